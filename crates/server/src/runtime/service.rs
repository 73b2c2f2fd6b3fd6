//! A running pool ([`Service`]): its handle and its task, the parts it
//! runs with, and how it stops.

// Time here is tokio's clock, which tests on paused time move.
#![deny(clippy::disallowed_methods)]

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use berth_core::pool::Pool;
use berth_plugin::Gate;
use berth_store::{PgInbox, Store};

use super::clock::Clock;
use super::events::Events;
use super::handle::{COMMAND_QUEUE, Handle};
use super::mode::{Holder, Mode, PoolError};
use super::observer::Observer;
use super::providers::Providers;
use super::shards::{self, Shards};
use super::task::Loop;

/// A running pool: its handle and its task.
pub struct Service {
    pub handle: Handle,
    pub(super) task: JoinHandle<Result<(), PoolError>>,
    /// The providers' heartbeats (a shared store), stopped after the task.
    pub(super) beating: Option<shards::Beating>,
    /// The task's outcome, once [`Service::ended`] has seen it.
    pub(super) outcome: Option<Result<(), PoolError>>,
    pub(super) shutdown: Option<oneshot::Sender<Duration>>,
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
    pub backend: Backend,
}

/// Whose the store is: this process's own, or shared by several.
pub enum Backend {
    /// A store of this process's own (SQLite): it always holds the pool.
    Embedded,
    /// A store shared by several processes (PostgreSQL).
    Shared(Shared),
}

/// What a store shared by several processes brings.
pub struct Shared {
    /// Who holds the pool at start, if another process does: the task
    /// stands by until it can take the pool over.
    pub standby: Option<Holder>,
    /// The providers' leases: where each provider's calls are carried out.
    pub shards: Arc<Shards>,
    /// Their heartbeats, stopped after the pool's task.
    pub beating: shards::Beating,
    /// The store's requests inbox.
    pub inbox: Arc<PgInbox>,
}

impl Service {
    /// Starts the pool's task on `pool` with its providers, store and clock.
    pub fn spawn(pool: Pool, parts: Parts) -> Service {
        let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
        let (outcomes_tx, outcomes) = mpsc::unbounded_channel();
        let (stop_tx, stop_rx) = oneshot::channel();
        let config = pool.config().clone();
        let ended = Arc::new(OnceLock::new());
        let mode = Arc::new(tokio::sync::watch::Sender::new(Mode::Holding));
        let lease = Arc::default();
        let events = Arc::new(Events::new());
        let (standby, shared, beating) = match parts.backend {
            Backend::Embedded => (None, None, None),
            Backend::Shared(Shared {
                standby,
                shards,
                beating,
                inbox,
            }) => (standby, Some((shards, inbox)), Some(beating)),
        };
        let run = Loop {
            ended: ended.clone(),
            mode: mode.clone(),
            lease: Arc::clone(&lease),
            gate: parts.gate,
            standby,
            pool,
            providers: parts.providers.clone(),
            shards: shared.as_ref().map(|(shards, _)| shards.clone()),
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
            inbox_due: shared.is_some(),
            taking_in: Vec::new(),
            events: events.clone(),
        };
        if parts.providers.loads_drivers() {
            tokio::spawn(events.clone().watch_drivers(parts.providers.clone()));
        }
        let closing = events.clone();
        let task = tokio::spawn(async move {
            let ended = run.run(rx, outcomes, stop_rx).await;
            closing.close();
            ended
        });
        Service {
            handle: Handle {
                tx,
                config: Arc::new(std::sync::RwLock::new(config)),
                providers: parts.providers,
                ended,
                mode,
                lease,
                shared,
                events,
                clock: parts.clock,
            },
            task,
            beating,
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

pub(super) fn panicked(e: tokio::task::JoinError) -> PoolError {
    match e.try_into_panic() {
        Ok(payload) => PoolError::Panicked(berth_core::text::panic_message(&*payload)),
        Err(e) => PoolError::Panicked(e.to_string()),
    }
}

/// How long a stop waits for driver calls in flight by default.
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(30);
