//! The thin async runtime around the pool core: one task owns the [`Pool`]
//! and the store, takes client commands (a bounded queue) and driver
//! outcomes, and after each batch writes the core's changes to the store
//! *before* it starts the driver calls the core asked for (intent before
//! act). Driver calls run on their own tasks and report back as outcomes.
//!
//! Clients talk to it through a cloneable [`Handle`].
//!
//! On a store shared by several processes (PostgreSQL) the task decides only
//! while this process holds the pool's lease: it claims it at start, renews
//! it with every commit (and on a timer when idle), and opens the drivers'
//! [`Gate`] only for as long as the lease is certain. When another process
//! holds the pool, this one stands by: commands are refused with
//! [`ServiceError::Standby`] (the API forwards them to the holder, and puts
//! a new request the holder does not take in time into the store's inbox
//! for it: [`Handle::send_to_inbox`]), and once
//! the lease is free the task takes the pool over and reloads it from the
//! store, as after a restart: list first, then act.

mod commands;
pub mod probe;
mod providers;
pub mod shards;
#[cfg(test)]
mod tests;
pub(crate) mod wire;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use berth_config::{Config, ProviderIx, Settings};
use berth_core::driver::check::{self, BadAnswer};
use berth_core::driver::{Instance, POOL_TAG, Tags};
use berth_core::pool::{
    Changes, Conflict, Effect, Failure, Idle, NewRequest, NodeId, Notice, Pool, Refusal, Refused,
    Request, RequestId, RequestState, TakenIn, Time,
};
use berth_plugin::{CallError, CallErrorKind, DriverState, Gate, Runtime, RuntimeConfig};
use berth_store::{Claimant, InboxEntry, PgInbox, PgStore, SqliteStore, Store, StoreError, Tenure};

pub use commands::{Caller, Change, Done};
pub use providers::{BoxFuture, Cloud, Health, LoadedDriver, Providers};
pub use shards::Shards;

/// Wall-clock time as the core sees it, advanced by tokio's clock so that
/// tests with paused time control it.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    base: Time,
    start: tokio::time::Instant,
}

impl Clock {
    /// A clock reading the system's wall-clock time now.
    pub fn system() -> Clock {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Clock::starting_at(Time(ms))
    }

    /// A clock reading `base` now.
    pub fn starting_at(base: Time) -> Clock {
        Clock {
            base,
            start: tokio::time::Instant::now(),
        }
    }

    pub fn now(&self) -> Time {
        self.base + self.start.elapsed()
    }

    fn instant(&self, t: Time) -> tokio::time::Instant {
        self.start + t.since(self.base)
    }
}

/// Why the pool could not do what a client asked.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Refused(#[from] Refused),
    #[error(transparent)]
    Conflict(#[from] Conflict),
    /// The caller may not do this (to this node or request).
    #[error("{0}")]
    Forbidden(String),
    /// The command queue is full: the pool is behind; try again shortly.
    #[error("the pool has {0} commands queued; try again shortly")]
    Busy(usize),
    #[error("the pool has stopped")]
    Stopped,
    /// The store could not be written, so the pool stopped deciding: what
    /// was asked is not done.
    #[error("the store could not be written ({0}); nothing was changed")]
    StoreFailed(Arc<str>),
    /// The store is out of reach (its server stopped, the network broke):
    /// the pool decides nothing until it is back; try again shortly.
    #[error("the store is out of reach ({0}); nothing was changed; try again shortly")]
    StoreUnavailable(Arc<str>),
    /// Another berth process holds the pool; this one stands by.
    #[error("{}", standby_text(.holder, .address))]
    Standby { holder: Arc<str>, address: Arc<str> },
}

fn standby_text(holder: &str, address: &str) -> String {
    if holder.is_empty() {
        return "this berth process does not hold the pool and does not know yet who does; \
                try again shortly"
            .into();
    }
    format!(
        "this berth process stands by: the pool is held by {holder} ({address}); nothing was \
         changed here"
    )
}

/// Why a pool's task ended with an error.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The store could not be written. The pool stopped at once: acting on
    /// the cloud, or telling a client, without a stored intent is how
    /// machines leak and nodes get handed out twice.
    #[error("the store could not be written")]
    Store(#[source] StoreError),
    /// The pool's task panicked.
    #[error("the pool's task panicked: {0}")]
    Panicked(String),
}

/// A driver call, as reported to an [`Observer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
pub enum CallKind {
    Create,
    List,
    Delete,
    SetTags,
}

impl CallKind {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// How a driver call ended, in a word: `ok` or
/// [`CallErrorKind::outcome`]'s.
pub fn outcome_name(result: Result<(), &CallError>) -> &'static str {
    result.err().map_or("ok", |e| e.kind.outcome())
}

/// Hears what the running pool does, for metrics and health. Called on the
/// pool's task or a driver call's task: it must be quick and must not block.
pub trait Observer: Send + Sync {
    /// A driver call ended after `took`.
    fn call(
        &self,
        _provider: &str,
        _call: CallKind,
        _result: Result<(), &CallError>,
        _took: Duration,
    ) {
    }
    /// Something worth an operator's attention happened.
    fn notice(&self, _config: &Config, _notice: &Notice) {}
    /// A request was handed its nodes `latency` after it was made.
    fn fulfilled(&self, _request: &Request, _latency: Duration) {}
    /// The store took `took` to commit one batch of changes.
    fn committed(&self, _took: Duration) {}
    /// One heartbeat of the providers' leases (a PostgreSQL store) took
    /// `took`, whether or not it reached the database.
    fn heartbeat(&self, _took: Duration) {}
    /// The pool's holder took `count` requests in from the store's inbox.
    fn taken_in(&self, _count: usize) {}
    /// Instances a driver answered that failed berth's checks (see
    /// [`berth_core::driver::check`]); the pool never saw them.
    fn refused(&self, _provider: &str, _refused: &[BadAnswer]) {}
    /// A readiness probe of one of `provider`'s instances ended after `took`.
    fn probed(
        &self,
        _provider: &str,
        _check: berth_config::Check,
        _result: Result<(), &str>,
        _took: Duration,
    ) {
    }
}

/// An observer that hears nothing.
struct Deaf;
impl Observer for Deaf {}

/// What clients send the pool's task, through a bounded queue.
enum Command {
    /// A change and its caller, checked and made in one step; answered
    /// once the change is stored.
    Act(Caller, Change, Answer),
    /// Answer once the request is no longer pending.
    Wait(RequestId, oneshot::Sender<Option<Request>>),
    Inspect(Box<dyn FnOnce(&Pool) + Send>),
    /// Take in what waits in the store's inbox; answer once all of it is
    /// stored.
    TakeIn(Answer),
}

/// How a change is answered: with the pool as it stands once the change
/// is stored, or with why it was not made.
type Answer = Box<dyn FnOnce(Result<(&Pool, Done), ServiceError>) + Send>;

/// What a driver call brought back. As many as there are calls in flight,
/// which the core bounds.
enum Outcome {
    Created(NodeId, Result<Instance, Failure>),
    Deleted(ProviderIx, Option<NodeId>, String, Result<(), Failure>),
    Listed(ProviderIx, Time, Result<Vec<Instance>, Failure>),
    Tagged(NodeId, Result<(), Failure>),
    /// A readiness probe (not a driver call: not counted in flight).
    Probed(NodeId, Result<Vec<String>, String>),
}

/// Commands queued for the pool's task at most; one more is refused with
/// [`ServiceError::Busy`] instead of growing memory. The API's connection
/// cap keeps it well below this in `berth serve`.
pub const COMMAND_QUEUE: usize = 4096;

