//! One configured provider running on a driver: a bounded set of driver
//! instances. A call checks an idle instance out, runs on a guest thread
//! (`guests.rs`) and puts it back, so each `Store` is owned by exactly one
//! task at a time.
//! A trap discards the instance that trapped; a later call instantiates and
//! configures a fresh one. Other instances and other providers are untouched.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tracing::Instrument;
use wasmtime::Store;

use super::Driver;
use super::bindings::{GuestAnswer, Plugin, PluginPre};
use super::guest_log::LogBudget;
use super::guests::{Guests, TaskLost};
use super::limits::{DeadlineExceeded, MemoryCapExceeded};
use super::sandbox::HttpPolicy;
use super::state::{DriverState, StateSpace};
use super::store_data::StoreState;
use berth_config::{AllowedHost, Credential, SandboxLimits};
use berth_core::driver::{
    AccountLimits, Call, CreateSpec, DriverError, DriverInfo, Instance, Page, Tags,
};

/// How one provider's driver runs in its sandbox.
#[derive(Clone, Debug)]
pub struct SandboxConfig {
    /// The provider's name, used in logs and errors.
    pub name: String,
    /// The pool id passed to `configure`; the driver tags everything with it.
    pub pool_id: String,
    /// Provider-level driver config, JSON text.
    pub driver_config: String,
    /// Hosts the driver may send HTTP requests to.
    pub allowed_hosts: Vec<AllowedHost>,
    /// Resource limits.
    pub limits: SandboxLimits,
    /// Credentials the host adds to requests to the hosts they name.
    pub credentials: Vec<Credential>,
    /// Where the driver's `state` records live; `None` keeps them in memory
    /// for as long as the provider lives.
    pub state: Option<DriverState>,
    /// Addresses the driver may never reach, whatever its allow-list says:
    /// berth's own API.
    pub deny: Vec<std::net::SocketAddr>,
    /// Shut while this process may not act on clouds; `None` is always
    /// open.
    pub gate: Option<Arc<crate::Gate>>,
}

/// A failed call: which provider, which call, what went wrong.
#[derive(Debug, Clone, thiserror::Error)]
#[error("provider {provider}: {call}: {kind}")]
pub struct CallError {
    pub provider: Arc<str>,
    pub call: Call,
    pub kind: CallErrorKind,
}

/// What went wrong in a call.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallErrorKind {
    /// The driver returned a typed error value.
    #[error("{0}")]
    Driver(DriverError),
    /// The driver instance trapped and was discarded.
    #[error("driver trapped: {0}")]
    Trap(Trap),
    /// A fresh instance could not be started or configured.
    #[error("driver could not start: {0}")]
    Start(Box<CallErrorKind>),
    /// The provider has not started (its driver did not load or its first
    /// instance failed); the reason.
    #[error("the provider has not started: {0}")]
    NotStarted(Arc<str>),
    /// The provider was closed.
    #[error("provider stopped")]
    Stopped,
    /// Another berth process carried the call out for this one, or was to,
    /// and it failed there, or was not taken, before anything was sent to
    /// the cloud; what went wrong, in words.
    #[error("{0}")]
    Peer(Arc<str>),
    /// The call was handed to another berth process and its answer was
    /// lost: it may have been carried out.
    #[error("{0}")]
    PeerLost(Arc<str>),
}

impl CallErrorKind {
    /// The trap, if the instance trapped.
    pub fn trap(&self) -> Option<&Trap> {
        match self {
            CallErrorKind::Trap(t) => Some(t),
            CallErrorKind::Start(inner) => inner.trap(),
            _ => None,
        }
    }
}

/// Why a driver instance was discarded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
pub enum Trap {
    /// The call ran past its deadline (in a CPU loop or waiting) and was stopped.
    #[error("call ran past its deadline of {}ms and was stopped", .0.as_millis())]
    Deadline(Duration),
    /// The driver tried to grow its memory past the cap.
    #[error("exceeded the memory cap of {0} bytes")]
    OutOfMemory(u64),
    /// The driver panicked (Rust panics abort with `unreachable`); the last
    /// line it wrote to stderr, if any, says why.
    #[error("panicked: {0}")]
    Panic(String),
    /// Any other trap.
    #[error("{0}")]
    Crash(String),
}

