//! Where a driver may send: the outbound HTTP policy of each provider
//! (allow-list; never link-local or cloud metadata; loopback and private
//! addresses only when named as literals; never berth's own API; bounded
//! concurrency and response size), and the hooks the host's wasi:http
//! calls for each request. Which address is which is in `addresses.rs`,
//! the memory caps in `limits.rs`.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::instrument::WithSubscriber;
use wasmtime_wasi_http::WasiHttpHooks;

use berth_config::{AllowedHost, Credential, SandboxLimits, canonical_ip};

use super::addresses::{is_forbidden_ip, is_internal_ip};
use super::credentials::{self, NotApplied};
use super::gate::Gate;
use super::tokens::{Cell, Held, Issued, Unusable};

/// The outbound HTTP policy of one provider.
#[derive(Debug)]
pub struct HttpPolicy {
    provider: Arc<str>,
    allowed: Vec<AllowedHost>,
    /// Added to the requests of the hosts they name; the guest never sees
    /// them. They also mask their secrets in every response, so that a
    /// server echoing a request cannot hand them to the guest.
    credentials: Held,
    /// berth's own listening addresses: never reachable, even when named.
    own: Vec<SocketAddr>,
    /// One permit per outbound request of the provider open at once.
    outbound: Arc<Semaphore>,
    max_outbound: usize,
    /// Largest response body a guest may read.
    max_response_bytes: u64,
    denied: AtomicU64,
    /// Shut while this process may not act on clouds (it does not hold the
    /// pool's lease).
    gate: Arc<Gate>,
    /// The conformance kit's fault mode: while set, every allowed request
    /// is answered with this recorded response and never sent.
    recorded: std::sync::Mutex<Option<Recorded>>,
    /// Whether `recorded` is set: every request of a pool reads this, and
    /// only the kit ever takes the lock.
    armed: std::sync::atomic::AtomicBool,
    /// Requests answered from `recorded`.
    answered: AtomicU64,
}

/// A cloud response recorded by a driver author, given to a driver in place
/// of the real one (`berth driver test --faults`).
#[derive(Clone, Debug)]
pub struct Recorded {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

/// Why an outbound request was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Denial {
    NotAllowed,
    ForbiddenAddress(IpAddr),
    /// Loopback or private, reached through a name rather than a literal
    /// the allow-list names.
    InternalAddress(IpAddr),
    /// berth's own API.
    OwnAddress(SocketAddr),
    /// This process does not hold the pool's lease now.
    GateShut,
    BadUri,
    /// A user name or password in the URL.
    UserInfo,
    /// TRACE or CONNECT.
    Method(String),
    Unresolvable,
    /// Too many requests open at once.
    TooMany {
        limit: usize,
        scope: &'static str,
    },
}

impl std::fmt::Display for Denial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Denial::NotAllowed => f.write_str("host is not in the provider's allowed hosts"),
            Denial::ForbiddenAddress(ip) => write!(
                f,
                "address {ip} is link-local, cloud metadata, unspecified or multicast, never reachable"
            ),
            Denial::InternalAddress(ip) => write!(
                f,
                "address {ip} is loopback or private and the allowed hosts do not name it as a literal"
            ),
            Denial::OwnAddress(a) => write!(f, "{a} is berth's own API, never reachable"),
            Denial::GateShut => f.write_str(
                "this process does not hold the pool's lease now, so it sends nothing to clouds",
            ),
            Denial::BadUri => f.write_str("request has no host"),
            Denial::UserInfo => f.write_str("a user name or password in the URL is refused"),
            Denial::Method(m) => write!(f, "method {m} is refused"),
            Denial::Unresolvable => f.write_str("host name does not resolve"),
            Denial::TooMany { limit, scope } => write!(
                f,
                "{limit} outbound requests of this {scope} are already open (the limit)"
            ),
        }
    }
}

