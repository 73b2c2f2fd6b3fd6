//! Integration tests through the real host: the real plugins, built here for
//! wasm32-wasip2, loaded into the real sandbox, talking to the simulated cloud
//! over real HTTP on 127.0.0.1.

// Only `tests/support/sys.rs` allows `unsafe` (ARCHITECTURE.md, "Lints and
// unsafe code").
#![deny(unsafe_code)]

mod azure;
mod commands;
mod ec2;
mod events;
mod examples;
mod faults;
mod gce;
mod ha;
mod hetzner;
mod http_edge;
mod in_berth;
mod kit;
mod layers;
mod live_config;
mod openapi;
mod openstack;
mod package;
mod paths;
mod pg_store;
mod pinning;
mod pool;
mod power_loss;
mod readiness;
mod reload;
mod sandbox;
mod schedulers;
mod sdk_js;
mod sdk_python;
mod serve;
mod static_hosts;
mod store_trust;
mod support;
mod templates;
mod tls;
mod token_servers;
mod tokens;
mod ui;

use std::ffi::OsStr;
use std::time::Duration;

use berth::conformance::{self, TestConfig};
use berth::driver::{DriverError, POOL_TAG};
use berth::plugin::{
    AllowedHost, CallErrorKind, Engine, EngineConfig, LoadErrorKind, LoadSource, Rejection,
    Sandbox, SandboxConfig, SandboxLimits, Trap,
};
use support::sandbox::{engine, provider, spec};
use support::server::run_berth;
use support::{KIT_STEPS, LogCapture, SimServer, plugin, plugins_dir_and_name};

async fn hostile(
    engine: &Engine,
    name: &str,
    config: serde_json::Value,
    limits: SandboxLimits,
    allow: &[&str],
) -> Sandbox {
    provider(engine, "hostile", name, config, limits, allow).await
}

fn one_instance(deadline: Duration) -> SandboxLimits {
    SandboxLimits {
        max_instances: 1,
        call_deadline: deadline,
        ..SandboxLimits::default()
    }
}

#[tokio::test]
async fn sim_driver_passes_the_conformance_kit() {
    let sim = SimServer::start().await;
    let config: TestConfig = serde_json::from_value(serde_json::json!({
        "config": {"endpoint": sim.url()},
        "allow_hosts": [sim.addr().to_string()],
    }))
    .unwrap();
    let report = conformance::test(&engine(), &plugin("sim"), &config).await;
    assert!(report.passed(), "{report}");
    assert!(report.to_string().contains("PASS  batches"), "{report}");
    // The sim cloud's own record: one instance, and the batches' two,
    // each created and deleted.
    let all = sim.cloud.instances();
    assert_eq!(all.len(), 3, "{all:?}");
    assert!(
        (all.iter()).all(|i| i.state == berth::sim::InstanceState::Terminated),
        "{all:?}"
    );
    let batches = (sim.cloud.calls().into_iter())
        .filter(|c| c.path.starts_with("/v1/batch/"))
        .map(|c| (c.path, c.items.len()))
        .collect::<Vec<_>>();
    assert_eq!(
        batches,
        [
            ("/v1/batch/create".to_owned(), 2),
            ("/v1/batch/delete".to_owned(), 3)
        ]
    );
}

#[tokio::test]
async fn the_conformance_kit_catches_a_driver_that_keeps_state_in_memory() {
    // The example driver keeps its instances in its own memory: fine for one
    // instance, wrong under a host that runs several side by side.
    let config: TestConfig = serde_json::from_value(serde_json::json!({"config": {}})).unwrap();
    let report = conformance::test(&engine(), &plugin("example"), &config).await;
    let failed: Vec<&str> = report
        .steps
        .iter()
        .filter(|s| !s.passed)
        .map(|s| s.name)
        .collect();
    assert_eq!(failed, ["seen by another instance"], "{report}");
    assert!(!report.passed());
}

