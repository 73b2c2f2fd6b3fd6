//! A driver call as one berth process sends it to another to carry out
//! (`POST /internal/v1/calls`), and its answer: the contract's host types,
//! said in JSON. The core's types stay free of serde; these mirror them.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use berth_core::driver::{
    Addresses, CapacityScope, Connection, CreateSpec, DriverError, Instance, InstanceState, Tags,
};
use berth_plugin::{CallError, CallErrorKind, Deletion};

/// The call, for one provider, under the pool's lease of `pool_epoch`.
#[derive(Debug, Serialize, Deserialize)]
pub struct CallBody {
    pub provider: String,
    /// The epoch of the pool's lease the sender decided under.
    pub pool_epoch: i64,
    pub call: Call,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Call {
    Create(Spec),
    List(Tags),
    Delete(String),
    SetTags { id: String, tags: Tags },
}

/// What the call came to.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    Created(Box<Machine>),
    Listed(Vec<Machine>),
    Deleted { already_gone: bool },
    Tagged,
    Failed(Error),
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Spec {
    pub node_id: String,
    pub instance_type: String,
    pub image: String,
    pub tags: Tags,
    pub user_data: Option<String>,
    pub ssh_public_key: Option<String>,
    pub options: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Machine {
    pub id: String,
    pub state: String,
    pub instance_type: String,
    pub tags: BTreeMap<String, String>,
    pub public_ipv4: Option<String>,
    pub private_ipv4: Option<String>,
    pub ipv6: Option<String>,
    pub hostname: Option<String>,
    pub created_at_ms: Option<u64>,
    pub username: Option<String>,
    pub port: Option<u16>,
    pub host_keys: Vec<String>,
}

/// A failed call: the driver's typed error, which the pool acts on, or
/// anything else in words.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Error {
    RateLimited {
        retry_after_ms: u64,
        message: String,
    },
    QuotaExceeded(String),
    Capacity {
        instance_type: Option<String>,
        message: String,
    },
    NotFound(String),
    Unauthorized(String),
    InvalidConfig(String),
    Transient(String),
    Permanent(String),
    Other(String),
}

impl From<CreateSpec> for Spec {
    fn from(s: CreateSpec) -> Spec {
        Spec {
            node_id: s.node_id,
            instance_type: s.instance_type,
            image: s.image,
            tags: s.tags,
            user_data: s.user_data,
            ssh_public_key: s.ssh_public_key,
            options: s.options,
        }
    }
}

impl From<Spec> for CreateSpec {
    fn from(s: Spec) -> CreateSpec {
        CreateSpec {
            node_id: s.node_id,
            instance_type: s.instance_type,
            image: s.image,
            tags: s.tags,
            user_data: s.user_data,
            ssh_public_key: s.ssh_public_key,
            options: s.options,
        }
    }
}

impl From<Instance> for Machine {
    fn from(i: Instance) -> Machine {
        Machine {
            id: i.id,
            state: i.state.to_string(),
            instance_type: i.instance_type,
            tags: i.tags,
            public_ipv4: i.addresses.public_ipv4,
            private_ipv4: i.addresses.private_ipv4,
            ipv6: i.addresses.ipv6,
            hostname: i.addresses.hostname,
            created_at_ms: i.created_at_ms,
            username: i.connection.username,
            port: i.connection.port,
            host_keys: i.connection.host_keys,
        }
    }
}

impl From<Machine> for Instance {
    fn from(m: Machine) -> Instance {
        let state = match m.state.as_str() {
            "pending" => InstanceState::Pending,
            "running" => InstanceState::Running,
            "stopping" => InstanceState::Stopping,
            "terminated" => InstanceState::Terminated,
            _ => InstanceState::Unknown,
        };
        Instance {
            id: m.id,
            state,
            instance_type: m.instance_type,
            tags: m.tags,
            addresses: Addresses {
                public_ipv4: m.public_ipv4,
                private_ipv4: m.private_ipv4,
                ipv6: m.ipv6,
                hostname: m.hostname,
            },
            created_at_ms: m.created_at_ms,
            connection: Connection {
                username: m.username,
                port: m.port,
                host_keys: m.host_keys,
            },
        }
    }
}

impl From<&CallError> for Error {
    fn from(e: &CallError) -> Error {
        let CallErrorKind::Driver(d) = &e.kind else {
            return Error::Other(e.kind.to_string());
        };
        match d.clone() {
            DriverError::RateLimited {
                retry_after,
                message,
            } => Error::RateLimited {
                retry_after_ms: u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX),
                message,
            },
            DriverError::QuotaExceeded(m) => Error::QuotaExceeded(m),
            DriverError::Capacity { scope, message } => Error::Capacity {
                instance_type: match scope {
                    CapacityScope::InstanceType(t) => Some(t),
                    CapacityScope::General => None,
                },
                message,
            },
            DriverError::NotFound(m) => Error::NotFound(m),
            DriverError::Unauthorized(m) => Error::Unauthorized(m),
            DriverError::InvalidConfig(m) => Error::InvalidConfig(m),
            DriverError::Transient(m) => Error::Transient(m),
            DriverError::Permanent(m) => Error::Permanent(m),
        }
    }
}

