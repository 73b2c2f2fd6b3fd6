//! `[store]`: the embedded store's sync level, or a PostgreSQL store (its
//! url, password, TLS roots and the pool's lease).

use std::path::Path;
use std::time::Duration;

use toml::Table;

use crate::settings::{Password, Postgres, StoreSettings, StoreSync};
use crate::walker::{Section, Walker};

impl Walker<'_> {
    pub(crate) fn store(&mut self, t: &Table, base: &Path) -> StoreSettings {
        let mut s = Section::new("store".into(), t);
        let sync_text = self.string(&mut s, "sync");
        let sync = match sync_text.as_deref() {
            None | Some("full") => StoreSync::Full,
            Some("normal") => StoreSync::Normal,
            Some(other) => {
                self.problem(
                    "store.sync",
                    format!("`{other}` is not a sync level; expected full or normal"),
                );
                StoreSync::Full
            }
        };
        let url = self.string(&mut s, "url");
        let password = self.secret(&mut s, "password", false);
        let password_file = self.string(&mut s, "password-file");
        let lease_ttl = self.duration(&mut s, "pool-lease-ttl");
        let ca_file = self.string(&mut s, "ca-file");
        let postgres = match url {
            None => {
                for key in ["password", "password-file"] {
                    if t.contains_key(key) {
                        self.problem(s.at(key), "only a PostgreSQL store (`url`) has a password");
                    }
                }
                if ca_file.is_some() {
                    self.problem(
                        s.at("ca-file"),
                        "only a PostgreSQL store (`url`) connects over TLS",
                    );
                }
                if lease_ttl.is_some() {
                    self.problem(
                        s.at("pool-lease-ttl"),
                        "only a PostgreSQL store (`url`), shared by several processes, has a \
                         pool lease",
                    );
                }
                None
            }
            Some(url) => {
                if sync_text.is_some() {
                    self.problem(
                        "store.sync",
                        "applies to the embedded store only; a PostgreSQL server's durability \
                         is its own `synchronous_commit` setting",
                    );
                }
                let tls = self.postgres_url(&s.at("url"), &url);
                if ca_file.is_some() && !tls {
                    self.problem(
                        s.at("ca-file"),
                        "applies only over TLS: add sslmode=verify-full (or require) to the url",
                    );
                }
                let password = match (password, password_file) {
                    (Some(_), Some(_)) => {
                        self.problem(
                            s.at("password-file"),
                            "give `password` or `password-file`, not both",
                        );
                        None
                    }
                    (Some(p), None) => Some(Password::Value(p)),
                    (None, Some(f)) => Some(Password::File(base.join(f))),
                    (None, None) => None,
                };
                let lease_ttl = lease_ttl.unwrap_or(Postgres::DEFAULT_LEASE_TTL);
                if lease_ttl < Duration::from_millis(500) {
                    self.problem(
                        s.at("pool-lease-ttl"),
                        "must be at least 500ms: the holder renews it every 0.4 × this when idle",
                    );
                }
                Some(Postgres {
                    url,
                    password,
                    pool_lease_ttl: lease_ttl,
                    ca_file: ca_file.map(|f| base.join(f)),
                })
            }
        };
        self.finish(s);
        StoreSettings { sync, postgres }
    }

    /// Checks a PostgreSQL url: the scheme, a user and a host, no password
    /// in it, and an `sslmode` berth knows. Returns whether it asks for TLS.
    fn postgres_url(&mut self, at: &str, text: &str) -> bool {
        let url = match url::Url::parse(text) {
            Ok(u) => u,
            Err(e) => {
                self.problem(
                    at,
                    format!("`{text}` is not a url such as postgres://berth@db.example/berth: {e}"),
                );
                return false;
            }
        };
        if !matches!(url.scheme(), "postgres" | "postgresql") {
            self.problem(
                at,
                format!(
                    "`{}:` is not a PostgreSQL url; it starts with postgres://",
                    url.scheme()
                ),
            );
            return false;
        }
        if url.password().is_some() {
            // Not echoed: the text holds the password.
            self.problem(
                at,
                "holds a password, which whoever reads this file would see; \
                 give it as password = \"${NAME}\" or password-file",
            );
            return false;
        }
        if url.username().is_empty() {
            self.problem(at, "names no user, as in postgres://USER@HOST/DATABASE");
        }
        if url.host_str().is_none_or(str::is_empty) {
            self.problem(at, "names no host, as in postgres://USER@HOST/DATABASE");
        }
        let mut tls = false;
        for (key, value) in url.query_pairs() {
            if key == "password" {
                self.problem(
                    at,
                    "holds a password, which whoever reads this file would see; \
                     give it as password = \"${NAME}\" or password-file",
                );
            } else if key == "sslmode" {
                match &*value {
                    "disable" | "prefer" => tls = false,
                    "require" | "verify-ca" | "verify-full" => tls = true,
                    other => self.problem(
                        at,
                        format!(
                            "sslmode={other} is not a mode berth knows; expected verify-full \
                             (TLS, the server's certificate verified), or disable"
                        ),
                    ),
                }
            } else if matches!(&*key, "sslrootcert" | "sslcert" | "sslkey") {
                self.problem(
                    at,
                    format!("{key} is not read from the url; give the CA file as `ca-file`"),
                );
            }
        }
        tls
    }
}
