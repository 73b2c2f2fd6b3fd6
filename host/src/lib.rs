//! berth keeps pools of cloud machines ready for the programs that need them.
//! Every cloud driver is a sandboxed WebAssembly component loaded at run time
//! against one WIT contract (`wit/driver.wit`).
//!
//! - [`driver`]: the contract as plain host types.
//! - [`plugin`]: loading, sandboxing and calling driver components.

//! - [`sim`]: a simulated cloud for tests, benchmarks and the embedded default.

pub mod conformance;
pub mod driver;
pub(crate) mod duration;
pub mod plugin;
pub mod sim;
