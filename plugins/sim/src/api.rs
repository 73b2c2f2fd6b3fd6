//! The sim's wire format (docs/sim-cloud.md) and its conversion to the
//! contract's types. Responses are read leniently (unknown fields ignored,
//! absent ones defaulted) so a newer sim does not break an older driver.

use std::collections::BTreeMap;

use berth_sdk::types::{Addresses, Connection, Instance, InstanceState};
use serde::{Deserialize, Serialize};

/// `POST /v1/instances`.
#[derive(Clone, Serialize)]
pub(crate) struct CreateBody<'a> {
    pub instance_type: &'a str,
    pub image: &'a str,
    pub tags: BTreeMap<String, String>,
    pub client_token: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_data: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ssh_public_key: Option<&'a str>,
}

/// `POST /v1/batch/create`.
#[derive(Serialize)]
pub(crate) struct BatchCreateBody<'a> {
    pub instances: Vec<CreateBody<'a>>,
}

/// `POST /v1/batch/delete`.
#[derive(Serialize)]
pub(crate) struct BatchDeleteBody<'a> {
    pub ids: &'a [String],
}

/// What a batch call answers: one result per item, in order.
#[derive(Deserialize)]
pub(crate) struct BatchResults {
    pub results: Vec<BatchResult>,
}

/// One item's result: its instance (a create), nothing (a delete), or the
/// error the call alone would have answered, with that call's status.
#[derive(Deserialize)]
pub(crate) struct BatchResult {
    #[serde(default)]
    pub instance: Option<ApiInstance>,
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(flatten)]
    pub error: ErrorBody,
}

/// `PUT /v1/instances/{id}/tags`.
#[derive(Serialize)]
pub(crate) struct SetTagsBody {
    pub tags: BTreeMap<String, String>,
}

/// One instance as the sim reports it.
#[derive(Deserialize)]
pub(crate) struct ApiInstance {
    id: String,
    state: String,
    instance_type: String,
    #[serde(default)]
    tags: BTreeMap<String, String>,
    #[serde(default)]
    created_at_ms: Option<u64>,
    #[serde(default)]
    private_ipv4: Option<String>,
    #[serde(default)]
    public_ipv4: Option<String>,
    #[serde(default)]
    hostname: Option<String>,
    #[serde(default)]
    ssh_port: Option<u16>,
    #[serde(default)]
    username: Option<String>,
    /// Why it failed, in state `failed`.
    #[serde(default)]
    fault: Option<String>,
}

impl From<ApiInstance> for Instance {
    fn from(i: ApiInstance) -> Instance {
        let state = match i.state.as_str() {
            "pending" => InstanceState::Pending,
            "running" => InstanceState::Running,
            "stopping" => InstanceState::Stopping,
            "terminated" => InstanceState::Terminated,
            "failed" => InstanceState::Failed(i.fault.unwrap_or_default()),
            _ => InstanceState::Unknown,
        };
        Instance {
            id: i.id,
            state,
            instance_type: i.instance_type,
            tags: i.tags.into_iter().collect(),
            addresses: Addresses {
                public_ipv4: i.public_ipv4,
                private_ipv4: i.private_ipv4,
                ipv6: None,
                hostname: i.hostname,
            },
            created_at_ms: i.created_at_ms,
            connection: Connection {
                username: i.username,
                port: i.ssh_port,
                host_keys: vec![],
            },
        }
    }
}

/// `GET /v1/instances`.
#[derive(Deserialize)]
pub(crate) struct InstancePage {
    pub instances: Vec<ApiInstance>,
    #[serde(default)]
    pub next_page_token: Option<String>,
}

/// `GET /v1/limits`.
#[derive(Deserialize)]
pub(crate) struct LimitsBody {
    #[serde(default)]
    pub max_instances: Option<u32>,
    #[serde(default)]
    pub used_instances: Option<u32>,
}

/// The body of every sim error.
#[derive(Default, Deserialize)]
pub(crate) struct ErrorBody {
    #[serde(default)]
    pub error: ErrorDetail,
    /// With 429.
    #[serde(default)]
    pub retry_after_ms: Option<u64>,
    /// With 503 `insufficient_capacity`.
    #[serde(default)]
    pub instance_type: Option<String>,
}

#[derive(Default, Deserialize)]
pub(crate) struct ErrorDetail {
    #[serde(default)]
    pub code: String,
    #[serde(default)]
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_from_sim_json() {
        let json = r#"{
          "id": "i-000000000000002a", "state": "pending", "instance_type": "small",
          "image": "ubuntu-24.04", "tags": {"berth-pool": "p1", "berth-node": "n-1"},
          "created_at_ms": 1790000000000, "private_ipv4": "127.1.0.42", "public_ipv4": null,
          "hostname": "i-000000000000002a.sim.internal", "ssh_port": 22, "username": "berth",
          "client_token": "n-1"
        }"#;
        let i: Instance = serde_json::from_str::<ApiInstance>(json)
            .map(Into::into)
            .expect("parses");
        assert_eq!(i.id, "i-000000000000002a");
        assert!(matches!(i.state, InstanceState::Pending));
        assert_eq!(i.instance_type, "small");
        assert_eq!(
            i.tags,
            vec![
                ("berth-node".into(), "n-1".into()),
                ("berth-pool".into(), "p1".into())
            ]
        );
        assert_eq!(i.created_at_ms, Some(1_790_000_000_000));
        assert_eq!(i.addresses.private_ipv4.as_deref(), Some("127.1.0.42"));
        assert_eq!(i.addresses.public_ipv4, None);
        assert_eq!(
            i.addresses.hostname.as_deref(),
            Some("i-000000000000002a.sim.internal")
        );
        assert_eq!(i.connection.username.as_deref(), Some("berth"));
        assert_eq!(i.connection.port, Some(22));
    }

    #[test]
    fn states() {
        for (text, want) in [
            ("pending", InstanceState::Pending),
            ("running", InstanceState::Running),
            ("stopping", InstanceState::Stopping),
            ("terminated", InstanceState::Terminated),
            ("failed", InstanceState::Failed("no host".into())),
            ("exploded", InstanceState::Unknown),
        ] {
            let json = format!(
                r#"{{"id": "i-1", "state": "{text}", "instance_type": "t", "fault": "no host"}}"#
            );
            let i: Instance = serde_json::from_str::<ApiInstance>(&json)
                .map(Into::into)
                .expect("parses");
            assert_eq!(i.state, want, "{text}");
        }
    }
}