impl CallErrorKind {
    /// How a call that failed this way ended, in a word, the same in stats,
    /// metrics and logs: the contract's error kind (`rate-limited`,
    /// `quota-exceeded`, `capacity`, `not-found`, `unauthorized`,
    /// `invalid-config`, `transient`, `permanent`), `trap`, `start-failed`,
    /// `not-started`, `stopped`, `peer` or `peer-lost`. A call that did not
    /// fail is `ok`.
    pub fn outcome(&self) -> &'static str {
        match self {
            CallErrorKind::Driver(e) => e.into(),
            CallErrorKind::Trap(_) => "trap",
            CallErrorKind::Start(_) => "start-failed",
            CallErrorKind::NotStarted(_) => "not-started",
            CallErrorKind::Stopped => "stopped",
            CallErrorKind::Peer(_) => "peer",
            CallErrorKind::PeerLost(_) => "peer-lost",
        }
    }
}

impl Trap {
    /// The kind of trap in a word, the same in stats, metrics and the API:
    /// `deadline`, `out-of-memory`, `panic` or `crash`.
    pub fn name(&self) -> &'static str {
        self.into()
    }
}

/// Result of a delete: gone now, or already gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deletion {
    Deleted,
    AlreadyGone,
}

/// Calls made so far, by call and outcome.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallStats {
    /// `(call, outcome)` → (count, total microseconds); outcomes are `ok`
    /// and [`CallErrorKind::outcome`]'s words.
    pub calls: BTreeMap<(Call, &'static str), (u64, u64)>,
    /// Driver instances started (the first, and one after each trap).
    pub instances_started: u64,
    /// Traps by kind ([`Trap::name`]).
    pub traps: BTreeMap<&'static str, u64>,
}

type GuestFuture<'a, T> = Pin<Box<dyn Future<Output = GuestAnswer<T>> + Send + 'a>>;

/// One of the contract's calls with its arguments, typed by what it
/// answers: run on an instance that is checked out, started and
/// configured, by [`Sandbox::call`] or [`DriverInstance::call`].
trait Export: Send + 'static {
    type Output: Send + 'static;
    const CALL: Call;
    fn run(self, live: &mut Live) -> GuestFuture<'_, Self::Output>;
}

/// Makes sure an instance is started and configured; calls nothing more.
struct Warm;
struct Create(CreateSpec);
struct CreateMany(Vec<CreateSpec>);
struct Get {
    pool_id: String,
    ids: Vec<String>,
}
struct List {
    filter: Tags,
    cursor: Option<String>,
}
struct Delete(String);
struct DeleteMany(Vec<String>);
struct SetTags(String, Tags);
struct Limits;

impl Export for Warm {
    type Output = ();
    const CALL: Call = Call::Configure;
    fn run(self, _live: &mut Live) -> GuestFuture<'_, ()> {
        Box::pin(async { Ok(Ok(())) })
    }
}

impl Export for Create {
    type Output = Instance;
    const CALL: Call = Call::Create;
    fn run(self, live: &mut Live) -> GuestFuture<'_, Instance> {
        Box::pin(async move { live.plugin.create(&mut live.store, &self.0).await })
    }
}

impl Export for CreateMany {
    type Output = Vec<Result<Instance, DriverError>>;
    const CALL: Call = Call::CreateMany;
    fn run(self, live: &mut Live) -> GuestFuture<'_, Self::Output> {
        Box::pin(async move { live.plugin.create_many(&mut live.store, &self.0).await })
    }
}

