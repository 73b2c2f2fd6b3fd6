//! The HTTP API under `/v1` (JSON), with `/healthz`, `/readyz`, `/metrics`
//! and `/openapi.json`: a thin face on a running pool's [`Handle`](crate::runtime::Handle).
//!
//! Every handler authenticates the caller (bearer token → client or admin),
//! checks its body by hand so that a bad field is named, and asks the pool's
//! task for what it needs; views are built on that task in one go, so a
//! response shows the pool at one moment. Errors are [`types::ErrorBody`]
//! with a stable code. While another berth process holds a shared pool,
//! `/v1` calls are relayed to it as they are (`forward.rs`).

mod auth;
mod config;
mod doc;
mod edge;
mod error;
mod events;
mod forward;
mod health;
mod nodes;
mod peer;
mod pool;
mod requests;
mod responses;
mod router;
mod state;
mod ui;
mod views;

pub use crate::telemetry::Telemetry;
pub use auth::Caller;
pub use berth_types as types;
pub use berth_types::MAX_WAIT;
pub use edge::MAX_BODY;
pub use error::ApiError;
pub use state::Api;
