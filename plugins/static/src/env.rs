//! What the driver asks of the host: its records, a TCP probe, the clock and
//! the log. Behind a trait so the allocation logic runs in native unit tests
//! against an in-memory stand-in (`tests::Fake`).

use std::time::{SystemTime, UNIX_EPOCH};

use berth_sdk::types::Error;
use berth_sdk::{log, net, state};

pub(crate) trait Env {
    /// The value under `key`.
    fn get(&self, key: &str) -> Result<Option<String>, Error>;
    /// Every key starting with `prefix`, with its value, in key order.
    fn scan(&self, prefix: &str) -> Result<Vec<(String, String)>, Error>;
    /// Stores `value` (`None` removes) if the value now is `expected`.
    fn compare_and_swap(
        &self,
        key: &str,
        expected: Option<&str>,
        value: Option<&str>,
    ) -> Result<bool, Error>;
    /// Whether `host`:`port` accepts a TCP connection within `timeout_ms`.
    fn probe(&self, host: &str, port: u16, timeout_ms: u32) -> Result<(), String>;
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
    /// A warning for the operator.
    fn warn(&self, message: &str, fields: &[(&str, &str)]);
    /// A detail for debugging.
    fn debug(&self, message: &str, fields: &[(&str, &str)]);
}

/// The real host, through the SDK's imports.
pub(crate) struct Sandbox;

impl Env for Sandbox {
    fn get(&self, key: &str) -> Result<Option<String>, Error> {
        state::get(key)
    }

    fn scan(&self, prefix: &str) -> Result<Vec<(String, String)>, Error> {
        state::scan(prefix)
    }

    fn compare_and_swap(
        &self,
        key: &str,
        expected: Option<&str>,
        value: Option<&str>,
    ) -> Result<bool, Error> {
        state::compare_and_swap(key, expected, value)
    }

    fn probe(&self, host: &str, port: u16, timeout_ms: u32) -> Result<(), String> {
        net::tcp_probe(host, port, timeout_ms)
    }

    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }

    fn warn(&self, message: &str, fields: &[(&str, &str)]) {
        log::warn(message, fields);
    }

    fn debug(&self, message: &str, fields: &[(&str, &str)]) {
        log::debug(message, fields);
    }
}
