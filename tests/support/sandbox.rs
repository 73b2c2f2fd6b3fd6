//! A driver run in its sandbox in the test process: the runtime, a
//! provider on a built plugin, a create spec.

use berth::driver::{CreateSpec, POOL_TAG};
use berth::plugin::{AllowedHost, Engine, EngineConfig, Sandbox, SandboxConfig, SandboxLimits};

use crate::support::plugin;

pub fn engine() -> Engine {
    Engine::new(EngineConfig::default()).expect("engine")
}

pub fn spec(node: &str) -> CreateSpec {
    CreateSpec {
        node_id: node.into(),
        token: token_for(node),
        instance_type: "small".into(),
        image: "img".into(),
        tags: [(POOL_TAG.to_string(), "pool".to_string())].into(),
        user_data: None,
        ssh_public_key: None,
        options: "{}".into(),
    }
}

/// A provider named `name` on the plugin `plugin_name`.
pub async fn provider(
    engine: &Engine,
    plugin_name: &str,
    name: &str,
    config: serde_json::Value,
    limits: SandboxLimits,
    allow: &[&str],
) -> Sandbox {
    let driver = engine
        .load_file(plugin(plugin_name))
        .await
        .expect("plugin loads");
    Sandbox::start(
        &driver,
        SandboxConfig {
            name: name.into(),
            pool_id: "pool".into(),
            driver_config: config.to_string(),
            allowed_hosts: allow
                .iter()
                .map(|h| AllowedHost::parse(h).expect("host"))
                .collect(),
            limits,
            credentials: Vec::new(),
            state: None,
            deny: Vec::new(),
            gate: None,
        },
    )
}

/// A create token of its own for `node`, the same each time: what berth's
/// pool sends for a node's first try (these tests make one try each).
pub fn token_for(node: &str) -> String {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    node.hash(&mut h);
    let high = h.finish();
    "second half".hash(&mut h);
    let bytes = (u128::from(high) << 64 | u128::from(h.finish())).to_be_bytes();
    berth::driver::create_token(bytes, 4)
}
