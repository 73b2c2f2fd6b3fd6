//! The simulated cloud's bookkeeping as plain data: instances, the call log and
//! the rate-limit bucket. No clock reads, no randomness, no I/O — time arrives
//! as `now_ms` and the dice roll as `roll`, so every rule here is a function of
//! its inputs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Knobs;
use berth_core::driver::BERTH_TAG_PREFIX;
use berth_core::pool::{Bucket, Time};

/// Lifecycle state of a simulated instance, as it appears on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InstanceState {
    Pending,
    Running,
    /// Never produced by the simulator today (deletes terminate at once); it is
    /// part of the documented wire format so drivers are written to expect it.
    Stopping,
    Terminated,
    /// Its boot failed (the `boot_failure_rate` knob): it never runs, and
    /// says why in `fault`.
    Failed,
}

/// An instance as the API returns it (`docs/sim-cloud.md`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    pub id: String,
    pub state: InstanceState,
    pub instance_type: String,
    pub image: String,
    pub tags: BTreeMap<String, String>,
    pub created_at_ms: u64,
    pub private_ipv4: String,
    pub public_ipv4: Option<String>,
    pub hostname: String,
    pub ssh_port: u16,
    pub username: String,
    pub client_token: Option<String>,
    /// Why it failed, in state `failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<String>,
}

/// What a `failed` instance says (its `fault`).
pub const BOOT_FAULT: &str = "the instance failed to boot (boot_failure_rate)";

/// One cloud-API call as `/sim/calls` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Call {
    pub at_ms: u64,
    pub method: String,
    pub path: String,
    /// The query string, if any (a list's tags, ids and page token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    pub status: u16,
    /// For a `429`: how long the caller was told to wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// Who called, when the caller's endpoint named itself with a
    /// `/c/NAME` prefix (several berth processes on one cloud).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
    /// For a batch call: each item, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<CallItem>,
}

/// One item of a batch call, as the cloud recorded it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CallItem {
    /// What the call alone would have answered.
    pub status: u16,
    /// The instance: the one deleted (or asked for), or the one created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// Why a cloud-API call was refused. Turned into a status and error body in
/// exactly one place (`api::error_response`).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub(crate) enum ApiError {
    #[error("{0}")]
    InvalidRequest(String),
    #[error("missing or wrong bearer token")]
    Unauthorized,
    #[error("no instance {0}")]
    NotFound(String),
    #[error("{used} live instances, quota is {quota}")]
    QuotaExceeded { quota: u32, used: u32 },
    #[error("no capacity for instance type {instance_type}")]
    InsufficientCapacity { instance_type: String },
    #[error("rate limit exceeded, retry in {retry_after_ms} ms")]
    RateLimited { retry_after_ms: u64 },
    #[error("{0}")]
    Internal(String),
}

/// A create request after JSON decoding.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateRequest {
    pub instance_type: String,
    pub image: String,
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    #[serde(default)]
    pub client_token: Option<String>,
    // Accepted so requests look like a real cloud's, but the sim has no machine
    // to hand them to.
    #[serde(default)]
    #[expect(dead_code, reason = "accepted for API fidelity, never used")]
    pub user_data: Option<String>,
    #[serde(default)]
    #[expect(dead_code, reason = "accepted for API fidelity, never used")]
    pub ssh_public_key: Option<String>,
}

/// How a create ended when it did not fail.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Created {
    New(Instance),
    /// A live instance already had the request's client token.
    Existing(Instance),
}

/// A parsed list query.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ListQuery {
    pub tags: Vec<(String, String)>,
    /// Only these ids (`id=`, repeated), if any are given.
    pub ids: Vec<u64>,
    pub page_size: usize,
    /// Only ids above this one are returned.
    pub after: Option<u64>,
}

pub(crate) const DEFAULT_PAGE_SIZE: usize = 100;
pub(crate) const MAX_PAGE_SIZE: usize = 1000;

/// One page of a list.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Page {
    pub instances: Vec<Instance>,
    pub next_page_token: Option<String>,
}

/// What is persisted of one instance; everything else is derived.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Record {
    pub id: u64,
    pub instance_type: String,
    pub image: String,
    pub tags: BTreeMap<String, String>,
    pub created_at_ms: u64,
    pub terminated_at_ms: Option<u64>,
    pub client_token: Option<String>,
    /// The address and SSH port it reports, in place of its own
    /// (`PUT /sim/instances/{id}/endpoint`, or a machine of its own for
    /// the `ssh_target` knob).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<Endpoint>,
    /// Whether its boot fails (`boot_failure_rate`): once its boot delay
    /// has passed it is `failed`, not `running`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub boot_fails: bool,
}

