//! The pool core's data: time, ids, nodes and their lifecycle, requests, and
//! the values the core hands to its runtime (effects, notices, changes).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::config::{LabelIx, ProviderIx};
use crate::driver::{Addresses, Connection, DriverError, Tags};

/// Wall-clock time in milliseconds since the Unix epoch. Wall clock rather
/// than a monotonic instant because it is stored and must mean the same thing
/// after a restart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Time(pub u64);

impl Time {
    pub const ZERO: Time = Time(0);

    pub fn from_millis(ms: u64) -> Time {
        Time(ms)
    }

    pub fn as_millis(self) -> u64 {
        self.0
    }

    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn since(self, earlier: Time) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}

impl std::ops::Add<Duration> for Time {
    type Output = Time;
    fn add(self, d: Duration) -> Time {
        Time(
            self.0
                .saturating_add(d.as_millis().min(u64::MAX as u128) as u64),
        )
    }
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub u64);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{:016x}"), self.0)
            }
        }

        impl FromStr for $name {
            type Err = ();
            fn from_str(s: &str) -> Result<Self, ()> {
                let hex = s.strip_prefix($prefix).ok_or(())?;
                if hex.len() != 16 {
                    return Err(());
                }
                u64::from_str_radix(hex, 16).map($name).map_err(|_| ())
            }
        }
    };
}

id_type!(
    /// A node's id; also its `berth-node` tag and the create's client token.
    NodeId,
    "n-"
);
id_type!(
    /// A request's id.
    RequestId,
    "r-"
);

/// What berth does with a node when nobody is using it. Spelled `run`,
/// `hold`, `drain` in tags, the store and the API (`FromStr`, [`Idle::as_str`]).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::VariantNames,
    strum::Display,
)]
#[strum(serialize_all = "kebab-case")]
pub enum Idle {
    /// Hand it out, recycle it by the label's rules.
    #[default]
    Run,
    /// Keep it: never handed out, never recycled (for inspection).
    Hold,
    /// Delete it as soon as it is idle.
    Drain,
}

impl Idle {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Why a node is being deleted, spelled in kebab case (`idle-timeout`) in
/// the store and the API.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::VariantNames,
)]
#[strum(serialize_all = "kebab-case")]
pub enum DeleteReason {
    /// A client returned it and the label is single use.
    Released,
    /// Ready longer than `max-ready-age`.
    Recycled,
    /// Ready beyond `min-ready` for longer than `idle-timeout`.
    IdleTimeout,
    /// Not running within `boot-timeout`.
    BootTimeout,
    /// Idle behaviour drain.
    Drained,
    /// An operator asked.
    Admin,
    /// A backing instance whose slots were all free for `grace-time`.
    SlotsIdle,
    /// Its launch failed after the instance existed.
    LaunchFailed,
    /// Ready and unused while a request for other labels needed its room.
    Evicted,
    /// The cloud reported its instance failed: it will never run.
    InstanceFailed,
}

impl DeleteReason {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Why a node is gone, spelled in kebab case (`slot-freed`).
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::VariantNames,
)]
#[strum(serialize_all = "kebab-case")]
pub enum GoneReason {
    /// berth deleted its instance.
    Deleted,
    /// Its instance disappeared without berth deleting it.
    Vanished,
    /// A slot node whose slot was freed.
    SlotFreed,
    /// Its backing instance went away.
    BackingLost,
    /// Its launch was given up before an instance existed (quota, capacity,
    /// cancelled request); not a failed try.
    Aborted,
}

