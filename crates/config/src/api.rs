//! `[api]`: where the service listens and is reached, its timeouts and
//! connection cap, its tokens, and the pool's lease TTL.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use berth_core::config::Config;
use toml::Table;

use crate::settings::{ApiSettings, Role, TlsFiles, Token};
use crate::walker::{Section, Walker, join};

impl Walker<'_> {
    /// `[api]`, and the pool's lease TTL that it holds.
    pub(crate) fn api(&mut self, t: &Table, base: &Path) -> (ApiSettings, Duration) {
        let mut s = Section::new("api".into(), t);
        let d = ApiSettings::default();
        let listen = match self.string(&mut s, "listen") {
            None => d.listen,
            Some(text) => match text.parse::<std::net::SocketAddr>() {
                Ok(a) => a,
                Err(_) => {
                    self.problem(
                        "api.listen",
                        format!("`{text}` is not an address and port such as 127.0.0.1:8080"),
                    );
                    d.listen
                }
            },
        };
        let advertise = self.string(&mut s, "advertise");
        let cert = self.string(&mut s, "tls-cert").map(|p| base.join(p));
        let key = self.string(&mut s, "tls-key").map(|p| base.join(p));
        let peer_ca = self.string(&mut s, "tls-peer-ca").map(|p| base.join(p));
        let tls = match (cert, key) {
            (Some(cert), Some(key)) => Some(TlsFiles { cert, key, peer_ca }),
            (None, None) => {
                if peer_ca.is_some() {
                    self.problem(
                        "api.tls-peer-ca",
                        "only with api.tls-cert and api.tls-key: the other processes are reached \
                         over TLS only when this one serves it",
                    );
                }
                None
            }
            (Some(_), None) => {
                self.problem(
                    "api.tls-key",
                    "missing: api.tls-cert needs the key beside it",
                );
                None
            }
            (None, Some(_)) => {
                self.problem(
                    "api.tls-cert",
                    "missing: api.tls-key needs the certificate beside it",
                );
                None
            }
        };
        let allow_plain_http = self.bool(&mut s, "allow-plain-http").unwrap_or(false);
        if let Some(text) = &advertise {
            self.advertise_url(text, tls.is_some());
        }
        let lease_ttl = self
            .duration(&mut s, "lease-ttl")
            .unwrap_or(Config::DEFAULT_LEASE_TTL);
        if lease_ttl.is_zero() {
            self.problem("api.lease-ttl", "must be more than zero");
        }
        let mut positive = |w: &mut Self, key: &'static str, default: Duration| {
            let d = w.duration(&mut s, key).unwrap_or(default);
            if d.is_zero() {
                w.problem(format!("api.{key}"), "must be more than zero");
            }
            d
        };
        let header_timeout = positive(self, "header-timeout", d.header_timeout);
        let body_timeout = positive(self, "body-timeout", d.body_timeout);
        let max_connections = self
            .int::<usize>(&mut s, "max-connections", "1 or more")
            .unwrap_or(d.max_connections);
        if max_connections == 0 {
            self.problem("api.max-connections", "must be 1 or more");
        }
        let mut tokens: Vec<Token> = Vec::new();
        if let Some(t) = self.table(&mut s, "tokens") {
            for (name, t) in self.named("api.tokens", t) {
                if let Some(token) = self.token(name, t) {
                    tokens.push(token);
                }
            }
        }
        self.finish(s);
        for (i, t) in tokens.iter().enumerate() {
            if tokens[..i].iter().any(|o| o.secret == t.secret) {
                self.problem(
                    format!("api.tokens.{}.token", t.name),
                    "the same secret as another token; each token needs its own",
                );
            }
        }
        let api = ApiSettings {
            listen,
            tokens,
            header_timeout,
            body_timeout,
            max_connections: max_connections.max(1),
            advertise,
            tls,
            allow_plain_http,
        };
        if let Some(problem) = listen_problem(&api, listen) {
            self.problem("api.listen", problem);
        }
        (api, lease_ttl)
    }

    /// Checks `api.advertise`: an http url of a host and port (https with
    /// TLS), nothing else.
    fn advertise_url(&mut self, text: &str, tls: bool) {
        let scheme = if tls { "https" } else { "http" };
        let problem = match url::Url::parse(text) {
            Err(e) => Some(format!(
                "`{text}` is not a url such as {scheme}://10.0.0.5:8080: {e}"
            )),
            Ok(u) if u.scheme() != scheme && tls => Some(format!(
                "`{text}`: this API serves TLS (api.tls-cert), so the other processes reach it \
                 at an https:// url"
            )),
            Ok(u) if u.scheme() != scheme => Some(format!(
                "`{text}`: this API serves plain http (no api.tls-cert), so this starts with \
                 http://"
            )),
            Ok(u) if u.host_str().is_none_or(str::is_empty) => {
                Some(format!("`{text}` names no host"))
            }
            Ok(u) if u.path() != "/" || u.query().is_some() || !u.username().is_empty() => {
                Some(format!("`{text}`: give only {scheme}://HOST:PORT"))
            }
            Ok(_) => None,
        };
        if let Some(p) = problem {
            self.problem("api.advertise", p);
        }
    }

    fn token(&mut self, name: String, t: &Table) -> Option<Token> {
        let mut s = Section::new(join("api.tokens", &name), t);
        let role = self.required_string(&mut s, "role");
        let secret = self.required_string(&mut s, "token");
        let max_nodes = self.max_nodes(&mut s);
        let at = s.path.clone();
        self.finish(s);
        let role = match role.as_deref()? {
            "client" => Role::Client,
            "admin" => Role::Admin,
            other => {
                self.problem(
                    join(&at, "role"),
                    format!("`{other}` is not a role; expected client or admin"),
                );
                return None;
            }
        };
        let path = join(&at, "token");
        let secret = self.interpolate(&path, &secret?);
        if secret.chars().count() < 16 {
            // The length of an interpolated secret says little; it is not shown.
            self.problem(path, "a token must be at least 16 characters");
            return None;
        }
        Some(Token {
            name,
            role,
            secret,
            max_nodes,
        })
    }
}

/// Why the API may not listen on `listen` with these settings, if it may
/// not: an address beyond this host needs tokens (or anyone who reaches it
/// could take and delete nodes), and TLS, or those tokens cross the network
/// in the clear, unless `allow-plain-http` says TLS ends in front of berth.
/// Checked for `api.listen` and again for `berth serve --listen`.
pub fn listen_problem(api: &ApiSettings, listen: SocketAddr) -> Option<String> {
    if crate::canonical_ip(listen.ip()).is_loopback() {
        return None;
    }
    if api.tokens.is_empty() {
        return Some(format!(
            "{listen} is not a loopback address and no api.tokens are configured: anyone who \
             reaches it could take and delete nodes; add tokens or listen on 127.0.0.1"
        ));
    }
    if api.tls.is_none() && !api.allow_plain_http {
        return Some(format!(
            "{listen} is not a loopback address and the API has no TLS: its tokens would cross \
             the network in the clear; set api.tls-cert and api.tls-key, or, where TLS ends in \
             front of berth (a proxy on this host), set api.allow-plain-http = true"
        ));
    }
    None
}
