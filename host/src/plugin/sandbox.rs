//! What a driver may do: the per-provider sandbox limits, the outbound HTTP
//! policy (allow-list, never link-local or cloud metadata), the memory cap, and
//! the `Store` state every driver instance runs with.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks, WasiHttpView};

use super::credentials::{self, Credential, NotApplied};
use super::state::StateSpace;

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
}

impl Default for SandboxLimits {
    fn default() -> Self {
        SandboxLimits {
            memory_bytes: 256 << 20,
            call_deadline: Duration::from_secs(30),
            max_instances: 4,
            max_response_bytes: 64 << 20,
        }
    }
}

/// One allowed outbound destination: a host name or IP literal (with `*.` for
/// any subdomain) and an optional port.
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
            host: host.to_ascii_lowercase(),
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

    pub(crate) fn matches(&self, host: &str, port: u16) -> bool {
        if self.port.is_some_and(|p| p != port) {
            return false;
        }
        match self.host.strip_prefix("*.") {
            Some(domain) => {
                host.len() > domain.len() + 1
                    && host.ends_with(domain)
                    && host[..host.len() - domain.len()].ends_with('.')
            }
            None => self.host == host,
        }
    }
}

/// Addresses a driver may never reach, whatever its allow-list says:
/// link-local ranges, where clouds serve instance metadata and credentials.
pub fn is_forbidden_ip(ip: IpAddr) -> bool {
    const EC2_V6_METADATA: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);
    match ip {
        IpAddr::V4(v4) => v4.is_link_local() || v4 == Ipv4Addr::UNSPECIFIED,
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_forbidden_ip(IpAddr::V4(v4));
            }
            v6 == EC2_V6_METADATA || (v6.segments()[0] & 0xffc0) == 0xfe80 || v6.is_unspecified()
        }
    }
}

/// The outbound HTTP policy of one provider.
#[derive(Debug)]
pub struct HttpPolicy {
    provider: Arc<str>,
    allowed: Vec<AllowedHost>,
    /// Added to the requests of the hosts they name; the guest never sees
    /// them.
    credentials: Vec<Credential>,
    denied: AtomicU64,
}

/// Why an outbound request was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Denial {
    NotAllowed,
    ForbiddenAddress(IpAddr),
    BadUri,
    Unresolvable,
}

impl std::fmt::Display for Denial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Denial::NotAllowed => f.write_str("host is not in the provider's allowed hosts"),
            Denial::ForbiddenAddress(ip) => write!(
                f,
                "address {ip} is link-local or cloud metadata, never reachable"
            ),
            Denial::BadUri => f.write_str("request has no host"),
            Denial::Unresolvable => f.write_str("host name does not resolve"),
        }
    }
}

impl HttpPolicy {
    pub fn new(provider: Arc<str>, allowed: Vec<AllowedHost>) -> Self {
        HttpPolicy {
            provider,
            allowed,
            credentials: Vec::new(),
            denied: AtomicU64::new(0),
        }
    }

    /// The same policy, with `credentials` added to the requests they name.
    pub fn with_credentials(mut self, credentials: Vec<Credential>) -> Self {
        self.credentials = credentials;
        self
    }

    /// Counts and logs a refused outbound request or probe.
    pub(crate) fn note_denied(&self, url: &str, denial: &Denial) {
        self.denied.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(provider = %self.provider, %url, reason = %denial, "outbound request denied");
    }

    /// Outbound requests refused so far.
    pub fn denied_count(&self) -> u64 {
        self.denied.load(Ordering::Relaxed)
    }

    /// Decides whether `uri` may be fetched and returns the address to
    /// connect to. Names are resolved here and every address is checked, so a
    /// name that points at a metadata address is refused too.
    pub(crate) async fn authorize(&self, uri: &http::Uri) -> Result<SocketAddr, Denial> {
        let host = uri.host().ok_or(Denial::BadUri)?;
        let port = uri
            .port_u16()
            .unwrap_or(if uri.scheme() == Some(&http::uri::Scheme::HTTPS) {
                443
            } else {
                80
            });
        self.authorize_host(host, port).await
    }

