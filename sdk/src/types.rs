//! The contract's data types, as the driver sees them.
//!
//! These are the WIT types of `berth:driver/types@0.2.0`, re-exported as
//! generated. Build errors with the constructors in [`crate::error`].

pub use crate::bindings::berth::driver::types::{
    AccountLimits, Addresses, Capabilities, Capacity, CapacityScope, ConfigField, Connection,
    CreateSpec, DriverInfo, Error, FieldType, Instance, InstanceState, Page, RateLimit, Tags,
};

/// Drivers compare states (`i.state == InstanceState::Running`); the
/// generated variant derives no `PartialEq` of its own.
impl PartialEq for InstanceState {
    fn eq(&self, other: &Self) -> bool {
        use InstanceState::*;
        match (self, other) {
            (Failed(a), Failed(b)) => a == b,
            (Pending, Pending)
            | (Running, Running)
            | (Stopping, Stopping)
            | (Terminated, Terminated)
            | (Unknown, Unknown) => true,
            _ => false,
        }
    }
}

impl Eq for InstanceState {}

/// No address known yet.
impl Default for Addresses {
    fn default() -> Self {
        Addresses {
            public_ipv4: None,
            private_ipv4: None,
            ipv6: None,
            hostname: None,
        }
    }
}
