//! The smallest complete berth driver: a "cloud" that lives in memory.
//!
//! It shows every part of a driver (describe, config validation, typed
//! errors, idempotent create, get, pages, tag rules, limits) without a
//! network, and it is
//! the SDK's compiling example. It is not a usable cloud: the instances live in
//! the memory of one component instance, and the host runs several instances
//! of a driver side by side and replaces one that traps, so a `list` may reach
//! an instance that never saw the `create`. A real driver keeps nothing that
//! matters in memory and asks its cloud instead (see `plugins/sim`).

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use berth_sdk::tags::{self, POOL_TAG};
use berth_sdk::types::{
    AccountLimits, Addresses, Capabilities, ConfigField, Connection, CreateSpec, DriverInfo, Error,
    FieldType, Instance, InstanceState, Page,
};
use berth_sdk::{Driver, error, pages};
use serde::Deserialize;

/// The provider config, as JSON.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    /// Refuse creates beyond this many instances.
    #[serde(default)]
    max_instances: Option<u32>,
}

/// The configured driver: its pool, its config and its instances by id.
struct Example {
    pool_id: String,
    max_instances: Option<u32>,
    instances: BTreeMap<String, Instance>,
    /// Instance id by the create token that made it.
    tokens: BTreeMap<String, String>,
    next_id: u64,
}

impl Driver for Example {
    fn describe() -> DriverInfo {
        DriverInfo {
            name: "example".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Keeps instances in memory; a template for real drivers.".into(),
            config: vec![ConfigField {
                name: "max_instances".into(),
                field_type: FieldType::Integer,
                required: false,
                default: None,
                doc: "Refuse creates beyond this many instances; absent means no limit.".into(),
            }],
            label_options: vec![],
            capabilities: Capabilities::ACCOUNT_LIMITS | Capabilities::IDEMPOTENT_CREATE,
        }
    }

    fn configure(pool_id: &str, config: &str) -> Result<Self, Error> {
        let config: Config = serde_json::from_str(config)
            .map_err(|e| error::invalid_config(format!("provider config: {e}")))?;
        Ok(Example {
            pool_id: pool_id.to_owned(),
            max_instances: config.max_instances,
            instances: BTreeMap::new(),
            tokens: BTreeMap::new(),
            next_id: 1,
        })
    }

    fn create(&mut self, spec: CreateSpec) -> Result<Instance, Error> {
        if !matches!(serde_json::from_str(&spec.options), Ok(serde_json::Value::Object(o)) if o.is_empty())
        {
            return Err(error::invalid_config(
                "label options: this driver takes none",
            ));
        }
        // The token is an idempotency key: a retried create returns the
        // instance the first try made.
        if let Some(existing) = self
            .tokens
            .get(&spec.token)
            .and_then(|id| self.instances.get(id))
        {
            return Ok(existing.clone());
        }
        if self
            .max_instances
            .is_some_and(|max| self.instances.len() >= max as usize)
        {
            return Err(error::quota_exceeded("max_instances reached"));
        }
        let mut tags = spec.tags;
        // Never create outside the pool, whatever the spec says.
        tags.retain(|(k, _)| k != POOL_TAG);
        tags.push((POOL_TAG.to_owned(), self.pool_id.clone()));
        let instance = Instance {
            id: format!("mem-{:04}", self.next_id),
            state: InstanceState::Running,
            instance_type: spec.instance_type,
            tags,
            addresses: Addresses {
                public_ipv4: None,
                private_ipv4: Some(format!("10.0.0.{}", self.next_id % 250 + 1)),
                ipv6: None,
                hostname: None,
            },
            created_at_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .ok()
                .map(|d| d.as_millis() as u64),
            connection: Connection {
                username: Some("berth".into()),
                port: Some(22),
                host_keys: vec![],
            },
        };
        self.next_id += 1;
        self.tokens.insert(spec.token, instance.id.clone());
        self.instances.insert(instance.id.clone(), instance.clone());
        berth_sdk::log::info("created", &[("id", &instance.id)]);
        Ok(instance)
    }

    fn get(&mut self, ids: &[String]) -> Result<Vec<Instance>, Error> {
        let found = ids.iter().filter_map(|id| self.instances.get(id)).cloned();
        Ok(pages::only_ids(found, ids, &self.pool_id))
    }

    fn list(&mut self, filter: &[(String, String)], cursor: Option<&str>) -> Result<Page, Error> {
        let all = self
            .instances
            .values()
            .filter(|i| tags::has_all(&i.tags, filter))
            .cloned()
            .collect();
        // Pages of 100, in id order: the host asks for each in turn.
        Ok(pages::page_of(all, cursor, 100))
    }

    fn delete(&mut self, instance_id: &str) -> Result<(), Error> {
        match self.instances.remove(instance_id) {
            Some(_) => {
                self.tokens.retain(|_, id| id != instance_id);
                Ok(())
            }
            None => Err(error::not_found(format!("no instance {instance_id}"))),
        }
    }

    fn set_tags(&mut self, instance_id: &str, new: &[(String, String)]) -> Result<(), Error> {
        let instance = self
            .instances
            .get_mut(instance_id)
            .ok_or_else(|| error::not_found(format!("no instance {instance_id}")))?;
        instance.tags = tags::replace_berth_tags(&instance.tags, new);
        Ok(())
    }

    fn limits(&mut self) -> Result<AccountLimits, Error> {
        Ok(AccountLimits {
            max_instances: self.max_instances,
            used_instances: Some(self.instances.len() as u32),
            max_cores: None,
            max_ram_mib: None,
            used_cores: None,
            used_ram_mib: None,
        })
    }
}

berth_sdk::export_driver!(Example);