impl HttpPolicy {
    pub fn new(provider: Arc<str>, allowed: Vec<AllowedHost>) -> Self {
        let limits = SandboxLimits::default();
        HttpPolicy {
            provider: provider.clone(),
            allowed,
            credentials: Held::new(provider.clone(), Vec::new()),
            own: Vec::new(),
            outbound: Arc::new(Semaphore::new(limits.max_outbound)),
            max_outbound: limits.max_outbound,
            max_response_bytes: limits.max_response_bytes,
            denied: AtomicU64::new(0),
            gate: Arc::new(Gate::always()),
            recorded: std::sync::Mutex::new(None),
            armed: std::sync::atomic::AtomicBool::new(false),
            answered: AtomicU64::new(0),
        }
    }

    /// From now on answers every allowed request with `recorded`, sending
    /// nothing; `None` sends requests again.
    pub(crate) fn answer_with(&self, recorded: Option<Recorded>) {
        let mut slot = self.recorded.lock().unwrap_or_else(|p| p.into_inner());
        self.armed.store(recorded.is_some(), Ordering::Release);
        *slot = recorded;
    }

    /// Requests answered with a recorded response so far.
    pub(crate) fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    fn recorded(&self) -> Option<Recorded> {
        if !self.armed.load(Ordering::Acquire) {
            return None;
        }
        self.recorded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The same policy, sending nothing while `gate` is shut.
    pub fn gated(mut self, gate: Arc<Gate>) -> Self {
        self.gate = gate;
        self
    }

    /// The same policy, with `credentials` added to the requests they name.
    pub fn with_credentials(mut self, credentials: Vec<Credential>) -> Self {
        self.credentials = Held::new(self.provider.clone(), credentials);
        self
    }

    /// The provider's credentials as they run.
    pub(crate) fn credentials(&self) -> &Held {
        &self.credentials
    }

    /// The same policy, never reaching `own` (berth's API).
    pub fn denying(mut self, own: Vec<SocketAddr>) -> Self {
        self.own = own;
        self
    }

    /// The same policy, with the provider's outbound limits.
    pub fn limited(mut self, limits: &SandboxLimits) -> Self {
        self.outbound = Arc::new(Semaphore::new(limits.max_outbound.max(1)));
        self.max_outbound = limits.max_outbound.max(1);
        self.max_response_bytes = limits.max_response_bytes;
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
        if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
            return Err(Denial::UserInfo);
        }
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
        // Allow-list entries are kept canonical, and so is `host` when they
        // are compared (`AllowedHost::matches`).
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
        // Every address a name has is checked, not just the one used: a
        // name with one bad address is refused as a whole.
        for a in &addrs {
            if is_forbidden_ip(a.ip()) {
                return Err(Denial::ForbiddenAddress(a.ip()));
            }
            if is_internal_ip(a.ip()) && !self.names_literal(a.ip(), port) {
                return Err(Denial::InternalAddress(a.ip()));
            }
            if self.is_own(*a) {
                return Err(Denial::OwnAddress(*a));
            }
        }
        addrs.first().copied().ok_or(Denial::Unresolvable)
    }

    /// The addresses a readiness probe of an instance at `host` (as its
    /// cloud reported it) may connect to on `port`. The instance's own
    /// addresses, private or public, are what a probe is for; never a
    /// link-local, metadata, unspecified, broadcast or multicast address, nor
    /// berth's own API; this host's loopback only where the provider's
    /// allow-list names that address (a cloud on this host, as in tests). A
    /// name is resolved and every address it has is checked.
    pub async fn probe_addresses(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => tokio::net::lookup_host((host, port))
                .await
                .map_err(|e| format!("{host} does not resolve: {e}"))?
                .collect(),
        };
        for a in &addrs {
            let ip = a.ip();
            if is_forbidden_ip(ip) {
                return Err(Denial::ForbiddenAddress(ip).to_string());
            }
            if self.is_own(*a) {
                return Err(Denial::OwnAddress(*a).to_string());
            }
            let canonical = canonical_ip(ip);
            if canonical.is_loopback()
                && !self.allowed.iter().any(|h| h.names(&canonical.to_string()))
            {
                return Err(format!(
                    "address {ip} is this host's loopback; a probe reaches it only where the provider's allowed hosts name it"
                ));
            }
        }
        if addrs.is_empty() {
            return Err(Denial::Unresolvable.to_string());
        }
        Ok(addrs)
    }

    /// Whether the allow-list names `ip` itself (in any of its forms, for
    /// `port`).
    fn names_literal(&self, ip: IpAddr, port: u16) -> bool {
        let text = canonical_ip(ip).to_string();
        self.allowed.iter().any(|a| a.matches(&text, port))
    }

    /// Whether `addr` is berth's own API: its address (in any of its
    /// forms), or for an API listening on every address, any address of
    /// this host on its port.
    fn is_own(&self, addr: SocketAddr) -> bool {
        let ip = canonical_ip(addr.ip());
        self.own.iter().any(|own| {
            let own_ip = canonical_ip(own.ip());
            own.port() == addr.port()
                && (own_ip == ip
                    || (own_ip.is_unspecified()
                        && (is_internal_ip(ip)
                            || local_addresses().into_iter().any(|l| canonical_ip(l) == ip))))
        })
    }

    /// Takes a permit for one more outbound request of the provider.
    fn open(&self) -> Result<OwnedSemaphorePermit, Denial> {
        self.outbound
            .clone()
            .try_acquire_owned()
            .map_err(|_| Denial::TooMany {
                limit: self.max_outbound,
                scope: "provider",
            })
    }
}

