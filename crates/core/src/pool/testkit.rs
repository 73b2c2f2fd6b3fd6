//! A deterministic harness for the pool core: a fake in-memory cloud that
//! carries out [`Effect`]s, an injected clock, and a store that keeps what
//! [`Pool::take_changes`] hands it exactly as the real one would, so a test
//! can crash the pool and restore it.
//!
//! The harness also watches what no single test asserts: calls made to a
//! provider inside a rate-limit window it announced, more calls in flight than
//! the sandbox allows, a wakeup in the past (a busy loop in the runtime), and
//! a request forgotten before it ended.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::config::{Label, Offer, Provider, Readiness, Timings};
use crate::driver::{Addresses, Connection, DriverError, Instance, InstanceState, Page};

/// Where every test's clock starts: a realistic wall-clock time.
pub(super) const T0: Time = Time(1_700_000_000_000);

pub(super) fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

// ---- config ---------------------------------------------------------------

/// A provider with no rate limit and no limits.
pub(super) fn provider(name: &str) -> Provider {
    Provider::new(name)
}

/// An offer of instance type `ty` on provider `p`: 1 vCPU, 1 GiB, price 1.
pub(super) fn offer(p: u16, ty: &str) -> Offer {
    Offer {
        provider: ProviderIx(p),
        instance_type: ty.into(),
        image: "img".into(),
        options: "{}".into(),
        vcpus: 1,
        ram_mib: 1024,
        price: 1.0,
    }
}

/// A machine label with the given offers, ready once its instance runs
/// (the fake cloud's instances have nothing to probe).
pub(super) fn machine(name: &str, offers: Vec<Offer>) -> Label {
    Label {
        ready: Readiness::RUNNING,
        ..Label::new(name, LabelKind::Machine { offers })
    }
}

/// A slot label with `slots` slots per instance of `backing`.
pub(super) fn slots(name: &str, backing: u16, slots: u16) -> Label {
    Label {
        kind: LabelKind::Slots {
            slots,
            backing: LabelIx(backing),
            grace_time: Label::DEFAULT_GRACE_TIME,
        },
        ..machine(name, Vec::new())
    }
}

pub(super) fn config(providers: Vec<Provider>, labels: Vec<Label>) -> Config {
    Config {
        pool_id: "pool-1".into(),
        timings: Timings::default(),
        providers,
        labels,
        requestor_lease_ttl: Config::DEFAULT_LEASE_TTL,
        requestor_caps: Default::default(),
    }
}

// ---- the fake cloud -------------------------------------------------------

/// A kind of driver call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Call {
    Create,
    CreateMany,
    List,
    Get,
    Delete,
    DeleteMany,
    SetTags,
    /// A readiness probe: not a driver call, but the instance is reached.
    Probe,
}

impl Call {
    pub(super) fn of(effect: &Effect) -> Call {
        match effect {
            Effect::Call(call) => Call::driver(call),
            Effect::Probe(_) => Call::Probe,
        }
    }

    fn driver(call: &DriverCall) -> Call {
        match call {
            DriverCall::Create { .. } => Call::Create,
            DriverCall::CreateMany { .. } => Call::CreateMany,
            DriverCall::DeleteMany { .. } => Call::DeleteMany,
            DriverCall::List { .. } => Call::List,
            DriverCall::Get { .. } => Call::Get,
            DriverCall::Delete { .. } => Call::Delete,
            DriverCall::SetTags { .. } => Call::SetTags,
        }
    }
}

/// A failure the fake cloud answers with, for the next `times` calls of a kind.
#[derive(Clone, Debug)]
pub(super) struct Fault {
    pub call: Call,
    pub failure: Failure,
    pub times: u32,
    /// Whether the call took effect before it failed (a driver that traps
    /// after its create went through).
    pub reached: bool,
}

/// A lie the fake cloud tells in its answers, for the next `times` calls it
/// applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Lie {
    /// A list names an owned live instance twice, the copy under another
    /// node id (the runtime's checks refuse both).
    Twin,
    /// A list names an owned live instance under a new node id that a label
    /// could adopt, instead of its own.
    Relabel,
    /// A list names an adoptable instance that does not exist.
    Phantom,
    /// A create answers with an owned live instance that is already there
    /// instead of making one.
    HeldCreate,
    /// A list answers with nothing at all.
    Empty,
    /// A list answers with its first half only (a lost page).
    Truncated,
}

#[derive(Clone, Debug)]
pub(super) struct FakeInstance {
    pub id: String,
    pub instance_type: String,
    pub tags: Tags,
    pub created: Time,
    pub terminated: Option<Time>,
    /// Set when the cloud gave up on it (`InstanceState::Failed`): why.
    pub failed: Option<String>,
}

/// One provider's account in the fake cloud.
#[derive(Clone, Debug, Default)]
pub(super) struct FakeProvider {
    pub instances: BTreeMap<String, FakeInstance>,
    /// How long a new instance is pending before it runs; zero: at once.
    pub boot_delay: Duration,
    /// How long after it runs an instance answers probes; `None`: never.
    pub ready_delay: Option<Duration>,
    /// The host keys an instance's SSH server shows.
    pub host_keys: Vec<String>,
    /// The host keys the cloud reports for its instances.
    pub reported_keys: Vec<String>,
    /// Most live instances the account allows.
    pub quota: Option<u32>,
    /// Instance types without capacity.
    pub out_of_capacity: Vec<String>,
    /// How long a terminated instance stays listed.
    pub linger: Duration,
    pub faults: Vec<Fault>,
    /// Lies still to tell, and how many times each.
    pub lies: Vec<(Lie, u32)>,
    /// Where the lies' made-up node ids are counted.
    pub invented: u64,
    /// Every call that reached the cloud, when.
    pub calls: Vec<(Time, Call)>,
    /// The rate-limit window this provider announced, as the pool learned it.
    pub held_until: Option<Time>,
    pub in_flight: u32,
    pub max_in_flight: u32,
    /// What its driver declares it takes many of in one call.
    pub batches: Batches,
    /// Instances per list page (`None`: every one on one page).
    pub page_size: Option<usize>,
    /// While set, every page from this one (counted from 0) on fails as
    /// `transient`.
    pub failing_pages: Option<usize>,
    /// The cloud's own rate limit, one call per this long: a call sooner
    /// after the last one it took is refused as `rate-limited`, retry
    /// after this long.
    pub one_call_per: Option<Duration>,
    /// When the cloud last took a call, under `one_call_per`.
    pub last_taken: Option<Time>,
}