/// Where an instance says it can be reached.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    pub address: String,
    pub port: u16,
}

impl Record {
    fn is_live(&self) -> bool {
        self.terminated_at_ms.is_none()
    }

    /// Whether reads show it yet (`list_lag_ms` after its create).
    fn shown(&self, knobs: &Knobs, now_ms: u64) -> bool {
        now_ms >= self.created_at_ms.saturating_add(knobs.list_lag_ms)
    }

    fn state(&self, knobs: &Knobs, now_ms: u64) -> InstanceState {
        match self.terminated_at_ms {
            Some(_) => InstanceState::Terminated,
            None if now_ms < self.created_at_ms.saturating_add(knobs.boot_delay_ms) => {
                InstanceState::Pending
            }
            None if self.boot_fails => InstanceState::Failed,
            None => InstanceState::Running,
        }
    }

    fn view(&self, knobs: &Knobs, now_ms: u64) -> Instance {
        let id = format_id(self.id);
        // A loopback address of its own, so that nothing that probes a
        // simulated machine (berth's readiness checks) sends a packet off
        // this host. Outside 127.0.0.0/16, where this host's own services
        // listen: id 42 reads as 127.1.0.42, unique for the first 16
        // million instances.
        let n = self.id;
        let own = format!(
            "127.{}.{}.{}",
            1 + (n >> 16) % 255,
            (n >> 8) & 0xff,
            n & 0xff
        );
        let (private_ipv4, ssh_port) = match &self.endpoint {
            Some(e) => (e.address.clone(), e.port),
            None => (own, 22),
        };
        let state = self.state(knobs, now_ms);
        Instance {
            hostname: format!("{id}.sim.internal"),
            id,
            state,
            fault: (state == InstanceState::Failed).then(|| BOOT_FAULT.to_owned()),
            instance_type: self.instance_type.clone(),
            image: self.image.clone(),
            tags: self.tags.clone(),
            created_at_ms: self.created_at_ms,
            private_ipv4,
            public_ipv4: None,
            ssh_port,
            username: "berth".to_owned(),
            client_token: self.client_token.clone(),
        }
    }
}

/// The persisted part of the state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Saved {
    pub next_id: u64,
    pub instances: Vec<Record>,
}

pub(crate) fn format_id(id: u64) -> String {
    format!("i-{id:016x}")
}