impl Export for Get {
    type Output = Vec<Instance>;
    const CALL: Call = Call::Get;
    fn run(self, live: &mut Live) -> GuestFuture<'_, Vec<Instance>> {
        Box::pin(async move {
            (live.plugin)
                .get(&mut live.store, &self.pool_id, &self.ids)
                .await
        })
    }
}

impl Export for List {
    type Output = Page;
    const CALL: Call = Call::List;
    fn run(self, live: &mut Live) -> GuestFuture<'_, Page> {
        Box::pin(async move {
            (live.plugin)
                .list(&mut live.store, &self.filter, self.cursor.as_deref())
                .await
        })
    }
}

impl Export for Delete {
    type Output = ();
    const CALL: Call = Call::Delete;
    fn run(self, live: &mut Live) -> GuestFuture<'_, ()> {
        Box::pin(async move { live.plugin.delete(&mut live.store, &self.0).await })
    }
}

impl Export for DeleteMany {
    type Output = Vec<Result<(), DriverError>>;
    const CALL: Call = Call::DeleteMany;
    fn run(self, live: &mut Live) -> GuestFuture<'_, Self::Output> {
        Box::pin(async move { live.plugin.delete_many(&mut live.store, &self.0).await })
    }
}

impl Export for SetTags {
    type Output = ();
    const CALL: Call = Call::SetTags;
    fn run(self, live: &mut Live) -> GuestFuture<'_, ()> {
        Box::pin(async move {
            live.plugin
                .set_tags(&mut live.store, &self.0, &self.1)
                .await
        })
    }
}

impl Export for Limits {
    type Output = AccountLimits;
    const CALL: Call = Call::Limits;
    fn run(self, live: &mut Live) -> GuestFuture<'_, AccountLimits> {
        Box::pin(async move { live.plugin.limits(&mut live.store).await })
    }
}

struct Shared {
    name: Arc<str>,
    pool_id: String,
    driver_config: String,
    limits: SandboxLimits,
    policy: Arc<HttpPolicy>,
    state: StateSpace,
    pre: PluginPre,
    /// What the driver may log, shared by its instances.
    log: Arc<LogBudget>,
    /// Plain mutex: held only to bump counters, never across an await.
    stats: Mutex<CallStats>,
}

/// One provider's driver, running in its sandbox. Cheap to clone; the
/// instances go away when the last clone is dropped.
#[derive(Clone)]
pub struct Sandbox {
    shared: Arc<Shared>,
    driver: Driver,
    spare: Arc<Spare>,
    /// Where its calls run; held here (not by the calls themselves) so the
    /// guests' runtime is never dropped on one of its own threads.
    guests: Arc<Guests>,
}

/// The provider's instances that are not running a call.
///
/// Why not one task per instance fed by a channel: a call checked out to
/// the task that runs it keeps the same guarantee (each `Store` owned by one
/// task at a time, moved, never shared) with one hand-off per call (to a
/// guest thread and back) instead of one per instance and call.
struct Spare {
    /// One permit per instance that may exist; bounds concurrency.
    permits: Semaphore,
    /// Plain mutex: held only to push or pop, never across an await.
    instances: Mutex<Vec<DriverInstance>>,
}

struct Live {
    store: Store<StoreState>,
    plugin: Plugin,
}

