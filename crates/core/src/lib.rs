//! The pool core of berth: pure state transitions over nodes, requests,
//! quotas and slots, the driver contract as plain host types, and the config
//! the core decides with.
//!
//! Nothing here does I/O, spawns, sleeps or reads a clock: time comes in as
//! a value, and the decisions come out as calls for the runtime to make. The
//! crate depends on no async runtime, sandbox, database or HTTP stack, and a
//! test in the workspace (`tests/layers.rs`) holds it to that.
//!
//! - [`driver`]: the contract as plain host types, and the checks on what a
//!   driver answers.
//! - [`config`]: the pool's config: labels, offers, limits, timings.
//! - [`pool`]: nodes, requests, quotas, slots, reconciling.
//! - [`duration`]: strict duration parsing and RFC 3339 time.
//! - [`text`]: making text from outside safe to show.

#![forbid(unsafe_code)]

pub mod config;
pub mod driver;
pub mod duration;
pub mod pool;
pub mod text;
