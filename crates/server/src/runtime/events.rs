//! The pool's changes as a stream of events (`GET /v1/events`): each
//! request and node the pool's task stores, once it is stored, and each
//! change of a provider's state (listed, its lists failing or not
//! believed, the cloud's quota, rate-limit and capacity pauses, a store
//! mismatch), and each change of a provider's driver (started, failed,
//! switched or rolled back, a reload refused), looked at every 250 ms.
//! Events carry an id,
//! `GENERATION-SEQUENCE`: the generation is drawn when this process starts,
//! so that an id from another process, or from before a restart, is told
//! apart from one of this history. The last [`HISTORY`] events are kept, so
//! a client that reconnects with `Last-Event-ID` gets what it missed; one
//! whose id is not in the history is told so (a `reset` event) and reads
//! what it watches again.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::sync::broadcast;

use berth_config::ProviderIx;
use std::time::Duration;

use berth_core::pool::{Changes, ListHealth, NodeId, NodeState, Pool, RequestState, Time};
use berth_types::rfc3339;

use super::providers::{DriverStanding, Providers};

/// How many events are kept for clients that reconnect.
pub const HISTORY: usize = 4096;

/// How often the drivers' states are looked at for events.
pub const DRIVERS_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// How many events a live client may fall behind before its stream ends
/// with a `reset`.
const LAG: usize = 1024;

/// One event, as sent.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub seq: u64,
    /// `request`, `node`, `provider` or `driver`.
    pub kind: &'static str,
    /// The requestor the event concerns, if one does: a client token sees
    /// only its own.
    pub requestor: Option<String>,
    /// The event's data, JSON.
    pub data: String,
}

/// A request's change, as an event's data.
#[derive(Serialize)]
struct RequestEvent<'a> {
    id: String,
    requestor: &'a str,
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    nodes: Vec<String>,
}

/// A node's change, as an event's data.
#[derive(Serialize)]
struct NodeEvent<'a> {
    id: String,
    label: &'a str,
    provider: &'a str,
    state: &'static str,
    idle: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    request: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    requestor: Option<&'a str>,
}

/// A provider's state: what changes whether and when it launches. Kept as
/// it is read (times unformatted), so that a step compares it with the one
/// last published and formats nothing unless it changed.
#[derive(Serialize, PartialEq)]
struct ProviderState {
    listed: bool,
    /// `ok`, `failing` or `suspect`.
    list: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    list_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "at")]
    quota_paused_until: Option<Time>,
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "at")]
    rate_limited_until: Option<Time>,
    /// Instance types (`*` for all) without capacity, each with until when.
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "each_at")]
    capacity_paused: Vec<(Option<String>, Time)>,
    store_mismatch: bool,
}

impl ProviderState {
    /// Provider `p`'s state in `pool` after a step at `now`: pauses that
    /// have ended are left out.
    fn of(pool: &Pool, p: ProviderIx, now: Time) -> ProviderState {
        let s = pool.provider_status(p);
        let (list, list_error) = match s.list {
            ListHealth::Ok => ("ok", None),
            ListHealth::Failing { error, .. } => ("failing", Some(error)),
            ListHealth::Suspect { .. } => ("suspect", None),
        };
        ProviderState {
            listed: s.listed,
            list,
            list_error,
            quota_paused_until: s.quota_paused_until.filter(|t| *t > now),
            rate_limited_until: s.held_until.filter(|t| *t > now),
            capacity_paused: (s.capacity_paused.into_iter())
                .filter(|(_, t)| *t > now)
                .collect(),
            store_mismatch: s.mismatch.is_some(),
        }
    }
}

/// A provider's state, as an event's data.
#[derive(Serialize)]
struct ProviderEvent<'a> {
    provider: &'a str,
    #[serde(flatten)]
    state: &'a ProviderState,
}

/// A time as RFC 3339.
fn at<S: serde::Serializer>(t: &Option<Time>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.serialize_str(&rfc3339(t.as_millis())),
        None => s.serialize_none(),
    }
}

/// Capacity pauses as `[instance type or "*", RFC 3339]` pairs.
fn each_at<S: serde::Serializer>(
    pauses: &[(Option<String>, Time)],
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    let mut seq = s.serialize_seq(Some(pauses.len()))?;
    for (ty, t) in pauses {
        seq.serialize_element(&(ty.as_deref().unwrap_or("*"), rfc3339(t.as_millis())))?;
    }
    seq.end()
}

/// Per provider, the state of one kind last published.
struct Latest<T>(Vec<Option<T>>);

