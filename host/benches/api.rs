//! The pool through its HTTP API, against a sim cloud that creates instantly:
//! the scenarios Nodepool's figures exist for, plus a sustained closed loop.
//!
//! `cargo bench -p berth --bench api`, or `... -- normal` for the store's
//! `sync = "normal"` (the default is `full`), or `... -- postgres` for the
//! PostgreSQL store on a throwaway PostgreSQL 15 cluster that syncs to disk
//! (scripts/postgres; `scripts/setup tests` installs the server). Everything runs on
//! 127.0.0.1, in this process but the database: a sim cloud, `berth serve`
//! (sim driver in its sandbox, the store), and clients that each keep one
//! HTTP/1.1 connection. A request's
//! time is from its POST until a `wait` long-poll says fulfilled.
//!
//! `... -- postgres processes=3` runs three `berth` binaries on the one
//! database instead of berth in this process: one holds the pool, and the
//! clients spread their connections over all three (the two standing by
//! relay to the holder, and offer it new requests); add `holder-only` for clients that go to the holder
//! alone, as behind a load balancer that routes by `/readyz`.
//! `processes=1` runs one binary, to compare with in the same shape (on
//! SQLite too, without `postgres`).
//!
//! `... -- boot=MS` runs the cold scenarios alone against a sim whose
//! instances boot in MS milliseconds, with berth on its default
//! `boot-poll-interval`: how soon berth sees a boot, and how many lists it
//! spends per booting node. For a boot of 5 s or more it runs one cold
//! request and one burst of 20. Then one request whose first instance
//! fails to boot: how soon berth replaces it.
//!
//! `... -- swap` measures a hand-out's latency while the sim driver's
//! file is replaced every second, against the steady state
//! (docs/BENCHMARKS.md, "A driver swapped under load").
//!
//! `... -- ssh` measures what `ready = "ssh"` costs: the sim's instances
//! lead to a real sshd (as in `tests/readiness.rs`) and boot at once;
//! single cold requests alternate between a label ready when running and
//! one ready once an SSH key exchange completes, and `ssh-keyscan` of the
//! same server through an instance's port is timed beside them. berth's
//! overhead is the SSH label's extra time over the keyscan's.

// Only `tests/support/sys.rs` allows `unsafe` (ARCHITECTURE.md, "Lints and
// unsafe code").
#![deny(unsafe_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

#[path = "../../tests/support/postgres.rs"]
#[allow(dead_code)]
mod postgres;
#[path = "../../tests/support/sshd.rs"]
#[allow(dead_code)]
mod sshd;
#[path = "../../tests/support/sys.rs"]
#[allow(dead_code)]
mod sys;

/// One keep-alive HTTP/1.1 connection.
struct Conn {
    stream: BufReader<TcpStream>,
    host: String,
}

impl Conn {
    async fn open(addr: &str) -> Conn {
        let s = TcpStream::connect(addr).await.expect("connect");
        s.set_nodelay(true).expect("nodelay");
        Conn {
            stream: BufReader::new(s),
            host: addr.to_owned(),
        }
    }

    async fn call(&mut self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.host,
            body.len()
        );
        self.stream
            .get_mut()
            .write_all(req.as_bytes())
            .await
            .expect("send");
        let (status, buf) = self.read_response().await;
        (status, serde_json::from_slice(&buf).unwrap_or(Value::Null))
    }

    /// Reads one response: its status and body.
    async fn read_response(&mut self) -> (u16, Vec<u8>) {
        let mut status = 0;
        let mut length = 0;
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stream.read_line(&mut line).await.expect("read head");
            assert!(n > 0, "the server closed the connection");
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some(rest) = l.strip_prefix("HTTP/1.1 ") {
                status = rest[..3].parse().expect("status");
            } else if let Some((k, v)) = l.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().expect("length");
            }
        }
        let mut buf = vec![0; length];
        self.stream.read_exact(&mut buf).await.expect("read body");
        (status, buf)
    }

    /// Creates a request for `labels` and waits until it is fulfilled;
    /// returns the time taken and the request.
    async fn request(&mut self, labels: Value) -> (Duration, Value) {
        let started = Instant::now();
        let (s, r) = self
            .call("POST", "/v1/requests", Some(&json!({"labels": labels})))
            .await;
        assert_eq!(s, 201, "{r}");
        let mut r = r;
        while r["state"] == "pending" {
            let path = format!("/v1/requests/{}?wait=60s", r["id"].as_str().unwrap());
            r = self.call("GET", &path, None).await.1;
        }
        assert_eq!(r["state"], "fulfilled", "{r}");
        (started.elapsed(), r)
    }

    /// A GET whose body is text, not JSON.
    async fn call_text(&mut self, path: &str) -> (u16, String) {
        let req = format!("GET {path} HTTP/1.1\r\nHost: {}\r\n\r\n", self.host);
        self.stream
            .get_mut()
            .write_all(req.as_bytes())
            .await
            .expect("send");
        let (status, body) = self.read_response().await;
        (status, String::from_utf8(body).expect("utf-8"))
    }

    async fn ready(&mut self, label: &str) -> u64 {
        let (_, labels) = self.call("GET", "/v1/labels", None).await;
        labels
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == label)
            .and_then(|l| l["ready"].as_u64())
            .unwrap_or(0)
    }
}

