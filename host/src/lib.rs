//! berth keeps pools of cloud machines ready for the programs that need them.
//! Every cloud driver is a sandboxed WebAssembly component loaded at run time
//! against one WIT contract (`wit/berth-driver@0.1.0/driver.wit`).
//!
//! This crate is the `berth` binary and, for a program that embeds berth,
//! one place that names the workspace's crates by what they hold:
//!
//! - [`driver`], [`pool`], [`duration`], [`text`] (`berth-core`): the
//!   contract as host types and the pure pool core.
//! - [`config`] (`berth-config`): the config file, checked into settings.
//! - [`plugin`], [`conformance`], [`contract`] (`berth-plugin`): loading,
//!   sandboxing and calling driver components, and the conformance kit.
//! - [`store`] (`berth-store`): the store of the pool's records.
//! - [`runtime`], [`api`], [`metrics`], [`serve`] (`berth-server`): the
//!   service.
//! - [`sim`] (`berth-sim`): a simulated cloud.
//! - [`client`] (`berth-client`): a client of the HTTP API.
//! - [`cli`]: the CLI's commands against a running service.

#![forbid(unsafe_code)]

pub mod cli;

pub use berth_client as client;
pub use berth_config as config;
pub use berth_core::{driver, duration, pool, text};
pub use berth_plugin as plugin;
pub use berth_plugin::{conformance, contract};
#[cfg(feature = "embedded-sim")]
pub use berth_server::embedded;
pub use berth_server::{api, metrics, runtime, serve};
pub use berth_sim as sim;
pub use berth_store as store;