/// A client's way in to a running pool. Cheap to clone.
#[derive(Clone)]
pub struct Handle {
    tx: mpsc::Sender<Command>,
    config: Arc<Config>,
    providers: Arc<Providers>,
    /// Why the pool's task ended, if it ended by itself; a command sent
    /// after that is answered with it rather than a plain `Stopped`.
    ended: Arc<OnceLock<ServiceError>>,
    /// Set while the store is out of reach ([`ServiceError::StoreUnavailable`])
    /// or another process holds the pool ([`ServiceError::Standby`]).
    down: Down,
    /// The pool's lease while this process holds one.
    lease: SharedLease,
    shards: Option<Arc<Shards>>,
    /// The store's requests inbox, with a store shared by several
    /// processes: where this process puts the requests it accepts while
    /// it stands by.
    inbox: Option<Arc<PgInbox>>,
    clock: Clock,
}

/// The lease as the pool's task last saw it confirmed; a plain copy, so
/// that keeping it current costs a step no allocation.
type SharedLease = Arc<std::sync::Mutex<Option<berth_store::Holding>>>;

/// Why the pool decides nothing for now, while it does not.
type Down = Arc<tokio::sync::watch::Sender<Option<ServiceError>>>;

impl Handle {
    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    /// The drivers loaded so far.
    pub fn drivers(&self) -> Vec<LoadedDriver> {
        self.providers.drivers()
    }

    /// The providers' leases, with a store shared by several processes.
    pub fn shards(&self) -> Option<&Arc<Shards>> {
        self.shards.as_ref()
    }

    /// The providers: how each one's start went, its driver's stats.
    pub fn providers(&self) -> &Arc<Providers> {
        &self.providers
    }

    /// Makes `change` for `caller`, if the caller may, in one step of the
    /// pool; once the change is stored, `then` reads the pool for the
    /// answer (on the pool's task: keep it short).
    pub async fn act<R: Send + 'static>(
        &self,
        caller: Caller,
        change: Change,
        then: impl FnOnce(&Pool, Done) -> R + Send + 'static,
    ) -> Result<R, ServiceError> {
        let (tx, rx) = oneshot::channel();
        let answer: Answer = Box::new(move |result| {
            let _ = tx.send(result.map(|(pool, done)| then(pool, done)));
        });
        self.send(Command::Act(caller, change, answer))?;
        rx.await.map_err(|_| self.gone())?
    }

    /// [`Handle::act`] as the embedding program, answered with what the
    /// change did.
    async fn embedder(&self, change: Change) -> Result<Done, ServiceError> {
        self.act(Caller::embedder(), change, |_, done| done).await
    }

    fn send(&self, command: Command) -> Result<(), ServiceError> {
        self.tx.try_send(command).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => ServiceError::Busy(COMMAND_QUEUE),
            mpsc::error::TrySendError::Closed(_) => self.gone(),
        })
    }

    /// Renews `requestor`'s lease for `ttl` (see [`Pool::renew`]); returns
    /// when it now expires.
    pub async fn renew(&self, requestor: String, ttl: Duration) -> Result<Time, ServiceError> {
        match self.embedder(Change::Renew { requestor, ttl }).await? {
            Done::Renewed(t) => Ok(t),
            other => unreachable!("a renewal answered {other:?}"),
        }
    }

    /// Why a command could not reach the pool.
    fn gone(&self) -> ServiceError {
        if let Some(down) = self.down.borrow().clone() {
            return down;
        }
        self.ended.get().cloned().unwrap_or(ServiceError::Stopped)
    }

    /// Why the pool's task ended by itself (its store could not be
    /// written), if it did.
    pub fn failure(&self) -> Option<ServiceError> {
        self.ended.get().cloned()
    }

    /// Why the pool decides nothing here for now (its store is out of
    /// reach, another process holds it), while it does not.
    pub fn down(&self) -> Option<ServiceError> {
        self.down.borrow().clone()
    }

    /// Who holds the pool and where, while another process does.
    pub fn standby(&self) -> Option<(Arc<str>, Arc<str>)> {
        match self.down.borrow().as_ref()? {
            ServiceError::Standby { holder, address } => Some((holder.clone(), address.clone())),
            _ => None,
        }
    }

    /// Returns once this process no longer stands by for `holder`: the pool
    /// changed hands, this process took it over, or the task ended.
    pub async fn no_longer_held_by(&self, holder: &str) {
        let mut down = self.down.subscribe();
        let _ = down
            .wait_for(
                |d| !matches!(d, Some(ServiceError::Standby { holder: h, .. }) if **h == *holder),
            )
            .await;
    }

    /// How long ago the lease this process holds stopped being certain,
    /// while a renewal is overdue (its database does not answer): the
    /// drivers' gate is then shut. `None` while the lease is certain, or
    /// none is held.
    pub fn lease_uncertain(&self) -> Option<Duration> {
        let held = (*self.lease.lock().ok()?)?;
        std::time::Instant::now().checked_duration_since(held.valid_until)
    }

    /// Whether the pool is shared by several processes (a PostgreSQL
    /// store): a request accepted while another process holds the pool
    /// goes through the store's inbox.
    pub fn shared(&self) -> bool {
        self.inbox.is_some()
    }

    /// Whether `new`, asked by `caller`, may be and could ever be served:
    /// what the pool's holder checks, checked here first by a process
    /// standing by.
    pub fn check(&self, caller: &Caller, new: &NewRequest) -> Result<(), ServiceError> {
        commands::may_submit(caller, new)?;
        Ok(berth_core::pool::check(&self.config, new)?)
    }

    /// Accepts a request under `id` while this process stands by (checked
    /// first with [`Handle::check`]): puts it into the store's inbox and
    /// announces it, for the pool's holder to take in (at once, or once a
    /// process takes the pool over). Durable once this returns. An id
    /// already taken is taken by this very request (relayed to the holder
    /// first, and stored by it: [`Pool::submit_under`]; two random draws of
    /// 64 bits meet too rarely to be the reason). Answers the request as it
    /// now stands: pending. Its requestor's lease is renewed when it is
    /// taken in.
    pub async fn send_to_inbox(
        &self,
        id: RequestId,
        new: NewRequest,
    ) -> Result<Request, ServiceError> {
        let Some(inbox) = &self.inbox else {
            return Err(self.gone());
        };
        let created = self.clock.now();
        let entry = InboxEntry {
            id,
            requestor: new.requestor.clone(),
            priority: new.priority,
            created,
            wants: (new.wants.iter())
                .map(|(l, n)| (self.config[*l].name.clone(), *n))
                .collect(),
        };
        let added = inbox.send(&entry).await.map_err(|e| {
            ServiceError::StoreUnavailable(format!("the request was not accepted: {e}").into())
        })?;
        if !added {
            tracing::debug!(request = %id, "the request was stored before it reached the inbox");
        }
        Ok(Request {
            id,
            requestor: new.requestor,
            priority: new.priority,
            created,
            wants: new.wants,
            state: RequestState::Pending,
            nodes: Vec::new(),
            failures: 0,
        })
    }

    /// Has the pool's holder take in what waits in the store's inbox, and
    /// returns once that is stored: a request accepted by a process
    /// standing by is then known here. Nothing to do for a store of one
    /// process's own.
    pub async fn take_in(&self) -> Result<(), ServiceError> {
        if !self.shared() {
            return Ok(());
        }
        let (tx, rx) = oneshot::channel();
        let answer: Answer = Box::new(move |result| {
            let _ = tx.send(result.map(drop));
        });
        self.send(Command::TakeIn(answer))?;
        rx.await.map_err(|_| self.gone())?
    }

    /// Takes a request; see [`Handle::wait`] for its outcome.
    pub async fn submit(&self, new: NewRequest) -> Result<RequestId, ServiceError> {
        self.submit_with(new, None).await
    }

    /// Takes a request and renews its requestor's lease for `ttl` in the
    /// same step (one commit); a refused request renews nothing.
    pub async fn submit_renewing(
        &self,
        new: NewRequest,
        ttl: Duration,
    ) -> Result<RequestId, ServiceError> {
        self.submit_with(new, Some(ttl)).await
    }

    async fn submit_with(
        &self,
        new: NewRequest,
        lease: Option<Duration>,
    ) -> Result<RequestId, ServiceError> {
        match self
            .embedder(Change::Submit {
                new,
                lease,
                id: None,
            })
            .await?
        {
            Done::Submitted(id) => Ok(id),
            other => unreachable!("a request answered {other:?}"),
        }
    }

    pub async fn cancel(&self, id: RequestId) -> Result<(), ServiceError> {
        self.embedder(Change::Cancel(id)).await.map(drop)
    }

    pub async fn release(&self, id: NodeId) -> Result<(), ServiceError> {
        self.embedder(Change::Release(id)).await.map(drop)
    }

    pub async fn set_idle(&self, id: NodeId, idle: Idle) -> Result<(), ServiceError> {
        self.embedder(Change::SetIdle(id, idle)).await.map(drop)
    }

    pub async fn delete(&self, id: NodeId) -> Result<(), ServiceError> {
        self.embedder(Change::Delete(id)).await.map(drop)
    }

    /// Waits until a request is fulfilled, failed or cancelled; `None` if
    /// there is no such request.
    pub async fn wait(&self, id: RequestId) -> Result<Option<Request>, ServiceError> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Wait(id, tx))?;
        rx.await.map_err(|_| self.gone())
    }

    /// Reads the pool's state on its own task.
    pub async fn inspect<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Pool) -> R + Send + 'static,
    ) -> Result<R, ServiceError> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Inspect(Box::new(move |pool| {
            let _ = tx.send(f(pool));
        })))?;
        rx.await.map_err(|_| self.gone())
    }
}