impl FakeProvider {
    pub(super) fn live(&self) -> impl Iterator<Item = &FakeInstance> {
        self.instances.values().filter(|i| i.terminated.is_none())
    }

    /// Takes one lie of those that apply to `call`, if any is left.
    fn lie(&mut self, call: Call) -> Option<Lie> {
        let (lie, times) = self.lies.iter_mut().find(|(l, t)| {
            *t > 0
                && match call {
                    Call::Create => *l == Lie::HeldCreate,
                    Call::List => *l != Lie::HeldCreate,
                    _ => false,
                }
        })?;
        *times -= 1;
        Some(*lie)
    }

    /// The fault a call meets: the cloud's own rate limit, or one injected.
    fn refused(&mut self, now: Time, call: Call) -> Option<Fault> {
        if let Some(gap) = self.one_call_per {
            if self.last_taken.is_some_and(|t| now < t + gap) {
                return Some(Fault {
                    call,
                    failure: rate_limited(gap.as_millis() as u64),
                    times: 1,
                    reached: false,
                });
            }
            self.last_taken = Some(now);
        }
        self.fault(call)
    }

    fn fault(&mut self, call: Call) -> Option<Fault> {
        let f = self
            .faults
            .iter_mut()
            .find(|f| f.call == call && f.times > 0)?;
        f.times -= 1;
        Some(f.clone())
    }
}

#[derive(Clone, Debug, Default)]
pub(super) struct Cloud {
    pub providers: Vec<FakeProvider>,
    counter: u64,
}

/// The answer to a call, as the runtime would report it.
#[derive(Clone, Debug)]
pub(super) enum Outcome {
    Created(NodeId, Result<Instance, Failure>),
    CreatedMany(ProviderIx, Vec<(NodeId, Result<Instance, Failure>)>),
    Deleted(ProviderIx, Option<NodeId>, String, Result<(), Failure>),
    DeletedMany(ProviderIx, Vec<(ToDelete, Result<(), Failure>)>),
    Listed(ProviderIx, Result<Page, Failure>),
    Got(ProviderIx, Vec<String>, Result<Vec<Instance>, Failure>),
    Tagged(NodeId, Result<(), Failure>),
    Probed(NodeId, Result<Vec<String>, String>),
}

impl Outcome {
    fn failure(&self) -> Option<&Failure> {
        match self {
            Outcome::Created(_, r) => r.as_ref().err(),
            Outcome::Deleted(.., r) => r.as_ref().err(),
            // A batch's answers each carry their own: a rate limit among
            // them holds the provider.
            Outcome::CreatedMany(_, all) => all.iter().find_map(|(_, r)| r.as_ref().err()),
            Outcome::DeletedMany(_, all) => all.iter().find_map(|(_, r)| r.as_ref().err()),
            Outcome::Listed(_, r) => r.as_ref().err(),
            Outcome::Got(_, _, r) => r.as_ref().err(),
            Outcome::Tagged(_, r) => r.as_ref().err(),
            Outcome::Probed(..) => None,
        }
    }
}

pub(super) fn effect_provider(e: &Effect) -> ProviderIx {
    match e {
        Effect::Call(call) => call.provider(),
        Effect::Probe(probe) => probe.provider,
    }
}

impl Cloud {
    pub(super) fn new(providers: usize) -> Cloud {
        Cloud {
            providers: vec![FakeProvider::default(); providers],
            counter: 0,
        }
    }

    /// An instance put in the cloud behind berth's back.
    pub(super) fn plant(&mut self, p: u16, ty: &str, tags: Tags, now: Time) -> String {
        self.counter += 1;
        let id = format!("i-{p}-{:04}", self.counter);
        self.providers[usize::from(p)].instances.insert(
            id.clone(),
            FakeInstance {
                id: id.clone(),
                instance_type: ty.into(),
                tags,
                created: now,
                terminated: None,
                failed: None,
            },
        );
        id
    }

    fn report(&self, p: usize, i: &FakeInstance, now: Time) -> Instance {
        let fp = &self.providers[p];
        let state = match (i.terminated, &i.failed) {
            (Some(_), _) => InstanceState::Terminated,
            (None, Some(_)) => InstanceState::Failed,
            (None, None) if i.created + fp.boot_delay <= now => InstanceState::Running,
            (None, None) => InstanceState::Pending,
        };
        Instance {
            id: i.id.clone(),
            state,
            instance_type: i.instance_type.clone(),
            tags: i.tags.clone(),
            addresses: Addresses {
                private_ipv4: Some(format!("10.0.0.{}", i.id.len())),
                ..Addresses::default()
            },
            created_at_ms: Some(i.created.as_millis()),
            connection: Connection {
                host_keys: fp.reported_keys.clone(),
                ..Connection::default()
            },
            failure: i.failed.clone().filter(|_| state == InstanceState::Failed),
        }
    }

