//! The clients' way in: [`Handle`], the commands it queues for the pool's
//! task, and how each is answered once its change is stored.

// Time here is tokio's clock, which tests on paused time move.
#![deny(clippy::disallowed_methods)]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use berth_config::Config;
use berth_core::pool::{
    Idle, NewRequest, NodeId, Pool, Refused, Request, RequestId, RequestState, Time,
};
use berth_store::{InboxEntry, PgInbox};

use super::change::{self, Caller, Change};
use super::clock::Clock;
use super::events::Events;
use super::mode::{Mode, ServiceError};
use super::providers::{LoadedDriver, Providers};
use super::shards::Shards;

/// What clients send the pool's task, through a bounded queue.
pub(super) enum Command {
    /// A change and its caller, checked and made in one step; answered
    /// once the change is stored.
    Act(Box<dyn Act>),
    /// Answer once the request is no longer pending.
    Wait(RequestId, oneshot::Sender<Option<Request>>),
    Inspect(Box<dyn FnOnce(&Pool) + Send>),
    /// Take in what waits in the store's inbox; answer once all of it is
    /// stored.
    TakeIn(Reply),
    /// Decide with a new config from the next step ([`Pool::reconfigure`]);
    /// answer with why not, if it is refused.
    Reconfigure(Arc<Config>, oneshot::Sender<Result<(), ServiceError>>),
}

/// A change, its caller and the way to answer them, as the queue carries
/// it (the change's type is known only to [`Handle::act`]).
pub(super) trait Act: Send {
    /// Checks and makes the change; returns how to answer once the step's
    /// changes are stored.
    fn apply(self: Box<Self>, pool: &mut Pool, now: Time) -> Reply;
    /// Answers with `why`, making nothing.
    fn refuse(self: Box<Self>, why: ServiceError);
}

/// How a step's change is answered: with the pool as it stands once the
/// step is stored, or with why it was not.
pub(super) type Reply = Box<dyn FnOnce(Result<&Pool, ServiceError>) + Send>;

/// A change of type `C` asked through [`Handle::act`].
pub(super) struct Acting<C: Change, F, R> {
    pub(super) caller: Caller,
    pub(super) change: C,
    pub(super) then: F,
    pub(super) tx: oneshot::Sender<Result<R, ServiceError>>,
}

impl<C, F, R> Act for Acting<C, F, R>
where
    C: Change,
    F: FnOnce(&Pool, C::Output) -> R + Send + 'static,
    R: Send + 'static,
{
    fn apply(self: Box<Self>, pool: &mut Pool, now: Time) -> Reply {
        let Acting {
            caller,
            change,
            then,
            tx,
        } = *self;
        let made = change.apply(pool, now, &caller);
        Box::new(move |stored| {
            let _ = tx.send(stored.and_then(|pool| made.map(|out| then(pool, out))));
        })
    }

    fn refuse(self: Box<Self>, why: ServiceError) {
        let _ = self.tx.send(Err(why));
    }
}

/// Commands queued for the pool's task at most; one more is refused with
/// [`ServiceError::Busy`] instead of growing memory. The API's connection
/// cap keeps it well below this in `berth serve`.
pub const COMMAND_QUEUE: usize = 4096;

/// A client's way in to a running pool. Cheap to clone.
#[derive(Clone)]
pub struct Handle {
    pub(super) tx: mpsc::Sender<Command>,
    /// The config the pool decides with: swapped by [`Handle::reconfigure`]
    /// once the pool took a new one.
    pub(super) config: Arc<std::sync::RwLock<Arc<Config>>>,
    pub(super) providers: Arc<Providers>,
    /// Why the pool's task ended, if it ended by itself; a command sent
    /// after that is answered with it rather than a plain `Stopped`.
    pub(super) ended: Arc<OnceLock<ServiceError>>,
    /// Whether the pool decides now, as its task last said.
    pub(super) mode: Modes,
    /// The pool's lease while this process holds one.
    pub(super) lease: SharedLease,
    /// With a store shared by several processes: the providers' leases,
    /// and the store's requests inbox, where this process puts the
    /// requests it accepts while it stands by.
    pub(super) shared: Option<(Arc<Shards>, Arc<PgInbox>)>,
    /// What the pool's task stored, as events.
    pub(super) events: Arc<Events>,
    pub(super) clock: Clock,
}

/// The lease as the pool's task last saw it confirmed; a plain copy, so
/// that keeping it current costs a step no allocation.
pub(super) type SharedLease = Arc<std::sync::Mutex<Option<berth_store::Holding>>>;

