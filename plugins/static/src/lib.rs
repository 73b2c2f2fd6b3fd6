//! The berth driver for a fixed list of hosts ("static" machines, as in
//! Nodepool's static driver): berth does not start or stop them, it hands
//! out their slots. A host with `max-parallel-jobs = N` serves N nodes at
//! once; `create` takes a free slot on a host whose `labels` hold the
//! instance type, `delete` frees it. Which slot serves which node lives in
//! the host's durable records for the provider (`berth_sdk::state`), shared
//! by every instance of the driver, so nothing is kept in memory. See
//! `plugins/static/README.md`.

#![forbid(unsafe_code)]

mod config;
mod env;
mod records;
mod slots;

use berth_sdk::types::{
    AccountLimits, Capabilities, ConfigField, CreateSpec, DriverInfo, Error, FieldType, Instance,
    Page,
};
use berth_sdk::{Driver, error};

use slots::Slots;

/// The exported driver.
struct StaticHosts {
    slots: Slots,
}

fn field(
    name: &str,
    field_type: FieldType,
    required: bool,
    default: Option<&str>,
    doc: &str,
) -> ConfigField {
    ConfigField {
        name: name.into(),
        field_type,
        required,
        default: default.map(Into::into),
        doc: doc.into(),
    }
}

impl Driver for StaticHosts {
    fn describe() -> DriverInfo {
        use FieldType::{Integer, Object, String, StringList};
        DriverInfo {
            name: "static".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Hands out slots of a fixed list of hosts that berth neither starts \
                          nor stops. Each host serves the instance types in its `labels`, up \
                          to `max-parallel-jobs` nodes at once; allocations live in the \
                          host's driver records, so they survive restarts."
                .into(),
            config: vec![
                field(
                    "hosts",
                    Object,
                    true,
                    None,
                    "The hosts: a JSON list of objects with the `hosts[].…` fields below. \
                     May be empty.",
                ),
                field(
                    "hosts[].name",
                    String,
                    true,
                    None,
                    "Unique name, 1 to 64 of A-Z a-z 0-9 . _ -; instance ids are `NAME/SLOT`.",
                ),
                field(
                    "hosts[].address",
                    String,
                    true,
                    None,
                    "IPv4 or IPv6 address (no brackets) or DNS name clients connect to.",
                ),
                field(
                    "hosts[].labels",
                    StringList,
                    true,
                    None,
                    "The instance types the host serves: a label's `instance-type` for this \
                     provider must be one of them.",
                ),
                field(
                    "hosts[].max-parallel-jobs",
                    Integer,
                    false,
                    Some("1"),
                    "How many nodes the host serves at once, 1 to 1000.",
                ),
                field(
                    "hosts[].username",
                    String,
                    false,
                    None,
                    "Login user name reported with each node.",
                ),
                field(
                    "hosts[].port",
                    Integer,
                    false,
                    Some("22"),
                    "Login port reported with each node.",
                ),
                field(
                    "hosts[].host-keys",
                    StringList,
                    false,
                    Some("[]"),
                    "SSH host public keys (`authorized_keys` format) reported with each node.",
                ),
                field(
                    "hosts[].ready-check",
                    Object,
                    false,
                    None,
                    "If present, a node on this host reports `pending` until a TCP connection \
                     to the host succeeds, then `running`. The address must be in the \
                     provider's allowed hosts.",
                ),
                field(
                    "hosts[].ready-check.port",
                    Integer,
                    false,
                    None,
                    "Port to connect to; the host's `port` when absent.",
                ),
                field(
                    "hosts[].ready-check.timeout-ms",
                    Integer,
                    false,
                    Some("1000"),
                    "How long one probe waits for the connection, 1 to 30000.",
                ),
            ],
            label_options: vec![],
            capabilities: Capabilities::ACCOUNT_LIMITS | Capabilities::IDEMPOTENT_CREATE,
        }
    }

    fn configure(pool_id: &str, config: &str) -> Result<Self, Error> {
        let mut problems = match config::parse(config) {
            Ok(config) if !pool_id.is_empty() => {
                return Ok(StaticHosts {
                    slots: Slots {
                        pool_id: pool_id.to_owned(),
                        config,
                    },
                });
            }
            Ok(_) => Vec::new(),
            Err(problems) => problems,
        };
        if pool_id.is_empty() {
            problems.push("pool id: must not be empty".to_owned());
        }
        Err(error::invalid_config(problems.join("; ")))
    }

    fn create(&mut self, spec: CreateSpec) -> Result<Instance, Error> {
        self.slots.create(&env::Sandbox, &spec)
    }

    fn get(&mut self, ids: &[String]) -> Result<Vec<Instance>, Error> {
        self.slots.get(&env::Sandbox, ids)
    }

    fn list(&mut self, filter: &[(String, String)], _cursor: Option<&str>) -> Result<Page, Error> {
        // One page, the last: the records are read in one scan, and a
        // provider holds at most 10,000 of them.
        Ok(Page {
            instances: self.slots.list(&env::Sandbox, filter)?,
            next: None,
        })
    }

    fn delete(&mut self, instance_id: &str) -> Result<(), Error> {
        self.slots.delete(&env::Sandbox, instance_id)
    }

    fn set_tags(&mut self, instance_id: &str, tags: &[(String, String)]) -> Result<(), Error> {
        self.slots.set_tags(&env::Sandbox, instance_id, tags)
    }

    fn limits(&mut self) -> Result<AccountLimits, Error> {
        self.slots.limits(&env::Sandbox)
    }
}

berth_sdk::export_driver!(StaticHosts);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configure_reports_every_problem() {
        let ok = r#"{"hosts": [{"name": "a", "address": "10.0.0.1", "labels": ["s"]}]}"#;
        assert!(StaticHosts::configure("p", ok).is_ok_and(|d| d.slots.config.slots() == 1));
        match StaticHosts::configure("", r#"{"hosts": [{"name": "a"}]}"#) {
            Err(Error::InvalidConfig(m)) => assert_eq!(
                m,
                "hosts[0].address: missing; it is required; \
                 hosts[0].labels: missing; it is required; pool id: must not be empty"
            ),
            Err(e) => panic!("{e:?}"),
            Ok(_) => panic!("accepted"),
        }
    }

    #[test]
    fn describe_declares_every_key_the_config_reads() {
        let info = StaticHosts::describe();
        let declared: Vec<&str> = info.config.iter().map(|f| f.name.as_str()).collect();
        let read: Vec<String> = config::TOP_KEYS
            .iter()
            .map(|k| (*k).to_owned())
            .chain(config::HOST_KEYS.iter().map(|k| format!("hosts[].{k}")))
            .chain(
                config::READY_CHECK_KEYS
                    .iter()
                    .map(|k| format!("hosts[].ready-check.{k}")),
            )
            .collect();
        assert_eq!(declared, read);
        assert!(info.capabilities.contains(Capabilities::IDEMPOTENT_CREATE));
    }
}