    /// A readiness probe of `instance` at `now`: its keys once it has run
    /// for the provider's `ready_delay`.
    fn probe(&self, p: usize, node: NodeId, instance: &str, now: Time) -> Outcome {
        let fp = &self.providers[p];
        let up = fp.instances.get(instance).is_some_and(|i| {
            i.terminated.is_none()
                && fp
                    .ready_delay
                    .is_some_and(|d| i.created + fp.boot_delay + d <= now)
        });
        let r = match (up, fp.ready_delay) {
            (true, _) => Ok(fp.host_keys.clone()),
            (false, None) => Err("timed out waiting for the server's banner".to_owned()),
            (false, Some(_)) => Err("connection refused".to_owned()),
        };
        Outcome::Probed(node, r)
    }

    /// Carries out a call at `now`.
    pub(super) fn carry_out(&mut self, now: Time, effect: &Effect) -> Outcome {
        let p = effect_provider(effect).0 as usize;
        match effect {
            Effect::Probe(probe) => self.probe(p, probe.node, &probe.instance, now),
            Effect::Call(call) => self.call(p, now, call),
        }
    }

    /// Carries out a driver call to provider `p` at `now`.
    fn call(&mut self, p: usize, now: Time, effect: &DriverCall) -> Outcome {
        let call = Call::driver(effect);
        // Terminated instances stay listed for a while, then go.
        let linger = self.providers[p].linger;
        self.providers[p]
            .instances
            .retain(|_, i| i.terminated.is_none_or(|t| t + linger > now));
        self.providers[p].calls.push((now, call));
        let fault = self.providers[p].refused(now, call);
        if let Some(f) = &fault
            && !f.reached
        {
            let e = f.failure.clone();
            return match effect {
                DriverCall::Create { node, .. } => Outcome::Created(*node, Err(e)),
                DriverCall::Delete {
                    provider,
                    node,
                    instance,
                } => Outcome::Deleted(*provider, *node, instance.clone(), Err(e)),
                DriverCall::List { provider, .. } => Outcome::Listed(*provider, Err(e)),
                DriverCall::Get {
                    provider,
                    instances,
                } => Outcome::Got(*provider, instances.clone(), Err(e)),
                DriverCall::SetTags { node, .. } => Outcome::Tagged(*node, Err(e)),
                DriverCall::CreateMany { provider, creates } => Outcome::CreatedMany(
                    *provider,
                    (creates.iter())
                        .map(|(n, _)| (*n, Err(e.clone())))
                        .collect(),
                ),
                DriverCall::DeleteMany { provider, deletes } => Outcome::DeletedMany(
                    *provider,
                    (deletes.iter())
                        .map(|d| (d.clone(), Err(e.clone())))
                        .collect(),
                ),
            };
        }
        let lie = self.providers[p].lie(call);
        let outcome = self.answer(p, now, effect, lie);
        match fault {
            // It went through, and then the answer was lost or wrong.
            Some(f) => match outcome {
                Outcome::Created(n, _) => Outcome::Created(n, Err(f.failure)),
                Outcome::Deleted(p, n, i, _) => Outcome::Deleted(p, n, i, Err(f.failure)),
                Outcome::Listed(p, _) => Outcome::Listed(p, Err(f.failure)),
                Outcome::Got(p, asked, _) => Outcome::Got(p, asked, Err(f.failure)),
                Outcome::Tagged(n, _) => Outcome::Tagged(n, Err(f.failure)),
                Outcome::CreatedMany(p, all) => Outcome::CreatedMany(
                    p,
                    (all.into_iter())
                        .map(|(n, _)| (n, Err(f.failure.clone())))
                        .collect(),
                ),
                Outcome::DeletedMany(p, all) => Outcome::DeletedMany(
                    p,
                    (all.into_iter())
                        .map(|(d, _)| (d, Err(f.failure.clone())))
                        .collect(),
                ),
                probed @ Outcome::Probed(..) => probed,
            },
            None => outcome,
        }
    }

    /// A create that reached provider `p`: within its quota and capacity,
    /// an instance.
    fn create(
        &mut self,
        p: usize,
        now: Time,
        spec: &crate::driver::CreateSpec,
    ) -> Result<Instance, Failure> {
        let fp = &self.providers[p];
        if fp.quota.is_some_and(|q| fp.live().count() as u32 >= q) {
            return Err(Failure::Driver(DriverError::QuotaExceeded(
                "instances".into(),
            )));
        }
        if fp.out_of_capacity.contains(&spec.instance_type) {
            return Err(Failure::Driver(DriverError::Capacity {
                scope: crate::driver::CapacityScope::InstanceType(spec.instance_type.clone()),
                message: "sold out".into(),
            }));
        }
        let id = self.plant(p as u16, &spec.instance_type, spec.tags.clone(), now);
        let i = &self.providers[p].instances[&id];
        Ok(self.report(p, i, now))
    }

    /// A delete that reached provider `p`.
    fn delete(&mut self, p: usize, now: Time, instance: &str) -> Result<(), Failure> {
        match self.providers[p].instances.get_mut(instance) {
            Some(i) => {
                i.terminated.get_or_insert(now);
                Ok(())
            }
            None => Err(Failure::Driver(DriverError::NotFound(instance.to_owned()))),
        }
    }

