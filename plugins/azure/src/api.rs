//! Azure Resource Manager's answers: its error body mapped to the
//! contract's cases, and a virtual machine read as an instance. Everything
//! here comes from the network and is checked, never trusted.

use berth_sdk::error;
use berth_sdk::http::Response;
use berth_sdk::types::{Addresses, Connection, Error, Instance, InstanceState};
use serde_json::Value;

/// The longest error text kept from an answer.
const MAX_MESSAGE: usize = 400;
/// How long to wait after a `429` that names no `Retry-After`.
const DEFAULT_RETRY_MS: u64 = 10_000;

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

/// The code and message of an ARM error body.
pub(crate) fn error_code(body: &[u8]) -> Option<(String, String)> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let e = v.get("error")?;
    let code = e.get("code")?.as_str()?.to_owned();
    let message = e.get("message").and_then(Value::as_str).unwrap_or("");
    Some((code, clip(message)))
}

/// The contract's error for ARM's `code` and `message` (of an answer or of
/// a failed operation). `size` names what a create asked for.
pub(crate) fn from_code(code: &str, message: &str, size: Option<&str>) -> Option<Error> {
    let said = format!("{code}: {message}");
    let lower = message.to_ascii_lowercase();
    Some(match code {
        "TooManyRequests" => error::rate_limited(DEFAULT_RETRY_MS, said),
        "InvalidAuthenticationToken"
        | "ExpiredAuthenticationToken"
        | "AuthenticationFailed"
        | "AuthorizationFailed"
        | "LinkedAuthorizationFailed" => error::unauthorized(said),
        "QuotaExceeded" | "OperationNotAllowed" if lower.contains("quota") => {
            error::quota_exceeded(said)
        }
        "SkuNotAvailable" => match size {
            Some(s) => error::capacity_for_type(s, said),
            None => error::capacity_general(said),
        },
        "AllocationFailed"
        | "ZonalAllocationFailed"
        | "OverconstrainedAllocationRequest"
        | "OverconstrainedZonalAllocationRequest" => error::capacity_general(said),
        "ResourceNotFound" | "NotFound" => error::not_found(said),
        "ResourceGroupNotFound"
        | "SubscriptionNotFound"
        | "InvalidSubscriptionId"
        | "LocationNotAvailableForResourceType" => error::invalid_config(said),
        "Conflict"
        | "AnotherOperationInProgress"
        | "OperationNotAllowed"
        | "RetryableError"
        | "InternalServerError"
        | "InternalOperationError"
        | "ServiceUnavailable"
        | "GatewayTimeout"
        | "OSProvisioningTimedOut" => error::transient(said),
        "InvalidParameter"
        | "InvalidRequestContent"
        | "InvalidRequestFormat"
        | "InvalidTag"
        | "InvalidTagNameCharacters"
        | "PropertyChangeNotAllowed"
        | "LocationRequired"
        | "MissingApiVersionParameter"
        | "ImageNotFound"
        | "PlatformImageNotFound"
        | "BadRequest" => error::permanent(said),
        _ => return None,
    })
}

