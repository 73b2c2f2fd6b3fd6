//! Hetzner Cloud's answers: its error body mapped to the contract's error
//! cases, and a server object read as an instance. Everything here comes
//! from the network and is checked, never trusted.

use berth_sdk::error;
use berth_sdk::http::Response;
use berth_sdk::tags::{decode_label, is_berth_tag};
use berth_sdk::types::{Addresses, Connection, Error, Instance, InstanceState};
use serde_json::Value;

/// The longest error text kept from an answer.
const MAX_MESSAGE: usize = 300;

/// The error code and message of an error answer, if it has Hetzner's body.
pub(crate) fn error_code(resp: &Response) -> Option<(String, String)> {
    let body: Value = serde_json::from_slice(&resp.body).ok()?;
    let e = body.get("error")?;
    let code = e.get("code")?.as_str()?.to_owned();
    let message = e.get("message").and_then(Value::as_str).unwrap_or("");
    Some((code, clip(message)))
}

fn clip(text: &str) -> String {
    let mut out: String = text
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_MESSAGE)
        .collect();
    if text.chars().count() > MAX_MESSAGE {
        out.push('…');
    }
    out
}

/// How long to wait after a `429`: the `Retry-After` seconds if the answer
/// has them, else the time the bucket takes to refill one request
/// (`3600 / RateLimit-Limit` seconds), at least a second.
pub(crate) fn retry_after_ms(resp: &Response) -> u64 {
    if let Some(secs) = (resp.header("retry-after")).and_then(|v| v.trim().parse::<u64>().ok()) {
        return secs.clamp(1, 3600) * 1000;
    }
    let per_hour = (resp.header("ratelimit-limit"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(3600);
    (3_600_000 / per_hour).clamp(1000, 3_600_000)
}

/// The contract's error for a non-2xx answer. `server_type` names what a
/// create asked for, for capacity errors.
pub(crate) fn from_response(resp: &Response, server_type: Option<&str>) -> Error {
    let Some((code, message)) = error_code(resp) else {
        let text = clip(&resp.text());
        return error::from_status(
            resp.status,
            resp.header("retry-after"),
            format!("Hetzner answered {}: {text}", resp.status),
        );
    };
    let said = format!("{code}: {message}");
    match code.as_str() {
        "rate_limit_exceeded" => error::rate_limited(retry_after_ms(resp), said),
        "unauthorized" | "forbidden" | "token_readonly" => error::unauthorized(said),
        "resource_limit_exceeded" => error::quota_exceeded(said),
        "resource_unavailable" => match server_type {
            Some(t) => error::capacity_for_type(t, said),
            None => error::capacity_general(said),
        },
        "placement_error" => error::capacity_general(said),
        "not_found" => error::not_found(said),
        "locked" | "conflict" | "server_error" | "service_error" | "maintenance"
        | "unavailable" | "timeout" | "robot_unavailable" => error::transient(said),
        "invalid_input"
        | "json_error"
        | "uniqueness_error"
        | "protected"
        | "unsupported_error"
        | "deprecated_api_endpoint"
        | "invalid_server_type" => error::permanent(said),
        _ => error::from_status(resp.status, resp.header("retry-after"), said),
    }
}

/// A server's status as an instance state.
pub(crate) fn state(status: &str) -> InstanceState {
    match status {
        "initializing" | "starting" | "rebuilding" => InstanceState::Pending,
        "running" | "migrating" => InstanceState::Running,
        // An `off` server runs nothing; berth does not start machines again.
        "stopping" | "off" | "deleting" => InstanceState::Stopping,
        _ => InstanceState::Unknown,
    }
}

/// A label map as tags: berth's values decoded (they were stored through
/// the label encoding), others as they are. A berth label that does not
/// decode was not written by a berth driver; it is kept as it is, and the
/// host judges it.
pub(crate) fn tags_of(labels: Option<&Value>) -> Vec<(String, String)> {
    let Some(map) = labels.and_then(Value::as_object) else {
        return Vec::new();
    };
    map.iter()
        .filter_map(|(k, v)| Some((k, v.as_str()?)))
        .map(|(k, v)| {
            let value = if is_berth_tag(k) {
                decode_label(v).unwrap_or_else(|| v.to_owned())
            } else {
                v.to_owned()
            };
            (k.clone(), value)
        })
        .collect()
}

/// A server object (`{"id": …, "name": …, "status": …}`) as an instance;
/// an error names what is missing.
pub(crate) fn instance(server: &Value) -> Result<Instance, String> {
    let id = server
        .get("id")
        .and_then(Value::as_u64)
        .ok_or("a server without a numeric id")?;
    let status = server
        .get("status")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("server {id} without a status"))?;
    let text = |path: &[&str]| -> Option<String> {
        let mut v = server;
        for key in path {
            v = v.get(key)?;
        }
        v.as_str().map(str::to_owned).filter(|s| !s.is_empty())
    };
    let private = (server.get("private_net").and_then(Value::as_array))
        .and_then(|nets| nets.iter().find_map(|n| n.get("ip")?.as_str()))
        .map(str::to_owned);
    Ok(Instance {
        id: id.to_string(),
        state: state(status),
        instance_type: text(&["server_type", "name"]).unwrap_or_default(),
        tags: tags_of(server.get("labels")),
        addresses: Addresses {
            public_ipv4: text(&["public_net", "ipv4", "ip"]),
            private_ipv4: private,
            ipv6: text(&["public_net", "ipv6", "ip"]).and_then(|net| first_address(&net)),
            hostname: None,
        },
        created_at_ms: text(&["created"]).and_then(|t| berth_sdk::time::parse_ms(&t)),
        connection: Connection {
            username: Some("root".into()),
            port: Some(22),
            host_keys: Vec::new(),
        },
    })
}

/// A server's IPv6 address: Hetzner gives the server a /64 network
/// (`2001:db8:1::/64`), whose `::1` is the server's own address.
fn first_address(network: &str) -> Option<String> {
    let prefix = network.strip_suffix("/64")?;
    let prefix = prefix.strip_suffix("::").unwrap_or(prefix);
    let groups: Vec<&str> = prefix.split(':').collect();
    (groups.len() <= 4
        && groups
            .iter()
            .all(|g| g.len() <= 4 && u16::from_str_radix(g, 16).is_ok()))
    .then(|| format!("{prefix}::1"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn resp(status: u16, headers: &[(&str, &str)], body: &Value) -> Response {
        Response {
            status,
            headers: (headers.iter())
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            body: body.to_string().into_bytes(),
        }
    }

    fn err(code: &str) -> Value {
        json!({"error": {"code": code, "message": "m", "details": null}})
    }

    #[test]
    fn codes_map_to_cases() {
        let case = |status, code: &str| match from_response(
            &resp(status, &[], &err(code)),
            Some("cx22"),
        ) {
            Error::RateLimited(r) => format!("rate-limited {}", r.retry_after_ms),
            Error::QuotaExceeded(_) => "quota".into(),
            Error::Capacity(_) => "capacity".into(),
            Error::NotFound(_) => "not-found".into(),
            Error::Unauthorized(_) => "unauthorized".into(),
            Error::Transient(_) => "transient".into(),
            Error::Permanent(_) => "permanent".into(),
            Error::InvalidConfig(_) => "invalid-config".into(),
        };
        assert_eq!(case(429, "rate_limit_exceeded"), "rate-limited 1000");
        assert_eq!(case(401, "unauthorized"), "unauthorized");
        assert_eq!(case(403, "forbidden"), "unauthorized");
        assert_eq!(case(403, "resource_limit_exceeded"), "quota");
        assert_eq!(case(412, "resource_unavailable"), "capacity");
        assert_eq!(case(404, "not_found"), "not-found");
        assert_eq!(case(423, "locked"), "transient");
        assert_eq!(case(503, "maintenance"), "transient");
        assert_eq!(case(400, "invalid_input"), "permanent");
        // A code of tomorrow falls back on the status.
        assert_eq!(case(503, "brand_new"), "transient");
        // Not Hetzner's body at all: a proxy's page.
        let page = Response {
            status: 502,
            headers: vec![],
            body: b"<html>bad gateway</html>".to_vec(),
        };
        assert!(matches!(from_response(&page, None), Error::Transient(m) if m.contains("502")));
    }

    #[test]
    fn rate_limits_wait_for_one_request_to_come_back() {
        let r = |h: &[(&str, &str)]| retry_after_ms(&resp(429, h, &err("rate_limit_exceeded")));
        assert_eq!(r(&[]), 1000);
        assert_eq!(r(&[("ratelimit-limit", "360")]), 10_000);
        assert_eq!(r(&[("ratelimit-limit", "7200")]), 1000);
        assert_eq!(r(&[("retry-after", "4"), ("ratelimit-limit", "360")]), 4000);
        assert_eq!(r(&[("ratelimit-limit", "0")]), 1000);
    }

    #[test]
    fn a_server_reads_as_an_instance() {
        let server = json!({
            "id": 42, "name": "n-1", "status": "running", "created": "2016-01-30T23:55:00+00:00",
            "server_type": {"name": "cx22"},
            "public_net": {"ipv4": {"ip": "203.0.113.1"}, "ipv6": {"ip": "2001:db8:1::/64"}},
            "private_net": [{"ip": "10.0.0.2"}],
            "labels": {"berth-pool": "z4dyz2epool", "team": "Web.Dev", "berth-x": "Not-Encoded"},
        });
        let i = instance(&server).expect("reads");
        assert_eq!(i.id, "42");
        assert_eq!(i.state, InstanceState::Running);
        assert_eq!(i.instance_type, "cx22");
        assert_eq!(i.addresses.public_ipv4.as_deref(), Some("203.0.113.1"));
        assert_eq!(i.addresses.private_ipv4.as_deref(), Some("10.0.0.2"));
        assert_eq!(i.addresses.ipv6.as_deref(), Some("2001:db8:1::1"));
        assert_eq!(i.created_at_ms, Some(1_454_198_100_000));
        let tag = |k: &str| berth_sdk::tags::tag(&i.tags, k).map(str::to_owned);
        assert_eq!(tag("berth-pool").as_deref(), Some("My.pool"));
        assert_eq!(tag("team").as_deref(), Some("Web.Dev"));
        assert_eq!(tag("berth-x").as_deref(), Some("Not-Encoded"));
        assert!(instance(&json!({"name": "x"})).is_err());
        assert!(instance(&json!({"id": 1})).is_err());
    }

    #[test]
    fn states() {
        for (status, want) in [
            ("initializing", InstanceState::Pending),
            ("starting", InstanceState::Pending),
            ("running", InstanceState::Running),
            ("stopping", InstanceState::Stopping),
            ("off", InstanceState::Stopping),
            ("deleting", InstanceState::Stopping),
            ("unknown", InstanceState::Unknown),
            ("", InstanceState::Unknown),
        ] {
            assert_eq!(state(status), want, "{status}");
        }
    }
}