impl GoneReason {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Where a node is in its life. Its [name](NodeState::name) (`in-use`) is
/// what the store and the API spell; [`NodeStateName`] reads one back.
#[derive(Clone, Debug, PartialEq, strum::IntoStaticStr, strum::EnumDiscriminants)]
#[strum(serialize_all = "kebab-case")]
#[strum_discriminants(
    name(NodeStateName),
    derive(strum::EnumString, strum::VariantNames),
    strum(serialize_all = "kebab-case")
)]
pub enum NodeState {
    /// The create intent is stored; the call is waiting or in flight. For a
    /// slot node: waiting for its backing instance to run.
    Creating { since: Time, attempt: u32 },
    /// The instance exists and is not running yet.
    Booting { since: Time },
    /// Running and free (or assigned to a request not yet fulfilled).
    Ready { since: Time },
    /// Handed out to a request.
    InUse { request: RequestId, since: Time },
    /// Returned by its client; about to be deleted, reused or freed.
    Used { since: Time },
    /// Its instance is to be deleted, or the delete is in flight.
    Deleting { since: Time, reason: DeleteReason },
    /// Its instance is gone. Kept for history, then forgotten.
    Gone { since: Time, reason: GoneReason },
    /// It could not be launched; it never had a running instance.
    Failed { since: Time, reason: String },
}

impl NodeState {
    pub fn name(&self) -> &'static str {
        self.into()
    }

    /// Whether the node has (or may have) a cloud instance counted against
    /// its provider's limits.
    pub fn holds_instance(&self) -> bool {
        !matches!(self, NodeState::Gone { .. } | NodeState::Failed { .. })
    }

    pub fn is_final(&self) -> bool {
        !self.holds_instance()
    }

    /// When the node entered this state.
    pub fn since(&self) -> Time {
        match self {
            NodeState::Creating { since, .. }
            | NodeState::Booting { since }
            | NodeState::Ready { since }
            | NodeState::InUse { since, .. }
            | NodeState::Used { since }
            | NodeState::Deleting { since, .. }
            | NodeState::Gone { since, .. }
            | NodeState::Failed { since, .. } => *since,
        }
    }
}

/// A node's part in slot packing. Its [name](Packing::name) (`plain`,
/// `backing`, `slot`) is what the store spells; [`PackingName`] reads one back.
#[derive(Clone, Debug, PartialEq, strum::IntoStaticStr, strum::EnumDiscriminants)]
#[strum(serialize_all = "kebab-case")]
#[strum_discriminants(
    name(PackingName),
    derive(strum::EnumString, strum::VariantNames),
    strum(serialize_all = "kebab-case")
)]
pub enum Packing {
    /// One node, one instance.
    Plain,
    /// An instance of a backing label that hosts the nodes of `slot_label`.
    Backing {
        slot_label: LabelIx,
        /// Which node holds each slot; `None` is free.
        slots: Vec<Option<NodeId>>,
        /// Since when every slot has been free.
        free_since: Option<Time>,
    },
    /// A node occupying slot `index` of `backing`.
    Slot { backing: NodeId, index: u16 },
}

impl Packing {
    pub fn name(&self) -> &'static str {
        self.into()
    }
}

/// What a node needs from the cloud: counted against provider limits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    pub vcpus: u32,
    pub ram_mib: u64,
}

impl From<&crate::config::Offer> for Resources {
    fn from(o: &crate::config::Offer) -> Self {
        Resources {
            vcpus: o.vcpus,
            ram_mib: o.ram_mib,
        }
    }
}

/// One node berth manages.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub id: NodeId,
    pub label: LabelIx,
    /// For a slot node, the backing instance's provider.
    pub provider: ProviderIx,
    pub instance_type: String,
    pub resources: Resources,
    pub price: f64,
    /// The cloud instance id once known. A slot node has none of its own.
    pub instance: Option<String>,
    pub state: NodeState,
    pub idle: Idle,
    pub packing: Packing,
    /// The pending request this node is set aside for.
    pub assigned: Option<RequestId>,
    /// When the node was first launched (its record created).
    pub created: Time,
    /// Addresses and login details, once the instance reported them.
    pub endpoint: Option<Box<Endpoint>>,
    /// Why its last failed launch try failed, for people: the cloud's
    /// reason for a failed instance, the driver's error for a failed
    /// create, a boot timeout. `None` while no try of it has failed; a node
    /// launched on a later try keeps it. Printable and cut to
    /// [`MAX_FAILURE`] bytes ([`failure_text`]).
    pub failure: Option<String>,
}

