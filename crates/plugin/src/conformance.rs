//! The driver conformance kit: `berth driver check` inspects a driver file
//! without running it; `berth driver test` runs it through the real sandbox
//! against its real endpoint and checks every rule of the contract.

mod config;
mod faults;
mod kit;
mod report;

use std::path::Path;
use std::time::{Duration, Instant};

use crate::{
    AllowedHost, Contract, Engine, Provision, Sandbox, SandboxConfig, SandboxLimits, inspect,
};

pub use config::{CreateConfig, TestConfig};
pub use faults::{Fault, FaultCall};
pub use report::{Report, Step};

use kit::Kit;

/// Checks a driver file without running any of its code: it is a component,
/// it exports this contract version, it imports only what the host provides,
/// it compiles, and its exports have the contract's types.
pub async fn check(engine: &Engine, path: &Path) -> Report {
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
                .partition(|e| e.as_str() == inspection.contract.driver_export());
            let mut said = format!(
                "speaks {}: exports {}",
                inspection.contract,
                ours.first().map_or("", |e| e.as_str())
            );
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
    let engine_check = engine.link_only(bytes, inspection.contract).await;
    report.record(
        "compile and link",
        started,
        engine_check.map(|()| "exports match the contract".to_string()),
    );
    report
}

/// Runs the conformance test: describe → configure → create with tags →
/// listed with those tags → got by id → created again with its token, the
/// same instance → seen by a second instance → set-tags visible → a foreign
/// pool's list does not show it → error mapping (with faults) → delete →
/// gone or terminated, in a list and by id → delete again is not an error →
/// paging → cleanup.
pub async fn test(engine: &Engine, path: &Path, config: &TestConfig) -> Report {
    test_until(engine, path, config, std::future::pending()).await
}

/// [`test`], stopping the steps when `stop` completes (Ctrl-C). Whatever
/// happened, it ends by deleting every instance the run created, waiting
/// out `rate-limited` answers as it goes, and the report's last step says
/// what it deleted.
pub async fn test_until(
    engine: &Engine,
    path: &Path,
    config: &TestConfig,
    stop: impl Future<Output = ()>,
) -> Report {
    let mut report = Report::default();
    let Some((provider, pool_id, contract)) = start(engine, path, config, &mut report).await else {
        return report;
    };
    let mut kit = Kit {
        provider: &provider,
        pool_id,
        contract,
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
    engine: &Engine,
    path: &Path,
    config: &TestConfig,
    report: &mut Report,
) -> Option<(Sandbox, String, Contract)> {
    let started = Instant::now();
    let driver = match engine.load_file(path).await {
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
    let credentials =
        match berth_config::credentials(&config.credentials, &allowed, &config.base, &env) {
            Ok(c) => c,
            Err(e) => return refused(report, e.to_string()),
        };
    let driver_config = match berth_config::interpolate_json(&config.config, &env) {
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
            driver_config: driver_config.to_string(),
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
    ok.then_some((provider, pool_id, driver.contract()))
}
