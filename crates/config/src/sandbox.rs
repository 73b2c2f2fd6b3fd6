//! What a provider's driver may do and what the host adds to its requests:
//! the sandbox limits, the outbound allow-list, and the credentials. Plain
//! settings; `berth-plugin` enforces them.

use std::borrow::Cow;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use http::header::HeaderName;

use crate::exchanged::{ClientCertificate, GoogleServiceAccount, Keystone, OAuth2, SecretSource};

/// Resource limits of one provider's driver instances.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxLimits {
    /// Largest linear memory a driver instance may grow to, in bytes.
    pub memory_bytes: u64,
    /// Wall-clock deadline of one call, including the time a guest spends
    /// waiting on HTTP. A guest still running at the deadline is stopped.
    pub call_deadline: Duration,
    /// How many instances of the driver may run calls at once.
    pub max_instances: usize,
    /// Largest HTTP response body a guest may read, in bytes.
    pub max_response_bytes: u64,
    /// Outbound HTTP requests of the whole provider open at once; one more
    /// is refused (`connection-limit-reached`).
    pub max_outbound: usize,
    /// Outbound HTTP requests of one driver instance open at once.
    pub max_outbound_per_instance: usize,
    /// What one driver instance may make the host hold for it, in bytes:
    /// the resources it creates through WASI (HTTP header maps, streams,
    /// pollables) and a `state.scan` answer. Bounds host memory outside the
    /// guest's own `memory_bytes`.
    pub host_memory_bytes: u64,
    /// Log records (the `log` import and stdio lines) the provider's
    /// instances may write per second together; more are dropped and
    /// counted.
    pub log_rate: u32,
    /// Bytes of log records the provider's instances may write per second
    /// together (message and fields, and a fixed overhead per record for
    /// the line it becomes); more are dropped and counted.
    pub log_bytes: u64,
    /// The largest driver file loaded; a larger one is refused before it
    /// is read.
    pub max_driver_bytes: u64,
    /// How long loading waits for the driver to compile; past it the
    /// provider's start fails (and is tried again).
    pub compile_deadline: Duration,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        SandboxLimits {
            memory_bytes: 256 << 20,
            call_deadline: Duration::from_secs(30),
            max_instances: 4,
            max_response_bytes: 64 << 20,
            max_outbound: 64,
            max_outbound_per_instance: 16,
            host_memory_bytes: 16 << 20,
            log_rate: 100,
            log_bytes: 64 << 10,
            max_driver_bytes: 64 << 20,
            compile_deadline: Duration::from_secs(120),
        }
    }
}

/// Largest HTTP header (or trailer) map one `fields` resource may hold, in
/// bytes of its in-memory form. Clouds send a few KiB.
pub const FIELD_SIZE_LIMIT: usize = 32 << 10;

impl SandboxLimits {
    /// Resources one instance may hold in its table at once: each may be a
    /// header map of up to [`FIELD_SIZE_LIMIT`], so their number is what
    /// bounds the host memory they take.
    pub fn max_resources(&self) -> usize {
        usize::try_from(self.host_memory_bytes / FIELD_SIZE_LIMIT as u64)
            .unwrap_or(usize::MAX)
            .max(64)
    }
}

/// `ip` in its canonical form: an IPv4 address carried in any IPv6 form is
/// that IPv4 address; any other address is itself. Every check of an
/// address (allow-list literals, forbidden and internal ranges, berth's own
/// API, probes) compares canonical forms, so that `[::ffff:127.0.0.1]`
/// is `127.0.0.1` wherever it is named or met.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => embedded_v4(v6).map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The IPv4 address an IPv6 address carries, in the forms a host or a
/// gateway would turn back into IPv4: mapped (`::ffff:a.b.c.d`), SIIT's
/// translated form (`::ffff:0:a.b.c.d`), compatible (`::a.b.c.d`), NAT64
/// (`64:ff9b::/96`, `64:ff9b:1::/48`) and 6to4 (`2002:AABB:CCDD::/48`).
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    if let Some(v4) = v6.to_ipv4_mapped() {
        return Some(v4);
    }
    if s[..6] == [0, 0, 0, 0, 0xffff, 0] {
        return Some(low);
    }
    // `::` and `::1` are the unspecified and loopback addresses themselves.
    if s[..6] == [0; 6] && !(s[6] == 0 && s[7] <= 1) {
        return Some(low);
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] || (s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1) {
        return Some(low);
    }
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new(
            (s[1] >> 8) as u8,
            s[1] as u8,
            (s[2] >> 8) as u8,
            s[2] as u8,
        ));
    }
    None
}

