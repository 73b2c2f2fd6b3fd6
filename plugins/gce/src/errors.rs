//! The one place Compute Engine's failures become the contract's errors:
//! a refused request by its `error.errors[].reason` (the status when there
//! is none), and an operation that ended `DONE` with `error.errors[]` by
//! their `code`.

use berth_sdk::error;
use berth_sdk::http::Response;
use berth_sdk::types::Error;
use serde_json::Value;

/// How long to hold calls back after a throttle that named no
/// `Retry-After` (Compute Engine seldom does). Its API rate quotas are per
/// minute, refilled as they go; two seconds leave room for the project's
/// other callers.
pub(crate) const DEFAULT_RETRY_AFTER_MS: u64 = 2000;

/// The call an error answered, for what a reason means there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Call {
    /// `instances.insert` or `bulkInsert`, for this machine type: a 400 or
    /// 404 names something of the label's (its image, machine type,
    /// network) that is wrong.
    Create,
    /// A page of `instances.list` asked for with a page token: a 400 says
    /// the token is no longer good.
    ListPage,
    /// Anything else.
    Other,
}

/// A refusal in Google's error model, read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub status: u16,
    /// `error.errors[].reason`, in order.
    pub reasons: Vec<String>,
    pub message: String,
}

impl ApiError {
    pub(crate) fn has(&self, reason: &str) -> bool {
        self.reasons.iter().any(|r| r == reason)
    }
}

/// Reads `resp`'s body as Google's error model; the status alone when it
/// is not (a proxy's page, the host's own answer about a credential).
pub(crate) fn api_error(resp: &Response) -> ApiError {
    let text = resp.text();
    let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let e = &body["error"];
    let reasons: Vec<String> = (e["errors"].as_array().into_iter().flatten())
        .filter_map(|x| x["reason"].as_str().map(str::to_owned))
        .collect();
    let message = match e["message"].as_str() {
        Some(m) => m.to_owned(),
        None if e.is_string() => e.as_str().unwrap_or_default().to_owned(),
        None => text.trim().chars().take(200).collect(),
    };
    let mut message = if reasons.is_empty() {
        format!("GCE answered {}: {message}", resp.status)
    } else {
        format!(
            "GCE answered {} {}: {message}",
            resp.status,
            reasons.join(", ")
        )
    };
    if let Some(status) = e["status"].as_str() {
        message.push_str(&format!(" ({status})"));
    }
    ApiError {
        status: resp.status,
        reasons,
        message,
    }
}

fn retry_after_ms(resp: &Response) -> u64 {
    resp.header("retry-after")
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map_or(DEFAULT_RETRY_AFTER_MS, |secs| secs.saturating_mul(1000))
}

/// The error for a refused request. `instance_type` is what a create asked
/// for, so that a capacity error can name it.
pub(crate) fn from_response(resp: &Response, call: Call, instance_type: Option<&str>) -> Error {
    let e = api_error(resp);
    let m = e.message.clone();
    let any = |rs: &[&str]| rs.iter().any(|r| e.has(r));
    if resp.status == 429
        || any(&[
            "rateLimitExceeded",
            "userRateLimitExceeded",
            "RATE_LIMIT_EXCEEDED",
        ])
    {
        return error::rate_limited(retry_after_ms(resp), m);
    }
    if any(&["quotaExceeded", "QUOTA_EXCEEDED"]) {
        return error::quota_exceeded(m);
    }
    if any(&[
        "insufficientCapacity",
        "resourcePoolExhausted",
        "ZONE_RESOURCE_POOL_EXHAUSTED",
    ]) {
        return match instance_type {
            Some(t) => error::capacity_for_type(t, m),
            None => error::capacity_general(m),
        };
    }
    if any(&[
        "authError",
        "forbidden",
        "insufficientPermissions",
        "accessNotConfigured",
        "SERVICE_DISABLED",
        "ACCESS_TOKEN_SCOPE_INSUFFICIENT",
        "IAM_PERMISSION_DENIED",
    ]) {
        return error::unauthorized(m);
    }
    if any(&[
        "backendError",
        "internalError",
        "resourceNotReady",
        "conditionNotMet",
    ]) {
        return error::transient(m);
    }
    if any(&["notFound"]) {
        return match call {
            Call::Create => error::invalid_config(m),
            _ => error::not_found(m),
        };
    }
    match (call, resp.status) {
        (Call::Create, 400) => error::invalid_config(m),
        (Call::ListPage, 400) => error::transient(format!("{m}; the page token is no longer good")),
        (Call::Create, 404) => error::invalid_config(m),
        (_, 401 | 403) => error::unauthorized(m),
        (_, 404) => error::not_found(m),
        (_, 412) => error::transient(m),
        (_, 500..=599) => error::transient(m),
        _ => error::permanent(m),
    }
}

