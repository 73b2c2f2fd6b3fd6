//! The pool through the real host: the sim driver in the sandbox, the sim
//! cloud over HTTP, the store (SQLite, or PostgreSQL with
//! `BERTH_TEST_STORE=postgres`), and the runtime that ties them to the
//! core. Time is real here (the cloud is a real server), so the timings in
//! these configs are short and every wait is a bounded poll.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use berth::config::{self, LabelIx, Settings};
use berth::driver::{LABEL_TAG, NODE_TAG, POOL_TAG, SIG_TAG, STORE_TAG};
use berth::pool::{NewRequest, NodeId, NodeState, Pool, RequestState};
use berth::runtime::{self, Handle, StartOptions};
use berth::sim::{Knobs, SimCloud};

use crate::support::config::{SLOTS, test_store};
use crate::support::pool::{fulfil, live_instances, pool_config, start, until_pool};
use crate::support::{SimServer, live, plugin, plugins_dir_and_name};

/// Opens the store that `settings` name, as `berth serve` would, without
/// claiming the pool: for reading what a stopped pool left behind.
async fn open_store(settings: &Settings) -> Box<dyn berth::store::Store> {
    assert_eq!(
        settings.store.postgres.is_some(),
        crate::support::config::on_postgres(),
        "the test runs on the store it was asked to"
    );
    let config = Arc::new(settings.pool.clone());
    match &settings.store.postgres {
        None => Box::new(
            berth::store::SqliteStore::open(
                &settings.state_dir.join("berth.db"),
                config,
                settings.store.sync,
            )
            .expect("the SQLite store opens"),
        ),
        Some(pg) => Box::new(
            berth::store::PgStore::open(pg, config, None)
                .await
                .expect("the PostgreSQL store opens"),
        ),
    }
}

fn label(handle: &Handle, name: &str) -> LabelIx {
    handle.config().label(name).expect("label")
}

fn ready_of(pool: &Pool, label: LabelIx) -> Vec<NodeId> {
    let mut ready: Vec<_> = pool
        .nodes()
        .filter(|n| n.label == label)
        .filter_map(|n| match n.state {
            NodeState::Ready { since } if n.assigned.is_none() => Some((since, n.id)),
            _ => None,
        })
        .collect();
    ready.sort();
    ready.into_iter().map(|(_, id)| id).collect()
}

const SMALL: &str = r#"
[labels.small]
min-ready = 3
[labels.small.providers.sim]
instance-type = "small"
image = "ubuntu-24.04"
vcpus = 2
ram = "4GiB"
"#;