pub(crate) fn parse_id(text: &str) -> Option<u64> {
    let hex = text.strip_prefix("i-")?;
    if hex.len() != 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// Everything the simulator knows.
#[derive(Debug)]
pub(crate) struct State {
    knobs: Knobs,
    /// Id of the next instance; never reused, not even after a reset, so a
    /// stale id held by a client can never name a newer instance.
    next_id: u64,
    instances: BTreeMap<u64, Record>,
    calls: Vec<Call>,
    /// Calls begun and not yet recorded, by caller.
    in_flight: std::collections::BTreeMap<Option<String>, usize>,
    /// The request rate limit: berth's own token bucket, of `rate` tokens
    /// a second and room for `max(1, rate)`. `None` means full: the bucket
    /// is (re)started full whenever the rate limit is armed or changed.
    bucket: Option<Bucket>,
    /// Bumped by every change worth persisting, so a slow writer can tell that
    /// its snapshot has been overtaken.
    generation: u64,
}

impl State {
    pub(crate) fn new(knobs: Knobs, saved: Saved) -> Self {
        let max_saved = saved.instances.iter().map(|r| r.id).max().unwrap_or(0);
        State {
            knobs,
            // Guard against a hand-edited file whose counter lags its instances.
            next_id: saved.next_id.max(max_saved + 1).max(1),
            instances: saved.instances.into_iter().map(|r| (r.id, r)).collect(),
            calls: Vec::new(),
            in_flight: std::collections::BTreeMap::new(),
            bucket: None,
            generation: 0,
        }
    }

    pub(crate) fn knobs(&self) -> &Knobs {
        &self.knobs
    }

    pub(crate) fn set_knobs(&mut self, knobs: Knobs) {
        if knobs.rate_limit != self.knobs.rate_limit {
            self.bucket = None;
        }
        self.knobs = knobs;
    }

    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    pub(crate) fn saved(&self) -> Saved {
        Saved {
            next_id: self.next_id,
            instances: self.instances.values().cloned().collect(),
        }
    }

    pub(crate) fn calls(&self) -> &[Call] {
        &self.calls
    }

    pub(crate) fn record_call(&mut self, call: Call) {
        self.calls.push(call);
    }

    /// A call by `caller` came in.
    pub(crate) fn call_came_in(&mut self, caller: &Option<String>) {
        *self.in_flight.entry(caller.clone()).or_default() += 1;
    }

    /// A call by `caller` was recorded, or given up by its client.
    pub(crate) fn call_left(&mut self, caller: &Option<String>) {
        if let Some(n) = self.in_flight.get_mut(caller) {
            *n = n.saturating_sub(1);
        }
    }

    /// Calls by `caller` that came in and are not yet recorded.
    pub(crate) fn in_flight(&self, caller: &Option<String>) -> usize {
        self.in_flight.get(caller).copied().unwrap_or(0)
    }

    /// Forgets every instance and call and refills the rate bucket.
    pub(crate) fn reset(&mut self) {
        self.instances.clear();
        self.calls.clear();
        self.bucket = None;
        self.generation += 1;
    }

    /// Drops terminated instances whose retention has run out.
    fn purge(&mut self, now_ms: u64) {
        let retention = self.knobs.terminated_retention_ms;
        self.instances.retain(|_, r| match r.terminated_at_ms {
            Some(at) => now_ms < at.saturating_add(retention),
            None => true,
        });
    }

    fn live_count(&self) -> u32 {
        let live = self.instances.values().filter(|r| r.is_live()).count();
        u32::try_from(live).unwrap_or(u32::MAX)
    }

    /// Takes a token for one cloud-API call, or says how long until one is there.
    pub(crate) fn admit(&mut self, now_ms: u64) -> Result<(), ApiError> {
        let Some(rate) = self.knobs.rate_limit else {
            return Ok(());
        };
        let now = Time(now_ms);
        // Float-to-int `as` saturates, so absurd rates still give sane numbers.
        let room = rate.max(1.0) as u32;
        let bucket = self.bucket.get_or_insert_with(|| Bucket::new(rate, room));
        if bucket.try_take(now) {
            return Ok(());
        }
        let retry_after_ms = bucket.next_token().since(now).as_millis().max(1);
        Err(ApiError::RateLimited {
            retry_after_ms: u64::try_from(retry_after_ms).unwrap_or(u64::MAX),
        })
    }

    /// Checks the bearer token, given the request's `Authorization` header.
    pub(crate) fn authorize(&self, authorization: Option<&str>) -> Result<(), ApiError> {
        let Some(token) = &self.knobs.token else {
            return Ok(());
        };
        match authorization.and_then(|h| h.strip_prefix("Bearer ")) {
            Some(given) if given == token => Ok(()),
            _ => Err(ApiError::Unauthorized),
        }
    }

    /// Creates an instance. `roll` is a uniform number in `[0, 1)` compared with
    /// the failure rate. An injected failure creates nothing: the point is to
    /// exercise the caller's retry path, and the client token makes a retry
    /// safe either way. `boot_roll`, another, is compared with the boot
    /// failure rate: an instance that loses it fails once its boot delay
    /// has passed.
    pub(crate) fn create(
        &mut self,
        request: CreateRequest,
        now_ms: u64,
        [roll, boot_roll]: [f64; 2],
        endpoint: Option<Endpoint>,
    ) -> Result<Created, ApiError> {
        self.purge(now_ms);
        if request.instance_type.is_empty() || request.image.is_empty() {
            return Err(ApiError::InvalidRequest(
                "instance_type and image must not be empty".to_owned(),
            ));
        }
        // Checked before quota and capacity: a retried create must find the
        // instance it already made, even if the quota is now full because of it.
        if let Some(token) = &request.client_token
            && let Some(existing) = self
                .instances
                .values()
                .find(|r| r.is_live() && r.client_token.as_ref() == Some(token))
        {
            return Ok(Created::Existing(existing.view(&self.knobs, now_ms)));
        }
        if self.knobs.out_of_capacity.contains(&request.instance_type) {
            return Err(ApiError::InsufficientCapacity {
                instance_type: request.instance_type,
            });
        }
        let used = self.live_count();
        if let Some(quota) = self.knobs.quota
            && used >= quota
        {
            return Err(ApiError::QuotaExceeded { quota, used });
        }
        if roll < self.knobs.failure_rate {
            return Err(ApiError::Internal("injected failure".to_owned()));
        }
        let id = self.next_id;
        self.next_id += 1;
        let record = Record {
            id,
            instance_type: request.instance_type,
            image: request.image,
            tags: request.tags,
            created_at_ms: now_ms,
            terminated_at_ms: None,
            client_token: request.client_token,
            endpoint,
            boot_fails: boot_roll < self.knobs.boot_failure_rate,
        };
        let view = record.view(&self.knobs, now_ms);
        self.instances.insert(id, record);
        self.generation += 1;
        Ok(Created::New(view))
    }

    pub(crate) fn get(&mut self, id: &str, now_ms: u64) -> Result<Instance, ApiError> {
        self.purge(now_ms);
        let record = parse_id(id)
            .and_then(|n| self.instances.get(&n))
            .filter(|r| r.shown(&self.knobs, now_ms))
            .ok_or_else(|| ApiError::NotFound(id.to_owned()))?;
        Ok(record.view(&self.knobs, now_ms))
    }

    /// Looks up a live instance for a change; terminated ones are as good as gone.
    fn live_mut(&mut self, id: &str) -> Result<&mut Record, ApiError> {
        parse_id(id)
            .and_then(|n| self.instances.get_mut(&n))
            .filter(|r| r.is_live())
            .ok_or_else(|| ApiError::NotFound(id.to_owned()))
    }

    pub(crate) fn delete(&mut self, id: &str, now_ms: u64) -> Result<(), ApiError> {
        self.purge(now_ms);
        self.live_mut(id)?.terminated_at_ms = Some(now_ms);
        self.generation += 1;
        Ok(())
    }

    /// Points a live instance at `endpoint`: the address and SSH port it
    /// reports from now on.
    pub(crate) fn set_endpoint(
        &mut self,
        id: &str,
        endpoint: Endpoint,
        now_ms: u64,
    ) -> Result<(), ApiError> {
        self.purge(now_ms);
        self.live_mut(id)?.endpoint = Some(endpoint);
        self.generation += 1;
        Ok(())
    }

    /// Replaces the instance's `berth-` tags with the `berth-` tags given. Other
    /// keys in the request are ignored rather than refused: the call's contract
    /// is that tags outside berth's prefix are never touched, and a client that
    /// echoes back the full map it read should not be punished for it.
    pub(crate) fn set_tags(
        &mut self,
        id: &str,
        tags: BTreeMap<String, String>,
        now_ms: u64,
    ) -> Result<(), ApiError> {
        self.purge(now_ms);
        let record = self.live_mut(id)?;
        record.tags.retain(|k, _| !k.starts_with(BERTH_TAG_PREFIX));
        record.tags.extend(
            tags.into_iter()
                .filter(|(k, _)| k.starts_with(BERTH_TAG_PREFIX)),
        );
        self.generation += 1;
        Ok(())
    }

    pub(crate) fn list(&mut self, query: &ListQuery, now_ms: u64) -> Page {
        self.purge(now_ms);
        let start = query.after.map_or(0, |a| a.saturating_add(1));
        let mut matching = self
            .instances
            .range(start..)
            .map(|(_, r)| r)
            .filter(|r| r.shown(&self.knobs, now_ms))
            .filter(|r| query.ids.is_empty() || query.ids.contains(&r.id))
            .filter(|r| query.tags.iter().all(|(k, v)| r.tags.get(k) == Some(v)));
        let instances: Vec<Instance> = matching
            .by_ref()
            .take(query.page_size)
            .map(|r| r.view(&self.knobs, now_ms))
            .collect();
        let more = matching.next().is_some();
        let next_page_token = match instances.last() {
            Some(last) if more => Some(last.id.clone()),
            _ => None,
        };
        Page {
            instances,
            next_page_token,
        }
    }

    /// Every retained instance, live or terminated, ordered by id.
    pub(crate) fn all(&mut self, now_ms: u64) -> Vec<Instance> {
        self.purge(now_ms);
        self.instances
            .values()
            .map(|r| r.view(&self.knobs, now_ms))
            .collect()
    }

    /// `(quota, live instances)` for `/v1/limits`.
    pub(crate) fn limits(&mut self, now_ms: u64) -> (Option<u32>, u32) {
        self.purge(now_ms);
        (self.knobs.quota, self.live_count())
    }
}