#[tokio::test]
async fn the_binary_checks_and_tests_the_sim_driver() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("provider.json");
    std::fs::write(
        &config,
        serde_json::json!({"config": {"endpoint": sim.url()}, "allow_hosts": [sim.addr().to_string()]}).to_string(),
    )
    .unwrap();
    let sim_wasm = plugin("sim");
    let check = run_berth(
        [OsStr::new("driver"), "check".as_ref(), sim_wasm.as_ref()],
        &[],
    )
    .await;
    assert!(check.success(), "{check}");
    assert!(
        check
            .stdout
            .contains("speaks berth:driver@0.2.0: exports berth:driver/driver@0.2.0"),
        "{check}"
    );
    assert!(check.stdout.contains(", 0 failed"), "{check}");

    driver_test_passes(&sim_wasm, &config, &dir.path().join("cache"), &[]).await;
    let out = driver_test_passes_every_step(&sim_wasm, &sim, dir.path()).await;
    assert!(
        out.contains("PASS  error mapping")
            && out.contains("list with an instance whose boot failed: failed: "),
        "{out}"
    );

    // A failing run exits non-zero: the driver cannot reach a host it is not allowed.
    std::fs::write(
        &config,
        serde_json::json!({"config": {"endpoint": sim.url()}, "allow_hosts": []}).to_string(),
    )
    .unwrap();
    let denied = run_berth(
        [
            OsStr::new("driver"),
            "test".as_ref(),
            sim_wasm.as_ref(),
            "--config".as_ref(),
            config.as_ref(),
        ],
        &[],
    )
    .await;
    assert_eq!(denied.code(), Some(1), "{denied}");
    assert!(denied.stdout.contains("FAIL"), "{denied}");
}