impl Sandbox {
    /// Starts a provider on `driver`. Instances are created lazily, when a
    /// call finds none idle and fewer than `max_instances` exist.
    pub fn start(driver: &Driver, config: SandboxConfig) -> Sandbox {
        let name: Arc<str> = config.name.into();
        let mut limits = config.limits;
        if limits.memory_bytes > driver.inner.max_memory_bytes {
            tracing::warn!(provider = %name, cap = limits.memory_bytes, max = driver.inner.max_memory_bytes, "memory cap above the runtime's maximum; using the maximum");
            limits.memory_bytes = driver.inner.max_memory_bytes;
        }
        let shared = Arc::new(Shared {
            policy: Arc::new(
                HttpPolicy::new(name.clone(), config.allowed_hosts)
                    .with_credentials(config.credentials)
                    .denying(config.deny)
                    .gated(
                        config
                            .gate
                            .unwrap_or_else(|| Arc::new(crate::Gate::always())),
                    )
                    .limited(&limits),
            ),
            state: config
                .state
                .unwrap_or_else(DriverState::in_memory)
                .space(&name),
            log: Arc::new(LogBudget::new(
                name.clone(),
                limits.log_rate,
                limits.log_bytes,
            )),
            name,
            pool_id: config.pool_id,
            driver_config: config.driver_config,
            limits,
            pre: driver.inner.pre.clone(),
            stats: Mutex::new(CallStats::default()),
        });
        let spare = Arc::new(Spare {
            permits: Semaphore::new(shared.limits.max_instances.max(1)),
            instances: Mutex::new(Vec::new()),
        });
        Sandbox {
            shared,
            driver: driver.clone(),
            spare,
            guests: driver.inner.guests.clone(),
        }
    }

    /// The provider's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The driver it runs.
    pub fn driver(&self) -> &Driver {
        &self.driver
    }