impl<T: PartialEq> Latest<T> {
    /// Keeps `state` as provider `i`'s, and answers it if it differs from
    /// the one kept before (it is to be published).
    fn changed(&mut self, i: usize, state: T) -> Option<&T> {
        if self.0.get(i).and_then(Option::as_ref) == Some(&state) {
            return None;
        }
        if self.0.len() <= i {
            self.0.resize_with(i + 1, || None);
        }
        self.0[i] = Some(state);
        self.0[i].as_ref()
    }
}

/// The event history and its live subscribers.
pub struct Events {
    generation: String,
    inner: Mutex<Inner>,
    tx: broadcast::Sender<Arc<Event>>,
    /// Set once the pool's task has ended: every stream ends.
    closed: tokio::sync::watch::Sender<bool>,
}

struct Inner {
    next: u64,
    history: VecDeque<Arc<Event>>,
    /// Each provider's state as last published.
    providers: Latest<ProviderState>,
    /// Each provider's driver as last published.
    drivers: Latest<DriverStanding>,
    ready: ReadyTimes,
}

/// How many of each label's nodes [`ReadyTimes`] keeps.
pub const READY_SAMPLES: usize = 256;

/// For each label, how long its last [`READY_SAMPLES`] nodes took from
/// their launch to ready, as this process stored them ready.
#[derive(Default)]
struct ReadyTimes(std::collections::HashMap<String, VecDeque<(NodeId, Duration)>>);

impl ReadyTimes {
    fn note(&mut self, label: &str, node: NodeId, took: Duration) {
        // The label's name is copied once, for its first node.
        if !self.0.contains_key(label) {
            self.0.insert(label.to_owned(), VecDeque::new());
        }
        let Some(kept) = self.0.get_mut(label) else {
            return;
        };
        // A node stored ready again (held, say) counts once.
        if kept.iter().any(|(id, _)| *id == node) {
            return;
        }
        if kept.len() == READY_SAMPLES {
            kept.pop_front();
        }
        kept.push_back((node, took));
    }
}

/// How long a label's nodes took to be ready: the median, the 95th
/// percentile (nearest rank), and of how many nodes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Quantiles {
    pub p50: Duration,
    pub p95: Duration,
    pub nodes: usize,
}