#[tokio::test]
async fn a_cpu_loop_is_stopped_at_its_deadline_and_others_keep_working() {
    let rt = engine();
    let looping = hostile(
        &rt,
        "looping",
        serde_json::json!({"mode": "loop"}),
        one_instance(Duration::from_millis(500)),
        &[],
    )
    .await;
    let healthy = hostile(
        &rt,
        "healthy",
        serde_json::json!({"mode": "ok"}),
        one_instance(Duration::from_secs(30)),
        &[],
    )
    .await;

    let stuck = tokio::spawn({
        let looping = looping.clone();
        async move { looping.create(spec("n1")).await }
    });
    // While the guest spins, another provider is served.
    let mut served = 0;
    while !stuck.is_finished() {
        healthy
            .create(spec("other"))
            .await
            .expect("healthy provider serves while another loops");
        served += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(served > 0);
    let err = stuck.await.unwrap().expect_err("loop must not return");
    assert_eq!(
        err.kind.trap(),
        Some(&Trap::Deadline(Duration::from_millis(500))),
        "{err}"
    );
    assert_eq!(err.provider.as_ref(), "looping");
    assert!(
        err.to_string().contains("provider looping: create"),
        "{err}"
    );

    // The one instance slot is free again: the guest was stopped, not abandoned.
    looping
        .list(Default::default())
        .await
        .expect("next call gets a fresh instance");
    let stats = looping.stats();
    assert_eq!(stats.instances_started, 2, "{stats:?}");
    assert_eq!(stats.traps.get("deadline"), Some(&1));
}

#[tokio::test]
async fn waiting_past_the_deadline_is_stopped_too() {
    let rt = engine();
    let sleeper = hostile(
        &rt,
        "sleeper",
        serde_json::json!({"mode": "sleep"}),
        one_instance(Duration::from_millis(300)),
        &[],
    )
    .await;
    let err = sleeper
        .create(spec("n1"))
        .await
        .expect_err("sleep must not return");
    assert!(matches!(err.kind.trap(), Some(Trap::Deadline(_))), "{err}");
    sleeper
        .list(Default::default())
        .await
        .expect("fresh instance after the deadline");
}

#[tokio::test]
async fn allocating_past_the_cap_traps() {
    let rt = engine();
    let limits = SandboxLimits {
        memory_bytes: 32 << 20,
        ..one_instance(Duration::from_secs(30))
    };
    let hog = hostile(
        &rt,
        "hog",
        serde_json::json!({"mode": "alloc"}),
        limits,
        &[],
    )
    .await;
    let err = hog
        .create(spec("n1"))
        .await
        .expect_err("alloc must not succeed");
    assert_eq!(err.kind.trap(), Some(&Trap::OutOfMemory(32 << 20)), "{err}");
    hog.list(Default::default())
        .await
        .expect("fresh instance after out-of-memory");
    assert_eq!(hog.stats().traps.get("out-of-memory"), Some(&1));
}

#[tokio::test(flavor = "current_thread")]
async fn a_host_outside_the_allow_list_is_denied_and_logged() {
    let logs = LogCapture::install();
    let sim = SimServer::start().await;
    let rt = engine();
    // Allowed: nothing on this port. Asked for: the sim cloud.
    let p = hostile(
        &rt,
        "nosy",
        serde_json::json!({"mode": "http", "url": format!("{}/v1/instances", sim.url())}),
        one_instance(Duration::from_secs(30)),
        &["127.0.0.1:1"],
    )
    .await;
    let err = p
        .create(spec("n1"))
        .await
        .expect_err("http mode reports its outcome as an error");
    let msg = err.to_string();
    assert!(
        matches!(err.kind, CallErrorKind::Driver(DriverError::Transient(_))),
        "{msg}"
    );
    assert!(
        msg.contains("http failed") && msg.contains("HttpRequestDenied"),
        "{msg}"
    );
    assert_eq!(p.denied_requests(), 1);
    assert!(
        sim.cloud.calls().is_empty(),
        "the request must never reach the sim cloud"
    );
    let logged = logs.contents();
    assert!(
        logged.contains("outbound request denied")
            && logged.contains("nosy")
            && logged.contains("/v1/instances"),
        "{logged}"
    );

    // The same request to an allowed host goes through (so the denial above is the policy, not a broken fixture).
    let ok = hostile(
        &rt,
        "allowed",
        serde_json::json!({"mode": "http", "url": format!("{}/v1/limits", sim.url())}),
        one_instance(Duration::from_secs(30)),
        &[&sim.addr().to_string()],
    )
    .await;
    let err = ok
        .create(spec("n1"))
        .await
        .expect_err("http mode reports its outcome as an error");
    assert!(err.to_string().contains("http ok: 200"), "{err}");
}

#[tokio::test(flavor = "current_thread")]
async fn cloud_metadata_is_denied_even_when_allow_listed() {
    let logs = LogCapture::install();
    let rt = engine();
    let p = hostile(
        &rt,
        "metadata",
        serde_json::json!({"mode": "metadata"}),
        one_instance(Duration::from_secs(30)),
        &["169.254.169.254", "169.254.169.254:80"],
    )
    .await;
    let err = p
        .create(spec("n1"))
        .await
        .expect_err("metadata mode reports its outcome as an error");
    assert!(err.to_string().contains("http failed"), "{err}");
    assert!(err.to_string().contains("DestinationIpProhibited"), "{err}");
    assert_eq!(p.denied_requests(), 1);
    assert!(
        logs.contents().contains("is link-local, cloud metadata"),
        "{}",
        logs.contents()
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_panic_is_a_typed_error_and_the_next_call_works() {
    let logs = LogCapture::install();
    let rt = engine();
    let p = hostile(
        &rt,
        "panicky",
        serde_json::json!({"mode": "panic"}),
        one_instance(Duration::from_secs(30)),
        &[],
    )
    .await;
    let err = p.create(spec("n1")).await.expect_err("panic");
    match err.kind.trap() {
        Some(Trap::Panic(message)) => assert!(message.contains("fixture panic"), "{message}"),
        other => panic!("expected a panic trap, got {other:?}: {err}"),
    }
    assert!(
        err.to_string()
            .starts_with("provider panicky: create: driver trapped: panicked"),
        "{err}"
    );
    p.list(Default::default()).await.expect("next call works");
    // And again: every panic costs only that instance.
    assert!(p.create(spec("n2")).await.is_err());
    p.list(Default::default()).await.expect("next call works");
    assert_eq!(p.stats().instances_started, 3);
    assert!(logs.contents().contains("fixture panic"));
}

#[tokio::test]
async fn a_driver_sees_no_environment_files_or_sockets() {
    let p = hostile(
        &engine(),
        "snoop",
        serde_json::json!({"mode": "snoop"}),
        one_instance(Duration::from_secs(30)),
        &[],
    )
    .await;
    let err = p
        .create(spec("n1"))
        .await
        .expect_err("snoop reports what it saw as an error");
    let seen = err.to_string();
    assert!(seen.contains("env=[]"), "{seen}");
    assert!(seen.contains("args=[]"), "{seen}");
    assert!(seen.contains("root=Err("), "{seen}");
    assert!(seen.contains("passwd=Err("), "{seen}");
    assert!(seen.contains("tcp=Err("), "{seen}");
}

#[tokio::test(flavor = "current_thread")]
async fn guest_stdio_goes_to_the_host_log() {
    let logs = LogCapture::install();
    let rt = engine();
    let p = hostile(
        &rt,
        "chatty",
        serde_json::json!({"mode": "stdout"}),
        one_instance(Duration::from_secs(30)),
        &[],
    )
    .await;
    p.create(spec("n1")).await.expect("stdout mode creates");
    let logged = logs.contents();
    assert!(
        logged.contains("chatty") && logged.contains("stdout") && logged.contains("stderr"),
        "{logged}"
    );
}

#[tokio::test]
async fn calls_run_concurrently_on_a_bounded_set_of_instances() {
    let sim = SimServer::start().await;
    sim.cloud
        .set_knobs(berth::sim::Knobs {
            create_latency_ms: 200,
            ..Default::default()
        })
        .expect("knobs");
    let limits = SandboxLimits {
        max_instances: 3,
        ..SandboxLimits::default()
    };
    let p = provider(
        &engine(),
        "sim",
        "sim",
        serde_json::json!({"endpoint": sim.url()}),
        limits,
        &[&sim.addr().to_string()],
    )
    .await;
    let creates: Vec<_> = (0..9)
        .map(|i| {
            let p = p.clone();
            tokio::spawn(async move { p.create(spec(&format!("n{i}"))).await })
        })
        .collect();
    for c in creates {
        c.await.unwrap().expect("create");
    }
    let stats = p.stats();
    assert_eq!(stats.instances_started, 3, "{stats:?}");
    // Proof of overlap from the sim cloud's own record: each create takes
    // 200ms to answer, so creates received less than 200ms apart were in
    // flight at the same time.
    let mut received: Vec<u64> = sim
        .cloud
        .calls()
        .iter()
        .filter(|c| c.method == "POST")
        .map(|c| c.at_ms)
        .collect();
    assert_eq!(received.len(), 9);
    received.sort();
    let overlapping = received.windows(2).filter(|w| w[1] - w[0] < 150).count();
    assert!(
        overlapping >= 3,
        "creates did not overlap: received at {received:?}"
    );
    assert_eq!(sim.cloud.instances().len(), 9);
}

#[tokio::test]
async fn bad_files_are_rejected_by_name_and_the_rest_load() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(plugin("sim"), dir.path().join("sim.wasm")).unwrap();
    std::fs::copy(plugin("wrong-version"), dir.path().join("old.wasm")).unwrap();
    std::fs::write(
        dir.path().join("core.wasm"),
        wat::parse_str("(module)").unwrap(),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("garbage.wasm"),
        b"#!/bin/sh\necho not wasm\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("empty.wasm"),
        wat::parse_str("(component)").unwrap(),
    )
    .unwrap();
    std::fs::write(dir.path().join("readme.txt"), b"ignored").unwrap();

    let (loaded, failed) = engine().load_dir(dir.path()).await.unwrap();
    assert_eq!(loaded.len(), 1);
    assert_eq!(loaded[0].info().name, "sim");
    let by_file = |name: &str| {
        failed
            .iter()
            .find(|e| e.path.ends_with(name))
            .unwrap_or_else(|| panic!("{name} not reported: {failed:?}"))
    };
    assert!(
        matches!(by_file("old.wasm").kind, LoadErrorKind::Rejected(Rejection::WrongContract { ref found }) if found == "berth:driver@0.0.9")
    );
    assert!(matches!(
        by_file("core.wasm").kind,
        LoadErrorKind::Rejected(Rejection::CoreModule)
    ));
    assert!(matches!(
        by_file("garbage.wasm").kind,
        LoadErrorKind::Rejected(Rejection::NotWasm)
    ));
    assert!(matches!(
        by_file("empty.wasm").kind,
        LoadErrorKind::Rejected(Rejection::MissingExport { .. })
    ));
    assert_eq!(failed.len(), 4);
    let text = by_file("old.wasm").to_string();
    assert!(
        text.contains("old.wasm")
            && text.contains(
                "targets contract berth:driver@0.0.9; this host supports berth:driver@0.1.0 \
                 and berth:driver@0.2.0"
            ),
        "{text}"
    );
}

#[tokio::test]
async fn a_second_start_loads_from_the_cache() {
    let cache = tempfile::tempdir().unwrap();
    let config = EngineConfig {
        cache_dir: Some(cache.path().to_path_buf()),
        ..EngineConfig::default()
    };
    let first = Engine::new(config.clone())
        .unwrap()
        .load_file(plugin("sim"))
        .await
        .unwrap();
    assert_eq!(first.source(), LoadSource::Compiled);
    let second = Engine::new(config.clone())
        .unwrap()
        .load_file(plugin("sim"))
        .await
        .unwrap();
    assert_eq!(second.source(), LoadSource::Cache);
    assert_eq!(first.sha256(), second.sha256());

    // A corrupt entry is recompiled, never trusted.
    for entry in std::fs::read_dir(cache.path()).unwrap() {
        std::fs::write(entry.unwrap().path(), b"corrupt").unwrap();
    }
    let third = Engine::new(config.clone())
        .unwrap()
        .load_file(plugin("sim"))
        .await
        .unwrap();
    assert_eq!(third.source(), LoadSource::Compiled);
    let fourth = Engine::new(config)
        .unwrap()
        .load_file(plugin("sim"))
        .await
        .unwrap();
    assert_eq!(fourth.source(), LoadSource::Cache);
}

#[tokio::test]
async fn a_bad_config_is_a_typed_error_naming_the_provider() {
    let p = provider(
        &engine(),
        "sim",
        "misconfigured",
        serde_json::json!({"endpoint": "ftp://nowhere"}),
        SandboxLimits::default(),
        &[],
    )
    .await;
    let err = p.warm().await.expect_err("bad endpoint");
    assert!(
        matches!(
            err.kind,
            CallErrorKind::Driver(DriverError::InvalidConfig(_))
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with("provider misconfigured: configure: invalid config"),
        "{err}"
    );
}

#[tokio::test]
async fn config_check_prints_every_problem_with_its_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        format!(
            "pool-id = \"p\"\nplugins-dir = {:?}\n[providers.a]\ndriver = {:?}\n",
            plugins_dir_and_name(&plugin("sim")).0,
            plugins_dir_and_name(&plugin("sim")).1,
        ),
    )
    .unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "pool-id = \"p\"\nsync-interval = \"soon\"\n[providers.a]\ndriver = \"missing.wasm\"\nrate = -1\n",
    )
    .unwrap();
    let run = |file: std::path::PathBuf| async move {
        run_berth([OsStr::new("config"), "check".as_ref(), file.as_ref()], &[]).await
    };
    let out = run(good).await;
    assert_eq!(out.code(), Some(0), "{out}");
    assert!(out.stdout.contains("ok (1 provider, 0 labels)"), "{out}");

    let out = run(bad.clone()).await;
    assert_eq!(out.code(), Some(1), "{out}");
    // Each line leads with the file, line and column of its key.
    let bad = bad.display();
    assert!(
        out.stdout
            .contains(&format!("{bad}:2:1: sync-interval: duration `soon`")),
        "{out}"
    );
    assert!(
        out.stdout
            .contains(&format!("{bad}:5:1: providers.a.rate: must be")),
        "{out}"
    );
    assert!(out.stdout.contains("2 problems"), "{out}");
}

