//! The openstack driver against the fake Nova of `tests/clouds`, with berth
//! holding a `keystone` credential that the Keystone token server of
//! `tests/support/tokens.rs` exchanges, and Nova taking only the tokens that
//! server issued: the conformance kit with every step, paging and Nova's
//! recorded faults; every page of a list followed; a pool under `berth
//! serve` killed with SIGKILL while Nova made servers it never got to
//! answer for (and a list lagging behind) and while it deleted them, with
//! no server leaked or made twice; and the calls one node's lifecycle
//! costs. Nova's own record (`Nova::machines`) is what is counted.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use berth::config::{self, Settings};
use berth::conformance::{self, Fault, TestConfig};
use berth::driver::{CreateSpec, LABEL_TAG, NODE_TAG, POOL_TAG};
use berth::plugin::{AllowedHost, Engine, EngineConfig, Sandbox, SandboxConfig, SandboxLimits};
use berth::pool::NodeState;
use berth::runtime::{self, Service, StartOptions};
use berth_test_clouds::common::{Machine, live_by_node};
use berth_test_clouds::openstack::{IMAGE_ID, Nova, NovaConfig, Quota};

use crate::support::config::{CI, OPS};
use crate::support::pool::{fulfil, until_pool};
use crate::support::server::{Berth, Launch, until};
use crate::support::tokens::{TokenConfig, TokenServer};
use crate::support::{KIT_STEPS, plugin, plugins_dir_and_name, workspace};

const USER: &str = "berth-ci";
const PASSWORD: &str = "os-pa55word/for+nova=";
/// A flavor of the fake Nova: 1 vCPU, 2 GiB.
const FLAVOR: &str = "2";

/// A Nova that takes the tokens of a Keystone, whose catalog names it, and
/// a directory for the test's files (the password among them).
struct Cloud {
    tokens: TokenServer,
    nova: Nova,
    dir: tempfile::TempDir,
}

impl Cloud {
    async fn start(config: NovaConfig) -> Cloud {
        let tokens = TokenServer::start(TokenConfig {
            lifetime: Duration::from_secs(60),
            passwords: vec![(USER.into(), PASSWORD.into())],
            ..TokenConfig::default()
        })
        .await;
        let nova = Nova::start_with(config, tokens.token_check()).await;
        tokens.set_compute_url(&nova.compute_url());
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("os-password"), PASSWORD).expect("password file");
        Cloud { tokens, nova, dir }
    }

    /// Nova's `host:port`, the credential's host.
    fn host(&self) -> String {
        self.nova.addr().to_string()
    }

    /// The credential as `[[providers.NAME.credentials]]` and the kit take
    /// it: a password read from `os-password` in the test's directory.
    fn credential(&self) -> serde_json::Value {
        serde_json::json!({
            "host": self.host(),
            "kind": "keystone",
            "auth-url": self.tokens.keystone_url(),
            "username": USER,
            "password-file": "os-password",
            "project-name": "ci",
        })
    }

    /// The cloud's servers of `pool`.
    fn servers_of(&self, pool: &str) -> Vec<Machine> {
        (self.nova.machines().into_iter())
            .filter(|m| m.tag(POOL_TAG) == Some(pool))
            .collect()
    }
}

/// Nova's defaults with a quota a test does not run into, and builds and
/// deletes quick enough for a pool under test.
fn roomy() -> NovaConfig {
    NovaConfig {
        boot_time: Duration::from_millis(300),
        delete_time: Duration::from_millis(100),
        quota: Quota {
            instances: 200,
            cores: 400,
            ram_mib: 1 << 20,
            metadata_items: 128,
        },
        ..NovaConfig::default()
    }
}

/// Where the openstack driver, compiled once, is cached for the tests
/// here.
fn compiled_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("openstack-compiled")
}