/// A running pool: its handle and its task.
pub struct Service {
    pub handle: Handle,
    task: JoinHandle<Result<(), PoolError>>,
    beating: Option<shards::Beating>,
    /// The task's outcome, once [`Service::ended`] has seen it.
    outcome: Option<Result<(), PoolError>>,
    shutdown: Option<oneshot::Sender<Duration>>,
}

/// The parts a pool's task runs with besides the pool itself.
pub struct Parts {
    /// Every configured provider, in the config's order.
    pub providers: Arc<Providers>,
    pub store: Box<dyn Store>,
    pub clock: Clock,
    pub observer: Arc<dyn Observer>,
    /// Shut while this process may not act on clouds; always open for a
    /// store of its own.
    pub gate: Arc<Gate>,
    /// Who holds the pool at start, if another process does: the task
    /// stands by until it can take the pool over.
    pub standby: Option<Tenure>,
    /// The providers' leases (a shared store): where each provider's calls
    /// are carried out.
    pub shards: Option<Arc<Shards>>,
    /// Their heartbeats, stopped after the pool's task.
    pub beating: Option<shards::Beating>,
    /// The store's requests inbox (a shared store).
    pub inbox: Option<Arc<PgInbox>>,
}

impl Service {
    /// Starts the pool's task on `pool` with its providers, store and clock.
    pub fn spawn(pool: Pool, parts: Parts) -> Service {
        let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
        let (outcomes_tx, outcomes) = mpsc::unbounded_channel();
        let (stop_tx, stop_rx) = oneshot::channel();
        let config = pool.config().clone();
        let ended = Arc::new(OnceLock::new());
        let down = Arc::new(tokio::sync::watch::Sender::new(None));
        let lease = Arc::default();
        let run = Loop {
            ended: ended.clone(),
            down: down.clone(),
            lease: Arc::clone(&lease),
            gate: parts.gate,
            standby: parts.standby,
            pool,
            providers: parts.providers.clone(),
            shards: parts.shards.clone(),
            store: parts.store,
            clock: parts.clock,
            observer: parts.observer,
            outcomes: outcomes_tx,
            waiters: HashMap::new(),
            effects: Vec::new(),
            replies: Vec::new(),
            in_flight: 0,
            // Whatever waits in a shared store's inbox is taken in at the
            // first step as holder.
            inbox_due: parts.inbox.is_some(),
            taking_in: Vec::new(),
        };
        let task = tokio::spawn(run.run(rx, outcomes, stop_rx));
        Service {
            handle: Handle {
                tx,
                config,
                providers: parts.providers,
                ended,
                down,
                lease,
                shards: parts.shards,
                inbox: parts.inbox,
                clock: parts.clock,
            },
            task,
            beating: parts.beating,
            outcome: None,
            shutdown: Some(stop_tx),
        }
    }

    /// Completes if the pool's task ends by itself, which it only does when
    /// it fails (its store cannot be written, or it panicked). Cancel-safe:
    /// [`Service::stop_within`] still reports the outcome afterwards.
    pub async fn ended(&mut self) {
        if self.outcome.is_none() {
            let joined = (&mut self.task).await;
            self.outcome = Some(joined.unwrap_or_else(|e| Err(panicked(e))));
        }
    }

    /// Stops the pool: client commands are refused from now on, driver
    /// calls in flight are waited for (up to `grace`) and their outcomes
    /// stored, and no new call is started. Returns the task's outcome. A
    /// call still running after `grace` is abandoned; its intent is stored,
    /// so the next start resolves it.
    pub async fn stop_within(mut self, grace: Duration) -> Result<(), PoolError> {
        let outcome = match self.outcome.take() {
            Some(outcome) => outcome,
            None => {
                if let Some(s) = self.shutdown.take() {
                    let _ = s.send(grace);
                }
                (&mut self.task).await.unwrap_or_else(|e| Err(panicked(e)))
            }
        };
        // Calls this process carries out for another holder of the pool
        // end (within the grace) before its providers are given up.
        if let Some(beating) = self.beating.take() {
            beating.leave(grace).await;
        }
        outcome
    }

    /// [`Service::stop_within`] with [`DEFAULT_STOP_GRACE`].
    pub async fn stop(self) -> Result<(), PoolError> {
        self.stop_within(DEFAULT_STOP_GRACE).await
    }
}

fn panicked(e: tokio::task::JoinError) -> PoolError {
    match e.try_into_panic() {
        Ok(payload) => PoolError::Panicked(berth_core::text::panic_message(&*payload)),
        Err(e) => PoolError::Panicked(e.to_string()),
    }
}

/// How long a stop waits for driver calls in flight by default.
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(30);

/// Options for [`start`] beyond the config file.
#[derive(Clone, Default)]
pub struct StartOptions {
    /// Seed for node and request ids; random when `None`.
    pub seed: Option<u64>,
    /// Hears driver calls, notices and fulfilments (metrics); none if `None`.
    pub observer: Option<Arc<dyn Observer>>,
    /// Addresses no driver may reach whatever its allow-list says: the
    /// API's own.
    pub deny: Vec<SocketAddr>,
    /// The url at which the other processes sharing the pool reach this
    /// one's API (a PostgreSQL store).
    pub advertise: Option<String>,
    /// Where compiled drivers are cached; `None` uses
    /// [`berth_plugin::default_cache_dir`], else `cache` in the state
    /// directory.
    pub cache_dir: Option<std::path::PathBuf>,
    /// Adopt the pool's instances that the store cannot vouch for, as
    /// their tags say, until every provider has been listed once
    /// ([`Pool::adopt_instances`]).
    pub adopt_instances: bool,
}

