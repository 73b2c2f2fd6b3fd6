//! A client of berth's HTTP API, and the API's wire types.
//!
//! [`types`] are the bodies the service sends and reads, shared with the
//! service itself, which derives its OpenAPI document from their schemas.

pub mod types;

pub use types::MAX_WAIT;
