//! What every fake cloud shares: serving on 127.0.0.1:0, the knobs a test
//! turns (calls counted, answers injected, answers held back, lists that
//! lag), the check of a caller's token, and the record of machines.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

/// A router served on 127.0.0.1:0 over HTTP/1.1 until dropped.
pub struct Served {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Served {
    pub async fn start(app: Router) -> Served {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { break };
                        let service = hyper_util::service::TowerToHyperService::new(app.clone());
                        connections.spawn(async move {
                            let io = hyper_util::rt::TokioIo::new(stream);
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(io, service)
                                .await;
                        });
                    }
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        Served { addr, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Locks a fake cloud's state; a test that panicked while holding it
/// poisoned it, and the state is still what it was.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Checks the token a request carries: `Ok` lets it through, `Err` says why
/// not, in words the cloud's 401 carries. A test plugs in a token server's
/// record, or a fixed token.
pub type TokenCheck = Arc<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// A check that takes exactly `tokens` (a cloud's API tokens, made in its
/// console); the list can change while the cloud serves.
pub fn fixed_tokens(tokens: Arc<Mutex<Vec<String>>>) -> TokenCheck {
    Arc::new(move |token: &str| {
        if lock(&tokens).iter().any(|t| t == token) {
            Ok(())
        } else {
            Err("unknown token".into())
        }
    })
}

/// The bearer token of `Authorization: Bearer …`, if any.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
        .filter(|t| !t.is_empty())
}

/// A ready answer: status, headers and body, as a test injects it or a
/// cloud builds its error.
#[derive(Clone, Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    /// A JSON answer.
    pub fn json(status: u16, body: &serde_json::Value) -> Answer {
        Answer {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.to_string(),
        }
    }

    pub fn with_header(mut self, name: &str, value: impl Into<String>) -> Answer {
        self.headers.push((name.into(), value.into()));
        self
    }
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        let mut response = Response::new(Body::from(self.body));
        *response.status_mut() =
            StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        for (name, value) in self.headers {
            if let (Ok(n), Ok(v)) = (
                HeaderName::try_from(name.as_str()),
                HeaderValue::try_from(value.as_str()),
            ) {
                response.headers_mut().append(n, v);
            }
        }
        response
    }
}

/// What a test turns on a fake cloud, by operation name (each cloud names
/// its operations, e.g. `servers.create`, and lists them in its docs).
#[derive(Default)]
pub struct Knobs {
    calls: Mutex<BTreeMap<String, u64>>,
    injected: Mutex<BTreeMap<String, VecDeque<Answer>>>,
    holds: Mutex<BTreeMap<String, Duration>>,
    lag: Mutex<Duration>,
}

impl Knobs {
    /// Counts a call of `op` and gives the answer a test injected for it,
    /// if any: the cloud answers that instead of doing anything.
    pub fn enter(&self, op: &str) -> Option<Answer> {
        *lock(&self.calls).entry(op.to_owned()).or_default() += 1;
        let mut injected = lock(&self.injected);
        let queue = injected.get_mut(op)?;
        let answer = queue.pop_front();
        if queue.is_empty() {
            injected.remove(op);
        }
        answer
    }

    /// Calls answered so far, by operation (injected answers included).
    pub fn calls(&self) -> BTreeMap<String, u64> {
        lock(&self.calls).clone()
    }

    /// Calls of `op` so far.
    pub fn count(&self, op: &str) -> u64 {
        lock(&self.calls).get(op).copied().unwrap_or(0)
    }

    /// The next `times` calls of `op` are answered `answer`, doing nothing.
    pub fn inject(&self, op: &str, answer: Answer, times: usize) {
        let mut injected = lock(&self.injected);
        let queue = injected.entry(op.to_owned()).or_default();
        queue.extend(std::iter::repeat_n(answer, times));
    }

    /// Answers of `op` are held back `delay` after the cloud did what they
    /// report (a caller killed meanwhile never learns of it); zero stops it.
    pub fn hold(&self, op: &str, delay: Duration) {
        let mut holds = lock(&self.holds);
        if delay.is_zero() {
            holds.remove(op);
        } else {
            holds.insert(op.to_owned(), delay);
        }
    }

    /// Waits as long as answers of `op` are held back.
    pub async fn held(&self, op: &str) {
        let delay = lock(&self.holds).get(op).copied();
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
    }

    /// A machine made less than `lag` ago is left out of lists and
    /// lookups by filter, as an eventually consistent read may leave it
    /// out; zero (the default) shows it at once.
    pub fn set_lag(&self, lag: Duration) {
        *lock(&self.lag) = lag;
    }

    /// Whether a machine made at `created` shows in lists yet.
    pub fn listed(&self, created: Instant) -> bool {
        created.elapsed() >= *lock(&self.lag)
    }
}

/// One machine as a fake cloud's own record has it, for counting leaks and
/// duplicates after a test: every machine the cloud ever made, deleted ones
/// included.
#[derive(Clone, Debug)]
pub struct Machine {
    /// The cloud's id.
    pub id: String,
    /// Its name.
    pub name: String,
    /// Its tags or labels as the cloud stores them (label-encoded values on
    /// clouds that restrict them).
    pub tags: BTreeMap<String, String>,
    /// The cloud's status word.
    pub status: String,
    /// Deleted (gone from the cloud's API).
    pub deleted: bool,
}

impl Machine {
    pub fn tag(&self, key: &str) -> Option<&str> {
        self.tags.get(key).map(String::as_str)
    }
}

/// The machines not deleted that carry `pool_key` = `pool`, grouped by the
/// value of `node_key`: a test asserts each node has one, and that every
/// one belongs to a node berth still holds.
pub fn live_by_node<'a>(
    machines: &'a [Machine],
    pool_key: &str,
    pool: &str,
    node_key: &str,
) -> BTreeMap<String, Vec<&'a Machine>> {
    let mut by_node: BTreeMap<String, Vec<&Machine>> = BTreeMap::new();
    for m in machines
        .iter()
        .filter(|m| !m.deleted && m.tag(pool_key) == Some(pool))
    {
        let node = m.tag(node_key).unwrap_or_default().to_owned();
        by_node.entry(node).or_default().push(m);
    }
    by_node
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn injected_answers_are_used_up_in_order_and_every_call_counts() {
        let knobs = Knobs::default();
        knobs.inject(
            "servers.create",
            Answer::json(429, &serde_json::json!({})),
            2,
        );
        assert!(knobs.enter("servers.create").is_some());
        assert!(knobs.enter("servers.list").is_none());
        assert!(knobs.enter("servers.create").is_some());
        assert!(knobs.enter("servers.create").is_none());
        assert_eq!(knobs.count("servers.create"), 3);
        assert_eq!(knobs.calls().values().sum::<u64>(), 4);
    }

    #[test]
    fn a_lag_hides_what_is_new() {
        let knobs = Knobs::default();
        let now = Instant::now();
        assert!(knobs.listed(now));
        knobs.set_lag(Duration::from_secs(60));
        assert!(!knobs.listed(now));
    }

    #[test]
    fn bearer_tokens_are_read_from_authorization() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer abc"),
        );
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        assert_eq!(bearer(&h), None);
    }
}
