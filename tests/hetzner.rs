//! The hetzner driver against the fake Hetzner Cloud of tests/clouds
//! (bearer tokens, labels and selectors, pages, `RateLimit-*`, the server
//! limit, unique names, servers booted and deleted through actions), with
//! the project's API token held by the host as a `bearer` credential.

use std::collections::BTreeSet;
use std::path::Path;

use berth::conformance::{self, Fault, TestConfig};
use berth::plugin::{Engine, EngineConfig};
use berth_test_clouds::hetzner::{Cloud, Options};

use crate::support::clouds::{KilledPool, survives_sigkill_during_creates_and_deletes};
use crate::support::config::{CI, OPS};
use crate::support::server::{Berth, Launch, run_berth, until};
use crate::support::sys::set_own_env_var;
use crate::support::{KIT_STEPS, plugin, plugins_dir_and_name, workspace};

const TOKEN: &str = "hcloud-test-token";
/// Stored as it is: lowercase letters, digits and inner `-`, no `z`, need no
/// escape in the label encoding.
const POOL: &str = "hc-itest";

fn engine() -> Engine {
    Engine::new(EngineConfig::default()).expect("engine")
}

/// The project's token as a `bearer` credential for the cloud's host, read
/// from `${var}`.
fn bearer(cloud: &Cloud, var: &str) -> serde_json::Value {
    serde_json::json!({"host": cloud.addr().to_string(), "kind": "bearer", "token": format!("${{{var}}}")})
}

#[tokio::test]
async fn hetzner_passes_the_conformance_kit_with_its_recorded_faults() {
    const VAR: &str = "BERTH_ITEST_HETZNER_KIT_TOKEN";
    const WRONG: &str = "BERTH_ITEST_HETZNER_KIT_WRONG_TOKEN";
    let cloud = Cloud::start(Options::default()).await;
    // The kit reads `${…}` from the environment; these names are this
    // test's own.
    set_own_env_var(VAR, TOKEN);
    set_own_env_var(WRONG, "not-the-token");
    let config = |var: &str| -> TestConfig {
        let mut c: TestConfig = serde_json::from_value(serde_json::json!({
            "config": {"endpoint": cloud.url(), "page-size": 2},
            "allow_hosts": [cloud.addr().to_string()],
            "create": {"instance_type": "cx22", "image": "ubuntu-24.04"},
            "call_deadline": "30s",
            "credentials": [bearer(&cloud, var)],
        }))
        .expect("test config");
        c.faults = Fault::from_file(&workspace().join("plugins/hetzner/faults.json"))
            .expect("the driver's faults");
        c
    };
    let report = conformance::test(&engine(), &plugin("hetzner"), &config(VAR)).await;
    println!("{report}");
    assert!(report.passed(), "{report}");
    for step in KIT_STEPS
        .iter()
        .chain(&["paging", "error mapping", "batches"])
    {
        assert!(
            report.steps.iter().any(|s| s.name == *step && s.passed),
            "{step} did not pass:\n{report}"
        );
    }
    // The cloud's own record: every server the kit made is deleted, and
    // the one it sent twice with one token was made once.
    until(10, "every server the kit made to be deleted", || async {
        cloud.machines().iter().all(|m| m.deleted).then_some(())
    })
    .await;
    let names: Vec<String> = cloud.machines().into_iter().map(|m| m.name).collect();
    let unique: BTreeSet<&String> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "one server per node: {names:?}");
    assert!(
        cloud.knobs().count("servers.create") > names.len() as u64,
        "the create sent again"
    );

    // With a token the project does not know, the create is refused as
    // unauthorized and nothing is made.
    let made = cloud.machines().len();
    let report = conformance::test(&engine(), &plugin("hetzner"), &config(WRONG)).await;
    let create = (report.steps.iter())
        .find(|s| s.name == "create with tags")
        .unwrap_or_else(|| panic!("no create step:\n{report}"));
    assert!(
        !create.passed && create.detail.contains("unauthorized"),
        "{report}"
    );
    assert_eq!(cloud.machines().len(), made);
}

