//! Credentials (`[[providers.NAME.credentials]]`): what the host adds to a
//! driver's requests to one host, each secret from the environment or a
//! file; also read outside a config file, for `berth driver test`.

use std::net::IpAddr;
use std::path::Path;

use toml::{Table, Value};

use crate::exchanged::{
    ClientAuth, ClientCertificate, GoogleServiceAccount, Keystone, KeystoneMethod, KeystoneRef,
    OAuth2, SecretSource,
};
use crate::problem::ConfigErrors;
use crate::sandbox::{AllowedHost, Auth, Credential};
use crate::walker::{Section, Walker};

/// Reads credentials tables outside a config file (`berth driver test`'s
/// JSON), with the same keys and checks as `[[providers.NAME.credentials]]`;
/// relative `*-file` paths are taken from `base`.
pub fn credentials(
    tables: &[toml::Value],
    allowed: &[AllowedHost],
    base: &Path,
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
            Value::Table(t) => out.extend(w.credential(at, t, allowed, base)),
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
        base: &Path,
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
        let kind = self.required_string(&mut s, "kind");
        let auth = match kind.as_deref() {
            Some("aws-sigv4") => {
                let access_key_id = self.required_string(&mut s, "access-key-id");
                let access_key_id =
                    access_key_id.map(|k| self.interpolate(&s.at("access-key-id"), &k));
                let secret_access_key = self.secret_source(
                    &mut s,
                    ("secret-access-key", "secret-access-key-file"),
                    true,
                    base,
                );
                let session_token = self.secret_source(
                    &mut s,
                    ("session-token", "session-token-file"),
                    false,
                    base,
                );
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
            Some("bearer") => self
                .secret_source(&mut s, ("token", "token-file"), true, base)
                .map(|value| Auth::Header {
                    name: http::header::AUTHORIZATION,
                    scheme: Some("Bearer"),
                    value,
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
                let value = self.secret_source(&mut s, ("value", "value-file"), true, base);
                match (name, value) {
                    (Some(name), Some(value)) => Some(Auth::Header {
                        name,
                        scheme: None,
                        value,
                    }),
                    _ => None,
                }
            }
            Some("keystone") => self.keystone(&mut s, base).map(Auth::Keystone),
            Some("oauth2-client-credentials") => self.oauth2(&mut s, base).map(Auth::OAuth2),
            Some("google-service-account") => {
                let key = self.secret_source(&mut s, ("key", "key-file"), true, base);
                let scopes = self.strings(&mut s, "scopes").unwrap_or_else(|| {
                    vec!["https://www.googleapis.com/auth/cloud-platform".to_owned()]
                });
                if scopes.is_empty() {
                    self.problem(
                        s.at("scopes"),
                        "names no scope; leave it out for cloud-platform",
                    );
                }
                key.map(|key| Auth::Google(GoogleServiceAccount { key, scopes }))
            }
            Some("client-certificate") => {
                let cert = self
                    .required_string(&mut s, "cert-file")
                    .map(|p| base.join(p));
                let key = self.secret_source(&mut s, ("key", "key-file"), true, base);
                let ca = self.string(&mut s, "ca-file").map(|p| base.join(p));
                match (cert, key) {
                    (Some(cert), Some(key)) => {
                        Some(Auth::ClientCertificate(ClientCertificate { cert, key, ca }))
                    }
                    _ => None,
                }
            }
            Some(other) => {
                self.problem(
                    s.at("kind"),
                    format!(
                        "`{other}` is not aws-sigv4, bearer, header, keystone, \
                         oauth2-client-credentials, google-service-account or client-certificate"
                    ),
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

impl Walker<'_> {
    /// A secret from `key` (`${ENV}` only) or from the file `key-file`:
    /// exactly one of them, when `required`.
    fn secret_source(
        &mut self,
        s: &mut Section<'_>,
        (key, file): (&'static str, &'static str),
        required: bool,
        base: &Path,
    ) -> Option<SecretSource> {
        let given = (s.table.contains_key(key), s.table.contains_key(file));
        match given {
            (true, true) => {
                self.problem(s.at(file), format!("give `{key}` or `{file}`, not both"));
                s.known.extend([key, file]);
                None
            }
            (false, true) => self
                .string(s, file)
                .map(|p| SecretSource::File(base.join(p))),
            (true, false) => self.secret(s, key, true).map(SecretSource::Value),
            (false, false) if required => {
                s.known.extend([key, file]);
                self.problem(
                    s.at(key),
                    format!("missing; give `{key}` (from the environment) or `{file}`"),
                );
                None
            }
            (false, false) => None,
        }
    }

    /// An array of strings.
    fn strings(&mut self, s: &mut Section<'_>, key: &'static str) -> Option<Vec<String>> {
        match s.get(key)? {
            Value::Array(a) => Some(
                a.iter()
                    .enumerate()
                    .filter_map(|(i, v)| match v {
                        Value::String(v) => Some(v.clone()),
                        v => {
                            self.wrong_type(format!("{}[{i}]", s.at(key)), "a string", v);
                            None
                        }
                    })
                    .collect(),
            ),
            v => {
                self.wrong_type(s.at(key), "an array of strings", v);
                None
            }
        }
    }

    /// The URL of an endpoint the host sends a secret to: HTTPS, or plain
    /// HTTP to a loopback address (a local test server).
    fn secret_url(&mut self, s: &mut Section<'_>, key: &'static str) -> Option<String> {
        let text = self.required_string(s, key)?;
        let text = self.interpolate(&s.at(key), &text);
        let url = match url::Url::parse(&text) {
            Ok(u) => u,
            Err(e) => {
                self.problem(s.at(key), format!("`{text}` is not a URL: {e}"));
                return None;
            }
        };
        let loopback = match url.host() {
            Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
            Some(url::Host::Ipv4(ip)) => crate::canonical_ip(IpAddr::V4(ip)).is_loopback(),
            Some(url::Host::Ipv6(ip)) => crate::canonical_ip(IpAddr::V6(ip)).is_loopback(),
            None => false,
        };
        match url.scheme() {
            "https" => {}
            "http" if loopback => {}
            _ => {
                self.problem(
                    s.at(key),
                    format!(
                        "`{text}`: the host sends a secret there, so it must be https:// \
                         (or http:// to a loopback address, for a local test server)"
                    ),
                );
                return None;
            }
        }
        if !url.username().is_empty() || url.password().is_some() {
            self.problem(s.at(key), "must not hold a user name or password");
            return None;
        }
        Some(text.trim_end_matches('/').to_owned())
    }

    /// A Keystone user or project: `PREFIX-id`, or `PREFIX-name` with
    /// `PREFIX-domain` (default `Default`).
    fn keystone_ref(
        &mut self,
        s: &mut Section<'_>,
        (id, name, domain): (&'static str, &'static str, &'static str),
    ) -> Option<KeystoneRef> {
        let id_v = self.string(s, id);
        let name_v = self.string(s, name);
        let domain_v = self.string(s, domain);
        match (id_v, name_v) {
            (Some(_), Some(_)) => {
                self.problem(s.at(name), format!("give `{id}` or `{name}`, not both"));
                None
            }
            (Some(i), None) => {
                if domain_v.is_some() {
                    self.problem(s.at(domain), format!("goes with `{name}`, not `{id}`"));
                }
                Some(KeystoneRef::Id(i))
            }
            (None, Some(n)) => Some(KeystoneRef::Name {
                name: n,
                domain: domain_v.unwrap_or_else(|| "Default".to_owned()),
            }),
            (None, None) => None,
        }
    }

    fn keystone(&mut self, s: &mut Section<'_>, base: &Path) -> Option<Keystone> {
        let auth_url = self.secret_url(s, "auth-url");
        let app = self.string(s, "application-credential-id");
        let method = match app {
            Some(id) => {
                let secret = self.secret_source(
                    s,
                    (
                        "application-credential-secret",
                        "application-credential-secret-file",
                    ),
                    true,
                    base,
                );
                for key in [
                    "username",
                    "user-id",
                    "password",
                    "password-file",
                    "project-name",
                    "project-id",
                ] {
                    if s.table.contains_key(key) {
                        s.known.push(key);
                        self.problem(
                            s.at(key),
                            "an application credential names its user and project itself; leave this out",
                        );
                    }
                }
                secret.map(|secret| KeystoneMethod::ApplicationCredential { id, secret })
            }
            None => {
                let user = self.keystone_ref(s, ("user-id", "username", "user-domain"));
                if user.is_none()
                    && !s.table.contains_key("username")
                    && !s.table.contains_key("user-id")
                {
                    self.problem(
                        s.at("username"),
                        "missing; give `username` or `user-id`, or `application-credential-id`",
                    );
                }
                let password = self.secret_source(s, ("password", "password-file"), true, base);
                let project =
                    self.keystone_ref(s, ("project-id", "project-name", "project-domain"));
                match (user, password) {
                    (Some(user), Some(password)) => Some(KeystoneMethod::Password {
                        user,
                        password,
                        project,
                    }),
                    _ => None,
                }
            }
        };
        let ca = self.string(s, "ca-file").map(|p| base.join(p));
        Some(Keystone {
            auth_url: auth_url?,
            method: method?,
            ca,
        })
    }

    fn oauth2(&mut self, s: &mut Section<'_>, base: &Path) -> Option<OAuth2> {
        let token_url = self.secret_url(s, "token-url");
        let client_id = self
            .required_string(s, "client-id")
            .map(|c| self.interpolate(&s.at("client-id"), &c));
        let has_key =
            s.table.contains_key("private-key") || s.table.contains_key("private-key-file");
        let client = if has_key {
            for key in ["client-secret", "client-secret-file", "client-auth"] {
                if s.table.contains_key(key) {
                    s.known.push(key);
                    self.problem(s.at(key), "give a client secret or a private key, not both");
                }
            }
            let key = self.secret_source(s, ("private-key", "private-key-file"), true, base);
            let key_id = self.string(s, "key-id");
            key.map(|key| ClientAuth::PrivateKeyJwt { key, key_id })
        } else {
            let secret = self.secret_source(s, ("client-secret", "client-secret-file"), true, base);
            let basic = match self.string(s, "client-auth").as_deref() {
                None | Some("body") => false,
                Some("basic") => true,
                Some(other) => {
                    self.problem(
                        s.at("client-auth"),
                        format!("`{other}` is not body or basic"),
                    );
                    false
                }
            };
            secret.map(|secret| ClientAuth::Secret { secret, basic })
        };
        let scope = self.string(s, "scope");
        let resource = self.string(s, "resource");
        let ca = self.string(s, "ca-file").map(|p| base.join(p));
        Some(OAuth2 {
            token_url: token_url?,
            client_id: client_id?,
            client: client?,
            scope,
            resource,
            ca,
        })
    }
}