/// The addresses of this host's network interfaces.
fn local_addresses() -> Vec<IpAddr> {
    #[cfg(target_os = "linux")]
    if let Ok(interfaces) = nix::ifaddrs::getifaddrs() {
        return interfaces
            .filter_map(|i| i.address)
            .filter_map(|a| {
                if let Some(v4) = a.as_sockaddr_in() {
                    Some(IpAddr::V4(v4.ip()))
                } else {
                    a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
                }
            })
            .collect();
    }
    Vec::new()
}

/// The hooks the host's wasi:http implementation calls for each request.
pub(crate) struct Hooks {
    policy: Arc<HttpPolicy>,
    /// One permit per outbound request of this instance open at once.
    outbound: Arc<Semaphore>,
    max_outbound: usize,
    /// Connect and first-byte timeouts, when the guest sets none: no
    /// request needs to wait longer than a call may take.
    call_deadline: Duration,
    /// Where the instance's caller logs: wasi:http sends each request on a
    /// task of its own, which would otherwise log nowhere in particular.
    dispatch: tracing::Dispatch,
}

impl Hooks {
    /// The hooks of one instance of the provider `policy` governs, within
    /// `limits`, logging to `dispatch`.
    pub(crate) fn new(
        policy: Arc<HttpPolicy>,
        limits: &SandboxLimits,
        dispatch: tracing::Dispatch,
    ) -> Self {
        Hooks {
            policy,
            outbound: Arc::new(Semaphore::new(limits.max_outbound_per_instance.max(1))),
            max_outbound: limits.max_outbound_per_instance.max(1),
            call_deadline: limits.call_deadline,
            dispatch,
        }
    }
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
        // Taken now, before anything is opened: a guest that starts
        // requests without waiting for them cannot run past the limits.
        let permits = self
            .outbound
            .clone()
            .try_acquire_owned()
            .map_err(|_| Denial::TooMany {
                limit: self.max_outbound,
                scope: "driver instance",
            })
            .and_then(|instance| Ok((instance, policy.open()?)));
        let dispatch = self.dispatch.clone();
        let mut options = options.unwrap_or_default();
        options.connect_timeout.get_or_insert(self.call_deadline);
        options.first_byte_timeout.get_or_insert(self.call_deadline);
        options
            .between_bytes_timeout
            .get_or_insert(self.call_deadline);
        Box::new(async move {
            let url = berth_core::text::printable(&request.uri().to_string()).into_owned();
            let refuse = |denial: Denial| {
                policy.note_denied(&url, &denial);
                Err(match denial {
                    Denial::Unresolvable => wasmtime_wasi_http::Error::DestinationNotFound,
                    Denial::ForbiddenAddress(_)
                    | Denial::InternalAddress(_)
                    | Denial::OwnAddress(_) => wasmtime_wasi_http::Error::DestinationIpProhibited,
                    Denial::TooMany { .. } => wasmtime_wasi_http::Error::ConnectionLimitReached,
                    Denial::Method(_) => wasmtime_wasi_http::Error::HttpRequestMethodInvalid,
                    Denial::NotAllowed | Denial::BadUri | Denial::UserInfo | Denial::GateShut => {
                        wasmtime_wasi_http::Error::HttpRequestDenied
                    }
                })
            };
            let permits = match permits {
                Ok(p) => p,
                Err(denial) => return refuse(denial),
            };
            // TRACE echoes the request, credentials the host added
            // included; CONNECT makes a tunnel no allow-list can see into.
            if matches!(request.method().as_str(), "TRACE" | "CONNECT") {
                return refuse(Denial::Method(request.method().to_string()));
            }
            let addr = match policy.authorize(request.uri()).await {
                Ok(addr) => addr,
                Err(denial) => return refuse(denial),
            };
            if let Some(recorded) = policy.recorded() {
                policy.answered.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(provider = %policy.provider, %url, status = recorded.status, "answered with a recorded response");
                return recorded_response(recorded);
            }
            let held = policy.credentials();
            let host = request.uri().host().unwrap_or("").to_owned();
            let (response, io) = match held.find(&host, addr.port()) {
                None => {
                    pin_address(&mut request, addr);
                    // Checked last, after every await before the send: a
                    // process paused anywhere above finds the gate shut
                    // when it resumes.
                    if !policy.gate.is_open() {
                        return refuse(Denial::GateShut);
                    }
                    tracing::debug!(provider = %policy.provider, %url, "outbound request");
                    wasmtime_wasi_http::default_send_request(request, Some(options))
                        .await
                        .map(boxed)?
                }
                Some(cell) => {
                    let (parts, body) = match buffered(request).await {
                        Ok(b) => b,
                        Err(why) => {
                            tracing::warn!(provider = %policy.provider, %url, reason = %why, "outbound request denied");
                            policy.denied.fetch_add(1, Ordering::Relaxed);
                            return Err(wasmtime_wasi_http::Error::HttpRequestDenied);
                        }
                    };
                    let issued = match held.current(cell).await {
                        Ok(i) => i,
                        Err(unusable) => return unusable_response(&host, &unusable),
                    };
                    let send = |issued: Arc<Issued>| {
                        let policy = policy.clone();
                        let (parts, body) = (copy_parts(&parts), body.clone());
                        async move {
                            let request = match signed(parts, body, &issued, addr) {
                                Ok(r) => r,
                                Err(why) => {
                                    tracing::warn!(provider = %policy.provider, reason = %why, "outbound request denied");
                                    policy.denied.fetch_add(1, Ordering::Relaxed);
                                    return Err(wasmtime_wasi_http::Error::HttpRequestDenied);
                                }
                            };
                            if !policy.gate.is_open() {
                                policy.note_denied(&request.uri().to_string(), &Denial::GateShut);
                                return Err(wasmtime_wasi_http::Error::HttpRequestDenied);
                            }
                            match &issued.material {
                                credentials::Material::ClientTls(tls) => {
                                    crate::mtls::send(request, options, tls.clone(), addr).await
                                }
                                _ => wasmtime_wasi_http::default_send_request(request, Some(options))
                                    .await
                                    .map(boxed),
                            }
                        }
                    };
                    tracing::debug!(provider = %policy.provider, %url, "outbound request with credential");
                    let generation = issued.generation;
                    let first = send(issued).await?;
                    let status = first.0.status();
                    match replay_after(held, cell, status, generation).await {
                        Some(fresh) => {
                            drop(first);
                            cell.replayed();
                            tracing::debug!(provider = %policy.provider, %url, "sent again with a new token after 401");
                            send(fresh).await?
                        }
                        None => first,
                    }
                }
            };
            let max = policy.max_response_bytes;
            // Taken after any exchange above: it masks every token sent.
            let response = match held.scrubber() {
                Some(scrubber) => {
                    let (mut parts, body) = response.into_parts();
                    scrubber.headers(&mut parts.headers);
                    let body = limit_body(scrubber.body(body), max);
                    http::Response::from_parts(parts, body)
                }
                None => response.map(|body| limit_body(body, max)),
            };
            // The permits are held until the connection is done with.
            let io = async move {
                let done = io.await;
                drop(permits);
                done
            };
            Ok((
                response,
                Box::new(io)
                    as Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>,
            ))
        }
        .with_subscriber(dispatch))
    }
}

