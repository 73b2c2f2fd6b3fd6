//! Constructors for the contract's typed [`Error`].
//!
//! The host acts on the error *case*, never on the message, so pick the case
//! with care: `transient` is retried, `permanent` and `invalid-config` are not,
//! `rate-limited` pauses calls, `quota-exceeded` and `capacity` pause creates,
//! and `not-found` from `delete` counts as success.

use crate::types::{Capacity, CapacityScope, Error, RateLimit};

/// A fault that may go away on retry (network error, 5xx).
pub fn transient(message: impl Into<String>) -> Error {
    Error::Transient(message.into())
}

/// A fault that will not go away on retry.
pub fn permanent(message: impl Into<String>) -> Error {
    Error::Permanent(message.into())
}

/// The cloud is throttling calls; the host waits `retry_after_ms` before the
/// next call of this kind.
pub fn rate_limited(retry_after_ms: u64, message: impl Into<String>) -> Error {
    Error::RateLimited(RateLimit {
        retry_after_ms,
        message: message.into(),
    })
}

/// An account quota was hit; the host makes no creates until an instance goes away.
pub fn quota_exceeded(message: impl Into<String>) -> Error {
    Error::QuotaExceeded(message.into())
}

/// The cloud has no capacity for `instance_type`; other types may still work.
pub fn capacity_for_type(instance_type: impl Into<String>, message: impl Into<String>) -> Error {
    Error::Capacity(Capacity {
        scope: CapacityScope::InstanceType(instance_type.into()),
        message: message.into(),
    })
}

/// Nothing can be launched on this provider right now.
pub fn capacity_general(message: impl Into<String>) -> Error {
    Error::Capacity(Capacity {
        scope: CapacityScope::General,
        message: message.into(),
    })
}

/// The instance does not exist. From `delete`, the host treats it as success.
pub fn not_found(message: impl Into<String>) -> Error {
    Error::NotFound(message.into())
}

/// Credentials were rejected or lack a permission.
pub fn unauthorized(message: impl Into<String>) -> Error {
    Error::Unauthorized(message.into())
}

/// The provider config or label options are wrong; name the field in `message`.
pub fn invalid_config(message: impl Into<String>) -> Error {
    Error::InvalidConfig(message.into())
}

/// The usual case for an HTTP error status, as the Python and JavaScript
/// SDKs map it: 429 is `rate-limited` (waiting as the `retry-after` header
/// says in seconds, else a second), 401 and 403 `unauthorized`, 404
/// `not-found`, 5xx `transient`, anything else `permanent`. A cloud with its
/// own codes (a quota, capacity) maps those first and falls back to this.
pub fn from_status(status: u16, retry_after: Option<&str>, message: impl Into<String>) -> Error {
    match status {
        429 => {
            let secs = retry_after.and_then(|v| v.trim().parse::<u64>().ok());
            rate_limited(secs.map_or(1000, |s| s.saturating_mul(1000)), message)
        }
        401 | 403 => unauthorized(message),
        404 => not_found(message),
        500..=599 => transient(message),
        _ => permanent(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_their_cases() {
        let case = |status, after| match from_status(status, after, "m") {
            Error::RateLimited(r) => format!("rate-limited {}", r.retry_after_ms),
            Error::Unauthorized(_) => "unauthorized".into(),
            Error::NotFound(_) => "not-found".into(),
            Error::Transient(_) => "transient".into(),
            Error::Permanent(_) => "permanent".into(),
            other => format!("{other:?}"),
        };
        assert_eq!(case(429, Some("3")), "rate-limited 3000");
        assert_eq!(case(429, Some("soon")), "rate-limited 1000");
        assert_eq!(case(429, None), "rate-limited 1000");
        assert_eq!(case(401, None), "unauthorized");
        assert_eq!(case(403, None), "unauthorized");
        assert_eq!(case(404, None), "not-found");
        assert_eq!(case(503, None), "transient");
        assert_eq!(case(409, None), "permanent");
    }
}