/// A host as it is compared: an IP literal (bracketed or not) in its
/// [`canonical_ip`] text, a name as it is.
fn host_key(host: &str) -> Cow<'_, str> {
    match host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
    {
        Ok(ip) => Cow::Owned(canonical_ip(ip).to_string()),
        Err(_) => Cow::Borrowed(host),
    }
}

/// One allowed outbound destination: a host name or IP literal (with `*.` for
/// any subdomain) and an optional port. A literal is kept in its canonical
/// form ([`canonical_ip`]), and so are the literals it is compared with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowedHost {
    host: String,
    port: Option<u16>,
}

impl AllowedHost {
    /// Parses `host`, `host:port`, `*.domain`, `[v6]:port`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err("empty host".into());
        }
        if text.contains("://") || text.contains('/') {
            return Err(format!("{text:?} must be a host or host:port, not a URL"));
        }
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let (h, after) = rest
                .split_once(']')
                .ok_or_else(|| format!("{text:?}: unclosed ["))?;
            let port = match after.strip_prefix(':') {
                Some(p) => Some(
                    p.parse::<u16>()
                        .map_err(|_| format!("{text:?}: bad port"))?,
                ),
                None if after.is_empty() => None,
                None => return Err(format!("{text:?}: junk after ]")),
            };
            (h.to_string(), port)
        } else {
            match text.rsplit_once(':') {
                Some((h, p)) if !h.contains(':') => (
                    h.to_string(),
                    Some(
                        p.parse::<u16>()
                            .map_err(|_| format!("{text:?}: bad port"))?,
                    ),
                ),
                _ => (text.to_string(), None),
            }
        };
        Ok(AllowedHost {
            host: host_key(&host.to_ascii_lowercase()).into_owned(),
            port,
        })
    }

    /// Whether every request `other` matches is one this matches too.
    pub fn covers(&self, other: &AllowedHost) -> bool {
        let port = match (self.port, other.port) {
            (None, _) => true,
            (Some(a), Some(b)) => a == b,
            (Some(_), None) => false,
        };
        let host = match (self.host.strip_prefix("*."), other.host.strip_prefix("*.")) {
            // *.example.com covers *.a.example.com and itself.
            (Some(_), Some(theirs)) => {
                self.host == other.host || self.matches(theirs, other.port.unwrap_or(0))
            }
            (None, Some(_)) => false,
            (_, None) => self.matches(&other.host, other.port.unwrap_or(0)),
        };
        port && host
    }

    /// Whether some request is allowed by both this entry and `other`: the
    /// same host (or a wildcard covering the other's host, or two
    /// wildcards one of which covers the other) on a port both allow.
    pub fn overlaps(&self, other: &AllowedHost) -> bool {
        let port = match (self.port, other.port) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        };
        let host = match (self.host.strip_prefix("*."), other.host.strip_prefix("*.")) {
            (None, None) => self.host == other.host,
            (Some(domain), None) => within(&other.host, domain),
            (None, Some(domain)) => within(&self.host, domain),
            // `*.a.example.com` is within `*.example.com`.
            (Some(mine), Some(theirs)) => {
                mine == theirs || within(mine, theirs) || within(theirs, mine)
            }
        };
        port && host
    }

    /// Whether this entry names `host` itself (a literal or a name, not a
    /// wildcard), on whatever port.
    pub fn names(&self, host: &str) -> bool {
        self.host == host_key(host)
    }

    /// Whether a request to `host` (lower case) on `port` is allowed by
    /// this entry.
    pub fn matches(&self, host: &str, port: u16) -> bool {
        if self.port.is_some_and(|p| p != port) {
            return false;
        }
        let host = host_key(host);
        match self.host.strip_prefix("*.") {
            Some(domain) => within(&host, domain),
            None => self.host == host,
        }
    }
}

/// Whether `name` is a subdomain of `domain`.
fn within(name: &str, domain: &str) -> bool {
    name.len() > domain.len() + 1
        && name.ends_with(domain)
        && name[..name.len() - domain.len()].ends_with('.')
}

