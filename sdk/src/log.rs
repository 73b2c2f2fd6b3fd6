//! Structured logging into the host's log, attributed to the driver.
//!
//! Each function writes one record with `fields` shown beside the message:
//!
//! ```no_run
//! berth_sdk::log::info("instance created", &[("id", "i-1"), ("type", "small")]);
//! ```
//!
//! The host rate-limits and truncates records and never fails the call.
//! Never log secrets; a driver should not have any to log.

use crate::bindings::berth::driver::log as wit;

/// Severity of a log record.
pub use wit::Level;

/// Writes one record at `level`.
pub fn log(level: Level, message: &str, fields: &[(&str, &str)]) {
    let fields: Vec<(String, String)> = fields
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    wit::log(level, message, &fields);
}

/// Writes a record at [`Level::Trace`].
pub fn trace(message: &str, fields: &[(&str, &str)]) {
    log(Level::Trace, message, fields);
}

/// Writes a record at [`Level::Debug`].
pub fn debug(message: &str, fields: &[(&str, &str)]) {
    log(Level::Debug, message, fields);
}

/// Writes a record at [`Level::Info`].
pub fn info(message: &str, fields: &[(&str, &str)]) {
    log(Level::Info, message, fields);
}

/// Writes a record at [`Level::Warn`].
pub fn warn(message: &str, fields: &[(&str, &str)]) {
    log(Level::Warn, message, fields);
}

/// Writes a record at [`Level::Error`].
pub fn error(message: &str, fields: &[(&str, &str)]) {
    log(Level::Error, message, fields);
}
