//! The conformance kit's own promises: its paging and error-mapping steps
//! catch the mistakes they are for, it waits out rate limits, and whatever
//! happens (a step that fails, Ctrl-C) it deletes everything it created,
//! as the cloud's own record shows.

use std::ffi::OsStr;
use std::process::Stdio;
use std::time::Duration;

use berth::conformance::{self, Fault, TestConfig};
use berth::plugin::{Engine, EngineConfig};
use berth::sim::Knobs;
use tokio::io::AsyncReadExt;

use crate::support::server::run_berth;
use crate::support::{SimServer, live, plugin, workspace};

fn engine() -> Engine {
    Engine::new(EngineConfig::default()).expect("engine")
}

/// The careless fixture against `sim`, making `mistake`.
fn careless(sim: &SimServer, mistake: &str) -> TestConfig {
    serde_json::from_value(serde_json::json!({
        "config": {"endpoint": sim.url(), "page_size": 2, "mistake": mistake},
        "allow_hosts": [sim.addr().to_string()],
    }))
    .unwrap()
}

fn sim_faults() -> Vec<Fault> {
    Fault::from_file(&workspace().join("plugins/sim/faults.json")).expect("the sim's faults")
}

/// The names of the steps that failed, and the report.
fn failed(report: &conformance::Report) -> Vec<&'static str> {
    report
        .steps
        .iter()
        .filter(|s| !s.passed)
        .map(|s| s.name)
        .collect()
}

#[tokio::test]
async fn the_paging_step_fails_a_driver_that_reads_one_page() {
    let sim = SimServer::start().await;
    let mut config = careless(&sim, "ignores-paging");
    config.faults = sim_faults();
    let report = conformance::test(&engine(), &plugin("careless"), &config).await;
    assert_eq!(failed(&report), ["paging"], "{report}");
    let paging = report.steps.iter().find(|s| s.name == "paging").unwrap();
    assert!(
        paging.detail.contains("does not follow every page"),
        "{report}"
    );
    // The three instances of the paging step are deleted all the same.
    assert!(live(&sim.cloud).is_empty(), "{:?}", live(&sim.cloud));
    let cleanup = report.steps.last().unwrap();
    assert_eq!(cleanup.name, "cleanup");
    assert!(
        cleanup.detail.starts_with("deleted 3 instances"),
        "{report}"
    );
}

#[tokio::test]
async fn the_error_mapping_step_fails_a_driver_that_takes_a_429_for_transient() {
    let sim = SimServer::start().await;
    let mut config = careless(&sim, "rate-limit-as-transient");
    config.faults = sim_faults();
    let report = conformance::test(&engine(), &plugin("careless"), &config).await;
    assert_eq!(failed(&report), ["error mapping"], "{report}");
    assert!(
        report.to_string().contains("FAIL  error mapping")
            && report
                .to_string()
                .contains("create 429 with retry-after: expected rate-limited, got transient"),
        "{report}"
    );
    // The recorded answers reached no cloud: the sim saw two creates for
    // the cycle (the second with the first's token, which made nothing),
    // two for the batches step and three for paging, nothing more.
    assert_eq!(crate::support::creates(&sim.cloud), 7);
    assert!(live(&sim.cloud).is_empty());
}

#[tokio::test]
async fn the_batches_step_fails_a_driver_that_answers_a_batch_short() {
    let sim = SimServer::start().await;
    let config = careless(&sim, "short-batches");
    let report = conformance::test(&engine(), &plugin("careless"), &config).await;
    assert_eq!(failed(&report), ["batches"], "{report}");
    assert!(
        report
            .to_string()
            .contains("create-many: answered 1 results for 2 items"),
        "{report}"
    );
    // The two instances it made and did not answer for are deleted all
    // the same.
    assert!(live(&sim.cloud).is_empty(), "{:?}", live(&sim.cloud));
}

/// A recorded `200` whose instance is in the sim's `failed` state, as the
/// sim answers `GET /v1/instances/{id}` (`list: false`) or a list
/// (`list: true`), for the instance of the kit's cycle.
fn failed_instance(call: &str, list: bool, reason: &str) -> Fault {
    let instance = serde_json::json!({
        "id": "{{instance-id}}", "state": "failed", "instance_type": "small",
        "image": "ubuntu-24.04", "tags": {"berth-pool": "{{pool-id}}"},
        "created_at_ms": 1, "private_ipv4": "127.1.0.1", "public_ipv4": null,
        "hostname": "i.sim.internal", "ssh_port": 22, "username": "berth",
        "client_token": null, "fault": berth::sim::BOOT_FAULT,
    });
    let body = match list {
        true => serde_json::json!({"instances": [instance], "next_page_token": null}),
        false => instance,
    };
    serde_json::from_value(serde_json::json!({
        "name": format!("{call} of a failed instance, reason {reason:?}"),
        "call": call, "status": 200,
        "headers": {"content-type": "application/json"},
        "body": body.to_string(), "expect": "failed", "reason": reason,
    }))
    .unwrap()
}