    /// A snapshot of the calls made so far.
    pub fn stats(&self) -> CallStats {
        self.shared
            .stats
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    /// Outbound HTTP requests the sandbox refused so far.
    pub fn denied_requests(&self) -> u64 {
        self.shared.policy.denied_count()
    }

    /// How each of the provider's credentials is doing.
    pub fn credentials(&self) -> Vec<crate::CredentialStatus> {
        self.shared.policy.credentials().statuses()
    }

    /// Reads every credential's secrets again (and exchanges them again)
    /// at its next use: what `SIGHUP` does.
    pub fn reload_credentials(&self) {
        self.shared.policy.credentials().reload();
    }

    /// The conformance kit's fault mode: answers every request the driver
    /// is allowed to send with `recorded` (nothing reaches the cloud) until
    /// called with `None`.
    pub(crate) fn answer_with(&self, recorded: Option<crate::sandbox::Recorded>) {
        self.shared.policy.answer_with(recorded);
    }

    /// Requests answered in the fault mode so far.
    pub(crate) fn answered_requests(&self) -> u64 {
        self.shared.policy.answered()
    }

    /// Log records of the driver dropped over its rate or byte limit so
    /// far.
    pub fn log_dropped(&self) -> u64 {
        self.shared.log.dropped().records
    }

    /// The bytes of those records (each with its line's overhead).
    pub fn log_dropped_bytes(&self) -> u64 {
        self.shared.log.dropped().bytes
    }

    /// Stops taking calls: calls already running finish, later ones fail
    /// with `Stopped`.
    pub fn close(&self) {
        self.spare.permits.close();
    }

    async fn call<E: Export>(&self, export: E) -> Result<E::Output, CallError> {
        let call = E::CALL;
        let err = |kind| CallError {
            provider: self.shared.name.clone(),
            call,
            kind,
        };
        let (shared, spare) = (self.shared.clone(), self.spare.clone());
        // Dropping the task (the caller was cancelled) cancels the call: the
        // instance is dropped with it and its permit freed, and a later call
        // starts a fresh one.
        let task = self.guests.spawn(async move {
            let _permit = spare
                .permits
                .acquire()
                .await
                .map_err(|_| CallErrorKind::Stopped)?;
            // Most recently used first, so a lightly loaded provider keeps
            // few instances warm.
            let mut instance = spare
                .instances
                .lock()
                .ok()
                .and_then(|mut spare| spare.pop())
                .unwrap_or_else(|| DriverInstance {
                    shared,
                    live: None,
                    _guests: None,
                });
            let result = instance.dispatch(export).await;
            if let Ok(mut spare) = spare.instances.lock() {
                spare.push(instance);
            }
            result
        });
        match task.await {
            Ok(result) => result.map_err(err),
            Err(TaskLost::Cancelled) => Err(err(CallErrorKind::Stopped)),
            Err(TaskLost::Panicked(why)) => {
                tracing::error!(provider = %self.shared.name, %call, %why, "the host panicked in a driver call");
                Err(err(CallErrorKind::Trap(Trap::Crash(format!(
                    "the host panicked in the call: {why}"
                )))))
            }
        }
    }

    /// A driver instance of this provider (same config, limits and
    /// allow-list) owned by the caller, outside the provider's bounded set.
    pub fn instance(&self) -> DriverInstance {
        DriverInstance {
            shared: self.shared.clone(),
            live: None,
            _guests: Some(self.guests.clone()),
        }
    }
}

/// Calls `describe` on a throwaway instance with no network access, on a
/// guest thread.
pub(super) async fn describe(
    guests: &Guests,
    pre: &PluginPre,
    name: &str,
    memory_bytes: u64,
) -> Result<DriverInfo, CallError> {
    let name: Arc<str> = name.into();
    let (pre, task_name) = (pre.clone(), name.clone());
    let task = guests.spawn(async move { describe_here(&pre, task_name, memory_bytes).await });
    match task.await {
        Ok(result) => result,
        Err(lost) => Err(CallError {
            provider: name,
            call: Call::Describe,
            kind: match lost {
                TaskLost::Cancelled => CallErrorKind::Stopped,
                TaskLost::Panicked(why) => CallErrorKind::Trap(Trap::Crash(format!(
                    "the host panicked in the call: {why}"
                ))),
            },
        }),
    }
}

async fn describe_here(
    pre: &PluginPre,
    name: Arc<str>,
    memory_bytes: u64,
) -> Result<DriverInfo, CallError> {
    let limits = SandboxLimits {
        memory_bytes: memory_bytes.min(SandboxLimits::default().memory_bytes),
        ..SandboxLimits::default()
    };
    let policy = Arc::new(HttpPolicy::new(name.clone(), Vec::new()));
    let err = |kind| CallError {
        provider: name.clone(),
        call: Call::Describe,
        kind,
    };
    let budget = limits.call_deadline;
    let state = DriverState::in_memory().space(&name);
    let log = Arc::new(LogBudget::new(
        name.clone(),
        limits.log_rate,
        limits.log_bytes,
    ));
    let mut live = instantiate(pre, name.clone(), &limits, policy, state, log)
        .await
        .map_err(|e| err(CallErrorKind::Trap(classify(e, budget, None))))?;
    guarded(&mut live, budget, async |live: &mut Live| {
        live.plugin.describe(&mut live.store).await
    })
    .await
    .map_err(|t| err(CallErrorKind::Trap(t)))
}

async fn instantiate(
    pre: &PluginPre,
    name: Arc<str>,
    limits: &SandboxLimits,
    policy: Arc<HttpPolicy>,
    state: StateSpace,
    log: Arc<LogBudget>,
) -> wasmtime::Result<Live> {
    let mut store = Store::new(
        pre.engine(),
        StoreState::new(name, limits, policy, state, log),
    );
    store.limiter(|s| &mut s.limiter);
    // What one import call may pass to the host (strings, lists) is bounded
    // by the same budget as what the host holds for the instance.
    store.set_hostcall_fuel(usize::try_from(limits.host_memory_bytes).unwrap_or(usize::MAX));
    // Installed once per store; each call only moves `deadline`. The
    // callback yields to the executor every tick (so a busy guest never
    // starves other tasks) and traps once the deadline has passed.
    store.epoch_deadline_callback(|ctx| {
        if Instant::now() >= ctx.data().deadline {
            Err(wasmtime::Error::new(DeadlineExceeded))
        } else {
            Ok(wasmtime::UpdateDeadline::Yield(1))
        }
    });
    // Instantiation runs guest start code, so it gets a deadline too.
    arm(&mut store, limits.call_deadline);
    let plugin = pre.instantiate_async(&mut store).await?;
    Ok(Live { store, plugin })
}

/// Sets the deadline of the next call.
fn arm(store: &mut Store<StoreState>, budget: Duration) {
    store.data_mut().deadline = Instant::now() + budget;
    store.set_epoch_deadline(1);
}

/// How long past its budget a call may run before the host timeout fires.
/// The host timeout covers time a guest spends waiting on the host (HTTP,
/// sleeps), which epoch interruption cannot see; the grace lets the epoch trap
/// win for CPU-bound guests, so the trap kind is precise.
const DEADLINE_GRACE: Duration = Duration::from_millis(50);

/// Runs one guest call on `live` within `budget`. A trap or an expired
/// deadline comes back as the `Trap`; the caller must then discard `live`.
async fn guarded<T>(
    live: &mut Live,
    budget: Duration,
    call: impl AsyncFnOnce(&mut Live) -> wasmtime::Result<T>,
) -> Result<T, Trap> {
    arm(&mut live.store, budget);
    match tokio::time::timeout(budget + DEADLINE_GRACE, call(&mut *live)).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(classify(e, budget, Some(&live.store))),
        Err(_elapsed) => Err(Trap::Deadline(budget)),
    }
}

