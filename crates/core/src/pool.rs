//! The pool core: nodes, requests, quotas, prewarming, slots and the
//! reconciler, as plain data and decisions.
//!
//! Nothing here does IO or reads a clock. Time comes in as `now`; what the core
//! wants done comes out as [`Effect`]s (driver calls) and [`Changes`] (records
//! to store), and outcomes come back through [`Pool::created`],
//! [`Pool::deleted`], [`Pool::listed`] and [`Pool::tagged`]. The runtime
//! (`berth_server::runtime`) writes the changes to the store *before* it carries out
//! the effects, so a crash at any point leaves an intent the next start can
//! resolve.
//!
//! Every change to a node goes through [`Pool::update`] (or `insert` /
//! `purge`), which keeps the indexes (free ready nodes per label, usage per
//! provider, the calls each provider owes) true; nothing else touches them.

mod adopt;
mod asked;
mod bookkeeping;
mod bucket;
mod calls;
mod caps;
mod choice;
mod commands;
mod events;
#[cfg(test)]
mod headroom;
mod identity;
mod leases;
mod model;
mod plan;
mod prewarm;
mod probes;
#[cfg(test)]
mod prop;
mod reconcile;
mod tags;
#[cfg(test)]
mod testkit;
#[cfg(test)]
mod tests;
mod timers;
mod vouch;
mod waiting;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use crate::config::{Config, LabelIx, LabelKind, ProviderIx};
use crate::driver::{
    CreateSpec, IDLE_TAG, LABEL_TAG, NODE_TAG, POOL_TAG, REQUEST_TAG, SIG_TAG, SLOT_LABEL_TAG,
    SLOTS_HELD_TAG, SLOTS_TAG, STORE_TAG, Tags,
};

pub use asked::{
    MAX_COUNT, MAX_KEY, MAX_METADATA, MAX_METADATA_KEY, MAX_METADATA_KEYS, MAX_METADATA_VALUE,
    Unreadable, is_metadata_key, read_key, read_metadata, read_request,
};
pub use bucket::Bucket;
pub use caps::Cap;
pub use commands::servable;
pub use identity::{Identity, Signed, is_generation};
pub use model::*;
use plan::Kept;
pub use probes::{ProbeTarget, Probing};
use timers::Timer;
pub use waiting::{Blocked, Limit, Wait, WaitReason};

/// The pool's state and decisions. See the module docs.
pub struct Pool {
    config: Arc<Config>,
    nodes: HashMap<NodeId, Node>,
    requests: HashMap<RequestId, Request>,
    /// Pending requests in the order they are served: priority, then age.
    pending: BTreeSet<(i32, Time, RequestId)>,
    ix: Indexes,
    /// Nodes with a driver call in flight: at most one call per node.
    busy: HashSet<NodeId>,
    /// When this process learned each node's instance id; an instance
    /// missing from a list that started earlier is not yet a vanished one.
    attached_at: HashMap<NodeId, Time>,
    timers: BTreeSet<(Time, Timer)>,
    /// Failed delete and tag calls per node in a row, for their backoff.
    tries: HashMap<NodeId, u32>,
    leases: leases::RequestorLeases,
    /// Creating nodes whose create's outcome is not known
    /// ([`Failure::Unknown`]): the first of the provider's lists (by
    /// `ProviderRt::lists_started`) that started after it ended, and how it
    /// ended. None is created again until that list has been believed.
    unsure: HashMap<NodeId, (u64, String)>,
    /// Creating nodes marked busy while they wait out a backoff after a
    /// failed try on the same provider: no call is in flight for them.
    create_waits: HashSet<NodeId>,
    /// Booting nodes whose instance runs, waiting for a readiness probe to
    /// pass (`probes.rs`).
    probes: HashMap<NodeId, Probing>,
    dirty_nodes: HashSet<NodeId>,
    dirty_requests: HashSet<RequestId>,
    purged_nodes: Vec<NodeId>,
    purged_requests: Vec<RequestId>,
    /// Requests taken in from the store's inbox since the last
    /// [`Pool::take_changes`].
    taken_in: Vec<RequestId>,
    notices: Vec<Notice>,
    ids: IdGen,
    /// The time of the last [`Pool::tick`].
    last_tick: Time,
    /// The room the last plan kept for requests that waited past
    /// `reserve-after` and could not be served, each with its place in
    /// the serving order: requests behind it may not take it
    /// ([`Pool::waiting`] says so).
    kept: Vec<Kept>,
    /// The store's identity: what every instance's tags are signed with.
    identity: Identity,
    /// When each node's tags were last confirmed set (a create's answer or
    /// a set-tags): a list that started earlier may show older ones.
    tagged_at: HashMap<NodeId, Time>,
    /// Nodes whose listed tags have been compared with berth's since
    /// start: once each (and set again if they differed), so that a list
    /// does not sign every node anew, and a driver that cannot keep a tag
    /// does not cost a call per list.
    tags_checked: HashSet<NodeId>,
    /// Take instances of the pool that the store cannot vouch for as they
    /// are, until every provider has been listed once (`berth serve
    /// --adopt-instances`).
    adopting: bool,
    /// The store is to record that it has faced every provider
    /// ([`Changes::confirmed`]).
    confirm_owed: bool,
}