    /// What the cloud does with a call that reached it, and answers.
    fn answer(&mut self, p: usize, now: Time, effect: &DriverCall, lie: Option<Lie>) -> Outcome {
        match effect {
            // A batch is each of its items, told no lies.
            DriverCall::CreateMany { provider, creates } => {
                let answers = (creates.iter())
                    .map(|(node, spec)| (*node, self.create(p, now, spec)))
                    .collect();
                Outcome::CreatedMany(*provider, answers)
            }
            DriverCall::DeleteMany { provider, deletes } => {
                let answers = (deletes.iter())
                    .map(|d| (d.clone(), self.delete(p, now, &d.instance)))
                    .collect();
                Outcome::DeletedMany(*provider, answers)
            }
            DriverCall::Create { node, .. }
                if lie == Some(Lie::HeldCreate)
                    && let Some(held) = self.owned_live(p).next() =>
            {
                Outcome::Created(*node, Ok(self.report(p, held, now)))
            }
            DriverCall::Create { node, spec, .. } => {
                Outcome::Created(*node, self.create(p, now, spec))
            }
            DriverCall::List { provider, cursor } => {
                // Pages by id marker: those after the cursor's id.
                let fp = &self.providers[p];
                let after = |id: &String| cursor.as_ref().is_none_or(|c| id > c);
                let size = fp.page_size.unwrap_or(usize::MAX);
                let rest: Vec<&FakeInstance> =
                    fp.instances.values().filter(|i| after(&i.id)).collect();
                let page_index = fp.instances.len().saturating_sub(rest.len()) / size.max(1);
                if fp.failing_pages.is_some_and(|first| page_index >= first) {
                    return Outcome::Listed(*provider, Err(transient()));
                }
                let more = rest.len() > size;
                let mut all: Vec<Instance> = (rest.iter().take(size))
                    .map(|i| self.report(p, i, now))
                    .collect();
                let next = more.then(|| all.last().map(|i| i.id.clone())).flatten();
                if let Some(lie) = lie {
                    self.tell(p, lie, &mut all, now);
                }
                Outcome::Listed(
                    *provider,
                    Ok(Page {
                        instances: all,
                        next,
                    }),
                )
            }
            // A look by id tells no lies: what list lies do is lose pages.
            DriverCall::Get {
                provider,
                instances,
            } => {
                let fp = &self.providers[p];
                let found = (instances.iter())
                    .filter_map(|id| fp.instances.get(id))
                    .filter(|i| i.terminated.is_none_or(|t| now.since(t) < fp.linger))
                    .map(|i| self.report(p, i, now))
                    .collect();
                Outcome::Got(*provider, instances.clone(), Ok(found))
            }
            DriverCall::Delete {
                provider,
                node,
                instance,
            } => Outcome::Deleted(
                *provider,
                *node,
                instance.clone(),
                self.delete(p, now, instance),
            ),
            DriverCall::SetTags {
                node,
                instance,
                tags,
                ..
            } => {
                let result = match self.providers[p].instances.get_mut(instance) {
                    Some(i) => {
                        i.tags
                            .retain(|k, _| !k.starts_with(crate::driver::BERTH_TAG_PREFIX));
                        i.tags.extend(tags.clone());
                        Ok(())
                    }
                    None => Err(Failure::Driver(DriverError::NotFound(instance.clone()))),
                };
                Outcome::Tagged(*node, result)
            }
        }
    }
}

impl Cloud {
    fn owned_live(&self, p: usize) -> impl Iterator<Item = &FakeInstance> {
        self.providers[p]
            .live()
            .filter(|i| i.tags.contains_key(crate::driver::NODE_TAG))
    }

    /// Changes a list answer as `lie` says.
    fn tell(&mut self, p: usize, lie: Lie, all: &mut Vec<Instance>, now: Time) {
        self.providers[p].invented += 1;
        let invented = format!("n-{:016x}", 0xdead_0000_0000 + self.providers[p].invented);
        let first = self.owned_live(p).next().map(|i| self.report(p, i, now));
        match (lie, first) {
            (Lie::Twin, Some(real)) => {
                let mut twin = real;
                twin.tags.insert(crate::driver::NODE_TAG.into(), invented);
                all.push(twin);
            }
            (Lie::Relabel, Some(real)) => {
                if let Some(entry) = all.iter_mut().find(|i| i.id == real.id) {
                    entry.tags.insert(crate::driver::NODE_TAG.into(), invented);
                }
            }
            (Lie::Empty, _) => all.clear(),
            (Lie::Truncated, _) => all.truncate(all.len() / 2),
            (Lie::Phantom, _) => all.push(Instance {
                id: format!("i-phantom-{p}-{}", self.providers[p].invented),
                state: InstanceState::Running,
                instance_type: if p == 0 { "t0" } else { "t1" }.into(),
                tags: [
                    (crate::driver::POOL_TAG.to_string(), "pool-1".to_string()),
                    (crate::driver::NODE_TAG.to_string(), invented),
                    (crate::driver::LABEL_TAG.to_string(), "a".to_string()),
                ]
                .into(),
                addresses: Addresses::default(),
                created_at_ms: Some(now.as_millis()),
                connection: Connection::default(),
                failure: None,
            }),
            _ => {}
        }
    }
}

pub(super) fn rate_limited(ms: u64) -> Failure {
    Failure::Driver(DriverError::RateLimited {
        retry_after: Duration::from_millis(ms),
        message: "slow down".into(),
    })
}

pub(super) fn transient() -> Failure {
    Failure::Driver(DriverError::Transient("try again".into()))
}

pub(super) fn quota() -> Failure {
    Failure::Driver(DriverError::QuotaExceeded("instances".into()))
}

pub(super) fn capacity(ty: &str) -> Failure {
    Failure::Driver(DriverError::Capacity {
        scope: crate::driver::CapacityScope::InstanceType(ty.into()),
        message: "sold out".into(),
    })
}

pub(super) fn trap() -> Failure {
    Failure::host(HostFailureKind::Trap, "driver trapped: unreachable")
}

