//! Guest bindings generated from `wit/berth-driver@0.2.0/driver.wit` (world
//! `driver-plugin`).
//!
//! Driver authors do not use this module directly: the WIT types are
//! re-exported from [`crate::types`] and [`crate::export_driver!`] wires a
//! [`crate::Driver`] to the generated export. It is public only because the
//! generated export macro expands in the driver's crate and must reach it.

wit_bindgen::generate!({
    path: "../wit/berth-driver@0.2.0",
    world: "berth:driver/driver-plugin",
    // The world imports wasi:http, clocks and random; generate those too
    // rather than depending on another crate's copy of them.
    generate_all,
    pub_export_macro: true,
    default_bindings_module: "berth_sdk::bindings",
});
