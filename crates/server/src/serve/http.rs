//! The API's HTTP/1.1 server: the router on hyper's connection, with the
//! limits `axum::serve` does not set.
//!
//! - **Header time** (`header-timeout`): a connection must send a request's
//!   head within this, counted from its start or from the end of its
//!   previous answer, so an idle kept-alive connection ends after it too.
//!   hyper enforces it (its `header_read_timeout` restarts while a
//!   connection waits for the next request).
//! - **Body time** (`body-timeout`) and size are enforced by the router's own
//!   layer (`api::bounded_body`), so that in-process users of the router
//!   get them as well.
//! - **Connections** (`max-connections`, and never more than half the
//!   process's open-file limit, so that drivers and the store keep fds): at
//!   the cap, a new connection that has sent nothing is closed at once, and
//!   one whose request has come closes the connections that have waited
//!   longest for a request; a connection whose request is being answered,
//!   or has arrived unread, is never cut. Only when every connection is
//!   busy is a new one with a request closed (after a short wait).
//! - **Long-polls** (`GET /v1/requests/{id}?wait=`) hold their connection
//!   while they wait: at most all but a reserve ([`reserve`]) wait at once,
//!   and one more is answered at once (`Retry-After: 1`). So clients
//!   waiting on their requests never hold every connection: a health
//!   check, an admin call or a short request finds a connection that is
//!   idle (and can be closed to make room) or free.
//! - **Deferred accept** (Linux `TCP_DEFER_ACCEPT`): a connection reaches
//!   berth once its first bytes come, or after a second without any, so an
//!   idle flood waits in the kernel and costs no fd, and a connection just
//!   accepted has its request there already.
//! - **Stop**: the listener closes, idle connections close, and answers in
//!   progress are finished (for at most [`STOP_WAIT`]).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tower::ServiceExt;

use crate::telemetry::Telemetry;

/// How long a stop waits for answers in progress.
pub const STOP_WAIT: Duration = Duration::from_secs(10);

/// Connections the kernel may queue before berth accepts them (capped by
/// the system's `somaxconn`). Large, so that a burst of connections waits
/// to be accepted (and then closed or served by the rules here) instead of
/// being held half-open by the kernel for seconds.
const BACKLOG: u32 = 4096;

/// Listens on `addr` with [`BACKLOG`], and on Linux with
/// `TCP_DEFER_ACCEPT`.
pub fn listen(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    defer_accept(&socket);
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// A connection is handed to berth once its first bytes have come (or,
/// without any, after about a second): a flood of connections that send
/// nothing waits in the kernel, costing berth no fd, and a connection berth
/// accepts almost always has its request there already, so it is never
/// taken for an idle one. (nginx's `deferred`.) Best effort: without it the
/// rules above still hold.
#[cfg(target_os = "linux")]
fn defer_accept(socket: &tokio::net::TcpSocket) {
    if let Err(error) = super::sys::set_tcp_defer_accept(socket, 1) {
        tracing::debug!(%error, "TCP_DEFER_ACCEPT not set");
    }
}

#[cfg(not(target_os = "linux"))]
fn defer_accept(_: &tokio::net::TcpSocket) {}

/// How long the accept loop, at the cap with no connection to close, waits
/// for one before it refuses the new connection.
const EVICT_PATIENCE: Duration = Duration::from_millis(100);

/// Connections kept from long-polls at a cap of `max_connections`: a
/// sixteenth, at least 16 (all of a cap of 16 or less but one).
pub fn reserve(max_connections: usize) -> usize {
    (max_connections / 16)
        .max(16)
        .min(max_connections.saturating_sub(1))
}

/// How many long-polls may wait at once under a cap of `max_connections`:
/// the rest are kept for everything else ([`reserve`]).
pub fn waits_within(max_connections: usize) -> usize {
    max_connections - reserve(max_connections)
}

/// The server's limits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub header_timeout: Duration,
    pub max_connections: usize,
}

/// `max_connections`, lowered to half the open-file limit when that is
/// smaller (after raising the soft limit to the hard one): the rest is
/// left to drivers' outgoing requests, the store and the runtime. Returns
/// the cap and the limit it was derived from.
pub fn connection_cap(max_connections: usize) -> (usize, Option<u64>) {
    match raise_open_file_limit() {
        Some(limit) => {
            let half = usize::try_from(limit / 2).unwrap_or(usize::MAX);
            (max_connections.min(half).max(1), Some(limit))
        }
        None => (max_connections, None),
    }
}

/// Raises the soft open-file limit to the hard one and returns it.
#[cfg(unix)]
fn raise_open_file_limit() -> Option<u64> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    // `None` is no limit.
    let mut lim = getrlimit(Resource::Nofile);
    let below = match (lim.current, lim.maximum) {
        (Some(current), Some(maximum)) => current < maximum,
        (Some(_), None) => true,
        (None, _) => false,
    };
    if below {
        let raised = Rlimit {
            current: lim.maximum,
            maximum: lim.maximum,
        };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            lim.current = lim.maximum;
        }
    }
    lim.current
}

