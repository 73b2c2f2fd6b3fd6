//! Plugin runtime benchmark: warm call overhead (WASM driver vs the same
//! logic in native Rust, measured in one run), instantiation with the pooling
//! allocator, driver load time cold (compile) vs from the cache for every
//! driver in the repository, and the same driver written in Rust, Python and
//! JavaScript making the same call.
//!
//! Run with `cargo bench -p berth --bench runtime`; the figures go into
//! docs/BENCHMARKS.md.

// Only `tests/support/sys.rs` allows `unsafe` (ARCHITECTURE.md, "Lints and
// unsafe code").
#![deny(unsafe_code)]

#[path = "../../tests/support.rs"]
#[allow(dead_code)]
mod support;

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use berth::driver::{Addresses, Connection, CreateSpec, Instance, InstanceState, POOL_TAG, Tags};
use berth::plugin::{Engine, EngineConfig, Sandbox, SandboxConfig, SandboxLimits};

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    rt.block_on(run());
}

struct Row {
    what: String,
    figure: String,
}

fn per_call(total: Duration, n: u32) -> Duration {
    total / n
}

fn fmt(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.2} µs")
    } else {
        format!("{:.2} ms", us / 1000.0)
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Load `path` `runs` times cold (compile, empty cache) and from the cache,
/// each on a fresh runtime; three rows.
async fn load_times(rows: &mut Vec<Row>, name: &str, path: &std::path::Path, runs: usize) {
    let cache = tempfile::tempdir().expect("tempdir");
    let mut cold = Vec::new();
    let mut cached = Vec::new();
    for _ in 0..runs {
        let _ = std::fs::remove_dir_all(cache.path());
        let config = EngineConfig {
            cache_dir: Some(cache.path().to_path_buf()),
            ..EngineConfig::default()
        };
        let engine = Engine::new(config.clone()).expect("engine");
        let d = engine.load_file(path).await.expect("load");
        assert_eq!(d.source(), berth::plugin::LoadSource::Compiled);
        cold.push(d.load_time());
        let engine = Engine::new(config).expect("engine");
        let d = engine.load_file(path).await.expect("load");
        assert_eq!(d.source(), berth::plugin::LoadSource::Cache);
        cached.push(d.load_time());
    }
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    rows.push(Row {
        what: format!(
            "load {name} driver ({} KiB), cold: compile (median of {runs})",
            size / 1024
        ),
        figure: fmt(median(cold.clone())),
    });
    rows.push(Row {
        what: format!("load {name} driver, from the cache (median of {runs})"),
        figure: fmt(median(cached.clone())),
    });
    rows.push(Row {
        what: format!("load {name} driver, cold / cached"),
        figure: format!(
            "{:.1}×",
            median(cold).as_secs_f64() / median(cached).as_secs_f64()
        ),
    });
}

fn provider(
    driver: &berth::plugin::Driver,
    config: serde_json::Value,
    instances: usize,
) -> Sandbox {
    Sandbox::start(
        driver,
        SandboxConfig {
            name: "bench".into(),
            pool_id: "bench".into(),
            driver_config: config.to_string(),
            allowed_hosts: vec![],
            limits: SandboxLimits {
                max_instances: instances,
                ..SandboxLimits::default()
            },
            credentials: vec![],
            state: None,
            deny: Vec::new(),
            gate: None,
        },
    )
}

/// A create of node `node` in pool `pool`.
fn spec(node: &str, pool: &str) -> CreateSpec {
    CreateSpec {
        node_id: node.into(),
        token: support::sandbox::token_for(node),
        instance_type: "small".into(),
        image: "img".into(),
        tags: [
            (POOL_TAG.to_string(), pool.to_string()),
            ("berth-node".to_string(), node.to_string()),
        ]
        .into(),
        user_data: None,
        ssh_public_key: None,
        options: "{}".into(),
    }
}

fn pool_tags() -> Tags {
    [(POOL_TAG.to_string(), "bench".to_string())].into()
}

/// The example driver's `list`, natively: filter the map by tags and clone the
/// matches into host types. This is the work the WASM driver does, minus the
/// component boundary.
fn native_list(instances: &BTreeMap<String, Instance>, filter: &Tags) -> Vec<Instance> {
    instances
        .values()
        .filter(|i| filter.iter().all(|(k, v)| i.tags.get(k) == Some(v)))
        .cloned()
        .collect()
}

fn native_instance(n: u64) -> Instance {
    Instance {
        id: format!("mem-{n:04}"),
        state: InstanceState::Running,
        instance_type: "small".into(),
        tags: [
            (POOL_TAG.to_string(), "bench".to_string()),
            ("berth-node".to_string(), format!("node-{n}")),
        ]
        .into(),
        addresses: Addresses {
            private_ipv4: Some(format!("10.0.0.{}", n % 250 + 1)),
            ..Addresses::default()
        },
        created_at_ms: Some(1_790_000_000_000),
        connection: Connection {
            username: Some("berth".into()),
            port: Some(22),
            host_keys: vec![],
        },
        failure: None,
    }
}

async fn run() {
    eprintln!("building plugins…");
    let sim_path = support::plugin("sim");
    let hostile_path = support::plugin("hostile");
    let example_path = support::plugin("example");
    let mut rows = Vec::new();

    // Load time: cold (compile) vs from the cache, each on a fresh runtime.
    let static_path = support::plugin("static");
    let ec2_path = support::plugin("aws-ec2");
    for (name, path) in [
        ("sim (Rust)", &sim_path),
        ("example (Rust)", &example_path),
        ("static (Rust)", &static_path),
        ("aws-ec2 (Rust)", &ec2_path),
    ] {
        load_times(&mut rows, name, path, 5).await;
    }
    eprintln!("building the Python and JavaScript drivers…");
    let python_path = support::scripted_plugin("python-example");
    let js_path = support::scripted_plugin("js-example");
    load_times(&mut rows, "python-example (Python)", &python_path, 2).await;
    load_times(&mut rows, "js-example (JavaScript)", &js_path, 2).await;

    // The same driver in three languages, the same call, the same cloud:
    // each lists the same 20 instances of its pool from the sim cloud over
    // HTTP (request, JSON parse, records across the component boundary).
    const LISTED: usize = 20;
    let sim = support::SimServer::start().await;
    let cache = tempfile::tempdir().expect("tempdir");
    let langs = Engine::new(EngineConfig {
        cache_dir: Some(cache.path().to_path_buf()),
        ..EngineConfig::default()
    })
    .expect("engine");
    let mut rust_list = None;
    for (name, path) in [
        ("Rust (sim)", &sim_path),
        ("Python (python-example)", &python_path),
        ("JavaScript (js-example)", &js_path),
    ] {
        let driver = langs.load_file(path).await.expect("load");
        let p = Sandbox::start(
            &driver,
            SandboxConfig {
                name: "lang".into(),
                pool_id: "bench-lang".into(),
                driver_config: serde_json::json!({"endpoint": sim.url()}).to_string(),
                allowed_hosts: vec![
                    berth::plugin::AllowedHost::parse(&sim.addr().to_string()).unwrap(),
                ],
                limits: SandboxLimits {
                    max_instances: 1,
                    ..SandboxLimits::default()
                },
                credentials: vec![],
                state: None,
                deny: Vec::new(),
                gate: None,
            },
        );
        let mut instance = p.instance();
        let t = Instant::now();
        instance.warm().await.expect("warm");
        let start = t.elapsed();
        if rust_list.is_none() {
            for i in 0..LISTED {
                instance
                    .create(spec(&format!("lang-{i}"), "bench-lang"))
                    .await
                    .expect("create");
            }
        }
        let own_pool: Tags = [(POOL_TAG.to_string(), "bench-lang".to_string())].into();
        let n = 200;
        let mut times = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            let listed = instance.list(own_pool.clone()).await.expect("list");
            times.push(t.elapsed());
            assert_eq!(listed.len(), LISTED, "{name} listed {listed:?}");
        }
        let list = median(times);
        rows.push(Row {
            what: format!("{name}: instantiate + configure one instance"),
            figure: fmt(start),
        });
        rows.push(Row {
            what: format!("{name}: list of {LISTED} over HTTP from the sim cloud (median of {n})"),
            figure: fmt(list),
        });
        match rust_list {
            None => rust_list = Some(list),
            Some(rust) => rows.push(Row {
                what: format!("{name}: list / the Rust driver's list"),
                figure: format!("{:.1}×", list.as_secs_f64() / rust.as_secs_f64()),
            }),
        }
    }

    let engine = Engine::new(EngineConfig::default()).expect("engine");
    let hostile = engine.load_file(&hostile_path).await.expect("hostile");
    let example = engine.load_file(&example_path).await.expect("example");

    // Instantiate + configure a fresh instance (pooling allocator).
    let p = provider(&hostile, serde_json::json!({"mode": "ok"}), 1);
    let n = 500;
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let mut instance = p.instance();
        let t = Instant::now();
        instance.warm().await.expect("warm");
        times.push(t.elapsed());
    }
    rows.push(Row {
        what: format!(
            "instantiate + configure a driver instance (pooling allocator, median of {n})"
        ),
        figure: fmt(median(times)),
    });

    // Warm no-op call: the hostile fixture's `list` returns an empty list at once.
    let n: u32 = 50_000;
    let mut direct = p.instance();
    direct.warm().await.expect("warm");
    for _ in 0..1000 {
        direct.list(Tags::new()).await.expect("list");
    }
    let t = Instant::now();
    for _ in 0..n {
        black_box(direct.list(black_box(Tags::new())).await.expect("list"));
    }
    let wasm_noop = per_call(t.elapsed(), n);
    let t = Instant::now();
    for _ in 0..n {
        black_box(p.list(black_box(Tags::new())).await.expect("list"));
    }
    let queued_noop = per_call(t.elapsed(), n);
    let empty: BTreeMap<String, Instance> = BTreeMap::new();
    let t = Instant::now();
    for _ in 0..n {
        black_box(native_list(black_box(&empty), black_box(&Tags::new())));
    }
    let native_noop = per_call(t.elapsed(), n);
    rows.push(Row {
        what: format!("warm no-op call, WASM driver instance held by the caller (mean of {n})"),
        figure: fmt(wasm_noop),
    });
    rows.push(Row {
        what: format!("warm no-op call through a Sandbox (instance checkout, mean of {n})"),
        figure: fmt(queued_noop),
    });
    rows.push(Row {
        what: format!("the same no-op natively (mean of {n})"),
        figure: fmt(native_noop),
    });

    // `list` returning 1,000 instances: the example driver holds them in memory.
    let example_provider = provider(&example, serde_json::json!({}), 1);
    let mut direct = example_provider.instance();
    for i in 0..1000u64 {
        direct
            .create(spec(&format!("node-{i}"), "bench"))
            .await
            .expect("create");
    }
    let native: BTreeMap<String, Instance> = (1..=1000u64)
        .map(|i| (format!("mem-{i:04}"), native_instance(i)))
        .collect();
    let n: u32 = 500;
    let filter = pool_tags();
    assert_eq!(direct.list(filter.clone()).await.expect("list").len(), 1000);
    let t = Instant::now();
    for _ in 0..n {
        black_box(direct.list(filter.clone()).await.expect("list"));
    }
    let wasm_list = per_call(t.elapsed(), n);
    let t = Instant::now();
    for _ in 0..n {
        black_box(native_list(black_box(&native), black_box(&filter)));
    }
    let native_list_t = per_call(t.elapsed(), n);
    rows.push(Row {
        what: format!("list returning 1,000 instances, WASM driver (mean of {n})"),
        figure: fmt(wasm_list),
    });
    rows.push(Row {
        what: format!("the same list natively (mean of {n})"),
        figure: fmt(native_list_t),
    });
    rows.push(Row {
        what: "list of 1,000: WASM / native".into(),
        figure: format!(
            "{:.1}×",
            wasm_list.as_secs_f64() / native_list_t.as_secs_f64()
        ),
    });

    println!("| measurement | figure |");
    println!("| --- | --- |");
    for r in rows {
        println!("| {} | {} |", r.what, r.figure);
    }
}
