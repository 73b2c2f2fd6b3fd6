//! The pool's store, holding nodes, requests, slot assignments and requestor
//! leases: the embedded SQLite file in WAL mode ([`SqliteStore`]), or a
//! PostgreSQL database ([`PgStore`], `[store] url`), both behind [`Store`].
//! The runtime commits the core's [`Changes`](berth_core::pool::Changes) in
//! one transaction before it makes any cloud call (intent before act) and
//! loads a [`Snapshot`](berth_core::pool::Snapshot) at start. Rows live only
//! in this module: the rest of berth sees core types.
//!
//! Rows name labels and providers, not config indexes, so a config change
//! between runs never silently remaps a record. A record that no longer fits
//! the config is dropped with a note (a node) or failed (a pending request);
//! see [`Loaded::dropped`].
//!
//! Several berth processes may share a PostgreSQL store. One of them holds
//! the pool at a time, under a lease with an epoch ([`Store::claim`]); each
//! of its commits renews the lease in the same transaction and fails as
//! [`StoreError::Fenced`] once another process has taken the pool over.
//! Each provider is held by one of them at a time too, under a lease of its
//! own that spreads over the live processes ([`PgShards`]).
//! ARCHITECTURE.md ("Several berth processes, one pool") has the whole
//! story.

#![forbid(unsafe_code)]

mod connect;
mod copy;
mod error;
mod identity;
mod inbox;
mod load;
mod pg;
mod records;
mod rows;
mod schema;
mod shards;
mod sqlite;
mod sqlite_records;
mod store;
#[cfg(test)]
mod tests;
mod value;
mod write;

pub use copy::{Copied, copy_into_empty};
pub use error::StoreError;
pub use inbox::{InboxEntry, PgInbox};
pub use pg::PgStore;
pub use records::PgRecords;
pub use shards::{Announced, Member, PgShards, Roster, RosterLease};
pub use sqlite::SqliteStore;
pub use sqlite_records::SqliteRecords;
pub use store::{Claimant, Holding, Loaded, Store, StoreFuture, Tenure};
