//! The `--config` file of `berth driver test`: the driver config, the
//! create to make, the faults to answer with.

use std::path::Path;

use serde::Deserialize;

use berth_core::driver::Tags;

use super::faults::Fault;

/// The `--config` file of `berth driver test`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestConfig {
    /// Provider-level driver config, passed to `configure`.
    #[serde(default = "empty_object")]
    pub config: serde_json::Value,
    /// Hosts the driver may reach.
    #[serde(default)]
    pub allow_hosts: Vec<String>,
    /// Pool id to use; a fresh random one by default, so runs never collide.
    pub pool_id: Option<String>,
    /// What to create.
    #[serde(default)]
    pub create: CreateConfig,
    /// Per-call deadline, e.g. "30s".
    pub call_deadline: Option<String>,
    /// Credentials the host adds to the driver's requests, with the keys of
    /// `[[providers.NAME.credentials]]`; secrets as `${ENV}`.
    #[serde(default)]
    pub credentials: Vec<toml::Value>,
    /// Instances the paging step creates; by default one more than the
    /// page size the driver config names. `--instances` sets it too.
    #[serde(default)]
    pub instances: Option<u32>,
    /// Recorded cloud responses to check the driver's error mapping
    /// against (`--faults FILE`).
    #[serde(skip)]
    pub faults: Vec<Fault>,
    /// Where relative `*-file` paths of `credentials` are taken from: the
    /// directory of the file this was read from.
    #[serde(skip)]
    pub base: std::path::PathBuf,
}

/// The instance the test creates.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateConfig {
    #[serde(default = "default_type")]
    pub instance_type: String,
    #[serde(default = "default_image")]
    pub image: String,
    /// Label-level driver options.
    #[serde(default = "empty_object")]
    pub options: serde_json::Value,
}

impl Default for CreateConfig {
    fn default() -> Self {
        CreateConfig {
            instance_type: default_type(),
            image: default_image(),
            options: empty_object(),
        }
    }
}

pub(super) fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(Default::default())
}
pub(super) fn default_type() -> String {
    "small".into()
}
pub(super) fn default_image() -> String {
    "default".into()
}

impl TestConfig {
    /// Reads and parses a config file.
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let mut config: TestConfig =
            serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        config.base = berth_config::base_dir(path).to_path_buf();
        Ok(config)
    }
}

pub(super) fn has_all(have: &Tags, want: &Tags) -> Result<(), String> {
    for (k, v) in want {
        match have.get(k) {
            Some(got) if got == v => {}
            Some(got) => return Err(format!("tag {k}={got:?}, expected {v:?}")),
            None => return Err(format!("tag {k} missing")),
        }
    }
    Ok(())
}
