//! The driver conformance kit: `berth driver check` inspects a driver file
//! without running it; `berth driver test` runs it through the real sandbox
//! against its real endpoint and checks every rule of the contract.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::sandbox::Recorded;
use crate::{
    AllowedHost, CallError, CallErrorKind, Deletion, Provision, Runtime, Sandbox, SandboxConfig,
    SandboxLimits, inspect,
};
use berth_core::driver::{
    CreateSpec, DriverError, Instance, InstanceState, LABEL_TAG, NODE_TAG, POOL_TAG, Tags,
};

/// One line of a report.
#[derive(Clone, Debug)]
pub struct Step {
    pub name: &'static str,
    /// Also true for a step skipped.
    pub passed: bool,
    /// Not run, for want of what it needs (`detail` says what).
    pub skipped: bool,
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
            skipped: false,
            duration: started.elapsed(),
            detail,
        });
        passed
    }

    fn skip(&mut self, name: &'static str, why: &str) {
        self.steps.push(Step {
            name,
            passed: true,
            skipped: true,
            duration: Duration::ZERO,
            detail: why.to_string(),
        });
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for s in &self.steps {
            writeln!(
                f,
                "{}  {:<24} {:>9.1}ms  {}",
                match (s.passed, s.skipped) {
                    (_, true) => "SKIP",
                    (true, false) => "PASS",
                    (false, false) => "FAIL",
                },
                s.name,
                s.duration.as_secs_f64() * 1e3,
                s.detail
            )?;
        }
        let count = |f: fn(&Step) -> bool| self.steps.iter().filter(|s| f(s)).count();
        let skipped = count(|s| s.skipped);
        let failed = count(|s| !s.passed);
        let passed = self.steps.len() - skipped - failed;
        write!(f, "{passed} passed, {failed} failed")?;
        if skipped > 0 {
            write!(f, ", {skipped} skipped")?;
        }
        writeln!(f)
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
        Ok({
            // A toolchain may export more (componentize-py's `exports`);
            // the host uses only the contract's interface.
            let (ours, others): (Vec<&String>, Vec<&String>) = inspection
                .exports
                .iter()
                .partition(|e| e.as_str() == crate::bindings::DRIVER_EXPORT);
            let mut said = format!("exports {}", ours.first().map_or("", |e| e.as_str()));
            if !others.is_empty() {
                let others: Vec<String> = others.iter().map(|e| format!("`{e}`")).collect();
                said.push_str(&format!(
                    "; also exports {}, which the host does not use",
                    others.join(", ")
                ));
            }
            said
        }),
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
            skipped: false,
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
    /// Instances the paging step creates; by default one more than the
    /// page size the driver config names. `--instances` sets it too.
    #[serde(default)]
    pub instances: Option<u32>,
    /// Recorded cloud responses to check the driver's error mapping
    /// against (`--faults FILE`).
    #[serde(skip)]
    pub faults: Vec<Fault>,
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
/// listed with those tags → seen by a second instance → set-tags visible →
/// a foreign pool's list does not show it → error mapping (with faults) →
/// delete → gone or terminated → delete again is not an error → paging →
/// cleanup.
pub async fn test(runtime: &Runtime, path: &Path, config: &TestConfig) -> Report {
    test_until(runtime, path, config, std::future::pending()).await
}

/// [`test`], stopping the steps when `stop` completes (Ctrl-C). Whatever
/// happened, it ends by deleting every instance the run created, waiting
/// out `rate-limited` answers as it goes, and the report's last step says
/// what it deleted.
pub async fn test_until(
    runtime: &Runtime,
    path: &Path,
    config: &TestConfig,
    stop: impl Future<Output = ()>,
) -> Report {
    let mut report = Report::default();
    let Some((provider, pool_id)) = start(runtime, path, config, &mut report).await else {
        return report;
    };
    let mut kit = Kit {
        provider: &provider,
        pool_id,
        config,
        nodes: Vec::new(),
        created: Vec::new(),
        deleted: Vec::new(),
        waited: Duration::ZERO,
    };
    let interrupted = {
        let steps = kit.run(&mut report);
        tokio::pin!(steps);
        tokio::select! {
            () = &mut steps => false,
            () = stop => true,
        }
    };
    if interrupted {
        report.steps.push(Step {
            name: "interrupted",
            passed: false,
            skipped: false,
            duration: Duration::ZERO,
            detail: "stopped by a signal; cleaning up".into(),
        });
    }
    kit.cleanup(&mut report).await;
    report
}

/// Loads the driver and configures a provider on it.
async fn start(
    runtime: &Runtime,
    path: &Path,
    config: &TestConfig,
    report: &mut Report,
) -> Option<(Sandbox, String)> {
    let started = Instant::now();
    let driver = match runtime.load_file(path).await {
        Ok(d) => d,
        Err(e) => {
            report.record("load", started, Err(e.to_string()));
            return None;
        }
    };
    report.record(
        "load",
        started,
        Ok(format!(
            "{} in {:.1}ms",
            match driver.source() {
                crate::LoadSource::Compiled => "compiled",
                crate::LoadSource::Cache => "loaded from the compiled cache",
            },
            driver.load_time().as_secs_f64() * 1e3
        )),
    );
    let info = driver.info();
    report.steps.push(Step {
        name: "describe",
        passed: !info.name.is_empty() && !info.version.is_empty(),
        skipped: false,
        duration: Duration::ZERO,
        detail: format!(
            "{} {} ({} config fields, {} label options)",
            info.name,
            info.version,
            info.config.len(),
            info.label_options.len()
        ),
    });

    let refused = |report: &mut Report, why: String| {
        report.record("configure", Instant::now(), Err(why));
        None
    };
    let mut allowed = Vec::new();
    for h in &config.allow_hosts {
        match AllowedHost::parse(h) {
            Ok(a) => allowed.push(a),
            Err(e) => return refused(report, format!("allow_hosts: {e}")),
        }
    }
    let env = |name: &str| std::env::var(name).ok();
    let credentials = match berth_config::credentials(&config.credentials, &allowed, &env) {
        Ok(c) => c,
        Err(e) => return refused(report, e.to_string()),
    };
    let mut limits = SandboxLimits::default();
    if let Some(d) = &config.call_deadline {
        match berth_core::duration::parse(d) {
            Ok(d) => limits.call_deadline = d,
            Err(e) => return refused(report, format!("call_deadline: {e}")),
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
    ok.then_some((provider, pool_id))
}

/// Longest a run waits out `rate-limited` answers for one call.
const RATE_LIMIT_PATIENCE: Duration = Duration::from_secs(120);

/// One conformance run against a configured provider: what it asked the
/// cloud for, so that the cleanup can delete all of it.
struct Kit<'a> {
    provider: &'a Sandbox,
    pool_id: String,
    config: &'a TestConfig,
    /// Every node id the run sent a create for, noted before the create
    /// went out: the cleanup also finds an instance whose create answer
    /// never arrived.
    nodes: Vec<String>,
    /// Instance ids creates returned.
    created: Vec<String>,
    /// Instance ids a step deleted.
    deleted: Vec<String>,
    /// Time spent waiting out `rate-limited` answers.
    waited: Duration,
}

impl Kit<'_> {
    fn pool_filter(&self) -> Tags {
        [(POOL_TAG.to_string(), self.pool_id.clone())].into()
    }

    /// A create spec for a fresh node id of this run.
    fn spec(&mut self, purpose: &str) -> CreateSpec {
        let node_id = format!("conformance-node-{:08x}", rand::random::<u32>());
        self.nodes.push(node_id.clone());
        CreateSpec {
            node_id: node_id.clone(),
            instance_type: self.config.create.instance_type.clone(),
            image: self.config.create.image.clone(),
            tags: [
                (POOL_TAG.to_string(), self.pool_id.clone()),
                (NODE_TAG.to_string(), node_id),
                (LABEL_TAG.to_string(), "conformance".to_string()),
                ("berth-conformance".to_string(), purpose.to_string()),
            ]
            .into(),
            user_data: None,
            ssh_public_key: None,
            options: self.config.create.options.to_string(),
        }
    }

    /// Makes a call again after each `rate-limited` answer, never before
    /// its `retry-after` has passed, and at least twice as long after as
    /// the time before (a call of several requests, a list of many pages,
    /// needs the cloud's budget to build up again); gives up when waiting
    /// would pass [`RATE_LIMIT_PATIENCE`] for the call.
    async fn patiently<T, F, Fut>(&mut self, mut call: F) -> Result<T, CallError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, CallError>>,
    {
        let mut waited = Duration::ZERO;
        let mut last = Duration::ZERO;
        loop {
            match call().await {
                Err(e) => match rate_limited(&e).map(|after| after.max(last * 2)) {
                    Some(wait) if waited + wait <= RATE_LIMIT_PATIENCE => {
                        tokio::time::sleep(wait).await;
                        waited += wait;
                        last = wait;
                        self.waited += wait;
                    }
                    _ => return Err(e),
                },
                done => return done,
            }
        }
    }

    async fn create(&mut self, spec: CreateSpec) -> Result<Instance, CallError> {
        let provider = self.provider;
        let made = self.patiently(|| provider.create(spec.clone())).await;
        if let Ok(i) = &made {
            self.created.push(i.id.clone());
        }
        made
    }

    async fn list(&mut self, filter: Tags) -> Result<Vec<Instance>, CallError> {
        let provider = self.provider;
        self.patiently(|| provider.list(filter.clone())).await
    }

    async fn delete(&mut self, id: &str) -> Result<Deletion, CallError> {
        let provider = self.provider;
        let done = self.patiently(|| provider.delete(id)).await;
        if done.is_ok() {
            self.deleted.push(id.to_string());
        }
        done
    }

    async fn run(&mut self, report: &mut Report) {
        if let Some(id) = self.cycle(report).await {
            self.faults(&id, report).await;
            self.removal(&id, report).await;
        }
        self.paging(report).await;
    }

    /// Create, list, another instance's list, set-tags, foreign pool; the
    /// id of the instance created.
    async fn cycle(&mut self, report: &mut Report) -> Option<String> {
        let spec = self.spec("created");
        let tags = spec.tags.clone();
        let started = Instant::now();
        let instance = match self.create(spec).await {
            Ok(i) => {
                let checked = has_all(&i.tags, &tags).map(|()| format!("{} ({})", i.id, i.state));
                report.record("create with tags", started, checked);
                i
            }
            Err(e) => {
                report.record("create with tags", started, Err(e.to_string()));
                return None;
            }
        };
        let id = instance.id.clone();

        let started = Instant::now();
        let shown = self
            .list(self.pool_filter())
            .await
            .map_err(|e| e.to_string())
            .and_then(|all| {
                has_all(&listed(&all, &id)?.tags, &tags)
                    .map(|()| format!("{id} listed with its tags ({} in pool)", all.len()))
            });
        report.record("listed with tags", started, shown);

        // The host runs several instances of a driver side by side, so
        // nothing that matters may live in one instance's memory.
        let started = Instant::now();
        let mut other = self.provider.instance();
        let filter = self.pool_filter();
        let (mut waited, mut last) = (Duration::ZERO, Duration::ZERO);
        let seen = loop {
            match other.list(filter.clone()).await {
                Err(e) => match rate_limited(&e).map(|after| after.max(last * 2)) {
                    Some(wait) if waited + wait <= RATE_LIMIT_PATIENCE => {
                        tokio::time::sleep(wait).await;
                        waited += wait;
                        last = wait;
                    }
                    _ => break Err(e),
                },
                listed => break listed,
            }
        };
        self.waited += waited;
        let seen = seen
            .map_err(|e| e.to_string())
            .and_then(|all| {
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
        let provider = self.provider;
        let set = match self
            .patiently(|| provider.set_tags(&id, new_tags.clone()))
            .await
        {
            Err(e) => Err(e.to_string()),
            Ok(()) => self
                .list(self.pool_filter())
                .await
                .map_err(|e| e.to_string())
                .and_then(|all| {
                    let found = listed(&all, &id)?;
                    has_all(&found.tags, &new_tags)?;
                    if found.tags.contains_key("berth-conformance") {
                        return Err("removed tag berth-conformance still present".into());
                    }
                    Ok("replaced tags visible in list".to_string())
                }),
        };
        report.record("set-tags visible", started, set);

        let started = Instant::now();
        let foreign: Tags = [(POOL_TAG.to_string(), format!("{}-foreign", self.pool_id))].into();
        let isolated = self
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
        Some(id)
    }

    /// Delete, gone after delete, delete again.
    async fn removal(&mut self, id: &str, report: &mut Report) {
        let started = Instant::now();
        let deleted = self
            .delete(id)
            .await
            .map_err(|e| e.to_string())
            .and_then(|d| match d {
                Deletion::Deleted => Ok("deleted".to_string()),
                Deletion::AlreadyGone => Err("first delete said not-found".to_string()),
            });
        report.record("delete", started, deleted);

        let started = Instant::now();
        let gone = self
            .list(self.pool_filter())
            .await
            .map_err(|e| e.to_string())
            .and_then(|all| match all.iter().find(|i| i.id == id) {
                None => Ok("gone".to_string()),
                Some(i)
                    if matches!(i.state, InstanceState::Terminated | InstanceState::Stopping) =>
                {
                    Ok(format!("listed as {}", i.state))
                }
                Some(i) => Err(format!("still listed as {}", i.state)),
            });
        report.record("gone after delete", started, gone);

        let started = Instant::now();
        let again = self
            .delete(id)
            .await
            .map(|d| format!("{d:?}"))
            .map_err(|e| e.to_string());
        report.record("delete again", started, again);
    }

    /// Creates more than one page's worth of instances and checks that one
    /// list shows every one of them, once.
    async fn paging(&mut self, report: &mut Report) {
        let wanted = match self.config.instances {
            Some(n) => n,
            None => match page_size(&self.config.config) {
                Some(page) => page.saturating_add(1),
                None => {
                    report.skip(
                        "paging",
                        "the driver config names no page size (page_size); \
                         --instances N creates N instances to check that list follows every page",
                    );
                    return;
                }
            },
        };
        if wanted == 0 {
            report.skip("paging", "--instances 0");
            return;
        }
        let started = Instant::now();
        let mut ids = Vec::new();
        for n in 0..wanted {
            let spec = self.spec("paging");
            match self.create(spec).await {
                Ok(i) => ids.push(i.id),
                Err(e) => {
                    report.record(
                        "paging",
                        started,
                        Err(format!("create {} of {wanted}: {e}", n + 1)),
                    );
                    return;
                }
            }
        }
        let checked = self
            .list(self.pool_filter())
            .await
            .map_err(|e| e.to_string())
            .and_then(|all| {
                let mut missing = ids.clone();
                missing.retain(|id| !all.iter().any(|i| &i.id == id));
                let mut seen = std::collections::BTreeSet::new();
                let twice: Vec<&str> = all
                    .iter()
                    .filter(|i| !seen.insert(i.id.as_str()))
                    .map(|i| i.id.as_str())
                    .collect();
                if !missing.is_empty() {
                    Err(format!(
                        "one list shows {} of the {wanted} instances created ({} listed in all): \
                         the driver does not follow every page; missing {}",
                        wanted as usize - missing.len(),
                        all.len(),
                        sample(&missing)
                    ))
                } else if !twice.is_empty() {
                    Err(format!("one list shows {} twice", sample(&twice)))
                } else {
                    Ok(format!(
                        "one list shows all {wanted} instances created ({} listed in all)",
                        all.len()
                    ))
                }
            });
        report.record("paging", started, checked);
    }

    /// Each recorded response in turn: the driver's answer to it must be
    /// the error case the author expects.
    async fn faults(&mut self, id: &str, report: &mut Report) {
        if self.config.faults.is_empty() {
            report.skip(
                "error mapping",
                "no --faults file: recorded cloud responses check how the driver maps each one",
            );
            return;
        }
        for fault in self.config.faults.clone() {
            let started = Instant::now();
            let before = self.provider.answered_requests();
            self.provider.answer_with(Some(Recorded {
                status: fault.status,
                headers: fault.headers.clone().into_iter().collect(),
                body: fault.body.clone(),
            }));
            let answer = match fault.call {
                FaultCall::Create => {
                    let spec = self.spec("fault");
                    self.provider.create(spec).await.map(|_| "ok")
                }
                FaultCall::List => self.provider.list(self.pool_filter()).await.map(|_| "ok"),
                FaultCall::Delete => self.provider.delete(id).await.map(|d| match d {
                    Deletion::Deleted => "ok",
                    Deletion::AlreadyGone => "not-found",
                }),
                FaultCall::SetTags => {
                    let tags = self.pool_filter();
                    self.provider.set_tags(id, tags).await.map(|()| "ok")
                }
            };
            self.provider.answer_with(None);
            let answered = self.provider.answered_requests() - before;
            let verdict = fault.judge(answered, answer);
            report.steps.push(Step {
                name: "error mapping",
                passed: verdict.is_ok(),
                skipped: false,
                duration: started.elapsed(),
                detail: format!("{}: {}", fault.title(), verdict.unwrap_or_else(|e| e)),
            });
        }
    }

    /// Deletes whatever the run created that is still there: every id a
    /// create returned and not deleted since, and every instance the
    /// cloud lists with one of the run's node ids.
    async fn cleanup(&mut self, report: &mut Report) {
        let started = Instant::now();
        let mut left: Vec<String> = self
            .created
            .iter()
            .filter(|id| !self.deleted.contains(id))
            .cloned()
            .collect();
        let mut unlisted = None;
        if !self.nodes.is_empty() {
            match self.list(self.pool_filter()).await {
                Ok(all) => {
                    for i in all {
                        let ours = i.tags.get(NODE_TAG).is_some_and(|n| self.nodes.contains(n));
                        if ours && i.state != InstanceState::Terminated && !left.contains(&i.id) {
                            left.push(i.id);
                        }
                    }
                }
                Err(e) => unlisted = Some(e.to_string()),
            }
        }
        let mut deleted = Vec::new();
        let mut failed = Vec::new();
        for id in left {
            match self.delete(&id).await {
                Ok(Deletion::Deleted) => deleted.push(id),
                Ok(Deletion::AlreadyGone) => {}
                Err(e) => failed.push(format!("{id} ({e})")),
            }
        }
        let mut detail = match deleted.len() {
            0 => "nothing left to delete".to_string(),
            n => format!(
                "deleted {n} instance{} the run created: {}",
                if n == 1 { "" } else { "s" },
                deleted.join(", ")
            ),
        };
        if !self.waited.is_zero() {
            detail.push_str(&format!(
                "; waited {:.1}s in all for rate limits",
                self.waited.as_secs_f64()
            ));
        }
        let result = match (failed.is_empty(), unlisted) {
            (true, None) => Ok(detail),
            (true, Some(why)) => Err(format!(
                "{detail}; could not list the pool to find instances whose create did not answer: {why}"
            )),
            (false, _) => Err(format!(
                "{detail}; NOT deleted, delete by hand: {}",
                failed.join(", ")
            )),
        };
        report.record("cleanup", started, result);
    }
}

/// The instance `id` in a list, or what the list shows instead.
fn listed<'a>(all: &'a [Instance], id: &str) -> Result<&'a Instance, String> {
    all.iter()
        .find(|i| i.id == id)
        .ok_or_else(|| format!("{id} not in a list of {} instances", all.len()))
}

/// How long to wait before calling again, for a `rate-limited` answer.
fn rate_limited(e: &CallError) -> Option<Duration> {
    match &e.kind {
        CallErrorKind::Driver(DriverError::RateLimited { retry_after, .. }) => {
            Some((*retry_after).max(Duration::from_millis(10)))
        }
        _ => None,
    }
}

/// The page size a driver config names, under the usual spellings.
fn page_size(config: &serde_json::Value) -> Option<u32> {
    ["page_size", "page-size", "pageSize", "per_page"]
        .iter()
        .find_map(|k| config.get(k)?.as_u64())
        .and_then(|n| u32::try_from(n).ok())
}

/// Up to three ids, and how many more.
fn sample<S: AsRef<str>>(ids: &[S]) -> String {
    let shown: Vec<&str> = ids.iter().take(3).map(AsRef::as_ref).collect();
    match ids.len() {
        n if n > 3 => format!("{} and {} more", shown.join(", "), n - 3),
        _ => shown.join(", "),
    }
}

/// The contract's name of an error case.
fn case(e: &DriverError) -> &'static str {
    match e {
        DriverError::RateLimited { .. } => "rate-limited",
        DriverError::QuotaExceeded(_) => "quota-exceeded",
        DriverError::Capacity { .. } => "capacity",
        DriverError::NotFound(_) => "not-found",
        DriverError::Unauthorized(_) => "unauthorized",
        DriverError::InvalidConfig(_) => "invalid-config",
        DriverError::Transient(_) => "transient",
        DriverError::Permanent(_) => "permanent",
    }
}