/// What kind of instance a test plants in the cloud behind berth's back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Planted {
    /// Without the pool's tags.
    Foreign,
    /// With the pool's tags, signed by the store berth runs on (the
    /// harness's default identity): a leak berth must delete.
    Signed,
    /// With the pool's tags but no signature (made by hand): berth must
    /// neither hand it out nor delete it.
    Unsigned,
}

/// The tags berth would give node `node` of `label` on a `ty` instance,
/// signed with the default identity the harness's store has.
pub(super) fn signed_tags(config: &Config, node: NodeId, label: &str, ty: &str) -> Tags {
    let identity = Identity::default();
    let signature = identity.sign(Signed {
        pool_id: &config.pool_id,
        node,
        label,
        instance_type: ty,
        slots: None,
    });
    [
        (crate::driver::POOL_TAG.to_string(), config.pool_id.clone()),
        (crate::driver::NODE_TAG.to_string(), node.to_string()),
        (crate::driver::LABEL_TAG.to_string(), label.to_string()),
        (crate::driver::IDLE_TAG.to_string(), "run".to_string()),
        (
            crate::driver::STORE_TAG.to_string(),
            identity.generation.clone(),
        ),
        (crate::driver::SIG_TAG.to_string(), signature),
    ]
    .into()
}

// ---- the store ------------------------------------------------------------

/// What the store holds: every change applied as the runtime applies it.
#[derive(Clone, Debug, Default)]
pub(super) struct Store {
    pub nodes: HashMap<NodeId, Node>,
    pub requests: HashMap<RequestId, Request>,
    pub leases: HashMap<String, RequestorLease>,
    pub identity: Identity,
}

impl Store {
    /// Applies changes; returns what a store should never be asked to do.
    fn apply(&mut self, c: Changes) -> Vec<String> {
        let mut wrong = Vec::new();
        for n in c.nodes {
            // A node in use is never given up because lists stopped showing
            // its instance: it stays with its holder until released.
            let was_in_use = self
                .nodes
                .get(&n.id)
                .is_some_and(|old| matches!(old.state, NodeState::InUse { .. }));
            let lost = matches!(
                n.state,
                NodeState::Gone {
                    reason: GoneReason::Vanished,
                    ..
                }
            );
            if was_in_use && lost {
                wrong.push(format!("{} went from in use to {:?}", n.id, n.state));
            }
            self.nodes.insert(n.id, n);
        }
        for r in c.requests {
            self.requests.insert(r.id, r);
        }
        if let Some(identity) = c.identity {
            self.identity = identity;
        }
        for l in c.leases {
            self.leases.insert(l.requestor.clone(), l);
        }
        for r in c.purged_leases {
            self.leases.remove(&r);
        }
        for id in c.purged_nodes {
            match self.nodes.remove(&id) {
                Some(n) if n.state.is_final() => {}
                other => wrong.push(format!("node {id} purged while {other:?}")),
            }
        }
        for id in c.purged_requests {
            match self.requests.remove(&id) {
                Some(r) if r.state != RequestState::Pending => {}
                other => wrong.push(format!("request {id} purged while {other:?}")),
            }
        }
        wrong
    }

    pub(super) fn snapshot(&self) -> Snapshot {
        let mut nodes: Vec<Node> = self.nodes.values().cloned().collect();
        nodes.sort_by_key(|n| n.id);
        let mut requests: Vec<Request> = self.requests.values().cloned().collect();
        requests.sort_by_key(|r| r.id);
        let mut leases: Vec<RequestorLease> = self.leases.values().cloned().collect();
        leases.sort_by(|a, b| a.requestor.cmp(&b.requestor));
        Snapshot {
            nodes,
            requests,
            leases,
            identity: self.identity.clone(),
        }
    }
}

// ---- the harness ----------------------------------------------------------

/// A call made and not yet answered.
#[derive(Clone, Debug)]
pub(super) struct InFlight {
    pub effect: Effect,
    pub due: Time,
    /// The cloud's answer, if the call has reached it.
    pub outcome: Option<Outcome>,
}

pub(super) struct Harness {
    pub config: Arc<Config>,
    pub pool: Pool,
    pub cloud: Cloud,
    pub now: Time,
    pub in_flight: Vec<InFlight>,
    /// How long a call takes to answer.
    pub latency: Duration,
    /// The clock's step in [`Harness::advance`].
    pub dt: Duration,
    /// Calls reach the cloud when they answer rather than when made, so a
    /// crash loses them unseen.
    pub reach_late: bool,
    /// Every call made, when.
    pub log: Vec<(Time, Effect)>,
    pub notices: Vec<Notice>,
    pub store: Store,
    /// What the harness saw go wrong beyond a test's own asserts.
    pub violations: Vec<String>,
    /// Check every invariant after every step, not only when asked.
    pub strict: bool,
    seed: u64,
    restarts: u64,
}

impl Harness {
    pub(super) fn new(config: Config) -> Harness {
        let config = Arc::new(config);
        let seed = 7;
        Harness {
            pool: Pool::new(config.clone(), seed),
            cloud: Cloud::new(config.providers.len()),
            config,
            now: T0,
            in_flight: Vec::new(),
            latency: Duration::ZERO,
            dt: secs(1),
            reach_late: false,
            log: Vec::new(),
            notices: Vec::new(),
            store: Store::default(),
            violations: Vec::new(),
            strict: false,
            seed,
            restarts: 0,
        }
    }

    pub(super) fn label(&self, name: &str) -> LabelIx {
        self.config.label(name).expect("label")
    }