/// One entry of an operation's `error.errors`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OpError {
    pub code: String,
    pub message: String,
}

/// The error of an operation that ended `DONE` with `errors`, its
/// `httpErrorStatusCode` being `http`.
pub(crate) fn from_operation(
    errors: &[OpError],
    http: Option<u16>,
    instance_type: Option<&str>,
) -> Error {
    let m = {
        let all: Vec<String> = (errors.iter())
            .map(|e| format!("{}: {}", e.code, e.message))
            .collect();
        format!("the GCE operation failed: {}", all.join("; "))
    };
    let has = |codes: &[&str]| errors.iter().any(|e| codes.contains(&e.code.as_str()));
    if has(&["QUOTA_EXCEEDED"]) {
        error::quota_exceeded(m)
    } else if has(&[
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "REGION_RESOURCE_POOL_EXHAUSTED",
    ]) {
        match instance_type {
            Some(t) => error::capacity_for_type(t, m),
            None => error::capacity_general(m),
        }
    } else if has(&["RATE_LIMIT_EXCEEDED"]) {
        error::rate_limited(DEFAULT_RETRY_AFTER_MS, m)
    } else if has(&["RESOURCE_NOT_FOUND", "NOT_FOUND", "INVALID_FIELD_VALUE"]) {
        error::invalid_config(m)
    } else if has(&["PERMISSIONS_ERROR", "FORBIDDEN"]) {
        error::unauthorized(m)
    } else if has(&[
        "INTERNAL_ERROR",
        "UNAVAILABLE",
        "SERVICE_UNAVAILABLE",
        "RESOURCE_NOT_READY",
    ]) || http.is_some_and(|s| s >= 500)
    {
        error::transient(m)
    } else {
        error::permanent(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_sdk::types::{CapacityScope, RateLimit};

    fn resp(status: u16, headers: &[(&str, &str)], body: &str) -> Response {
        Response {
            status,
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            body: body.as_bytes().to_vec(),
        }
    }

    fn google(status: u16, reason: &str) -> String {
        serde_json::json!({"error": {"code": status, "message": format!("said {reason}"),
            "errors": [{"message": "m", "domain": "global", "reason": reason}]}})
        .to_string()
    }

    pub(crate) fn case(e: &Error) -> String {
        match e {
            Error::RateLimited(RateLimit { retry_after_ms, .. }) => {
                format!("rate-limited {retry_after_ms}")
            }
            Error::QuotaExceeded(_) => "quota-exceeded".into(),
            Error::Capacity(c) => match &c.scope {
                CapacityScope::InstanceType(t) => format!("capacity {t}"),
                CapacityScope::General => "capacity general".into(),
            },
            Error::NotFound(_) => "not-found".into(),
            Error::Unauthorized(_) => "unauthorized".into(),
            Error::InvalidConfig(_) => "invalid-config".into(),
            Error::Transient(_) => "transient".into(),
            Error::Permanent(_) => "permanent".into(),
        }
    }

    fn check(status: u16, headers: &[(&str, &str)], body: &str, call: Call, want: &str) {
        let e = from_response(&resp(status, headers, body), call, Some("e2-small"));
        assert_eq!(case(&e), want, "{status} {body}");
    }

    #[test]
    fn maps_reasons() {
        let c = Call::Other;
        check(
            403,
            &[],
            &google(403, "rateLimitExceeded"),
            c,
            "rate-limited 2000",
        );
        check(
            403,
            &[],
            &google(403, "userRateLimitExceeded"),
            c,
            "rate-limited 2000",
        );
        check(
            429,
            &[("retry-after", "7")],
            &google(429, "rateLimitExceeded"),
            c,
            "rate-limited 7000",
        );
        check(429, &[], "", c, "rate-limited 2000");
        check(
            403,
            &[],
            &google(403, "quotaExceeded"),
            Call::Create,
            "quota-exceeded",
        );
        check(
            503,
            &[],
            &google(503, "insufficientCapacity"),
            Call::Create,
            "capacity e2-small",
        );
        check(401, &[], &google(401, "authError"), c, "unauthorized");
        check(403, &[], &google(403, "forbidden"), c, "unauthorized");
        check(
            403,
            &[],
            &google(403, "accessNotConfigured"),
            c,
            "unauthorized",
        );
        check(404, &[], &google(404, "notFound"), c, "not-found");
        check(
            404,
            &[],
            &google(404, "notFound"),
            Call::Create,
            "invalid-config",
        );
        check(
            400,
            &[],
            &google(400, "invalid"),
            Call::Create,
            "invalid-config",
        );
        check(400, &[], &google(400, "invalid"), c, "permanent");
        check(
            400,
            &[],
            &google(400, "invalid"),
            Call::ListPage,
            "transient",
        );
        check(409, &[], &google(409, "alreadyExists"), c, "permanent");
        check(412, &[], &google(412, "conditionNotMet"), c, "transient");
        check(400, &[], &google(400, "resourceNotReady"), c, "transient");
        check(500, &[], &google(500, "backendError"), c, "transient");
        check(503, &[], &google(503, "backendError"), c, "transient");
        check(502, &[], "<html>bad gateway</html>", c, "transient");
        // The host's own answers when it holds no usable token.
        check(
            401,
            &[("x-berth-credential", "unusable")],
            r#"{"error": {"message": "refused"}}"#,
            c,
            "unauthorized",
        );
        check(
            503,
            &[("x-berth-credential", "unusable")],
            r#"{"error": {"message": "unreachable"}}"#,
            c,
            "transient",
        );
    }

    #[test]
    fn messages_carry_status_reason_and_text() {
        let e = api_error(&resp(403, &[], &google(403, "forbidden")));
        assert_eq!(e.message, "GCE answered 403 forbidden: said forbidden");
        let e = api_error(&resp(502, &[], "<html>bad gateway</html>"));
        assert_eq!(e.message, "GCE answered 502: <html>bad gateway</html>");
        let body = r#"{"error": {"code": 401, "message": "m", "errors": [{"reason": "authError"}], "status": "UNAUTHENTICATED"}}"#;
        assert_eq!(
            api_error(&resp(401, &[], body)).message,
            "GCE answered 401 authError: m (UNAUTHENTICATED)"
        );
    }

    #[test]
    fn maps_operation_codes() {
        let op = |code: &str| {
            vec![OpError {
                code: code.into(),
                message: "m".into(),
            }]
        };
        let t = Some("e2-small");
        assert_eq!(
            case(&from_operation(&op("QUOTA_EXCEEDED"), Some(403), t)),
            "quota-exceeded"
        );
        assert_eq!(
            case(&from_operation(
                &op("ZONE_RESOURCE_POOL_EXHAUSTED"),
                Some(503),
                t
            )),
            "capacity e2-small"
        );
        assert_eq!(
            case(&from_operation(
                &op("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"),
                None,
                None
            )),
            "capacity general"
        );
        assert_eq!(
            case(&from_operation(&op("RESOURCE_NOT_FOUND"), Some(404), t)),
            "invalid-config"
        );
        assert_eq!(
            case(&from_operation(&op("INTERNAL_ERROR"), Some(500), t)),
            "transient"
        );
        assert_eq!(
            case(&from_operation(&op("SOMETHING_NEW"), Some(503), t)),
            "transient"
        );
        assert_eq!(
            case(&from_operation(&op("SOMETHING_NEW"), Some(400), t)),
            "permanent"
        );
        let e = from_operation(&op("QUOTA_EXCEEDED"), None, t);
        assert!(
            matches!(&e, Error::QuotaExceeded(m) if m == "the GCE operation failed: QUOTA_EXCEEDED: m"),
            "{e:?}"
        );
    }
}