/// How long to wait after a `429`: `Retry-After` seconds, else ten.
pub(crate) fn retry_after_ms(resp: &Response) -> u64 {
    (resp.header("retry-after"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(DEFAULT_RETRY_MS, |s| s.clamp(1, 3600) * 1000)
}

/// Below this many requests left in a budget, the driver says so.
const LOW_BUDGET: u64 = 10;

/// The budget an answer says is nearly spent (`x-ms-ratelimit-remaining-*`,
/// per subscription or per Compute resource policy), and what is left.
pub(crate) fn low_budget(resp: &Response) -> Option<(&str, u64)> {
    resp.headers.iter().find_map(|(name, value)| {
        let budget = name.strip_prefix("x-ms-ratelimit-remaining-")?;
        // `…-resource` reads `Policy;N,Policy;N`; the others a count.
        let left = (value
            .split(',')
            .filter_map(|part| part.rsplit(';').next()?.trim().parse().ok()))
        .min()?;
        (left < LOW_BUDGET).then_some((budget, left))
    })
}

/// The contract's error for a non-2xx answer.
pub(crate) fn from_response(resp: &Response, size: Option<&str>) -> Error {
    if resp.status == 429 {
        let said = error_code(&resp.body).map_or_else(
            || "429 Too Many Requests".to_owned(),
            |(c, m)| format!("{c}: {m}"),
        );
        return error::rate_limited(retry_after_ms(resp), said);
    }
    match error_code(&resp.body) {
        Some((code, message)) => from_code(&code, &message, size)
            .unwrap_or_else(|| error::from_status(resp.status, None, format!("{code}: {message}"))),
        None => error::from_status(
            resp.status,
            resp.header("retry-after"),
            format!("ARM answered {}: {}", resp.status, clip(&resp.text())),
        ),
    }
}

/// Why a VM failed, from its instance view's error status if the answer
/// has one.
fn failure(props: &Value) -> String {
    (props
        .pointer("/instanceView/statuses")
        .and_then(Value::as_array))
    .and_then(|statuses| {
        statuses.iter().find(|s| {
            s.get("level").and_then(Value::as_str) == Some("Error")
                || (s.get("code").and_then(Value::as_str))
                    .is_some_and(|c| c.starts_with("ProvisioningState/failed"))
        })
    })
    .map(|s| {
        let code = s.get("code").and_then(Value::as_str).unwrap_or("");
        let message = (s.get("message").or_else(|| s.get("displayStatus")))
            .and_then(Value::as_str)
            .unwrap_or("");
        clip(&format!(
            "{}: {message}",
            code.trim_start_matches("ProvisioningState/failed/")
        ))
    })
    .unwrap_or_else(|| "provisioning failed".to_owned())
}

/// A VM's state from its provisioning state and, when the answer has its
/// instance view, its power state.
pub(crate) fn state(props: &Value) -> InstanceState {
    let provisioning = (props.get("provisioningState").and_then(Value::as_str)).unwrap_or("");
    match provisioning {
        "Creating" | "Updating" | "Migrating" => InstanceState::Pending,
        "Deleting" => InstanceState::Stopping,
        "Failed" | "Canceled" => InstanceState::Failed(failure(props)),
        "Succeeded" => {
            let power = (props
                .pointer("/instanceView/statuses")
                .and_then(Value::as_array))
            .and_then(|s| {
                s.iter()
                    .filter_map(|st| st.get("code")?.as_str())
                    .find(|c| c.starts_with("PowerState/"))
            });
            match power {
                None | Some("PowerState/running" | "PowerState/starting") => InstanceState::Running,
                Some(
                    "PowerState/stopping"
                    | "PowerState/stopped"
                    | "PowerState/deallocating"
                    | "PowerState/deallocated",
                ) => InstanceState::Stopping,
                Some(_) => InstanceState::Unknown,
            }
        }
        _ => InstanceState::Unknown,
    }
}

/// The ARM id of a VM's primary (first) network interface.
pub(crate) fn nic_id(vm: &Value) -> Option<&str> {
    vm.pointer("/properties/networkProfile/networkInterfaces/0/id")
        .and_then(Value::as_str)
        .filter(|id| id.starts_with("/subscriptions/") && !id.contains(['?', '#']))
}

/// A VM as an instance, with the addresses learnt from its network
/// interface (Azure keeps them there, not on the VM).
pub(crate) fn instance(vm: &Value, addresses: Addresses) -> Result<Instance, String> {
    let name = (vm.get("name").and_then(Value::as_str))
        .filter(|n| !n.is_empty())
        .ok_or("a virtual machine without a name")?;
    let props = vm
        .get("properties")
        .ok_or_else(|| format!("virtual machine {name} without properties"))?;
    let tags = (vm.get("tags").and_then(Value::as_object))
        .map(|t| {
            t.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default();
    let username = (props
        .pointer("/osProfile/adminUsername")
        .and_then(Value::as_str))
    .map(str::to_owned);
    Ok(Instance {
        id: name.to_owned(),
        state: state(props),
        instance_type: (props
            .pointer("/hardwareProfile/vmSize")
            .and_then(Value::as_str))
        .unwrap_or_default()
        .to_owned(),
        tags,
        addresses,
        created_at_ms: (props.get("timeCreated").and_then(Value::as_str))
            .and_then(berth_sdk::time::parse_ms),
        connection: Connection {
            username,
            port: Some(22),
            host_keys: Vec::new(),
        },
    })
}

/// The private and public addresses of a network interface, and the ARM id
/// of its public IP address if it has one (whose address is asked apart).
pub(crate) fn nic_addresses(nic: &Value) -> (Option<String>, Option<String>) {
    let config = nic.pointer("/properties/ipConfigurations/0/properties");
    let private = config
        .and_then(|c| c.get("privateIPAddress")?.as_str())
        .filter(|ip| ip.parse::<std::net::Ipv4Addr>().is_ok())
        .map(str::to_owned);
    let pip = config
        .and_then(|c| c.pointer("/publicIPAddress/id")?.as_str())
        .filter(|id| id.starts_with("/subscriptions/") && !id.contains(['?', '#']))
        .map(str::to_owned);
    (private, pip)
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

    fn case(status: u16, code: &str, message: &str) -> String {
        let body = json!({"error": {"code": code, "message": message}});
        match from_response(
            &resp(status, &[("retry-after", "7")], &body),
            Some("Standard_B2s"),
        ) {
            Error::RateLimited(r) => format!("rate-limited {}", r.retry_after_ms),
            Error::QuotaExceeded(_) => "quota".into(),
            Error::Capacity(_) => "capacity".into(),
            Error::NotFound(_) => "not-found".into(),
            Error::Unauthorized(_) => "unauthorized".into(),
            Error::Transient(_) => "transient".into(),
            Error::Permanent(_) => "permanent".into(),
            Error::InvalidConfig(_) => "invalid-config".into(),
        }
    }

    #[test]
    fn codes_map_to_cases() {
        assert_eq!(case(429, "TooManyRequests", "slow"), "rate-limited 7000");
        assert_eq!(case(401, "ExpiredAuthenticationToken", "x"), "unauthorized");
        assert_eq!(case(403, "AuthorizationFailed", "x"), "unauthorized");
        assert_eq!(
            case(
                409,
                "OperationNotAllowed",
                "exceeding approved Total Regional Cores quota"
            ),
            "quota"
        );
        assert_eq!(
            case(409, "OperationNotAllowed", "VM is marked for deletion"),
            "transient"
        );
        assert_eq!(case(409, "SkuNotAvailable", "x"), "capacity");
        assert_eq!(case(404, "ResourceNotFound", "x"), "not-found");
        assert_eq!(case(404, "ResourceGroupNotFound", "x"), "invalid-config");
        assert_eq!(case(400, "InvalidParameter", "x"), "permanent");
        assert_eq!(case(503, "SomethingNew", "x"), "transient");
        let page = Response {
            status: 502,
            headers: vec![],
            body: b"<html>".to_vec(),
        };
        assert!(matches!(from_response(&page, None), Error::Transient(_)));
        let bare = Response {
            status: 429,
            headers: vec![],
            body: vec![],
        };
        assert!(
            matches!(from_response(&bare, None), Error::RateLimited(r) if r.retry_after_ms == 10_000)
        );
    }

    #[test]
    fn low_budgets_are_noticed() {
        let r = |h: &[(&str, &str)]| resp(200, h, &json!({}));
        let low = r(&[("x-ms-ratelimit-remaining-subscription-writes", "3")]);
        assert_eq!(low_budget(&low), Some(("subscription-writes", 3)));
        let fine = r(&[("x-ms-ratelimit-remaining-subscription-reads", "11999")]);
        assert_eq!(low_budget(&fine), None);
        let policy = r(&[(
            "x-ms-ratelimit-remaining-resource",
            "Microsoft.Compute/PutVM3Min;2,Microsoft.Compute/PutVM30Min;300",
        )]);
        assert_eq!(low_budget(&policy), Some(("resource", 2)));
        assert_eq!(
            low_budget(&r(&[("x-ms-ratelimit-remaining-resource", "junk")])),
            None
        );
    }

    #[test]
    fn states_and_failures() {
        let p = |v: Value| state(&v);
        assert_eq!(
            p(json!({"provisioningState": "Creating"})),
            InstanceState::Pending
        );
        assert_eq!(
            p(json!({"provisioningState": "Succeeded"})),
            InstanceState::Running
        );
        assert_eq!(
            p(json!({"provisioningState": "Deleting"})),
            InstanceState::Stopping
        );
        assert_eq!(
            p(
                json!({"provisioningState": "Succeeded", "instanceView": {"statuses": [
                {"code": "ProvisioningState/succeeded"}, {"code": "PowerState/deallocated"}]}})
            ),
            InstanceState::Stopping
        );
        assert_eq!(
            p(
                json!({"provisioningState": "Failed", "instanceView": {"statuses": [
                {"code": "ProvisioningState/failed/AllocationFailed", "level": "Error",
                 "message": "Allocation failed."}]}})
            ),
            InstanceState::Failed("AllocationFailed: Allocation failed.".into())
        );
        assert_eq!(
            p(json!({"provisioningState": "Failed"})),
            InstanceState::Failed("provisioning failed".into())
        );
        assert_eq!(p(json!({})), InstanceState::Unknown);
    }

    #[test]
    fn a_vm_reads_as_an_instance() {
        let vm = json!({"name": "n-1", "tags": {"berth-pool": "p", "n": 1},
            "properties": {"provisioningState": "Succeeded", "timeCreated": "2026-01-30T23:55:00.1234567+00:00",
              "hardwareProfile": {"vmSize": "Standard_B2s"}, "osProfile": {"adminUsername": "berth"},
              "networkProfile": {"networkInterfaces": [{"id": "/subscriptions/s/x/nic"}]}}});
        let i = instance(&vm, Addresses::default()).expect("reads");
        assert_eq!(
            (i.id.as_str(), i.instance_type.as_str()),
            ("n-1", "Standard_B2s")
        );
        assert_eq!(i.tags, vec![("berth-pool".to_owned(), "p".to_owned())]);
        assert_eq!(i.connection.username.as_deref(), Some("berth"));
        assert!(i.created_at_ms.is_some());
        assert_eq!(nic_id(&vm), Some("/subscriptions/s/x/nic"));
        assert!(instance(&json!({"properties": {}}), Addresses::default()).is_err());
        let nic = json!({"properties": {"ipConfigurations": [{"properties": {
            "privateIPAddress": "10.0.0.4", "publicIPAddress": {"id": "/subscriptions/s/pip"}}}]}});
        assert_eq!(
            nic_addresses(&nic),
            (Some("10.0.0.4".into()), Some("/subscriptions/s/pip".into()))
        );
        let odd = json!({"properties": {"ipConfigurations": [{"properties": {
            "privateIPAddress": "not an ip", "publicIPAddress": {"id": "https://elsewhere"}}}]}});
        assert_eq!(nic_addresses(&odd), (None, None));
    }
}
