//! What every store is: the [`Store`] trait the runtime holds, and what its
//! calls answer: what a load found ([`Loaded`]), who holds the pool
//! ([`Tenure`], [`Holding`]), and the process that claims it
//! ([`Claimant`]).

// Time here is tokio's clock, which tests on paused time move.
#![deny(clippy::disallowed_methods)]

use std::time::Duration;
use tokio::time::Instant;

use berth_core::config::Config;
use berth_core::pool::{Changes, Snapshot};

use crate::error::StoreError;
use crate::inbox::InboxEntry;

/// What a [`Store`] call returns: a future, since a store may be across a
/// network (PostgreSQL); the embedded one is ready at once.
pub type StoreFuture<'a, T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Where the pool's records are kept. Object safe, so the runtime can hold a
/// `Box<dyn Store>`.
pub trait Store: Send {
    /// Everything stored, converted to core types against `config`.
    fn load<'a>(&'a mut self, config: &'a Config) -> StoreFuture<'a, Loaded>;
    /// Writes `changes` atomically (one transaction): upserts nodes and
    /// requests, removes purged ones, rewrites the slot assignments of
    /// changed backing nodes. On error nothing of `changes` is written.
    fn commit<'a>(&'a mut self, changes: &'a Changes) -> StoreFuture<'a, ()>;
    /// Names labels and providers by `config` in what it writes from now
    /// on: the pool took a new config while running, with the running
    /// labels and providers at their indexes and labels added after them.
    fn reconfigure(&mut self, config: std::sync::Arc<Config>);
    /// Whether the store is within reach, for a step that acts without
    /// committing anything (a list): no cloud call while it is not. The
    /// embedded store always is.
    fn confirm(&mut self) -> StoreFuture<'_, ()> {
        Box::pin(std::future::ready(Ok(())))
    }
    /// Connects again after an error for which [`StoreError::is_lost`]
    /// holds. The embedded store has no connection to lose.
    fn reconnect(&mut self) -> StoreFuture<'_, ()> {
        Box::pin(std::future::ready(Ok(())))
    }
    /// Takes the pool's lease for this process if nobody else holds it,
    /// or says who does. A store of one process's own is always
    /// [`Tenure::Alone`].
    fn claim(&mut self) -> StoreFuture<'_, Tenure> {
        Box::pin(std::future::ready(Ok(Tenure::Alone)))
    }
    /// The lease as last confirmed (by a claim, a commit, or
    /// [`Store::confirm`]), while this process holds it.
    fn holding(&self) -> Option<Holding> {
        None
    }
    /// Gives the lease up, so that another process takes over at once.
    fn release(&mut self) -> StoreFuture<'_, ()> {
        Box::pin(std::future::ready(Ok(())))
    }
    /// The oldest requests waiting in the inbox for the pool's holder to
    /// take them in, at most `limit` ([`crate::PgInbox`]): the commit that stores
    /// one removes its entry ([`Changes::taken_in`]). A store of one
    /// process's own has no inbox.
    fn inbox(&mut self, _limit: usize) -> StoreFuture<'_, Vec<InboxEntry>> {
        Box::pin(std::future::ready(Ok(Vec::new())))
    }
    /// How often the pool calls [`Store::confirm`] while nothing else does:
    /// a file store makes sure its file and directory are still there
    /// (removed, replaced or emptied under the process, they would take
    /// commits nobody will read). `None`: no need.
    fn watch_every(&self) -> Option<Duration> {
        None
    }
}

/// A process that shares a pool, as it claims the pool's lease.
#[derive(Clone, Debug)]
pub struct Claimant {
    /// This process, unique among those sharing the store.
    pub holder: String,
    /// Where the others reach this process's API.
    pub address: String,
    /// How long the lease lasts unrenewed.
    pub ttl: Duration,
}

impl Claimant {
    /// Until when a lease renewed at `sent` (before the statement went out)
    /// certainly still holds: no other process can take the pool over
    /// before `sent + ttl` by the server's clock, and a fifth of the TTL is
    /// kept back for clocks that do not run quite alike.
    pub fn valid_until(&self, sent: Instant) -> Instant {
        sent + self.ttl - self.ttl / 5
    }
}

/// Who holds the pool, as a claim found.
#[derive(Clone, Debug, PartialEq)]
pub enum Tenure {
    /// The store is this process's own: there is no lease.
    Alone,
    /// This process holds the lease.
    Held(Holding),
    /// Another process does; its lease runs out in `expires_in` unless it
    /// renews it.
    Other {
        holder: String,
        address: String,
        expires_in: Duration,
    },
}

/// A lease this process holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holding {
    /// The fencing token: bumped at each takeover, and checked by every
    /// commit.
    pub epoch: i64,
    /// When the confirming statement was sent, by the monotonic clock as
    /// tokio reads it (which tests on paused time control).
    pub renewed: Instant,
    /// By the same clock, the moment before which no other process can
    /// have taken the pool over ([`Claimant::valid_until`]).
    pub valid_until: Instant,
    /// When the lease expires unrenewed, by the database's clock.
    pub expires: std::time::SystemTime,
}

/// What [`Store::load`] found.
#[derive(Clone, Debug, Default)]
pub struct Loaded {
    /// The records, sorted by id.
    pub snapshot: Snapshot,
    /// What did not fit the config or the other records, said in words for
    /// the log: nodes left out, requests failed, slot rows ignored.
    pub dropped: Vec<String>,
}
