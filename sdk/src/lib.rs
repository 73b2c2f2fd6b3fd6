//! The Rust SDK for berth cloud drivers.
//!
//! A driver is a WebAssembly component (`wasm32-wasip2`, `crate-type =
//! ["cdylib"]`) that implements the `berth:driver@0.2.0` contract in
//! `wit/berth-driver@0.2.0/driver.wit`. With this crate a driver is one type implementing
//! [`Driver`] and one [`export_driver!`] line:
//!
//! ```no_run
//! use berth_sdk::types::{CreateSpec, DriverInfo, Error, Instance, Page};
//! use berth_sdk::{Driver, error};
//!
//! struct MyCloud {
//!     pool_id: String,
//! }
//!
//! impl Driver for MyCloud {
//!     fn describe() -> DriverInfo {
//!         DriverInfo {
//!             name: "my-cloud".into(),
//!             version: env!("CARGO_PKG_VERSION").into(),
//!             description: "Machines on My Cloud.".into(),
//!             config: vec![],
//!             label_options: vec![],
//!             capabilities: berth_sdk::types::Capabilities::empty(),
//!         }
//!     }
//!     fn configure(pool_id: &str, _config: &str) -> Result<Self, Error> {
//!         Ok(MyCloud { pool_id: pool_id.to_owned() })
//!     }
//!     fn create(&mut self, _spec: CreateSpec) -> Result<Instance, Error> {
//!         Err(error::permanent("not written yet"))
//!     }
//!     fn get(&mut self, _ids: &[String]) -> Result<Vec<Instance>, Error> {
//!         Ok(vec![])
//!     }
//!     fn list(&mut self, _filter: &[(String, String)], _cursor: Option<&str>) -> Result<Page, Error> {
//!         Ok(Page { instances: vec![], next: None })
//!     }
//!     fn delete(&mut self, id: &str) -> Result<(), Error> {
//!         Err(error::not_found(id))
//!     }
//!     fn set_tags(&mut self, id: &str, _tags: &[(String, String)]) -> Result<(), Error> {
//!         Err(error::not_found(id))
//!     }
//! }
//!
//! berth_sdk::export_driver!(MyCloud);
//! # fn main() {}
//! ```
//!
//! - [`types`]: the contract's records, variants and flags.
//! - [`error`]: constructors for each error case.
//! - [`http`]: a blocking HTTP client over `wasi:http`.
//! - [`tags`]: berth's tag keys and the `list` / `set-tags` rules.
//! - [`pages`]: helpers for the answers of `get` and `list`.
//! - [`auth`]: what the host's credentials learned that a driver may know.
//! - [`log`]: structured records into the host's log.
//! - [`state`]: durable records the host keeps for the provider.
//! - [`net`]: a TCP probe under the provider's allowed hosts.
//!
//! `plugins/example` in the berth repository is a complete driver to copy,
//! and `docs/writing-a-driver.md` walks through building and testing one.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod auth;
#[allow(missing_docs, clippy::all)]
#[doc(hidden)]
pub mod bindings;
pub mod cloud_init;
pub mod config;
#[doc(hidden)]
pub mod driver;
pub mod error;
pub mod http;
pub mod log;
pub mod net;
pub mod pages;
pub mod state;
pub mod tags;
pub mod time;
pub mod types;

pub use driver::Driver;

/// The raw WASI bindings of the imports the world allows (clocks, random,
/// http), for what the SDK does not wrap, such as reading the clock.
pub use bindings::wasi;