    /// Writes what changed to the store, as the runtime does after each call
    /// into the pool.
    pub(super) fn persist(&mut self) {
        let changes = self.pool.take_changes();
        let wrong = self.store.apply(changes);
        self.violations.extend(wrong);
        self.notices.extend(self.pool.take_notices());
    }

    /// One tick at the current time: the calls it makes are made.
    pub(super) fn tick(&mut self) {
        let mut out = Vec::new();
        self.pool.tick(self.now, &mut out);
        self.persist();
        if let Some(t) = self.pool.next_wakeup()
            && t <= self.now
        {
            self.violations.push(format!(
                "next wakeup {t:?} is not after the tick at {:?}",
                self.now
            ));
        }
        for effect in out {
            self.make(effect);
        }
    }

    fn make(&mut self, effect: Effect) {
        if let Effect::Probe(_) = effect {
            // The host's own call: no driver, no provider limit.
            self.log.push((self.now, effect.clone()));
            self.in_flight.push(InFlight {
                effect,
                due: self.now + self.latency,
                outcome: None,
            });
            return;
        }
        let p = effect_provider(&effect).0 as usize;
        let fp = &mut self.cloud.providers[p];
        if let Some(until) = fp.held_until
            && until > self.now
        {
            self.violations.push(format!(
                "{effect:?} at {:?} inside the rate-limit window until {until:?}",
                self.now
            ));
        }
        fp.in_flight += 1;
        fp.max_in_flight = fp.max_in_flight.max(fp.in_flight);
        let max = self.config.providers[p].max_calls.max(1);
        if fp.in_flight > max {
            self.violations.push(format!(
                "{} calls in flight to provider {p}, at most {max}",
                fp.in_flight
            ));
        }
        // A node in use never loses its instance to berth, whatever lists
        // say: alone or in a batch.
        let deleted: Vec<&str> = match &effect {
            Effect::Call(DriverCall::Delete { instance, .. }) => vec![instance],
            Effect::Call(DriverCall::DeleteMany { deletes, .. }) => {
                deletes.iter().map(|d| d.instance.as_str()).collect()
            }
            _ => Vec::new(),
        };
        for instance in deleted {
            if let Some(holder) = self.pool.holder(effect_provider(&effect), instance)
                && (self.pool.node(holder))
                    .is_some_and(|n| matches!(n.state, NodeState::InUse { .. }))
            {
                self.violations.push(format!(
                    "{effect:?} at {:?}: the instance of {holder}, which is in use",
                    self.now
                ));
            }
        }
        self.log.push((self.now, effect.clone()));
        let outcome = (!self.reach_late).then(|| self.cloud.carry_out(self.now, &effect));
        self.in_flight.push(InFlight {
            effect,
            due: self.now + self.latency,
            outcome,
        });
    }

    /// Answers the call at `index` of `in_flight` now.
    pub(super) fn deliver(&mut self, index: usize) {
        let call = self.in_flight.remove(index);
        let outcome = match call.outcome {
            Some(o) => o,
            None => self.cloud.carry_out(self.now, &call.effect),
        };
        let p = effect_provider(&call.effect);
        if let Outcome::Probed(id, r) = outcome {
            self.pool.probed(id, r, self.now);
            self.persist();
            return;
        }
        let fp = &mut self.cloud.providers[p.0 as usize];
        fp.in_flight = fp.in_flight.saturating_sub(1);
        if let Some(Failure::Driver(DriverError::RateLimited { retry_after, .. })) =
            outcome.failure()
        {
            let until = self.now + *retry_after;
            fp.held_until = Some(fp.held_until.map_or(until, |t| t.max(until)));
        }
        let now = self.now;
        // What a driver answers passes the runtime's checks first.
        let checked = |r: Result<Instance, Failure>| {
            r.and_then(|i| match crate::driver::check::instance(&i) {
                Ok(()) => Ok(i),
                Err(bad) => Err(Failure::host(HostFailureKind::BadAnswer, bad.to_string())),
            })
        };
        match outcome {
            Outcome::Created(id, r) => self.pool.created(now, id, checked(r)),
            Outcome::CreatedMany(p, all) => {
                let all = (all.into_iter()).map(|(id, r)| (id, checked(r))).collect();
                self.pool.created_many(now, p, all)
            }
            Outcome::Deleted(p, node, instance, r) => self.pool.deleted(now, p, node, &instance, r),
            Outcome::DeletedMany(p, all) => self.pool.deleted_many(now, p, all),
            Outcome::Listed(p, r) => {
                let r = r.map(|page| Page {
                    instances: crate::driver::check::listing(page.instances).0,
                    next: page.next,
                });
                self.pool.listed(now, p, r)
            }
            Outcome::Got(p, asked, r) => {
                let r = r.map(|all| crate::driver::check::listing(all).0);
                self.pool.got(now, p, &asked, r)
            }
            Outcome::Tagged(id, r) => self.pool.tagged(now, id, r),
            // A probe's outcome returned above; it is not a driver call.
            Outcome::Probed(..) => {}
        }
        self.persist();
    }

    /// Answers every call due by now, then ticks, until nothing more happens
    /// at this instant.
    pub(super) fn step(&mut self) {
        for _ in 0..100 {
            let mut any = false;
            while let Some(i) = self.in_flight.iter().position(|c| c.due <= self.now) {
                self.deliver(i);
                any = true;
            }
            let made = self.log.len();
            self.tick();
            if !any && self.log.len() == made {
                return;
            }
        }
        self.violations
            .push(format!("no quiet point at {:?} after 100 rounds", self.now));
    }