/// Indexes derived from the nodes; kept apart so they can be updated while a
/// node is borrowed.
struct Indexes {
    labels: Vec<LabelRt>,
    providers: Vec<ProviderRt>,
}

/// Per-label runtime state.
#[derive(Default)]
struct LabelRt {
    /// Ready, unassigned, idle-run plain nodes, oldest first.
    free_ready: BTreeSet<(Time, NodeId)>,
    /// Creating or booting unassigned plain nodes.
    free_launching: BTreeSet<NodeId>,
    /// For a slot label: its live backing nodes.
    backings: BTreeSet<NodeId>,
    /// Prewarm launches that failed in a row, and when prewarming may try again.
    failures: u32,
    backoff_until: Time,
    /// Launches owed beyond `min-ready` since a request took the label's
    /// last ready node (`burst-extra`); in memory only.
    burst_owed: u32,
}

/// A list whose pages are being followed.
struct Listing {
    /// When its first page was asked for: what the list shows is as of then.
    started: Time,
    /// The cursor of the page owed next (`None`: the first).
    cursor: Option<String>,
    /// Whether a page call is in flight.
    asking: bool,
    pages: u32,
    /// The instances of the pages so far.
    instances: Vec<crate::driver::Instance>,
}

/// Per-provider runtime state.
struct ProviderRt {
    usage: Usage,
    /// The part of `usage` held by nodes being deleted: room on its way.
    deleting: Usage,
    /// Creates paused after quota-exceeded, until an instance goes away or this time.
    quota_paused_until: Option<Time>,
    /// Every call held after rate-limited, until this time.
    held_until: Option<Time>,
    /// A new list waits for one other call to go first: set when a call
    /// other than a list page was answered rate-limited (see
    /// `Pool::call_done`).
    list_waits: bool,
    /// Instance types out of capacity (`None`: all of them), until when.
    capacity_paused: Vec<(Option<String>, Time)>,
    bucket: Option<Bucket>,
    next_list: Time,
    list_busy: bool,
    /// Lists started so far: the one in flight is the last.
    lists_started: u64,
    /// A list has completed since start: until then nothing is created, so
    /// that creates left from before a crash are found rather than repeated.
    listed: bool,
    /// The list under way (`list_busy`): the pages it has so far.
    listing: Option<Listing>,
    in_flight: u32,
    max_in_flight: u32,
    /// What the provider's driver takes in one call, as it declared
    /// ([`Pool::declared`]): until then, one instance per call.
    batches: Batches,
    want_create: BTreeSet<NodeId>,
    want_delete: BTreeSet<NodeId>,
    want_tags: BTreeSet<NodeId>,
    /// Non-final nodes with an instance id on this provider.
    with_instance: HashSet<NodeId>,
    /// The same by instance id: the one live node that holds each instance.
    /// A list or a create that claims an instance held here for another
    /// node is not believed.
    holders: HashMap<String, NodeId>,
    /// Leak deletes, apart from (and within) the provider's own rate: a
    /// driver that lists thousands of owned orphans gets them deleted at
    /// this pace, not all at once.
    leak_bucket: Bucket,
    /// Owned instances no live node accounts for, by instance id.
    leaks: HashMap<String, Leak>,
    /// Nodes whose instance the latest complete lists did not show:
    /// suspected, not gone (see `reconcile`).
    missing: HashMap<NodeId, Missing>,
    /// Of those, the ones suspected long enough to be looked up by id: a
    /// `get` that does not show them confirms them gone.
    to_confirm: BTreeSet<NodeId>,
    get_busy: bool,
    /// When the next `get` may go (after one that failed).
    next_get: Time,
    /// When the booting nodes are next worth a look (by `get`, or by a
    /// list when there are more than one `get` takes); `None` when none
    /// boots.
    next_boot_poll: Option<Time>,
    /// `get`s in a row that failed, for the backoff.
    get_failures: u32,
    /// Lists in a row that failed or were not believed, for the backoff.
    list_failures: u32,
    /// How the provider's lists are going.
    list_health: ListHealth,
    /// When the last believed list started.
    last_listed: Option<Time>,
    /// When a list problem was last said (notices are rate-limited).
    list_said: Option<Time>,
    foreign_said: bool,
    leaks_deleted: u64,
    /// Instances of the pool berth neither uses nor deletes, by instance
    /// id, as the last believed list showed them (`reconcile`).
    quarantined: BTreeMap<String, Quarantined>,
    /// A believed list has shown nothing in quarantine since start: the
    /// provider counts towards the store's confirmation.
    checked: bool,
    /// Instances an operator took on purpose (`--adopt-instances`): the
    /// provider's first list showed them, and they count as vouched for
    /// until this process ends, whether adopted or (past the provider's
    /// limits) deleted as leaks.
    taken_on_purpose: HashSet<String>,
    /// Why nothing is created here: the store has not faced the clouds yet
    /// (it is new, emptied or replaced) and the provider's last list showed
    /// instances of the pool it cannot vouch for. Ends when a list shows
    /// none (they were deleted in the cloud, or adopted on purpose).
    mismatch: Option<String>,
}

