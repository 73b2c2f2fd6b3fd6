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
use berth_core::pool::{Changes, ListHealth, Pool, RequestState, Time};
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

/// A provider's state, as an event's data: what changes whether and when
/// it launches.
#[derive(Serialize, PartialEq)]
struct ProviderEvent {
    provider: String,
    listed: bool,
    /// `ok`, `failing` or `suspect`.
    list: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    list_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    quota_paused_until: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rate_limited_until: Option<String>,
    /// Instance types (`*` for all) without capacity, each with until when.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    capacity_paused: Vec<(String, String)>,
    store_mismatch: bool,
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
    providers: Vec<String>,
    /// Each provider's driver as last published.
    drivers: Vec<String>,
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
                providers: Vec::new(),
                drivers: Vec::new(),
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
            let data = NodeEvent {
                id: n.id.to_string(),
                label: config
                    .labels
                    .get(usize::from(n.label.0))
                    .map_or("", |l| &l.name),
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

    /// Publishes each provider whose state changed since it was last
    /// published, as `pool` has it after a step at `now`.
    pub fn providers(&self, pool: &Pool, now: Time) {
        let config = pool.config();
        let mut inner = self.inner();
        for (i, p) in config.providers.iter().enumerate() {
            let s = pool.provider_status(ProviderIx(i as u16));
            let until = |t: Option<Time>| t.filter(|t| *t > now).map(|t| rfc3339(t.as_millis()));
            let (list, list_error) = match &s.list {
                ListHealth::Ok => ("ok", None),
                ListHealth::Failing { error, .. } => ("failing", Some(error.clone())),
                ListHealth::Suspect { .. } => ("suspect", None),
            };
            let state = ProviderEvent {
                provider: p.name.clone(),
                listed: s.listed,
                list,
                list_error,
                quota_paused_until: until(s.quota_paused_until),
                rate_limited_until: until(s.held_until),
                capacity_paused: (s.capacity_paused.iter())
                    .filter(|(_, t)| *t > now)
                    .map(|(ty, t)| {
                        (
                            ty.clone().unwrap_or_else(|| "*".into()),
                            rfc3339(t.as_millis()),
                        )
                    })
                    .collect(),
                store_mismatch: s.mismatch.is_some(),
            };
            let data = serde_json::to_string(&state).unwrap_or_default();
            if inner.providers.get(i) == Some(&data) {
                continue;
            }
            if inner.providers.len() <= i {
                inner.providers.resize(i + 1, String::new());
            }
            inner.providers[i] = data.clone();
            self.publish(&mut inner, "provider", None, data);
        }
    }

    /// Publishes each provider's driver whose state changed since it was
    /// last published: started, failed to start, switched to another file
    /// or rolled back (another sha256), or a reload refused.
    pub fn drivers(&self, states: &[DriverStanding]) {
        let mut inner = self.inner();
        for (i, state) in states.iter().enumerate() {
            let data = serde_json::to_string(state).unwrap_or_default();
            if inner.drivers.get(i) == Some(&data) {
                continue;
            }
            if inner.drivers.len() <= i {
                inner.drivers.resize(i + 1, String::new());
            }
            inner.drivers[i] = data.clone();
            self.publish(&mut inner, "driver", None, data);
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
                _ = every.tick() => self.drivers(&providers.driver_states()),
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