#[tokio::test]
async fn the_error_mapping_step_fails_a_driver_that_misses_a_failed_instance() {
    let sim = SimServer::start().await;
    let mut config = careless(&sim, "failed-as-unknown");
    config.faults = sim_faults();
    config
        .faults
        .push(failed_instance("get", false, "failed to boot"));
    let report = conformance::test(&engine(), &plugin("careless"), &config).await;
    assert_eq!(
        failed(&report),
        ["error mapping", "error mapping"],
        "{report}"
    );
    let text = report.to_string();
    for line in [
        "list with an instance whose boot failed: expected failed, got ok",
        "get of a failed instance, reason \"failed to boot\": expected failed, got ok",
    ] {
        assert!(text.contains(line), "{line}\n{report}");
    }
}

#[tokio::test]
async fn the_error_mapping_step_reads_a_failed_instance_and_its_reason() {
    let sim = SimServer::start().await;
    let mut config = careless(&sim, "ignores-paging");
    config.faults = vec![
        failed_instance("get", false, "failed to boot"),
        failed_instance("list", true, "failed to boot"),
        failed_instance("get", false, "out of disk"),
    ];
    let report = conformance::test(&engine(), &plugin("careless"), &config).await;
    let mapping: Vec<_> = (report.steps.iter())
        .filter(|s| s.name == "error mapping")
        .map(|s| (s.passed, s.detail.clone()))
        .collect();
    let reason = berth::sim::BOOT_FAULT;
    assert_eq!(
        mapping,
        [
            (
                true,
                format!("get of a failed instance, reason \"failed to boot\": failed: {reason}")
            ),
            (
                true,
                format!("list of a failed instance, reason \"failed to boot\": failed: {reason}")
            ),
            (
                false,
                format!(
                    "get of a failed instance, reason \"out of disk\": failed with reason \
                     {reason:?}, expected one containing \"out of disk\""
                )
            ),
        ],
        "{report}"
    );
}

#[tokio::test]
async fn the_kit_waits_out_rate_limits_and_passes() {
    let sim = SimServer::start_with(Knobs {
        rate_limit: Some(4.0),
        ..Knobs::default()
    })
    .await;
    let config: TestConfig = serde_json::from_value(serde_json::json!({
        "config": {"endpoint": sim.url(), "page_size": 2},
        "allow_hosts": [sim.addr().to_string()],
    }))
    .unwrap();
    let report = conformance::test(&engine(), &plugin("sim"), &config).await;
    assert!(report.passed(), "{report}");
    let cleanup = report.steps.last().unwrap();
    assert!(cleanup.detail.contains("for rate limits"), "{report}");
    assert!(live(&sim.cloud).is_empty());
}

#[tokio::test]
async fn the_binary_deletes_what_it_created_when_a_step_fails() {
    // Room for three: the fourth instance of the paging step is refused.
    let sim = SimServer::start_with(Knobs {
        quota: Some(3),
        ..Knobs::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = sim.provider_json(dir.path(), None);
    let wasm = plugin("sim");
    let cache = dir.path().join("cache");
    let ran = run_berth(
        [
            OsStr::new("driver"),
            "test".as_ref(),
            wasm.as_ref(),
            "--config".as_ref(),
            config.as_ref(),
            "--instances".as_ref(),
            "5".as_ref(),
        ],
        &[("BERTH_CACHE_DIR", cache.as_ref())],
    )
    .await;
    assert_eq!(ran.status.code(), Some(1), "{ran}");
    assert!(ran.stdout.contains("FAIL  paging"), "{ran}");
    assert!(ran.stdout.contains("create 4 of 5"), "{ran}");
    assert!(
        ran.stdout.contains("PASS  cleanup") && ran.stdout.contains("deleted 3 instances"),
        "{ran}"
    );
    assert!(live(&sim.cloud).is_empty(), "{:?}", live(&sim.cloud));
}

#[tokio::test]
async fn the_binary_deletes_what_it_created_when_interrupted() {
    // Slow creates, so that SIGINT comes in the middle of the paging step.
    let sim = SimServer::start_with(Knobs {
        create_latency_ms: 200,
        ..Knobs::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = sim.provider_json(dir.path(), None);
    let wasm = plugin("sim");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .args([OsStr::new("driver"), "test".as_ref(), wasm.as_ref()])
        .args(["--config".as_ref(), config.as_os_str()])
        .args(["--instances", "50"])
        .env("BERTH_CACHE_DIR", dir.path().join("cache"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("berth driver test");
    // The cycle's instance is deleted, and the batch step's two; then
    // paging creates them one by one.
    let mut waited = 0;
    while live(&sim.cloud).len() < 3 {
        assert!(waited < 600, "the paging step never got going");
        tokio::time::sleep(Duration::from_millis(100)).await;
        waited += 1;
    }
    let pid = child.id().expect("pid") as i32;
    let pid = rustix::process::Pid::from_raw(pid).expect("a child's pid");
    rustix::process::kill_process(pid, rustix::process::Signal::INT).expect("SIGINT sent");
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("berth driver test ends after SIGINT")
        .unwrap();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .await
        .unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .await
        .unwrap();
    assert!(
        err.contains("stopping: deleting what this run created"),
        "{err}"
    );
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(out.contains("FAIL  interrupted"), "{out}");
    assert!(out.contains("PASS  cleanup"), "{out}");
    assert!(live(&sim.cloud).is_empty(), "{:?}\n{out}", live(&sim.cloud));
    // Every instance the sim made for paging, and no fewer, is named as
    // deleted: the cycle's one and the batch step's two were deleted by
    // their steps.
    let made = sim.cloud.instances().len() - 3;
    assert!(
        out.contains(&format!("deleted {made} instances")),
        "{made} made:\n{out}"
    );
}