/// The sim cloud wants a bearer token; the host holds it and adds it to the
/// driver's requests to that host. The driver's config, its view of its own
/// request, and the log never hold it.
#[tokio::test]
async fn the_host_adds_a_bearer_token_the_driver_never_holds() {
    const TOKEN: &str = "sim-bearer-4f1c9a7e2b";
    const VAR: &str = "BERTH_TEST_SIM_BEARER_TOKEN";
    let logs = LogCapture::install();
    let sim = SimServer::start_with(berth::sim::Knobs {
        token: Some(TOKEN.into()),
        ..Default::default()
    })
    .await;
    let rt = engine();
    let driver = rt.load_file(plugin("sim")).await.expect("sim loads");
    let addr = sim.addr().to_string();
    let table: toml::Table = toml::from_str(&format!(
        "host = \"{addr}\"\nkind = \"bearer\"\ntoken = \"${{{VAR}}}\""
    ))
    .unwrap();
    let credentials = berth::config::credentials(
        &[toml::Value::Table(table)],
        &[AllowedHost::parse(&addr).unwrap()],
        std::path::Path::new("."),
        &|name: &str| (name == VAR).then(|| TOKEN.to_owned()),
    )
    .expect("credentials");
    let start = |name: &str, credentials| {
        Sandbox::start(
            &driver,
            SandboxConfig {
                name: name.into(),
                pool_id: "pool".into(),
                driver_config: serde_json::json!({"endpoint": sim.url()}).to_string(),
                allowed_hosts: vec![AllowedHost::parse(&addr).unwrap()],
                limits: SandboxLimits::default(),
                credentials,
                state: None,
                deny: Vec::new(),
                gate: None,
            },
        )
    };
    let without = start("without", Vec::new());
    // Every time: the sim cloud reads the body it refuses, so the driver
    // hears the 401 rather than a dropped connection.
    for i in 0..20 {
        let e = without.create(spec(&format!("n-{i}"))).await.unwrap_err();
        assert!(
            matches!(e.kind, CallErrorKind::Driver(DriverError::Unauthorized(_))),
            "{e}"
        );
    }
    let with = start("with", credentials);
    let made = with
        .create(spec("n-2"))
        .await
        .expect("create with the token");
    assert_eq!(made.tags[POOL_TAG], "pool");
    let logged = logs.contents();
    // The capture saw the requests (so it would have seen the token too).
    assert!(logged.matches("outbound request").count() >= 21, "{logged}");
    assert!(!logged.contains(TOKEN), "the token is in the log");
}