/// Loads the configured drivers, opens the store in the state directory,
/// restores the pool from it, and starts it.
pub async fn start(settings: Settings, options: StartOptions) -> anyhow::Result<Service> {
    let state_dir = &settings.state_dir;
    std::fs::create_dir_all(state_dir)
        .with_context(|| format!("creating the state directory {}", state_dir.display()))?;
    let config = Arc::new(settings.pool.clone());
    // The store first: opening it checks that the state directory can be
    // written (a read-only or full one is a clear error now, not a failed
    // commit later), before any driver starts loading.
    // The drivers' records: beside the pool's SQLite store, or in the same
    // PostgreSQL database, shared with every process on the pool.
    let mut records = None;
    // The providers' leases, in the same database.
    let mut shared_out = None;
    // The requests inbox, in the same database.
    let mut inbox = None;
    let mut store: Box<dyn Store> = match &settings.store.postgres {
        None => {
            let path = state_dir.join("berth.db");
            let store = SqliteStore::open(&path, config.clone(), settings.store.sync)
                .with_context(|| format!("opening the store {}", path.display()))?;
            Box::new(store)
        }
        Some(pg) => {
            let address = options.advertise.clone().unwrap_or_default();
            let claimant = Claimant {
                holder: format!(
                    "{address} pid {} #{:04x}",
                    std::process::id(),
                    rand::random::<u16>()
                ),
                address,
                ttl: pg.lease_ttl,
            };
            let store = PgStore::open(pg, config.clone(), Some(claimant))
                .await
                .with_context(|| format!("opening the PostgreSQL store {}", pg.url))?;
            records = Some(DriverState::on(Arc::new(store.records())));
            inbox = store.request_inbox().map(Arc::new);
            shared_out = store.shards(config.providers.iter().map(|p| p.name.clone()).collect());
            Box::new(store)
        }
    };
    let tenure = store.claim().await.context("claiming the pool's lease")?;
    let (gate, standby) = match tenure {
        Tenure::Alone => (Gate::always(), None),
        Tenure::Held(held) => {
            let gate = Gate::shut();
            gate.open_until(held.valid_until);
            tracing::info!(epoch = held.epoch, "this process holds the pool");
            (gate, None)
        }
        other => (Gate::shut(), Some(other)),
    };
    let gate = Arc::new(gate);
    let observer = options.observer.unwrap_or_else(|| Arc::new(Deaf));
    let (shards, beating) = match shared_out {
        Some(pg) => {
            let deadlines = (settings.drivers.iter())
                .map(|d| d.sandbox.call_deadline)
                .collect();
            let (shards, beating) = Shards::start(pg, deadlines, observer.clone())
                .await
                .context("taking part in the providers' leases")?;
            (Some(shards), Some(beating))
        }
        None => (None, None),
    };
    // Each provider's driver sends while this process may act on it: while
    // it holds the provider's lease (and the pool's holder is certain), or
    // for a store of its own, always.
    let gates: Vec<Arc<Gate>> = match &shards {
        Some(shards) => (0..config.providers.len())
            .map(|i| shards.gate(i))
            .collect(),
        None => vec![gate.clone(); config.providers.len()],
    };
    let loaded = match standby {
        None => store.load(&config).await.context("loading the store")?,
        // Loaded when the pool is taken over, as it then stands.
        Some(_) => berth_store::Loaded::default(),
    };
    let runtime = Runtime::new(RuntimeConfig {
        cache_dir: Some(
            options
                .cache_dir
                .clone()
                .or_else(berth_plugin::default_cache_dir)
                .unwrap_or_else(|| state_dir.join("cache")),
        ),
        ..Default::default()
    })?;
    let driver_state = match records {
        Some(records) => records,
        None => {
            let path = state_dir.join("driver-state.sqlite");
            DriverState::on(Arc::new(
                berth_store::SqliteRecords::open(&path)
                    .with_context(|| format!("opening the driver records {}", path.display()))?,
            ))
        }
    };
    // In the background: a driver that fails to start costs its own
    // provider, not the service.
    let providers = Providers::start(runtime, &settings, driver_state, options.deny, gates);
    for note in &loaded.dropped {
        tracing::warn!("store: {note}");
    }
    let clock = Clock::system();
    let seed = options.seed.unwrap_or_else(rand::random);
    let mut pool = Pool::restore(config.clone(), seed, loaded.snapshot, clock.now());
    if options.adopt_instances {
        tracing::warn!(
            "adopting on purpose: instances with this pool's tags that the store cannot vouch for are taken as their tags say (those tagged as handed out, on hold) and signed anew, until every provider has been listed once"
        );
        pool.adopt_instances();
    }
    tracing::info!(
        providers = config.providers.len(),
        labels = config.labels.len(),
        nodes = pool.nodes().count(),
        "pool started"
    );
    let parts = Parts {
        providers,
        store,
        clock,
        observer,
        gate,
        standby,
        shards,
        beating,
        inbox,
    };
    Ok(Service::spawn(pool, parts))
}

struct Loop {
    /// Shared with every [`Handle`]: why the task ended, if by itself.
    ended: Arc<OnceLock<ServiceError>>,
    /// Shared with every [`Handle`]: set while the store is out of reach
    /// or another process holds the pool.
    down: Down,
    /// Shared with every [`Handle`]: the lease while this process holds it.
    lease: SharedLease,
    /// Open while the lease is certain (always, for a store of its own).
    gate: Arc<Gate>,
    /// Who held the pool at start, until the task has stood by once.
    standby: Option<Tenure>,
    pool: Pool,
    providers: Arc<Providers>,
    /// Where each provider's calls go (a shared store).
    shards: Option<Arc<Shards>>,
    store: Box<dyn Store>,
    clock: Clock,
    observer: Arc<dyn Observer>,
    /// Where driver calls report back.
    outcomes: mpsc::UnboundedSender<Outcome>,
    waiters: HashMap<RequestId, Vec<oneshot::Sender<Option<Request>>>>,
    effects: Vec<Effect>,
    /// Changes made this step and how each went, answered once the step's
    /// changes are stored.
    replies: Vec<(Answer, Result<Done, ServiceError>)>,
    /// Driver calls started whose outcome has not come back.
    in_flight: usize,
    /// The store's inbox is to be read at the next step: requests were
    /// announced, asked for, or may wait there since this process took
    /// the pool.
    inbox_due: bool,
    /// [`Command::TakeIn`]s, answered once a read finds the inbox drained.
    taking_in: Vec<Answer>,
}

/// How often a process standing by asks whether the pool's lease is free,
/// at most: a holder that stops cleanly frees it at once.
const STANDBY_POLL: Duration = Duration::from_millis(250);

/// The first wait before connecting to a lost store again; it doubles up
/// to [`RECONNECT_MAX`].
const RECONNECT_FIRST: Duration = Duration::from_millis(250);
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// Commands and outcomes taken in one batch before the store is written:
/// enough to amortise a commit under load, few enough to keep latency low.
const BATCH: usize = 256;

/// Where the pool's task takes its work from.
struct Inbox {
    commands: mpsc::Receiver<Command>,
    outcomes: mpsc::UnboundedReceiver<Outcome>,
}

impl Inbox {
    /// Refuses every command queued now or sent from now on with `why`.
    fn close(&mut self, why: &ServiceError) {
        self.commands.close();
        while let Ok(command) = self.commands.try_recv() {
            refuse(command, why);
        }
    }
}