    /// As [`HttpPolicy::authorize`], for a host name or address and a port.
    pub(crate) async fn authorize_host(&self, host: &str, port: u16) -> Result<SocketAddr, Denial> {
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        if host.is_empty() {
            return Err(Denial::BadUri);
        }
        let literal = host.parse::<IpAddr>().ok();
        if let Some(ip) = literal
            && is_forbidden_ip(ip)
        {
            return Err(Denial::ForbiddenAddress(ip));
        }
        if !self.allowed.iter().any(|a| a.matches(&host, port)) {
            return Err(Denial::NotAllowed);
        }
        let addrs: Vec<SocketAddr> = match literal {
            Some(ip) => vec![SocketAddr::new(ip, port)],
            None => tokio::net::lookup_host((host.as_str(), port))
                .await
                .map_err(|_| Denial::Unresolvable)?
                .collect(),
        };
        if let Some(bad) = addrs.iter().find(|a| is_forbidden_ip(a.ip())) {
            return Err(Denial::ForbiddenAddress(bad.ip()));
        }
        addrs.first().copied().ok_or(Denial::Unresolvable)
    }
}

/// The hooks the host's wasi:http implementation calls for each request.
pub(crate) struct Hooks {
    policy: Arc<HttpPolicy>,
}

impl WasiHttpHooks for Hooks {
    fn send_request(
        &mut self,
        mut request: http::Request<wasmtime_wasi_http::WasiBody>,
        options: Option<wasmtime_wasi_http::RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>,
    ) -> Box<
        dyn Future<
                Output = Result<
                    (
                        http::Response<wasmtime_wasi_http::WasiBody>,
                        Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>,
                    ),
                    wasmtime_wasi_http::Error,
                >,
            > + Send,
    > {
        let policy = self.policy.clone();
        Box::new(async move {
            let url = request.uri().to_string();
            let addr = match policy.authorize(request.uri()).await {
                Ok(addr) => addr,
                Err(denial) => {
                    policy.note_denied(&url, &denial);
                    return Err(match denial {
                        Denial::Unresolvable => wasmtime_wasi_http::Error::DestinationNotFound,
                        Denial::ForbiddenAddress(_) => {
                            wasmtime_wasi_http::Error::DestinationIpProhibited
                        }
                        Denial::NotAllowed | Denial::BadUri => {
                            wasmtime_wasi_http::Error::HttpRequestDenied
                        }
                    });
                }
            };
            if let Some(cred) = credentials::find(
                &policy.credentials,
                request.uri().host().unwrap_or(""),
                addr.port(),
            ) {
                request = match authenticate(cred, request).await {
                    Ok(r) => r,
                    Err(why) => {
                        tracing::warn!(provider = %policy.provider, %url, reason = %why, "outbound request denied");
                        policy.denied.fetch_add(1, Ordering::Relaxed);
                        return Err(wasmtime_wasi_http::Error::HttpRequestDenied);
                    }
                };
            }
            // Plain HTTP connects to the address that was checked, so a name
            // cannot be re-resolved to a forbidden address between the check
            // and the connect. TLS needs the name for SNI and certificate
            // checks, so it connects by name (see docs/sandbox.md).
            if request.uri().scheme() != Some(&http::uri::Scheme::HTTPS) {
                let mut parts = request.uri().clone().into_parts();
                if let Ok(authority) = http::uri::Authority::try_from(addr.to_string()) {
                    parts.authority = Some(authority);
                    if let Ok(uri) = http::Uri::from_parts(parts) {
                        *request.uri_mut() = uri;
                    }
                }
            }
            tracing::debug!(provider = %policy.provider, %url, "outbound request");
            let (response, io) = wasmtime_wasi_http::default_send_request(request, options).await?;
            Ok((
                response.map(BodyExt::boxed_unsync),
                Box::new(io)
                    as Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>,
            ))
        })
    }
}