impl Node {
    /// The request the node is handed out to or set aside for, if any.
    pub fn request(&self) -> Option<RequestId> {
        match self.state {
            NodeState::InUse { request, .. } => Some(request),
            _ => self.assigned,
        }
    }
}

/// How a client reaches a node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Endpoint {
    pub addresses: Addresses,
    pub connection: Connection,
}

/// A request for a set of nodes.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub id: RequestId,
    pub requestor: String,
    /// Lower is served first.
    pub priority: i32,
    pub created: Time,
    /// Label and count; each label at most once.
    pub wants: Vec<(LabelIx, u32)>,
    pub state: RequestState,
    /// Nodes set aside (pending) or handed out (fulfilled).
    pub nodes: Vec<NodeId>,
    /// Failed launch tries made for this request.
    pub failures: u32,
    /// The last of them, for people: which node, on which provider, and
    /// why ("node n-… on provider `sim`: …"). Bounded as
    /// [`Node::failure`] is.
    pub last_failure: Option<String>,
    /// The client's idempotency key, if it gave one: the request's id is
    /// made from it ([`keyed_id`]), and the request is kept at least
    /// `idempotency-ttl` after it was made.
    pub key: Option<String>,
    /// The client's own words about the request, shown on it and on its
    /// nodes ([`Metadata`]).
    pub metadata: Metadata,
}

impl Request {
    /// Whether `new` asks for what this request asked
    /// ([`NewRequest::asks_as`]). A key given again with another ask is
    /// refused ([`Refused::KeyReused`]).
    pub fn asked_as(&self, new: &NewRequest) -> bool {
        new.asks_as(
            &self.requestor,
            self.priority,
            &self.wants,
            self.key.as_deref(),
            &self.metadata,
        )
    }
}

/// A request's metadata: the client's keys and values, bounded by
/// [`super::asked`]'s limits, in key order.
pub type Metadata = std::collections::BTreeMap<String, String>;

/// The id of the request `requestor` makes with idempotency key `key`:
/// the first 8 bytes of a SHA-256 over both. The same key from the same
/// requestor names the same request wherever it is asked (the pool's
/// holder, a process standing by, the store's inbox), so a retry finds
/// the request its first try made, across restarts and failover, by the
/// id the store already keeps unique.
pub fn keyed_id(requestor: &str, key: &str) -> RequestId {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"berth idempotency key\0");
    h.update(requestor.as_bytes());
    h.update([0]);
    h.update(key.as_bytes());
    let d = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&d[..8]);
    RequestId(u64::from_be_bytes(first))
}

/// The longest text a node's [failure](Node::failure) or a request's
/// [last failure](Request::last_failure) keeps, in bytes (before the `…`
/// that marks a cut). A driver's error and a cloud's reason are at most
/// 1024 bytes each (the host cuts them); this leaves room for what berth
/// says around them.
pub const MAX_FAILURE: usize = 2048;

/// `text` as a node or request keeps it: unsafe characters escaped
/// ([`crate::text::printable`]), cut to [`MAX_FAILURE`] bytes.
pub fn failure_text(text: &str) -> String {
    use crate::text::{printable, truncated};
    truncated(&printable(text), MAX_FAILURE).into_owned()
}

/// Where a request is. Its [name](RequestState::name) is what the store and
/// the API spell; [`RequestStateName`] reads one back.
#[derive(Clone, Debug, PartialEq, Eq, strum::IntoStaticStr, strum::EnumDiscriminants)]
#[strum(serialize_all = "kebab-case")]
#[strum_discriminants(
    name(RequestStateName),
    derive(strum::EnumString, strum::VariantNames),
    strum(serialize_all = "kebab-case")
)]
pub enum RequestState {
    Pending,
    Fulfilled { at: Time },
    Failed { at: Time, reason: String },
    Cancelled { at: Time },
}

impl RequestState {
    pub fn name(&self) -> &'static str {
        self.into()
    }
}

