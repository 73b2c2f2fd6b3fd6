//! The one place Nova's failures become the contract's errors: Nova's fault
//! body first (its name and message), the HTTP status when there is none.

use berth_sdk::error;
use berth_sdk::http::Response;
use berth_sdk::types::Error;
use serde_json::Value;

/// How long to hold calls back after a throttle that named no wait.
pub(crate) const DEFAULT_RETRY_AFTER_MS: u64 = 1000;

/// The driver call an answer was for: the same status means different
/// things to each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Call {
    Create,
    /// A page of a list; `cursor`: not the first.
    List {
        cursor: bool,
    },
    /// A server by id (get, and the looks before delete and set-tags).
    Server,
    Delete,
    SetTags,
    Limits,
}

/// A fault body: `{"itemNotFound": {"code": 404, "message": "…"}}`, or
/// Keystone's `{"error": {"code": 401, "title": …, "message": …}}`.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Fault {
    /// `badRequest`, `itemNotFound`, `overLimit`, …
    pub name: String,
    pub message: String,
    /// `retryAfter` of an `overLimit`, in seconds.
    pub retry_after: Option<String>,
}

/// Nova's fault in `body`, if it holds one.
pub(crate) fn fault(body: &[u8]) -> Option<Fault> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let map = v.as_object()?;
    let (name, inner) = map.iter().find(|(_, v)| v.get("message").is_some())?;
    let text = |k: &str| match inner.get(k)? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    Some(Fault {
        name: name.clone(),
        message: text("message").unwrap_or_default(),
        retry_after: text("retryAfter"),
    })
}

/// Seconds in a `Retry-After` header or `retryAfter`, as milliseconds.
fn seconds(text: &str) -> Option<u64> {
    text.trim()
        .parse::<u64>()
        .ok()
        .map(|s| s.saturating_mul(1000))
}

/// The error for a failed Nova call. `instance_type` is what a create asked
/// for, so a capacity error can name it.
pub(crate) fn from_response(resp: &Response, call: Call, instance_type: Option<&str>) -> Error {
    let parsed = fault(&resp.body);
    let mut message = match &parsed {
        Some(f) => format!("Nova answered {} {}: {}", resp.status, f.name, f.message),
        None => format!(
            "Nova answered {}: {}",
            resp.status,
            resp.text().trim().chars().take(200).collect::<String>()
        ),
    };
    if let Some(id) = resp.header("x-compute-request-id") {
        message.push_str(&format!(" (request id {})", id.trim()));
    }
    let said = parsed.as_ref().map_or("", |f| f.message.as_str());
    let name = parsed.as_ref().map_or("", |f| f.name.as_str());
    // Older Novas said a quota was exceeded with 413 `overLimit` and
    // `Retry-After: 0`; newer with 403. Either way it is a quota.
    if said.starts_with("Quota exceeded") {
        return error::quota_exceeded(message);
    }
    let retry_after_ms = || {
        (resp.header("retry-after").and_then(seconds))
            .or_else(|| parsed.as_ref()?.retry_after.as_deref().and_then(seconds))
            .unwrap_or(DEFAULT_RETRY_AFTER_MS)
    };
    match resp.status {
        429 => error::rate_limited(retry_after_ms(), message),
        413 if name == "overLimit" || resp.header("retry-after").is_some() => {
            error::rate_limited(retry_after_ms(), message)
        }
        401 => error::unauthorized(message),
        403 if said.starts_with("Maximum number of metadata items") => error::permanent(message),
        403 => error::unauthorized(message),
        404 => match call {
            Call::Server | Call::Delete | Call::SetTags => error::not_found(message),
            // The collection itself is not there: the endpoint is wrong.
            Call::Create | Call::List { .. } | Call::Limits => error::permanent(format!(
                "{message}; is the compute endpoint the Compute API's base URL (…/v2.1)?"
            )),
        },
        400 if matches!(call, Call::List { cursor: true }) && said.contains("marker") => {
            // The server the cursor names is gone for good: list again.
            error::transient(message)
        }
        400 if call == Call::Create && names_config(said) => error::invalid_config(message),
        409 if said.contains("vm_state building") || building_task(said) => {
            error::transient(message)
        }
        409 if said.contains("task_state deleting") && call != Call::Create => {
            error::not_found(message)
        }
        409 if said.starts_with("More than one possible network found") => {
            error::invalid_config(format!("{message}; set networks"))
        }
        406 => error::permanent(format!(
            "{message}; this cloud does not take the Compute API microversion the driver asks for"
        )),
        503 if name == "serverCapacityUnavailable" => match instance_type {
            Some(t) => error::capacity_for_type(t, message),
            None => error::capacity_general(message),
        },
        500..=599 => error::transient(message),
        _ => error::permanent(message),
    }
}

