//! Host bindings, one module per contract version this berth carries
//! (`v0_1`: `berth:driver@0.1.0`, `v0_2`: `berth:driver@0.2.0`), and the one
//! face the rest of the plugin sees: [`PluginPre`] and [`Plugin`], which
//! speak `berth_core::driver` types whatever version the driver was built
//! against. WIT types never leave this module.
//!
//! A 0.1 driver is adapted into 0.2's calls with its own (`v0_1`): `get` is
//! a list filtered by id, a batch is a loop, and a list is one page, the
//! last.

pub(crate) mod v0_1;
mod v0_2;

use berth_core::driver::{
    self as d, AccountLimits, CreateSpec, DriverError, DriverInfo, Instance, Page, Tags,
};
use wasmtime::Store;
use wasmtime::component::InstancePre;

use super::store_data::StoreState;

/// A guest's answer: the driver's value or typed error, or a trap (`Err`
/// of the outer result).
pub(crate) type GuestAnswer<T> = wasmtime::Result<Result<T, DriverError>>;

/// A version of the contract this berth binds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Contract {
    V0_1,
    V0_2,
}

impl Contract {
    /// Every version bound, oldest first.
    pub const ALL: [Contract; 2] = [Contract::V0_1, Contract::V0_2];

    /// The newest version: what new drivers are written against.
    pub const NEWEST: Contract = Contract::V0_2;

    /// The version number, `0.2.0`.
    pub fn version(self) -> &'static str {
        match self {
            Contract::V0_1 => "0.1.0",
            Contract::V0_2 => "0.2.0",
        }
    }

    /// The package, `berth:driver@0.2.0`.
    pub fn package(self) -> &'static str {
        match self {
            Contract::V0_1 => "berth:driver@0.1.0",
            Contract::V0_2 => "berth:driver@0.2.0",
        }
    }

    /// The interface a driver of this version exports.
    pub(crate) fn driver_export(self) -> &'static str {
        match self {
            Contract::V0_1 => "berth:driver/driver@0.1.0",
            Contract::V0_2 => "berth:driver/driver@0.2.0",
        }
    }

    /// The version whose driver interface is `export`, if bound.
    pub(crate) fn of_export(export: &str) -> Option<Contract> {
        Contract::ALL
            .into_iter()
            .find(|c| c.driver_export() == export)
    }

    /// The version `version` (`0.2.0`), if bound.
    pub(crate) fn of_version(version: &str) -> Option<Contract> {
        Contract::ALL.into_iter().find(|c| c.version() == version)
    }
}

impl std::fmt::Display for Contract {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.package())
    }
}

/// Adds every version's imports (`log`, `state`, `net`, and 0.2's `auth`)
/// to `linker`.
pub(crate) fn add_to_linker(
    linker: &mut wasmtime::component::Linker<StoreState>,
) -> wasmtime::Result<()> {
    v0_1::add_to_linker(linker)?;
    v0_2::add_to_linker(linker)
}

/// A driver component linked and ready to instantiate, by the version it
/// exports.
#[derive(Clone)]
pub(crate) enum PluginPre {
    V0_1(v0_1::DriverPluginPre<StoreState>),
    V0_2(v0_2::DriverPluginPre<StoreState>),
}

impl PluginPre {
    /// Checks that `pre` exports `contract`'s driver interface with its types.
    pub fn new(contract: Contract, pre: InstancePre<StoreState>) -> wasmtime::Result<PluginPre> {
        Ok(match contract {
            Contract::V0_1 => PluginPre::V0_1(v0_1::DriverPluginPre::new(pre)?),
            Contract::V0_2 => PluginPre::V0_2(v0_2::DriverPluginPre::new(pre)?),
        })
    }

    pub fn contract(&self) -> Contract {
        match self {
            PluginPre::V0_1(_) => Contract::V0_1,
            PluginPre::V0_2(_) => Contract::V0_2,
        }
    }

