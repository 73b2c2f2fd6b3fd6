//! What a scheduler needs from a pool, through the `berth serve` binary:
//! - a request sent again with its `Idempotency-Key` (after a timeout, or
//!   across a SIGKILL and a restart) answers the request the first try
//!   made, and never makes a second one or a second set of nodes;
//! - clients that give up waiting after 4 s on machines that take 10 s to
//!   boot, and ask again with their key, each get their machines, and no
//!   machine goes to a request nobody waits for;
//! - metadata is kept on a request, shown on its nodes to whom they are
//!   shown, filtered by, and refused when it is more than berth keeps.
//!
//! (The same key through a process standing by on PostgreSQL is in
//! `tests/ha.rs`.)

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::SimServer;
use crate::support::config::{CI, OPS, OTHER, serve_config_with, set_lease_ttl, test_store};
use crate::support::server::{Berth, http_with, run_berth, until};
use crate::support::{live, plugin};

/// `POST /v1/requests` with `body`, as `token`, with idempotency key
/// `key`: the status and the answer.
pub(crate) async fn post_keyed(
    server: &Berth,
    token: &str,
    key: &str,
    body: &Value,
) -> (u16, Value) {
    let (status, text) = http_with(
        &server.base,
        "POST",
        "/v1/requests",
        Some(token),
        &[("Idempotency-Key", key)],
        Some(body.clone()),
    )
    .await
    .unwrap_or_else(|e| panic!("POST /v1/requests: {e}"));
    let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, v)
}

/// A sim cloud whose machines run `ms` after they are made.
async fn sim_booting(ms: u64) -> SimServer {
    SimServer::start_with(berth::sim::Knobs {
        boot_delay_ms: ms,
        ..berth::sim::Knobs::default()
    })
    .await
}

/// A `berth serve` config against `sim` in a new directory, with
/// `small` as the keys of `[labels.small]`, `extra` appended, the suite's
/// store, and requestor leases of 10 minutes (no client here renews one).
fn config_for(sim: &SimServer, small: &str, extra: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let extra = format!("{extra}\n{}", test_store(dir.path()));
    let cfg = serve_config_with(sim, dir.path(), &plugin("sim"), small, &extra);
    set_lease_ttl(&cfg, "10m");
    (dir, cfg)
}

/// `berth serve --config cfg` in `dir`, once it is ready.
async fn serve(dir: &Path, cfg: &Path) -> Berth {
    let server = Berth::start(&["--config", &cfg.display().to_string()], dir).await;
    server.until_ready(30, "ready").await;
    server
}

/// Request `id` as `token` sees it.
async fn request_as(server: &Berth, token: &str, id: &str) -> Value {
    let (s, r) = server
        .call("GET", &format!("/v1/requests/{id}"), Some(token), None)
        .await;
    assert_eq!(s, 200, "{r}");
    r
}

/// Every request berth keeps, as an admin sees them.
async fn all_requests(server: &Berth) -> Vec<Value> {
    let (s, list) = server.call("GET", "/v1/requests", Some(OPS), None).await;
    assert_eq!(s, 200, "{list}");
    list.as_array().unwrap().clone()
}

