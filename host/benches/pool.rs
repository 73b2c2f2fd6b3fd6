//! Pool benchmark: the core's decisions at scale, and the whole pool (runtime,
//! SQLite store, the real sim driver in its sandbox, an instant sim cloud).
//!
//! - reconcile: one provider listing 100,000 owned instances, all known;
//! - resident memory of the process with 100,000 nodes in the pool;
//! - requests fulfilled per second from ready nodes, in the core alone and
//!   through the running pool.
//!
//! Run with `cargo bench -p berth --bench pool`; the figures go into
//! docs/BENCHMARKS.md.

// Only `tests/support/sys.rs` allows `unsafe` (ARCHITECTURE.md, "Lints and
// unsafe code").
#![deny(unsafe_code)]

#[path = "../../tests/support.rs"]
#[allow(dead_code)]
mod support;

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth::config::{self, Config, LabelIx, ProviderIx};
use berth::driver::{
    Addresses, Connection, IDLE_TAG, Instance, InstanceState, LABEL_TAG, NODE_TAG, POOL_TAG, Page,
    SIG_TAG, STORE_TAG, Tags,
};
use berth::pool::{
    DriverCall, Effect, Identity, NewRequest, NodeId, Pool, RequestState, Signed, Time,
};

const NODES: usize = 100_000;

fn main() {
    let mut rows: Vec<(String, String)> = Vec::new();
    core(&mut rows);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    rt.block_on(service(&mut rows));
    println!();
    println!("| measurement | figure |");
    println!("| --- | --- |");
    for (what, figure) in rows {
        println!("| {what} | {figure} |");
    }
}

fn core_config() -> Config {
    let text = r#"
pool-id = "bench"
ready = "running"
[providers.sim]
driver = "sim.wasm"
[labels.small]
[labels.small.providers.sim]
instance-type = "small"
image = "img"
vcpus = 2
ram = "4GiB"
"#;
    config::parse(text, Path::new("."), &|_| None)
        .expect("config")
        .pool
}

/// Instance `i` with the tags this pool's store gave it: signed with the
/// identity a pool without a store has (`Identity::default`), so that the
/// pool vouches for it.
fn instance(i: usize) -> Instance {
    let node = NodeId(i as u64 + 1);
    let identity = Identity::default();
    let signature = identity.sign(Signed {
        pool_id: "bench",
        node,
        label: "small",
        instance_type: "small",
        slots: None,
    });
    let tags: Tags = [
        (POOL_TAG.to_string(), "bench".to_string()),
        (NODE_TAG.to_string(), node.to_string()),
        (LABEL_TAG.to_string(), "small".to_string()),
        (IDLE_TAG.to_string(), "run".to_string()),
        (STORE_TAG.to_string(), identity.generation.clone()),
        (SIG_TAG.to_string(), signature),
    ]
    .into();
    Instance {
        id: format!("i-{i:016x}"),
        state: InstanceState::Running,
        instance_type: "small".into(),
        tags,
        addresses: Addresses {
            private_ipv4: Some(format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255)),
            ..Addresses::default()
        },
        created_at_ms: Some(1_700_000_000_000),
        connection: Connection::default(),
        failure: None,
    }
}

/// Resident set size of this process, from /proc.
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// One list, due at `now`, answered on one page with `instances`: the time
/// the pool takes to reconcile it.
fn list_once(pool: &mut Pool, now: Time, instances: Vec<Instance>) -> Duration {
    let mut out = Vec::new();
    pool.tick(now, &mut out);
    let asked = |e: &Effect| matches!(e, Effect::Call(DriverCall::List { cursor: None, .. }));
    assert!(out.iter().any(asked), "no list due at {now:?}");
    let page = Page {
        instances,
        next: None,
    };
    let start = Instant::now();
    pool.listed(now, ProviderIx(0), Ok(page));
    start.elapsed()
}

