//! The hetzner driver against the fake Hetzner Cloud of tests/clouds
//! (bearer tokens, labels and selectors, pages, `RateLimit-*`, the server
//! limit, unique names, servers booted and deleted through actions), with
//! the project's API token held by the host as a `bearer` credential.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use berth::conformance::{self, Fault, TestConfig};
use berth::plugin::{Engine, EngineConfig};
use berth_test_clouds::common::live_by_node;
use berth_test_clouds::hetzner::{Cloud, Options};

use crate::support::config::{CI, OPS};
use crate::support::server::{Berth, Launch, run_berth, until};
use crate::support::sys::set_own_env_var;
use crate::support::{KIT_STEPS, plugin, workspace};

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
        driver = plugin("hetzner").display().to_string(),
        url = cloud.url(),
    ) + &crate::support::config::test_store(state)
}

/// Nodes berth holds that are not gone, with their instance ids.
async fn held_nodes(server: &Berth) -> Vec<(String, String)> {
    let (_, nodes) = server.call("GET", "/v1/nodes", Some(OPS), None).await;
    (nodes.as_array().into_iter().flatten())
        .filter(|n| n["state"] != "gone")
        .map(|n| {
            let field = |k: &str| n[k].as_str().unwrap_or_default().to_owned();
            (field("id"), field("instance"))
        })
        .collect()
}

/// SIGKILL while creates are answered (the cloud made the server, berth
/// never heard), with lists lagging behind creates, then while deletes are;
/// then the cloud's own record holds one server per node berth holds and
/// nothing else, and a restart's adoption makes no create.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hetzner_pool_survives_sigkill_during_creates_and_deletes() {
    const KILLS: usize = 4;
    const VAR: &str = "BERTH_ITEST_HETZNER_POOL_TOKEN";
    let cloud = Cloud::start(Options::default()).await;
    cloud.knobs().hold("servers.create", Duration::from_secs(1));
    cloud.knobs().set_lag(Duration::from_secs(3));
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let config = dir.path().join("berth.toml");
    std::fs::write(&config, pool_config(&cloud, &state, VAR, 1)).expect("config");
    let cfg = config.display().to_string();
    let args = ["--config", cfg.as_str()];
    let env = [(VAR, TOKEN)];
    let launch = || Launch {
        env: &env,
        ..Launch::new(&args, dir.path())
    };
    let made = || cloud.machines().len();
    let mut handed = Vec::new();
    for round in 0..KILLS {
        let server = Berth::launch(launch()).await;
        if round > 0 {
            server
                .until_label_ready(60, "ci", 1, "the cut-off create resolved")
                .await;
            let request = server.request(CI, &[("ci", 1)]).await;
            let r = server.fulfilled(CI, &request.id).await;
            handed.extend(r.nodes.into_iter().map(|n| n.id));
        }
        until(30, "the cloud to make the next server", || async {
            (made() > round).then_some(())
        })
        .await;
        server.signal(libc::SIGKILL);
        server.exit_within(Duration::from_secs(30)).await;
    }
    // Deletes cut off: the released nodes' DELETEs are held, and berth is
    // killed once the cloud has taken the first.
    cloud.knobs().hold("servers.delete", Duration::from_secs(1));
    let server = Berth::launch(launch()).await;
    server
        .until_label_ready(60, "ci", 1, "the last create resolved")
        .await;
    let deletes = cloud.knobs().count("servers.delete");
    for node in &handed {
        let (s, n) = server
            .call("POST", &format!("/v1/nodes/{node}/release"), Some(CI), None)
            .await;
        assert_eq!(s, 200, "{n}");
    }
    until(30, "a delete to reach the cloud", || async {
        (cloud.knobs().count("servers.delete") > deletes).then_some(())
    })
    .await;
    server.signal(libc::SIGKILL);
    server.exit_within(Duration::from_secs(30)).await;

    cloud.knobs().hold("servers.delete", Duration::ZERO);
    let server = Berth::launch(launch()).await;
    server
        .until_label_ready(60, "ci", 1, "the pool settled")
        .await;
    until(60, "every released node's server to be gone", || async {
        let machines = cloud.machines();
        let live = live_by_node(&machines, "berth-pool", POOL, "berth-node");
        (live.len() == 1).then_some(())
    })
    .await;
    // The cloud's record: one live server per node berth holds, none twice,
    // none berth does not hold.
    let machines = cloud.machines();
    let live = live_by_node(&machines, "berth-pool", POOL, "berth-node");
    assert!(live.values().all(|m| m.len() == 1), "duplicates: {live:#?}");
    let held: BTreeSet<String> = held_nodes(&server)
        .await
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let in_cloud: BTreeSet<String> = live.keys().cloned().collect();
    assert_eq!(in_cloud, held, "leaks or losses: {machines:#?}");
    // Each cut-off create, sent again after the kill, was answered with
    // the server the first one made: one server per round, none made again
    // (a create given up would leave its server to be deleted as a leak,
    // and launch another), and the only ones deleted are the nodes given
    // back.
    assert_eq!(
        machines.len(),
        KILLS,
        "one server per cut-off create: {machines:#?}"
    );
    let deleted: BTreeSet<String> = (machines.iter())
        .filter(|m| m.deleted)
        .filter_map(|m| m.tag("berth-node").map(str::to_owned))
        .collect();
    assert_eq!(deleted, handed.iter().cloned().collect(), "{machines:#?}");
    assert!(
        cloud.knobs().count("servers.create") > KILLS as u64,
        "the creates were sent again: {:?}",
        cloud.knobs().calls()
    );

    // A restart adopts what is there and makes nothing.
    let creates = cloud.knobs().count("servers.create");
    server.terminate().await.assert_success();
    let server = Berth::launch(launch()).await;
    server.until_ready(60, "the restarted pool listed").await;
    server
        .until_label_ready(60, "ci", 1, "the node adopted")
        .await;
    assert_eq!(
        cloud.knobs().count("servers.create"),
        creates,
        "{:?}",
        cloud.knobs().calls()
    );
    assert_eq!(cloud.machines().len(), machines.len());
    server.terminate().await.assert_success();
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