#[cfg(not(unix))]
fn raise_open_file_limit() -> Option<u64> {
    None
}

/// One open connection, as the accept loop sees it.
struct Conn {
    /// Requests being answered on it.
    busy: AtomicUsize,
    /// Its socket, to see whether a request has arrived unread; valid
    /// while the connection is in [`Conns`] (its task removes it before
    /// closing the socket).
    fd: RawFd,
    /// Since when it has waited for a request (its start, or its last
    /// answer); meaningful while `busy` is 0.
    waiting_since: Mutex<Instant>,
    /// Told when the connection is closed to make room.
    evict: Notify,
}

/// The open connections.
#[derive(Default)]
struct Conns {
    next: u64,
    open: HashMap<u64, Arc<Conn>>,
}

impl Conns {
    /// Closes up to `n` of the connections that have waited longest for a
    /// request; returns how many, 0 if every one is busy or new.
    fn evict_longest_waiting(&mut self, n: usize) -> usize {
        let mut waiting: Vec<(Instant, u64)> = self
            .open
            .iter()
            .filter(|(_, c)| c.busy.load(Ordering::SeqCst) == 0 && !unread_data(c.fd))
            .map(|(id, c)| {
                (
                    *c.waiting_since.lock().unwrap_or_else(|e| e.into_inner()),
                    *id,
                )
            })
            .collect();
        waiting.sort_unstable();
        let mut evicted = 0;
        for (_, id) in waiting.into_iter().take(n) {
            if let Some(conn) = self.open.remove(&id) {
                conn.evict.notify_one();
                evicted += 1;
            }
        }
        evicted
    }
}

/// Whether bytes have arrived on `fd` that no one has read yet: a request
/// sent a moment ago, which makes the connection not idle, however long it
/// waited before.
#[cfg(unix)]
fn unread_data(fd: RawFd) -> bool {
    super::sys::unread_bytes(fd).is_some_and(|n| n > 0)
}

#[cfg(not(unix))]
fn unread_data(_: RawFd) -> bool {
    false
}

#[cfg(unix)]
type RawFd = std::os::fd::RawFd;
#[cfg(not(unix))]
type RawFd = i32;

/// Marks a connection busy while a request on it is answered.
struct Busy(Arc<Conn>);

