//! Compute Engine's resources as the driver reads them: an instance
//! (`compute#instance`) into the contract's, and an operation
//! (`compute#operation`). Everything here is untrusted: a field missing
//! or of another type is an error naming it, never a panic.

use std::collections::BTreeMap;

use berth_sdk::types::{Addresses, Connection, Instance, InstanceState};
use serde_json::Value;

use crate::errors::OpError;
use crate::names::tag_of;

/// An instance as the API shows it, with what the driver needs of it.
#[derive(Clone, Debug)]
pub(crate) struct ApiInstance {
    pub name: String,
    pub status: String,
    pub status_message: Option<String>,
    /// The machine type's short name (the last part of its URL).
    pub machine_type: String,
    /// The labels as stored (berth's values encoded).
    pub labels: BTreeMap<String, String>,
    pub label_fingerprint: String,
    pub created_at_ms: Option<u64>,
    pub private_ipv4: Option<String>,
    pub public_ipv4: Option<String>,
    pub ipv6: Option<String>,
    /// The login of the first `ssh-keys` metadata entry.
    pub ssh_user: Option<String>,
}

fn opt_str(v: &Value, what: &str) -> Result<Option<String>, String> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        other => Err(format!("{what} is not a string: {other}")),
    }
}

/// Reads one item of `instances.get` or `list`.
pub(crate) fn instance(v: &Value) -> Result<ApiInstance, String> {
    if !v.is_object() {
        return Err(format!("an instance is not a JSON object: {v}"));
    }
    let name = opt_str(&v["name"], "name")?.ok_or("an instance has no name")?;
    let at = |what: &str| format!("instance {name}: {what}");
    let status = opt_str(&v["status"], &at("status"))?.unwrap_or_default();
    let status_message = opt_str(&v["statusMessage"], &at("statusMessage"))?;
    let machine_type = opt_str(&v["machineType"], &at("machineType"))?
        .map(|t| t.rsplit('/').next().unwrap_or_default().to_owned())
        .unwrap_or_default();
    let mut labels = BTreeMap::new();
    match &v["labels"] {
        Value::Null => {}
        Value::Object(m) => {
            for (k, val) in m {
                let val = val
                    .as_str()
                    .ok_or_else(|| at(&format!("label {k} is not a string")))?;
                labels.insert(k.clone(), val.to_owned());
            }
        }
        other => return Err(at(&format!("labels are not an object: {other}"))),
    }
    let label_fingerprint =
        opt_str(&v["labelFingerprint"], &at("labelFingerprint"))?.unwrap_or_default();
    let created_at_ms = opt_str(&v["creationTimestamp"], &at("creationTimestamp"))?
        .and_then(|t| berth_sdk::time::parse_ms(&t));
    let nic = &v["networkInterfaces"][0];
    let private_ipv4 = opt_str(&nic["networkIP"], &at("networkIP"))?;
    let public_ipv4 = opt_str(&nic["accessConfigs"][0]["natIP"], &at("natIP"))?;
    let ipv6 = match opt_str(
        &nic["ipv6AccessConfigs"][0]["externalIpv6"],
        &at("externalIpv6"),
    )? {
        Some(a) => Some(a),
        None => opt_str(&nic["ipv6Address"], &at("ipv6Address"))?,
    };
    let ssh_user = (v["metadata"]["items"].as_array().into_iter().flatten())
        .find(|i| i["key"] == "ssh-keys")
        .and_then(|i| i["value"].as_str())
        .and_then(|keys| keys.lines().next())
        .and_then(|line| line.split_once(':'))
        .map(|(user, _)| user.to_owned())
        .filter(|u| !u.is_empty());
    Ok(ApiInstance {
        name,
        status,
        status_message,
        machine_type,
        labels,
        label_fingerprint,
        created_at_ms,
        private_ipv4,
        public_ipv4,
        ipv6,
        ssh_user,
    })
}

/// The contract's state for an instance `status`.
///
/// `TERMINATED` is a stopped instance: one that shut itself down, was
/// preempted, or failed to start. It keeps its disks (and their cost) and
/// never runs again unless started, which berth never does: it is
/// `failed`, with GCE's `statusMessage` as the reason, so that berth
/// deletes it. `SUSPENDED` likewise. A deleted instance is never
/// `TERMINATED` for long: it is gone (the API answers `404`).
pub(crate) fn state(status: &str, message: Option<&str>) -> InstanceState {
    match status {
        "PENDING" | "PROVISIONING" | "STAGING" => InstanceState::Pending,
        "RUNNING" => InstanceState::Running,
        "PENDING_STOP" | "STOPPING" | "SUSPENDING" => InstanceState::Stopping,
        "TERMINATED" | "SUSPENDED" => {
            let why = match message.map(str::trim).filter(|m| !m.is_empty()) {
                Some(m) => format!("GCE reports the instance {status}: {m}"),
                None => format!(
                    "GCE reports the instance {status} (stopped: shut down from inside, preempted, \
                     or it failed to start); it will not run again"
                ),
            };
            InstanceState::Failed(why)
        }
        _ => InstanceState::Unknown,
    }
}

impl ApiInstance {
    /// The contract's instance, berth's label values decoded; `hostname`
    /// the zonal internal DNS name when it is known.
    pub(crate) fn to_instance(&self, hostname: Option<String>) -> Instance {
        Instance {
            id: self.name.clone(),
            state: state(&self.status, self.status_message.as_deref()),
            instance_type: self.machine_type.clone(),
            tags: self.labels.iter().map(|(k, v)| tag_of(k, v)).collect(),
            addresses: Addresses {
                public_ipv4: self.public_ipv4.clone(),
                private_ipv4: self.private_ipv4.clone(),
                ipv6: self.ipv6.clone(),
                hostname,
            },
            created_at_ms: self.created_at_ms,
            connection: Connection {
                username: self.ssh_user.clone(),
                port: None,
                host_keys: vec![],
            },
        }
    }
}