/// The answers a fault may expect.
const CASES: [&str; 9] = [
    "ok",
    "rate-limited",
    "quota-exceeded",
    "capacity",
    "not-found",
    "unauthorized",
    "invalid-config",
    "transient",
    "permanent",
];

/// The call a recorded response is given to.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, strum::Display)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum FaultCall {
    Create,
    List,
    Delete,
    SetTags,
}

/// One entry of a `--faults` file: a response the cloud gives, and the
/// error case the driver must turn it into.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    /// The call to make while every request is answered with this.
    pub call: FaultCall,
    /// The response's status, headers and body, as the cloud sends them.
    pub status: u16,
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub body: String,
    /// What the driver must answer: an error case of the contract
    /// (`rate-limited`, `not-found`, …) or `ok`.
    pub expect: String,
    /// With `rate-limited`: the `retry-after` the driver must report.
    #[serde(default)]
    pub retry_after_ms: Option<u64>,
    /// A name for the report; `CALL STATUS` by default.
    #[serde(default)]
    pub name: Option<String>,
}

impl Fault {
    /// Reads a `--faults` file: a JSON array of entries.
    pub fn from_file(path: &Path) -> anyhow::Result<Vec<Fault>> {
        let at = |e: &dyn std::fmt::Display| anyhow::anyhow!("{}: {e}", path.display());
        let text = std::fs::read_to_string(path).map_err(|e| at(&e))?;
        let faults: Vec<Fault> = serde_json::from_str(&text).map_err(|e| at(&e))?;
        for (n, f) in faults.iter().enumerate() {
            if !CASES.contains(&f.expect.as_str()) {
                return Err(at(&format!(
                    "entry {n}: expect {:?} is not one of {}",
                    f.expect,
                    CASES.join(", ")
                )));
            }
            if !(100..=599).contains(&f.status) {
                return Err(at(&format!(
                    "entry {n}: status {} is not 100 to 599",
                    f.status
                )));
            }
            if f.retry_after_ms.is_some() && f.expect != "rate-limited" {
                return Err(at(&format!(
                    "entry {n}: retry_after_ms goes with expect \"rate-limited\" only"
                )));
            }
        }
        Ok(faults)
    }