/// The I/O of one connection, finished after its response is read.
pub(crate) type Io =
    std::pin::Pin<Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>>;

/// What `default_send_request` answers, in types that name no closure.
pub(crate) fn boxed<B>(
    (response, io): (
        http::Response<B>,
        impl Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send + 'static,
    ),
) -> (http::Response<wasmtime_wasi_http::WasiBody>, Io)
where
    B: http_body::Body<Data = bytes::Bytes, Error = wasmtime_wasi_http::Error> + Send + 'static,
{
    (response.map(|b| b.boxed_unsync()), Box::pin(io))
}

/// A response, and the future that finishes its connection's I/O.
type Sent = (
    http::Response<wasmtime_wasi_http::WasiBody>,
    Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>,
);

/// `recorded` as the response to a request, with nothing sent.
fn recorded_response(recorded: Recorded) -> Result<Sent, wasmtime_wasi_http::Error> {
    let body = http_body_util::Full::new(bytes::Bytes::from(recorded.body))
        .map_err(|never| match never {})
        .boxed_unsync();
    let mut response = http::Response::builder().status(recorded.status);
    for (name, value) in &recorded.headers {
        response = response.header(name, value);
    }
    let response = response
        .body(body)
        .map_err(|e| wasmtime_wasi_http::Error::InternalError(Some(e.to_string())))?;
    Ok((
        response,
        Box::new(async { Ok(()) })
            as Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>,
    ))
}

