//! berth keeps pools of cloud machines ready for the programs that need them.
//! Every cloud driver is a sandboxed WebAssembly component loaded at run time
//! against one WIT contract (`wit/driver.wit`).
//!
//! - [`driver`]: the contract as plain host types.
//! - [`contract`]: the contract's WIT files, for `berth driver wit`.
//! - [`plugin`]: loading, sandboxing and calling driver components.
//! - [`config`]: the config file, checked into typed data.
//! - [`pool`]: the pool core: nodes, requests, quotas, slots, reconciling.
//! - [`store`]: the embedded SQLite store of the pool's records.
//! - [`runtime`]: the async runtime that runs the core against drivers and the store.
//! - [`sim`]: a simulated cloud for tests, benchmarks and the embedded default.
//! - [`api`]: the HTTP API on a running pool, with auth and metrics.
//! - [`serve`]: `berth serve`, the pool and its API as one service.
//! - [`client`]: the CLI's client commands for a running service.
//! - [`text`]: making text from outside safe to show.

pub mod api;
pub mod client;
pub mod config;
pub mod conformance;
pub mod contract;
pub mod driver;
pub mod duration;
#[cfg(feature = "embedded-sim")]
pub mod embedded;
pub mod metrics;
pub mod plugin;
pub mod pool;
pub mod runtime;
pub mod serve;
pub mod sim;
pub mod store;
pub mod text;
