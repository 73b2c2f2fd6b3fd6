//! The driver contract as plain host types: what a driver is asked to do and
//! what it answers. WIT-generated types never leave `plugin::bindings`; the rest
//! of berth speaks these.

pub mod check;
pub mod records;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// Tags on a cloud resource. A map because berth treats tag keys as unique; a
/// driver that reports a key twice has its last value win.
pub type Tags = BTreeMap<String, String>;

/// Tag key holding the pool id; every resource berth owns carries it.
pub const POOL_TAG: &str = "berth-pool";
/// Tag key holding berth's node id.
pub const NODE_TAG: &str = "berth-node";
/// Tag key holding the node's label.
pub const LABEL_TAG: &str = "berth-label";
/// Tag key holding the node's idle behaviour (`run`, `hold`, `drain`).
pub const IDLE_TAG: &str = "berth-idle";
/// Tag key on a backing instance: how many slots it has.
pub const SLOTS_TAG: &str = "berth-slots";
/// Tag key on a backing instance: the slot label its slots serve.
pub const SLOT_LABEL_TAG: &str = "berth-slot-label";
/// Tag key holding the generation of the store that made the instance
/// (`pool::Identity`).
pub const STORE_TAG: &str = "berth-store";
/// Tag key holding the signature of berth's tags on the instance, under its
/// store's key (`pool::Identity`).
pub const SIG_TAG: &str = "berth-sig";
/// Tag key on an instance handed out to a request: the request's id.
pub const REQUEST_TAG: &str = "berth-request";
/// Tag key on a backing instance with slots handed out: how many.
pub const SLOTS_HELD_TAG: &str = "berth-slots-held";
/// Prefix of every tag key berth manages.
pub const BERTH_TAG_PREFIX: &str = "berth-";

/// Lifecycle state of an instance as the cloud reports it.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, strum::Display)]
#[strum(serialize_all = "kebab-case")]
pub enum InstanceState {
    Pending,
    Running,
    Stopping,
    Terminated,
    /// The cloud gave up on it: it will never run. Its reason is
    /// [`Instance::failure`].
    Failed,
    Unknown,
}

/// Network addresses of an instance.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Addresses {
    pub public_ipv4: Option<String>,
    pub private_ipv4: Option<String>,
    pub ipv6: Option<String>,
    pub hostname: Option<String>,
}

/// How a client logs in to an instance.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Connection {
    pub username: Option<String>,
    pub port: Option<u16>,
    pub host_keys: Vec<String>,
}

/// One cloud machine as a driver reports it.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instance {
    pub id: String,
    pub state: InstanceState,
    pub instance_type: String,
    pub tags: Tags,
    pub addresses: Addresses,
    pub created_at_ms: Option<u64>,
    pub connection: Connection,
    /// The cloud's reason for a `Failed` instance, for people; `None` in
    /// every other state (`driver::check` refuses an instance otherwise).
    /// (Absent from what a process of an earlier berth sends.)
    #[cfg_attr(feature = "serde", serde(default))]
    pub failure: Option<String>,
}

/// One page of a list: its instances, and where the next page starts
/// (`None` on the last page). A list is complete once a page without `next`
/// came back.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Page {
    pub instances: Vec<Instance>,
    pub next: Option<String>,
}

/// What to create.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateSpec {
    pub node_id: String,
    /// The create's idempotency key (a UUID in text form): the same for
    /// every try of one create, restarts included; see `pool::tags`.
    /// (Absent from what a process of an earlier berth sends.)
    #[cfg_attr(feature = "serde", serde(default))]
    pub token: String,
    pub instance_type: String,
    pub image: String,
    pub tags: Tags,
    pub user_data: Option<String>,
    pub ssh_public_key: Option<String>,
    /// Label-level driver options, JSON text.
    pub options: String,
}

/// A create token ([`CreateSpec::token`]) from 16 bytes: a UUID of
/// `version` (4: random, 8: made from other data) in RFC 9562's text form,
/// 36 characters, lowercase.
pub fn create_token(mut bytes: [u8; 16], version: u8) -> String {
    bytes[6] = (bytes[6] & 0x0f) | (version << 4);
    bytes[8] = (bytes[8] & 0x3f) | 0x80; // the RFC's variant
    let hex = hex::encode(bytes);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// What a capacity error applies to.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CapacityScope {
    InstanceType(String),
    General,
}

/// A typed error value returned by a driver. The host acts on the variant;
/// the message is for people.
/// Its kind in a word (`rate-limited`) is `<&str>::from(&error)`.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
pub enum DriverError {
    #[error("rate limited, retry after {}ms: {message}", retry_after.as_millis())]
    RateLimited {
        retry_after: Duration,
        message: String,
    },
    #[error("quota exceeded: {0}")]
    QuotaExceeded(String),
    #[error("no capacity ({}): {message}", match scope { CapacityScope::InstanceType(t) => t.as_str(), CapacityScope::General => "general" })]
    Capacity {
        scope: CapacityScope,
        message: String,
    },
    #[error("not found: {0}")]
    NotFound(String),
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    #[error("invalid config: {0}")]
    InvalidConfig(String),
    #[error("transient error: {0}")]
    Transient(String),
    #[error("permanent error: {0}")]
    Permanent(String),
}

/// The type of a config field, as messages name it (`string list`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::Display)]
#[strum(serialize_all = "lowercase")]
pub enum FieldType {
    String,
    Integer,
    Number,
    Boolean,
    #[strum(serialize = "string list")]
    StringList,
    Object,
}

/// One documented field of a driver's config or label options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigField {
    pub name: String,
    pub field_type: FieldType,
    pub required: bool,
    /// Default as JSON text.
    pub default: Option<String>,
    pub doc: String,
}

/// Optional features a driver declares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    pub account_limits: bool,
    pub user_data: bool,
    pub ssh_keys: bool,
    pub idempotent_create: bool,
    pub create_many: bool,
    pub delete_many: bool,
}

/// What a driver says about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverInfo {
    pub name: String,
    pub version: String,
    pub description: String,
    pub config: Vec<ConfigField>,
    pub label_options: Vec<ConfigField>,
    pub capabilities: Capabilities,
}

/// The account's own quota and usage; `None` is unknown or unlimited.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AccountLimits {
    pub max_instances: Option<u32>,
    pub max_cores: Option<u32>,
    pub max_ram_mib: Option<u64>,
    pub used_instances: Option<u32>,
    pub used_cores: Option<u32>,
    pub used_ram_mib: Option<u64>,
}

/// The calls of the contract, for errors, traces and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
pub enum Call {
    Describe,
    Configure,
    Create,
    CreateMany,
    Get,
    List,
    Delete,
    DeleteMany,
    SetTags,
    Limits,
}

impl Call {
    /// The call's name as the WIT spells it.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