impl Quantiles {
    fn of(times: impl Iterator<Item = Duration>) -> Option<Quantiles> {
        let mut sorted: Vec<Duration> = times.collect();
        sorted.sort_unstable();
        let rank =
            |q: f64| sorted[((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1];
        (!sorted.is_empty()).then(|| Quantiles {
            p50: rank(0.5),
            p95: rank(0.95),
            nodes: sorted.len(),
        })
    }
}

/// Where a client resumes.
pub enum Resume {
    /// Every event after the one it last saw, then the live ones.
    From(Vec<Arc<Event>>),
    /// Its id is not of this history (another process, a restart, or too
    /// old): it reads what it watches again.
    Reset,
}

impl Default for Events {
    fn default() -> Events {
        Events::new()
    }
}

impl Events {
    pub fn new() -> Events {
        Events {
            generation: format!("{:08x}", rand::random::<u32>()),
            inner: Mutex::new(Inner {
                next: 1,
                history: VecDeque::new(),
                providers: Latest(Vec::new()),
                drivers: Latest(Vec::new()),
                ready: ReadyTimes::default(),
            }),
            tx: broadcast::channel(LAG).0,
            closed: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Ends every stream: the pool's task has ended.
    pub fn close(&self) {
        self.closed.send_replace(true);
    }

    /// Completes once the pool's task has ended.
    pub async fn closed(&self) {
        let mut closed = self.closed.subscribe();
        let _ = closed.wait_for(|c| *c).await;
    }

    /// An event's id as sent.
    pub fn id(&self, e: &Event) -> String {
        format!("{}-{}", self.generation, e.seq)
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish(
        &self,
        inner: &mut Inner,
        kind: &'static str,
        requestor: Option<String>,
        data: String,
    ) {
        let event = Arc::new(Event {
            seq: inner.next,
            kind,
            requestor,
            data,
        });
        inner.next += 1;
        if inner.history.len() == HISTORY {
            inner.history.pop_front();
        }
        inner.history.push_back(event.clone());
        // Nobody listening is no error.
        let _ = self.tx.send(event);
    }

    /// Publishes one event of `kind` with `data`, for tests of what reads
    /// the stream.
    #[cfg(test)]
    pub(crate) fn push(&self, kind: &'static str, requestor: Option<&str>, data: &str) {
        let mut inner = self.inner();
        self.publish(
            &mut inner,
            kind,
            requestor.map(str::to_owned),
            data.to_owned(),
        );
    }

    /// Publishes what a step stored (`changes`), as `pool` now has it.
    pub fn stored(&self, pool: &Pool, changes: &Changes) {
        if changes.requests.is_empty() && changes.nodes.is_empty() {
            return;
        }
        let config = pool.config();
        let mut inner = self.inner();
        for r in &changes.requests {
            let (state, reason) = match &r.state {
                RequestState::Pending => ("pending", None),
                RequestState::Fulfilled { .. } => ("fulfilled", None),
                RequestState::Failed { reason, .. } => ("failed", Some(reason.as_str())),
                RequestState::Cancelled { .. } => ("cancelled", None),
            };
            let data = RequestEvent {
                id: r.id.to_string(),
                requestor: &r.requestor,
                state,
                reason,
                nodes: r.nodes.iter().map(ToString::to_string).collect(),
            };
            let data = serde_json::to_string(&data).unwrap_or_default();
            self.publish(&mut inner, "request", Some(r.requestor.clone()), data);
        }
        for n in &changes.nodes {
            let requestor = pool.requestor_of(n.id);
            let label = (config.labels.get(usize::from(n.label.0))).map_or("", |l| &l.name);
            if let NodeState::Ready { since } = n.state {
                inner.ready.note(label, n.id, since.since(n.created));
            }
            let data = NodeEvent {
                id: n.id.to_string(),
                label,
                provider: (config.providers.get(usize::from(n.provider.0))).map_or("", |p| &p.name),
                state: n.state.name(),
                idle: n.idle.into(),
                request: n.request().map(|r| r.to_string()),
                requestor,
            };
            let data = serde_json::to_string(&data).unwrap_or_default();
            self.publish(&mut inner, "node", requestor.map(str::to_owned), data);
        }
    }

    /// How long each label's nodes took from their launch to ready, of
    /// the last [`READY_SAMPLES`] this process stored ready; a label none
    /// of whose nodes it saw become ready is absent.
    pub fn time_to_ready(&self) -> std::collections::BTreeMap<String, Quantiles> {
        let inner = self.inner();
        (inner.ready.0.iter())
            .filter_map(|(label, kept)| {
                Quantiles::of(kept.iter().map(|(_, took)| *took)).map(|q| (label.clone(), q))
            })
            .collect()
    }

    /// Publishes each provider whose state changed since it was last
    /// published, as `pool` has it after a step at `now`.
    pub fn providers(&self, pool: &Pool, now: Time) {
        let config = pool.config();
        let mut inner = self.inner();
        for (i, p) in config.providers.iter().enumerate() {
            let state = ProviderState::of(pool, ProviderIx(i as u16), now);
            let data = (inner.providers.changed(i, state)).map(|state| {
                let event = ProviderEvent {
                    provider: &p.name,
                    state,
                };
                serde_json::to_string(&event).unwrap_or_default()
            });
            if let Some(data) = data {
                self.publish(&mut inner, "provider", None, data);
            }
        }
    }

    /// Publishes each provider's driver whose state changed since it was
    /// last published: started, failed to start, switched to another file
    /// or rolled back (another sha256), or a reload refused.
    pub fn drivers(&self, states: Vec<DriverStanding>) {
        let mut inner = self.inner();
        for (i, state) in states.into_iter().enumerate() {
            let data = (inner.drivers.changed(i, state))
                .map(|state| serde_json::to_string(state).unwrap_or_default());
            if let Some(data) = data {
                self.publish(&mut inner, "driver", None, data);
            }
        }
    }

    /// Publishes the drivers' changes ([`Events::drivers`]) as `providers`
    /// come to them, looking every [`DRIVERS_EVERY`], until the pool's
    /// task ends.
    pub async fn watch_drivers(self: Arc<Self>, providers: Arc<Providers>) {
        let mut every = tokio::time::interval(DRIVERS_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => self.drivers(providers.driver_states()),
                () = self.closed() => return,
            }
        }
    }

    /// The events after `last` (an id as sent), and a receiver of the live
    /// ones from then on, with nothing lost between the two; from now on
    /// with no `last`.
    pub fn subscribe(&self, last: Option<&str>) -> (Resume, broadcast::Receiver<Arc<Event>>) {
        let inner = self.inner();
        let rx = self.tx.subscribe();
        let resume = match last {
            None => Resume::From(Vec::new()),
            Some(last) => match self.seq_of(last) {
                // Still in the history (or the newest): what follows it.
                Some(seq)
                    if seq + 1 >= inner.history.front().map_or(inner.next, |e| e.seq)
                        && seq < inner.next =>
                {
                    Resume::From(
                        inner
                            .history
                            .iter()
                            .filter(|e| e.seq > seq)
                            .cloned()
                            .collect(),
                    )
                }
                _ => Resume::Reset,
            },
        };
        drop(inner);
        (resume, rx)
    }

    /// The sequence of an id of this generation.
    fn seq_of(&self, id: &str) -> Option<u64> {
        let (generation, seq) = id.trim().split_once('-')?;
        (generation == self.generation).then_some(())?;
        seq.parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_to_ready_is_a_nearest_rank_of_each_nodes_first_time_ready() {
        let mut t = ReadyTimes::default();
        let s = Duration::from_secs;
        for i in 1..=20u64 {
            t.note("small", NodeId(i), s(i));
        }
        // Stored ready again (held, say): not counted twice.
        t.note("small", NodeId(20), s(500));
        let q = Quantiles::of(t.0["small"].iter().map(|(_, d)| *d)).unwrap();
        assert_eq!(
            q,
            Quantiles {
                p50: s(10),
                p95: s(19),
                nodes: 20
            }
        );
        assert_eq!(Quantiles::of([s(7)].into_iter()).unwrap().p95, s(7));
        assert_eq!(Quantiles::of(std::iter::empty()), None);
        // Only the last READY_SAMPLES are kept.
        for i in 100..(100 + READY_SAMPLES as u64) {
            t.note("small", NodeId(i), s(1000));
        }
        let q = Quantiles::of(t.0["small"].iter().map(|(_, d)| *d)).unwrap();
        assert_eq!((q.p50, q.nodes), (s(1000), READY_SAMPLES));
    }

    /// A provider's state is published only when it changes, and reads as
    /// the API documents it: times as RFC 3339, a capacity pause for every
    /// type as `*`.
    #[test]
    fn a_provider_state_is_published_once_per_change_as_documented() {
        let state = |quota: Option<u64>| ProviderState {
            listed: true,
            list: "ok",
            list_error: None,
            quota_paused_until: quota.map(Time::from_millis),
            rate_limited_until: None,
            capacity_paused: vec![
                (None, Time::from_millis(0)),
                (Some("big".into()), Time::from_millis(1000)),
            ],
            store_mismatch: false,
        };
        let mut latest = Latest(Vec::new());
        assert!(latest.changed(1, state(None)).is_some(), "the first");
        assert!(latest.changed(1, state(None)).is_none(), "the same again");
        let changed = latest.changed(1, state(Some(1_700_000_000_000))).unwrap();
        let event = ProviderEvent {
            provider: "sim",
            state: changed,
        };
        let json: serde_json::Value = serde_json::to_value(&event).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "provider": "sim",
                "listed": true,
                "list": "ok",
                "quota_paused_until": "2023-11-14T22:13:20.000Z",
                "capacity_paused": [["*", "1970-01-01T00:00:00.000Z"], ["big", "1970-01-01T00:00:01.000Z"]],
                "store_mismatch": false,
            })
        );
        assert!(latest.changed(0, state(None)).is_some(), "another provider");
    }

    /// A reconnect resumes after an id still in the history, the newest
    /// included; one older than the history, of another generation, or
    /// not yet sent gets a reset.
    #[test]
    fn a_resume_takes_what_follows_an_id_of_this_history_and_resets_otherwise() {
        let events = Events::new();
        for _ in 0..HISTORY + 10 {
            events.push("node", None, "{}");
        }
        let id = |seq: u64| format!("{}-{seq}", events.generation);
        let after = |last: &str| match events.subscribe(Some(last)).0 {
            Resume::From(missed) => Some(missed.iter().map(|e| e.seq).collect::<Vec<_>>()),
            Resume::Reset => None,
        };
        let newest = (HISTORY + 10) as u64;
        assert_eq!(after(&id(newest)), Some(vec![]));
        assert_eq!(after(&id(newest - 2)), Some(vec![newest - 1, newest]));
        // The oldest kept is 11: after 10 every kept one follows.
        assert_eq!(after(&id(10)).map(|v| v.len()), Some(HISTORY));
        assert_eq!(after(&id(9)), None, "older than the history");
        assert_eq!(after(&id(newest + 1)), None, "not sent yet");
        assert_eq!(
            after(&format!("0badc0de-{newest}")),
            None,
            "another generation"
        );
        assert_eq!(after("garbage"), None);
    }
}