impl Loop {
    async fn run(
        mut self,
        commands: mpsc::Receiver<Command>,
        outcomes: mpsc::UnboundedReceiver<Outcome>,
        stop: oneshot::Receiver<Duration>,
    ) -> Result<(), PoolError> {
        let mut inbox = Inbox { commands, outcomes };
        let mut stop = stop;
        if let Some(Tenure::Other {
            holder, address, ..
        }) = self.standby.take()
        {
            let why = ServiceError::Standby {
                holder: holder.into(),
                address: address.into(),
            };
            match self.suspend(&mut inbox, &mut stop, why, false).await {
                Ok(true) => {}
                Ok(false) => {
                    inbox.close(&ServiceError::Stopped);
                    return Ok(());
                }
                Err(e) => return Err(self.fail(&mut inbox, e)),
            }
        }
        let outcome = loop {
            let suspended = match self.serve(&mut inbox, &mut stop).await {
                Ok(grace) => break self.drain(&mut inbox, grace).await,
                Err(e) if e.is_lost() => {
                    tracing::error!(
                        error = %e,
                        "the store is out of reach: deciding nothing and calling no cloud until it is back"
                    );
                    let why = ServiceError::StoreUnavailable(e.to_string().into());
                    self.suspend(&mut inbox, &mut stop, why, true).await
                }
                Err(e) if e.is_conflict() => {
                    tracing::warn!(
                        error = %e,
                        "a commit was refused: something else wrote the store's rows under this process; the pool is reloaded from the store and decides again"
                    );
                    let why = ServiceError::StoreUnavailable(
                        format!("the pool is being reloaded: {e}").into(),
                    );
                    self.suspend(&mut inbox, &mut stop, why, false).await
                }
                Err(e) if e.is_fenced() => {
                    tracing::warn!(
                        error = %e,
                        "another berth process took the pool over: this one stands by, deciding nothing and calling no cloud"
                    );
                    let why = ServiceError::Standby {
                        holder: "".into(),
                        address: "".into(),
                    };
                    self.suspend(&mut inbox, &mut stop, why, false).await
                }
                Err(e) => break Err(e),
            };
            match suspended {
                Ok(true) => {}
                Ok(false) => {
                    // Stopped while suspended: nothing was in flight that
                    // the next start (or the holder) does not resolve.
                    inbox.close(&ServiceError::Stopped);
                    return Ok(());
                }
                Err(e) => break Err(e),
            }
        };
        match outcome {
            Ok(()) => Ok(()),
            Err(e) => Err(self.fail(&mut inbox, e)),
        }
    }

    /// The pool's life until it is told to stop; returns the stop's grace.
    async fn serve(
        &mut self,
        inbox: &mut Inbox,
        stop: &mut oneshot::Receiver<Duration>,
    ) -> Result<Duration, StoreError> {
        // The first step is owed at once (the first lists, prewarming): a
        // pool nobody talks to must not wait for an event to start.
        self.step().await?;
        // A store file removed or replaced under the process is noticed
        // within this, even while nothing is committed.
        let mut watch = self.store.watch_every().map(tokio::time::interval);
        let grace = loop {
            let wake = self.pool.next_wakeup().map(|t| self.clock.instant(t));
            let renew = self.renewal_due();
            tokio::select! {
                biased;
                g = &mut *stop => break g.unwrap_or(Duration::ZERO),
                _ = tick(&mut watch) => {
                    self.store.check().await?;
                    continue;
                }
                Some(o) = inbox.outcomes.recv() => self.outcome(o),
                c = inbox.commands.recv() => match c {
                    Some(c) => self.command(c),
                    None => break Duration::ZERO,
                },
                _ = sleep_until(wake) => {}
                _ = sleep_until(renew) => {}
                () = requests_sent(&self.shards) => self.inbox_due = true,
                // More than one step's worth waited in the inbox.
                () = std::future::ready(()), if self.inbox_due => {}
            }
            for _ in 1..BATCH {
                if let Ok(o) = inbox.outcomes.try_recv() {
                    self.outcome(o);
                } else if let Ok(c) = inbox.commands.try_recv() {
                    self.command(c);
                } else {
                    break;
                }
            }
            self.step().await?;
        };
        Ok(grace)
    }

    /// The store could not be written: nothing more is decided, acted on or
    /// answered as done. Commands waiting for their commit, queued, or sent
    /// from now on are answered with the failure; calls in flight are left
    /// (their intents are stored, so the next start resolves them).
    fn fail(&mut self, inbox: &mut Inbox, e: StoreError) -> PoolError {
        tracing::error!(
            error = %e,
            "the store could not be written; the pool stopped deciding, so that nothing is done or answered without a stored record"
        );
        let failed = ServiceError::StoreFailed(e.to_string().into());
        let _ = self.ended.set(failed.clone());
        for answer in self
            .replies
            .drain(..)
            .map(|(a, _)| a)
            .chain(self.taking_in.drain(..))
        {
            answer(Err(failed.clone()));
        }
        inbox.close(&failed);
        self.waiters.clear();
        PoolError::Store(e)
    }