impl Busy {
    fn new(conn: &Arc<Conn>) -> Busy {
        conn.busy.fetch_add(1, Ordering::SeqCst);
        Busy(conn.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        *self
            .0
            .waiting_since
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Instant::now();
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(unix)]
fn raw_fd(stream: &tokio::net::TcpStream) -> RawFd {
    std::os::fd::AsRawFd::as_raw_fd(stream)
}

#[cfg(not(unix))]
fn raw_fd(_: &tokio::net::TcpStream) -> RawFd {
    -1
}

/// Serves `router` on `listener` (over TLS with `tls`) until `shutdown`
/// completes, then stops as the module says.
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
    limits: Limits,
    telemetry: Arc<Telemetry>,
    shutdown: impl Future<Output = ()>,
) {
    let conns = Arc::new(Mutex::new(Conns::default()));
    // One permit per connection, held until its socket is closed: the cap
    // counts sockets, not table entries, so an evicted connection is
    // closed before its successor is served.
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    // Accept errors (the open-file limit reached) are said once a minute.
    let mut accept_failing: Option<Instant> = None;
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            // A connection that went away before it was accepted is
            // nothing to say or wait for.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset
                ) =>
            {
                continue;
            }
            // Anything else (no fds) is said, and waited out, or this spins.
            Err(e) => {
                if accept_failing.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                    accept_failing = Some(Instant::now());
                    tracing::error!(error = %e, "the API cannot accept connections");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // At the cap, a new connection that has sent nothing (with
        // TCP_DEFER_ACCEPT: nothing in its first second) is closed at once;
        // one whose request is there makes room: the connections that have
        // waited longest for a request are closed, and it waits for a
        // socket to go. With none to close (all busy, or with a request just
        // arrived), it waits up to EVICT_PATIENCE for one, then is refused.
        let mut patience = Instant::now() + EVICT_PATIENCE;
        let permit = loop {
            if let Ok(permit) = permits.clone().try_acquire_owned() {
                break Some(permit);
            }
            if !unread_data(raw_fd(&stream)) {
                break None;
            }
            // Several at once, so that a flood does not make every accept
            // wait for one socket to close.
            let evicted = conns
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .evict_longest_waiting(limits.max_connections.div_ceil(16));
            if evicted > 0 {
                patience = Instant::now() + EVICT_PATIENCE;
                let acquired =
                    tokio::time::timeout(Duration::from_secs(1), permits.clone().acquire_owned());
                if let Ok(Ok(permit)) = acquired.await {
                    break Some(permit);
                }
            } else if Instant::now() >= patience {
                break None;
            } else {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        let Some(permit) = permit else {
            telemetry.http_connection_closed("refused");
            drop(stream);
            continue;
        };
        let (id, conn) = {
            let mut table = conns.lock().unwrap_or_else(|e| e.into_inner());
            let conn = Arc::new(Conn {
                busy: AtomicUsize::new(0),
                fd: raw_fd(&stream),
                waiting_since: Mutex::new(Instant::now()),
                evict: Notify::new(),
            });
            let id = table.next;
            table.next += 1;
            table.open.insert(id, conn.clone());
            telemetry.http_connections_open(table.open.len());
            (id, conn)
        };
        let _ = stream.set_nodelay(true);
        let connection = Connection {
            id,
            conn,
            router: router.clone(),
            conns: conns.clone(),
            telemetry: telemetry.clone(),
            header_timeout: limits.header_timeout,
            watcher: graceful.watcher(),
        };
        match &tls {
            None => {
                tokio::spawn(connection.serve(stream, permit));
            }
            Some(tls) => {
                tokio::spawn(connection.serve_tls(stream, tls.clone(), permit));
            }
        }
    }
    drop(listener);
    if tokio::time::timeout(STOP_WAIT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            "answers still in progress {}s after the stop were cut",
            STOP_WAIT.as_secs()
        );
    }
}

/// One accepted connection, to be served on its own task.
struct Connection {
    id: u64,
    conn: Arc<Conn>,
    router: axum::Router,
    conns: Arc<Mutex<Conns>>,
    telemetry: Arc<Telemetry>,
    header_timeout: Duration,
    watcher: hyper_util::server::graceful::Watcher,
}

impl Connection {
    /// Serves requests on `io` until the client closes, a timeout, an
    /// eviction or the stop; `permit` (its place under the cap) is given
    /// back once the socket is closed.
    async fn serve<I>(self, io: I, permit: tokio::sync::OwnedSemaphorePermit)
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let Connection {
            id,
            conn,
            router,
            conns,
            telemetry,
            header_timeout,
            watcher,
        } = self;
        let service = {
            let conn = conn.clone();
            hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let busy = Busy::new(&conn);
                let router = router.clone();
                async move {
                    let answer = router.oneshot(req.map(axum::body::Body::new)).await;
                    drop(busy);
                    answer
                }
            })
        };
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .serve_connection(TokioIo::new(io), service);
        let mut connection = Box::pin(watcher.watch(connection));
        loop {
            tokio::select! {
                served = &mut connection => {
                    if let Err(e) = served
                        && e.is_timeout()
                    {
                        telemetry.http_connection_closed("header_timeout");
                    }
                    break;
                }
                () = conn.evict.notified() => {
                    // Looked at again at the last moment: a request that
                    // came since the accept loop chose this connection
                    // is answered, not reset.
                    if conn.busy.load(Ordering::SeqCst) == 0 && !unread_data(conn.fd) {
                        telemetry.http_connection_closed("evicted");
                        break;
                    }
                    conns
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .open
                        .insert(id, conn.clone());
                }
            }
        }
        Self::forget(&conns, &telemetry, id);
        // Out of the table first: its fd number is not looked at after
        // the socket is closed.
        drop(connection);
        drop(permit);
    }

    /// Serves requests over TLS on `stream` once its handshake is done.
    /// The handshake has the time a request's head has, and a connection
    /// closed to make room during it is closed at once.
    async fn serve_tls(
        self,
        stream: tokio::net::TcpStream,
        tls: tokio_rustls::TlsAcceptor,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) {
        let handshake = tokio::time::timeout(self.header_timeout, tls.accept(stream));
        let reason = tokio::select! {
            done = handshake => match done {
                Ok(Ok(stream)) => return self.serve(stream, permit).await,
                Ok(Err(error)) => {
                    tracing::debug!(%error, "a TLS handshake failed");
                    "tls_handshake"
                }
                Err(_) => "tls_handshake_timeout",
            },
            () = self.conn.evict.notified() => "evicted",
        };
        // The socket is closed (with the handshake) before it leaves the
        // table, and its place under the cap is given back last.
        self.telemetry.http_connection_closed(reason);
        Self::forget(&self.conns, &self.telemetry, self.id);
        drop(permit);
    }

    fn forget(conns: &Mutex<Conns>, telemetry: &Telemetry, id: u64) {
        let mut table = conns.lock().unwrap_or_else(|e| e.into_inner());
        table.open.remove(&id);
        telemetry.http_connections_open(table.open.len());
    }
}