    /// Moves the clock on by `d`, stepping every `dt`.
    pub(super) fn advance(&mut self, d: Duration) {
        let end = self.now + d;
        while self.now < end {
            self.now = (self.now + self.dt).min(end);
            self.step();
            if self.strict
                && self.violations.is_empty()
                && let Err(e) = self.check()
            {
                self.violations.push(format!("at {:?}: {e}", self.now));
            }
        }
    }

    /// Steps until `done` holds, for at most `limit`; whether it held.
    pub(super) fn run_until(
        &mut self,
        limit: Duration,
        mut done: impl FnMut(&Harness) -> bool,
    ) -> bool {
        let end = self.now + limit;
        self.step();
        while !done(self) {
            if self.now >= end {
                return false;
            }
            self.now = (self.now + self.dt).min(end);
            self.step();
        }
        true
    }

    /// The process dies: answers in flight are lost (calls that reached the
    /// cloud stay done), and a new pool starts from what the store holds.
    pub(super) fn crash(&mut self) {
        self.in_flight.clear();
        for fp in &mut self.cloud.providers {
            fp.in_flight = 0;
            // A new process has not been told to wait; the cloud would say so again.
            fp.held_until = None;
        }
        self.restarts += 1;
        let seed = self
            .seed
            .wrapping_add(self.restarts.wrapping_mul(0x1000_0001));
        self.pool = Pool::restore(self.config.clone(), seed, self.store.snapshot(), self.now);
        // The new process learns what the drivers declare as they start.
        for (p, fp) in self.cloud.providers.iter().enumerate() {
            self.pool.declared(ProviderIx(p as u16), fp.batches);
        }
    }

    /// Provider `p`'s driver declares it takes batches.
    pub(super) fn declare(&mut self, p: u16, batches: Batches) {
        self.cloud.providers[usize::from(p)].batches = batches;
        self.pool.declared(ProviderIx(p), batches);
    }

    pub(super) fn submit(&mut self, wants: &[(&str, u32)], priority: i32) -> RequestId {
        self.submit_as("test", wants, priority)
    }

    pub(super) fn submit_as(
        &mut self,
        requestor: &str,
        wants: &[(&str, u32)],
        priority: i32,
    ) -> RequestId {
        let wants = wants.iter().map(|(l, n)| (self.label(l), *n)).collect();
        let id = self
            .pool
            .submit(
                self.now,
                NewRequest {
                    requestor: requestor.into(),
                    priority,
                    wants,
                    ..NewRequest::default()
                },
            )
            .expect("submit");
        self.persist();
        id
    }

    pub(super) fn renew(&mut self, requestor: &str, ttl: Duration) {
        self.pool.renew(self.now, requestor, ttl);
        self.persist();
    }

    pub(super) fn release(&mut self, id: NodeId) {
        self.pool.release(self.now, id).expect("release");
        self.persist();
    }

    /// Gives back every node of request `id` still in use.
    pub(super) fn release_held(&mut self, id: RequestId) {
        let nodes = (self.pool.request(id)).map_or_else(Vec::new, |r| r.nodes.clone());
        for n in nodes {
            if matches!(
                self.pool.node(n).map(|n| &n.state),
                Some(NodeState::InUse { .. })
            ) {
                self.release(n);
            }
        }
    }

    pub(super) fn set_idle(&mut self, id: NodeId, idle: Idle) {
        self.pool.set_idle(self.now, id, idle).expect("set idle");
        self.persist();
    }

    pub(super) fn state(&self, id: RequestId) -> RequestState {
        self.pool.request(id).expect("request").state.clone()
    }

    pub(super) fn fulfilled(&self, id: RequestId) -> bool {
        matches!(self.state(id), RequestState::Fulfilled { .. })
    }

    /// Nodes of a label in a state (by its name), sorted by id.
    pub(super) fn nodes(&self, label: &str, state: &str) -> Vec<Node> {
        let l = self.label(label);
        let mut v: Vec<Node> = self
            .pool
            .nodes()
            .filter(|n| n.label == l && n.state.name() == state)
            .cloned()
            .collect();
        v.sort_by_key(|n| n.id);
        v
    }

    pub(super) fn count(&self, label: &str, state: &str) -> usize {
        self.nodes(label, state).len()
    }

    /// Calls of a kind made to a provider.
    pub(super) fn calls(&self, p: u16, call: Call) -> Vec<Time> {
        self.log
            .iter()
            .filter(|(_, e)| effect_provider(e).0 == p && Call::of(e) == call)
            .map(|(t, _)| *t)
            .collect()
    }

    /// Live instances the cloud has on a provider.
    pub(super) fn live(&self, p: u16) -> usize {
        self.cloud.providers[usize::from(p)].live().count()
    }

