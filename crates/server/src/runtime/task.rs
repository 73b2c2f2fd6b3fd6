//! The pool's task: one loop that owns the [`Pool`] and the store, takes
//! commands and outcomes in batches, and in each step decides, stores, and
//! only then answers and acts.

// Time here is tokio's clock, which tests on paused time move.
#![deny(clippy::disallowed_methods)]

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use berth_config::Config;
use berth_core::pool::{
    Changes, Effect, NewRequest, Pool, Refusal, Request, RequestId, RequestState, TakenIn,
    Unreadable, read_request,
};
use berth_core::text::printable;
use berth_plugin::Gate;
use berth_store::{InboxEntry, Store, StoreError};

use super::clock::Clock;
use super::effects::{Called, Outcome, call, probe};
use super::events::Events;
use super::handle::{Command, Modes, Reply, SharedLease, refuse};
use super::mode::{Holder, Mode, PoolError, ServiceError};
use super::observer::Observer;
use super::providers::Providers;
use super::shards::Shards;

pub(super) struct Loop {
    /// Shared with every [`Handle`](super::Handle): why the task ended, if by itself.
    pub(super) ended: Arc<OnceLock<ServiceError>>,
    /// Shared with every [`Handle`](super::Handle): whether the pool decides here now.
    pub(super) mode: Modes,
    /// Shared with every [`Handle`](super::Handle): the lease while this process holds it.
    pub(super) lease: SharedLease,
    /// Open while the lease is certain (always, for a store of its own).
    pub(super) gate: Arc<Gate>,
    /// Who held the pool at start, until the task has stood by once.
    pub(super) standby: Option<Holder>,
    pub(super) pool: Pool,
    pub(super) providers: Arc<Providers>,
    /// Where each provider's calls go (a shared store).
    pub(super) shards: Option<Arc<Shards>>,
    pub(super) store: Box<dyn Store>,
    pub(super) clock: Clock,
    pub(super) observer: Arc<dyn Observer>,
    /// Where driver calls report back.
    pub(super) outcomes: mpsc::UnboundedSender<Outcome>,
    pub(super) waiters: HashMap<RequestId, Vec<oneshot::Sender<Option<Request>>>>,
    pub(super) effects: Vec<Effect>,
    /// How to answer the changes made this step, once the step's changes
    /// are stored.
    pub(super) replies: Vec<Reply>,
    /// Driver calls started whose outcome has not come back.
    pub(super) in_flight: usize,
    /// The store's inbox is to be read at the next step: requests were
    /// announced, asked for, or may wait there since this process took
    /// the pool.
    pub(super) inbox_due: bool,
    /// [`Command::TakeIn`]s, answered once a read finds the inbox drained.
    pub(super) taking_in: Vec<Reply>,
    /// Shared with every [`Handle`](super::Handle): what each commit
    /// stored, as events.
    pub(super) events: Arc<Events>,
}

/// How often a process standing by asks whether the pool's lease is free,
/// at most: a holder that stops cleanly frees it at once.
pub(super) const STANDBY_POLL: Duration = Duration::from_millis(250);

/// The first wait before connecting to a lost store again; it doubles up
/// to [`RECONNECT_MAX`].
pub(super) const RECONNECT_FIRST: Duration = Duration::from_millis(250);
pub(super) const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// Commands and outcomes taken in one batch before the store is written:
/// enough to amortise a commit under load, few enough to keep latency low.
pub(super) const BATCH: usize = 256;

/// Where the pool's task takes its work from.
pub(super) struct Queues {
    pub(super) commands: mpsc::Receiver<Command>,
    pub(super) outcomes: mpsc::UnboundedReceiver<Outcome>,
}

impl Queues {
    /// Refuses every command queued now or sent from now on with `why`.
    pub(super) fn close(&mut self, why: &ServiceError) {
        self.commands.close();
        while let Ok(command) = self.commands.try_recv() {
            refuse(command, why);
        }
    }
}

impl Loop {
    pub(super) async fn run(
        mut self,
        commands: mpsc::Receiver<Command>,
        outcomes: mpsc::UnboundedReceiver<Outcome>,
        stop: oneshot::Receiver<Duration>,
    ) -> Result<(), PoolError> {
        let mut queues = Queues { commands, outcomes };
        let mut stop = stop;
        if let Some(holder) = self.standby.take() {
            match (self.suspend(&mut queues, &mut stop, Mode::Standby(Some(holder)))).await {
                Ok(true) => {}
                Ok(false) => {
                    queues.close(&ServiceError::Stopped);
                    return Ok(());
                }
                Err(e) => return Err(self.fail(&mut queues, e)),
            }
        }
        let outcome = loop {
            let suspended = match self.serve(&mut queues, &mut stop).await {
                Ok(grace) => break self.drain(&mut queues, grace).await,
                Err(e) if e.is_lost() => {
                    tracing::error!(
                        error = %e,
                        "the store is out of reach: deciding nothing and calling no cloud until it is back"
                    );
                    let lost = Mode::StoreLost(e.to_string().into());
                    self.suspend(&mut queues, &mut stop, lost).await
                }
                Err(e) if e.is_conflict() => {
                    tracing::warn!(
                        error = %e,
                        "a commit was refused: something else wrote the store's rows under this process; the pool is reloaded from the store and decides again"
                    );
                    let reloading = Mode::Reloading(e.to_string().into());
                    self.suspend(&mut queues, &mut stop, reloading).await
                }
                Err(e) if e.is_fenced() => {
                    tracing::warn!(
                        error = %e,
                        "another berth process took the pool over: this one stands by, deciding nothing and calling no cloud"
                    );
                    self.suspend(&mut queues, &mut stop, Mode::Standby(None))
                        .await
                }
                Err(e) => break Err(e),
            };
            match suspended {
                Ok(true) => {}
                Ok(false) => {
                    // Stopped while suspended: nothing was in flight that
                    // the next start (or the holder) does not resolve.
                    queues.close(&ServiceError::Stopped);
                    return Ok(());
                }
                Err(e) => break Err(e),
            }
        };
        match outcome {
            Ok(()) => Ok(()),
            Err(e) => Err(self.fail(&mut queues, e)),
        }
    }