/// Adds `cred` to `request`, reading its body to sign it.
async fn authenticate(
    cred: &Credential,
    request: http::Request<wasmtime_wasi_http::WasiBody>,
) -> Result<http::Request<wasmtime_wasi_http::WasiBody>, NotApplied> {
    let https = request.uri().scheme() == Some(&http::uri::Scheme::HTTPS);
    let host = request.uri().host().unwrap_or("").to_owned();
    if !credentials::may_send(&host, https) {
        return Err(NotApplied::Insecure(host));
    }
    let (mut parts, body) = request.into_parts();
    let body = http_body_util::Limited::new(body, credentials::MAX_SIGNED_BODY)
        .collect()
        .await
        .map_err(|_| NotApplied::BodyTooLarge(credentials::MAX_SIGNED_BODY))?
        .to_bytes();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    credentials::apply(&cred.auth, &mut parts, &body, now_ms);
    let body = http_body_util::Full::new(body)
        .map_err(|never| match never {})
        .boxed_unsync();
    Ok(http::Request::from_parts(parts, body))
}

/// Returned by the memory limiter; identifies an out-of-memory trap.
#[derive(Debug, thiserror::Error)]
#[error("driver exceeded its memory cap of {cap} bytes (asked for {asked})")]
pub(crate) struct MemoryCapExceeded {
    pub cap: u64,
    pub asked: u64,
}

/// Returned by the epoch callback; identifies a deadline trap.
#[derive(Debug, thiserror::Error)]
#[error("driver call ran past its deadline")]
pub(crate) struct DeadlineExceeded;

/// Caps linear memory and table growth of one driver instance.
pub(crate) struct Limiter {
    memory_bytes: u64,
}

impl wasmtime::ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired as u64 > self.memory_bytes {
            return Err(wasmtime::Error::new(MemoryCapExceeded {
                cap: self.memory_bytes,
                asked: desired as u64,
            }));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Tables hold function references; a million is far beyond any real
        // driver and keeps a hostile one from growing host memory through them.
        Ok(desired <= 1_000_000)
    }
}

/// Everything a driver instance's `Store` holds.
pub(crate) struct StoreState {
    pub provider: Arc<str>,
    wasi: WasiCtx,
    http: WasiHttpCtx,
    table: ResourceTable,
    hooks: Hooks,
    /// The provider's durable records (the `state` import).
    pub state: StateSpace,
    pub limiter: Limiter,
    /// The current call must finish before this instant; read by the epoch
    /// callback.
    pub deadline: Instant,
    /// Log records emitted during the current call, to cap a noisy driver.
    pub log_records: u32,
    /// The last line the guest wrote to stderr (a Rust panic message).
    stderr_tail: Arc<std::sync::Mutex<String>>,
}

impl StoreState {
    pub fn new(
        provider: Arc<str>,
        limits: &SandboxLimits,
        policy: Arc<HttpPolicy>,
        state: StateSpace,
    ) -> Self {
        // No preopened directories, no environment, no arguments, no network
        // sockets (the builder's defaults deny every address); stdio goes to
        // the host log attributed to the provider.
        let stderr_tail = Arc::new(std::sync::Mutex::new(String::new()));
        let wasi = WasiCtx::builder()
            .stdout(GuestOutput {
                provider: provider.clone(),
                stream: "stdout",
                last: None,
            })
            .stderr(GuestOutput {
                provider: provider.clone(),
                stream: "stderr",
                last: Some(stderr_tail.clone()),
            })
            .allow_ip_name_lookup(false)
            .allow_tcp(false)
            .allow_udp(false)
            .build();
        StoreState {
            provider,
            wasi,
            http: WasiHttpCtx::new(),
            table: ResourceTable::new(),
            hooks: Hooks { policy },
            state,
            limiter: Limiter {
                memory_bytes: limits.memory_bytes,
            },
            deadline: Instant::now(),
            log_records: 0,
            stderr_tail,
        }
    }

    /// The provider's outbound policy, which the TCP probe obeys too.
    pub fn policy(&self) -> &HttpPolicy {
        &self.hooks.policy
    }

    /// The last complete line the guest wrote to stderr.
    pub fn stderr_tail(&self) -> String {
        self.stderr_tail
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }
}

impl WasiView for StoreState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for StoreState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

