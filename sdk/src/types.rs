//! The contract's data types, as the driver sees them.
//!
//! These are the WIT types of `berth:driver/types@0.1.0`, re-exported as
//! generated. Build errors with the constructors in [`crate::error`].

pub use crate::bindings::berth::driver::types::{
    AccountLimits, Addresses, Capabilities, Capacity, CapacityScope, ConfigField, Connection,
    CreateSpec, DriverInfo, Error, FieldType, Instance, InstanceState, RateLimit, Tags,
};
