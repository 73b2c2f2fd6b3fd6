//! A driver call as one berth process sends it to another to carry out
//! (`POST /internal/v1/calls`), and its answer, in JSON. The contract's host
//! types serialize themselves (`berth-core`'s `serde` feature).

use serde::{Deserialize, Serialize};

use berth_core::driver::{CreateSpec, DriverError, Instance, Page, Tags};
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
    Create(CreateSpec),
    CreateMany(Vec<CreateSpec>),
    /// One page of a list: the first, or the one after `cursor`'s.
    List {
        filter: Tags,
        cursor: Option<String>,
    },
    Get(Vec<String>),
    Delete(String),
    DeleteMany(Vec<String>),
    SetTags {
        id: String,
        tags: Tags,
    },
}

impl Call {
    /// Whether making the call again, after an attempt whose outcome is
    /// not known, does no harm: a list or a get reads, a delete of a gone instance
    /// is `not-found`, tags set twice are the same tags. A create could
    /// make a second machine.
    pub fn repeatable(&self) -> bool {
        !matches!(self, Call::Create(_) | Call::CreateMany(_))
    }
}

/// What the call came to.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    Created(Box<Instance>),
    /// One answer per spec, in order.
    CreatedMany(Vec<Result<Instance, DriverError>>),
    Listed(Page),
    Got(Vec<Instance>),
    Deleted {
        already_gone: bool,
    },
    /// One answer per id, in order: whether it was already gone.
    DeletedMany(Vec<Result<bool, DriverError>>),
    Tagged,
    Failed(Error),
}

/// A failed call: the driver's typed error, which the pool acts on, or
/// anything else in words.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Error {
    Driver(DriverError),
    Other(String),
}

impl From<&CallError> for Error {
    fn from(e: &CallError) -> Error {
        match &e.kind {
            CallErrorKind::Driver(d) => Error::Driver(d.clone()),
            other => Error::Other(other.to_string()),
        }
    }
}

impl Error {
    /// The error as the pool's task takes it, from `holder`.
    pub fn into_kind(self, holder: &str) -> CallErrorKind {
        match self {
            Error::Driver(d) => CallErrorKind::Driver(d),
            Error::Other(m) => {
                CallErrorKind::Peer(format!("at {holder}, which holds the provider: {m}").into())
            }
        }
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
    use std::time::Duration;

    use super::*;
    use berth_core::driver::Call as Which;
    use berth_core::driver::{Addresses, CapacityScope, Connection, InstanceState};

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

        let many = Answer::DeletedMany(vec![
            Ok(true),
            Ok(false),
            Err(DriverError::Transient("t".into())),
        ]);
        let text = serde_json::to_string(&many).unwrap();
        let Answer::DeletedMany(back) = serde_json::from_str(&text).unwrap() else {
            panic!("{text}");
        };
        assert_eq!(
            back,
            [Ok(true), Ok(false), Err(DriverError::Transient("t".into()))]
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
            failure: None,
        };
        let created = Answer::CreatedMany(vec![
            Ok(instance.clone()),
            Err(DriverError::QuotaExceeded("q".into())),
        ]);
        let text = serde_json::to_string(&created).unwrap();
        let Answer::CreatedMany(back) = serde_json::from_str(&text).unwrap() else {
            panic!("{text}");
        };
        assert_eq!(
            back,
            [
                Ok(instance.clone()),
                Err(DriverError::QuotaExceeded("q".into()))
            ]
        );
        let text = serde_json::to_string(&Answer::Created(Box::new(instance.clone()))).unwrap();
        let Answer::Created(m) = serde_json::from_str(&text).unwrap() else {
            panic!("{text}");
        };
        assert_eq!(*m, instance);
        for state in [
            InstanceState::Pending,
            InstanceState::Running,
            InstanceState::Terminated,
            InstanceState::Unknown,
        ] {
            let listed = Answer::Listed(Page {
                instances: vec![Instance {
                    state,
                    ..instance.clone()
                }],
                next: Some("after-i-1".into()),
            });
            let text = serde_json::to_string(&listed).unwrap();
            let Answer::Listed(back) = serde_json::from_str(&text).unwrap() else {
                panic!("{text}");
            };
            assert_eq!(back.instances[0].state, state);
            assert_eq!(back.next.as_deref(), Some("after-i-1"));
        }
    }
}