/// `berth driver test WASM --config CONFIG [more]` (compiled drivers
/// cached in `cache`) exits 0 with every step of the kit passed, and with
/// the paging and error-mapping steps too when `more` asks for them.
async fn driver_test_passes(
    wasm: &std::path::Path,
    config: &std::path::Path,
    cache: &std::path::Path,
    more: &[&OsStr],
) -> String {
    let mut args = vec![
        OsStr::new("driver"),
        "test".as_ref(),
        wasm.as_ref(),
        "--config".as_ref(),
        config.as_ref(),
    ];
    args.extend_from_slice(more);
    let test = run_berth(args, &[("BERTH_CACHE_DIR", cache.as_ref())]).await;
    assert!(test.success(), "{}: {test}", wasm.display());
    let out = &test.stdout;
    for step in KIT_STEPS {
        assert!(
            out.contains(&format!("PASS  {step}")),
            "{step} missing in\n{out}"
        );
    }
    if !more.is_empty() {
        // Every step runs; the batches only where the driver declares them,
        // a recorded failed instance only for a 0.2 driver.
        assert!(support::skipped_but_declared(out).is_empty(), "{out}");
        assert!(out.contains("PASS  paging"), "{out}");
        let faults = std::fs::read_to_string(sim_faults()).unwrap();
        let recorded = serde_json::from_str::<Vec<serde_json::Value>>(&faults)
            .unwrap()
            .len();
        let skipped = out.matches(support::NO_FAILED_STATE).count();
        let passed = out.matches("PASS  error mapping").count();
        assert_eq!(passed + skipped, recorded, "{out}");
    }
    test.stdout
}

