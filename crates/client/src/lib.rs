//! A client of berth's HTTP API, and the API's wire types.
//!
//! [`Client`] makes each of the API's operations one typed call, over
//! `http://` or `https://`:
//!
//! ```no_run
//! # async fn run() -> Result<(), berth_client::Error> {
//! use berth_client::{Client, types::NewRequest};
//!
//! let berth = Client::new("http://127.0.0.1:8080", Some("a-client-token".into()))?;
//! let new = NewRequest {
//!     labels: [("small".to_owned(), 1)].into(),
//!     ..Default::default()
//! };
//! let mut request = berth.create_request(&new).await?;
//! while request.state == "pending" {
//!     request = berth.request(&request.id, Some(berth_client::MAX_WAIT)).await?;
//! }
//! for node in &request.nodes {
//!     // ... use the node, then give it back:
//!     berth.release(&node.id).await?;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! [`types`] are the bodies the service sends and reads, shared with the
//! service itself, which derives its OpenAPI document from their schemas.

#![forbid(unsafe_code)]

mod client;
pub use berth_types as types;

pub use berth_core::pool::Idle;
pub use client::{Client, Error, NodeFilter, RequestFilter};
pub use types::MAX_WAIT;