    /// The pool's life until it is told to stop; returns the stop's grace.
    pub(super) async fn serve(
        &mut self,
        queues: &mut Queues,
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
                    self.store.confirm().await?;
                    continue;
                }
                Some(o) = queues.outcomes.recv() => self.outcome(o),
                c = queues.commands.recv() => match c {
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
                if let Ok(o) = queues.outcomes.try_recv() {
                    self.outcome(o);
                } else if let Ok(c) = queues.commands.try_recv() {
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
    pub(super) fn fail(&mut self, queues: &mut Queues, e: StoreError) -> PoolError {
        tracing::error!(
            error = %e,
            "the store could not be written; the pool stopped deciding, so that nothing is done or answered without a stored record"
        );
        let failed = ServiceError::StoreFailed(e.to_string().into());
        let _ = self.ended.set(failed.clone());
        for reply in self.replies.drain(..).chain(self.taking_in.drain(..)) {
            reply(Err(failed.clone()));
        }
        queues.close(&failed);
        self.waiters.clear();
        PoolError::Store(e)
    }

    /// Stopping: no new call starts and commands are refused, while the
    /// outcomes of calls in flight come in (up to `grace`) and are stored.
    pub(super) async fn drain(
        &mut self,
        queues: &mut Queues,
        grace: Duration,
    ) -> Result<(), StoreError> {
        match self.drain_calls(queues, grace).await {
            Ok(()) => {}
            Err(e) if e.is_fenced() => {
                // The pool is another process's now: what is left is its to
                // resolve, from the stored intents and its first lists.
                tracing::warn!(error = %e, "stopping: the pool was taken over meanwhile");
                queues.close(&ServiceError::Stopped);
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

    pub(super) async fn drain_calls(
        &mut self,
        queues: &mut Queues,
        grace: Duration,
    ) -> Result<(), StoreError> {
        let deadline = tokio::time::Instant::now() + grace;
        // Calls waiting for a provider to start are not worth the grace.
        self.providers.close();
        loop {
            self.commit_and_answer().await?;
            if self.in_flight == 0 {
                break;
            }
            tokio::select! {
                Some(o) = queues.outcomes.recv() => self.outcome(o),
                Some(c) = queues.commands.recv() => refuse(c, &ServiceError::Stopped),
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
        queues.close(&ServiceError::Stopped);
        self.waiters.clear();
        self.commit_and_answer().await
    }

    /// Stores what changed, then answers the commands that changed it.
    pub(super) async fn commit_and_answer(&mut self) -> Result<(), StoreError> {
        let changes = self.pool.take_changes();
        self.commit(&changes).await?;
        self.answer();
        Ok(())
    }

    /// Answers the changes made since the last answer. Clients hear of
    /// what they asked only once it is stored: a request id a client holds
    /// survives a crash.
    pub(super) fn answer(&mut self) {
        let pool = &self.pool;
        for reply in self.replies.drain(..) {
            reply(Ok(pool));
        }
    }

    /// Writes `changes`, if any. A store that cannot be written stops the
    /// pool (see [`Loop::fail`]): acting on the cloud without a stored
    /// intent is how machines leak.
    pub(super) async fn commit(&mut self, changes: &Changes) -> Result<(), StoreError> {
        if changes.is_empty() {
            return Ok(());
        }
        let started = tokio::time::Instant::now();
        // The commit blocks this worker thread, briefly (see
        // docs/BENCHMARKS.md: nearly all take under 0.5 ms). Handing the
        // worker's queue to another thread with `block_in_place` first cost
        // more than it saved: lone requests and one-client loops were slower
        // and the commits themselves took longer.
        self.store.commit(changes).await?;
        self.observer.committed(started.elapsed());
        self.events.stored(&self.pool, changes);
        Ok(())
    }

    pub(super) fn outcome(&mut self, outcome: Outcome) {
        let now = self.clock.now();
        let pool = &mut self.pool;
        let called = match outcome {
            Outcome::Probed(id, r) => return pool.probed(id, r, now),
            Outcome::Called(called) => called,
        };
        self.in_flight -= 1;
        match called {
            Called::Created(id, r) => pool.created(now, id, r),
            Called::Deleted(p, node, instance, r) => pool.deleted(now, p, node, &instance, r),
            Called::CreatedMany(p, all) => pool.created_many(now, p, all),
            Called::DeletedMany(p, all) => pool.deleted_many(now, p, all),
            Called::Listed(p, r) => pool.listed(now, p, r),
            Called::Got(p, asked, r) => pool.got(now, p, &asked, r),
            Called::Tagged(id, r) => pool.tagged(now, id, r),
        }
    }

    pub(super) fn command(&mut self, command: Command) {
        let now = self.clock.now();
        let pool = &mut self.pool;
        match command {
            Command::Act(act) => self.replies.push(act.apply(pool, now)),
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
            Command::TakeIn(reply) => {
                self.inbox_due = true;
                self.taking_in.push(reply);
            }
            Command::Reconfigure(config, reply) => self.reconfigure(config, reply),
        }
    }

    /// Takes a reload's config ([`Pool::reconfigure`]), in the pool and
    /// the store, or refuses it, changing nothing. Standing by too: the
    /// idle pool's config is the one this process takes the pool over
    /// with.
    pub(super) fn reconfigure(
        &mut self,
        config: Arc<Config>,
        reply: oneshot::Sender<Result<(), ServiceError>>,
    ) {
        let taken = self.pool.reconfigure(config.clone(), self.clock.now());
        if taken.is_ok() {
            self.store.reconfigure(config);
        }
        let _ = reply.send(taken.map_err(ServiceError::Reconfigure));
    }

    /// Reads the store's inbox if it is due and takes in what waits there
    /// ([`Pool::take_in`]): the step's commit stores the requests and
    /// claims their entries in one transaction.
    pub(super) async fn take_in(&mut self) -> Result<(), StoreError> {
        if !std::mem::take(&mut self.inbox_due) {
            return Ok(());
        }
        let entries = self.store.inbox(BATCH).await?;
        if entries.len() == BATCH {
            // More wait: the next step reads on.
            self.inbox_due = true;
        } else {
            self.replies.append(&mut self.taking_in);
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
                    self.pool.renew(now, &requestor, config.requestor_lease_ttl);
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
    pub(super) async fn step(&mut self) -> Result<(), StoreError> {
        self.take_in().await?;
        let now = self.clock.now();
        // What each started driver takes in batches, as it declared.
        for p in 0..self.pool.config().providers.len() {
            let p = berth_config::ProviderIx(p as u16);
            if let Some(batches) = self.providers.batches(p) {
                self.pool.declared(p, batches);
            }
        }
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
            self.store.confirm().await?;
        }
        self.commit(&changes).await?;
        self.events.providers(&self.pool, now);
        self.opened();
        self.answer();
        self.say_notices();
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
            match effect {
                Effect::Probe(p) => probe(
                    p,
                    &self.providers,
                    self.outcomes.clone(),
                    self.observer.clone(),
                ),
                Effect::Call(c) => {
                    self.in_flight += 1;
                    let route = (self.shards.clone()).zip(self.store.holding().map(|h| h.epoch));
                    call(
                        c,
                        &self.providers,
                        route,
                        &self.pool.config().pool_id,
                        self.outcomes.clone(),
                        self.observer.clone(),
                    );
                }
            }
        }
        Ok(())
    }
}

/// An inbox entry as the pool takes it in: read as a request to this
/// pool's config, or refused with why.
pub(super) fn inbox_request(config: &Config, entry: InboxEntry) -> Result<NewRequest, Refusal> {
    let wants = entry.wants.iter().map(|(name, n)| (name.as_str(), *n));
    let new = read_request(
        config,
        Some(entry.requestor.clone()),
        "",
        entry.priority,
        wants,
    );
    new.map(|new| NewRequest {
        key: entry.key.clone(),
        metadata: entry.metadata.clone(),
        ..new
    })
    .map_err(|e| Refusal {
        requestor: entry.requestor.clone(),
        priority: entry.priority,
        reason: match e {
            Unreadable::UnknownLabel { name, .. } => {
                format!("no label `{}` in this process's config", printable(&name))
            }
            e => e.to_string(),
        },
    })
}

/// Completes when the database announces requests put into the inbox;
/// never without a shared store.
pub(super) async fn requests_sent(shards: &Option<Arc<Shards>>) {
    match shards {
        Some(shards) => shards.requests_sent().await,
        None => std::future::pending().await,
    }
}

/// Completes when the database announces that the pool's lease was given
/// up; never without a shared store.
pub(super) async fn pool_given_up(shards: &Option<Arc<Shards>>) {
    match shards {
        Some(shards) => shards.pool_given_up().await,
        None => std::future::pending().await,
    }
}

/// The next tick of `interval`, or never.
pub(super) async fn tick(interval: &mut Option<tokio::time::Interval>) {
    match interval {
        Some(i) => {
            i.tick().await;
        }
        None => std::future::pending().await,
    }
}

pub(super) async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