impl ProviderRt {
    /// A provider nothing has happened on yet.
    fn new(p: &crate::config::Provider) -> ProviderRt {
        ProviderRt {
            usage: Usage::default(),
            deleting: Usage::default(),
            quota_paused_until: None,
            held_until: None,
            list_waits: false,
            capacity_paused: Vec::new(),
            bucket: p.rate.map(|rate| Bucket::new(rate, p.burst)),
            next_list: Time::ZERO,
            list_busy: false,
            lists_started: 0,
            listed: false,
            listing: None,
            batches: Batches::default(),
            in_flight: 0,
            max_in_flight: p.max_calls.max(1),
            want_create: BTreeSet::new(),
            want_delete: BTreeSet::new(),
            want_tags: BTreeSet::new(),
            with_instance: HashSet::new(),
            holders: HashMap::new(),
            leak_bucket: Bucket::new(LEAK_DELETES_PER_SECOND, LEAK_DELETES_PER_SECOND as u32),
            leaks: HashMap::new(),
            missing: HashMap::new(),
            to_confirm: BTreeSet::new(),
            get_busy: false,
            next_get: Time::ZERO,
            next_boot_poll: None,
            get_failures: 0,
            list_failures: 0,
            list_health: ListHealth::Ok,
            last_listed: None,
            list_said: None,
            foreign_said: false,
            leaks_deleted: 0,
            quarantined: BTreeMap::new(),
            checked: false,
            taken_on_purpose: HashSet::new(),
            mismatch: None,
        }
    }
}

/// An instance of the pool that berth neither hands out nor deletes: its
/// tags cannot be vouched for, or say it is in use, and nothing the store
/// holds rules that out. It waits for a person.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quarantined {
    /// Its `berth-node` tag, as shown (made safe to show).
    pub node: Option<String>,
    /// Why it is in quarantine, in words.
    pub why: String,
}

/// An owned instance to delete once `due` passes, if a list still shows it.
struct Leak {
    node: Option<NodeId>,
    due: Time,
    busy: bool,
}