/// The kit as a driver author runs it, through `berth driver test` with
/// the driver's recorded faults and the token from the environment.
#[tokio::test]
async fn hetzner_passes_the_kit_through_the_binary() {
    const VAR: &str = "BERTH_ITEST_HETZNER_BINARY_KIT_TOKEN";
    let cloud = Cloud::start(Options::default()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let provider = dir.path().join("provider.json");
    let json = serde_json::json!({
        "config": {"endpoint": cloud.url(), "page-size": 2},
        "allow_hosts": [cloud.addr().to_string()],
        "create": {"instance_type": "cx22", "image": "ubuntu-24.04"},
        "call_deadline": "30s",
        "credentials": [bearer(&cloud, VAR)],
    });
    std::fs::write(&provider, json.to_string()).expect("provider.json");
    let wasm = plugin("hetzner");
    let faults = workspace().join("plugins/hetzner/faults.json");
    let cache = dir.path().join("cache");
    let args = [
        "driver".as_ref(),
        "test".as_ref(),
        wasm.as_os_str(),
        "--config".as_ref(),
        provider.as_os_str(),
        "--faults".as_ref(),
        faults.as_os_str(),
    ];
    let env: [(&str, &std::ffi::OsStr); 2] = [
        (VAR, TOKEN.as_ref()),
        ("BERTH_CACHE_DIR", cache.as_os_str()),
    ];
    let ran = run_berth(args, &env).await;
    assert!(ran.status.success(), "{ran}");
    for step in KIT_STEPS
        .iter()
        .chain(&["paging", "error mapping", "batches"])
    {
        assert!(
            ran.stdout.contains(&format!("PASS  {step}")),
            "{step}: {ran}"
        );
    }
    until(10, "every server the kit made to be deleted", || async {
        cloud.machines().iter().all(|m| m.deleted).then_some(())
    })
    .await;
}

/// The berth config of a pool on the fake cloud: label `ci` with
/// `min_ready` servers, the token from `${var}`.
fn pool_config(cloud: &Cloud, state: &Path, var: &str, min_ready: u32) -> String {
    let host = cloud.addr();
    format!(
        r#"
pool-id = "{POOL}"
ready = "running"
state-dir = {state:?}
plugins-dir = {plugins:?}
sync-interval = "1s"
boot-poll-interval = "200ms"
leak-grace = "1s"
delete-retry = "1s"

[api]
listen = "127.0.0.1:0"
lease-ttl = "10m"
[api.tokens.ci]
role = "client"
token = "{CI}"
[api.tokens.ops]
role = "admin"
token = "{OPS}"

[providers.hz]
driver = {driver:?}
allow-hosts = ["{host}"]
config = {{ endpoint = "{url}", page-size = 5 }}
[[providers.hz.credentials]]
host = "{host}"
kind = "bearer"
token = "${{{var}}}"

[labels.ci]
min-ready = {min_ready}
[labels.ci.providers.hz]
instance-type = "cx22"
image = "ubuntu-24.04"
vcpus = 2
ram = "4GiB"
"#,
        state = state.display().to_string(),
        plugins = plugins_dir_and_name(&plugin("hetzner")).0,
        driver = plugins_dir_and_name(&plugin("hetzner")).1,
        url = cloud.url(),
    ) + &crate::support::config::test_store(state)
}

/// SIGKILL during creates and during deletes, with lists lagging: the
/// cloud's own record holds one server per node berth holds and nothing
/// else, and a restart's adoption makes no create
/// ([`survives_sigkill_during_creates_and_deletes`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hetzner_pool_survives_sigkill_during_creates_and_deletes() {
    const VAR: &str = "BERTH_ITEST_HETZNER_POOL_TOKEN";
    let cloud = Cloud::start(Options::default()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("berth.toml");
    let state = dir.path().join("state");
    std::fs::write(&config, pool_config(&cloud, &state, VAR, 1)).expect("config");
    survives_sigkill_during_creates_and_deletes(KilledPool {
        knobs: cloud.knobs(),
        machines: &|| cloud.machines(),
        create: "servers.create",
        delete: "servers.delete",
        pool: POOL,
        config: &config,
        dir: dir.path(),
        env: &[(VAR, TOKEN)],
    })
    .await;
}

/// Calls to the cloud per node, from create to delete, through `berth
/// serve`: 20 nodes requested together, released together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hetzner_api_calls_per_node_lifecycle() {
    const NODES: u32 = 20;
    const VAR: &str = "BERTH_ITEST_HETZNER_CALLS_TOKEN";
    let cloud = Cloud::start(Options::default()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let config = dir.path().join("berth.toml");
    // Berth's default sync interval and boot polls, as a real pool runs.
    let text = pool_config(&cloud, &state, VAR, 0)
        .replace("sync-interval = \"1s\"\n", "")
        .replace("boot-poll-interval = \"200ms\"\n", "")
        .replace("page-size = 5", "page-size = 50");
    std::fs::write(&config, text).expect("config");
    let cfg = config.display().to_string();
    let args = ["--config", cfg.as_str()];
    let env = [(VAR, TOKEN)];
    let server = Berth::launch(Launch {
        env: &env,
        ..Launch::new(&args, dir.path())
    })
    .await;
    server.until_ready(60, "the pool listed").await;
    let before = cloud.knobs().calls();
    let request = server.request(CI, &[("ci", NODES)]).await;
    let r = server.fulfilled(CI, &request.id).await;
    for node in &r.nodes {
        let path = format!("/v1/nodes/{}/release", node.id);
        assert_eq!(server.call("POST", &path, Some(CI), None).await.0, 200);
    }
    until(60, "every server deleted", || async {
        let m = cloud.machines();
        (m.len() == NODES as usize && m.iter().all(|m| m.deleted)).then_some(())
    })
    .await;
    server.terminate().await.assert_success();
    let after = cloud.knobs().calls();
    let count =
        |op: &str| after.get(op).copied().unwrap_or(0) - before.get(op).copied().unwrap_or(0);
    let ops = [
        "servers.create",
        "servers.get",
        "servers.list",
        "servers.update",
        "servers.delete",
    ];
    let total: u64 = ops.iter().map(|op| count(op)).sum();
    let n = u64::from(NODES);
    println!(
        "Hetzner API calls per node lifecycle: {:.2} ({} over {n} nodes)",
        total as f64 / n as f64,
        ops.iter()
            .map(|op| format!("{op} {}", count(op)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    assert_eq!(count("servers.create"), n, "one create per node");
    assert_eq!(
        count("servers.delete"),
        n,
        "one delete per node: Hetzner has no batch delete"
    );
    // Hand-out tags nothing: nodes launched for the request carry it.
    assert_eq!(count("servers.update"), 0);
    assert_eq!(count("actions.get"), 0);
}