/// The ids of a request's nodes.
fn node_ids(request: &Value) -> Vec<String> {
    let mut ids: Vec<String> = (request["nodes"].as_array().unwrap().iter())
        .map(|n| n["id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

/// SIGKILL, then `berth serve` again on the same config.
async fn killed_and_restarted(server: Berth, cfg: &Path, dir: &Path) -> Berth {
    server.signal(libc::SIGKILL);
    server.exit_within(Duration::from_secs(30)).await;
    serve(dir, cfg).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_sent_again_across_two_sigkills_makes_one_request_and_one_set_of_nodes() {
    let sim = SimServer::start().await;
    let (dir, cfg) = config_for(&sim, "min-ready = 0", "");
    let server = serve(dir.path(), &cfg).await;

    let body = json!({"labels": {"small": 2}, "metadata": {"build": "42"}});
    let (s, first) = post_keyed(&server, CI, "build-42", &body).await;
    assert_eq!(s, 201, "{first}");
    let id = first["id"].as_str().unwrap().to_owned();
    assert_eq!(first["idempotency_key"], "build-42");
    // Sent again at once (the client's first try timed out, say): the
    // same request, answered 200.
    let (s, again) = post_keyed(&server, CI, "build-42", &body).await;
    assert_eq!(
        (s, again["id"].as_str()),
        (200, Some(id.as_str())),
        "{again}"
    );

    // Across a SIGKILL: the key is stored with its request.
    let server = killed_and_restarted(server, &cfg, dir.path()).await;
    let (s, after_kill) = post_keyed(&server, CI, "build-42", &body).await;
    assert_eq!(
        (s, after_kill["id"].as_str()),
        (200, Some(id.as_str())),
        "{after_kill}"
    );
    let held = server.fulfilled(CI, &id).await;
    let nodes = node_ids(&serde_json::to_value(&held).unwrap());
    assert_eq!(nodes.len(), 2);

    // Across a second SIGKILL, once fulfilled: the request as it is now,
    // with the nodes it was handed.
    let server = killed_and_restarted(server, &cfg, dir.path()).await;
    let (s, fulfilled) = post_keyed(&server, CI, "build-42", &body).await;
    assert_eq!(s, 200, "{fulfilled}");
    assert_eq!(fulfilled["state"], "fulfilled");
    assert_eq!(node_ids(&fulfilled), nodes);
    let (s, fifth) = post_keyed(&server, CI, "build-42", &body).await;
    assert_eq!((s, node_ids(&fifth)), (200, nodes.clone()), "{fifth}");

    // The same key with another body is refused, naming the header; so is
    // a key that is not one.
    let other_body = json!({"labels": {"small": 1}, "metadata": {"build": "42"}});
    let (s, refused) = post_keyed(&server, CI, "build-42", &other_body).await;
    assert_eq!(s, 422, "{refused}");
    assert_eq!(refused["error"]["code"], "idempotency_key_reused");
    assert_eq!(refused["error"]["field"], "Idempotency-Key");
    assert!(
        refused["error"]["message"].as_str().unwrap().contains(&id),
        "{refused}"
    );
    let (s, bad) = post_keyed(&server, CI, "has space", &body).await;
    assert_eq!(
        (s, &bad["error"]["field"]),
        (400, &json!("Idempotency-Key")),
        "{bad}"
    );

    // One request, and one set of nodes: the cloud made two instances.
    let keyed: Vec<Value> = (all_requests(&server).await.into_iter())
        .filter(|r| r["idempotency_key"] == "build-42")
        .collect();
    assert_eq!(keyed.len(), 1, "{keyed:#?}");
    assert_eq!(all_requests(&server).await.len(), 1);
    assert_eq!(live(&sim.cloud).len(), 2, "{:#?}", live(&sim.cloud));

    // A key is its requestor's: another client's same key is its own.
    let (s, theirs) = post_keyed(&server, OTHER, "build-42", &body).await;
    assert_eq!(s, 201, "{theirs}");
    assert_ne!(theirs["id"].as_str(), Some(id.as_str()));
    server.terminate().await.assert_success();
}

/// A keyed request ended is kept past `history` (1 s here) until
/// `idempotency-ttl` (5 s) after it was made, answered again by its key
/// meanwhile; then it is forgotten, and the key makes a new request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_kept_for_idempotency_ttl_past_history_then_makes_a_new_request() {
    let sim = SimServer::start().await;
    let (dir, cfg) = config_for(&sim, "min-ready = 0", "");
    crate::support::config::edit_config(
        &cfg,
        "sync-interval = \"1s\"",
        "sync-interval = \"1s\"\nhistory = \"1s\"\nidempotency-ttl = \"5s\"",
    );
    let server = serve(dir.path(), &cfg).await;
    let body = json!({"labels": {"small": 1}});
    let made = std::time::Instant::now();
    let (s, first) = post_keyed(&server, CI, "nightly", &body).await;
    assert_eq!(s, 201, "{first}");
    let id = first["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/requests/{id}");
    let (s, cancelled) = server.call("DELETE", &path, Some(CI), None).await;
    assert_eq!((s, &cancelled["state"]), (200, &json!("cancelled")));
    // Past `history`: still kept, and the key still answers it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(request_as(&server, CI, &id).await["state"], "cancelled");
    let (s, again) = post_keyed(&server, CI, "nightly", &body).await;
    assert_eq!((s, &again["state"]), (200, &json!("cancelled")), "{again}");
    // Past `idempotency-ttl`: forgotten.
    until(30, "the keyed request forgotten", || async {
        let (s, _) = server.call("GET", &path, Some(CI), None).await;
        (s == 404).then_some(())
    })
    .await;
    let gone = made.elapsed();
    assert!(gone >= Duration::from_secs(5), "forgotten after {gone:?}");
    println!("a keyed request ended at once was forgotten {gone:?} after it was made");
    let (s, anew) = post_keyed(&server, CI, "nightly", &body).await;
    // A new request under the same id (made from requestor and key),
    // served from the machine the first left ready.
    assert_eq!(s, 201, "{anew}");
    assert_eq!(anew["id"].as_str(), Some(id.as_str()));
    assert_ne!(anew["state"], "cancelled");
    server.terminate().await.assert_success();
}

/// Ten clients, each wanting one machine and willing to wait 4 s at a time
/// for it, against machines that take 10 s to boot and room for exactly
/// ten. Each asks again with its key every time it gives up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_give_up_after_4s_and_ask_again_with_their_key_all_get_machines() {
    const CLIENTS: usize = 10;
    let sim = sim_booting(10_000).await;
    let extra = format!("[providers.sim.limits]\nmax-instances = {CLIENTS}");
    let (dir, cfg) = config_for(&sim, "min-ready = 0", &extra);
    let server = std::sync::Arc::new(serve(dir.path(), &cfg).await);

    let body = json!({"labels": {"small": 1}});
    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        let (server, body) = (server.clone(), body.clone());
        clients.push(tokio::spawn(async move {
            let key = format!("job-{i}");
            let mut tries = 0;
            loop {
                tries += 1;
                assert!(tries <= 20, "client {i} never got its machine");
                let (s, r) = post_keyed(&server, CI, &key, &body).await;
                assert_eq!(s, if tries == 1 { 201 } else { 200 }, "client {i}: {r}");
                let id = r["id"].as_str().unwrap().to_owned();
                if r["state"] == "fulfilled" {
                    return (id, node_ids(&r), tries);
                }
                // Waits 4 s, then gives up and asks again.
                let path = format!("/v1/requests/{id}?wait=4s");
                let (s, r) = server.call("GET", &path, Some(CI), None).await;
                assert_eq!(s, 200, "{r}");
                if r["state"] == "fulfilled" {
                    return (id, node_ids(&r), tries);
                }
            }
        }));
    }
    let mut ids = Vec::new();
    let mut machines = Vec::new();
    let mut retried = 0;
    for c in clients {
        let (id, nodes, tries) = c.await.unwrap();
        assert_eq!(nodes.len(), 1);
        ids.push(id);
        machines.extend(nodes);
        retried += usize::from(tries > 1);
    }
    println!("{CLIENTS} clients served; {retried} of them asked again at least once");
    // Every client gave up at least once (a boot takes 10 s), and each
    // has its own machine.
    assert_eq!(retried, CLIENTS);
    machines.sort();
    machines.dedup();
    assert_eq!(machines.len(), CLIENTS);
    // One request per client, and no machine for anyone else: the cloud
    // made one instance per client.
    let requests = all_requests(&server).await;
    assert_eq!(requests.len(), CLIENTS, "{requests:#?}");
    assert!(requests.iter().all(|r| r["state"] == "fulfilled"));
    assert_eq!(live(&sim.cloud).len(), CLIENTS);
    let server = std::sync::Arc::into_inner(server).expect("every client is done");
    server.terminate().await.assert_success();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_is_kept_shown_to_the_holder_filtered_by_and_bounded() {
    let sim = SimServer::start().await;
    let (dir, cfg) = config_for(&sim, "min-ready = 0", "");
    let server = serve(dir.path(), &cfg).await;

    // Through the CLI, as a scheduler's script would.
    let base = server.base.clone();
    let cli = |args: &[&str]| {
        let mut all: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        all.extend(["--server".into(), base.clone(), "--token".into(), CI.into()]);
        async move { run_berth(all, &[]).await }
    };
    let asked = [
        "request",
        "small",
        "--meta",
        "zuul.build=b-17",
        "--meta",
        "tenant=north side",
        "--idempotency-key",
        "b-17",
        "--json",
    ];
    let ran = cli(&[&asked[..], &["--wait", "60s"]].concat()).await;
    assert!(ran.success(), "{ran}");
    let request: Value = serde_json::from_str(&ran.stdout).unwrap();
    let want = json!({"tenant": "north side", "zuul.build": "b-17"});
    assert_eq!(request["metadata"], want, "{request}");
    assert_eq!(request["idempotency_key"], "b-17");
    assert_eq!(request["nodes"][0]["metadata"], want);
    let id = request["id"].as_str().unwrap().to_owned();
    let node = request["nodes"][0]["id"].as_str().unwrap().to_owned();
    // The same run again finds the same request.
    let ran = cli(&asked).await;
    assert!(ran.success(), "{ran}");
    let again: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(again["id"].as_str(), Some(id.as_str()));

    // A second request, with other metadata.
    let (s, second) = server
        .call(
            "POST",
            "/v1/requests",
            Some(CI),
            Some(json!({"labels": {"small": 1}, "metadata": {"tenant": "south"}})),
        )
        .await;
    assert_eq!(s, 201, "{second}");
    let ids = |v: &Value| -> Vec<String> {
        (v.as_array().unwrap().iter())
            .map(|x| x["id"].as_str().unwrap().to_owned())
            .collect()
    };
    for (query, want) in [
        ("?meta.tenant=north%20side", vec![id.clone()]),
        (
            "?meta.tenant=north%20side&meta.zuul.build=b-17",
            vec![id.clone()],
        ),
        ("?meta.tenant=north%20side&meta.zuul.build=b-18", vec![]),
        (
            "?meta.tenant=south",
            vec![second["id"].as_str().unwrap().to_owned()],
        ),
        ("?meta.absent=x", vec![]),
    ] {
        let (s, list) = server
            .call("GET", &format!("/v1/requests{query}"), Some(CI), None)
            .await;
        assert_eq!((s, ids(&list)), (200, want), "{query}: {list}");
    }
    // Nodes: filtered by their request's metadata, for whom it is shown.
    let path = "/v1/nodes?meta.zuul.build=b-17";
    let (s, mine) = server.call("GET", path, Some(CI), None).await;
    assert_eq!((s, ids(&mine)), (200, vec![node.clone()]), "{mine}");
    let (_, for_admin) = server.call("GET", path, Some(OPS), None).await;
    assert_eq!(ids(&for_admin), vec![node.clone()]);
    let (_, for_other) = server.call("GET", path, Some(OTHER), None).await;
    assert_eq!(ids(&for_other), Vec::<String>::new(), "{for_other}");
    let (_, seen) = server
        .call("GET", &format!("/v1/nodes/{node}"), Some(OTHER), None)
        .await;
    assert_eq!(seen["id"].as_str(), Some(node.as_str()));
    assert!(seen.get("metadata").is_none(), "{seen}");
    let ran = cli(&["nodes", "--meta", "zuul.build=b-17", "--json"]).await;
    assert!(ran.success(), "{ran}");
    let listed: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(ids(&listed), vec![node.clone()]);
    assert_eq!(listed[0]["metadata"], want);

    // More than berth keeps: 422 naming the field; a key that is not one:
    // 400.
    let too_many: serde_json::Map<String, Value> =
        (0..33).map(|i| (format!("k{i}"), json!("v"))).collect();
    let long = "x".repeat(513);
    for (metadata, status, code, field) in [
        (
            Value::Object(too_many),
            422,
            "metadata_too_large",
            "metadata",
        ),
        (
            json!({"log": long}),
            422,
            "metadata_too_large",
            "metadata.log",
        ),
        (json!({"has space": "v"}), 400, "bad_request", "metadata"),
        (
            json!({"job": "a\u{202e}b"}),
            400,
            "bad_request",
            "metadata.job",
        ),
        (json!({"job": 7}), 400, "bad_request", "metadata.job"),
    ] {
        let body = json!({"labels": {"small": 1}, "metadata": metadata});
        let (s, e) = server
            .call("POST", "/v1/requests", Some(CI), Some(body))
            .await;
        assert_eq!(s, status, "{e}");
        assert_eq!(e["error"]["code"], code, "{e}");
        assert_eq!(e["error"]["field"], field, "{e}");
    }
    let (s, e) = server
        .call("GET", "/v1/nodes?meta.a%20b=1", Some(CI), None)
        .await;
    assert_eq!((s, &e["error"]["field"]), (400, &json!("meta.a b")), "{e}");
    // Nothing refused was taken.
    assert_eq!(all_requests(&server).await.len(), 2);

    // Kept across a restart.
    server.terminate().await.assert_success();
    let server = serve(dir.path(), &cfg).await;
    let (_, kept) = server
        .call("GET", &format!("/v1/requests/{id}"), Some(CI), None)
        .await;
    assert_eq!(kept["metadata"], want, "{kept}");
    until(30, "the node's metadata after the restart", || async {
        let (_, n) = server
            .call("GET", &format!("/v1/nodes/{node}"), Some(CI), None)
            .await;
        (n["metadata"] == want).then_some(())
    })
    .await;
    server.terminate().await.assert_success();
}

/// `examples/scheduler.py`, the loop docs/api.md "Writing a client" shows,
/// run against the binary for one job, twice: the first run asks (201),
/// waits on the event stream while the machines boot, and releases them;
/// the second, as a scheduler restarted after the job, finds the same
/// request by its key (200) and reads its releases as done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_scheduler_asks_waits_on_events_releases_and_a_rerun_finds_its_request() {
    let sim = sim_booting(1_500).await;
    let (dir, cfg) = config_for(&sim, "min-ready = 0", "");
    let server = serve(dir.path(), &cfg).await;
    let script = crate::support::workspace().join("examples/scheduler.py");
    let run = || async {
        let out = tokio::process::Command::new("python3")
            .arg(&script)
            .args(["4711", "small=2"])
            .env("BERTH_SERVER", &server.base)
            .env("BERTH_TOKEN", CI)
            .output()
            .await
            .expect("python3");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{}\n{stderr}", out.status);
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let first = run().await;
    assert_eq!(first["asked"], 201, "{first}");
    let released = first["released"].as_object().unwrap();
    assert_eq!(released.len(), 2, "{first}");
    assert!(released.values().all(|c| c == 200), "{first}");
    let again = run().await;
    assert_eq!(again["asked"], 200, "{again}");
    assert_eq!(again["request"], first["request"]);
    let done = again["released"].as_object().unwrap();
    assert_eq!(
        done.keys().collect::<Vec<_>>(),
        released.keys().collect::<Vec<_>>()
    );
    assert!(done.values().all(|c| c == 409 || c == 404), "{again}");

    let requests = all_requests(&server).await;
    assert_eq!(requests.len(), 1, "{requests:#?}");
    assert_eq!(requests[0]["metadata"], json!({"job": "4711"}));
    for node in released.keys() {
        let (_, n) = server
            .call("GET", &format!("/v1/nodes/{node}"), Some(CI), None)
            .await;
        assert_ne!(n["state"], "in-use", "{n}");
    }
    server.terminate().await.assert_success();
}

/// Room for ten machines, kept full by a stream of one-node requests
/// (twelve clients, each holding its machine 1 to 2.1 s and asking again),
/// and a ten-node request among them. With `reserve-after = "5s"`, it keeps what
/// frees up from then on and is served within reserve-after, a hold and a
/// boot; the one-node requests behind it say what they wait for (`kept`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_request_among_a_stream_of_small_ones_is_served_after_reserve_after() {
    let sim = sim_booting(500).await;
    let extra = "[providers.sim.limits]\nmax-instances = 10";
    let (dir, cfg) = config_for(&sim, "min-ready = 0", extra);
    crate::support::config::edit_config(
        &cfg,
        "sync-interval = \"1s\"",
        "sync-interval = \"1s\"\nreserve-after = \"5s\"",
    );
    let server = std::sync::Arc::new(serve(dir.path(), &cfg).await);

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut stream = Vec::new();
    for i in 0..12 {
        let (server, stop) = (server.clone(), stop.clone());
        let hold = Duration::from_millis(1000 + 100 * i);
        stream.push(tokio::spawn(async move {
            let mut served = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let body = json!({"labels": {"small": 1}});
                let (s, r) = server
                    .call("POST", "/v1/requests", Some(CI), Some(body))
                    .await;
                assert_eq!(s, 201, "{r}");
                let path = format!("/v1/requests/{}?wait=2s", r["id"].as_str().unwrap());
                let (_, r) = server.call("GET", &path, Some(CI), None).await;
                if r["state"] != "fulfilled" {
                    // Given up: cancelled, so that it holds nothing.
                    let path = format!("/v1/requests/{}", r["id"].as_str().unwrap());
                    server.call("DELETE", &path, Some(CI), None).await;
                    continue;
                }
                served += 1;
                tokio::time::sleep(hold).await;
                let node = &r["nodes"][0]["id"].as_str().unwrap().to_owned();
                server
                    .call("POST", &format!("/v1/nodes/{node}/release"), Some(CI), None)
                    .await;
            }
            served
        }));
    }
    // The stream fills the pool first.
    until(30, "the pool full of one-node requests", || async {
        (live(&sim.cloud).len() >= 10).then_some(())
    })
    .await;
    let asked = std::time::Instant::now();
    let (s, big) = server
        .call(
            "POST",
            "/v1/requests",
            Some(OTHER),
            Some(json!({"labels": {"small": 10}})),
        )
        .await;
    assert_eq!(s, 201, "{big}");
    let path = format!("/v1/requests/{}", big["id"].as_str().unwrap());
    // While it keeps room, a one-node request behind it says so.
    let mut kept_seen = false;
    let served = loop {
        let (_, b) = server.call("GET", &path, Some(OTHER), None).await;
        if b["state"] == "fulfilled" {
            break asked.elapsed();
        }
        assert!(
            asked.elapsed() < Duration::from_secs(60),
            "still pending: {b}"
        );
        let (_, pending) = server
            .call("GET", "/v1/requests?state=pending", Some(CI), None)
            .await;
        kept_seen |= (pending.as_array().unwrap().iter())
            .flat_map(|r| r["waiting"].as_array().cloned().unwrap_or_default())
            .any(|w| w["reason"] == "kept");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut small_served = 0;
    for s in stream {
        small_served += s.await.unwrap();
    }
    println!(
        "the ten-node request was served {served:?} after it was asked; {small_served} one-node \
         requests were served around it"
    );
    assert!(
        kept_seen,
        "no request behind it said it waits for room kept"
    );
    // Not before reserve-after (5 s): the stream takes every machine that
    // frees until then. Then within the holds of the machines it waits
    // for (at most 2.1 s) and a boot (0.5 s), with room for the sim's
    // lists.
    assert!(served >= Duration::from_secs(5), "{served:?}");
    assert!(served < Duration::from_secs(5 + 3 + 1 + 6), "{served:?}");
    assert!(small_served > 10, "the stream served {small_served}");
    let server = std::sync::Arc::into_inner(server).expect("the stream is done");
    server.terminate().await.assert_success();
}

/// `max-nodes` on client `ci`'s token (2) and on label `small` (4): a
/// request over either waits with the reason `cap`, is never failed for
/// it, and is served once enough is given back; one that alone asks for
/// more than a cap is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requestor_at_its_cap_waits_with_the_reason_cap_and_is_served_when_it_releases() {
    let sim = SimServer::start().await;
    let (dir, cfg) = config_for(&sim, "min-ready = 0\nmax-nodes = 4", "");
    crate::support::config::edit_config(
        &cfg,
        &format!("token = \"{CI}\""),
        &format!("token = \"{CI}\"\nmax-nodes = 2"),
    );
    let server = serve(dir.path(), &cfg).await;
    let ask = |token: &'static str, n: u32| {
        let server = &server;
        async move {
            let body = json!({"labels": {"small": n}});
            server
                .call("POST", "/v1/requests", Some(token), Some(body))
                .await
        }
    };
    let id = |r: &Value| r["id"].as_str().unwrap().to_owned();
    // Alone over a cap: refused.
    let (s, e) = ask(CI, 3).await;
    assert_eq!(
        (s, &e["error"]["code"]),
        (422, &json!("unsatisfiable")),
        "{e}"
    );
    let (s, e) = ask(OTHER, 5).await;
    assert_eq!(
        (s, &e["error"]["code"]),
        (422, &json!("unsatisfiable")),
        "{e}"
    );

    let (_, first) = ask(CI, 2).await;
    let first = server.fulfilled(CI, &id(&first)).await;
    // At its cap of two: a third waits, with the reason.
    let (s, capped) = ask(CI, 1).await;
    assert_eq!(s, 201, "{capped}");
    let capped = id(&capped);
    until(30, "the request says it waits for the cap", || async {
        let r = request_as(&server, CI, &capped).await;
        let w = &r["waiting"][0];
        (w["reason"] == "cap").then(|| w["detail"].as_str().unwrap().to_owned())
    })
    .await;
    let r = request_as(&server, CI, &capped).await;
    assert!(
        r["waiting"][0]["detail"]
            .as_str()
            .unwrap()
            .contains("max-nodes 2"),
        "{r}"
    );
    // Another client is held only by the label's cap: two fit (four in
    // all), a third waits for the label.
    let (_, theirs) = ask(OTHER, 2).await;
    let theirs = server.fulfilled(OTHER, &id(&theirs)).await;
    let (_, label_capped) = ask(OTHER, 1).await;
    let label_capped = id(&label_capped);
    until(30, "the label's cap said", || async {
        let r = request_as(&server, OTHER, &label_capped).await;
        let detail = r["waiting"][0]["detail"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        (r["waiting"][0]["reason"] == "cap" && detail.contains("label `small`")).then_some(())
    })
    .await;
    // Never failed for it: still pending well past a boot.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(request_as(&server, CI, &capped).await["state"], "pending");
    assert_eq!(live(&sim.cloud).len(), 4);

    // Given back: each is served.
    let release = |token: &'static str, node: String| {
        let server = &server;
        async move {
            let path = format!("/v1/nodes/{node}/release");
            let (s, r) = server.call("POST", &path, Some(token), None).await;
            assert_eq!(s, 200, "{r}");
        }
    };
    release(CI, first.nodes[0].id.clone()).await;
    server.fulfilled(CI, &capped).await;
    release(OTHER, theirs.nodes[0].id.clone()).await;
    server.fulfilled(OTHER, &label_capped).await;
    server.terminate().await.assert_success();
}