    pub fn engine(&self) -> &wasmtime::Engine {
        match self {
            PluginPre::V0_1(p) => p.engine(),
            PluginPre::V0_2(p) => p.engine(),
        }
    }

    pub async fn instantiate_async(
        &self,
        store: &mut Store<StoreState>,
    ) -> wasmtime::Result<Plugin> {
        Ok(match self {
            PluginPre::V0_1(p) => Plugin::V0_1(p.instantiate_async(store).await?),
            PluginPre::V0_2(p) => Plugin::V0_2(p.instantiate_async(store).await?),
        })
    }
}

/// One instance of a driver component, by the version it exports. Its
/// calls are 0.2's; a 0.1 driver's are adapted (see the module's doc).
pub(crate) enum Plugin {
    V0_1(v0_1::DriverPlugin),
    V0_2(v0_2::DriverPlugin),
}

impl Plugin {
    pub async fn describe(&self, store: &mut Store<StoreState>) -> wasmtime::Result<DriverInfo> {
        match self {
            Plugin::V0_1(p) => v0_1::describe(p, store).await,
            Plugin::V0_2(p) => v0_2::describe(p, store).await,
        }
    }

    pub async fn configure(
        &self,
        store: &mut Store<StoreState>,
        pool_id: &str,
        config: &str,
    ) -> GuestAnswer<()> {
        match self {
            Plugin::V0_1(p) => v0_1::configure(p, store, pool_id, config).await,
            Plugin::V0_2(p) => v0_2::configure(p, store, pool_id, config).await,
        }
    }

    pub async fn create(
        &self,
        store: &mut Store<StoreState>,
        spec: &CreateSpec,
    ) -> GuestAnswer<Instance> {
        match self {
            Plugin::V0_1(p) => v0_1::create(p, store, spec).await,
            Plugin::V0_2(p) => v0_2::create(p, store, spec).await,
        }
    }

    /// The driver's answers, which the contract wants one per spec, in
    /// order. They are passed on as they came: the caller checks their
    /// number, since a driver that answers with another number may still
    /// have made the instances (the pool then waits for a list to tell).
    pub async fn create_many(
        &self,
        store: &mut Store<StoreState>,
        specs: &[CreateSpec],
    ) -> GuestAnswer<Vec<Result<Instance, DriverError>>> {
        match self {
            Plugin::V0_1(p) => v0_1::create_many(p, store, specs).await.map(Ok),
            Plugin::V0_2(p) => v0_2::create_many(p, store, specs).await.map(Ok),
        }
    }

    pub async fn get(
        &self,
        store: &mut Store<StoreState>,
        pool_id: &str,
        ids: &[String],
    ) -> GuestAnswer<Vec<Instance>> {
        match self {
            Plugin::V0_1(p) => v0_1::get(p, store, pool_id, ids).await,
            Plugin::V0_2(p) => v0_2::get(p, store, ids).await,
        }
    }

    pub async fn list(
        &self,
        store: &mut Store<StoreState>,
        filter: &Tags,
        cursor: Option<&str>,
    ) -> GuestAnswer<Page> {
        match self {
            Plugin::V0_1(p) => v0_1::list(p, store, filter, cursor).await,
            Plugin::V0_2(p) => v0_2::list(p, store, filter, cursor).await,
        }
    }

    pub async fn delete(&self, store: &mut Store<StoreState>, id: &str) -> GuestAnswer<()> {
        match self {
            Plugin::V0_1(p) => v0_1::delete(p, store, id).await,
            Plugin::V0_2(p) => v0_2::delete(p, store, id).await,
        }
    }

    /// The driver's answers, one per id in order if it keeps the
    /// contract; see [`Plugin::create_many`].
    pub async fn delete_many(
        &self,
        store: &mut Store<StoreState>,
        ids: &[String],
    ) -> GuestAnswer<Vec<Result<(), DriverError>>> {
        match self {
            Plugin::V0_1(p) => v0_1::delete_many(p, store, ids).await.map(Ok),
            Plugin::V0_2(p) => v0_2::delete_many(p, store, ids).await.map(Ok),
        }
    }