/// A request another process accepted that cannot be taken in as asked
/// ([`super::Pool::take_in`]): it names a label this pool's config does
/// not have. It is kept as failed, with `reason`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub requestor: String,
    pub priority: i32,
    pub reason: String,
}

/// What became of a request taken in from another process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TakenIn {
    /// It waits to be served, as a submitted one.
    Pending,
    /// It could not be served here, and failed with this reason.
    Failed(String),
    /// The pool already has a request of this id; nothing was taken in.
    Known,
}

/// What [`super::Pool::submit`] did with a request: its id, and whether it
/// is new (`fresh`) or one the pool had under that id already.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Submitted {
    pub id: RequestId,
    pub fresh: bool,
}

/// A new request as a client states it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NewRequest {
    pub requestor: String,
    pub priority: i32,
    pub wants: Vec<(LabelIx, u32)>,
    /// The client's idempotency key (the `Idempotency-Key` header).
    pub key: Option<String>,
    pub metadata: Metadata,
}

impl NewRequest {
    /// Whether this asks for what a request of `requestor`, `priority`,
    /// `wants`, `key` and `metadata` asked: the same of each, the labels
    /// and counts in any order.
    pub fn asks_as(
        &self,
        requestor: &str,
        priority: i32,
        wants: &[(LabelIx, u32)],
        key: Option<&str>,
        metadata: &Metadata,
    ) -> bool {
        let sorted = |wants: &[(LabelIx, u32)]| {
            let mut w: Vec<(LabelIx, u32)> =
                wants.iter().copied().filter(|(_, n)| *n > 0).collect();
            w.sort_unstable();
            w
        };
        self.requestor == requestor
            && self.priority == priority
            && sorted(&self.wants) == sorted(wants)
            && self.key.as_deref() == key
            && self.metadata == *metadata
    }
}

/// Why a driver call did not succeed, as the core needs to know it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The driver answered with a typed error.
    Driver(DriverError),
    /// The host could not get an answer it could use: a trap, a deadline,
    /// a driver that would not start, an answer that failed berth's checks.
    /// The call may or may not have reached the cloud.
    Host(HostFailure),
    /// The call was handed on to be carried out (another berth process
    /// holds the provider) and its answer was lost: it may well have been
    /// carried out. A create that ends so is not made again, here or on
    /// another provider, until a list that started afterwards has been
    /// believed: that list finds its instance if there is one.
    Unknown(String),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Driver(e) => write!(f, "{e}"),
            Failure::Host(h) => f.write_str(&h.message),
            Failure::Unknown(m) => f.write_str(m),
        }
    }
}

impl Failure {
    /// A host failure of `kind`, said in `message`.
    pub fn host(kind: HostFailureKind, message: impl Into<String>) -> Failure {
        Failure::Host(HostFailure {
            kind,
            message: message.into(),
        })
    }
}

/// Why the host got no answer it could use from a driver call: its kind,
/// for decisions and counts, and the source error in words (the core does
/// not know the sandbox's error types).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostFailure {
    pub kind: HostFailureKind,
    pub message: String,
}

/// The kinds of [`HostFailure`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostFailureKind {
    /// The driver instance trapped (a deadline, its memory cap, a panic, a
    /// crash) or could not be started or configured.
    Trap,
    /// The provider's driver has not started, or has stopped.
    NotStarted,
    /// The driver answered, and the answer failed berth's checks.
    BadAnswer,
    /// Another berth process was to carry the call out, and did not take it
    /// or failed before anything was sent to the cloud.
    Peer,
}

/// What the core wants done outside itself: a driver call, or a readiness
/// probe the host makes. The runtime carries it out and reports the outcome
/// back with the matching `Pool` method.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// A call to a provider's driver, counted in the provider's calls in
    /// flight until its outcome comes back.
    Call(DriverCall),
    /// A readiness probe: not a driver call, not counted in flight.
    Probe(Probe),
}

