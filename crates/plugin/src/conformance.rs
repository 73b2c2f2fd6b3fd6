//! The driver conformance kit: `berth driver check` inspects a driver file
//! without running it; `berth driver test` runs it through the real sandbox
//! against its real endpoint and checks every rule of the contract.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::{
    AllowedHost, Deletion, Provision, Runtime, Sandbox, SandboxConfig, SandboxLimits, inspect,
};
use berth_core::driver::{CreateSpec, InstanceState, LABEL_TAG, NODE_TAG, POOL_TAG, Tags};

/// One line of a report.
#[derive(Clone, Debug)]
pub struct Step {
    pub name: &'static str,
    pub passed: bool,
    pub duration: Duration,
    pub detail: String,
}

/// What a conformance run found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub steps: Vec<Step>,
}

impl Report {
    /// Whether every step passed.
    pub fn passed(&self) -> bool {
        !self.steps.is_empty() && self.steps.iter().all(|s| s.passed)
    }

    fn record(
        &mut self,
        name: &'static str,
        started: Instant,
        result: Result<String, String>,
    ) -> bool {
        let passed = result.is_ok();
        let detail = result.unwrap_or_else(|e| e);
        self.steps.push(Step {
            name,
            passed,
            duration: started.elapsed(),
            detail,
        });
        passed
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for s in &self.steps {
            writeln!(
                f,
                "{}  {:<24} {:>9.1}ms  {}",
                if s.passed { "PASS" } else { "FAIL" },
                s.name,
                s.duration.as_secs_f64() * 1e3,
                s.detail
            )?;
        }
        let passed = self.steps.iter().filter(|s| s.passed).count();
        writeln!(f, "{} passed, {} failed", passed, self.steps.len() - passed)
    }
}

/// Checks a driver file without running any of its code: it is a component,
/// it exports this contract version, it imports only what the host provides,
/// it compiles, and its exports have the contract's types.
pub async fn check(runtime: &Runtime, path: &Path) -> Report {
    let mut report = Report::default();
    let started = Instant::now();
    let bytes = match tokio::fs::read(path).await {
        Ok(b) => b,
        Err(e) => {
            report.record("read", started, Err(format!("{}: {e}", path.display())));
            return report;
        }
    };
    report.record("read", started, Ok(format!("{} bytes", bytes.len())));
    let started = Instant::now();
    let inspection = match inspect(&bytes) {
        Ok(i) => i,
        Err(e) => {
            report.record("contract", started, Err(e.to_string()));
            return report;
        }
    };
    report.record(
        "contract",
        started,
        Ok(format!("exports {}", inspection.exports.join(", "))),
    );
    for import in &inspection.imports {
        let what = match import.provided {
            Provision::Contract => "contract",
            Provision::Inert => "inert (linked, gives nothing)",
            Provision::Missing => "not provided",
        };
        report.steps.push(Step {
            name: "import",
            passed: import.provided != Provision::Missing,
            duration: Duration::ZERO,
            detail: format!("{} — {what}", import.name),
        });
    }
    // Compiling and linking run no guest code; they prove the exports have
    // the contract's types.
    let started = Instant::now();
    let engine_check = runtime.link_only(bytes).await;
    report.record(
        "compile and link",
        started,
        engine_check.map(|()| "exports match the contract".to_string()),
    );
    report
}

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

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(Default::default())
}
fn default_type() -> String {
    "small".into()
}
fn default_image() -> String {
    "default".into()
}

impl TestConfig {
    /// Reads and parses a config file.
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }
}

fn has_all(have: &Tags, want: &Tags) -> Result<(), String> {
    for (k, v) in want {
        match have.get(k) {
            Some(got) if got == v => {}
            Some(got) => return Err(format!("tag {k}={got:?}, expected {v:?}")),
            None => return Err(format!("tag {k} missing")),
        }
    }
    Ok(())
}