fn core(rows: &mut Vec<(String, String)>) {
    let config = Arc::new(core_config());
    let small = LabelIx(0);
    let rss_before = rss_mib();
    let mut pool = Pool::new(config, 1);
    let mut now = Time(1_700_000_000_000);
    let instances: Vec<Instance> = (0..NODES).map(instance).collect();

    // First list: every instance is adopted (the path a restart without a
    // store takes).
    let adopt = list_once(&mut pool, now, instances.clone());
    let _ = pool.take_changes();
    let _ = pool.take_notices();
    assert_eq!(pool.free_ready(small), NODES);
    rows.push((
        format!("adopt {NODES} instances from one list (core)"),
        ms(adopt),
    ));

    // Steady state: the same list again, every instance known.
    let mut runs = Vec::new();
    for _ in 0..5 {
        now = now + Duration::from_secs(60);
        runs.push(list_once(&mut pool, now, instances.clone()));
    }
    runs.sort();
    rows.push((
        format!("reconcile a list of {NODES} known instances (core, median of 5)"),
        ms(runs[2]),
    ));
    drop(instances);
    let rss_after = rss_mib();
    rows.push((
        format!("resident memory with {NODES} nodes in the core"),
        format!(
            "{rss_after:.0} MiB process total ({:.0} MiB for the nodes)",
            rss_after - rss_before
        ),
    ));
    // The lists dropped before leave freed memory the allocator keeps.
    support::sys::trim_heap();
    let rss_live = rss_mib();
    rows.push((
        format!("resident memory with {NODES} nodes in the core, freed memory handed back"),
        format!(
            "{rss_live:.0} MiB process total ({:.0} MiB for the nodes)",
            rss_live - rss_before
        ),
    ));

    // Requests from ready nodes: submit, decide, hand out; one tick per
    // request (the worst case: no batching).
    let n = 50_000;
    let mut out: Vec<Effect> = Vec::new();
    let start = Instant::now();
    for _ in 0..n {
        let id = pool
            .submit(
                now,
                NewRequest {
                    requestor: "bench".into(),
                    priority: 0,
                    wants: vec![(small, 1)],
                    ..NewRequest::default()
                },
            )
            .expect("taken");
        pool.tick(now, &mut out);
        out.clear();
        debug_assert!(matches!(
            pool.request(id).map(|r| &r.state),
            Some(RequestState::Fulfilled { .. })
        ));
        black_box(pool.take_changes());
    }
    let elapsed = start.elapsed();
    let fulfilled = pool
        .requests()
        .filter(|r| matches!(r.state, RequestState::Fulfilled { .. }))
        .count();
    assert_eq!(fulfilled, n);
    rows.push((
        format!("requests fulfilled from ready nodes (core, {n} requests, one tick each)"),
        format!("{:.0} /s", n as f64 / elapsed.as_secs_f64()),
    ));
}

async fn service(rows: &mut Vec<(String, String)>) {
    let sim = support::SimServer::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let ready = 2_000usize;
    let text = format!(
        r#"
pool-id = "bench"
ready = "running"
state-dir = {state:?}
plugins-dir = {plugins:?}
boot-poll-interval = "50ms"
[providers.sim]
driver = {driver:?}
max-concurrent-calls = 4
allow-hosts = ["{addr}"]
config = {{ endpoint = "{url}" }}
[labels.small]
min-ready = {ready}
[labels.small.providers.sim]
instance-type = "small"
image = "img"
vcpus = 2
ram = "4GiB"
"#,
        state = dir.path().display().to_string(),
        plugins = support::plugins_dir_and_name(&support::plugin("sim")).0,
        driver = support::plugins_dir_and_name(&support::plugin("sim")).1,
        addr = sim.addr(),
        url = sim.url(),
    );
    let config = config::parse(&text, dir.path(), &|_| None).expect("config");
    let service = berth::runtime::start(config, Default::default())
        .await
        .expect("pool");
    let h = service.handle.clone();
    let prewarm = Instant::now();
    loop {
        let n = h.inspect(|p| p.free_ready(LabelIx(0))).await.expect("pool");
        if n >= ready {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let prewarm = prewarm.elapsed();
    rows.push((
        format!("prewarm {ready} nodes through the sim driver and SQLite"),
        format!(
            "{:.2} s ({:.0} creates/s)",
            prewarm.as_secs_f64(),
            ready as f64 / prewarm.as_secs_f64()
        ),
    ));

    // As many concurrent single-node requests as there are ready nodes.
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..ready {
        let h = h.clone();
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            let id = h
                .submit(NewRequest {
                    requestor: "bench".into(),
                    priority: 0,
                    wants: vec![(LabelIx(0), 1)],
                    ..NewRequest::default()
                })
                .await
                .expect("taken");
            let r = h.wait(id).await.expect("pool").expect("request");
            assert!(matches!(r.state, RequestState::Fulfilled { .. }));
            t.elapsed()
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.push(t.await.expect("task"));
    }
    let elapsed = start.elapsed();
    latencies.sort();
    let p99 = latencies[latencies.len() * 99 / 100];
    rows.push((
        format!("{ready} concurrent requests from ready nodes (runtime + SQLite)"),
        format!(
            "{:.0} /s; {} total; p99 {}",
            ready as f64 / elapsed.as_secs_f64(),
            ms(elapsed),
            ms(p99)
        ),
    ));
    service.stop().await.expect("stop");
}
