//! While the pool is not this process's to decide on: the store out of
//! reach, a commit refused, or another process holding the pool. Nothing is
//! decided or sent until the store answers and this process holds the pool;
//! then the pool is reloaded from the store.

// Time here is tokio's clock, which tests on paused time move.
#![deny(clippy::disallowed_methods)]

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use berth_core::pool::Pool;
use berth_store::{StoreError, Tenure};

use super::handle::{Command, refuse};
use super::mode::{Holder, Mode, ServiceError};
use super::task::{Loop, Queues, RECONNECT_FIRST, RECONNECT_MAX, STANDBY_POLL, pool_given_up};

impl Loop {
    /// The pool is not this process's to decide on for now: the store is
    /// out of reach (`lost`), another process holds the pool, or a commit
    /// found the stored rows changed under it. Nothing is decided,
    /// sent to a cloud or answered as done until that ends. What changed in
    /// memory since the last commit is given up (its effects were never
    /// started, its commands are answered with the mode's refusal), and once the store
    /// answers again and this process holds the pool, the pool is reloaded
    /// from the store, as after a restart. Calls in flight are forgotten:
    /// their outcomes go to a channel nobody reads, and their stored intents
    /// are resolved by the first lists. Returns false if told to stop
    /// meanwhile; an error other than the store being out of reach or taken
    /// ends the pool as [`Loop::fail`] says.
    pub(super) async fn suspend(
        &mut self,
        queues: &mut Queues,
        stop: &mut oneshot::Receiver<Duration>,
        mode: Mode,
    ) -> Result<bool, StoreError> {
        self.gate.shut_now();
        self.show_lease();
        let was_lost = matches!(mode, Mode::StoreLost(_));
        let refused = matches!(mode, Mode::Reloading(_));
        let mut lost = was_lost;
        self.set_mode(mode);
        let why = self.refusal();
        for reply in self.replies.drain(..).chain(self.taking_in.drain(..)) {
            reply(Err(why.clone()));
        }
        self.effects.clear();
        self.waiters.clear();
        let (outcomes, fresh) = mpsc::unbounded_channel();
        self.outcomes = outcomes;
        queues.outcomes = fresh;
        self.in_flight = 0;

        let mut backoff = RECONNECT_FIRST;
        let mut wait = if lost { backoff } else { Duration::ZERO };
        loop {
            let retry = tokio::time::Instant::now() + wait;
            loop {
                tokio::select! {
                    biased;
                    _ = &mut *stop => return Ok(false),
                    Some(c) = queues.commands.recv() => match c {
                        // Taken standing by: the pool is taken over with it.
                        Command::Reconfigure(config, reply) => self.reconfigure(config, reply),
                        c => refuse(c, &self.refusal()),
                    },
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
                if !self.mode.borrow().stands_by_for(&holder) {
                    tracing::info!(%holder, %address, "standing by: another berth process holds the pool");
                }
                // This process holds no lease now: nothing of it is
                // uncertain, and `/readyz` says it stands by.
                self.show_lease();
                let standby = Mode::Standby(Some(Holder {
                    name: holder.into(),
                    address: address.into(),
                }));
                self.set_mode(standby);
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
            self.set_mode(Mode::Holding);
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

    /// What a command is answered with while the task decides nothing:
    /// the current mode's refusal.
    fn refusal(&self) -> ServiceError {
        self.mode
            .borrow()
            .refusal()
            .unwrap_or(ServiceError::Stopped)
    }

    pub(super) fn set_mode(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// Opens the drivers' gate for as long as the lease is certain, after
    /// the store confirmed it, and shows the lease to the API.
    pub(super) fn opened(&self) {
        if let Some(held) = self.store.holding() {
            self.gate.open_until(held.valid_until);
        }
        self.show_lease();
    }

    pub(super) fn show_lease(&self) {
        if let Ok(mut lease) = self.lease.lock() {
            *lease = self.store.holding();
        }
    }

    /// When the lease is next renewed if nothing is committed before:
    /// halfway through the time it is certain for.
    pub(super) fn renewal_due(&self) -> Option<tokio::time::Instant> {
        let held = self.store.holding()?;
        Some(held.renewed + held.valid_until.saturating_duration_since(held.renewed) / 2)
    }
}