/// Leak deletes per second per provider, at most (see `ProviderRt`).
pub const LEAK_DELETES_PER_SECOND: f64 = 10.0;

/// What a provider has, counting creating, booting and deleting nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub instances: u32,
    pub vcpus: u32,
    pub ram_mib: u64,
}

impl Usage {
    fn add(&mut self, r: Resources) {
        self.instances += 1;
        self.vcpus += r.vcpus;
        self.ram_mib += r.ram_mib;
    }

    fn sub(&mut self, r: Resources) {
        self.instances = self.instances.saturating_sub(1);
        self.vcpus = self.vcpus.saturating_sub(r.vcpus);
        self.ram_mib = self.ram_mib.saturating_sub(r.ram_mib);
    }
}

/// A provider's state as operators see it.
#[derive(Clone, Debug, PartialEq)]
pub struct ProviderStatus {
    pub usage: Usage,
    pub quota_paused_until: Option<Time>,
    pub held_until: Option<Time>,
    pub capacity_paused: Vec<(Option<String>, Time)>,
    pub listed: bool,
    pub leaks_pending: usize,
    pub leaks_deleted: u64,
    /// How its lists are going.
    pub list: ListHealth,
    /// When the last list berth believed started.
    pub last_listed: Option<Time>,
    /// Nodes whose instance is suspected missing (or confirmed, in use).
    pub missing: usize,
    /// Instances in quarantine, by id: berth neither hands them out nor
    /// deletes them.
    pub quarantined: BTreeMap<String, Quarantined>,
    /// Why nothing is created on the provider: the store is not the one its
    /// instances were made by, as far as it can tell.
    pub mismatch: Option<String>,
}

/// Node and request ids: unpredictable across processes and restarts (so two
/// berths, or a berth and its own past, never hand out the same id), yet
/// reproducible from the seed for tests.
struct IdGen {
    seed: u64,
    counter: u64,
}