/// Runs the conformance test: describe → configure → create with tags →
/// listed with those tags → seen by a second instance → set-tags visible → a foreign pool's list does not
/// show it → delete → gone or terminated → delete again is not an error.
pub async fn test(runtime: &Runtime, path: &Path, config: &TestConfig) -> Report {
    let mut report = Report::default();
    let started = Instant::now();
    let driver = match runtime.load_file(path).await {
        Ok(d) => d,
        Err(e) => {
            report.record("load", started, Err(e.to_string()));
            return report;
        }
    };
    report.record(
        "load",
        started,
        Ok(format!(
            "{:?} in {:.1}ms",
            driver.source(),
            driver.load_time().as_secs_f64() * 1e3
        )),
    );
    let info = driver.info();
    report.steps.push(Step {
        name: "describe",
        passed: !info.name.is_empty() && !info.version.is_empty(),
        duration: Duration::ZERO,
        detail: format!(
            "{} {} ({} config fields, {} label options)",
            info.name,
            info.version,
            info.config.len(),
            info.label_options.len()
        ),
    });

    let mut allowed = Vec::new();
    for h in &config.allow_hosts {
        match AllowedHost::parse(h) {
            Ok(a) => allowed.push(a),
            Err(e) => {
                report.record(
                    "configure",
                    Instant::now(),
                    Err(format!("allow_hosts: {e}")),
                );
                return report;
            }
        }
    }
    let env = |name: &str| std::env::var(name).ok();
    let credentials = match berth_config::credentials(&config.credentials, &allowed, &env) {
        Ok(c) => c,
        Err(e) => {
            report.record("configure", Instant::now(), Err(e.to_string()));
            return report;
        }
    };
    let mut limits = SandboxLimits::default();
    if let Some(d) = &config.call_deadline {
        match berth_core::duration::parse(d) {
            Ok(d) => limits.call_deadline = d,
            Err(e) => {
                report.record(
                    "configure",
                    Instant::now(),
                    Err(format!("call_deadline: {e}")),
                );
                return report;
            }
        }
    }
    let pool_id = config
        .pool_id
        .clone()
        .unwrap_or_else(|| format!("conformance-{:08x}", rand::random::<u32>()));
    let provider = Sandbox::start(
        &driver,
        SandboxConfig {
            name: format!("test:{}", driver.file_name()),
            pool_id: pool_id.clone(),
            driver_config: config.config.to_string(),
            allowed_hosts: allowed,
            // One instance runs the cycle, so each step sees the one before;
            // the "seen by another instance" step checks the rest.
            limits: SandboxLimits {
                max_instances: 1,
                ..limits
            },
            credentials,
            state: None,
            deny: Vec::new(),
            gate: None,
        },
    );
    let started = Instant::now();
    let ok = report.record(
        "configure",
        started,
        provider
            .warm()
            .await
            .map(|()| format!("pool id {pool_id}"))
            .map_err(|e| e.to_string()),
    );
    if !ok {
        return report;
    }
    run_cycle(&provider, &pool_id, config, &mut report).await;
    report
}

