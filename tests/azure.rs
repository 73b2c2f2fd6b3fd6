//! The azure driver against the fake Azure Resource Manager of tests/clouds
//! (VMs made by a PUT by name and deleted through long-running operations,
//! the interfaces, IPs and disks they make and delete with them, nextLink
//! pages, tags and their limits, throttling, core quota), with a service
//! principal's client secret held by the host as an
//! `oauth2-client-credentials` credential, exchanged at the token server of
//! tests/support/tokens.rs.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use berth::conformance::{self, Fault, TestConfig};
use berth::plugin::{Engine, EngineConfig};
use berth_test_clouds::azure::{Cloud, Options};

use crate::support::clouds::{KilledPool, survives_sigkill_during_creates_and_deletes};
use crate::support::config::{CI, OPS};
use crate::support::server::{Berth, Launch, until};
use crate::support::sys::set_own_env_var;
use crate::support::tokens::{TokenConfig, TokenServer};
use crate::support::{KIT_STEPS, plugin, plugins_dir_and_name, workspace};

const CLIENT: &str = "berth-service-principal";
const SECRET: &str = "client-secret-4d2a9c0e7b";
const POOL: &str = "az-itest";
const SUBNET: &str = "/subscriptions/00000000-0000-4000-8000-000000000001/resourceGroups/net/providers/Microsoft.Network/virtualNetworks/ci/subnets/runners";
const IMAGE: &str = "Canonical:ubuntu-24_04-lts:server:latest";
const KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBerthTestKey ops@example";

/// A token server that knows the service principal, and the fake ARM
/// checking its tokens.
async fn clouds(options: Options) -> (TokenServer, Cloud) {
    let tokens = TokenServer::start(TokenConfig {
        lifetime: Duration::from_secs(600),
        client_secrets: vec![(CLIENT.into(), SECRET.into())],
        ..TokenConfig::default()
    })
    .await;
    let cloud = Cloud::start(options, tokens.token_check()).await;
    (tokens, cloud)
}

/// The driver config for `cloud`.
fn driver_config(cloud: &Cloud) -> serde_json::Value {
    let o = Options::default();
    serde_json::json!({
        "subscription-id": o.subscription, "resource-group": o.resource_group,
        "location": o.location, "subnet-id": SUBNET, "endpoint": cloud.url(),
    })
}

fn engine() -> Engine {
    Engine::new(EngineConfig::default()).expect("engine")
}

/// The service principal as an `oauth2-client-credentials` credential for
/// the cloud's host, its secret read from `${var}`.
fn principal(tokens: &TokenServer, cloud: &Cloud, var: &str) -> serde_json::Value {
    serde_json::json!({
        "host": cloud.addr().to_string(), "kind": "oauth2-client-credentials",
        "token-url": tokens.oauth2_token_url(), "client-id": CLIENT,
        "client-secret": format!("${{{var}}}"), "scope": "https://management.azure.com/.default",
    })
}

#[tokio::test]
async fn azure_passes_the_conformance_kit_with_its_recorded_faults() {
    const VAR: &str = "BERTH_ITEST_AZURE_KIT_SECRET";
    const WRONG: &str = "BERTH_ITEST_AZURE_KIT_WRONG_SECRET";
    let (tokens, cloud) = clouds(Options {
        page_size: 2,
        ..Options::default()
    })
    .await;
    // A VM of the group that is no node of berth's: never touched.
    cloud.add_vm("build-agent-1", &[("team", "web")]);
    // The kit reads `${…}` from the environment; these names are this
    // test's own.
    set_own_env_var(VAR, SECRET);
    set_own_env_var(WRONG, "not-the-secret");
    let config = |var: &str| -> TestConfig {
        let mut c: TestConfig = serde_json::from_value(serde_json::json!({
            "config": driver_config(&cloud),
            "allow_hosts": [cloud.addr().to_string()],
            "create": {"instance_type": "Standard_B2s", "image": IMAGE, "options": {"ssh-public-key": KEY}},
            "call_deadline": "30s",
            "instances": 3,
            "credentials": [principal(&tokens, &cloud, var)],
        }))
        .expect("test config");
        c.faults = Fault::from_file(&workspace().join("plugins/azure/faults.json"))
            .expect("the driver's faults");
        c
    };
    let report = conformance::test(&engine(), &plugin("azure"), &config(VAR)).await;
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
    // The cloud's own record: every VM the kit made is deleted, with the
    // interface and disk it made; the VM sent twice was made once; the
    // group's other VM is as it was.
    until(10, "every VM the kit made to be deleted", || async {
        let m = cloud.machines();
        m.iter()
            .all(|m| m.deleted || m.name == "build-agent-1")
            .then_some(())
    })
    .await;
    assert!(
        cloud.made().iter().all(|m| m.deleted),
        "{:#?}",
        cloud.made()
    );
    let names: Vec<String> = cloud.machines().into_iter().map(|m| m.name).collect();
    let unique: BTreeSet<&String> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "one VM per node: {names:?}");
    assert!(
        cloud.knobs().count("vm.put") > names.len() as u64 - 1,
        "the create sent again"
    );
    assert!(
        (cloud.machines().iter()).any(|m| m.name == "build-agent-1" && !m.deleted),
        "the group's other VM was left alone"
    );

    // With a secret the directory does not know, no token is had, the
    // create is refused as unauthorized, and nothing is made.
    let made = cloud.machines().len();
    let report = conformance::test(&engine(), &plugin("azure"), &config(WRONG)).await;
    let create = (report.steps.iter())
        .find(|s| s.name == "create with tags")
        .unwrap_or_else(|| panic!("no create step:\n{report}"));
    assert!(
        !create.passed && create.detail.contains("unauthorized"),
        "{report}"
    );
    assert_eq!(cloud.machines().len(), made);
}

