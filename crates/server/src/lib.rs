//! The berth service: the runtime that runs the pool core against driver
//! components and the store, and the HTTP API on it.
//!
//! - [`runtime`]: the pool's task, its commands, and the providers' calls.
//! - [`api`]: the HTTP API on a running pool, with auth, telemetry and the
//!   OpenAPI document generated from its handlers.
//! - [`metrics`]: berth's glue to `prometheus-client`, which keeps the
//!   metrics behind `/metrics`.
//! - [`serve`]: `berth serve`, the pool and its API as one service.
//! - `embedded`: the sim driver carried inside the binary (feature
//!   `embedded-sim`).

// Only `serve/sys.rs` allows `unsafe` (ARCHITECTURE.md, "Lints and unsafe
// code").
#![deny(unsafe_code)]

pub mod api;
#[cfg(feature = "embedded-sim")]
pub mod embedded;
pub mod metrics;
pub mod runtime;
pub mod serve;
pub mod telemetry;