/// `small` keeps one ready, three while a schedule's window is open (it
/// opens 6 s after the test starts, for 8 s, in UTC as the file writes
/// it), and two more than `min-ready` once a request takes its last ready
/// node (`burst-extra`); nodes beyond `min-ready` idle out after 2 s.
/// Through the binary, on the wall clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_window_and_burst_extra_take_effect_at_their_time() {
    let sim = SimServer::start().await;
    let epoch = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    let hms = |t: u64| {
        let s = t % 86_400;
        format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    };
    let now = epoch() as u64;
    let (opens, closes) = (now + 6, now + 14);
    let window = format!(
        "[[labels.small.schedule]]\nfrom = \"{}\"\nto = \"{}\"\nmin-ready = 3\n",
        hms(opens),
        hms(closes)
    );
    let small = "min-ready = 1\nburst-extra = 2\nidle-timeout = \"2s\"";
    let (dir, cfg) = config_for(&sim, small, &window);
    let server = Berth::start(&["--config", &cfg.display().to_string()], dir.path()).await;
    let min_ready = || async {
        let (_, all) = server.call("GET", "/v1/labels", Some(OPS), None).await;
        all[0]["min_ready"].as_u64()
    };
    server.until_label_ready(30, "small", 1, "one ready").await;
    assert!(
        epoch() < opens as f64,
        "the window opened before the test looked"
    );
    assert_eq!(min_ready().await, Some(1));
    server
        .until_label_ready(30, "small", 3, "three ready in the window")
        .await;
    let filled = epoch();
    assert!(
        filled >= opens as f64,
        "three ready {:.1} s before the window",
        opens as f64 - filled
    );
    assert_eq!(min_ready().await, Some(3));
    server
        .until_label_ready(30, "small", 1, "back to one after the window")
        .await;
    let at = epoch();
    assert!(
        at >= closes as f64,
        "one ready {:.1} s before the window closed",
        closes as f64 - at
    );
    println!(
        "three ready {:.1} s after the window opened; one again {:.1} s after it closed \
         (idle-timeout 2 s)",
        filled - opens as f64,
        at - closes as f64
    );
    assert_eq!(min_ready().await, Some(1));

    // A request takes the last ready node: min-ready and two more.
    let r = server.request(CI, &[("small", 1)]).await;
    server.fulfilled(CI, &r.id).await;
    server
        .until_label_ready(30, "small", 3, "min-ready and burst-extra")
        .await;
    server.terminate().await.assert_success();
}