/// A response body that fails with `HttpResponseBodySize` once more than
/// `max` bytes have come.
fn limit_body<B>(body: B, max: u64) -> wasmtime_wasi_http::WasiBody
where
    B: http_body::Body<Data = bytes::Bytes, Error = wasmtime_wasi_http::Error> + Send + 'static,
{
    let max_usize = usize::try_from(max).unwrap_or(usize::MAX);
    http_body_util::Limited::new(body, max_usize)
        .map_err(move |e| match e.downcast::<wasmtime_wasi_http::Error>() {
            Ok(inner) => *inner,
            Err(_) => wasmtime_wasi_http::Error::HttpResponseBodySize(Some(max)),
        })
        .boxed_unsync()
}

/// Plain HTTP connects to the address that was checked, so a name cannot
/// be re-resolved to a forbidden address between the check and the
/// connect. TLS needs the name for SNI and certificate checks, so it
/// connects by name (see docs/sandbox.md).
fn pin_address(request: &mut http::Request<impl Sized>, addr: SocketAddr) {
    if request.uri().scheme() != Some(&http::uri::Scheme::HTTPS) {
        let mut parts = request.uri().clone().into_parts();
        if let Ok(authority) = http::uri::Authority::try_from(addr.to_string()) {
            parts.authority = Some(authority);
            if let Ok(uri) = http::Uri::from_parts(parts) {
                *request.uri_mut() = uri;
            }
        }
    }
}

/// A request that will carry a credential, its body read (to sign it, and
/// to send it again after a `401`); refused when it would cross a network
/// in the clear.
async fn buffered(
    request: http::Request<wasmtime_wasi_http::WasiBody>,
) -> Result<(http::request::Parts, bytes::Bytes), NotApplied> {
    let https = request.uri().scheme() == Some(&http::uri::Scheme::HTTPS);
    let host = request.uri().host().unwrap_or("").to_owned();
    if !credentials::may_send(&host, https) {
        return Err(NotApplied::Insecure(host));
    }
    let (parts, body) = request.into_parts();
    let body = http_body_util::Limited::new(body, credentials::MAX_SIGNED_BODY)
        .collect()
        .await
        .map_err(|_| NotApplied::BodyTooLarge(credentials::MAX_SIGNED_BODY))?
        .to_bytes();
    Ok((parts, body))
}