impl IdGen {
    fn next(&mut self) -> u64 {
        self.counter += 1;
        splitmix64(self.seed ^ self.counter.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Pool {
    /// An empty pool. `seed` makes ids unpredictable; pass a random one.
    pub fn new(config: Arc<Config>, seed: u64) -> Pool {
        let labels = config.labels.iter().map(|_| LabelRt::default()).collect();
        let providers = config.providers.iter().map(ProviderRt::new).collect();
        Pool {
            config,
            nodes: HashMap::new(),
            requests: HashMap::new(),
            pending: BTreeSet::new(),
            ix: Indexes { labels, providers },
            busy: HashSet::new(),
            attached_at: HashMap::new(),
            timers: BTreeSet::new(),
            tries: HashMap::new(),
            create_waits: HashSet::new(),
            probes: HashMap::new(),
            unsure: HashMap::new(),
            leases: leases::RequestorLeases::default(),
            dirty_nodes: HashSet::new(),
            dirty_requests: HashSet::new(),
            purged_nodes: Vec::new(),
            purged_requests: Vec::new(),
            taken_in: Vec::new(),
            notices: Vec::new(),
            ids: IdGen { seed, counter: 0 },
            last_tick: Time::ZERO,
            kept: Vec::new(),
            identity: Identity::default(),
            tagged_at: HashMap::new(),
            tags_checked: HashSet::new(),
            adopting: false,
            confirm_owed: false,
        }
    }

    /// A pool resumed from what a store held. No call is in flight; nodes
    /// left creating or deleting are resolved after each provider's first list.
    ///
    /// Every requestor's lease runs exactly as long from `now` as its last
    /// renewal made it last (`RequestorLease::ttl`, the API's `lease-ttl`): while no
    /// process decided (berth was down, a failover, the store out of
    /// reach) renewals were refused, and a requestor that kept trying must
    /// not lose its nodes for that; one that stopped renewing loses them
    /// one lease later. A stored deadline is never believed past that: it
    /// was written by a wall clock (this host's before a restart, another
    /// host's before a failover) that may have been ahead, and a deadline
    /// hours away would keep a dead client's machines that long.
    pub fn restore(config: Arc<Config>, seed: u64, snapshot: Snapshot, now: Time) -> Pool {
        let mut pool = Pool::new(config, seed);
        pool.identity = snapshot.identity;
        for node in snapshot.nodes {
            pool.insert(node);
        }
        for req in snapshot.requests {
            if req.state == RequestState::Pending {
                pool.pending.insert((req.priority, req.created, req.id));
            }
            pool.timers_for_request(&req);
            pool.requests.insert(req.id, req);
        }
        for lease in snapshot.leases {
            let expires = now + lease.ttl;
            if lease.expires == expires {
                pool.leases.restore(lease);
            } else {
                pool.leases.renew(&lease.requestor, expires, lease.ttl);
            }
        }
        let ids: Vec<NodeId> = pool.nodes.keys().copied().collect();
        for id in ids {
            pool.timers_for_node(id, now);
        }
        pool.dirty_nodes.clear();
        pool.dirty_requests.clear();
        // Labels and providers a reload removed (this process reloaded its
        // config before it took the pool over): what they left is given up
        // and drained as the reload does, and stored at the next commit.
        let retired: Vec<LabelIx> = (0..pool.config.labels.len())
            .filter(|&i| pool.config.labels[i].retired)
            .map(|i| LabelIx(i as u16))
            .collect();
        for label in retired {
            pool.retire(label, now);
        }
        pool.drain_retired(now);
        pool
    }

    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    /// Takes a new config while running (a reload of the config file).
    ///
    /// It must keep the pool's id and the running labels and providers at
    /// their indexes (`berth_config::align` arranges a file so): labels and
    /// providers may be added after them. A label keeps its kind and, for a
    /// slot label, its backing label. Anything else is refused, and the
    /// pool keeps its config.
    ///
    /// From the next tick the pool decides with it: `min-ready`, limits,
    /// offers, readiness, timeouts, rates, and new labels, which requests
    /// may ask for at once. What was already set by the old one stays as
    /// set: a boot timeout running, a pause, a timer due.
    ///
    /// A label it marks retired (removed from the file) is asked for no
    /// more: its pending requests fail, and its nodes, and the backing
    /// nodes of a retired slot label, are drained (deleted once idle), but
    /// those an operator holds. So are the nodes on a provider it marks
    /// retired, which no label offers any more.
    pub fn reconfigure(&mut self, config: Arc<Config>, now: Time) -> Result<(), String> {
        let old = &self.config;
        if config.pool_id != old.pool_id {
            return Err(format!(
                "the pool's id cannot change while berth runs ({} → {})",
                old.pool_id, config.pool_id
            ));
        }
        for p in &old.providers {
            let at = old.provider(&p.name).map(|ix| ix.0 as usize);
            if config
                .providers
                .get(at.unwrap_or(usize::MAX))
                .map(|q| &q.name)
                != Some(&p.name)
            {
                return Err(format!("provider {} is not at its index", p.name));
            }
        }
        for (i, l) in old.labels.iter().enumerate() {
            let Some(m) = config.labels.get(i).filter(|m| m.name == l.name) else {
                return Err(format!("label {} is not at its index", l.name));
            };
            let same_kind = match (&l.kind, &m.kind) {
                (LabelKind::Machine { .. }, LabelKind::Machine { .. }) => true,
                (LabelKind::Slots { backing: a, .. }, LabelKind::Slots { backing: b, .. }) => {
                    a == b
                }
                _ => false,
            };
            if !same_kind {
                return Err(format!(
                    "label {} cannot change its kind or its backing label while berth runs",
                    l.name
                ));
            }
        }
        for (rt, (p, q)) in
            (self.ix.providers.iter_mut()).zip(old.providers.iter().zip(&config.providers))
        {
            if (p.rate, p.burst) != (q.rate, q.burst) {
                rt.bucket = q.rate.map(|rate| Bucket::new(rate, q.burst));
            }
            rt.max_in_flight = q.max_calls.max(1);
        }
        let retiring: Vec<LabelIx> = (0..config.labels.len())
            .filter(|&i| config.labels[i].retired && !old.labels.get(i).is_some_and(|l| l.retired))
            .map(|i| LabelIx(i as u16))
            .collect();
        let added = config.labels.len() - old.labels.len();
        self.ix
            .labels
            .extend((0..added).map(|_| LabelRt::default()));
        let known = old.providers.len();
        (self.ix.providers).extend(config.providers[known..].iter().map(ProviderRt::new));
        self.config = config;
        for label in retiring {
            self.retire(label, now);
        }
        self.drain_retired(now);
        Ok(())
    }

    /// Fails the pending requests for a label removed from the config.
    fn retire(&mut self, label: LabelIx, now: Time) {
        let reason = format!(
            "label `{}` was removed from the config; the request was given up",
            self.config[label].name
        );
        let pending: Vec<RequestId> = (self.pending.iter())
            .map(|k| k.2)
            .filter(|id| self.requests[id].wants.iter().any(|(l, _)| *l == label))
            .collect();
        for id in pending {
            let state = RequestState::Failed {
                at: now,
                reason: reason.clone(),
            };
            self.finish_request(id, state, now);
        }
    }

    /// Drains every node that runs no more ([`Pool::runs_no_more`]): of a
    /// label or on a provider removed from the config. Each is deleted once
    /// idle; those an operator holds, once the hold is lifted.
    fn drain_retired(&mut self, now: Time) {
        let drained: Vec<NodeId> = (self.nodes.values())
            .filter(|n| n.idle == Idle::Run && !n.state.is_final() && self.runs_no_more(n))
            .map(|n| n.id)
            .collect();
        for id in drained {
            // Not final, so it takes the drain.
            let _ = self.set_idle(now, id, Idle::Drain);
        }
    }

    /// The store's identity the pool signs with.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// Takes the pool's instances that the store cannot vouch for as they
    /// are (adopted by their tags, held ones on hold, and signed anew),
    /// until every provider has been listed once: how an operator adopts
    /// on purpose what a lost or replaced store left in the clouds
    /// (`berth serve --adopt-instances`).
    pub fn adopt_instances(&mut self) {
        self.adopting = true;
    }

    // ---- queries ------------------------------------------------------

    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.nodes.get(&id)
    }

    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes.values()
    }

    pub fn request(&self, id: RequestId) -> Option<&Request> {
        self.requests.get(&id)
    }

    /// The requestor node `id` is handed out to or set aside for, if any.
    pub fn requestor_of(&self, id: NodeId) -> Option<&str> {
        let request = self.nodes.get(&id)?.request()?;
        self.requests.get(&request).map(|r| r.requestor.as_str())
    }

    pub fn requests(&self) -> impl Iterator<Item = &Request> {
        self.requests.values()
    }

    /// The time of the latest [`Pool::tick`]: "now" for a reader.
    pub fn last_tick(&self) -> Time {
        self.last_tick
    }

    pub fn pending_requests(&self) -> usize {
        self.pending.len()
    }

    /// Ready nodes a request could be given now, per label.
    pub fn free_ready(&self, label: LabelIx) -> usize {
        match &self.config[label].kind {
            LabelKind::Machine { .. } => self.ix.labels[label.0 as usize].free_ready.len(),
            LabelKind::Slots { .. } => self.free_slots(label, true),
        }
    }

    pub fn provider_status(&self, p: ProviderIx) -> ProviderStatus {
        let rt = &self.ix.providers[p.0 as usize];
        ProviderStatus {
            usage: rt.usage,
            quota_paused_until: rt.quota_paused_until,
            held_until: rt.held_until,
            capacity_paused: rt.capacity_paused.clone(),
            listed: rt.listed,
            leaks_pending: rt.leaks.len(),
            leaks_deleted: rt.leaks_deleted,
            list: rt.list_health.clone(),
            last_listed: rt.last_listed,
            missing: rt.missing.len(),
            quarantined: rt.quarantined.clone(),
            mismatch: rt.mismatch.clone(),
        }
    }

    /// Whether a node's instance is suspected missing (or confirmed, for a
    /// node kept in use), and since when.
    pub fn missing(&self, id: NodeId) -> Option<Missing> {
        let n = self.nodes.get(&id)?;
        self.ix.providers[n.provider.0 as usize]
            .missing
            .get(&id)
            .copied()
    }

    /// The live node that holds `instance` on provider `p`, if any.
    pub(crate) fn holder(&self, p: ProviderIx, instance: &str) -> Option<NodeId> {
        self.ix.providers[p.0 as usize]
            .holders
            .get(instance)
            .copied()
    }

    /// Records changed since the last call: store them before carrying out
    /// the effects of the same step.
    pub fn take_changes(&mut self) -> Changes {
        let nodes = self
            .dirty_nodes
            .drain()
            .filter_map(|id| self.nodes.get(&id).cloned())
            .collect();
        let requests = self
            .dirty_requests
            .drain()
            .filter_map(|id| self.requests.get(&id).cloned())
            .collect();
        let (leases, purged_leases) = self.leases.take_changes();
        Changes {
            nodes,
            requests,
            leases,
            purged_nodes: std::mem::take(&mut self.purged_nodes),
            purged_requests: std::mem::take(&mut self.purged_requests),
            taken_in: std::mem::take(&mut self.taken_in),
            purged_leases,
            identity: std::mem::take(&mut self.confirm_owed).then(|| self.identity.clone()),
        }
    }

    pub fn take_notices(&mut self) -> Vec<Notice> {
        std::mem::take(&mut self.notices)
    }

    // ---- the step -----------------------------------------------------

    /// Advances the pool to `now`: fires due timers, serves requests, keeps
    /// `min-ready`, and appends the driver calls now due to `out`.
    pub fn tick(&mut self, now: Time, out: &mut Vec<Effect>) {
        self.last_tick = self.last_tick.max(now);
        self.expire_leases(now);
        self.fire_timers(now);
        self.lift_pauses(now);
        self.plan(now);
        self.emit(now, out);
        self.emit_probes(now, out);
    }

    /// When [`Pool::tick`] next has something to do, if nothing else happens.
    ///
    /// Always after the last tick: whatever was due by then and still waits
    /// is held up by something (a call in flight, a hold, a limit) whose own
    /// time or outcome wakes the pool; counting it would make a busy loop.
    pub fn next_wakeup(&self) -> Option<Time> {
        let after = self.last_tick;
        let mut next: Option<Time> = None;
        let mut at = |t: Time| {
            if t > after {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        };
        if let Some(&(t, _)) = self.timers.first() {
            at(t);
        }
        // A schedule's window opening or closing changes `min-ready`.
        for label in &self.config.labels {
            if let Some(t) = label.next_window_edge(after.as_millis()) {
                at(Time(t));
            }
        }
        if let Some(t) = self.leases.next_expiry() {
            at(t);
        }
        for rt in &self.ix.providers {
            let list_owed = !rt.list_busy && rt.next_list <= after;
            if !rt.list_busy {
                at(rt.next_list);
            }
            let poll_owed = rt.next_boot_poll.is_some_and(|t| t <= after);
            let get_owed =
                !rt.get_busy && (poll_owed || (!rt.to_confirm.is_empty() && rt.next_get <= after));
            if !rt.get_busy && !rt.to_confirm.is_empty() {
                at(rt.next_get);
            }
            if !rt.get_busy
                && let Some(t) = rt.next_boot_poll
            {
                at(t);
            }
            if let Some(t) = rt.held_until {
                at(t);
            }
            if let Some(t) = rt.quota_paused_until {
                at(t);
            }
            for (_, t) in &rt.capacity_paused {
                at(*t);
            }
            let mut leak_owed = false;
            for leak in rt.leaks.values().filter(|l| !l.busy) {
                at(leak.due);
                leak_owed |= leak.due <= after;
            }
            let owes = list_owed
                || get_owed
                || leak_owed
                || !rt.want_create.is_empty()
                || !rt.want_delete.is_empty()
                || !rt.want_tags.is_empty();
            if owes && let Some(b) = &rt.bucket {
                at(b.next_token());
            }
            if leak_owed {
                at(rt.leak_bucket.next_token());
            }
        }
        for (i, rt) in self.ix.labels.iter().enumerate() {
            if rt.failures > 0 && self.config.labels[i].min_ready > 0 {
                at(rt.backoff_until);
            }
        }
        if let Some(t) = self.next_probe() {
            at(t);
        }
        next
    }
}
