//! What the driver asks of the host: HTTP, the credential's catalog, its
//! records, the clock and the log. Behind a trait so that the driver's
//! logic (the create that must not make two servers above all) runs in
//! native unit tests against a stand-in (`tests::Fake`).

use std::time::{SystemTime, UNIX_EPOCH};

use berth_sdk::http::{HttpError, Request, Response};
use berth_sdk::types::Error;
use berth_sdk::{auth, log, state};

/// An HTTP method the driver uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Method {
    Get,
    Post,
    Put,
    Delete,
}

/// A request to send.
#[derive(Clone, Debug)]
pub(crate) struct Outgoing {
    pub method: Method,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<Vec<u8>>,
}

pub(crate) trait Env {
    /// Sends `request`; an error when no answer arrived.
    fn send(&self, request: &Outgoing) -> Result<Response, HttpError>;
    /// The `auth-info` of the credential for `host`.
    fn auth_info(&self, host: &str) -> Result<Option<String>, Error>;
    /// The record under `key`.
    fn get(&self, key: &str) -> Result<Option<String>, Error>;
    /// Every record whose key starts with `prefix`.
    fn scan(&self, prefix: &str) -> Result<Vec<(String, String)>, Error>;
    /// Stores `value` (`None` removes) if the record now is `expected`.
    fn compare_and_swap(
        &self,
        key: &str,
        expected: Option<&str>,
        value: Option<&str>,
    ) -> Result<bool, Error>;
    /// Milliseconds since the Unix epoch (records outlive restarts, so
    /// wall-clock time).
    fn now_ms(&self) -> u64;
    /// Waits `ms` milliseconds.
    fn sleep_ms(&self, ms: u64);
    /// A warning for the operator.
    fn warn(&self, message: &str, fields: &[(&str, &str)]);
}

/// The real host, through the SDK's imports.
pub(crate) struct Sandbox;

impl Env for Sandbox {
    fn send(&self, r: &Outgoing) -> Result<Response, HttpError> {
        let mut request = match r.method {
            Method::Get => Request::get(&r.url),
            Method::Post => Request::post(&r.url),
            Method::Put => Request::put(&r.url),
            Method::Delete => Request::delete(&r.url),
        };
        for (k, v) in &r.headers {
            request = request.header(k, v);
        }
        if let Some(body) = &r.body {
            request = request.body(body.clone());
        }
        request.send()
    }

    fn auth_info(&self, host: &str) -> Result<Option<String>, Error> {
        auth::info(host)
    }

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

    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }

    fn sleep_ms(&self, ms: u64) {
        use berth_sdk::wasi::clocks::monotonic_clock;
        monotonic_clock::subscribe_duration(ms.saturating_mul(1_000_000)).block();
    }

    fn warn(&self, message: &str, fields: &[(&str, &str)]) {
        log::warn(message, fields);
    }
}
