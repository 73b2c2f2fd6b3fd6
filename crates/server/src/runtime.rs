//! The thin async runtime around the pool core: one task owns the [`Pool`](berth_core::pool::Pool)
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
//! [`Gate`](berth_plugin::Gate) only for as long as the lease is certain. When another process
//! holds the pool, this one stands by: commands are refused with
//! [`ServiceError::Standby`] (the API forwards them to the holder, and puts
//! a new request the holder does not take in time into the store's inbox
//! for it: [`Handle::send_to_inbox`]), and once
//! the lease is free the task takes the pool over and reloads it from the
//! store, as after a restart: list first, then act.
//!
//! Its rooms:
//! - `handle`: the clients' way in, and how each command is answered;
//!   `change`: the changes a caller may ask, checked and made in one step.
//! - `task`: the loop (decide, store, then answer and act); `effects`: driver
//!   calls and probes on tasks of their own; `notices`: the log lines.
//! - `standby`: deciding nothing while the store is out of reach, a commit
//!   was refused or another process holds the pool; `mode`: which of those
//!   holds now, and the errors commands get.
//! - `start`: the store opened, the lease claimed, the pool restored;
//!   `service`: a running pool, the parts it runs with, and its stop.
//! - `providers`: each provider's driver, started in the background; `probe`:
//!   readiness probes; `shards` and `wire`: the providers' leases and calls
//!   carried out by another process, with a shared store.
//! - `clock`: the core's time; `observer`: what metrics hear.

pub mod change;
mod clock;
mod effects;
pub mod events;
mod handle;
mod mode;
mod notices;
mod observer;
pub mod peers;
pub mod probe;
mod providers;
mod service;
pub mod shards;
mod standby;
mod start;
mod task;
#[cfg(test)]
mod tests;
pub(crate) mod wire;

pub use change::{Caller, Change};
pub use clock::Clock;
pub use handle::{COMMAND_QUEUE, Handle};
pub use mode::{Holder, Mode, PoolError, ServiceError};
pub use observer::{InFlight, Observer, outcome_name};
pub use providers::{
    BoxFuture, Cloud, Gates, Health, LoadedDriver, Prepared, Providers, ReloadCounts, ReloadError,
    Reloaded, RollbackError, Trigger,
};
pub use service::{Backend, DEFAULT_STOP_GRACE, Parts, Service, Shared};
pub use shards::{Added, Shards};
pub use start::{StartOptions, start};