fn classify(e: wasmtime::Error, budget: Duration, store: Option<&Store<StoreState>>) -> Trap {
    if e.downcast_ref::<DeadlineExceeded>().is_some() {
        Trap::Deadline(budget)
    } else if let Some(m) = e.downcast_ref::<MemoryCapExceeded>() {
        Trap::OutOfMemory(m.cap)
    } else {
        match e.downcast_ref::<wasmtime::Trap>() {
            Some(wasmtime::Trap::Interrupt) => Trap::Deadline(budget),
            Some(wasmtime::Trap::UnreachableCodeReached) => {
                let last = store.map(|s| s.data().stderr_tail()).unwrap_or_default();
                Trap::Panic(if last.is_empty() {
                    "unreachable executed".into()
                } else {
                    last
                })
            }
            Some(t) => Trap::Crash(t.to_string()),
            // Backtraces carry the module's own function names: the
            // driver's text, escaped like the rest of it.
            None => Trap::Crash(berth_core::text::printable(&format!("{e:#}")).into_owned()),
        }
    }
}

/// One driver instance owned by its holder: calls run on the holder's task,
/// one at a time. A trap discards the underlying instance; the next call
/// starts a fresh one. `Sandbox` keeps a bounded set of these; an embedder
/// that wants one of its own can hold it directly ([`Sandbox::instance`]).
pub struct DriverInstance {
    shared: Arc<Shared>,
    live: Option<Live>,
    /// Keeps the epoch ticker going for an instance an embedder holds
    /// (`None` in a provider's own set: the provider holds it).
    _guests: Option<Arc<Guests>>,
}

impl DriverInstance {
    async fn dispatch<E: Export>(&mut self, export: E) -> Result<E::Output, CallErrorKind> {
        let call = E::CALL;
        let span = tracing::info_span!("driver_call", provider = %self.shared.name, call = %call);
        let started = Instant::now();
        let result = self.run(export).instrument(span.clone()).await;
        let micros = started.elapsed().as_micros() as u64;
        let outcome = result.as_ref().err().map_or("ok", CallErrorKind::outcome);
        // A driver's error value is an expected outcome (not-found on a
        // repeated delete, a quota); traps and failed starts are not.
        span.in_scope(|| match &result {
            Ok(_) => tracing::debug!(duration_us = micros, outcome, "driver call"),
            Err(e @ CallErrorKind::Driver(_)) => tracing::debug!(duration_us = micros, outcome, error = %e, "driver call returned an error"),
            Err(e) => tracing::warn!(duration_us = micros, outcome, error = %e, "driver call failed"),
        });
        if let Ok(mut s) = self.shared.stats.lock() {
            let entry = s.calls.entry((call, outcome)).or_default();
            entry.0 += 1;
            entry.1 += micros;
            if let Some(t) = result.as_ref().err().and_then(|e| e.trap()) {
                *s.traps.entry(t.name()).or_default() += 1;
            }
        }
        result
    }