    pub async fn set_tags(
        &self,
        store: &mut Store<StoreState>,
        id: &str,
        tags: &Tags,
    ) -> GuestAnswer<()> {
        match self {
            Plugin::V0_1(p) => v0_1::set_tags(p, store, id, tags).await,
            Plugin::V0_2(p) => v0_2::set_tags(p, store, id, tags).await,
        }
    }

    pub async fn limits(&self, store: &mut Store<StoreState>) -> GuestAnswer<AccountLimits> {
        match self {
            Plugin::V0_1(p) => v0_1::limits(p, store).await,
            Plugin::V0_2(p) => v0_2::limits(p, store).await,
        }
    }
}

pub(crate) fn tags_to_wit(tags: &d::Tags) -> Vec<(String, String)> {
    tags.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

pub(crate) fn tags_from_wit(tags: Vec<(String, String)>) -> d::Tags {
    tags.into_iter().collect()
}

/// Text a driver supplies for people (error messages, its description,
/// a failed instance's reason): cut to `max` bytes and escaped, so it can
/// go into a log line, an API answer or a table as it is. (Instances are
/// not cut: they are checked, and refused if wrong; see `driver::check`.)
fn said(text: String, max: usize) -> String {
    use berth_core::text::{is_unsafe, printable, truncated};
    if text.len() <= max && !text.chars().any(is_unsafe) {
        return text;
    }
    printable(&truncated(&text, max)).into_owned()
}

/// Longest error message kept, in bytes.
const MAX_MESSAGE: usize = 1024;

/// The conversions between a version's WIT types and the host's that are
/// the same in every version, for the version module it expands in (whose
/// `wit` is its `types` interface).
macro_rules! same_in_every_version {
    () => {
        impl From<wit::Error> for d::DriverError {
            fn from(e: wit::Error) -> Self {
                let m = |m| said(m, MAX_MESSAGE);
                match e {
                    wit::Error::RateLimited(r) => d::DriverError::RateLimited {
                        retry_after: std::time::Duration::from_millis(r.retry_after_ms),
                        message: m(r.message),
                    },
                    wit::Error::QuotaExceeded(e) => d::DriverError::QuotaExceeded(m(e)),
                    wit::Error::Capacity(c) => d::DriverError::Capacity {
                        scope: match c.scope {
                            wit::CapacityScope::InstanceType(t) => {
                                d::CapacityScope::InstanceType(said(t, 256))
                            }
                            wit::CapacityScope::General => d::CapacityScope::General,
                        },
                        message: m(c.message),
                    },
                    wit::Error::NotFound(e) => d::DriverError::NotFound(m(e)),
                    wit::Error::Unauthorized(e) => d::DriverError::Unauthorized(m(e)),
                    wit::Error::InvalidConfig(e) => d::DriverError::InvalidConfig(m(e)),
                    wit::Error::Transient(e) => d::DriverError::Transient(m(e)),
                    wit::Error::Permanent(e) => d::DriverError::Permanent(m(e)),
                }
            }
        }

        impl From<wit::FieldType> for d::FieldType {
            fn from(t: wit::FieldType) -> Self {
                match t {
                    wit::FieldType::String => d::FieldType::String,
                    wit::FieldType::Integer => d::FieldType::Integer,
                    wit::FieldType::Number => d::FieldType::Number,
                    wit::FieldType::Boolean => d::FieldType::Boolean,
                    wit::FieldType::StringList => d::FieldType::StringList,
                    wit::FieldType::Object => d::FieldType::Object,
                }
            }
        }

        impl From<wit::ConfigField> for d::ConfigField {
            fn from(f: wit::ConfigField) -> Self {
                d::ConfigField {
                    name: said(f.name, 128),
                    field_type: f.field_type.into(),
                    required: f.required,
                    default: f.default.map(|d| said(d, MAX_MESSAGE)),
                    doc: said(f.doc, MAX_MESSAGE),
                }
            }
        }

        impl From<wit::DriverInfo> for d::DriverInfo {
            fn from(i: wit::DriverInfo) -> Self {
                d::DriverInfo {
                    name: said(i.name, 128),
                    version: said(i.version, 128),
                    description: said(i.description, MAX_MESSAGE),
                    config: i.config.into_iter().map(Into::into).collect(),
                    label_options: i.label_options.into_iter().map(Into::into).collect(),
                    capabilities: capabilities(i.capabilities),
                }
            }
        }

        impl From<wit::AccountLimits> for d::AccountLimits {
            fn from(l: wit::AccountLimits) -> Self {
                d::AccountLimits {
                    max_instances: l.max_instances,
                    max_cores: l.max_cores,
                    max_ram_mib: l.max_ram_mib,
                    used_instances: l.used_instances,
                    used_cores: l.used_cores,
                    used_ram_mib: l.used_ram_mib,
                }
            }
        }

        /// An instance as the host keeps it, but for its state.
        fn instance(
            i: wit::Instance,
            state: d::InstanceState,
            failure: Option<String>,
        ) -> d::Instance {
            d::Instance {
                id: i.id,
                state,
                instance_type: i.instance_type,
                tags: tags_from_wit(i.tags),
                addresses: d::Addresses {
                    public_ipv4: i.addresses.public_ipv4,
                    private_ipv4: i.addresses.private_ipv4,
                    ipv6: i.addresses.ipv6,
                    hostname: i.addresses.hostname,
                },
                created_at_ms: i.created_at_ms,
                connection: d::Connection {
                    username: i.connection.username,
                    port: i.connection.port,
                    host_keys: i.connection.host_keys,
                },
                failure,
            }
        }

        pub(super) async fn describe(
            p: &DriverPlugin,
            store: &mut Store<StoreState>,
        ) -> wasmtime::Result<d::DriverInfo> {
            Ok(p.berth_driver_driver().call_describe(store).await?.into())
        }

        pub(super) async fn configure(
            p: &DriverPlugin,
            store: &mut Store<StoreState>,
            pool_id: &str,
            config: &str,
        ) -> GuestAnswer<()> {
            let answer = p
                .berth_driver_driver()
                .call_configure(store, pool_id, config)
                .await?;
            Ok(answer.map_err(Into::into))
        }

        /// (Each version's `CreateSpec` is made from the host's by its own
        /// `From`.)
        pub(super) async fn create(
            p: &DriverPlugin,
            store: &mut Store<StoreState>,
            spec: &d::CreateSpec,
        ) -> GuestAnswer<d::Instance> {
            let answer = (p.berth_driver_driver())
                .call_create(store, &spec.into())
                .await?;
            Ok(answer.map(Into::into).map_err(Into::into))
        }

        pub(super) async fn delete(
            p: &DriverPlugin,
            store: &mut Store<StoreState>,
            id: &str,
        ) -> GuestAnswer<()> {
            let answer = p.berth_driver_driver().call_delete(store, id).await?;
            Ok(answer.map_err(Into::into))
        }

        pub(super) async fn set_tags(
            p: &DriverPlugin,
            store: &mut Store<StoreState>,
            id: &str,
            tags: &d::Tags,
        ) -> GuestAnswer<()> {
            let answer = (p.berth_driver_driver())
                .call_set_tags(store, id, &tags_to_wit(tags))
                .await?;
            Ok(answer.map_err(Into::into))
        }

        pub(super) async fn limits(
            p: &DriverPlugin,
            store: &mut Store<StoreState>,
        ) -> GuestAnswer<d::AccountLimits> {
            let answer = p.berth_driver_driver().call_limits(store).await?;
            Ok(answer.map(Into::into).map_err(Into::into))
        }
    };
}
use same_in_every_version;
