//! Durable records the host keeps for this driver's provider.
//!
//! For a driver whose "cloud" keeps no records of its own, such as a fixed
//! list of hosts: which host serves which node, and the tags berth set. Every
//! instance of the driver for one provider sees the same records, so claim
//! with [`compare_and_swap`] rather than read-then-write:
//!
//! ```no_run
//! use berth_sdk::state;
//! // Claim host `a` for node `n-1` unless someone else holds it.
//! if state::compare_and_swap("host/a", None, Some("n-1"))? {
//!     // ours
//! }
//! # Ok::<(), berth_sdk::types::Error>(())
//! ```
//!
//! Keys are at most 256 bytes, values at most 64 KiB, 10,000 keys per
//! provider. A failure (a limit, or the host's store unreachable) comes back
//! as [`Error::Transient`](crate::types::Error::Transient) naming the cause.

use crate::bindings::berth::driver::state as wit;
use crate::types::Error;

fn err(e: String) -> Error {
    Error::Transient(format!("driver state: {e}"))
}

/// The value stored under `key`.
pub fn get(key: &str) -> Result<Option<String>, Error> {
    wit::get(key).map_err(err)
}

/// Every key starting with `prefix` with its value, in key order.
pub fn scan(prefix: &str) -> Result<Vec<(String, String)>, Error> {
    wit::scan(prefix).map_err(err)
}

/// Stores `value` under `key` (`None` removes it) if the key's value is now
/// `expected` (`None`: absent). Returns whether it stored.
pub fn compare_and_swap(
    key: &str,
    expected: Option<&str>,
    value: Option<&str>,
) -> Result<bool, Error> {
    wit::compare_and_swap(key, expected, value).map_err(err)
}
