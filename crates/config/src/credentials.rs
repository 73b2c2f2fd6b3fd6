//! Credentials (`[[providers.NAME.credentials]]`): what the host adds to a
//! driver's requests to one host, each secret from the environment; also
//! read outside a config file, for `berth driver test`.

use toml::{Table, Value};

use crate::problem::ConfigErrors;
use crate::sandbox::{AllowedHost, Auth, Credential, Secret};
use crate::walker::{Section, Walker};

/// Reads credentials tables outside a config file (`berth driver test`'s
/// JSON), with the same keys and checks as `[[providers.NAME.credentials]]`.
pub fn credentials(
    tables: &[toml::Value],
    allowed: &[AllowedHost],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<Credential>, ConfigErrors> {
    let mut w = Walker {
        problems: Vec::new(),
        env,
    };
    let mut out = Vec::new();
    for (i, v) in tables.iter().enumerate() {
        let at = format!("credentials[{i}]");
        match v {
            Value::Table(t) => out.extend(w.credential(at, t, allowed)),
            v => w.wrong_type(at, "an object", v),
        }
    }
    if w.problems.is_empty() {
        Ok(out)
    } else {
        Err(ConfigErrors {
            problems: w.problems,
        })
    }
}

impl Walker<'_> {
    /// One `[[providers.NAME.credentials]]` table.
    pub(crate) fn credential(
        &mut self,
        path: String,
        t: &Table,
        allowed: &[AllowedHost],
    ) -> Option<Credential> {
        let mut s = Section::new(path, t);
        let host =
            self.required_string(&mut s, "host")
                .and_then(|h| match AllowedHost::parse(&h) {
                    Ok(a) => Some((h, a)),
                    Err(e) => {
                        self.problem(s.at("host"), e);
                        None
                    }
                });
        if let Some((text, h)) = &host
            && !allowed.iter().any(|a| a.covers(h))
        {
            self.problem(
                s.at("host"),
                format!(
                    "`{text}` is not in the provider's allow-hosts, so no request would carry this"
                ),
            );
        }
        let secret = Self::secret;
        let kind = self.required_string(&mut s, "kind");
        let auth = match kind.as_deref() {
            Some("aws-sigv4") => {
                let access_key_id = self.required_string(&mut s, "access-key-id");
                let access_key_id =
                    access_key_id.map(|k| self.interpolate(&s.at("access-key-id"), &k));
                let secret_access_key = secret(self, &mut s, "secret-access-key", true);
                let session_token = secret(self, &mut s, "session-token", false);
                let region = self.required_string(&mut s, "region");
                let service = self.required_string(&mut s, "service");
                match (access_key_id, secret_access_key, region, service) {
                    (Some(access_key_id), Some(secret_access_key), Some(region), Some(service)) => {
                        Some(Auth::AwsSigV4 {
                            access_key_id,
                            secret_access_key,
                            session_token,
                            region,
                            service,
                        })
                    }
                    _ => None,
                }
            }
            Some("bearer") => secret(self, &mut s, "token", true).map(|t| Auth::Header {
                name: http::header::AUTHORIZATION,
                value: Secret::new(format!("Bearer {}", t.expose())),
            }),
            Some("header") => {
                let name = self.required_string(&mut s, "header").and_then(|h| {
                    match http::header::HeaderName::try_from(h.as_str()) {
                        Ok(n) => Some(n),
                        Err(_) => {
                            self.problem(s.at("header"), format!("`{h}` is not a header name"));
                            None
                        }
                    }
                });
                let value = secret(self, &mut s, "value", true);
                match (name, value) {
                    (Some(name), Some(value)) => Some(Auth::Header { name, value }),
                    _ => None,
                }
            }
            Some(other) => {
                self.problem(
                    s.at("kind"),
                    format!("`{other}` is not aws-sigv4, bearer or header"),
                );
                // Which other keys belong depends on the kind: name none.
                return None;
            }
            None => return None,
        };
        self.finish(s);
        Some(Credential {
            host: host?.1,
            auth: auth?,
        })
    }
}