    fn title(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| format!("{} {}", self.call, self.status))
    }

    /// Whether the driver's `answer`, after `answered` recorded responses,
    /// is what the entry expects.
    fn judge(&self, answered: u64, answer: Result<&str, CallError>) -> Result<String, String> {
        if answered == 0 {
            return Err(format!(
                "the driver sent no request to be answered ({})",
                match &answer {
                    Ok(a) => (*a).to_string(),
                    Err(e) => e.kind.to_string(),
                }
            ));
        }
        let (got, retry_after) = match &answer {
            Ok(a) => (*a, None),
            Err(CallError {
                kind: CallErrorKind::Driver(e),
                ..
            }) => (
                case(e),
                match e {
                    DriverError::RateLimited { retry_after, .. } => Some(*retry_after),
                    _ => None,
                },
            ),
            Err(e) => return Err(format!("expected {}, got {}", self.expect, e.kind)),
        };
        if got != self.expect {
            let said = match &answer {
                Err(e) => format!(" ({})", e.kind),
                Ok(_) => String::new(),
            };
            return Err(format!("expected {}, got {got}{said}", self.expect));
        }
        match (self.retry_after_ms, retry_after) {
            (Some(want), Some(got)) if got.as_millis() != u128::from(want) => Err(format!(
                "rate-limited with retry-after {}ms, expected {want}ms",
                got.as_millis()
            )),
            (_, Some(after)) => Ok(format!("{got}, retry after {}ms", after.as_millis())),
            _ => Ok(got.to_string()),
        }
    }
}