    /// The pool is not this process's to decide on for now: the store is
    /// out of reach (`lost`), another process holds the pool, or a commit
    /// found the stored rows changed under it. Nothing is decided,
    /// sent to a cloud or answered as done until that ends. What changed in
    /// memory since the last commit is given up (its effects were never
    /// started, its commands are answered with `why`), and once the store
    /// answers again and this process holds the pool, the pool is reloaded
    /// from the store, as after a restart. Calls in flight are forgotten:
    /// their outcomes go to a channel nobody reads, and their stored intents
    /// are resolved by the first lists. Returns false if told to stop
    /// meanwhile; an error other than the store being out of reach or taken
    /// ends the pool as [`Loop::fail`] says.
    async fn suspend(
        &mut self,
        inbox: &mut Inbox,
        stop: &mut oneshot::Receiver<Duration>,
        mut why: ServiceError,
        mut lost: bool,
    ) -> Result<bool, StoreError> {
        self.gate.shut_now();
        self.show_lease();
        self.set_down(Some(why.clone()));
        for answer in self
            .replies
            .drain(..)
            .map(|(a, _)| a)
            .chain(self.taking_in.drain(..))
        {
            answer(Err(why.clone()));
        }
        self.effects.clear();
        self.waiters.clear();
        let (outcomes, fresh) = mpsc::unbounded_channel();
        self.outcomes = outcomes;
        inbox.outcomes = fresh;
        self.in_flight = 0;

        let was_lost = lost;
        let refused = !lost && matches!(why, ServiceError::StoreUnavailable(_));
        let mut backoff = RECONNECT_FIRST;
        let mut wait = if lost { backoff } else { Duration::ZERO };
        loop {
            let retry = tokio::time::Instant::now() + wait;
            loop {
                tokio::select! {
                    biased;
                    _ = &mut *stop => return Ok(false),
                    Some(c) = inbox.commands.recv() => refuse(c, &why),
                    _ = tokio::time::sleep_until(retry) => break,
                    // A holder that stopped cleanly announced it: now.
                    () = pool_given_up(&self.shards) => {
                        tracing::info!("the pool's lease was given up: asking for it now");
                        break;
                    }
                }
            }
            if lost {
                backoff = (backoff * 2).min(RECONNECT_MAX);
                wait = backoff;
                match self.store.reconnect().await {
                    Ok(()) => lost = false,
                    Err(e) if e.is_lost() => {
                        tracing::debug!(error = %e, "the store is still out of reach");
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
            let tenure = match self.store.claim().await {
                Ok(t) => t,
                Err(e) if e.is_lost() => {
                    lost = true;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if let Tenure::Other {
                holder,
                address,
                expires_in,
            } = tenure
            {
                if !matches!(&why, ServiceError::Standby { holder: h, .. } if **h == *holder) {
                    tracing::info!(%holder, %address, "standing by: another berth process holds the pool");
                }
                // This process holds no lease now: nothing of it is
                // uncertain, and `/readyz` says it stands by.
                self.show_lease();
                why = ServiceError::Standby {
                    holder: holder.into(),
                    address: address.into(),
                };
                self.set_down(Some(why.clone()));
                // Tried again once the lease could have expired, at least
                // every STANDBY_POLL, and at once when a holder's clean
                // stop (which frees the lease) is announced.
                wait = (expires_in + Duration::from_millis(5)).min(STANDBY_POLL);
                continue;
            }
            let config = self.pool.config().clone();
            let loaded = match self.store.load(&config).await {
                Ok(l) => l,
                Err(e) if e.is_lost() => {
                    lost = true;
                    continue;
                }
                Err(e) => return Err(e),
            };
            for note in &loaded.dropped {
                tracing::warn!("store: {note}");
            }
            let now = self.clock.now();
            self.pool = Pool::restore(config, rand::random(), loaded.snapshot, now);
            self.inbox_due = self.store.holding().is_some();
            self.opened();
            self.set_down(None);
            let epoch = self.store.holding().map(|h| h.epoch);
            if was_lost {
                tracing::info!(
                    ?epoch,
                    nodes = self.pool.nodes().count(),
                    "the store is back; the pool is reloaded from it and lists before it acts"
                );
            } else if refused {
                tracing::info!(
                    ?epoch,
                    nodes = self.pool.nodes().count(),
                    "the pool is reloaded from the store after a refused commit and lists before it acts"
                );
            } else {
                tracing::info!(
                    ?epoch,
                    nodes = self.pool.nodes().count(),
                    "this process took the pool over; reloaded from the store, it lists every provider before it acts"
                );
            }
            return Ok(true);
        }
    }

    fn set_down(&self, why: Option<ServiceError>) {
        self.down.send_replace(why);
    }

    /// Opens the drivers' gate for as long as the lease is certain, after
    /// the store confirmed it, and shows the lease to the API.
    fn opened(&self) {
        if let Some(held) = self.store.holding() {
            self.gate.open_until(held.valid_until);
        }
        self.show_lease();
    }

    fn show_lease(&self) {
        if let Ok(mut lease) = self.lease.lock() {
            *lease = self.store.holding();
        }
    }

    /// When the lease is next renewed if nothing is committed before:
    /// halfway through the time it is certain for.
    fn renewal_due(&self) -> Option<tokio::time::Instant> {
        let held = self.store.holding()?;
        let due = held.renewed + held.valid_until.saturating_duration_since(held.renewed) / 2;
        Some(tokio::time::Instant::from_std(due))
    }

    /// Stopping: no new call starts and commands are refused, while the
    /// outcomes of calls in flight come in (up to `grace`) and are stored.
    async fn drain(&mut self, inbox: &mut Inbox, grace: Duration) -> Result<(), StoreError> {
        match self.drain_calls(inbox, grace).await {
            Ok(()) => {}
            Err(e) if e.is_fenced() => {
                // The pool is another process's now: what is left is its to
                // resolve, from the stored intents and its first lists.
                tracing::warn!(error = %e, "stopping: the pool was taken over meanwhile");
                inbox.close(&ServiceError::Stopped);
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        // Given up at once, so that a process standing by takes the pool
        // over now rather than when the lease would have expired.
        if self.store.holding().is_some() {
            self.gate.shut_now();
            match self.store.release().await {
                Ok(()) => tracing::info!("gave the pool's lease up for another process to take"),
                Err(e) => {
                    tracing::warn!(error = %e, "could not give the pool's lease up; another process takes the pool over once it expires")
                }
            }
        }
        Ok(())
    }

    async fn drain_calls(&mut self, inbox: &mut Inbox, grace: Duration) -> Result<(), StoreError> {
        let deadline = tokio::time::Instant::now() + grace;
        // Calls waiting for a provider to start are not worth the grace.
        self.providers.close();
        loop {
            self.commit_and_answer().await?;
            if self.in_flight == 0 {
                break;
            }
            tokio::select! {
                Some(o) = inbox.outcomes.recv() => self.outcome(o),
                Some(c) = inbox.commands.recv() => refuse(c, &ServiceError::Stopped),
                _ = tokio::time::sleep_until(deadline) => {
                    tracing::warn!(
                        calls = self.in_flight,
                        "driver calls still running at the end of the stop grace; the next start resolves them"
                    );
                    break;
                }
            }
        }
        // Whatever is still queued is refused, so no client waits for ever.
        inbox.close(&ServiceError::Stopped);
        self.waiters.clear();
        self.commit_and_answer().await
    }

    /// Stores what changed, then answers the commands that changed it.
    async fn commit_and_answer(&mut self) -> Result<(), StoreError> {
        let changes = self.pool.take_changes();
        self.commit(&changes).await?;
        self.answer();
        Ok(())
    }

    /// Answers the changes made since the last answer. Clients hear of
    /// what they asked only once it is stored: a request id a client holds
    /// survives a crash.
    fn answer(&mut self) {
        let pool = &self.pool;
        for (answer, result) in self.replies.drain(..) {
            answer(result.map(|done| (pool, done)));
        }
    }

    /// Writes `changes`, if any. A store that cannot be written stops the
    /// pool (see [`Loop::fail`]): acting on the cloud without a stored
    /// intent is how machines leak.
    async fn commit(&mut self, changes: &Changes) -> Result<(), StoreError> {
        if changes.is_empty() {
            return Ok(());
        }
        let started = std::time::Instant::now();
        // The commit blocks this worker thread, briefly (see
        // docs/BENCHMARKS.md: nearly all take under 0.5 ms). Handing the
        // worker's queue to another thread with `block_in_place` first cost
        // more than it saved: lone requests and one-client loops were slower
        // and the commits themselves took longer.
        self.store.commit(changes).await?;
        self.observer.committed(started.elapsed());
        Ok(())
    }

    fn outcome(&mut self, outcome: Outcome) {
        let now = self.clock.now();
        let pool = &mut self.pool;
        if let Outcome::Probed(id, r) = outcome {
            pool.probed(id, r, now);
            return;
        }
        self.in_flight -= 1;
        match outcome {
            Outcome::Probed(..) => unreachable!("taken above"),
            Outcome::Created(id, r) => pool.created(now, id, r),
            Outcome::Deleted(p, node, instance, r) => pool.deleted(now, p, node, &instance, r),
            Outcome::Listed(p, started, r) => pool.listed(now, p, started, r),
            Outcome::Tagged(id, r) => pool.tagged(now, id, r),
        }
    }

    fn command(&mut self, command: Command) {
        let now = self.clock.now();
        let pool = &mut self.pool;
        match command {
            Command::Act(caller, change, answer) => {
                let result = commands::apply(pool, now, &caller, change);
                self.replies.push((answer, result));
            }
            Command::Wait(id, reply) => match pool.request(id) {
                None => {
                    let _ = reply.send(None);
                }
                Some(r) if r.state != RequestState::Pending => {
                    let _ = reply.send(Some(r.clone()));
                }
                Some(_) => self.waiters.entry(id).or_default().push(reply),
            },
            Command::Inspect(f) => f(pool),
            Command::TakeIn(answer) => {
                self.inbox_due = true;
                self.taking_in.push(answer);
            }
        }
    }

    /// Reads the store's inbox if it is due and takes in what waits there
    /// ([`Pool::take_in`]): the step's commit stores the requests and
    /// claims their entries in one transaction.
    async fn take_in(&mut self) -> Result<(), StoreError> {
        if !std::mem::take(&mut self.inbox_due) {
            return Ok(());
        }
        let entries = self.store.inbox(BATCH).await?;
        if entries.len() == BATCH {
            // More wait: the next step reads on.
            self.inbox_due = true;
        } else {
            for answer in self.taking_in.drain(..) {
                self.replies.push((answer, Ok(Done::Changed)));
            }
        }
        let now = self.clock.now();
        let config = self.pool.config().clone();
        let mut taken = 0;
        for entry in entries {
            let id = entry.id;
            let requestor = entry.requestor.clone();
            let created = entry.created;
            match self
                .pool
                .take_in(now, id, created, inbox_request(&config, entry))
            {
                TakenIn::Pending => {
                    self.pool.renew(now, &requestor, config.lease_ttl);
                    taken += 1;
                }
                // Said by the pool's notice (a failed request).
                TakenIn::Failed(_) => taken += 1,
                // Offered to this process and answered too late, so also
                // put into the inbox: the one request, taken already.
                TakenIn::Known => tracing::debug!(
                    request = %id,
                    "a request in the inbox was taken already, as offered; only its inbox entry is removed"
                ),
            }
        }
        if taken > 0 {
            self.observer.taken_in(taken);
        }
        Ok(())
    }

    /// Decide, store, then act.
    async fn step(&mut self) -> Result<(), StoreError> {
        self.take_in().await?;
        let now = self.clock.now();
        self.pool.tick(now, &mut self.effects);
        let changes = self.pool.take_changes();
        for r in &changes.requests {
            if let RequestState::Fulfilled { at } = r.state
                && at == now
            {
                self.observer.fulfilled(r, at.since(r.created));
            }
        }
        let renewal_due = self
            .renewal_due()
            .is_some_and(|at| at <= tokio::time::Instant::now());
        if changes.is_empty() && (!self.effects.is_empty() || renewal_due) {
            // Nothing to store, but calls to make: only while the store is
            // within reach (and the pool still this process's), so that a
            // lost store or lease stops every call at once. The same check
            // renews the lease when it is due.
            self.store.check().await?;
        }
        self.commit(&changes).await?;
        self.opened();
        self.answer();
        // Leak deletes and refused adoptions can come by the thousand (a
        // driver that lists thousands of orphans): one line per provider and
        // kind per step, with a count.
        let mut summed: HashMap<(ProviderIx, &'static str), (usize, String)> = HashMap::new();
        for notice in self.pool.take_notices() {
            self.observer.notice(self.pool.config(), &notice);
            match notice {
                Notice::LeakDeleted { provider, instance } => {
                    let e = summed.entry((provider, "leak")).or_insert((0, instance));
                    e.0 += 1;
                }
                Notice::NotAdopted { provider, instance } => {
                    let e = summed.entry((provider, "over")).or_insert((0, instance));
                    e.0 += 1;
                }
                notice => self.log(notice),
            }
        }
        for ((provider, kind), (count, first)) in summed {
            let provider = self.pool.config()[provider].name.as_str();
            match kind {
                "leak" => tracing::warn!(
                    provider,
                    count,
                    first = %first,
                    "deleted leaked instances (owned by this pool, no node accounts for them)"
                ),
                _ => tracing::warn!(
                    provider,
                    count,
                    first = %first,
                    "instances with this pool's tags not adopted: the provider's limits are full; each is deleted as a leak after leak-grace if it is still there"
                ),
            }
        }
        if !self.waiters.is_empty() {
            let pool = &self.pool;
            self.waiters.retain(|id, waiters| match pool.request(*id) {
                Some(r) if r.state == RequestState::Pending => true,
                r => {
                    for w in waiters.drain(..) {
                        let _ = w.send(r.cloned());
                    }
                    false
                }
            });
        }
        for effect in self.effects.drain(..) {
            if let Effect::Probe { .. } = effect {
                probe(
                    effect,
                    &self.providers,
                    self.outcomes.clone(),
                    self.observer.clone(),
                );
                continue;
            }
            self.in_flight += 1;
            let route = (self.shards.clone()).zip(self.store.holding().map(|h| h.epoch));
            call(
                effect,
                &self.providers,
                route,
                &self.pool.config().pool_id,
                self.clock,
                self.outcomes.clone(),
                self.observer.clone(),
            );
        }
        Ok(())
    }

    fn log(&self, notice: Notice) {
        let config = self.pool.config();
        let pname = |p: ProviderIx| config[p].name.as_str();
        match notice {
            Notice::Foreign { provider, count } => tracing::info!(
                provider = pname(provider),
                count,
                "instances without this pool's id are listed; berth leaves them alone"
            ),
            Notice::LeakDeleted { .. } | Notice::NotAdopted { .. } => {}
            Notice::Adopted { node, instance } => {
                tracing::info!(%node, %instance, "adopted an instance from its tags")
            }
            Notice::Vanished { node } => {
                tracing::warn!(%node, "the node's instance is gone (confirmed missing, or listed as terminated); the node is given up")
            }
            Notice::Missing { node, instance } => tracing::warn!(
                %node,
                %instance,
                "a list did not show the node's instance: suspected missing, not gone; nothing changes unless later lists confirm it"
            ),
            Notice::Reappeared { node } => {
                tracing::info!(%node, "the node's instance is listed again; no longer suspected")
            }
            Notice::LostInUse { node } => tracing::warn!(
                %node,
                "the node's instance is gone while the node is in use: it stays with its holder and is deleted once released"
            ),
            Notice::Revived { node, instance } => tracing::warn!(
                %node,
                %instance,
                "an instance given up as vanished is listed again: its node is back"
            ),
            Notice::ListFailing {
                provider,
                failures,
                error,
            } => tracing::warn!(
                provider = pname(provider),
                failures,
                %error,
                "listing the provider fails; nothing is decided on its answers until one works (said again at most once a minute)"
            ),
            Notice::ListSuspect { provider, known } => tracing::warn!(
                provider = pname(provider),
                known,
                "the provider's list shows none of the instances berth holds there; it is not believed (said again at most once a minute)"
            ),
            Notice::ListRecovered { provider, since } => tracing::info!(
                provider = pname(provider),
                since_ms = since.as_millis(),
                "the provider's lists are believed again"
            ),
            Notice::RequestFailed { request, reason } => {
                tracing::warn!(%request, %reason, "request failed")
            }
            Notice::QuotaPaused { provider, until } => tracing::warn!(
                provider = pname(provider),
                until = %berth_core::duration::rfc3339(until.as_millis()),
                "quota exceeded; creates paused"
            ),
            Notice::RateLimited { provider, until } => tracing::warn!(
                provider = pname(provider),
                until = %berth_core::duration::rfc3339(until.as_millis()),
                "rate limited; every call held"
            ),
            Notice::CapacityPaused {
                provider,
                instance_type,
                until,
            } => tracing::warn!(
                provider = pname(provider),
                instance_type = instance_type.as_deref().unwrap_or("all"),
                until = %berth_core::duration::rfc3339(until.as_millis()),
                "no capacity; instance type paused"
            ),
            Notice::LeaseExpired {
                requestor,
                failed,
                reclaimed,
            } => tracing::warn!(
                %requestor,
                failed,
                reclaimed,
                "a requestor stopped renewing its lease; its pending requests failed and its nodes were taken back"
            ),
            Notice::Quarantined {
                provider,
                count,
                named,
            } => {
                let named: Vec<String> = named
                    .iter()
                    .map(|(id, q)| match &q.node {
                        Some(node) => format!("{id} (node {node}): {}", q.why),
                        None => format!("{id}: {}", q.why),
                    })
                    .collect();
                tracing::error!(
                    provider = pname(provider),
                    count,
                    instances = %named.join("; "),
                    "instances with this pool's tags are in quarantine: berth neither hands them out nor deletes them; look at them (GET /v1/providers), then delete them in the cloud or adopt them on purpose (docs/tags.md)"
                )
            }
            Notice::StoreMismatch { provider, why } => tracing::error!(
                provider = pname(provider),
                %why,
                "this store is not the one the provider's instances of the pool were made by, as far as it can tell: nothing is created on the provider, and none of them is handed out or deleted. Put back the store that made them and restart, delete them in the cloud, or adopt them on purpose by starting once with `berth serve --adopt-instances` (docs/tags.md)"
            ),
            Notice::StoreMismatchEnded { provider } => tracing::info!(
                provider = pname(provider),
                "the provider's lists no longer show instances this store cannot vouch for: creates there go on"
            ),
            Notice::HeldByTags {
                node,
                instance,
                why,
            } => tracing::error!(
                %node,
                %instance,
                %why,
                "the store does not have this node in use, but its instance's tags say it is handed out: the node is put on hold (never handed out nor deleted); `berth run` hands it out again, `berth delete` deletes it"
            ),
        }
    }
}

/// An inbox entry as the pool takes it in: its labels named in this pool's
/// config, or refused with why.
fn inbox_request(config: &Config, entry: InboxEntry) -> Result<NewRequest, Refusal> {
    let mut wants = Vec::with_capacity(entry.wants.len());
    for (name, count) in &entry.wants {
        let Some(label) = config.label(name) else {
            return Err(Refusal {
                requestor: entry.requestor,
                priority: entry.priority,
                reason: format!(
                    "no label `{}` in this process's config",
                    berth_core::text::printable(name)
                ),
            });
        };
        wants.push((label, *count));
    }
    Ok(NewRequest {
        requestor: entry.requestor,
        priority: entry.priority,
        wants,
    })
}

/// Completes when the database announces requests put into the inbox;
/// never without a shared store.
async fn requests_sent(shards: &Option<Arc<Shards>>) {
    match shards {
        Some(shards) => shards.requests_sent().await,
        None => std::future::pending().await,
    }
}

/// Completes when the database announces that the pool's lease was given
/// up; never without a shared store.
async fn pool_given_up(shards: &Option<Arc<Shards>>) {
    match shards {
        Some(shards) => shards.pool_given_up().await,
        None => std::future::pending().await,
    }
}

/// The next tick of `interval`, or never.
async fn tick(interval: &mut Option<tokio::time::Interval>) {
    match interval {
        Some(i) => {
            i.tick().await;
        }
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn failure(e: CallError) -> Failure {
    match e.kind {
        CallErrorKind::Driver(d) => Failure::Driver(d),
        CallErrorKind::PeerLost(_) => Failure::Unknown(e.to_string()),
        _ => Failure::Host(e.to_string()),
    }
}

/// Why [`call`] never sees a probe.
const NOT_A_CALL: &str = "a readiness probe is not a driver call: `probe` makes it";

/// Makes one readiness probe on its own task; the outcome comes back as an
/// event. Not a driver call: the stop does not wait for it, and a pool that
/// stood by meanwhile never hears it.
fn probe(
    effect: Effect,
    providers: &Arc<Providers>,
    outcomes: mpsc::UnboundedSender<Outcome>,
    observer: Arc<dyn Observer>,
) {
    let Effect::Probe {
        provider,
        node,
        instance,
        target,
    } = effect
    else {
        return;
    };
    let providers = providers.clone();
    tokio::spawn(async move {
        let started = tokio::time::Instant::now();
        let r = providers.prober().probe(provider, &target).await;
        let name = providers.name(provider);
        let check = target.check;
        observer.probed(
            name,
            check,
            r.as_ref().map(|_| ()).map_err(String::as_str),
            started.elapsed(),
        );
        if let Err(why) = &r {
            tracing::debug!(provider = name, %node, %instance, check = check.as_str(), error = %why, "not ready yet");
        }
        let _ = outcomes.send(Outcome::Probed(node, r));
    });
}

/// Carries out one driver call on its own task; the outcome comes back as
/// an event.
fn call(
    effect: Effect,
    providers: &Arc<Providers>,
    route: Option<(Arc<Shards>, i64)>,
    pool_id: &str,
    clock: Clock,
    outcomes: mpsc::UnboundedSender<Outcome>,
    observer: Arc<dyn Observer>,
) {
    let p = match &effect {
        Effect::Create { provider, .. }
        | Effect::Delete { provider, .. }
        | Effect::List { provider }
        | Effect::SetTags { provider, .. } => *provider,
        Effect::Probe { .. } => unreachable!("{NOT_A_CALL}"),
    };
    let providers = providers.clone();
    let name: Arc<str> = providers_name(&providers, p);
    let pool_id = pool_id.to_owned();
    tokio::spawn(async move {
        let started = tokio::time::Instant::now();
        let heard = |kind: CallKind, r: Result<(), &CallError>| {
            observer.call(&name, kind, r, started.elapsed());
        };
        // A provider still starting is waited for; one whose start failed
        // fails the call at once, and the core treats it as any failed call.
        // With the providers shared out, the call goes to the provider's
        // holder (this process or another).
        let provider = match route {
            Some((shards, epoch)) => Ok(shards.cloud(p, providers.clone(), epoch)),
            None => providers.get(p).await,
        };
        let provider = match provider {
            Ok(provider) => provider,
            Err(why) => {
                let (kind, call) = match &effect {
                    Effect::Create { .. } => (CallKind::Create, berth_core::driver::Call::Create),
                    Effect::Delete { .. } => (CallKind::Delete, berth_core::driver::Call::Delete),
                    Effect::List { .. } => (CallKind::List, berth_core::driver::Call::List),
                    Effect::SetTags { .. } => {
                        (CallKind::SetTags, berth_core::driver::Call::SetTags)
                    }
                    Effect::Probe { .. } => unreachable!("{NOT_A_CALL}"),
                };
                let e = CallError {
                    provider: name.clone(),
                    call,
                    kind: CallErrorKind::NotStarted(why),
                };
                heard(kind, Err(&e));
                let failed = failure(e);
                let outcome = match effect {
                    Effect::Create { node, .. } => Outcome::Created(node, Err(failed)),
                    Effect::Delete { node, instance, .. } => {
                        Outcome::Deleted(p, node, instance, Err(failed))
                    }
                    Effect::List { .. } => Outcome::Listed(p, clock.now(), Err(failed)),
                    Effect::SetTags { node, .. } => Outcome::Tagged(node, Err(failed)),
                    Effect::Probe { .. } => unreachable!("{NOT_A_CALL}"),
                };
                let _ = outcomes.send(outcome);
                return;
            }
        };
        // What the driver answers is checked before the pool sees it.
        let refused = |r: &[BadAnswer]| {
            if !r.is_empty() {
                tracing::warn!(
                    provider = %name,
                    count = r.len(),
                    first = %r[0],
                    "refused what the driver answered: the pool acts as if it had not been said"
                );
                observer.refused(&name, r);
            }
        };
        let outcome = match effect {
            Effect::Create { node, spec, .. } => {
                let r = provider.create(spec).await;
                heard(CallKind::Create, r.as_ref().map(|_| ()));
                let r = r
                    .map_err(failure)
                    .and_then(|inst| match check::instance(&inst) {
                        Ok(()) => Ok(inst),
                        Err(bad) => {
                            refused(std::slice::from_ref(&bad));
                            Err(Failure::Host(format!("the driver answered {bad}")))
                        }
                    });
                Outcome::Created(node, r)
            }
            Effect::Delete { node, instance, .. } => {
                let r = provider.delete(&instance).await;
                heard(CallKind::Delete, r.as_ref().map(|_| ()));
                Outcome::Deleted(p, node, instance, r.map(|_| ()).map_err(failure))
            }
            Effect::List { .. } => {
                let listed_from = clock.now();
                let filter: Tags = [(POOL_TAG.to_owned(), pool_id)].into();
                let r = provider.list(filter).await;
                heard(CallKind::List, r.as_ref().map(|_| ()));
                let r = r.map_err(failure).map(|all| {
                    let (kept, bad) = check::listing(all);
                    refused(&bad);
                    kept
                });
                Outcome::Listed(p, listed_from, r)
            }
            Effect::SetTags {
                node,
                instance,
                tags,
                ..
            } => {
                let r = provider.set_tags(&instance, tags).await;
                heard(CallKind::SetTags, r.as_ref().map(|_| ()));
                Outcome::Tagged(node, r.map_err(failure))
            }
            Effect::Probe { .. } => unreachable!("{NOT_A_CALL}"),
        };
        // The pool may have stopped; its stored intents cover the outcome.
        let _ = outcomes.send(outcome);
    });
}

fn providers_name(providers: &Providers, p: ProviderIx) -> Arc<str> {
    providers.name(p).into()
}

/// Answers a command the pool no longer takes with `why`.
fn refuse(command: Command, why: &ServiceError) {
    match command {
        Command::Act(_, _, answer) | Command::TakeIn(answer) => answer(Err(why.clone())),
        Command::Wait(_, reply) => drop(reply),
        Command::Inspect(_) => {}
    }
}