    async fn call<E: Export>(&mut self, export: E) -> Result<E::Output, CallError> {
        self.dispatch(export).await.map_err(|kind| CallError {
            provider: self.shared.name.clone(),
            call: E::CALL,
            kind,
        })
    }

    async fn run<E: Export>(&mut self, export: E) -> Result<E::Output, CallErrorKind> {
        let shared = &*self.shared;
        let live = match self.live.take() {
            Some(live) => live,
            // A failed start of `warm` is the call's own failure; of any
            // other call, a failed start before it.
            None => start(shared).await.map_err(|k| {
                if E::CALL == Call::Configure {
                    k
                } else {
                    CallErrorKind::Start(Box::new(k))
                }
            })?,
        };
        let live = self.live.insert(live);
        match guarded(
            live,
            shared.limits.call_deadline,
            async |live: &mut Live| export.run(live).await,
        )
        .await
        {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(driver_error)) => Err(CallErrorKind::Driver(driver_error)),
            Err(trap) => {
                self.live = None;
                Err(CallErrorKind::Trap(trap))
            }
        }
    }

    contract_calls!(mut);
}

impl Sandbox {
    contract_calls!();
}

/// Most pages [`Sandbox::list`] follows before it gives up on a driver
/// whose list never ends.
pub const MAX_PAGES: usize = 1000;

/// The contract's calls, the same on a provider's bounded set of instances
/// ([`Sandbox`], by `&self`) and on an instance its holder owns
/// ([`DriverInstance`], by `&mut self`).
macro_rules! contract_calls {
    ($($mut:ident)?) => {
        /// Makes sure a driver instance is started and configured, so a bad
        /// config surfaces now rather than on the first real call.
        pub async fn warm(& $($mut)? self) -> Result<(), CallError> {
            self.call(Warm).await
        }

        /// Creates an instance.
        pub async fn create(& $($mut)? self, spec: CreateSpec) -> Result<Instance, CallError> {
            self.call(Create(spec)).await
        }

        /// Creates each of `specs`: one answer each, in order, if the
        /// driver keeps the contract (the caller checks the number). A
        /// driver without the `create-many` capability is asked once per
        /// spec.
        pub async fn create_many(
            & $($mut)? self,
            specs: Vec<CreateSpec>,
        ) -> Result<Vec<Result<Instance, DriverError>>, CallError> {
            self.call(CreateMany(specs)).await
        }

        /// The instances among `ids` that exist and carry the pool's tag.
        pub async fn get(& $($mut)? self, ids: Vec<String>) -> Result<Vec<Instance>, CallError> {
            let pool_id = self.shared.pool_id.clone();
            self.call(Get { pool_id, ids }).await
        }

        /// One page of the instances carrying every tag of `filter`,
        /// starting at `cursor` (`None`: the first).
        pub async fn list_page(
            & $($mut)? self,
            filter: Tags,
            cursor: Option<String>,
        ) -> Result<Page, CallError> {
            self.call(List { filter, cursor }).await
        }

        /// Every instance carrying every tag of `filter`: each page in
        /// turn, at most [`MAX_PAGES`].
        pub async fn list(& $($mut)? self, filter: Tags) -> Result<Vec<Instance>, CallError> {
            let mut all = Vec::new();
            let mut cursor = None;
            for _ in 0..MAX_PAGES {
                let page = self.list_page(filter.clone(), cursor.take()).await?;
                all.extend(page.instances);
                match page.next {
                    None => return Ok(all),
                    next => cursor = next,
                }
            }
            Err(CallError {
                provider: self.shared.name.clone(),
                call: Call::List,
                kind: CallErrorKind::Driver(DriverError::Permanent(format!(
                    "the list did not end after {MAX_PAGES} pages"
                ))),
            })
        }

        /// Replaces the instance's berth tags.
        pub async fn set_tags(& $($mut)? self, instance_id: &str, tags: Tags) -> Result<(), CallError> {
            self.call(SetTags(instance_id.to_owned(), tags)).await
        }

        /// The account's limits, if the driver declares that capability.
        pub async fn limits(& $($mut)? self) -> Result<AccountLimits, CallError> {
            self.call(Limits).await
        }

        /// Deletes an instance; `not-found` from the driver is `AlreadyGone`.
        pub async fn delete(& $($mut)? self, instance_id: &str) -> Result<Deletion, CallError> {
            deletion(self.call(Delete(instance_id.to_owned())).await)
        }

        /// Deletes each of `instance_ids`: one answer each, in order, if
        /// the driver keeps the contract (the caller checks the number),
        /// `not-found` as `AlreadyGone`. A driver without the `delete-many`
        /// capability is asked once per id.
        pub async fn delete_many(
            & $($mut)? self,
            instance_ids: Vec<String>,
        ) -> Result<Vec<Result<Deletion, DriverError>>, CallError> {
            let answers = self.call(DeleteMany(instance_ids)).await?;
            Ok(answers
                .into_iter()
                .map(|a| match a {
                    Ok(()) => Ok(Deletion::Deleted),
                    Err(DriverError::NotFound(_)) => Ok(Deletion::AlreadyGone),
                    Err(e) => Err(e),
                })
                .collect())
        }
    };
}
use contract_calls;