/// A guest's stdout or stderr: each complete line becomes a log record.
#[derive(Clone)]
struct GuestOutput {
    provider: Arc<str>,
    stream: &'static str,
    /// Keeps the last line, for trap messages. Plain mutex: never held across
    /// an await.
    last: Option<Arc<std::sync::Mutex<String>>>,
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(LineLogger {
            out: self.clone(),
            line: Vec::new(),
        })
    }
}

struct LineLogger {
    out: GuestOutput,
    line: Vec<u8>,
}

/// Longest stdio line kept; the rest of a longer line is dropped.
const MAX_LINE: usize = 4096;

impl LineLogger {
    fn emit(&mut self) {
        let text = String::from_utf8_lossy(&self.line);
        let text = text.trim_end();
        tracing::info!(provider = %self.out.provider, stream = self.out.stream, "driver: {text}");
        if let Some(last) = &self.out.last
            && let Ok(mut last) = last.lock()
            && !text.is_empty()
        {
            *last = text.to_string();
        }
        self.line.clear();
    }
}

impl tokio::io::AsyncWrite for LineLogger {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        for &b in buf {
            if b == b'\n' {
                self.emit();
            } else if self.line.len() < MAX_LINE {
                self.line.push(b);
            }
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if !self.line.is_empty() {
            self.emit();
        }
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allowed: &[&str]) -> HttpPolicy {
        HttpPolicy::new(
            "p".into(),
            allowed
                .iter()
                .map(|a| AllowedHost::parse(a).unwrap())
                .collect(),
        )
    }

    async fn check(allowed: &[&str], url: &str) -> Result<SocketAddr, Denial> {
        policy(allowed).authorize(&url.parse().unwrap()).await
    }

    #[tokio::test]
    async fn allow_list_decides() {
        assert_eq!(
            check(&["127.0.0.1:8080"], "http://127.0.0.1:8080/x").await,
            Ok("127.0.0.1:8080".parse().unwrap())
        );
        assert_eq!(
            check(&["127.0.0.1:8080"], "http://127.0.0.1:8081/x").await,
            Err(Denial::NotAllowed)
        );
        assert_eq!(
            check(&["127.0.0.1"], "http://127.0.0.1:9/x").await,
            Ok("127.0.0.1:9".parse().unwrap())
        );
        assert_eq!(
            check(&[], "http://127.0.0.1/").await,
            Err(Denial::NotAllowed)
        );
        assert_eq!(
            check(&["localhost:1"], "http://LOCALHOST:1/")
                .await
                .map(|a| a.port()),
            Ok(1)
        );
        assert_eq!(
            check(&["[::1]:7"], "http://[::1]:7/").await,
            Ok("[::1]:7".parse().unwrap())
        );
    }

    #[tokio::test]
    async fn metadata_is_never_reachable() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            check(
                &["169.254.169.254"],
                "http://169.254.169.254/latest/meta-data/"
            )
            .await,
            Err(Denial::ForbiddenAddress(ip("169.254.169.254")))
        );
        assert_eq!(
            check(&["*"], "http://[fd00:ec2::254]/").await,
            Err(Denial::ForbiddenAddress(ip("fd00:ec2::254")))
        );
        assert_eq!(
            check(&["[fe80::1]"], "http://[fe80::1]/").await,
            Err(Denial::ForbiddenAddress(ip("fe80::1")))
        );
        assert_eq!(
            check(&["[::ffff:169.254.1.1]"], "http://[::ffff:169.254.1.1]/").await,
            Err(Denial::ForbiddenAddress(ip("::ffff:169.254.1.1")))
        );
    }

    #[test]
    fn wildcard_matches_subdomains_only() {
        let a = AllowedHost::parse("*.example.com").unwrap();
        assert!(a.matches("api.example.com", 443));
        assert!(a.matches("a.b.example.com", 80));
        assert!(!a.matches("example.com", 443));
        assert!(!a.matches("badexample.com", 443));
    }

    #[test]
    fn allowed_host_rejects_urls() {
        assert!(AllowedHost::parse("http://x").is_err());
        assert!(AllowedHost::parse("x:notaport").is_err());
        assert!(AllowedHost::parse("").is_err());
    }
}