/// A call to a provider's driver that the core wants made.
#[derive(Clone, Debug, PartialEq)]
pub enum DriverCall {
    /// Launch `node`; report with [`super::Pool::created`].
    Create {
        provider: ProviderIx,
        node: NodeId,
        spec: crate::driver::CreateSpec,
    },
    /// Launch several nodes in one call, for a driver that declared
    /// `create-many`; report with [`super::Pool::created_many`].
    CreateMany {
        provider: ProviderIx,
        creates: Vec<(NodeId, crate::driver::CreateSpec)>,
    },
    /// Delete an instance; report with [`super::Pool::deleted`]. `node` is
    /// `None` for a leaked instance.
    Delete {
        provider: ProviderIx,
        node: Option<NodeId>,
        instance: String,
    },
    /// Delete several instances in one call, for a driver that declared
    /// `delete-many`; report with [`super::Pool::deleted_many`].
    DeleteMany {
        provider: ProviderIx,
        deletes: Vec<ToDelete>,
    },
    /// One page of a list of the provider's instances carrying the pool
    /// id: the first (`cursor` `None`) or the one after the page that gave
    /// `cursor`; report with [`super::Pool::listed`]. The core follows a
    /// list's pages one call at a time and believes it once it is complete.
    List {
        provider: ProviderIx,
        cursor: Option<String>,
    },
    /// Look up these instances by id (at most [`GET_MAX`]); report with
    /// [`super::Pool::got`].
    Get {
        provider: ProviderIx,
        instances: Vec<String>,
    },
    /// Replace berth's tags on a node's instance; report with
    /// [`super::Pool::tagged`].
    SetTags {
        provider: ProviderIx,
        node: NodeId,
        instance: String,
        tags: Tags,
    },
}

impl DriverCall {
    /// The provider whose driver the call goes to.
    pub fn provider(&self) -> ProviderIx {
        match self {
            DriverCall::Create { provider, .. }
            | DriverCall::CreateMany { provider, .. }
            | DriverCall::Delete { provider, .. }
            | DriverCall::DeleteMany { provider, .. }
            | DriverCall::List { provider, .. }
            | DriverCall::Get { provider, .. }
            | DriverCall::SetTags { provider, .. } => *provider,
        }
    }

    /// The contract's name for the call.
    pub fn name(&self) -> crate::driver::Call {
        use crate::driver::Call;
        match self {
            DriverCall::Create { .. } => Call::Create,
            DriverCall::CreateMany { .. } => Call::CreateMany,
            DriverCall::Delete { .. } => Call::Delete,
            DriverCall::DeleteMany { .. } => Call::DeleteMany,
            DriverCall::List { .. } => Call::List,
            DriverCall::Get { .. } => Call::Get,
            DriverCall::SetTags { .. } => Call::SetTags,
        }
    }
}

/// What a provider's driver takes many of in one call: its `create-many`
/// and `delete-many` capabilities.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Batches {
    pub create: bool,
    pub delete: bool,
}

impl From<&crate::driver::Capabilities> for Batches {
    fn from(c: &crate::driver::Capabilities) -> Batches {
        Batches {
            create: c.create_many,
            delete: c.delete_many,
        }
    }
}

/// One instance of a [`DriverCall::DeleteMany`]: `node` is `None` for a
/// leaked instance.
#[derive(Clone, Debug, PartialEq)]
pub struct ToDelete {
    pub node: Option<NodeId>,
    pub instance: String,
}

/// The most pages one list follows: a list that has not ended by then is
/// not believed.
pub const MAX_PAGES: u32 = 1000;

/// The longest cursor a page may hand back, in bytes: a longer one fails
/// the list.
pub const MAX_CURSOR: usize = 4096;

/// The most instances one `get` asks for (the contract's bound).
pub const GET_MAX: usize = 100;

/// The most items one `create-many` or `delete-many` carries (the
/// contract's bound).
pub const BATCH_MAX: usize = 100;