const CONFIG: &str = r#"
pool-id = "bench"
ready = "running"
state-dir = "{state}"
plugins-dir = "{state}"
sync-interval = "30s"
boot-poll-interval = "100ms"

[providers.sim]
driver = "sim.wasm"
allow-hosts = ["{sim}"]
max-concurrent-calls = 16
config = { endpoint = "http://{sim}" }

[labels.cold.providers.sim]
instance-type = "cold"
image = "img"
vcpus = 1
ram = "1GiB"
price = 0.01

[labels.warm]
min-ready = 200
[labels.warm.providers.sim]
instance-type = "warm"
image = "img"
vcpus = 1
ram = "1GiB"
price = 0.01

[labels.one]
min-ready = 4
[labels.one.providers.sim]
instance-type = "one"
image = "img"
vcpus = 1
ram = "1GiB"
price = 0.01

[labels.base.providers.sim]
instance-type = "base"
image = "img"
vcpus = 4
ram = "8GiB"
price = 0.04

[labels.slot4]
slots = 4
backing-label = "base"

[labels.loop]
min-ready = 32
[labels.loop.providers.sim]
instance-type = "loop"
image = "img"
vcpus = 1
ram = "1GiB"
price = 0.01
"#;

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// `n` clients at once, one request of `labels` each, spread over `addrs`;
/// the wall time.
async fn burst(addrs: &[String], n: usize, labels: Value) -> Duration {
    let mut conns = Vec::new();
    for i in 0..n {
        conns.push(Conn::open(&addrs[i % addrs.len()]).await);
    }
    let start = Arc::new(tokio::sync::Barrier::new(n + 1));
    let mut tasks = Vec::new();
    for mut c in conns {
        let start = start.clone();
        let labels = labels.clone();
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            c.request(labels).await;
        }));
    }
    start.wait().await;
    let t = Instant::now();
    for task in tasks {
        task.await.expect("client");
    }
    t.elapsed()
}