/// The head of a request again, to send it a second time.
fn copy_parts(parts: &http::request::Parts) -> http::request::Parts {
    let mut copy = http::Request::new(()).into_parts().0;
    copy.method = parts.method.clone();
    copy.uri = parts.uri.clone();
    copy.version = parts.version;
    copy.headers = parts.headers.clone();
    copy
}

/// `parts` and `body` with `issued` added, to be sent to `addr`.
fn signed(
    mut parts: http::request::Parts,
    body: bytes::Bytes,
    issued: &Issued,
    addr: SocketAddr,
) -> Result<http::Request<wasmtime_wasi_http::WasiBody>, NotApplied> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    credentials::apply(&issued.material, &mut parts, &body, now_ms)?;
    let body = http_body_util::Full::new(body)
        .map_err(|never| match never {})
        .boxed_unsync();
    let mut request = http::Request::from_parts(parts, body);
    pin_address(&mut request, addr);
    Ok(request)
}

/// After a response of `status` to a request that carried issue `generation` of
/// `cell`: the token to send it again with, when the host answered `401`
/// and the token could be renewed.
async fn replay_after(
    held: &Held,
    cell: &Cell,
    status: http::StatusCode,
    generation: u64,
) -> Option<Arc<Issued>> {
    if status != http::StatusCode::UNAUTHORIZED || !cell.exchanged() {
        return None;
    }
    held.refused(cell, generation).await
}