/// An operation as the driver needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Operation {
    pub name: String,
    pub status: String,
    pub errors: Vec<OpError>,
    pub http_status: Option<u16>,
    pub insert_ms: Option<u64>,
}

impl Operation {
    pub(crate) fn done(&self) -> bool {
        self.status == "DONE"
    }
}

/// Reads a `compute#operation`.
pub(crate) fn operation(v: &Value) -> Result<Operation, String> {
    let name = opt_str(&v["name"], "operation name")?.ok_or("an operation has no name")?;
    let status = opt_str(&v["status"], "operation status")?.unwrap_or_default();
    let mut errors = Vec::new();
    for e in v["error"]["errors"].as_array().into_iter().flatten() {
        errors.push(OpError {
            code: e["code"].as_str().unwrap_or("UNKNOWN").to_owned(),
            message: e["message"].as_str().unwrap_or_default().to_owned(),
        });
    }
    if errors.is_empty() && v["error"].is_object() {
        errors.push(OpError {
            code: "UNKNOWN".into(),
            message: v["error"].to_string(),
        });
    }
    let http_status = v["httpErrorStatusCode"]
        .as_u64()
        .and_then(|s| u16::try_from(s).ok());
    let insert_ms =
        opt_str(&v["insertTime"], "insertTime")?.and_then(|t| berth_sdk::time::parse_ms(&t));
    Ok(Operation {
        name,
        status,
        errors,
        http_status,
        insert_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_an_instance_as_the_api_shows_it() {
        let v = json!({
            "kind": "compute#instance",
            "id": "6100000000000000001",
            "name": "n-00000000000000ab-1a2b3c4d",
            "creationTimestamp": "2024-05-01T05:34:56.789-07:00",
            "machineType": "https://www.googleapis.com/compute/v1/projects/p/zones/us-central1-a/machineTypes/e2-small",
            "status": "RUNNING",
            "labels": {"berth-pool": "z4dyz2epool", "env": "ci"},
            "labelFingerprint": "42WmSpB8rSM=",
            "networkInterfaces": [{"networkIP": "10.128.0.5",
                "accessConfigs": [{"natIP": "34.1.2.3"}]}],
            "metadata": {"items": [{"key": "ssh-keys", "value": "ci:ssh-ed25519 AAAA k\nother:ssh-rsa B"}]},
        });
        let i = instance(&v).expect("reads");
        assert_eq!(i.machine_type, "e2-small");
        assert_eq!(i.ssh_user.as_deref(), Some("ci"));
        let c = i.to_instance(Some("h".into()));
        assert_eq!(c.id, "n-00000000000000ab-1a2b3c4d");
        assert_eq!(c.state, InstanceState::Running);
        assert_eq!(c.created_at_ms, Some(1_714_566_896_789));
        assert_eq!(c.addresses.public_ipv4.as_deref(), Some("34.1.2.3"));
        assert_eq!(c.addresses.private_ipv4.as_deref(), Some("10.128.0.5"));
        assert!(c.tags.contains(&("berth-pool".into(), "My.pool".into())));
        assert!(c.tags.contains(&("env".into(), "ci".into())));
    }

    #[test]
    fn bad_instances_are_errors_naming_the_field() {
        for (v, needle) in [
            (json!([]), "not a JSON object"),
            (json!({"status": "RUNNING"}), "no name"),
            (json!({"name": 3}), "name is not a string"),
            (
                json!({"name": "a", "labels": {"k": 1}}),
                "label k is not a string",
            ),
            (
                json!({"name": "a", "labels": []}),
                "labels are not an object",
            ),
            (
                json!({"name": "a", "networkInterfaces": [{"networkIP": 10}]}),
                "networkIP",
            ),
        ] {
            match instance(&v) {
                Err(m) => assert!(m.contains(needle), "{v}: {m}"),
                Ok(i) => panic!("{v}: read as {i:?}"),
            }
        }
    }

    #[test]
    fn states() {
        for (status, want) in [
            ("PROVISIONING", InstanceState::Pending),
            ("STAGING", InstanceState::Pending),
            ("RUNNING", InstanceState::Running),
            ("STOPPING", InstanceState::Stopping),
            ("SUSPENDING", InstanceState::Stopping),
            ("REPAIRING", InstanceState::Unknown),
            ("SOMETHING", InstanceState::Unknown),
        ] {
            assert_eq!(state(status, None), want, "{status}");
        }
        match state("TERMINATED", Some("Instance was preempted.")) {
            InstanceState::Failed(m) => {
                assert!(m.ends_with("TERMINATED: Instance was preempted."), "{m}")
            }
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(state("SUSPENDED", None), InstanceState::Failed(m) if m.contains("SUSPENDED"))
        );
    }

    #[test]
    fn reads_operations() {
        let op = operation(&json!({"name": "operation-1", "status": "DONE",
            "insertTime": "2024-05-01T05:34:56.789-07:00",
            "error": {"errors": [{"code": "QUOTA_EXCEEDED", "message": "Quota 'CPUS' exceeded."}]},
            "httpErrorStatusCode": 403}))
        .expect("reads");
        assert!(op.done());
        assert_eq!(op.errors[0].code, "QUOTA_EXCEEDED");
        assert_eq!(op.http_status, Some(403));
        assert_eq!(op.insert_ms, Some(1_714_566_896_789));
        assert!(operation(&json!({"status": "DONE"})).is_err());
    }
}