    /// Every invariant that must hold after every step; the first broken one.
    pub(super) fn check(&self) -> Result<(), String> {
        if let Some(v) = self.violations.first() {
            return Err(v.clone());
        }
        let pool = &self.pool;
        // Provider usage, counted from the nodes themselves.
        for (i, p) in self.config.providers.iter().enumerate() {
            let mut usage = Usage::default();
            for n in pool.nodes() {
                if n.provider.0 as usize == i
                    && n.state.holds_instance()
                    && !matches!(n.packing, Packing::Slot { .. })
                {
                    usage.add(n.resources);
                }
            }
            let counted = pool.provider_status(ProviderIx(i as u16)).usage;
            if usage != counted {
                return Err(format!(
                    "provider {i}: nodes use {usage:?}, index says {counted:?}"
                ));
            }
            let l = &p.limits;
            if l.max_instances.is_some_and(|m| usage.instances > m)
                || l.max_cores.is_some_and(|m| usage.vcpus > m)
                || l.max_ram_mib.is_some_and(|m| usage.ram_mib > m)
            {
                return Err(format!("provider {i}: {usage:?} is above {l:?}"));
            }
        }
        // No node given to two requests, and both sides agree.
        let mut owner: HashMap<NodeId, RequestId> = HashMap::new();
        for r in pool.requests() {
            if r.state != RequestState::Pending {
                continue;
            }
            for n in &r.nodes {
                if let Some(other) = owner.insert(*n, r.id) {
                    return Err(format!("node {n} set aside for {other} and {}", r.id));
                }
                let node = pool
                    .node(*n)
                    .ok_or(format!("request {} holds unknown {n}", r.id))?;
                if node.assigned != Some(r.id) {
                    return Err(format!("{n} in {} but assigned {:?}", r.id, node.assigned));
                }
            }
        }
        for n in pool.nodes() {
            if let Some(r) = n.assigned {
                if owner.get(&n.id) != Some(&r) {
                    return Err(format!("{} assigned to {r}, which does not hold it", n.id));
                }
                if n.state.is_final() {
                    return Err(format!("{} is {} and still assigned", n.id, n.state.name()));
                }
            }
            if let NodeState::InUse { request, .. } = n.state {
                // A fulfilled request may be forgotten while its nodes are in use.
                let r = pool.request(request);
                let ok = r.is_none_or(|r| {
                    matches!(r.state, RequestState::Fulfilled { .. }) && r.nodes.contains(&n.id)
                });
                if !ok || n.assigned.is_some() {
                    return Err(format!("{} in use by {request}, which is {r:?}", n.id));
                }
            }
        }
        // Slots: each held by one live node, which points back.
        for n in pool.nodes() {
            match &n.packing {
                Packing::Backing { slots, .. } => {
                    for (i, s) in slots.iter().enumerate() {
                        let Some(s) = s else { continue };
                        let ok = pool.node(*s).is_some_and(|sn| {
                            sn.packing
                                == Packing::Slot {
                                    backing: n.id,
                                    index: i as u16,
                                }
                                && !sn.state.is_final()
                        });
                        if !ok {
                            return Err(format!(
                                "slot {i} of {} names {s}: {:?}",
                                n.id,
                                pool.node(*s)
                            ));
                        }
                    }
                    if n.state.is_final() && slots.iter().any(Option::is_some) {
                        return Err(format!("{} is final with slots taken", n.id));
                    }
                }
                Packing::Slot { backing, index } if !n.state.is_final() => {
                    let ok = pool.node(*backing).is_some_and(|b| match &b.packing {
                        Packing::Backing { slots, .. } => {
                            slots.get(usize::from(*index)) == Some(&Some(n.id))
                        }
                        _ => false,
                    });
                    if !ok {
                        return Err(format!("slot node {} not held by {backing}", n.id));
                    }
                }
                _ => {}
            }
        }
        // No instance held by two live nodes (a backing node's slots share
        // its instance through it, not by holding it).
        let mut holder: HashMap<(ProviderIx, &str), NodeId> = HashMap::new();
        for n in pool.nodes() {
            if n.state.is_final() || matches!(n.packing, Packing::Slot { .. }) {
                continue;
            }
            if let Some(i) = n.instance.as_deref()
                && let Some(other) = holder.insert((n.provider, i), n.id)
            {
                return Err(format!("instance {i} held by {other} and {}", n.id));
            }
        }
        // The store holds what the pool holds.
        for n in pool.nodes() {
            if self.store.nodes.get(&n.id) != Some(n) {
                return Err(format!("store differs for {}", n.id));
            }
        }
        if self.store.nodes.len() != pool.nodes().count() {
            return Err("store holds nodes the pool forgot".into());
        }
        Ok(())
    }

    /// After quiet time: every owned live instance belongs to exactly one
    /// live node or is in quarantine (which only an instance berth cannot
    /// vouch for may be), and every running node's instance is there.
    pub(super) fn check_no_leaks(&self) -> Result<(), String> {
        for (p, fp) in self.cloud.providers.iter().enumerate() {
            let quarantined = self.pool.provider_status(ProviderIx(p as u16)).quarantined;
            for i in fp.live() {
                if i.tags.get(crate::driver::POOL_TAG) != Some(&self.config.pool_id) {
                    continue;
                }
                if quarantined.contains_key(&i.id) {
                    if i.tags.contains_key(crate::driver::SIG_TAG) {
                        return Err(format!(
                            "instance {} on provider {p} is signed, yet in quarantine",
                            i.id
                        ));
                    }
                    continue;
                }
                let owners: Vec<&Node> = self
                    .pool
                    .nodes()
                    .filter(|n| {
                        n.provider.0 as usize == p && !matches!(n.packing, Packing::Slot { .. })
                    })
                    .filter(|n| n.instance.as_deref() == Some(i.id.as_str()))
                    .filter(|n| !n.state.is_final())
                    .collect();
                if owners.len() != 1 {
                    return Err(format!(
                        "instance {} on provider {p} has {} live nodes",
                        i.id,
                        owners.len()
                    ));
                }
            }
        }
        for n in self.pool.nodes() {
            let settled = matches!(
                n.state,
                NodeState::Ready { .. } | NodeState::InUse { .. } | NodeState::Used { .. }
            );
            if !settled || matches!(n.packing, Packing::Slot { .. }) {
                continue;
            }
            let Some(inst) = &n.instance else {
                return Err(format!(
                    "{} is {} without an instance",
                    n.id,
                    n.state.name()
                ));
            };
            if !self.cloud.providers[n.provider.0 as usize]
                .live()
                .any(|i| &i.id == inst)
            {
                return Err(format!("{} is {} but {inst} is gone", n.id, n.state.name()));
            }
        }
        Ok(())
    }
}