fn deletion(result: Result<(), CallError>) -> Result<Deletion, CallError> {
    match result {
        Ok(()) => Ok(Deletion::Deleted),
        Err(CallError {
            kind: CallErrorKind::Driver(DriverError::NotFound(_)),
            ..
        }) => Ok(Deletion::AlreadyGone),
        Err(e) => Err(e),
    }
}

/// Instantiates and configures a fresh driver instance.
async fn start(shared: &Shared) -> Result<Live, CallErrorKind> {
    let budget = shared.limits.call_deadline;
    let mut live = instantiate(
        &shared.pre,
        shared.name.clone(),
        &shared.limits,
        shared.policy.clone(),
        shared.state.clone(),
        shared.log.clone(),
    )
    .await
    .map_err(|e| CallErrorKind::Trap(classify(e, budget, None)))?;
    if let Ok(mut s) = shared.stats.lock() {
        s.instances_started += 1;
    }
    let configured = guarded(&mut live, budget, async |live: &mut Live| {
        (live.plugin)
            .configure(&mut live.store, &shared.pool_id, &shared.driver_config)
            .await
    })
    .await;
    match configured {
        Err(trap) => Err(CallErrorKind::Trap(trap)),
        Ok(Err(e)) => Err(CallErrorKind::Driver(e)),
        Ok(Ok(())) => Ok(live),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The outcome and trap words are metric labels and stats keys that
    /// dashboards and alerts match on; they come from variant names, so a
    /// rename must fail here first.
    #[test]
    fn outcome_and_trap_words_are_pinned() {
        let s = String::new;
        let outcomes = [
            DriverError::RateLimited {
                retry_after: Duration::ZERO,
                message: s(),
            },
            DriverError::QuotaExceeded(s()),
            DriverError::Capacity {
                scope: berth_core::driver::CapacityScope::General,
                message: s(),
            },
            DriverError::NotFound(s()),
            DriverError::Unauthorized(s()),
            DriverError::InvalidConfig(s()),
            DriverError::Transient(s()),
            DriverError::Permanent(s()),
        ]
        .map(|e| CallErrorKind::Driver(e).outcome());
        assert_eq!(
            outcomes,
            [
                "rate-limited",
                "quota-exceeded",
                "capacity",
                "not-found",
                "unauthorized",
                "invalid-config",
                "transient",
                "permanent"
            ]
        );
        let traps = [
            Trap::Deadline(Duration::ZERO),
            Trap::OutOfMemory(0),
            Trap::Panic(s()),
            Trap::Crash(s()),
        ]
        .map(|t| t.name());
        assert_eq!(traps, ["deadline", "out-of-memory", "panic", "crash"]);
    }
}