/// What the guest gets when its request needed a credential that could
/// not be had: `401` when the credential was refused (the driver says
/// `unauthorized`), `503` when its issuer is out of reach (`transient`);
/// nothing is sent to the host.
fn unusable_response(host: &str, unusable: &Unusable) -> Result<Sent, wasmtime_wasi_http::Error> {
    let status = if unusable.refused { 401 } else { 503 };
    let body = serde_json::json!({
        "error": {
            "code": status,
            "message": format!(
                "berth holds no usable credential for {host}: {}",
                unusable.message
            ),
        }
    });
    recorded_response(Recorded {
        status,
        headers: vec![
            ("content-type".to_owned(), "application/json".to_owned()),
            ("x-berth-credential".to_owned(), "unusable".to_owned()),
        ],
        body: body.to_string(),
    })
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
        // A name that resolves to loopback is refused unless the address
        // itself is allowed as a literal.
        assert_eq!(
            check(&["localhost:1"], "http://LOCALHOST:1/").await,
            Err(Denial::InternalAddress("127.0.0.1".parse().unwrap()))
        );
        assert_eq!(
            check(&["localhost:1", "127.0.0.1:1"], "http://LOCALHOST:1/")
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
    async fn probes_reach_an_instances_own_addresses_and_nothing_else() {
        let p = policy(&["127.0.0.1:9000"]).denying(vec!["0.0.0.0:8080".parse().unwrap()]);
        let ok = |a: &str| vec![a.parse::<SocketAddr>().unwrap()];
        assert_eq!(
            p.probe_addresses("10.0.0.5", 22).await,
            Ok(ok("10.0.0.5:22"))
        );
        assert_eq!(
            p.probe_addresses("203.0.113.9", 22).await,
            Ok(ok("203.0.113.9:22"))
        );
        // Loopback the allow-list names, on any port; not another.
        assert_eq!(
            p.probe_addresses("127.0.0.1", 2222).await,
            Ok(ok("127.0.0.1:2222"))
        );
        assert!(
            p.probe_addresses("127.0.0.2", 22)
                .await
                .unwrap_err()
                .contains("loopback")
        );
        for other in ["::1", "::ffff:127.0.0.2", "::ffff:0:7f00:2"] {
            let e = p.probe_addresses(other, 22).await.unwrap_err();
            assert!(e.contains("loopback"), "{other}: {e}");
        }
        // The allow-listed loopback in another form is that address.
        assert_eq!(
            p.probe_addresses("::ffff:127.0.0.1", 2222).await,
            Ok(ok("[::ffff:127.0.0.1]:2222"))
        );
        for bad in [
            "169.254.169.254",
            "[fd00:ec2::254]",
            "::ffff:169.254.169.254",
            "::ffff:0:a9fe:a9fe",
            "0.0.0.0",
            "224.0.0.1",
        ] {
            let e = p.probe_addresses(bad, 22).await.unwrap_err();
            assert!(e.contains("never reachable"), "{bad}: {e}");
        }
        // berth's own API, listening on every address.
        let e = p.probe_addresses("10.1.2.3", 8080).await.unwrap_err();
        assert!(e.contains("berth's own API"), "{e}");
        // A name is checked by what it resolves to.
        let none = policy(&["example.com"]);
        assert!(
            none.probe_addresses("localhost", 22)
                .await
                .unwrap_err()
                .contains("loopback")
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

    /// Regression: berth's own address was compared with plain equality,
    /// so `[::ffff:127.0.0.1]`, allow-listed, reached the API on
    /// 127.0.0.1.
    #[tokio::test]
    async fn own_address_is_refused_in_every_form() {
        let own: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        for form in [
            "[::ffff:127.0.0.1]",
            "[::ffff:7f00:1]",
            "[0:0:0:0:0:ffff:7f00:1]",
            "[::ffff:0:127.0.0.1]",
            "[::127.0.0.1]",
            "[64:ff9b::127.0.0.1]",
        ] {
            let p = policy(&[&format!("{form}:8080")]).denying(vec![own]);
            let got = p
                .authorize(&format!("http://{form}:8080/v1/nodes").parse().unwrap())
                .await;
            assert!(matches!(got, Err(Denial::OwnAddress(_))), "{form}: {got:?}");
            let probe = p.probe_addresses(form, 8080).await;
            assert!(
                probe.as_ref().is_err_and(|e| e.contains("berth's own API")),
                "{form}: {probe:?}"
            );
        }
        // berth's own address given in a mapped form, met as IPv4.
        let p = policy(&["127.0.0.1"]).denying(vec!["[::ffff:127.0.0.1]:8080".parse().unwrap()]);
        assert!(matches!(
            p.authorize(&"http://127.0.0.1:8080/".parse().unwrap())
                .await,
            Err(Denial::OwnAddress(_))
        ));
        // A literal is named in any of its forms: the allow-list's
        // `127.0.0.1:9` is the request's `[::ffff:127.0.0.1]:9`, and the
        // reverse.
        assert!(
            check(&["127.0.0.1:9"], "http://[::ffff:127.0.0.1]:9/")
                .await
                .is_ok()
        );
        assert!(
            check(&["[::ffff:127.0.0.1]:9"], "http://127.0.0.1:9/")
                .await
                .is_ok()
        );
        // The metadata address in SIIT's form, allow-listed.
        assert_eq!(
            check(
                &["*", "[::ffff:0:a9fe:a9fe]"],
                "http://[::ffff:0:a9fe:a9fe]/"
            )
            .await,
            Err(Denial::ForbiddenAddress(
                "::ffff:0:a9fe:a9fe".parse().unwrap()
            ))
        );
    }

    #[tokio::test]
    async fn own_address_user_info_and_methods_are_refused() {
        let own: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let p = policy(&["127.0.0.1"]).denying(vec![own]);
        assert_eq!(
            p.authorize(&"http://127.0.0.1:8080/v1/nodes".parse().unwrap())
                .await,
            Err(Denial::OwnAddress(own))
        );
        assert!(
            p.authorize(&"http://127.0.0.1:8081/".parse().unwrap())
                .await
                .is_ok()
        );
        // An API on every address: any address of this host on its port.
        let p = policy(&["127.0.0.1", "10.0.0.1"]).denying(vec!["0.0.0.0:9000".parse().unwrap()]);
        for url in ["http://127.0.0.1:9000/", "http://10.0.0.1:9000/"] {
            assert!(
                matches!(
                    p.authorize(&url.parse().unwrap()).await,
                    Err(Denial::OwnAddress(_))
                ),
                "{url}"
            );
        }
        assert_eq!(
            policy(&["example.com"])
                .authorize(&"http://user:pw@example.com/".parse().unwrap())
                .await,
            Err(Denial::UserInfo)
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