async fn run_cycle(provider: &Sandbox, pool_id: &str, config: &TestConfig, report: &mut Report) {
    let node_id = format!("conformance-node-{:08x}", rand::random::<u32>());
    let tags: Tags = [
        (POOL_TAG.to_string(), pool_id.to_string()),
        (NODE_TAG.to_string(), node_id.clone()),
        (LABEL_TAG.to_string(), "conformance".to_string()),
        ("berth-conformance".to_string(), "created".to_string()),
    ]
    .into();
    let spec = CreateSpec {
        node_id: node_id.clone(),
        instance_type: config.create.instance_type.clone(),
        image: config.create.image.clone(),
        tags: tags.clone(),
        user_data: None,
        ssh_public_key: None,
        options: config.create.options.to_string(),
    };
    let pool_filter: Tags = [(POOL_TAG.to_string(), pool_id.to_string())].into();

    let started = Instant::now();
    let created = provider.create(spec).await;
    let instance = match created {
        Ok(i) => {
            let checked = has_all(&i.tags, &tags).map(|()| format!("{} ({})", i.id, i.state));
            if !report.record("create with tags", started, checked) {
                // Still clean up below.
            }
            i
        }
        Err(e) => {
            report.record("create with tags", started, Err(e.to_string()));
            return;
        }
    };
    let id = instance.id.clone();

    let started = Instant::now();
    let listed = provider
        .list(pool_filter.clone())
        .await
        .map_err(|e| e.to_string())
        .and_then(|all| {
            let found = all
                .iter()
                .find(|i| i.id == id)
                .ok_or_else(|| format!("{id} not in a list of {} instances", all.len()))?;
            has_all(&found.tags, &tags)
                .map(|()| format!("{id} listed with its tags ({} in pool)", all.len()))
        });
    report.record("listed with tags", started, listed);

    // The host runs several instances of a driver side by side, so nothing
    // that matters may live in one instance's memory.
    let started = Instant::now();
    let mut other = provider.instance();
    let seen = other.list(pool_filter.clone()).await.map_err(|e| e.to_string()).and_then(|all| {
        if all.iter().any(|i| i.id == id) {
            Ok("a second driver instance lists it".to_string())
        } else {
            Err(format!("a second driver instance does not list {id}: the driver keeps state in memory, but the host runs several instances side by side"))
        }
    });
    report.record("seen by another instance", started, seen);

    let mut new_tags = tags.clone();
    new_tags.remove("berth-conformance");
    new_tags.insert("berth-idle".to_string(), "hold".to_string());
    let started = Instant::now();
    let set = match provider.set_tags(&id, new_tags.clone()).await {
        Err(e) => Err(e.to_string()),
        Ok(()) => provider
            .list(pool_filter.clone())
            .await
            .map_err(|e| e.to_string())
            .and_then(|all| {
                let found = all
                    .iter()
                    .find(|i| i.id == id)
                    .ok_or_else(|| format!("{id} no longer listed"))?;
                has_all(&found.tags, &new_tags)?;
                if found.tags.contains_key("berth-conformance") {
                    return Err("removed tag berth-conformance still present".into());
                }
                Ok("replaced tags visible in list".to_string())
            }),
    };
    report.record("set-tags visible", started, set);

    let started = Instant::now();
    let foreign: Tags = [(POOL_TAG.to_string(), format!("{pool_id}-foreign"))].into();
    let isolated = provider
        .list(foreign)
        .await
        .map_err(|e| e.to_string())
        .and_then(|all| {
            if all.iter().any(|i| i.id == id) {
                Err(format!("{id} shown to a foreign pool id"))
            } else {
                Ok(format!("not shown ({} instances listed)", all.len()))
            }
        });
    report.record("foreign pool isolation", started, isolated);

    let started = Instant::now();
    let deleted = provider
        .delete(&id)
        .await
        .map_err(|e| e.to_string())
        .and_then(|d| match d {
            Deletion::Deleted => Ok("deleted".to_string()),
            Deletion::AlreadyGone => Err("first delete said not-found".to_string()),
        });
    report.record("delete", started, deleted);

    let started = Instant::now();
    let gone = provider
        .list(pool_filter)
        .await
        .map_err(|e| e.to_string())
        .and_then(|all| match all.iter().find(|i| i.id == id) {
            None => Ok("gone".to_string()),
            Some(i) if matches!(i.state, InstanceState::Terminated | InstanceState::Stopping) => {
                Ok(format!("listed as {}", i.state))
            }
            Some(i) => Err(format!("still listed as {}", i.state)),
        });
    report.record("gone after delete", started, gone);

    let started = Instant::now();
    let again = provider
        .delete(&id)
        .await
        .map(|d| format!("{d:?}"))
        .map_err(|e| e.to_string());
    report.record("delete again", started, again);
}