/// `clients` closed loops of request → release for `run`; the rate, p50
/// and p99 of the requests.
async fn sustained(addrs: &[String], clients: usize, run: Duration) -> (f64, Duration, Duration) {
    let mut tasks = Vec::new();
    for i in 0..clients {
        let addr = addrs[i % addrs.len()].clone();
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::open(&addr).await;
            let mut took = Vec::new();
            let end = Instant::now() + run;
            while Instant::now() < end {
                let (d, r) = c.request(json!({"loop": 1})).await;
                took.push(d);
                let node = r["nodes"][0]["id"].as_str().unwrap().to_owned();
                let (s, _) = c
                    .call("POST", &format!("/v1/nodes/{node}/release"), None)
                    .await;
                assert_eq!(s, 200);
            }
            took
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort();
    (
        all.len() as f64 / run.as_secs_f64(),
        percentile(&all, 0.5),
        percentile(&all, 0.99),
    )
}

/// The store commits of the whole run from `berth_store_commit_seconds`:
/// how many, and what share took at most each bucket's bound.
fn commit_summary(metrics: &str) -> String {
    let mut buckets = Vec::new();
    let mut count = 0.0;
    for line in metrics.lines() {
        if let Some(rest) = line.strip_prefix("berth_store_commit_seconds_bucket{le=\"") {
            let (le, n) = rest.split_once("\"} ").expect("bucket line");
            buckets.push((le.to_owned(), n.parse::<f64>().expect("bucket count")));
        } else if let Some(n) = line.strip_prefix("berth_store_commit_seconds_count ") {
            count = n.parse().expect("count");
        }
    }
    let shares: Vec<String> = buckets
        .iter()
        .filter(|(le, _)| ["0.0005", "0.001", "0.005", "0.01"].contains(&le.as_str()))
        .map(|(le, n)| {
            format!(
                "<= {} ms {:.2}%",
                le.parse::<f64>().unwrap() * 1e3,
                n / count * 100.0
            )
        })
        .collect();
    format!("store commits: {count}; {}", shares.join(", "))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    berth::embedded::write_sim_driver(dir.path()).expect("sim driver");
    let boot: Option<u64> = std::env::args().find_map(|a| {
        a.strip_prefix("boot=")
            .map(|n| n.parse().expect("milliseconds"))
    });
    let ssh = std::env::args().any(|a| a == "ssh");
    // Stopped when main ends.
    let sshd = ssh.then(sshd::Sshd::start);
    let knobs = berth::sim::Knobs {
        boot_delay_ms: boot.unwrap_or(0),
        ssh_target: sshd.as_ref().map(|s| s.addr.to_string()),
        ..Default::default()
    };
    let cloud = berth::sim::SimCloud::new(knobs, None).expect("sim");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sim = listener.local_addr().unwrap();
    tokio::spawn(cloud.clone().serve(listener, std::future::pending()));
    let arg = |a: &str| std::env::args().any(|x| x == a);
    // Dropped (stopped and removed) at the end of main.
    let mut cluster = None;
    let store = if arg("postgres") {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let c = postgres::PgCluster::start_durable(&root);
        std::fs::write(dir.path().join("pgpass"), c.password()).unwrap();
        let url = format!("postgres://berth@127.0.0.1:{}/berth", c.port());
        println!("store: PostgreSQL 15 on 127.0.0.1 (fsync on, synchronous_commit on)");
        cluster = Some(c);
        format!("\n[store]\nurl = \"{url}\"\npassword-file = \"pgpass\"\n")
    } else {
        let sync = if arg("normal") { "normal" } else { "full" };
        println!("store: SQLite, sync {sync}");
        format!("\n[store]\nsync = \"{sync}\"\n")
    };
    let mut text = CONFIG
        .replace("{state}", &dir.path().display().to_string())
        .replace("{sim}", &sim.to_string())
        + &store;
    if let Some(ms) = boot {
        // berth's own default poll interval, against a cloud that boots.
        text = text.replace("boot-poll-interval = \"100ms\"\n", "");
        println!("sim instances boot in {ms} ms; boot-poll-interval is the default");
    }
    if ssh {
        // No prewarming under the measurement; `cold` waits for SSH.
        text = text
            .replace("min-ready = 200", "min-ready = 0")
            .replace("min-ready = 32", "min-ready = 0")
            .replace(
                "[labels.cold.providers.sim]",
                "[labels.cold]\nready = \"ssh\"\n[labels.cold.providers.sim]",
            )
            + "\n[labels.plain.providers.sim]\ninstance-type = \"cold\"\nimage = \"img\"\nvcpus = 1\nram = \"1GiB\"\n";
    }
    let processes: Option<usize> = std::env::args().find_map(|a| {
        a.strip_prefix("processes=")
            .map(|n| n.parse().expect("a count"))
    });
    if let Some(n) = processes {
        assert!(
            n == 1 || cluster.is_some(),
            "several processes share a PostgreSQL store only"
        );
        return several(dir.path(), &text, n, arg("holder-only")).await;
    }
    let config = dir.path().join("berth.toml");
    std::fs::write(&config, text).unwrap();

    let (addr_tx, addr_rx) = tokio::sync::oneshot::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let options = berth::serve::ServeOptions {
        config: Some(config),
        listen: Some("127.0.0.1:0".parse().unwrap()),
        ..Default::default()
    };
    let server = tokio::spawn(berth::serve::serve(
        options,
        async move {
            let _ = stop_rx.await;
        },
        move |listening, _| {
            let _ = addr_tx.send(listening.addr);
        },
    ));
    let addr = addr_rx.await.expect("listening").to_string();
    if ssh {
        ssh_scenario(&addr).await;
    } else if arg("swap") {
        swap_scenario(&addr, dir.path()).await;
    } else if let Some(ms) = boot {
        cold_scenarios(&addr, &cloud, ms).await;
        failed_scenario(&addr, &cloud, ms).await;
    } else {
        scenarios(std::slice::from_ref(&addr), &addr).await;
    }
    let _ = stop_tx.send(());
    server.await.unwrap().expect("clean stop");
    drop(cluster);
}

/// `processes` `berth serve` binaries on the config `text` (each with a
/// state directory of its own under `dir`), then the scenarios with the
/// clients spread over all of them, or on the holder alone.
async fn several(dir: &std::path::Path, text: &str, processes: usize, holder_only: bool) {
    let mut children = Vec::new();
    let mut addrs = Vec::new();
    for i in 0..processes {
        let state = dir.join(format!("b{i}"));
        std::fs::create_dir_all(&state).unwrap();
        berth::embedded::write_sim_driver(&state).expect("sim driver");
        if dir.join("pgpass").exists() {
            std::fs::copy(dir.join("pgpass"), state.join("pgpass")).unwrap();
        }
        let config = state.join("berth.toml");
        let own = text.replace(&dir.display().to_string(), &state.display().to_string());
        std::fs::write(&config, own).unwrap();
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&config)
            .env("BERTH_LOG", "berth=warn")
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("berth serve");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let addr = loop {
            let line = lines
                .next_line()
                .await
                .unwrap()
                .expect("berth serve listens");
            if let Some(a) = line.strip_prefix("berth listening on http://") {
                break a.to_owned();
            }
        };
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        children.push(child);
        addrs.push(addr);
    }
    // The holder is the one whose /readyz says 200.
    let holder = loop {
        let mut found = None;
        for a in &addrs {
            let mut c = Conn::open(a).await;
            if c.call_text("/readyz").await.0 == 200 {
                found = Some(a.clone());
            }
        }
        if let Some(h) = found {
            break h;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!(
        "{processes} berth process(es) on the one store; clients on {}",
        if holder_only {
            "the holder alone"
        } else {
            "all of them"
        }
    );
    let spread = if holder_only {
        vec![holder.clone()]
    } else {
        addrs.clone()
    };
    scenarios(&spread, &holder).await;
    for mut c in children {
        let pid = rustix::process::Pid::from_raw(c.id().unwrap() as i32).expect("a child's pid");
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let _ = c.wait().await;
    }
}

/// What the cloud was asked so far, by its own record.
#[derive(Clone, Copy, Default)]
struct Asked {
    /// List calls, each a page of at most 100 instances (a list of the 236
    /// prewarmed instances and more is 3 of them).
    lists: usize,
    /// Looks at instances by id (`get`: a list with `id=`).
    gets: usize,
    /// Creates, alone or as items of a batch.
    creates: usize,
}

impl std::ops::Sub for Asked {
    type Output = Asked;
    fn sub(self, before: Asked) -> Asked {
        Asked {
            lists: self.lists - before.lists,
            gets: self.gets - before.gets,
            creates: self.creates - before.creates,
        }
    }
}

fn asked(cloud: &berth::sim::SimCloud) -> Asked {
    let mut a = Asked::default();
    for c in cloud.calls() {
        match (c.method.as_str(), c.path.as_str()) {
            ("GET", "/v1/instances") => {
                let by_id = (c.query.as_deref().unwrap_or_default().split('&'))
                    .any(|kv| kv.starts_with("id="));
                match by_id {
                    true => a.gets += 1,
                    false => a.lists += 1,
                }
            }
            ("POST", "/v1/instances") => a.creates += 1,
            ("POST", "/v1/batch/create") => a.creates += c.items.len(),
            _ => {}
        }
    }
    a
}

/// The scenarios that launch, against a cloud whose instances take
/// `boot_ms` to boot: one request at a time, then bursts, with the lists
/// each booting node cost.
async fn cold_scenarios(addr: &str, cloud: &berth::sim::SimCloud, boot_ms: u64) {
    let mut admin = Conn::open(addr).await;
    let t = Instant::now();
    while admin.ready("warm").await < 200 || admin.ready("loop").await < 32 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("prewarm of 236 nodes: {:.2} s", t.elapsed().as_secs_f64());

    let slow = boot_ms >= 5000;
    let before = asked(cloud);
    let mut one = Vec::new();
    for _ in 0..if slow { 1 } else { 20 } {
        one.push(admin.request(json!({"cold": 1})).await.0);
    }
    one.sort();
    let now = asked(cloud);
    let a = now - before;
    let per = |n: usize| n as f64 / a.creates.max(1) as f64;
    println!(
        "one cold request ({} in turn):                p50 {}  max {}  (target <= 150 ms); per booting node {:.2} list calls, {:.2} gets",
        one.len(),
        ms(percentile(&one, 0.5)),
        ms(one[one.len() - 1]),
        per(a.lists),
        per(a.gets)
    );

    let before = now;
    let n = if slow { 20 } else { 200 };
    let cold = burst(&[addr.to_owned()], n, json!({"cold": 1})).await;
    let now = asked(cloud);
    let a = now - before;
    println!(
        "{n} single-node requests, no ready nodes:     {}  (target <= 0.5 s); {} list calls and {} gets for {} creates",
        ms(cold),
        a.lists,
        a.gets,
        a.creates
    );
    if slow {
        return;
    }

    let before = now;
    let slots = burst(&[addr.to_owned()], 200, json!({"slot4": 1})).await;
    let a = asked(cloud) - before;
    println!(
        "200 requests on a 4-slot label, cold:          {}  (target <= 0.5 s); {} list calls and {} gets for {} creates",
        ms(slots),
        a.lists,
        a.gets,
        a.creates
    );
}

/// One cold request whose first instance fails to boot (the sim's
/// `boot_failure_rate`): how long after the cloud gave up on it berth
/// deleted it and created its replacement, by the cloud's own record, beside
/// when the poll that sees it was due (the rule of `boot_poll_after` on the
/// default `boot-poll-interval`) and `boot-timeout` (10 min).
async fn failed_scenario(addr: &str, cloud: &berth::sim::SimCloud, boot_ms: u64) {
    let mut admin = Conn::open(addr).await;
    let set_failures = |rate: f64| {
        let knobs = berth::sim::Knobs {
            boot_failure_rate: rate,
            ..cloud.knobs()
        };
        cloud.set_knobs(knobs).expect("knobs");
    };
    set_failures(1.0);
    let (s, r) = admin
        .call(
            "POST",
            "/v1/requests",
            Some(&json!({"labels": {"cold": 1}})),
        )
        .await;
    assert_eq!(s, 201, "{r}");
    let failed = loop {
        let failed =
            (cloud.instances().into_iter()).find(|i| i.state == berth::sim::InstanceState::Failed);
        if let Some(f) = failed {
            break f;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    set_failures(0.0);
    // A connection of its own: the first may have idled out meanwhile.
    let mut admin = Conn::open(addr).await;
    let mut r = r;
    while r["state"] == "pending" {
        let path = format!("/v1/requests/{}?wait=60s", r["id"].as_str().unwrap());
        r = admin.call("GET", &path, None).await.1;
    }
    assert_eq!(r["state"], "fulfilled", "{r}");
    let failed_at = failed.created_at_ms + boot_ms;
    let calls = cloud.calls();
    let deleted_at = (calls.iter())
        .find(|c| {
            c.path.ends_with(&format!("/v1/instances/{}", failed.id))
                || (c.path == "/v1/batch/delete"
                    && (c.items.iter()).any(|i| i.id.as_deref() == Some(failed.id.as_str())))
        })
        .map(|c| c.at_ms)
        .expect("the failed instance deleted");
    let replaced_at = (calls.iter())
        .filter(|c| c.method == "POST" && c.at_ms >= failed_at)
        .find(|c| c.path == "/v1/instances" || c.path == "/v1/batch/create")
        .map(|c| c.at_ms)
        .expect("a replacement created");
    // When the poll after the failure was due: 100 ms after the create,
    // then gaps that double up to 5 s.
    let (mut gap, mut due) = (100u64, 100u64);
    while due <= boot_ms {
        gap = (gap * 2).min(5_000);
        due += gap;
    }
    println!(
        "a failed instance ({boot_ms} ms boot): deleted {} ms and replaced {} ms after it failed; \
         the poll after it was due {} ms after (gap {} ms); boot-timeout 600000 ms",
        deleted_at.saturating_sub(failed_at),
        replaced_at.saturating_sub(failed_at),
        due - boot_ms,
        gap
    );
}

/// Single cold requests, alternating between `plain` (ready when running)
/// and `cold` (ready once an SSH key exchange completes), and `ssh-keyscan`
/// of the same sshd through the last node's port, in turn.
async fn ssh_scenario(addr: &str) {
    let mut admin = Conn::open(addr).await;
    // Warm up the connection paths and the driver once.
    admin.request(json!({"plain": 1})).await;
    admin.request(json!({"cold": 1})).await;
    let (mut plain, mut ssh) = (Vec::new(), Vec::new());
    // ssh-keyscan for the three key families berth asks for, and for one.
    let (mut scan, mut scan1) = (Vec::new(), Vec::new());
    let mut port = 0;
    for _ in 0..20 {
        plain.push(admin.request(json!({"plain": 1})).await.0);
        let (took, r) = admin.request(json!({"cold": 1})).await;
        ssh.push(took);
        let id = r["nodes"][0]["id"].as_str().unwrap().to_owned();
        let (_, node) = admin.call("GET", &format!("/v1/nodes/{id}"), None).await;
        port = node["connection"]["port"].as_u64().expect("a port");
        let keys = node["connection"]["host_keys"]
            .as_array()
            .map_or(0, Vec::len);
        assert_eq!(keys, 3, "{node}");
        for (types, times, keys) in [
            ("ed25519,ecdsa,rsa", &mut scan, 3),
            ("ed25519", &mut scan1, 1),
        ] {
            let t = Instant::now();
            let out = tokio::process::Command::new("ssh-keyscan")
                .args(["-T", "5", "-t", types, "-p", &port.to_string()])
                .arg("127.0.0.1")
                .output()
                .await
                .expect("ssh-keyscan runs");
            times.push(t.elapsed());
            assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), keys);
        }
    }
    for v in [&mut plain, &mut ssh, &mut scan, &mut scan1] {
        v.sort();
    }
    let p50 = |v: &[Duration]| percentile(v, 0.5);
    let line = |what: &str, v: &[Duration]| {
        println!("{what:<45} p50 {}  max {}", ms(p50(v)), ms(v[v.len() - 1]));
    };
    line("one cold request, ready when running (20):", &plain);
    line("one cold request, ready = \"ssh\" (20):", &ssh);
    line(
        &format!("ssh-keyscan, 3 key types (port {port}, 20):"),
        &scan,
    );
    line("ssh-keyscan, ed25519 only (20):", &scan1);
    let probe = p50(&ssh).as_secs_f64() - p50(&plain).as_secs_f64();
    println!(
        "berth's overhead over ssh-keyscan per node:   {:.2} ms over 3 types, {:.2} ms over ed25519 only  (ssh - running - keyscan at p50; target <= 20 ms)",
        (probe - p50(&scan).as_secs_f64()) * 1e3,
        (probe - p50(&scan1).as_secs_f64()) * 1e3
    );
}

/// Every scenario, with clients on `addrs`; the store commits are read
/// from `holder`'s metrics.
/// `... -- swap`: one client's hand-outs from ready nodes (request →
/// fulfilled → release, in a loop) for 10 s in a steady state, then for
/// 10 s while the sim driver's file is replaced by a new build every second
/// (the same driver with a custom section that differs: each is a new
/// sha256, checked, compiled and configured beside the running one); two
/// rounds, alternating.
async fn swap_scenario(addr: &str, dir: &std::path::Path) {
    use sha2::Digest;
    let mut admin = Conn::open(addr).await;
    while admin.ready("loop").await < 32 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    admin.request(json!({"one": 1})).await;
    let driver = dir.join("sim.wasm");
    let bytes = std::fs::read(&driver).expect("the sim driver");
    let run = Duration::from_secs(10);
    let mut build = 0u32;
    for round in 1..=2 {
        let (rate, p50, p99) = sustained(&[addr.to_owned()], 1, run).await;
        println!(
            "round {round}, steady:      {rate:.0} hand-outs/s  p50 {}  p99 {}",
            ms(p50),
            ms(p99)
        );
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swapper = {
            let (stop, addr, driver, bytes) =
                (stop.clone(), addr.to_owned(), driver.clone(), bytes.clone());
            let first = build;
            tokio::spawn(async move {
                let mut admin = Conn::open(&addr).await;
                let mut took = Vec::new();
                let mut build = first;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    build += 1;
                    let started = Instant::now();
                    let mut next = bytes.clone();
                    // A custom section (id 0) named "x" holding the build number.
                    next.extend_from_slice(&[0x00, 0x06, 0x01, b'x']);
                    next.extend_from_slice(&build.to_le_bytes());
                    let sha = hex::encode(sha2::Sha256::digest(&next));
                    let tmp = driver.with_extension("tmp");
                    std::fs::write(&tmp, &next).expect("write");
                    std::fs::rename(&tmp, &driver).expect("rename");
                    loop {
                        let (_, drivers) = admin.call("GET", "/v1/drivers", None).await;
                        if drivers[0]["sha256"] == sha.as_str() {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    took.push(started.elapsed());
                    let gap = Duration::from_secs(1).saturating_sub(started.elapsed());
                    tokio::time::sleep(gap).await;
                }
                (build, took)
            })
        };
        let (rate, p50, p99) = sustained(&[addr.to_owned()], 1, run).await;
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let (last, mut took) = swapper.await.expect("the swapper");
        build = last;
        took.sort();
        println!(
            "round {round}, swapping:    {rate:.0} hand-outs/s  p50 {}  p99 {}  ({} swaps, file written to running: p50 {}, max {})",
            ms(p50),
            ms(p99),
            took.len(),
            ms(percentile(&took, 0.5)),
            ms(*took.last().expect("a swap"))
        );
    }
}

async fn scenarios(addrs: &[String], holder: &str) {
    let addr = &addrs[0];
    let mut admin = Conn::open(addr).await;
    let t = Instant::now();
    while admin.ready("warm").await < 200 || admin.ready("loop").await < 32 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("prewarm of 236 nodes: {:.2} s", t.elapsed().as_secs_f64());

    // Warm up the connection paths once.
    admin.request(json!({"one": 1})).await;

    let cold = burst(addrs, 200, json!({"cold": 1})).await;
    println!(
        "200 single-node requests, no ready nodes:     {}  (Nodepool ~10-13 s; target <= 1 s)",
        ms(cold)
    );

    let warm = burst(addrs, 200, json!({"warm": 1})).await;
    println!(
        "200 requests served from 200 ready nodes:     {}  ({:.0} requests/s; Nodepool ~6-7 s; target <= 100 ms)",
        ms(warm),
        200.0 / warm.as_secs_f64()
    );

    let mut one = Vec::new();
    let mut turns = Vec::new();
    for a in addrs {
        turns.push(Conn::open(a).await);
    }
    // 1000, so that the p99 is the tenth slowest and not the second.
    for i in 0..1000 {
        while admin.ready("one").await == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let n = turns.len();
        one.push(turns[i % n].request(json!({"one": 1})).await.0);
    }
    one.sort();
    println!(
        "one request from a ready node (1000 in turn): p50 {}  p99 {}  (Nodepool 0.6-1.0 s; target p99 <= 5 ms)",
        ms(percentile(&one, 0.5)),
        ms(percentile(&one, 0.99))
    );

    let slots = burst(addrs, 200, json!({"slot4": 1})).await;
    println!(
        "200 requests on a 4-slot label, cold:          {}  (Nodepool ~9-16 s; target <= 1 s)",
        ms(slots)
    );

    // Sustained: n clients, each request → release in a loop. The rate
    // that keeps p99 within 10 ms is the figure the target asks for.
    let run = Duration::from_secs(5);
    let mut best = None;
    for clients in [1, 2, 4, 8] {
        let (rate, p50, p99) = sustained(addrs, clients, run).await;
        println!(
            "sustained, {clients} clients request → release for {} s: {rate:.0} requests/s  p50 {}  p99 {}",
            run.as_secs(),
            ms(p50),
            ms(p99)
        );
        if p99 <= Duration::from_millis(10) && best.is_none_or(|(_, r)| rate > r) {
            best = Some((clients, rate));
        }
    }
    match best {
        Some((clients, rate)) => println!(
            "highest sustained rate with p99 <= 10 ms: {rate:.0} requests/s ({clients} clients)"
        ),
        None => println!("no sustained run kept p99 <= 10 ms"),
    }

    // A new connection: the first one sat idle through the sustained runs,
    // longer than the server keeps an idle connection open.
    let mut admin = Conn::open(holder).await;
    let (status, metrics) = admin.call_text("/metrics").await;
    assert_eq!(status, 200, "{metrics}");
    println!("{}", commit_summary(&metrics));
}