/// The sim's recorded answers for the error-mapping step.
fn sim_faults() -> std::path::PathBuf {
    support::workspace().join("plugins/sim/faults.json")
}

/// The sim driver as built for contract 0.1, kept in the tree as drivers in
/// the wild are, is read as 0.1 and passes every step of the kit, as the
/// 0.2 build of the same driver does.
#[tokio::test]
async fn a_kept_01_driver_passes_the_kit() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let old = plugin("sim-0.1");
    let check = run_berth([OsStr::new("driver"), "check".as_ref(), old.as_ref()], &[]).await;
    assert!(check.success(), "{check}");
    assert!(
        check
            .stdout
            .contains("speaks berth:driver@0.1.0: exports berth:driver/driver@0.1.0"),
        "{check}"
    );
    let out = driver_test_passes_every_step(&old, &sim, dir.path()).await;
    // The recorded failed instance is the one thing 0.1 cannot say.
    assert_eq!(out.matches(support::NO_FAILED_STATE).count(), 1, "{out}");
}

/// [`driver_test_passes`] with a page size (the paging step) and the sim's
/// recorded error responses (`--faults`, the error mapping), in `dir`.
async fn driver_test_passes_every_step(
    wasm: &std::path::Path,
    sim: &SimServer,
    dir: &std::path::Path,
) -> String {
    let config = sim.provider_json(dir, Some(2));
    let faults = sim_faults();
    driver_test_passes(
        wasm,
        &config,
        &dir.join("cache"),
        &["--faults".as_ref(), faults.as_ref()],
    )
    .await
}

/// The drivers written in other languages pass the same kit against the
/// same sim cloud, run as an author runs it: `berth driver test`.
async fn scripted_driver_passes_the_conformance_kit(name: &'static str) {
    let wasm = tokio::task::spawn_blocking(move || support::scripted_plugin(name))
        .await
        .unwrap();
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    driver_test_passes_every_step(&wasm, &sim, dir.path()).await;
}

#[tokio::test]
async fn python_driver_passes_the_conformance_kit() {
    scripted_driver_passes_the_conformance_kit("python-example").await;
}

#[tokio::test]
async fn javascript_driver_passes_the_conformance_kit() {
    scripted_driver_passes_the_conformance_kit("js-example").await;
}