/// Probe whether a running node's instance is ready (`ready = "tcp"` or
/// `"ssh"`). The host makes it; report with [`super::Pool::probed`].
#[derive(Clone, Debug, PartialEq)]
pub struct Probe {
    pub provider: ProviderIx,
    pub node: NodeId,
    pub instance: String,
    pub target: super::ProbeTarget,
}

/// Something worth a log line, which the core cannot write itself.
#[derive(Clone, Debug, PartialEq)]
pub enum Notice {
    /// Instances without the pool id seen on a provider (said once).
    Foreign { provider: ProviderIx, count: usize },
    /// A complete list's pages named an instance more than once: every
    /// entry of it was left out of the list.
    ListRefused {
        provider: ProviderIx,
        refused: Vec<crate::driver::check::BadAnswer>,
    },
    /// An owned instance no node accounts for was deleted.
    LeakDeleted {
        provider: ProviderIx,
        instance: String,
    },
    /// An instance with berth's tags and no node was adopted.
    Adopted { node: NodeId, instance: String },
    /// An instance with berth's tags and no node was not adopted: the
    /// provider's limits are full. It is deleted as a leak after
    /// `leak-grace` if it is still there.
    NotAdopted {
        provider: ProviderIx,
        instance: String,
    },
    /// Instances of the pool on a provider are in quarantine: berth
    /// neither hands them out nor deletes them (said when new ones join;
    /// `named` gives the first few with the reason, `count` all).
    Quarantined {
        provider: ProviderIx,
        count: usize,
        named: Vec<(String, super::Quarantined)>,
    },
    /// A store that has not faced the clouds yet found instances of the
    /// pool it cannot vouch for on a provider: nothing is created there
    /// until a list shows none (said when it starts).
    StoreMismatch { provider: ProviderIx, why: String },
    /// A provider's lists no longer show instances the store cannot vouch
    /// for: creates there go on.
    StoreMismatchEnded { provider: ProviderIx },
    /// A node was put on hold because its instance's tags say it is handed
    /// out and the store does not have it so (a lost hand-out): never
    /// handed out nor recycled until an operator says so.
    HeldByTags {
        node: NodeId,
        instance: String,
        why: String,
    },
    /// A node's instance disappeared: confirmed missing, or listed as
    /// terminated.
    Vanished { node: NodeId },
    /// A list did not show a node's instance: it is suspected missing, not
    /// gone, until later lists confirm it.
    Missing { node: NodeId, instance: String },
    /// A suspected instance was listed again.
    Reappeared { node: NodeId },
    /// A node in use lost its instance (confirmed missing, or listed as
    /// terminated): kept in use for its holder, deleted once released.
    LostInUse { node: NodeId },
    /// An instance of a node berth had given up as vanished was listed
    /// again: the node is back.
    Revived { node: NodeId, instance: String },
    /// A provider's lists fail (said at the first failure in a row, then at
    /// most once a minute).
    ListFailing {
        provider: ProviderIx,
        failures: u32,
        error: String,
    },
    /// A provider's list showed none of the `known` instances berth holds
    /// there, and is not believed (said as `ListFailing` is).
    ListSuspect { provider: ProviderIx, known: usize },
    /// A provider's lists are believed again after failing or not being
    /// believed since `since`.
    ListRecovered { provider: ProviderIx, since: Time },
    /// A request failed.
    RequestFailed { request: RequestId, reason: String },
    /// A provider's creates are paused.
    QuotaPaused { provider: ProviderIx, until: Time },
    /// Every call to a provider is held.
    RateLimited { provider: ProviderIx, until: Time },
    /// An instance type is paused on a provider.
    CapacityPaused {
        provider: ProviderIx,
        instance_type: Option<String>,
        until: Time,
    },
    /// A requestor stopped renewing its lease: its pending requests failed
    /// and its nodes in use were taken back.
    LeaseExpired {
        requestor: String,
        failed: usize,
        reclaimed: usize,
    },
}