/// An engine that finds the driver compiled; the first caller compiles it.
async fn engine_compiled() -> Engine {
    static COMPILED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    let rt = Engine::new(EngineConfig {
        cache_dir: Some(compiled_dir()),
        ..EngineConfig::default()
    })
    .expect("engine");
    COMPILED
        .get_or_init(|| async {
            rt.load_file(plugin("openstack"))
                .await
                .expect("openstack loads");
        })
        .await;
    rt
}

/// Seeds a pool's state directory with the compiled driver.
async fn seed_compiled(state: &Path) {
    engine_compiled().await;
    let cache = state.join("cache");
    std::fs::create_dir_all(&cache).expect("cache dir");
    for entry in std::fs::read_dir(compiled_dir()).expect("compiled dir") {
        let entry = entry.expect("entry");
        let name = entry.file_name();
        if entry.file_type().is_ok_and(|t| t.is_file()) && !name.to_string_lossy().contains(".tmp")
        {
            std::fs::copy(entry.path(), cache.join(&name)).expect("seed cache");
        }
    }
}

/// A provider on the driver for pool `pool`, its requests carrying the
/// cloud's Keystone token; `extra` keys go into the driver config.
async fn provider(cloud: &Cloud, pool: &str, extra: serde_json::Value) -> Sandbox {
    let allowed = vec![AllowedHost::parse(&cloud.host()).expect("host")];
    let table = toml::Value::try_from(cloud.credential()).expect("credential as TOML");
    let credentials = config::credentials(&[table], &allowed, cloud.dir.path(), &|_| None)
        .expect("credentials check");
    let driver = engine_compiled()
        .await
        .load_file(plugin("openstack"))
        .await
        .expect("openstack loads");
    let mut driver_config = serde_json::json!({"credential-host": cloud.host()});
    if let serde_json::Value::Object(extra) = extra {
        driver_config.as_object_mut().expect("object").extend(extra);
    }
    Sandbox::start(
        &driver,
        SandboxConfig {
            name: "openstack".into(),
            pool_id: pool.into(),
            driver_config: driver_config.to_string(),
            allowed_hosts: allowed,
            limits: SandboxLimits {
                max_instances: 2,
                call_deadline: Duration::from_secs(60),
                ..SandboxLimits::default()
            },
            credentials,
            state: None,
            deny: Vec::new(),
            gate: None,
        },
    )
}

fn spec(pool: &str, node: &str) -> CreateSpec {
    CreateSpec {
        node_id: node.into(),
        token: crate::support::sandbox::token_for(node),
        instance_type: FLAVOR.into(),
        image: IMAGE_ID.into(),
        tags: [
            (POOL_TAG.to_string(), pool.to_string()),
            (NODE_TAG.to_string(), node.to_string()),
            (LABEL_TAG.to_string(), "itest".to_string()),
        ]
        .into(),
        user_data: None,
        ssh_public_key: None,
        options: "{}".into(),
    }
}

/// The berth config of one openstack provider `os` on `cloud`, one label
/// `ci` with `min_ready`, its state in `state`; `driver` holds extra keys
/// of the driver config.
fn pool_config_text(cloud: &Cloud, state: &Path, min_ready: u32, driver: &str) -> String {
    format!(
        r#"
pool-id = "os-itest"
ready = "running"
state-dir = {state:?}
plugins-dir = {plugins:?}
sync-interval = "1s"
boot-poll-interval = "200ms"
leak-grace = "1s"
delete-retry = "2s"
quota-pause = "1h"
capacity-pause = "1h"

[providers.os]
driver = {plugin:?}
max-concurrent-calls = 4
allow-hosts = ["{host}"]
config = {{ credential-host = "{host}"{driver} }}
sandbox = {{ call-deadline = "60s" }}

[[providers.os.credentials]]
host = "{host}"
kind = "keystone"
auth-url = "{auth}"
username = "{USER}"
password-file = {password:?}
project-name = "ci"

[labels.ci]
min-ready = {min_ready}
[labels.ci.providers.os]
instance-type = "{FLAVOR}"
image = "{IMAGE_ID}"
vcpus = 1
ram = "2GiB"
"#,
        state = state.display().to_string(),
        plugins = plugins_dir_and_name(&plugin("openstack")).0,
        plugin = plugins_dir_and_name(&plugin("openstack")).1,
        host = cloud.host(),
        auth = cloud.tokens.keystone_url(),
        password = cloud.dir.path().join("os-password").display().to_string(),
    ) + &crate::support::config::test_store(state)
}