#[tokio::test]
async fn prewarm_fills_and_a_request_is_served_from_ready_nodes() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let service = start(pool_config(&sim, dir.path(), SMALL)).await;
    // Prewarming starts by itself: nothing but the pool's own clock wakes
    // it (the cloud is watched, the pool is not asked anything).
    let end = tokio::time::Instant::now() + Duration::from_secs(20);
    while live_instances(&sim.cloud).len() < 3 {
        assert!(
            tokio::time::Instant::now() < end,
            "no prewarm without a client event"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let h = service.handle.clone();
    let small = label(&h, "small");
    until_pool(&h, 20, "three ready nodes", |p| {
        p.free_ready(LabelIx(0)) == 3
    })
    .await;
    assert_eq!(live_instances(&sim.cloud).len(), 3);
    let ready = h.inspect(move |p| ready_of(p, small)).await.unwrap();

    let id = h
        .submit(NewRequest {
            requestor: "ci".into(),
            priority: 0,
            wants: vec![(small, 2)],
            ..NewRequest::default()
        })
        .await
        .expect("request taken");
    let req = h.wait(id).await.unwrap().expect("request exists");
    assert!(
        matches!(req.state, RequestState::Fulfilled { .. }),
        "{req:?}"
    );
    // The two oldest ready nodes, no launch in between.
    let mut given = req.nodes.clone();
    given.sort();
    let mut oldest = ready[..2].to_vec();
    oldest.sort();
    assert_eq!(given, oldest);

    // min-ready refills in the background: 2 in use + 3 ready.
    until_pool(&h, 20, "refill", |p| p.free_ready(LabelIx(0)) == 3).await;
    assert_eq!(live_instances(&sim.cloud).len(), 5);

    // Single use: a released node's instance is deleted.
    for n in &req.nodes {
        h.release(*n).await.expect("release");
    }
    until_pool(&h, 20, "released nodes gone", |p| {
        p.nodes()
            .filter(|n| matches!(n.state, NodeState::Gone { .. }))
            .count()
            == 2
    })
    .await;
    let live = live_instances(&sim.cloud);
    assert_eq!(live.len(), 3);
    for n in &req.nodes {
        assert!(!live.contains_key(&n.to_string()), "{n} still live");
    }
    service.stop().await.expect("clean stop");
}

#[tokio::test]
async fn quota_exceeded_pauses_creates_on_the_provider() {
    let sim = SimServer::start_with(Knobs {
        quota: Some(2),
        ..Knobs::default()
    })
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let extra = SMALL.replace("min-ready = 3", "min-ready = 4");
    let service = start(pool_config(&sim, dir.path(), &extra)).await;
    let h = service.handle.clone();
    until_pool(&h, 20, "two ready and a quota pause", |p| {
        p.free_ready(LabelIx(0)) == 2
            && p.provider_status(berth::config::ProviderIx(0))
                .quota_paused_until
                .is_some()
    })
    .await;
    // That no create reaches the cloud during the pause is proved exactly,
    // in paused time, by berth-server's runtime tests.
    assert!(first_status(&sim.cloud, 403).is_some(), "a quota refusal");
    assert_eq!(live_instances(&sim.cloud).len(), 2);
    service.stop().await.expect("clean stop");
}

/// When `cloud` first answered a create (alone or in a batch) with
/// `status`.
fn first_status(cloud: &SimCloud, status: u16) -> Option<u64> {
    let all = crate::support::create_statuses(cloud).into_iter();
    all.filter(|(_, s)| *s == status).map(|(at, _)| at).next()
}

#[tokio::test]
async fn rate_limited_holds_every_call_until_retry_after() {
    // One call a second: the twelve creates go in one batch, right after
    // the first list, and are refused.
    let sim = SimServer::start_with(Knobs {
        rate_limit: Some(1.0),
        ..Knobs::default()
    })
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let extra = SMALL.replace("min-ready = 3", "min-ready = 12");
    let mut config = pool_config(&sim, dir.path(), &extra);
    // One call at a time, so no call is already on its way when a 429 comes.
    config.drivers[0].sandbox.max_instances = 1;
    config.pool.providers[0].max_calls = 1;
    let service = start(config).await;
    let h = service.handle.clone();
    until_pool(&h, 30, "twelve ready", |p| p.free_ready(LabelIx(0)) == 12).await;
    let calls = sim.cloud.calls();
    let limited: Vec<_> = calls.iter().filter(|c| c.status == 429).collect();
    assert!(!limited.is_empty(), "the sim never rate limited: {calls:?}");
    for c in &limited {
        let until = c.at_ms + c.retry_after_ms.expect("429 carries retry-after");
        let inside: Vec<_> = calls
            .iter()
            .filter(|d| d.at_ms > c.at_ms && d.at_ms < until)
            .collect();
        assert!(
            inside.is_empty(),
            "calls during the window after {c:?}: {inside:?}"
        );
    }
    service.stop().await.expect("clean stop");
}

#[tokio::test]
async fn capacity_errors_pause_the_type_and_the_label_falls_over() {
    let sim = SimServer::start_with(Knobs {
        out_of_capacity: vec!["big".into()],
        ..Knobs::default()
    })
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    // A second provider on the same cloud, less preferred, with another type.
    let extra = format!(
        r#"
[providers.sim-b]
driver = {driver:?}
priority = 1
allow-hosts = ["{addr}"]
config = {{ endpoint = "{url}" }}

[labels.large]
[labels.large.providers.sim]
instance-type = "big"
image = "img"
vcpus = 8
ram = "32GiB"
[labels.large.providers.sim-b]
instance-type = "big-b"
image = "img"
vcpus = 8
ram = "32GiB"
"#,
        driver = plugins_dir_and_name(&plugin("sim")).1,
        addr = sim.addr(),
        url = sim.url(),
    );
    let service = start(pool_config(&sim, dir.path(), &extra)).await;
    let h = service.handle.clone();
    // Once both providers are listed (they start in the background, in
    // either order), two large nodes are asked for: the preferred `sim`
    // first, which has no capacity for `big`.
    until_pool(&h, 20, "both providers listed", |p| {
        (0..2).all(|i| p.provider_status(berth::config::ProviderIx(i)).listed)
    })
    .await;
    let request = fulfil(&h, "ci", vec![(LabelIx(0), 2)]).await;
    assert_eq!(request.nodes.len(), 2);
    let types: BTreeSet<String> = live(&sim.cloud)
        .into_iter()
        .map(|i| i.instance_type)
        .collect();
    assert_eq!(types, BTreeSet::from(["big-b".to_string()]));
    // "big" is paused, not retried: refusals are only the creates that were
    // already on their way (at most min-ready of them). That none comes
    // during the pause is proved exactly, in paused time, by berth-server's
    // runtime tests.
    let all = crate::support::create_statuses(&sim.cloud).into_iter();
    let refusals = all.filter(|(_, s)| *s == 503).count();
    assert!((1..=2).contains(&refusals), "{refusals} refusals");
    service.stop().await.expect("clean stop");
}

#[tokio::test]
async fn slots_pack_onto_backing_instances_and_are_released_after_grace() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let service = start(pool_config(&sim, dir.path(), SLOTS)).await;
    let h = service.handle.clone();
    let slot = label(&h, "slot");
    let mut requests = Vec::new();
    for _ in 0..6 {
        let id = h
            .submit(NewRequest {
                requestor: "ci".into(),
                priority: 0,
                wants: vec![(slot, 1)],
                ..NewRequest::default()
            })
            .await
            .expect("taken");
        requests.push(id);
    }
    let mut nodes = Vec::new();
    for id in requests {
        let r = h.wait(id).await.unwrap().expect("exists");
        assert!(matches!(r.state, RequestState::Fulfilled { .. }), "{r:?}");
        nodes.extend(r.nodes);
    }
    // Six slot nodes on two backing instances: packed, never doubled.
    assert_eq!(live_instances(&sim.cloud).len(), 2);
    let placement = h
        .inspect(|p| {
            p.nodes()
                .filter_map(|n| match n.packing {
                    berth::pool::Packing::Slot { backing, index } if !n.state.is_final() => {
                        Some((backing, index))
                    }
                    _ => None,
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap();
    let distinct: BTreeSet<_> = placement.iter().copied().collect();
    assert_eq!(placement.len(), 6);
    assert_eq!(distinct.len(), 6, "a slot was handed out twice");
    let backings: BTreeSet<_> = placement.iter().map(|(b, _)| *b).collect();
    assert_eq!(backings.len(), 2);

    for n in nodes {
        h.release(n).await.expect("release");
    }
    until_pool(&h, 20, "backing instances released after grace", |p| {
        p.provider_status(berth::config::ProviderIx(0))
            .usage
            .instances
            == 0
    })
    .await;
    assert!(live_instances(&sim.cloud).is_empty());
    service.stop().await.expect("clean stop");
}

/// Instances made behind berth's back once its store has faced the cloud:
/// one signed with the store's key for a node the store does not have (a
/// lost record) is adopted; one signed for a label the pool does not serve
/// is deleted as a leak; one with the pool's tags but no signature (made by
/// hand) is never adopted nor deleted, only shown in quarantine; one of
/// another pool is never touched.
#[tokio::test]
async fn a_signed_instance_is_adopted_a_leak_deleted_and_a_forged_one_left_alone() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let extra = SMALL.replace("min-ready = 3", "min-ready = 0");
    let config = pool_config(&sim, dir.path(), &extra);
    let service = start(config).await;
    let h = service.handle.clone();
    until_pool(&h, 20, "the store confirmed", |p| p.identity().confirmed).await;
    let identity = h.inspect(|p| p.identity().clone()).await.unwrap();
    let engine = berth::plugin::Engine::new(Default::default()).unwrap();
    let driver = engine.load_file(plugin("sim")).await.unwrap();
    let setup = |pool_id: &str| {
        berth::plugin::Sandbox::start(
            &driver,
            berth::plugin::SandboxConfig {
                name: "setup".into(),
                pool_id: pool_id.into(),
                driver_config: serde_json::json!({ "endpoint": sim.url() }).to_string(),
                allowed_hosts: vec![
                    berth::plugin::AllowedHost::parse(&sim.addr().to_string()).unwrap(),
                ],
                limits: Default::default(),
                credentials: Vec::new(),
                state: None,
                deny: Vec::new(),
                gate: None,
            },
        )
    };
    let p = setup("itest");
    let signed = |node: NodeId, label: &str| -> berth::driver::Tags {
        let sig = identity.sign(berth::pool::Signed {
            pool_id: "itest",
            node,
            label,
            instance_type: "small",
            slots: None,
        });
        [
            (NODE_TAG.to_string(), node.to_string()),
            (LABEL_TAG.to_string(), label.to_string()),
            (STORE_TAG.to_string(), identity.generation.clone()),
            (SIG_TAG.to_string(), sig),
        ]
        .into()
    };
    let spec = |node: NodeId, tags: berth::driver::Tags| berth::driver::CreateSpec {
        node_id: node.to_string(),
        token: crate::support::sandbox::token_for(&node.to_string()),
        instance_type: "small".into(),
        image: "ubuntu-24.04".into(),
        tags,
        user_data: None,
        ssh_public_key: None,
        options: "{}".into(),
    };
    let adoptable = NodeId(0x1234);
    p.create(spec(adoptable, signed(adoptable, "small")))
        .await
        .expect("adoptable");
    let leak = p
        .create(spec(NodeId(0x5678), signed(NodeId(0x5678), "gone-label")))
        .await
        .expect("leak");
    let mut forged_tags = signed(NodeId(0x9abc), "small");
    forged_tags.remove(SIG_TAG);
    let forged = p
        .create(spec(NodeId(0x9abc), forged_tags))
        .await
        .expect("forged");
    let foreign = setup("another-pool")
        .create(spec(NodeId(0xdef0), Default::default()))
        .await
        .expect("foreign");
    drop(p);

    until_pool(&h, 20, "adopted node ready", move |p| {
        p.node(adoptable)
            .is_some_and(|n| matches!(n.state, NodeState::Ready { .. }))
    })
    .await;
    until_pool(&h, 20, "leak deleted", |p| {
        p.provider_status(berth::config::ProviderIx(0))
            .leaks_deleted
            == 1
    })
    .await;
    let quarantined = h
        .inspect(|p| p.provider_status(berth::config::ProviderIx(0)).quarantined)
        .await
        .unwrap();
    assert_eq!(
        quarantined.keys().collect::<Vec<_>>(),
        vec![&forged.id],
        "{quarantined:?}"
    );
    assert!(quarantined[&forged.id].why.contains("no signature"));
    let live = live_instances(&sim.cloud);
    assert_eq!(live.len(), 2, "{live:?}");
    assert!(live.contains_key(&adoptable.to_string()));
    assert!(live.values().any(|i| *i == forged.id), "never deleted");
    assert!(!live.values().any(|i| *i == leak.id));
    assert!(
        h.inspect(move |p| p
            .nodes()
            .all(|n| n.instance.as_deref() != Some(forged.id.as_str())))
            .await
            .unwrap(),
        "never taken by a node"
    );
    let untouched = sim
        .cloud
        .instances()
        .into_iter()
        .find(|i| i.id == foreign.id)
        .expect("foreign instance listed");
    assert_ne!(untouched.state, berth::sim::InstanceState::Terminated);
    service.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_restart_resumes_from_the_store_without_leaks_or_duplicates() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = pool_config(&sim, dir.path(), SMALL);
    let service = start(config.clone()).await;
    let h = service.handle.clone();
    let small = label(&h, "small");
    until_pool(&h, 20, "three ready", |p| p.free_ready(LabelIx(0)) == 3).await;
    let id = h
        .submit(NewRequest {
            requestor: "ci".into(),
            priority: 0,
            wants: vec![(small, 1)],
            ..NewRequest::default()
        })
        .await
        .unwrap();
    let req = h.wait(id).await.unwrap().unwrap();
    let in_use = req.nodes[0];
    service.stop().await.expect("clean stop");

    let service = start(config).await;
    let h = service.handle.clone();
    // The in-use node is still in use; ready ones are still ready; nothing new.
    until_pool(&h, 20, "settled", |p| p.free_ready(LabelIx(0)) == 3).await;
    let state = h
        .inspect(move |p| p.node(in_use).map(|n| n.state.name()))
        .await
        .unwrap();
    assert_eq!(state, Some("in-use"));
    assert_eq!(live_instances(&sim.cloud).len(), 4);
    service.stop().await.expect("clean stop");
}

/// Environment variable that turns [`churn_child`] into the pool process of
/// [`a_pool_killed_during_churn_resumes_without_leaks_or_double_allocations`].
const CHURN_CONFIG: &str = "BERTH_CHURN_CONFIG";

/// The berth process the SIGKILL test kills: it runs the pool from the config
/// at `$BERTH_CHURN_CONFIG` and churns requests (submit, wait, hold briefly,
/// release), appending what happens to `$BERTH_CHURN_LOG`. With
/// `$BERTH_CHURN_SECS` it stops churning after that long, lets the pool settle
/// and exits cleanly. Without the variables (an ordinary test run) it is an
/// entry point only and returns at once.
#[tokio::test]
async fn churn_child() {
    let Ok(config_path) = std::env::var(CHURN_CONFIG) else {
        return;
    };
    let log_path = std::env::var("BERTH_CHURN_LOG").expect("log path");
    let secs: u64 = std::env::var("BERTH_CHURN_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3600);
    let config = config::load(Path::new(&config_path)).expect("config");
    let service = runtime::start(config, StartOptions::default())
        .await
        .expect("pool starts");
    let h = service.handle.clone();
    let log = std::sync::Arc::new(std::sync::Mutex::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("log"),
    ));
    let write = move |line: String| {
        use std::io::Write;
        let mut f = log.lock().unwrap();
        writeln!(f, "{line}").unwrap();
        f.sync_data().unwrap();
    };
    // Requests a killed predecessor left pending are served now, or fail
    // once the lease of the worker that made them lapses. On PostgreSQL the
    // killed run's lease on the pool has to lapse first: until it does this
    // run stands by.
    let taken = tokio::time::Instant::now() + Duration::from_secs(30);
    let pending: Vec<_> = loop {
        let pending = h
            .inspect(|p| {
                p.requests()
                    .filter(|r| r.state == RequestState::Pending)
                    .map(|r| r.id)
                    .collect()
            })
            .await;
        match pending {
            Ok(pending) => break pending,
            Err(e @ runtime::ServiceError::Standby(_)) => {
                assert!(tokio::time::Instant::now() < taken, "{e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("the pool does not run: {e}"),
        }
    };
    for id in pending {
        let h = h.clone();
        let write = write.clone();
        tokio::spawn(async move {
            if let Ok(Some(r)) = h.wait(id).await {
                for n in &r.nodes {
                    write(format!("handed {id} {n}"));
                }
            }
        });
    }
    let small = h.config().label("small").unwrap();
    let stop_at = tokio::time::Instant::now() + Duration::from_secs(secs);
    // Each worker holds a lease it renews, named for this run: what a killed
    // run's workers held is taken back once their leases lapse, as it would
    // be for any client that died, so the quota is not used up by the dead.
    let ttl = Duration::from_secs(2);
    let run = std::process::id();
    let mut workers = Vec::new();
    for w in 0..4u64 {
        let h = h.clone();
        let write = write.clone();
        let requestor = format!("worker-{w}-{run}");
        let renewer = {
            let h = h.clone();
            let requestor = requestor.clone();
            tokio::spawn(async move {
                loop {
                    h.renew(requestor.clone(), ttl).await.expect("renew");
                    tokio::time::sleep(ttl / 4).await;
                }
            })
        };
        workers.push(tokio::spawn(async move {
            let mut i = 0u64;
            while tokio::time::Instant::now() < stop_at {
                let new = NewRequest {
                    requestor: requestor.clone(),
                    priority: (i % 3) as i32,
                    wants: vec![(small, 1 + (i % 2) as u32)],
                    ..NewRequest::default()
                };
                i += 1;
                let id = h.submit_renewing(new, ttl).await.expect("submit");
                write(format!("submitted {id}"));
                let r = h.wait(id).await.unwrap().expect("request");
                for n in &r.nodes {
                    write(format!("handed {id} {n}"));
                }
                tokio::time::sleep(Duration::from_millis(20 + 37 * (i % 5))).await;
                for n in &r.nodes {
                    h.release(*n).await.expect("release");
                }
            }
            renewer.abort();
        }));
    }
    for w in workers {
        w.await.expect("worker");
    }
    // Let deletes, leaks and adoption settle before a clean stop.
    tokio::time::sleep(Duration::from_secs(4)).await;
    service.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_pool_killed_during_churn_resumes_without_leaks_or_double_allocations() {
    let sim = SimServer::start_with(Knobs {
        create_latency_ms: 30,
        boot_delay_ms: 150,
        ..Knobs::default()
    })
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config_text = format!(
        r#"
pool-id = "itest"
ready = "running"
state-dir = "state"
plugins-dir = {plugins:?}
sync-interval = "1s"
boot-poll-interval = "100ms"
leak-grace = "1s"
delete-retry = "1s"

[providers.sim]
driver = {driver:?}
max-concurrent-calls = 4
allow-hosts = ["{addr}"]
config = {{ endpoint = "{url}" }}
[providers.sim.limits]
max-instances = 12

[labels.small]
min-ready = 2
[labels.small.providers.sim]
instance-type = "small"
image = "img"
vcpus = 1
ram = "1GiB"
"#,
        plugins = plugins_dir_and_name(&plugin("sim")).0,
        driver = plugins_dir_and_name(&plugin("sim")).1,
        addr = sim.addr(),
        url = sim.url(),
    );
    let config_text = config_text + &test_store(dir.path());
    let config_path = dir.path().join("berth.toml");
    std::fs::write(&config_path, &config_text).unwrap();
    let log_path = dir.path().join("churn.log");
    let child = |secs: Option<u64>| {
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args(["pool::churn_child", "--exact", "--nocapture"])
            .env(CHURN_CONFIG, &config_path)
            .env("BERTH_CHURN_LOG", &log_path)
            .stdout(std::process::Stdio::null());
        if let Some(s) = secs {
            cmd.env("BERTH_CHURN_SECS", s.to_string());
        }
        cmd.spawn().expect("child starts")
    };
    // Three runs killed at odd moments, then one that finishes.
    for kill_after_ms in [1700u64, 2300, 1900] {
        let mut c = child(None);
        tokio::time::sleep(Duration::from_millis(kill_after_ms)).await;
        c.kill().expect("SIGKILL");
        c.wait().unwrap();
    }
    // The last run churns for 3 s and settles for 4 s; a run that has not
    // ended in two minutes is stuck, and the test says so instead of hanging.
    let mut last = child(Some(3));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = last.try_wait().unwrap() {
            break status;
        }
        if tokio::time::Instant::now() > deadline {
            last.kill().expect("SIGKILL");
            last.wait().unwrap();
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            panic!("the last run did not end in 120 s; its log ends:\n{tail:#?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "the last run failed: {status}");

    let log = std::fs::read_to_string(&log_path).unwrap();
    let submitted: BTreeSet<&str> = log
        .lines()
        .filter_map(|l| l.strip_prefix("submitted "))
        .collect();
    let mut handed: BTreeMap<&str, &str> = BTreeMap::new();
    for l in log.lines().filter_map(|l| l.strip_prefix("handed ")) {
        let (req, node) = l.split_once(' ').unwrap();
        if let Some(other) = handed.insert(node, req) {
            assert_eq!(other, req, "node {node} handed to {other} and {req}");
        }
    }
    assert!(submitted.len() > 10, "too little churn: {log}");

    let settings = config::load(&config_path).unwrap();
    let config = Arc::new(settings.pool.clone());
    let mut store = open_store(&settings).await;
    let snapshot = store.load(&config).await.unwrap().snapshot;
    // No lost request: every request a client was told of is in the store,
    // and none is left pending.
    let stored: BTreeMap<String, &berth::pool::Request> = snapshot
        .requests
        .iter()
        .map(|r| (r.id.to_string(), r))
        .collect();
    for id in &submitted {
        let r = stored
            .get(*id)
            .unwrap_or_else(|| panic!("request {id} lost"));
        assert_ne!(r.state, RequestState::Pending, "{id} still pending");
    }
    // Zero leaks, checked against the sim cloud's own record: every live
    // owned instance belongs to exactly one live node, and every live node
    // with an instance is in the cloud.
    let live = live_instances(&sim.cloud);
    let owned: usize = crate::support::live(&sim.cloud)
        .iter()
        .filter(|i| i.tags.get(POOL_TAG).map(String::as_str) == Some("itest"))
        .count();
    assert_eq!(owned, live.len(), "two live instances share a node tag");
    let nodes: BTreeMap<String, &berth::pool::Node> = snapshot
        .nodes
        .iter()
        .filter(|n| !n.state.is_final())
        .map(|n| (n.id.to_string(), n))
        .collect();
    for (node, instance) in &live {
        let n = nodes
            .get(node)
            .unwrap_or_else(|| panic!("leaked instance {instance} (node {node})"));
        assert_eq!(n.instance.as_deref(), Some(instance.as_str()));
    }
    for (id, n) in &nodes {
        assert!(
            live.contains_key(id),
            "node {id} ({}) has no instance",
            n.state.name()
        );
    }
}

/// The command queue is bounded: while the pool's task is busy, commands
/// beyond [`runtime::COMMAND_QUEUE`] are refused at once with `Busy`
/// instead of queueing without end, and the queued ones are all served
/// once the task is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_command_queue_refuses_at_once_and_loses_nothing_queued() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let service = start(pool_config(&sim, dir.path(), "")).await;
    let h = service.handle.clone();
    // Hold the pool's task until everything below is sent.
    let (free_tx, free_rx) = std::sync::mpsc::channel::<()>();
    let (held_tx, held_rx) = tokio::sync::oneshot::channel();
    let holder = tokio::spawn({
        let h = h.clone();
        async move {
            h.inspect(move |_| {
                let _ = held_tx.send(());
                let _ = free_rx.recv_timeout(Duration::from_secs(30));
            })
            .await
        }
    });
    held_rx.await.expect("the task is held");
    let mut queued = Vec::new();
    let mut busy = 0;
    for _ in 0..runtime::COMMAND_QUEUE + 50 {
        let mut call = Box::pin(h.inspect(|p| p.nodes().count()));
        // Polled once: a command is queued (pending) or refused at once.
        let first = std::future::poll_fn(|cx| std::task::Poll::Ready(call.as_mut().poll(cx))).await;
        match first {
            std::task::Poll::Pending => queued.push(call),
            std::task::Poll::Ready(Err(runtime::ServiceError::Busy(n))) => {
                assert_eq!(n, runtime::COMMAND_QUEUE);
                busy += 1;
            }
            std::task::Poll::Ready(other) => panic!("answered while held: {other:?}"),
        }
    }
    assert_eq!(busy, 50, "refused beyond the queue");
    assert_eq!(queued.len(), runtime::COMMAND_QUEUE);
    free_tx.send(()).unwrap();
    holder.await.unwrap().expect("the holding read is answered");
    for call in queued {
        call.await.expect("a queued command is served");
    }
    service.stop().await.expect("stops");
}
