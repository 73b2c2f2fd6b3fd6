//! Host bindings for `berth:driver@0.1.0` and the conversions between WIT
//! types and `berth_core::driver` types. WIT types never leave this module.

use berth_core::driver as d;

wasmtime::component::bindgen!({
    path: "../../wit/berth-driver@0.1.0",
    world: "berth:driver/driver-plugin",
    imports: { default: async | trappable },
    exports: { default: async },
    with: {
        "wasi:http": wasmtime_wasi_http::p2::bindings::http,
        "wasi:io": wasmtime_wasi::p2::bindings::io,
        "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
        "wasi:random": wasmtime_wasi::p2::bindings::random,
    },
});

pub(crate) use self::berth::driver::types as wit;

/// The contract version this binding implements.
pub(crate) const CONTRACT: &str = "berth:driver@0.1.0";
/// The interface a driver must export.
pub(crate) const DRIVER_EXPORT: &str = "berth:driver/driver@0.1.0";

pub(crate) fn tags_to_wit(tags: &d::Tags) -> Vec<(String, String)> {
    tags.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

pub(crate) fn tags_from_wit(tags: Vec<(String, String)>) -> d::Tags {
    tags.into_iter().collect()
}

impl From<&d::CreateSpec> for wit::CreateSpec {
    fn from(s: &d::CreateSpec) -> Self {
        wit::CreateSpec {
            node_id: s.node_id.clone(),
            instance_type: s.instance_type.clone(),
            image: s.image.clone(),
            tags: tags_to_wit(&s.tags),
            user_data: s.user_data.clone(),
            ssh_public_key: s.ssh_public_key.clone(),
            options: s.options.clone(),
        }
    }
}

impl From<wit::InstanceState> for d::InstanceState {
    fn from(s: wit::InstanceState) -> Self {
        match s {
            wit::InstanceState::Pending => d::InstanceState::Pending,
            wit::InstanceState::Running => d::InstanceState::Running,
            wit::InstanceState::Stopping => d::InstanceState::Stopping,
            wit::InstanceState::Terminated => d::InstanceState::Terminated,
            wit::InstanceState::Unknown => d::InstanceState::Unknown,
        }
    }
}

impl From<wit::Instance> for d::Instance {
    fn from(i: wit::Instance) -> Self {
        d::Instance {
            id: i.id,
            state: i.state.into(),
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
        }
    }
}

/// Text a driver supplies for people (error messages, its description):
/// cut to `max` bytes and escaped, so it can go into a log line, an API
/// answer or a table as it is. (Instances are not cut: they are checked,
/// and refused if wrong; see `driver::check`.)
fn said(text: String, max: usize) -> String {
    use berth_core::text::{is_unsafe, printable, truncated};
    if text.len() <= max && !text.chars().any(is_unsafe) {
        return text;
    }
    printable(&truncated(&text, max)).into_owned()
}

/// Longest error message kept, in bytes.
const MAX_MESSAGE: usize = 1024;

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
            capabilities: d::Capabilities {
                account_limits: i.capabilities.contains(wit::Capabilities::ACCOUNT_LIMITS),
                user_data: i.capabilities.contains(wit::Capabilities::USER_DATA),
                ssh_keys: i.capabilities.contains(wit::Capabilities::SSH_KEYS),
                idempotent_create: i
                    .capabilities
                    .contains(wit::Capabilities::IDEMPOTENT_CREATE),
            },
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
