//! The HTTP API while drivers spin on every core: `/healthz` and a hand-out
//! from a ready node, measured with and without two hostile providers whose
//! lists spin on the CPU until their deadline (and are listed again soon
//! after each trap), so that as many guests spin as this machine has cores.
//!
//! `cargo bench -p berth --bench sandbox`. berth runs as the `berth serve`
//! binary, as a user runs it; the sim cloud and the clients run in this
//! process. Both runs are made in one sitting, the quiet one first.

// Only `tests/support/sys.rs` allows `unsafe` (ARCHITECTURE.md, "Lints and
// unsafe code").
#![deny(unsafe_code)]

#[path = "../../tests/support.rs"]
#[allow(dead_code)]
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use support::server::{Berth, Launch, http};

/// A config: a sim provider with label `one` (4 kept ready), and `spinners`
/// hostile providers whose lists spin.
fn config(dir: &Path, sim: &support::SimServer, spinners: usize) -> std::path::PathBuf {
    let mut text = format!(
        r#"
pool-id = "bench-sandbox"
ready = "running"
state-dir = {state:?}
plugins-dir = {plugins:?}
sync-interval = "30s"
boot-poll-interval = "100ms"

[api]
listen = "127.0.0.1:0"

[providers.sim]
driver = {sim_driver:?}
allow-hosts = ["{addr}"]
config = {{ endpoint = "{url}" }}

[labels.one]
min-ready = 4
[labels.one.providers.sim]
instance-type = "one"
image = "img"
vcpus = 1
ram = "1GiB"
"#,
        state = dir.join("state").display().to_string(),
        // The sim and hostile drivers are built into one directory.
        plugins = support::plugins_dir_and_name(&support::plugin("sim")).0,
        sim_driver = support::plugins_dir_and_name(&support::plugin("sim")).1,
        addr = sim.addr(),
        url = sim.url(),
    );
    for i in 0..spinners {
        text.push_str(&format!(
            r#"
[providers.spin{i}]
driver = {hostile:?}
config = {{ mode = "ok", list = "spin" }}
[providers.spin{i}.sandbox]
call-deadline = "5s"
"#,
            hostile = support::plugins_dir_and_name(&support::plugin("hostile")).1,
        ));
    }
    let path = dir.join("berth.toml");
    std::fs::write(&path, text).expect("config");
    path
}

/// CPU time (user and system) the process has used, in seconds (Linux).
fn cpu_seconds(pid: i32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which is in parentheses.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the whole line.
    (ticks(11) + ticks(12)) / 100.0
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// The `one` label's ready count.
async fn ready(base: &str) -> u64 {
    let (_, body) = http(base, "GET", "/v1/labels", None, None)
        .await
        .expect("labels");
    let labels: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    labels
        .as_array()
        .and_then(|a| a.iter().find(|l| l["name"] == "one"))
        .and_then(|l| l["ready"].as_u64())
        .unwrap_or(0)
}

/// Measures `/healthz` (500 probes) and hand-outs from ready (200, each
/// released at once); prints p50 and p99 of each.
async fn measure(what: &str, base: &str) -> (Duration, Duration) {
    let mut health = Vec::new();
    for _ in 0..500 {
        let t = Instant::now();
        let (s, _) = http(base, "GET", "/healthz", None, None)
            .await
            .expect("healthz");
        assert_eq!(s, 200);
        health.push(t.elapsed());
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut handout = Vec::new();
    for _ in 0..200 {
        while ready(base).await == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let t = Instant::now();
        let (s, body) = http(
            base,
            "POST",
            "/v1/requests",
            None,
            Some(json!({"labels": {"one": 1}})),
        )
        .await
        .expect("request");
        assert_eq!(s, 201, "{body}");
        let r: serde_json::Value = serde_json::from_str(&body).unwrap();
        let mut r = r;
        while r["state"] == "pending" {
            let path = format!("/v1/requests/{}?wait=60s", r["id"].as_str().unwrap());
            let (_, body) = http(base, "GET", &path, None, None).await.expect("wait");
            r = serde_json::from_str(&body).unwrap();
        }
        handout.push(t.elapsed());
        assert_eq!(r["state"], "fulfilled", "{r}");
        let node = r["nodes"][0]["id"].as_str().unwrap();
        http(
            base,
            "POST",
            &format!("/v1/nodes/{node}/release"),
            None,
            None,
        )
        .await
        .expect("release");
    }
    health.sort();
    handout.sort();
    println!(
        "{what}: /healthz p50 {} p99 {} max {}; hand-out from ready p50 {} p99 {}",
        ms(percentile(&health, 0.5)),
        ms(percentile(&health, 0.99)),
        ms(*health.last().unwrap()),
        ms(percentile(&handout, 0.5)),
        ms(percentile(&handout, 0.99)),
    );
    (percentile(&health, 0.99), percentile(&handout, 0.99))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let sim = support::SimServer::start().await;
    for spinners in [0, cores] {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = config(dir.path(), &sim, spinners);
        let cfg = cfg.display().to_string();
        let server = Berth::launch(Launch {
            level: "berth=warn",
            ..Launch::new(&["--config", &cfg], dir.path())
        })
        .await;
        while ready(&server.base).await < 4 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if spinners > 0 {
            // Let the spinning lists start.
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let what = if spinners == 0 {
            "no driver spinning".to_owned()
        } else {
            format!("{spinners} drivers spinning on {cores} cores")
        };
        let cpu_before = cpu_seconds(server.pid());
        let wall = Instant::now();
        let (health, handout) = measure(&what, &server.base).await;
        let busy = (cpu_seconds(server.pid()) - cpu_before) / wall.elapsed().as_secs_f64();
        let (_, m) = http(&server.base, "GET", "/metrics", None, None)
            .await
            .expect("metrics");
        let traps: f64 = m
            .lines()
            .filter(|l| {
                l.starts_with("berth_sandbox_traps_total{") && l.contains("kind=\"deadline\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .fold(0.0, |a, b| a + b);
        println!(
            "  meanwhile berth used {busy:.2} cores of {cores}; deadline traps so far: {traps}"
        );
        if spinners > 0 {
            let target = Duration::from_millis(10);
            println!(
                "target p99 <= 10 ms: /healthz {}, hand-out {}",
                if health <= target { "met" } else { "MISSED" },
                if handout <= target { "met" } else { "MISSED" },
            );
        }
        server.terminate().await.assert_success();
    }
}