/// How a provider's lists are going.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListHealth {
    /// The last list was believed.
    Ok,
    /// Lists fail (an error, a trap, a deadline) since `since`.
    Failing { since: Time, error: String },
    /// Lists answer, but showed none of the instances berth knows there,
    /// since `since`; they are not believed until that has lasted
    /// `missing-confirm` over two lists at least.
    Suspect { since: Time, known: usize },
}

/// A node whose instance a complete list did not show: suspected missing,
/// not gone. Lists that keep not showing it confirm it (two at least, over
/// `missing-confirm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Missing {
    /// When a list first did not show it.
    pub since: Time,
    /// Lists in a row that did not show it.
    pub lists: u32,
    /// Confirmed gone while the node was in use: it is kept for its holder
    /// (never deleted for it) and deleted once released.
    pub confirmed: bool,
}

/// Records that changed since the last [`super::Pool::take_changes`]: what the
/// runtime writes to the store before it carries out any effect.
#[derive(Clone, Debug, Default)]
pub struct Changes {
    pub nodes: Vec<Node>,
    pub requests: Vec<Request>,
    /// RequestorLeases renewed or taken out.
    pub leases: Vec<RequestorLease>,
    /// Forgotten records, to remove from the store.
    pub purged_nodes: Vec<NodeId>,
    pub purged_requests: Vec<RequestId>,
    /// RequestorLeases that expired, by requestor.
    pub purged_leases: Vec<String>,
    /// Requests taken in from the store's inbox ([`super::Pool::take_in`]):
    /// the commit that writes them removes their entries from it, and is
    /// refused whole if another commit took any of them first.
    pub taken_in: Vec<RequestId>,
    /// The store's identity to write over the one it has: once the store
    /// has faced every provider ([`super::Identity::confirmed`]), or when
    /// one store's records are copied into another (`berth store
    /// migrate`).
    pub identity: Option<super::Identity>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
            && self.requests.is_empty()
            && self.leases.is_empty()
            && self.purged_nodes.is_empty()
            && self.purged_requests.is_empty()
            && self.purged_leases.is_empty()
            && self.taken_in.is_empty()
            && self.identity.is_none()
    }
}

/// A requestor's claim on its requests and nodes, renewed by its
/// heartbeats. Once `expires` passes unrenewed, its pending requests fail and
/// its nodes in use are taken back: nothing stays allocated to a client that
/// has gone away.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestorLease {
    pub requestor: String,
    pub expires: Time,
    /// How long its last renewal made it last: what a restart gives it
    /// again ([`super::Pool::restore`]).
    pub ttl: Duration,
}

/// What a store held at start.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub nodes: Vec<Node>,
    pub requests: Vec<Request>,
    pub leases: Vec<RequestorLease>,
    /// The store's identity: what the instances it made are tagged and
    /// signed with.
    pub identity: super::Identity,
}

/// Why a request was refused at once.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("a request must ask for at least one node")]
    Empty,
    #[error("label `{0}` is asked for twice; give each label once with its count")]
    DuplicateLabel(String),
    #[error(
        "label `{label}`: asked for {wanted} nodes, but the configured provider limits allow at most {possible} at once"
    )]
    TooMany {
        label: String,
        wanted: u32,
        possible: u64,
    },
    #[error("label `{0}` was removed from the config")]
    Removed(String),
    /// Alone, it asks for more than a cap (`max-nodes`) allows.
    #[error("{0}")]
    OverCap(String),
    /// The key, made printable, and the request it made.
    #[error(
        "the idempotency key `{key}` was given before with another request ({request}); the same key must come with the same requestor, labels, priority and metadata"
    )]
    KeyReused { key: String, request: RequestId },
}

/// Why an operation on an existing node or request was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Conflict {
    #[error("no such node")]
    NoSuchNode,
    #[error("no such request")]
    NoSuchRequest,
    #[error("node is {0}, not in use")]
    NotInUse(&'static str),
    #[error("request is {0}, not pending")]
    NotPending(&'static str),
    #[error("node is already {0}")]
    AlreadyFinal(&'static str),
}