/// As written in `allow-hosts`: `host`, `host:port`, `[v6]:port`.
impl fmt::Display for AllowedHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.host.contains(':'), self.port) {
            (true, Some(p)) => write!(f, "[{}]:{p}", self.host),
            (true, None) => write!(f, "[{}]", self.host),
            (false, Some(p)) => write!(f, "{}:{p}", self.host),
            (false, None) => f.write_str(&self.host),
        }
    }
}

/// A secret string: never shown by `Debug` or `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }

    /// The secret itself, for the one place that uses it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// How requests to one host are authenticated.
#[derive(Clone, Debug)]
pub struct Credential {
    /// The requests it applies to: host (wildcards as in `allow-hosts`) and
    /// optional port.
    pub host: AllowedHost,
    pub auth: Auth,
}

/// The ways a request can be authenticated.
#[derive(Clone, Debug)]
pub enum Auth {
    /// AWS Signature Version 4 (EC2, and every AWS-style API).
    AwsSigV4 {
        access_key_id: String,
        secret_access_key: SecretSource,
        /// For temporary credentials.
        session_token: Option<SecretSource>,
        region: String,
        service: String,
    },
    /// `name: value`, e.g. `X-Api-Key: …`; with a `scheme`, `name: scheme
    /// value` (`Authorization: Bearer …`).
    Header {
        name: HeaderName,
        scheme: Option<&'static str>,
        value: SecretSource,
    },
    /// A token from OpenStack Keystone, as `X-Auth-Token`.
    Keystone(Keystone),
    /// A token from an OAuth2 token endpoint, as `Authorization: Bearer`.
    OAuth2(OAuth2),
    /// A Google OAuth2 token for a service account, as `Authorization:
    /// Bearer`.
    Google(GoogleServiceAccount),
    /// Mutual TLS with a client certificate.
    ClientCertificate(ClientCertificate),
}

impl Auth {
    /// The files it reads, each with the key that names it.
    pub fn files(&self) -> Vec<(&'static str, &std::path::Path)> {
        use crate::exchanged::{ClientAuth, KeystoneMethod};
        fn file<'a>(
            key: &'static str,
            s: &'a SecretSource,
        ) -> Option<(&'static str, &'a std::path::Path)> {
            match s {
                SecretSource::File(p) => Some((key, p.as_path())),
                SecretSource::Value(_) => None,
            }
        }
        let found = match self {
            Auth::AwsSigV4 {
                secret_access_key,
                session_token,
                ..
            } => vec![
                file("secret-access-key-file", secret_access_key),
                session_token
                    .as_ref()
                    .and_then(|t| file("session-token-file", t)),
            ],
            Auth::Header {
                scheme: Some(_),
                value,
                ..
            } => vec![file("token-file", value)],
            Auth::Header { value, .. } => vec![file("value-file", value)],
            Auth::Keystone(k) => vec![
                match &k.method {
                    KeystoneMethod::Password { password, .. } => file("password-file", password),
                    KeystoneMethod::ApplicationCredential { secret, .. } => {
                        file("application-credential-secret-file", secret)
                    }
                },
                k.ca.as_deref().map(|p| ("ca-file", p)),
            ],
            Auth::OAuth2(o) => vec![
                match &o.client {
                    ClientAuth::Secret { secret, .. } => file("client-secret-file", secret),
                    ClientAuth::PrivateKeyJwt { key, .. } => file("private-key-file", key),
                },
                o.ca.as_deref().map(|p| ("ca-file", p)),
            ],
            Auth::Google(g) => vec![file("key-file", &g.key)],
            Auth::ClientCertificate(c) => vec![
                Some(("cert-file", c.cert.as_path())),
                file("key-file", &c.key),
                c.ca.as_deref().map(|p| ("ca-file", p)),
            ],
        };
        found.into_iter().flatten().collect()
    }

    /// The `kind` it is written as.
    pub fn kind(&self) -> &'static str {
        match self {
            Auth::AwsSigV4 { .. } => "aws-sigv4",
            Auth::Header {
                scheme: Some(_), ..
            } => "bearer",
            Auth::Header { .. } => "header",
            Auth::Keystone(_) => "keystone",
            Auth::OAuth2(_) => "oauth2-client-credentials",
            Auth::Google(_) => "google-service-account",
            Auth::ClientCertificate(_) => "client-certificate",
        }
    }
}