fn parse_config(text: &str, state: &Path) -> Settings {
    config::parse(text, state, &|_| None).unwrap_or_else(|e| panic!("config: {e}\n{text}"))
}

async fn start(config: Settings) -> Service {
    runtime::start(
        config,
        StartOptions {
            seed: Some(13),
            ..Default::default()
        },
    )
    .await
    .expect("pool starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openstack_passes_the_conformance_kit_against_nova_with_a_keystone_credential() {
    let cloud = Cloud::start(NovaConfig {
        max_limit: 1000,
        ..roomy()
    })
    .await;
    // Pages of three, and seven servers for the paging step: three pages.
    let mut config: TestConfig = serde_json::from_value(serde_json::json!({
        "config": {"credential-host": cloud.host(), "page-size": 3},
        "allow_hosts": [cloud.host()],
        "pool_id": "os-kit",
        "create": {"instance_type": FLAVOR, "image": IMAGE_ID},
        "credentials": [cloud.credential()],
        "instances": 7,
    }))
    .expect("test config");
    config.base = cloud.dir.path().to_path_buf();
    config.faults = Fault::from_file(&workspace().join("plugins/openstack/faults.json"))
        .expect("the driver's faults");
    let faults = config.faults.len();
    let rt = engine_compiled().await;
    let report = conformance::test(&rt, &plugin("openstack"), &config).await;
    println!("{report}");
    assert!(report.passed(), "{report}");
    for step in KIT_STEPS.iter().chain(&["paging", "delete"]) {
        assert!(
            report
                .steps
                .iter()
                .any(|s| s.name == *step && s.passed && !s.skipped),
            "{step} did not pass:\n{report}"
        );
    }
    let mapped = (report.steps.iter())
        .filter(|s| s.name == "error mapping" && s.passed && !s.skipped)
        .count();
    assert_eq!(mapped, faults, "{report}");
    assert!(
        report
            .to_string()
            .contains("failed: No valid host was found"),
        "{report}"
    );
    // The driver declares no batches.
    assert!(report.to_string().contains("SKIP  batches"), "{report}");

    // Nova's own record: the kit's server and the paging step's seven,
    // each made once (the create sent again with its token made none),
    // all deleted.
    let knobs = cloud.nova.knobs();
    assert_eq!(knobs.count("servers.create"), 8, "{:?}", knobs.calls());
    until(10, "every server of the run to be gone", || async {
        let all = cloud.servers_of("os-kit");
        (all.len() == 8 && all.iter().all(|m| m.deleted)).then_some(())
    })
    .await;
    let all = cloud.servers_of("os-kit");
    let nodes: BTreeSet<&str> = all.iter().filter_map(|m| m.tag(NODE_TAG)).collect();
    assert_eq!(nodes.len(), 8, "{all:#?}");
    // With the tags set-tags left on the first: berth-conformance gone,
    // berth-idle added; the create token beside them.
    let first = (all.iter())
        .find(|m| m.tag("berth-conformance").is_none())
        .unwrap_or_else(|| panic!("the kit's first server: {all:#?}"));
    assert_eq!(first.tag("berth-idle"), Some("hold"), "{first:?}");
    assert!(first.tag("create-token").is_some(), "{first:?}");
    assert_eq!(first.name, first.tag(NODE_TAG).unwrap_or_default());
    // Keystone issued the token every request carried.
    assert!(cloud.tokens.counts().issued >= 1);
    // The page size asked for, every page followed by its marker.
    let pages = (cloud.nova.requests().into_iter())
        .filter(|r| r.starts_with("GET /v2.1/servers/detail?limit=3"))
        .count();
    assert!(pages >= 3, "{:?}", cloud.nova.requests());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_follows_every_page_of_servers() {
    let cloud = Cloud::start(roomy()).await;
    // Twelve servers of this pool and three of another, made through the
    // driver; pages of five.
    let ours = provider(&cloud, "os-itest", serde_json::json!({"page-size": 5})).await;
    let other = provider(&cloud, "someone-else", serde_json::json!({})).await;
    let mut made = BTreeSet::new();
    for n in 0..12 {
        let i = ours
            .create(spec("os-itest", &format!("n-{n:016x}")))
            .await
            .expect("create");
        made.insert(i.id);
    }
    for n in 0..3 {
        let node = format!("n-{:016x}", 100 + n);
        other
            .create(spec("someone-else", &node))
            .await
            .expect("create");
    }
    let before = cloud.nova.requests().len();
    let listed = ours.list(Default::default()).await.expect("list");
    let listed: BTreeSet<String> = listed.into_iter().map(|i| i.id).collect();
    assert_eq!(listed, made);
    // Fifteen servers, pages of five: three full pages and the empty one
    // after the third's next link; each page after the first asked from
    // the marker the page before ended on.
    let pages: Vec<String> = cloud.nova.requests()[before..].to_vec();
    assert_eq!(pages.len(), 4, "{pages:#?}");
    assert_eq!(pages[0], "GET /v2.1/servers/detail?limit=5");
    let order: Vec<String> = {
        let mut all = cloud.nova.machines();
        // Newest first, as Nova lists: the page boundaries are every fifth.
        all.reverse();
        all.into_iter().map(|m| m.id).collect()
    };
    for (i, page) in pages.iter().enumerate().skip(1) {
        let marker = page
            .split("marker=")
            .nth(1)
            .unwrap_or_else(|| panic!("page {i} has no marker: {page}"));
        assert!(
            page.starts_with("GET /v2.1/servers/detail?limit=5&marker="),
            "{page}"
        );
        assert!(order.contains(&marker.to_owned()), "{page}");
    }
    let markers: BTreeSet<&str> = pages[1..]
        .iter()
        .filter_map(|p| p.split("marker=").nth(1))
        .collect();
    assert_eq!(markers.len(), 3, "{pages:#?}");
}

/// The nodes berth holds with an instance, and the pool's servers Nova has
/// not deleted, agree; and no node was ever given two servers.
async fn agree(server: &Berth, cloud: &Cloud) {
    until(60, "berth's nodes and Nova's servers to agree", || async {
        let (s, nodes) = server
            .try_call("GET", "/v1/nodes", Some(OPS), None)
            .await
            .ok()?;
        if s != 200 {
            return None;
        }
        let mut held: Vec<String> = (nodes.as_array()?.iter())
            .filter(|n| !matches!(n["state"].as_str(), Some("gone" | "failed")))
            .filter_map(|n| n["instance"].as_str().map(str::to_owned))
            .collect();
        held.sort();
        let all = cloud.servers_of("os-itest");
        let mut live: Vec<String> = (all.iter())
            .filter(|m| !m.deleted)
            .map(|m| m.id.clone())
            .collect();
        live.sort();
        (held == live).then_some(())
    })
    .await;
    let all = cloud.servers_of("os-itest");
    for (node, servers) in live_by_node(&all, POOL_TAG, "os-itest", NODE_TAG) {
        assert_eq!(servers.len(), 1, "node {node} has {servers:#?}");
    }
    let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
    for m in &all {
        *per_node
            .entry(m.tag(NODE_TAG).unwrap_or_default())
            .or_default() += 1;
    }
    assert!(
        per_node.values().all(|n| *n == 1),
        "a node given two servers: {per_node:?}\n{all:#?}"
    );
}

/// A pool of two ready nodes under `berth serve`, killed with SIGKILL
/// twice: once while Nova held back its answers to two creates whose
/// servers it had made, with lists that leave a new server out for 3 s;
/// once while it held back its answers to deletes. After each restart no
/// server is leaked and no node has two; a restart with nothing cut off
/// adopts what is there and creates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_under_berth_serve_survives_sigkill_during_creates_and_deletes() {
    let cloud = Cloud::start(roomy()).await;
    let knobs = cloud.nova.knobs();
    knobs.hold("servers.create", Duration::from_secs(1));
    knobs.set_lag(Duration::from_secs(3));
    let state = cloud.dir.path().join("state");
    let text = pool_config_text(&cloud, &state, 2, ", list-lag = \"4s\"")
        + &format!(
            "\n[api]\nlisten = \"127.0.0.1:0\"\nlease-ttl = \"10m\"\n\
             [api.tokens.ci]\nrole = \"client\"\ntoken = \"{CI}\"\n\
             [api.tokens.ops]\nrole = \"admin\"\ntoken = \"{OPS}\"\n"
        );
    let path = cloud.dir.path().join("berth.toml");
    std::fs::write(&path, text).expect("config");
    seed_compiled(&state).await;
    let cfg = path.display().to_string();
    let args = ["--config", cfg.as_str()];
    let launch = || Launch::new(&args, cloud.dir.path());

    // 1. Killed with both creates made in Nova and their answers held.
    let server = Berth::launch(launch()).await;
    until(60, "Nova to make two servers", || async {
        (cloud.servers_of("os-itest").len() >= 2).then_some(())
    })
    .await;
    server.signal(libc::SIGKILL);
    server.exit_within(Duration::from_secs(30)).await;
    assert_eq!(knobs.count("servers.create"), 2);

    // 2. The restart sends both creates again; the driver finds each
    //    server by its name (once the list shows it) and posts none.
    let before = cloud.nova.requests().len();
    let server = Berth::launch(launch()).await;
    server
        .until_label_ready(90, "ci", 2, "the two servers cut off")
        .await;
    agree(&server, &cloud).await;
    assert_eq!(knobs.count("servers.create"), 2, "{:?}", knobs.calls());
    let lookups = (cloud.nova.requests()[before..].iter())
        .filter(|r| r.starts_with("GET /v2.1/servers/detail?name="))
        .count();
    assert!(lookups >= 2, "{:#?}", cloud.nova.requests());

    // 3. Both handed out and given back: deleted, and two made in their
    //    place; killed while Nova holds back its answers to the deletes.
    knobs.hold("servers.delete", Duration::from_secs(1));
    let request = server.request(CI, &[("ci", 2)]).await;
    let served = server.fulfilled(CI, &request.id).await;
    for node in &served.nodes {
        let (s, r) = server
            .call(
                "POST",
                &format!("/v1/nodes/{}/release", node.id),
                Some(CI),
                None,
            )
            .await;
        assert_eq!(s, 200, "{r}");
    }
    until(60, "Nova to be asked for two deletes", || async {
        (knobs.count("servers.delete") >= 2).then_some(())
    })
    .await;
    server.signal(libc::SIGKILL);
    server.exit_within(Duration::from_secs(30)).await;

    // 4. The restart deletes what it was deleting, keeps two ready.
    let server = Berth::launch(launch()).await;
    server
        .until_label_ready(90, "ci", 2, "two ready after the deletes cut off")
        .await;
    agree(&server, &cloud).await;
    server.terminate().await.assert_success();

    // 5. A restart with nothing cut off adopts and creates nothing.
    knobs.hold("servers.create", Duration::ZERO);
    knobs.hold("servers.delete", Duration::ZERO);
    let creates = knobs.count("servers.create");
    let server = Berth::launch(launch()).await;
    server
        .until_label_ready(90, "ci", 2, "the two adopted")
        .await;
    agree(&server, &cloud).await;
    assert_eq!(
        knobs.count("servers.create"),
        creates,
        "{:?}",
        knobs.calls()
    );
    server.terminate().await.assert_success();
    let all = cloud.servers_of("os-itest");
    println!(
        "servers made: {}, creates sent: {creates}, calls: {:?}",
        all.len(),
        knobs.calls()
    );
    // Two nodes at first, two in place of the two handed out: four in all,
    // however many times berth was killed.
    assert_eq!(all.len(), 4, "{all:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openstack_api_calls_per_node_lifecycle() {
    let cloud = Cloud::start(roomy()).await;
    let state = cloud.dir.path().join("state");
    // The default sync interval and boot-poll interval, as in a real pool.
    let text = pool_config_text(&cloud, &state, 0, "")
        .replace("sync-interval = \"1s\"\n", "")
        .replace("boot-poll-interval = \"200ms\"\n", "");
    assert!(!text.contains("boot-poll-interval") && !text.contains("sync-interval"));
    let config = parse_config(&text, &state);
    let ci = config.pool.label("ci").expect("label");
    const NODES: u32 = 30;
    seed_compiled(&state).await;
    let service = start(config).await;
    let h = service.handle.clone();
    // create → ready → handed out, thirty together
    let req = fulfil(&h, "batch", vec![(ci, NODES)]).await;
    // → released together → deleted
    let mut released = tokio::task::JoinSet::new();
    for n in req.nodes.clone() {
        let h = h.clone();
        released.spawn(async move { h.release(n).await });
    }
    for r in released.join_all().await {
        r.expect("release");
    }
    until_pool(&h, 60, "every node deleted", |p| {
        p.nodes().count() == NODES as usize
            && p.nodes().all(|n| matches!(n.state, NodeState::Gone { .. }))
    })
    .await;
    service.stop().await.expect("clean stop");

    let calls = cloud.nova.knobs().calls();
    let count = |op: &str| calls.get(op).copied().unwrap_or(0);
    let n = u64::from(NODES);
    let total: u64 = calls.values().sum();
    let (create, delete, get, detail) = (
        count("servers.create"),
        count("servers.delete"),
        count("servers.get"),
        count("servers.detail"),
    );
    let metadata: u64 = (calls.iter())
        .filter(|(op, _)| op.starts_with("metadata."))
        .map(|(_, c)| c)
        .sum();
    println!(
        "Nova API calls per node lifecycle: {:.2} (servers.create {create}, servers.delete \
         {delete}, servers.get {get}, servers.detail {detail}, metadata {metadata}, over {n} \
         nodes; all: {calls:?})",
        total as f64 / n as f64
    );
    // One create and one delete per node: the records say the servers are
    // the pool's, so a delete looks nothing up first.
    assert_eq!(create, n, "{calls:?}");
    assert_eq!(delete, n, "{calls:?}");
    // Nodes launched for the request carry `berth-request` from their
    // create: the hand-out writes no metadata.
    assert_eq!(metadata, 0, "{calls:?}");
    // Boot polls of the thirty booting servers are one list by name each
    // (not thirty lookups), and lists are shared by all: together well
    // under one per node.
    assert!(detail < n, "{calls:?}");
    // A lookup by id only for what a list left out, or a get of one or two.
    assert!(get < n / 2, "{calls:?}");
    assert_eq!(
        total,
        create + delete + get + detail,
        "nothing but these: {calls:?}"
    );
    let all = cloud.servers_of("os-itest");
    assert_eq!(all.len(), NODES as usize);
    until(10, "every server deleted", || async {
        cloud
            .servers_of("os-itest")
            .iter()
            .all(|m| m.deleted)
            .then_some(())
    })
    .await;
}