impl Error {
    /// The error as the pool's task takes it, from `holder`.
    pub fn into_kind(self, holder: &str) -> CallErrorKind {
        let driver = match self {
            Error::RateLimited {
                retry_after_ms,
                message,
            } => DriverError::RateLimited {
                retry_after: Duration::from_millis(retry_after_ms),
                message,
            },
            Error::QuotaExceeded(m) => DriverError::QuotaExceeded(m),
            Error::Capacity {
                instance_type,
                message,
            } => DriverError::Capacity {
                scope: instance_type.map_or(CapacityScope::General, CapacityScope::InstanceType),
                message,
            },
            Error::NotFound(m) => DriverError::NotFound(m),
            Error::Unauthorized(m) => DriverError::Unauthorized(m),
            Error::InvalidConfig(m) => DriverError::InvalidConfig(m),
            Error::Transient(m) => DriverError::Transient(m),
            Error::Permanent(m) => DriverError::Permanent(m),
            Error::Other(m) => {
                return CallErrorKind::Peer(
                    format!("at {holder}, which holds the provider: {m}").into(),
                );
            }
        };
        CallErrorKind::Driver(driver)
    }
}

impl From<Deletion> for Answer {
    fn from(d: Deletion) -> Answer {
        Answer::Deleted {
            already_gone: d == Deletion::AlreadyGone,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_core::driver::Call as Which;

    /// Every typed driver error, and an instance with every field set, come
    /// through JSON as they went in.
    #[test]
    fn calls_and_answers_round_trip_through_json() {
        let errors = [
            DriverError::RateLimited {
                retry_after: Duration::from_millis(1500),
                message: "slow".into(),
            },
            DriverError::QuotaExceeded("q".into()),
            DriverError::Capacity {
                scope: CapacityScope::InstanceType("big".into()),
                message: "c".into(),
            },
            DriverError::Capacity {
                scope: CapacityScope::General,
                message: "g".into(),
            },
            DriverError::NotFound("n".into()),
            DriverError::Unauthorized("u".into()),
            DriverError::InvalidConfig("i".into()),
            DriverError::Transient("t".into()),
            DriverError::Permanent("p".into()),
        ];
        for e in errors {
            let call = CallError {
                provider: "p".into(),
                call: Which::Create,
                kind: CallErrorKind::Driver(e.clone()),
            };
            let text = serde_json::to_string(&Answer::Failed(Error::from(&call))).unwrap();
            let Answer::Failed(back) = serde_json::from_str(&text).unwrap() else {
                panic!("{text}");
            };
            assert!(
                matches!(back.into_kind("b"), CallErrorKind::Driver(d) if d == e),
                "{text}"
            );
        }
        let trapped = CallError {
            provider: "p".into(),
            call: Which::List,
            kind: CallErrorKind::Stopped,
        };
        let kind = Error::from(&trapped).into_kind("http://b:1 pid 7");
        assert_eq!(
            kind.to_string(),
            "at http://b:1 pid 7, which holds the provider: provider stopped"
        );

        let instance = Instance {
            id: "i-1".into(),
            state: InstanceState::Stopping,
            instance_type: "small".into(),
            tags: [("berth-node".to_owned(), "n1".to_owned())].into(),
            addresses: Addresses {
                public_ipv4: Some("198.51.100.1".into()),
                private_ipv4: Some("10.0.0.1".into()),
                ipv6: Some("2001:db8::1".into()),
                hostname: Some("h".into()),
            },
            created_at_ms: Some(7),
            connection: Connection {
                username: Some("ci".into()),
                port: Some(2222),
                host_keys: vec!["ssh-ed25519 AAAA".into()],
            },
        };
        let text =
            serde_json::to_string(&Answer::Created(Box::new(instance.clone().into()))).unwrap();
        let Answer::Created(m) = serde_json::from_str(&text).unwrap() else {
            panic!("{text}");
        };
        assert_eq!(Instance::from(*m), instance);
        for state in [
            InstanceState::Pending,
            InstanceState::Running,
            InstanceState::Terminated,
            InstanceState::Unknown,
        ] {
            let m = Machine::from(Instance {
                state,
                ..instance.clone()
            });
            assert_eq!(Instance::from(m).state, state);
        }
    }
}