/// A 409 for a task that ends by itself (spawning, networking, …), not one
/// that ends the server.
fn building_task(said: &str) -> bool {
    said.contains("task_state") && !said.contains("task_state deleting")
}

/// Whether a create's `400` names something of the label or the provider
/// config (flavor, image, key pair, network, security group, zone).
fn names_config(said: &str) -> bool {
    [
        "Flavor ",
        "flavorRef",
        "Can not find requested image",
        "imageRef",
        "Image ",
        "key_name",
        "Network ",
        "Security group",
        "security_group",
        "availability zone",
        "networks",
    ]
    .iter()
    .any(|n| said.contains(n))
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

    fn nova(name: &str, code: u16, message: &str) -> String {
        serde_json::json!({ name: {"code": code, "message": message} }).to_string()
    }

    /// The error's case and payload in a comparable form.
    fn case(e: &Error) -> String {
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
        let e = from_response(&resp(status, headers, body), call, Some("2"));
        assert_eq!(case(&e), want, "{status} {body} ({call:?})");
    }

    #[test]
    fn maps_novas_faults_by_their_words() {
        let quota =
            "Quota exceeded for instances: Requested 1, but already used 10 of 10 instances";
        check(
            403,
            &[],
            &nova("forbidden", 403, quota),
            Call::Create,
            "quota-exceeded",
        );
        check(
            413,
            &[("retry-after", "0")],
            &nova("overLimit", 413, quota),
            Call::Create,
            "quota-exceeded",
        );
        check(
            403,
            &[],
            &nova(
                "forbidden",
                403,
                "Maximum number of metadata items exceeds 128",
            ),
            Call::SetTags,
            "permanent",
        );
        check(
            403,
            &[],
            &nova(
                "forbidden",
                403,
                "Policy doesn't allow os_compute_api:servers:create to be performed.",
            ),
            Call::Create,
            "unauthorized",
        );
        let limited = r#"{"overLimit": {"code": 429, "message": "This request was rate-limited.", "retryAfter": "3"}}"#;
        check(
            429,
            &[("retry-after", "3")],
            limited,
            Call::List { cursor: false },
            "rate-limited 3000",
        );
        check(429, &[], limited, Call::Create, "rate-limited 3000");
        check(429, &[], "", Call::Create, "rate-limited 1000");
        check(
            413,
            &[],
            &nova("overLimit", 413, "This request was rate-limited."),
            Call::Delete,
            "rate-limited 1000",
        );
        check(
            413,
            &[],
            "<html>Request Entity Too Large</html>",
            Call::Create,
            "permanent",
        );
        let keystone = r#"{"error": {"code": 401, "title": "Unauthorized", "message": "The request you have made requires authentication."}}"#;
        check(
            401,
            &[],
            keystone,
            Call::List { cursor: false },
            "unauthorized",
        );
        let gone = nova("itemNotFound", 404, "Instance x could not be found.");
        for call in [Call::Server, Call::Delete, Call::SetTags] {
            check(404, &[], &gone, call, "not-found");
        }
        check(404, &[], "", Call::List { cursor: false }, "permanent");
        check(404, &[], "", Call::Create, "permanent");
        let marker = nova("badRequest", 400, "marker [x] not found");
        check(400, &[], &marker, Call::List { cursor: true }, "transient");
        check(400, &[], &marker, Call::List { cursor: false }, "permanent");
        for said in [
            "Flavor 42 could not be found.",
            "Invalid flavorRef provided.",
            "Can not find requested image",
            "Invalid key_name provided.",
            "Network 3cb9 could not be found.",
            "Security group web not found.",
            "The requested availability zone is not available",
        ] {
            check(
                400,
                &[],
                &nova("badRequest", 400, said),
                Call::Create,
                "invalid-config",
            );
        }
        check(
            400,
            &[],
            &nova("badRequest", 400, "Invalid input for field/attribute name."),
            Call::Create,
            "permanent",
        );
        let building = "Cannot 'update metadata' instance x while it is in vm_state building";
        check(
            409,
            &[],
            &nova("conflictingRequest", 409, building),
            Call::SetTags,
            "transient",
        );
        check(
            409,
            &[],
            &nova("conflictingRequest", 409, building),
            Call::Server,
            "transient",
        );
        let spawning = "Cannot 'update metadata' instance x while it is in task_state spawning";
        check(
            409,
            &[],
            &nova("conflictingRequest", 409, spawning),
            Call::SetTags,
            "transient",
        );
        let deleting = "Cannot 'update metadata' instance x while it is in task_state deleting";
        check(
            409,
            &[],
            &nova("conflictingRequest", 409, deleting),
            Call::SetTags,
            "not-found",
        );
        let error = "Cannot 'update metadata' instance x while it is in vm_state error";
        check(
            409,
            &[],
            &nova("conflictingRequest", 409, error),
            Call::SetTags,
            "permanent",
        );
        check(
            409,
            &[],
            &nova("conflictingRequest", 409, "Instance x is locked"),
            Call::Delete,
            "permanent",
        );
        check(
            409,
            &[],
            &nova(
                "conflictingRequest",
                409,
                "More than one possible network found. Specify network ID(s) to select which one(s) to connect to.",
            ),
            Call::Create,
            "invalid-config",
        );
        check(
            406,
            &[],
            &nova(
                "computeFault",
                406,
                "Version 2.38 is not supported by the API.",
            ),
            Call::Create,
            "permanent",
        );
        check(
            503,
            &[],
            &nova("serverCapacityUnavailable", 503, "no room"),
            Call::Create,
            "capacity 2",
        );
        check(
            503,
            &[],
            &nova("serviceUnavailable", 503, "try later"),
            Call::Create,
            "transient",
        );
        check(
            500,
            &[],
            &nova("computeFault", 500, "Unexpected API Error."),
            Call::SetTags,
            "transient",
        );
        check(
            502,
            &[],
            "<html>Bad Gateway</html>",
            Call::Delete,
            "transient",
        );
        check(418, &[], "", Call::Delete, "permanent");
    }

    #[test]
    fn messages_carry_the_fault_and_the_request_id() {
        let e = from_response(
            &resp(
                404,
                &[("x-compute-request-id", "req-1")],
                &nova("itemNotFound", 404, "Instance x could not be found."),
            ),
            Call::Server,
            None,
        );
        assert!(
            matches!(&e, Error::NotFound(m) if m == "Nova answered 404 itemNotFound: Instance x could not be found. (request id req-1)"),
            "{e:?}"
        );
        let e = from_response(
            &resp(502, &[], "<html>bad gateway</html>"),
            Call::Delete,
            None,
        );
        assert!(
            matches!(&e, Error::Transient(m) if m == "Nova answered 502: <html>bad gateway</html>"),
            "{e:?}"
        );
        assert_eq!(fault(b"[1]"), None);
        assert_eq!(fault(b"{\"a\": 1}"), None);
    }
}