/// The pool task's [`Mode`], as it last said.
pub(super) type Modes = Arc<tokio::sync::watch::Sender<Mode>>;

impl Handle {
    /// The config the pool decides with now.
    pub fn config(&self) -> Arc<Config> {
        // A poisoned lock still holds a whole config: it is only swapped.
        let config = self.config.read().unwrap_or_else(|e| e.into_inner());
        config.clone()
    }

    /// Makes the pool decide with `config` from its next step: a reload
    /// of the config file, arranged with `berth_config::align`. Refused,
    /// changing nothing, if the pool cannot take it
    /// ([`Pool::reconfigure`]), or if the pool has stopped. Standing by, the
    /// config is taken for when this process takes the pool over. With a
    /// store shared by several processes, each must be given the same
    /// config: `berth serve` reloads the pool's holder only once every
    /// other process runs it.
    pub async fn reconfigure(&self, config: Arc<Config>) -> Result<(), ServiceError> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Reconfigure(config.clone(), tx))?;
        rx.await.map_err(|_| self.gone())??;
        // After the pool: a request naming a new label reaches a pool that
        // knows it.
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = config;
        Ok(())
    }

    /// The drivers loaded so far.
    pub fn drivers(&self) -> Vec<LoadedDriver> {
        self.providers.drivers()
    }

    /// What the pool's task stores, as events (`GET /v1/events`).
    pub fn events(&self) -> &Arc<Events> {
        &self.events
    }

    /// The providers' leases, with a store shared by several processes.
    pub fn shards(&self) -> Option<&Arc<Shards>> {
        self.shared.as_ref().map(|(shards, _)| shards)
    }

    /// The providers: how each one's start went, its driver's stats.
    pub fn providers(&self) -> &Arc<Providers> {
        &self.providers
    }

    /// Makes `change` for `caller`, if the caller may, in one step of the
    /// pool; once the change is stored, `then` reads the pool for the
    /// answer (on the pool's task: keep it short).
    pub async fn act<C: Change, R: Send + 'static>(
        &self,
        caller: Caller,
        change: C,
        then: impl FnOnce(&Pool, C::Output) -> R + Send + 'static,
    ) -> Result<R, ServiceError> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Act(Box::new(Acting {
            caller,
            change,
            then,
            tx,
        })))?;
        rx.await.map_err(|_| self.gone())?
    }

    /// [`Handle::act`] as the embedding program, answered with what the
    /// change answers.
    pub(super) async fn embedder<C: Change>(&self, change: C) -> Result<C::Output, ServiceError> {
        self.act(Caller::embedder(), change, |_, out| out).await
    }

    pub(super) fn send(&self, command: Command) -> Result<(), ServiceError> {
        self.tx.try_send(command).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => ServiceError::Busy(COMMAND_QUEUE),
            mpsc::error::TrySendError::Closed(_) => self.gone(),
        })
    }

    /// Renews `requestor`'s lease for `ttl` (see [`Pool::renew`]); returns
    /// when it now expires.
    pub async fn renew(&self, requestor: String, ttl: Duration) -> Result<Time, ServiceError> {
        self.embedder(change::Renew { requestor, ttl }).await
    }

    /// Why a command could not reach the pool.
    pub(super) fn gone(&self) -> ServiceError {
        if let Some(refusal) = self.mode.borrow().refusal() {
            return refusal;
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
        self.mode.borrow().refusal()
    }

    /// Whether the pool decides here now, and if not, why.
    pub fn mode(&self) -> Mode {
        self.mode.borrow().clone()
    }

    /// Returns once this process no longer stands by for `holder`: the pool
    /// changed hands, this process took it over, or the task ended.
    pub async fn no_longer_held_by(&self, holder: &str) {
        let mut mode = self.mode.subscribe();
        let _ = mode.wait_for(|m| !m.stands_by_for(holder)).await;
    }

    /// How long ago the lease this process holds stopped being certain,
    /// while a renewal is overdue (its database does not answer): the
    /// drivers' gate is then shut. `None` while the lease is certain, or
    /// none is held.
    pub fn lease_uncertain(&self) -> Option<Duration> {
        let held = (*self.lease.lock().ok()?)?;
        tokio::time::Instant::now().checked_duration_since(held.valid_until)
    }

    /// Whether the pool is shared by several processes (a PostgreSQL
    /// store): a request accepted while another process holds the pool
    /// goes through the store's inbox.
    pub fn shared(&self) -> bool {
        self.shared.is_some()
    }

    /// Whether `new`, asked by `caller`, may be and could ever be served:
    /// what the pool's holder checks, checked here first by a process
    /// standing by.
    pub fn may_take(&self, caller: &Caller, new: &NewRequest) -> Result<(), ServiceError> {
        change::may_submit(caller, new)?;
        Ok(berth_core::pool::servable(&self.config(), new)?)
    }

    /// Accepts a request under `id` while this process stands by (checked
    /// first with [`Handle::may_take`]): puts it into the store's inbox and
    /// announces it, for the pool's holder to take in (at once, or once a
    /// process takes the pool over). Durable once this returns. An id
    /// already taken is taken by this very request (relayed to the holder
    /// first, and stored by it: [`Pool::submit_under`]; two random draws of
    /// 64 bits meet too rarely to be the reason), or by the request that
    /// the same idempotency key made before, which must have been asked
    /// alike ([`Refused::KeyReused`]). Answers the request as this call
    /// knows it (pending), and whether it is new. Its requestor's lease is
    /// renewed when it is taken in.
    pub async fn send_to_inbox(
        &self,
        id: RequestId,
        new: NewRequest,
    ) -> Result<(Request, bool), ServiceError> {
        let Some((_, inbox)) = &self.shared else {
            return Err(self.gone());
        };
        let created = self.clock.now();
        let config = self.config();
        let entry = InboxEntry {
            id,
            requestor: new.requestor.clone(),
            priority: new.priority,
            created,
            wants: (new.wants.iter())
                .map(|(l, n)| (config[*l].name.clone(), *n))
                .collect(),
            key: new.key.clone(),
            metadata: new.metadata.clone(),
        };
        let unavailable =
            |e| ServiceError::StoreUnavailable(format!("the request was not accepted: {e}").into());
        let added = inbox.send(&entry).await.map_err(unavailable)?;
        if !added {
            tracing::debug!(request = %id, "the request was stored before it reached the inbox");
            // An idempotency key given again: the request it made must
            // have been asked as this one is.
            // Read as the holder takes an entry in: one this config cannot
            // read (another label) is not the same ask either.
            if let Some(key) = &new.key {
                let known = inbox.asked(id).await.map_err(unavailable)?;
                let same = |known| {
                    super::task::inbox_request(&config, known).is_ok_and(|k: NewRequest| {
                        k.asks_as(
                            &new.requestor,
                            new.priority,
                            &new.wants,
                            new.key.as_deref(),
                            &new.metadata,
                        )
                    })
                };
                if known.is_some_and(|known| !same(known)) {
                    return Err(ServiceError::Refused(Refused::KeyReused {
                        key: berth_core::text::printable(key).into_owned(),
                        request: id,
                    }));
                }
            }
        }
        let request = Request {
            id,
            requestor: new.requestor,
            priority: new.priority,
            created,
            wants: new.wants,
            state: RequestState::Pending,
            nodes: Vec::new(),
            failures: 0,
            last_failure: None,
            key: new.key,
            metadata: new.metadata,
        };
        // A request relayed and stored before it reached the inbox is
        // this very call's (without a key, the id was drawn here): new.
        let fresh = added || request.key.is_none();
        Ok((request, fresh))
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
        let reply: Reply = Box::new(move |stored| {
            let _ = tx.send(stored.map(drop));
        });
        self.send(Command::TakeIn(reply))?;
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

    pub(super) async fn submit_with(
        &self,
        new: NewRequest,
        lease: Option<Duration>,
    ) -> Result<RequestId, ServiceError> {
        let submitted = self
            .embedder(change::Submit {
                new,
                lease,
                id: None,
            })
            .await?;
        Ok(submitted.id)
    }

    pub async fn cancel(&self, id: RequestId) -> Result<(), ServiceError> {
        self.embedder(change::Cancel(id)).await
    }

    pub async fn release(&self, id: NodeId) -> Result<(), ServiceError> {
        self.embedder(change::Release(id)).await
    }

    pub async fn set_idle(&self, id: NodeId, idle: Idle) -> Result<(), ServiceError> {
        self.embedder(change::SetIdle(id, idle)).await
    }

    pub async fn delete(&self, id: NodeId) -> Result<(), ServiceError> {
        self.embedder(change::Delete(id)).await
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

/// Answers a command the pool no longer takes with `why`.
pub(super) fn refuse(command: Command, why: &ServiceError) {
    match command {
        Command::Act(act) => act.refuse(why.clone()),
        Command::TakeIn(reply) => reply(Err(why.clone())),
        Command::Wait(_, reply) => drop(reply),
        Command::Inspect(_) => {}
        Command::Reconfigure(_, reply) => {
            let _ = reply.send(Err(why.clone()));
        }
    }
}