/// The berth config of a pool on the fake cloud: label `ci` with
/// `min_ready` VMs, the client secret from `${var}`.
fn pool_config(
    tokens: &TokenServer,
    cloud: &Cloud,
    state: &Path,
    var: &str,
    min_ready: u32,
) -> String {
    let host = cloud.addr();
    let o = Options::default();
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

[providers.az]
driver = {driver:?}
allow-hosts = ["{host}"]
config = {{ subscription-id = "{sub}", resource-group = "{rg}", location = "{loc}", subnet-id = "{SUBNET}", endpoint = "{url}" }}
[[providers.az.credentials]]
host = "{host}"
kind = "oauth2-client-credentials"
token-url = "{token_url}"
client-id = "{CLIENT}"
client-secret = "${{{var}}}"
scope = "https://management.azure.com/.default"

[labels.ci]
min-ready = {min_ready}
[labels.ci.providers.az]
instance-type = "Standard_B2s"
image = "{IMAGE}"
vcpus = 2
ram = "4GiB"
options = {{ ssh-public-key = "{KEY}" }}
"#,
        state = state.display().to_string(),
        plugins = plugins_dir_and_name(&plugin("azure")).0,
        driver = plugins_dir_and_name(&plugin("azure")).1,
        url = cloud.url(),
        sub = o.subscription,
        rg = o.resource_group,
        loc = o.location,
        token_url = tokens.oauth2_token_url(),
    ) + &crate::support::config::test_store(state)
}

/// SIGKILL during creates and during deletes, with lists lagging: the
/// cloud's own record holds one VM per node berth holds and nothing else,
/// a restart's adoption makes no create
/// ([`survives_sigkill_during_creates_and_deletes`]), and nothing a deleted
/// VM made is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_azure_pool_survives_sigkill_during_creates_and_deletes() {
    const VAR: &str = "BERTH_ITEST_AZURE_POOL_SECRET";
    let (tokens, cloud) = clouds(Options::default()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("berth.toml");
    let state = dir.path().join("state");
    std::fs::write(&config, pool_config(&tokens, &cloud, &state, VAR, 1)).expect("config");
    let machines = survives_sigkill_during_creates_and_deletes(KilledPool {
        knobs: cloud.knobs(),
        machines: &|| cloud.machines(),
        create: "vm.put",
        delete: "vm.delete",
        pool: POOL,
        config: &config,
        dir: dir.path(),
        env: &[(VAR, SECRET)],
    })
    .await;
    let live_vms: BTreeSet<String> = (machines.iter())
        .filter(|m| !m.deleted)
        .map(|m| m.name.clone())
        .collect();
    let left: Vec<_> = (cloud.made().into_iter())
        .filter(|m| !m.deleted && !live_vms.contains(&m.vm))
        .collect();
    assert!(left.is_empty(), "left by deleted VMs: {left:#?}");
}

/// Calls to the cloud per node, from create to delete, through `berth
/// serve`: 20 nodes requested together, released together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_api_calls_per_node_lifecycle() {
    const NODES: u32 = 20;
    const VAR: &str = "BERTH_ITEST_AZURE_CALLS_SECRET";
    let (tokens, cloud) = clouds(Options::default()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let config = dir.path().join("berth.toml");
    // Berth's default sync interval and boot polls, as a real pool runs.
    let text = pool_config(&tokens, &cloud, &state, VAR, 0)
        .replace("sync-interval = \"1s\"\n", "")
        .replace("boot-poll-interval = \"200ms\"\n", "");
    std::fs::write(&config, text).expect("config");
    let cfg = config.display().to_string();
    let args = ["--config", cfg.as_str()];
    let env = [(VAR, SECRET)];
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
        "vm.put",
        "vm.get",
        "vm.list",
        "nic.get",
        "pip.get",
        "vm.patch",
        "vm.delete",
        "operation.get",
    ];
    let total: u64 = ops.iter().map(|op| count(op)).sum();
    let n = u64::from(NODES);
    println!(
        "Azure Resource Manager calls per node lifecycle: {:.2} ({} over {n} nodes)",
        total as f64 / n as f64,
        ops.iter()
            .map(|op| format!("{op} {}", count(op)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    assert_eq!(count("vm.put"), n, "one create per node");
    assert_eq!(
        count("vm.delete"),
        n,
        "one delete per node: ARM has no batch delete"
    );
    // Each VM's addresses are asked of its interface once it is up, then
    // kept in the provider's records: at least once per VM, and at most once
    // per instance of the driver (4, `max-concurrent-calls`) that looked
    // before any had stored them.
    assert!(
        (n..=4 * n).contains(&count("nic.get")),
        "interface lookups: {after:?}"
    );
    // Hand-out tags nothing: nodes launched for the request carry it; and
    // the long-running operations are never polled: the VM says it all.
    assert_eq!(count("vm.patch"), 0);
    assert_eq!(count("operation.get"), 0);
}
