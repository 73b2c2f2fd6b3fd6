//! `berth serve` end to end: the real binary on 127.0.0.1:0, a sim cloud in
//! this test process, and plain HTTP. Every wait is a bounded poll.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::config::{
    CI, OPS, OTHER, SLOTS, code, database, edit_config, on_postgres, quota_of_two, serve_config,
    serve_config_for, serve_config_on, serve_config_with, set_lease_ttl,
};
use crate::support::disk::{Tmpfs, skip};
use crate::support::postgres::psql;
use crate::support::server::{Berth, Launch, SIGTERM, run_berth, until};
use crate::support::{
    SimServer, create_statuses, creates, instances_and_nodes, live, metric, plugin,
    plugins_dir_and_name, plugins_dir_with, scripted_plugin,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_end_to_end_through_the_binary() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = serve_config(&sim, dir.path());
    let cfg = config.display().to_string();
    let server = Berth::start(&["--config", &cfg], dir.path()).await;

    // Health, readiness (after the first list), the description.
    assert_eq!(server.call("GET", "/healthz", None, None).await.0, 200);
    server.until_ready(30, "ready").await;
    let (s, doc) = server.call("GET", "/openapi.json", None, None).await;
    assert_eq!(s, 200);
    assert!(doc["paths"]["/v1/requests"].is_object());

    // Tokens: none → 401, a wrong one → 401.
    let (s, e) = server.call("GET", "/v1/nodes", None, None).await;
    assert_eq!((s, code(&e)), (401, "unauthorized"));
    let (s, _) = server
        .call("GET", "/v1/nodes", Some("nope-nope-nope-nope"), None)
        .await;
    assert_eq!(s, 401);

    // Bad bodies name the field; unknown labels are 422.
    let bad = [
        (json!({"labels": {"small": 0}}), "labels.small"),
        (json!({"labels": {"small": 1}, "prio": 1}), "prio"),
        (json!({"labels": []}), "labels"),
        (
            json!({"labels": {"small": 1}, "priority": "high"}),
            "priority",
        ),
    ];
    for (body, field) in bad {
        let (s, e) = server
            .call("POST", "/v1/requests", Some(CI), Some(body.clone()))
            .await;
        assert_eq!((s, code(&e)), (400, "bad_request"), "{body}: {e}");
        assert_eq!(e["error"]["field"], field, "{body}: {e}");
    }
    let (s, e) = server
        .call(
            "POST",
            "/v1/requests",
            Some(CI),
            Some(json!({"labels": {"huge": 1}})),
        )
        .await;
    assert_eq!((s, code(&e)), (422, "unknown_label"), "{e}");
    let (s, e) = server
        .call(
            "POST",
            "/v1/requests",
            Some(CI),
            Some(json!({"labels": {"small": 1}, "requestor": "other"})),
        )
        .await;
    assert_eq!((s, code(&e)), (403, "forbidden"), "{e}");

    // Whatever axum answers by itself is the same JSON; parameters are
    // never ignored; filters name what is not configured.
    let errors = [
        (
            "PATCH",
            "/v1/nodes".to_owned(),
            None,
            405,
            "method_not_allowed",
        ),
        (
            "POST",
            "/v1/requests".to_owned(),
            Some(json!({"labels": {"small": 1}, "pad": "x".repeat(3 << 20)})),
            413,
            "too_large",
        ),
        (
            "GET",
            "/v1/labels?verbose=1".to_owned(),
            None,
            400,
            "bad_request",
        ),
        (
            "GET",
            "/v1/nodes?label=huge".to_owned(),
            None,
            422,
            "unknown_label",
        ),
        (
            "GET",
            "/v1/nodes?provider=x".to_owned(),
            None,
            422,
            "unknown_provider",
        ),
    ];
    for (method, path, body, status, want) in errors {
        let (s, e) = server.call(method, &path, Some(OPS), body).await;
        assert_eq!((s, code(&e)), (status, want), "{method} {path}: {e}");
    }

    // Request → fulfilled (long-poll) → release → deleted.
    let r = server.request(CI, &[("small", 1)]).await;
    let id = r.id;
    let r = server.fulfilled(CI, &id).await;
    let node = &r.nodes[0];
    assert!(
        node.addresses.is_some() && node.connection.is_some(),
        "{node:?}"
    );
    let nid = node.id.clone();

    // Another client sees the node but not how to reach it, and cannot
    // release it or read the request.
    let (s, n) = server
        .call("GET", &format!("/v1/nodes/{nid}"), Some(OTHER), None)
        .await;
    assert_eq!(s, 200);
    assert!(
        n.get("addresses").is_none() && n.get("connection").is_none(),
        "{n}"
    );
    assert_eq!(n["requestor"], "ci");
    // Nor may it release the node or read the request; clients may not
    // hold, drain or delete at all (an admin may).
    let node_path = format!("/v1/nodes/{nid}");
    let forbidden = [
        ("POST", format!("{node_path}/release"), OTHER, None),
        ("GET", format!("/v1/requests/{id}"), OTHER, None),
        (
            "PUT",
            format!("{node_path}/idle"),
            CI,
            Some(json!({"idle": "hold"})),
        ),
        ("DELETE", node_path.clone(), CI, None),
    ];
    for (method, path, token, body) in forbidden {
        let (s, e) = server.call(method, &path, Some(token), body).await;
        assert_eq!((s, code(&e)), (403, "forbidden"), "{method} {path}: {e}");
    }
    let (s, e) = server
        .call(
            "PUT",
            &format!("/v1/nodes/{nid}/idle"),
            Some(OPS),
            Some(json!({"idle": "sleep"})),
        )
        .await;
    assert_eq!(
        (s, e["error"]["field"].as_str()),
        (400, Some("idle")),
        "{e}"
    );

    let (s, n) = server
        .call("POST", &format!("/v1/nodes/{nid}/release"), Some(CI), None)
        .await;
    assert_eq!(s, 200, "{n}");
    let (s, e) = server
        .call("POST", &format!("/v1/nodes/{nid}/release"), Some(CI), None)
        .await;
    assert_eq!((s, code(&e)), (409, "conflict"), "released twice: {e}");
    until(20, "the released node to be gone", || async {
        let (_, n) = server
            .call("GET", &format!("/v1/nodes/{nid}"), Some(OPS), None)
            .await;
        (n["state"] == "gone").then_some(())
    })
    .await;

    // Leases: `other` takes a node and stops renewing; after the 3 s TTL
    // its node is taken back. `ci` keeps renewing and keeps its node.
    let (_, theirs) = server
        .call(
            "POST",
            "/v1/requests",
            Some(OTHER),
            Some(json!({"labels": {"small": 1}})),
        )
        .await;
    let (_, mine) = server
        .call(
            "POST",
            "/v1/requests",
            Some(CI),
            Some(json!({"labels": {"small": 1}})),
        )
        .await;
    let theirs = server
        .call(
            "GET",
            &format!("/v1/requests/{}?wait=20s", theirs["id"].as_str().unwrap()),
            Some(OTHER),
            None,
        )
        .await
        .1;
    let mine = server
        .call(
            "GET",
            &format!("/v1/requests/{}?wait=20s", mine["id"].as_str().unwrap()),
            Some(CI),
            None,
        )
        .await
        .1;
    assert_eq!(
        (theirs["state"].as_str(), mine["state"].as_str()),
        (Some("fulfilled"), Some("fulfilled"))
    );
    let their_node = theirs["nodes"][0]["id"].as_str().unwrap().to_owned();
    let my_node = mine["nodes"][0]["id"].as_str().unwrap().to_owned();
    for _ in 0..8 {
        let (s, l) = server.call("POST", "/v1/lease", Some(CI), None).await;
        assert_eq!((s, l["requestor"].as_str()), (200, Some("ci")), "{l}");
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    let (_, n) = server
        .call("GET", &format!("/v1/nodes/{their_node}"), Some(OPS), None)
        .await;
    assert!(
        matches!(n["state"].as_str(), Some("deleting" | "gone")),
        "reclaimed: {n}"
    );
    let (_, n) = server
        .call("GET", &format!("/v1/nodes/{my_node}"), Some(OPS), None)
        .await;
    assert_eq!(n["state"], "in-use", "{n}");

    // Metrics reflect the run.
    let (s, m) = server.call("GET", "/metrics", Some(OPS), None).await;
    assert_eq!(s, 200);
    let m = m.as_str().unwrap().to_owned();
    for needle in [
        "berth_nodes{",
        "berth_driver_calls_total{provider=\"sim\",call=\"create\",outcome=\"ok\"}",
        "berth_request_fulfilment_seconds_count",
        "berth_leases_expired_total 1",
    ] {
        assert!(m.contains(needle), "no `{needle}` in\n{m}");
    }
    // OpenMetrics text, said so and whole.
    assert!(m.ends_with("\n# EOF\n"), "{m}");
    let addr = server.base.strip_prefix("http://").unwrap();
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let ask = format!(
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {OPS}\r\nConnection: close\r\n\r\n"
    );
    s.write_all(ask.as_bytes()).await.unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).await.unwrap();
    let head = answer
        .split("\r\n\r\n")
        .next()
        .unwrap()
        .to_ascii_lowercase();
    assert!(
        head.contains(
            "\r\ncontent-type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\n"
        ),
        "{head}"
    );

    // SIGTERM: a clean stop; a restart adopts every node from the store and
    // the cloud, with no create in between.
    let before: Vec<Value> = server
        .call("GET", "/v1/nodes?state=ready", Some(OPS), None)
        .await
        .1
        .as_array()
        .unwrap()
        .clone();
    let created = creates(&sim.cloud);
    server.terminate().await.assert_success();
    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    server.until_ready(30, "ready again").await;
    let (_, n) = server
        .call("GET", &format!("/v1/nodes/{my_node}"), Some(OPS), None)
        .await;
    assert_eq!(n["state"], "in-use", "kept across the restart: {n}");
    for b in &before {
        let (_, n) = server
            .call(
                "GET",
                &format!("/v1/nodes/{}", b["id"].as_str().unwrap()),
                Some(OPS),
                None,
            )
            .await;
        assert_eq!(
            (n["state"].as_str(), n["instance"].as_str()),
            (Some("ready"), b["instance"].as_str()),
            "{n}"
        );
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = creates(&sim.cloud);
    assert_eq!(after, created, "no create after the restart");
    server.terminate().await.assert_success();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_without_a_config_runs_the_embedded_default() {
    let dir = tempfile::tempdir().unwrap();
    let server = Berth::start(&["--listen", "127.0.0.1:0"], dir.path()).await;
    let (s, labels) = server.call("GET", "/v1/labels", None, None).await;
    assert_eq!(s, 200);
    let names: Vec<&str> = labels
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["small", "large", "shared"]);
    until(60, "two small nodes ready", || async {
        let (_, l) = server.call("GET", "/v1/labels", None, None).await;
        (l[0]["ready"].as_u64() >= Some(2)).then_some(())
    })
    .await;
    let (s, r) = server
        .call(
            "POST",
            "/v1/requests",
            None,
            Some(json!({"labels": {"small": 1, "shared": 2}})),
        )
        .await;
    assert_eq!(s, 201, "{r}");
    let (_, r) = server
        .call(
            "GET",
            &format!("/v1/requests/{}?wait=60s", r["id"].as_str().unwrap()),
            None,
            None,
        )
        .await;
    assert_eq!(r["state"], "fulfilled", "{r}");
    // The two shared nodes are slots of one backing node, which says what it
    // hosts.
    let (_, nodes) = server.call("GET", "/v1/nodes", None, None).await;
    let nodes = nodes.as_array().unwrap();
    let backing: Vec<&str> = nodes
        .iter()
        .filter(|n| n["label"] == "shared")
        .map(|n| n["slot"]["backing"].as_str().expect("a slot node"))
        .collect();
    assert_eq!(backing.len(), 2, "{nodes:?}");
    assert_eq!(backing[0], backing[1]);
    let host = nodes.iter().find(|n| n["id"] == backing[0]).unwrap();
    assert_eq!(
        host["hosting"],
        json!({"label": "shared", "used": 2, "slots": 4}),
        "{host}"
    );
    assert!(
        nodes
            .iter()
            .filter(|n| n["id"] != backing[0])
            .all(|n| n.get("hosting").is_none())
    );
    // The CLI against the same server.
    let base = server.base.clone();
    let cli = |args: &'static [&'static str]| {
        let base = base.clone();
        async move { run_berth(args, &[("BERTH_SERVER", base.as_ref())]).await }
    };
    let out = cli(&["request", "small=1", "--wait=60s"]).await;
    assert_eq!(out.code(), Some(0), "{out}");
    assert!(out.stdout.contains("fulfilled"), "{out}");
    let out = cli(&["nodes", "--state", "in-use"]).await;
    assert_eq!(out.code(), Some(0), "{out}");
    assert!(
        out.stdout.lines().next().unwrap_or("").starts_with("ID"),
        "{out}"
    );
    assert!(
        out.stdout.lines().count() >= 5,
        "3 + 1 in use, and the header: {out}"
    );
    let out = cli(&["nodes"]).await;
    let host_line = out
        .stdout
        .lines()
        .find(|l| l.starts_with(backing[0]))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(host_line.contains("(hosts 2/4 shared)"), "{out}");
    let out = cli(&["release", "n-0000000000000000"]).await;
    assert_eq!(out.code(), Some(1), "an API error exits 1: {out}");
    let (_, d) = server.call("GET", "/v1/drivers", None, None).await;
    assert_eq!(d[0]["file"], "sim", "{d}");
    assert!(dir.path().join("berth-data/berth.db").exists());
    server.terminate().await.assert_success();
}

#[tokio::test]
async fn a_stop_waits_out_its_grace_and_the_next_start_resolves_what_was_in_flight() {
    // Every create takes 8 s: the two prewarm creates are still running when
    // the service is told to stop with a 1 s grace.
    let sim = SimServer::start_with(berth::sim::Knobs {
        create_latency_ms: 8_000,
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = serve_config(&sim, dir.path());
    let cfg = config.display().to_string();
    let server = Berth::launch(Launch {
        json: true,
        ..Launch::new(&["--config", &cfg, "--stop-grace", "1s"], dir.path())
    })
    .await;
    until(30, "two creates under way", || async {
        let (_, nodes) = server.call("GET", "/v1/nodes", Some(OPS), None).await;
        let creating = nodes
            .as_array()?
            .iter()
            .filter(|n| n["state"] == "creating")
            .count();
        (creating == 2).then_some(())
    })
    .await;
    // Counted in flight until they end: one call if they went together as
    // a batch, two if not (and a list may be in flight beside).
    until(10, "the creates counted in flight", || async {
        let m = server.metrics(Some(OPS)).await;
        let n = metric(&m, "berth_driver_calls_in_flight{provider=\"sim\"}")?;
        (n >= 1.0).then_some(())
    })
    .await;
    let stopping = std::time::Instant::now();
    let exited = server.terminate().await;
    exited.assert_success();
    // Not the 8 s the calls take: the grace, then out.
    assert!(
        stopping.elapsed() < Duration::from_secs(6),
        "stopped after {:?}",
        stopping.elapsed()
    );
    // The log is JSON lines, and says what was left.
    let text = exited.log_text();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let said = |m: &str| {
        lines.iter().any(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|s| s.contains(m))
        })
    };
    assert!(said("pool started"), "{text}");
    assert!(said("still running at the end of the stop grace"), "{text}");

    // The next start resolves the two creates: two nodes ready, two
    // instances in the cloud, none twice.
    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    server
        .until_label_ready(60, "small", 2, "two ready nodes")
        .await;
    let live = live(&sim.cloud).len();
    assert_eq!(live, 2);
    server.terminate().await.assert_success();
}

/// A create cut off by SIGKILL after the cloud made its instance and
/// before berth stored the answer, 20 times over. The sim answers a create
/// 1 s after making its instance, and leaves a new instance out of lists and
/// gets for 4 s, as an eventually consistent cloud may. So the restarted
/// berth does not see the instance, tries the create again with the node's
/// create token, and the cloud answers with the instance that token made.
/// Each round then takes the ready node, so that its replacement is the
/// next create cut off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_cut_off_by_sigkill_after_the_cloud_made_them_yield_one_instance_each() {
    const KILLS: usize = 20;
    const WHAT: &str = "the create cut off to be resolved: one ready node";
    let sim = SimServer::start_with(berth::sim::Knobs {
        create_answer_delay_ms: 1_000,
        list_lag_ms: 4_000,
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = serve_config_with(&sim, dir.path(), &plugin("sim"), "min-ready = 1", "");
    set_lease_ttl(&config, "10m");
    let cfg = config.display().to_string();
    for round in 0..KILLS {
        let server = Berth::start(&["--config", &cfg], dir.path()).await;
        if round > 0 {
            server.until_label_ready(60, "small", 1, WHAT).await;
            let request = server.request(CI, &[("small", 1)]).await;
            server.fulfilled(CI, &request.id).await;
        }
        // The cloud has made the instance; berth waits for the answer.
        until(30, "the cloud to make the next instance", || async {
            (sim.cloud.instances().len() > round).then_some(())
        })
        .await;
        server.signal(libc::SIGKILL);
        server.exit_within(Duration::from_secs(30)).await;
    }
    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    server.until_label_ready(60, "small", 1, WHAT).await;

    // The cloud's own record: one instance per node, none twice.
    assert_eq!(
        instances_and_nodes(&sim.cloud),
        (KILLS, KILLS),
        "{:#?}",
        sim.cloud.instances()
    );
    assert_eq!(live(&sim.cloud).len(), KILLS);
    // Each was asked for again after its kill, and the cloud answered with
    // the instance the token had made (200, not 201).
    let found = (create_statuses(&sim.cloud).iter())
        .filter(|(_, status)| *status == 200)
        .count();
    assert_eq!(found, KILLS, "{:?}", create_statuses(&sim.cloud));
    server.terminate().await.assert_success();
}

/// A client cannot renew its lease while berth is down. Its lease (6 s
/// here) expired during a 7 s outage, and the restarted berth gives every
/// lease one full TTL before it takes anything back: the client that renews
/// within it keeps its node, the one that does not loses its node then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_expired_while_berth_was_down_gets_a_full_ttl_to_be_renewed() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = serve_config(&sim, dir.path());
    set_lease_ttl(&config, "6s");
    let cfg = config.display().to_string();
    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    let mut held = Vec::new();
    for token in [CI, OTHER] {
        let request = server.request(token, &[("small", 1)]).await;
        held.push(
            server.fulfilled(token, &request.id).await.nodes[0]
                .id
                .clone(),
        );
    }
    server.signal(libc::SIGKILL);
    server.exit_within(Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_secs(7)).await;

    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    server.until_ready(30, "ready again").await;
    let state = |id: String| {
        let server = &server;
        async move {
            let path = format!("/v1/nodes/{id}");
            let (_, n) = server.call("GET", &path, Some(OPS), None).await;
            n["state"].as_str().unwrap_or_default().to_owned()
        }
    };
    for id in &held {
        assert_eq!(state(id.clone()).await, "in-use", "{}", server.log_text());
    }
    let (s, _) = server.call("POST", "/v1/lease", Some(CI), None).await;
    assert_eq!(s, 200);
    until(30, "the silent client's node taken back", || async {
        (state(held[1].clone()).await != "in-use").then_some(())
    })
    .await;
    assert_eq!(state(held[0].clone()).await, "in-use");
    server.terminate().await.assert_success();
}

/// libfaketime's preload library, which `scripts/setup tests` installs.
fn libfaketime() -> std::path::PathBuf {
    let found = std::fs::read_dir("/usr/lib").ok().and_then(|dirs| {
        dirs.flatten()
            .map(|d| d.path().join("faketime/libfaketime.so.1"))
            .find(|p| p.exists())
    });
    found.expect("libfaketime is missing: run scripts/setup tests")
}

/// Regression: requestor leases are stored as wall-clock deadlines, and a
/// restart kept a stored one that was later than its TTL from then. A
/// client renewed while berth's clock was an hour ahead (libfaketime), then
/// berth restarted with the right clock and the client stayed silent: its
/// nodes stayed held for the hour (the lease TTL being seconds). Now a
/// restart gives every lease exactly its TTL from then, and the silent
/// client's nodes come back within it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_renewed_under_a_clock_set_ahead_ends_within_its_ttl_after_a_restart() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = serve_config(&sim, dir.path());
    set_lease_ttl(&config, "4s");
    let cfg = config.display().to_string();
    let preload = libfaketime().display().to_string();
    let ahead = [
        ("LD_PRELOAD", preload.as_str()),
        ("FAKETIME", "+1h"),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ];
    let server = Berth::launch(Launch {
        env: &ahead,
        ..Launch::new(&["--config", &cfg], dir.path())
    })
    .await;
    server.until_ready(30, "ready, an hour ahead").await;
    let request = server.request(CI, &[("small", 2)]).await;
    let held: Vec<String> = (server.fulfilled(CI, &request.id).await.nodes)
        .iter()
        .map(|n| n.id.clone())
        .collect();
    let (_, n) = server
        .call("GET", &format!("/v1/nodes/{}", held[0]), Some(OPS), None)
        .await;
    let since = n["since"].as_str().unwrap_or_default().to_owned();
    server.terminate().await.assert_success();

    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    let restarted = std::time::Instant::now();
    let taken_back = |id: String| {
        let server = &server;
        async move {
            let path = format!("/v1/nodes/{id}");
            let (_, n) = server.call("GET", &path, Some(OPS), None).await;
            n["state"] != "in-use"
        }
    };
    until(20, "the silent client's nodes taken back", || async {
        for id in &held {
            if !taken_back(id.clone()).await {
                return None;
            }
        }
        Some(())
    })
    .await;
    eprintln!(
        "handed out at {since} (an hour ahead); taken back {:.1}s after the restart, lease-ttl 4s",
        restarted.elapsed().as_secs_f64()
    );
    server.terminate().await.assert_success();
}

/// Regression: a graceful stop sometimes exited non-zero. Signals were only
/// handled once the API listened, so a SIGTERM that came earlier (in CI, one
/// sent the moment the API answered, before the main thread had reached the
/// line that registered the handler) met the default action and killed
/// berth. A stop asked for at any moment of the start is a clean stop: here,
/// while a Python driver compiles, which takes seconds (and which berth once
/// did before it listened). The stop does not wait for the compile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_while_a_driver_compiles_is_a_clean_stop() {
    let wasm = tokio::task::spawn_blocking(|| scripted_plugin("python-example"))
        .await
        .unwrap();
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = serve_config_on(&sim, dir.path(), &wasm);
    let cfg = config.display().to_string();
    let starting = Berth::spawn(Launch::new(&["--config", &cfg], dir.path()));
    starting.log_says("loading a driver", 60).await;
    starting.signal(SIGTERM);
    let exited = starting.exit_within(Duration::from_secs(60)).await;
    exited.assert_success();
    let log = exited.log_text();
    assert!(log.contains("stopped"), "{log}");
    // It did not wait for the compile to end.
    assert!(!log.contains("driver loaded"), "{log}");
}

/// A store that cannot be written (here a full file system) stops the pool
/// at once: the change that could not be stored is answered
/// `503 store_unwritable`, the log says why at ERROR, and berth exits with
/// code 3 so that a supervisor restarts it, instead of staying up as a
/// service that refuses everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_cannot_be_written_ends_berth_with_code_3() {
    if on_postgres() {
        return skip(
            "a_store_that_cannot_be_written_ends_berth_with_code_3",
            "the store is on PostgreSQL, not on this disk",
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = match Tmpfs::mount(&dir.path().join("state"), "8m") {
        Ok(disk) => disk,
        Err(why) => {
            return skip(
                "a_store_that_cannot_be_written_ends_berth_with_code_3",
                &why,
            );
        }
    };
    let sim = SimServer::start().await;
    let config = serve_config(&sim, dir.path());
    let cfg = config.display().to_string();
    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    server
        .until_label_ready(30, "small", 2, "two ready nodes")
        .await;
    disk.fill();
    // Each request adds rows; soon one cannot be stored.
    let refused = until(60, "a request the store cannot take", || async {
        let answer = server
            .try_call(
                "POST",
                "/v1/requests",
                Some(CI),
                Some(json!({"labels": {"small": 1}})),
            )
            .await;
        match answer {
            Ok((201, _)) => None,
            Ok((status, e)) => Some(Ok((status, e))),
            Err(e) => Some(Err(e.to_string())),
        }
    })
    .await;
    let (status, e) = refused.unwrap_or_else(|e| {
        panic!(
            "berth went away without answering: {e}\n{}",
            crate::support::server::tail(&server.log)
        )
    });
    assert_eq!((status, code(&e)), (503, "store_unwritable"), "{e}");
    let exited = server.exit_within(Duration::from_secs(60)).await;
    exited.assert_code(3);
    let log = exited.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("ERROR") && l.contains("the store could not be written")),
        "{log}"
    );
    drop(disk);
}

/// Started on a state directory it cannot write, berth does not come up
/// "healthy" to refuse every change: it ends at once with code 3 and names
/// the directory.
#[tokio::test]
async fn a_read_only_state_directory_ends_the_start_with_code_3() {
    if on_postgres() {
        return skip(
            "a_read_only_state_directory_ends_the_start_with_code_3",
            "the store is on PostgreSQL, not on this disk",
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = match Tmpfs::mount(&dir.path().join("state"), "8m") {
        Ok(disk) => disk,
        Err(why) => {
            return skip(
                "a_read_only_state_directory_ends_the_start_with_code_3",
                &why,
            );
        }
    };
    disk.read_only();
    let sim = SimServer::start().await;
    let config = serve_config(&sim, dir.path());
    let cfg = config.display().to_string();
    let exited = Berth::spawn(Launch::new(&["--config", &cfg], dir.path()))
        .exit_within(Duration::from_secs(60))
        .await;
    exited.assert_code(3);
    let log = exited.log_text();
    let state = dir.path().join("state").display().to_string();
    assert!(
        log.lines()
            .any(|l| l.contains(&state) && l.contains("cannot be written")),
        "{log}"
    );
    drop(disk);
}

/// A config berth cannot use ends the start with code 2 and says why.
#[tokio::test]
async fn a_config_it_cannot_use_ends_berth_with_code_2() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("berth.toml");
    std::fs::write(&cfg, "pool-id = \"x\"\nsync-interval = \"soon\"\n").unwrap();
    let cfg = cfg.display().to_string();
    let exited = Berth::spawn(Launch::new(&["--config", &cfg], dir.path()))
        .exit_within(Duration::from_secs(60))
        .await;
    exited.assert_code(2);
    let log = exited.log_text();
    assert!(log.contains("sync-interval"), "{log}");
}

/// The sim's answers with `status` to creates (alone or in a batch), by
/// when it answered them.
fn refused_creates(sim: &SimServer, status: u16) -> Vec<u64> {
    let all = crate::support::create_statuses(&sim.cloud).into_iter();
    all.filter(|(_, s)| *s == status)
        .map(|(at, _)| at)
        .collect()
}

/// Refusals grouped into bursts: the creates that were on their way
/// together (less than 500 ms apart); when each burst began.
fn bursts(refusals: &[u64]) -> Vec<u64> {
    let mut starts: Vec<u64> = Vec::new();
    for (i, &at) in refusals.iter().enumerate() {
        if i == 0 || at - refusals[i - 1] >= 500 {
            starts.push(at);
        }
    }
    starts
}

#[tokio::test]
async fn the_binary_sends_no_create_while_a_quota_pause_lasts() {
    // One instance allowed and three wanted: every create past the first is
    // refused for quota, and each refusal pauses creates for 2 s.
    let sim = SimServer::start_with(berth::sim::Knobs {
        quota: Some(1),
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = serve_config_with(&sim, dir.path(), &plugin("sim"), "min-ready = 3", "");
    let text = std::fs::read_to_string(&config).unwrap();
    let text = text.replace(
        "leak-grace = \"1s\"",
        "leak-grace = \"1s\"\nquota-pause = \"2s\"",
    );
    std::fs::write(&config, text).unwrap();
    let cfg = config.display().to_string();
    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    let refusals = until(30, "three bursts of quota refusals", || async {
        let refusals = refused_creates(&sim, 403);
        (bursts(&refusals).len() >= 3).then_some(refusals)
    })
    .await;
    server.terminate().await.assert_success();
    // Each burst comes when the pause set by the one before is over, as the
    // sim's own record shows; a retry on the ordinary backoff (1 s) would
    // come inside it.
    let starts = bursts(&refusals);
    for w in starts.windows(2) {
        assert!(w[1] - w[0] >= 2_000, "bursts at {starts:?}: {refusals:?}");
    }
}

/// `berth serve` compiles its driver into the cache `BERTH_CACHE_DIR`
/// names, and `berth driver test` then loads that very entry: one cache for
/// the service and the kit.
#[tokio::test]
async fn serve_and_the_kit_share_one_compiled_cache() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("shared-cache");
    let cache_text = cache.to_string_lossy().into_owned();
    let cfg = serve_config(&sim, dir.path());
    let cfg_text = cfg.to_string_lossy().into_owned();
    let args = ["--config", cfg_text.as_str()];
    let env = [("BERTH_CACHE_DIR", cache_text.as_str())];
    let mut launch = Launch::new(&args, dir.path());
    launch.env = &env;
    let server = Berth::launch(launch).await;
    until(60, "the driver loaded", || async {
        server.log_text().contains("driver loaded").then_some(())
    })
    .await;
    assert!(
        server.log_text().contains("source=Compiled"),
        "{}",
        server.log_text()
    );
    server.terminate().await.assert_success();
    assert!(
        std::fs::read_dir(&cache).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with(".cwasm")),
        "serve wrote nothing into {}",
        cache.display()
    );

    let config = sim.provider_json(dir.path(), None);
    let wasm = plugin("sim");
    let test = run_berth(
        [
            std::ffi::OsStr::new("driver"),
            "test".as_ref(),
            wasm.as_ref(),
            "--config".as_ref(),
            config.as_ref(),
        ],
        &[("BERTH_CACHE_DIR", cache.as_os_str())],
    )
    .await;
    assert!(test.success(), "{test}");
    assert!(
        test.stdout.contains("loaded from the compiled cache"),
        "{test}"
    );
}

/// The nodes as an admin sees them, each by what its store row holds:
/// label, state, instance, holder, and its packing (a slot on a backing
/// machine, or the machine backing slots).
async fn nodes_as_stored(server: &Berth) -> Vec<String> {
    let (s, nodes) = server.call("GET", "/v1/nodes", Some(OPS), None).await;
    assert_eq!(s, 200, "{nodes}");
    let mut seen: Vec<String> = (nodes.as_array().expect("nodes").iter())
        .map(|n| {
            let keys = [
                "id", "label", "state", "instance", "request", "slot", "hosting",
            ];
            keys.map(|k| format!("{k}={}", n[k])).join(" ")
        })
        .collect();
    seen.sort();
    seen
}

/// Undoes schema step 5 (SQLite) or 9 (PostgreSQL): the packing column's
/// old name.
const UNDO_PACKING: &str = "ALTER TABLE nodes RENAME COLUMN packing TO role;";

/// Undoes schema step 7 (SQLite) or 12 (PostgreSQL), on the requests:
/// their idempotency key and metadata.
const UNDO_KEY_METADATA: &str = "ALTER TABLE requests DROP COLUMN idempotency_key; \
                                 ALTER TABLE requests DROP COLUMN metadata;";

/// Undoes schema step 6 (SQLite) or 10 (PostgreSQL): the failure columns.
const UNDO_FAILURE_COLUMNS: &str =
    "ALTER TABLE nodes DROP COLUMN failure; ALTER TABLE requests DROP COLUMN last_failure;";

/// A store from before a node's packing had the core's own word as its
/// column (`role`: SQLite schema 4, PostgreSQL schema 8) opens in `berth
/// serve`: its migration steps rename the column and add the failure
/// columns (SQLite step 6, PostgreSQL step 10), and the pool is as it was,
/// a slot still in use on its backing machine and a plain node ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_from_before_the_packing_column_opens_with_its_nodes_as_they_were() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (url, store) = if on_postgres() {
        let (url, store) = database(dir.path(), None);
        (Some(url), store)
    } else {
        (None, String::new())
    };
    let extra = format!("{SLOTS}{store}");
    let cfg = serve_config_with(&sim, dir.path(), &plugin("sim"), "min-ready = 1", &extra);
    let cfg = cfg.display().to_string();
    set_lease_ttl(Path::new(&cfg), "10m");
    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    server.until_ready(30, "ready").await;
    let r = server.request(CI, &[("slot", 1)]).await;
    let slot = server.fulfilled(CI, &r.id).await.nodes[0].id.clone();
    until(30, "a small node ready", || async {
        let nodes = nodes_as_stored(&server).await;
        (nodes.iter())
            .any(|n| n.contains("label=\"small\"") && n.contains("state=\"ready\""))
            .then_some(())
    })
    .await;
    let before = nodes_as_stored(&server).await;
    server.terminate().await.assert_success();
    assert!(
        before
            .iter()
            .any(|n| n.contains(&slot) && n.contains("backing")),
        "{before:#?}"
    );

    // Set back to the schema before the rename: the column's old name, no
    // failure columns (the step after it), and the version before both. (A
    // step added later is undone here too.)
    match &url {
        Some(url) => {
            let version = psql(url, "SELECT version FROM berth_schema").unwrap();
            assert_eq!(
                version.trim(),
                "12",
                "a step after the requests' key and metadata: undo it here too"
            );
            // PostgreSQL's step 12: the requests' key and metadata, in the
            // inbox too; step 11: the members' config and its heartbeat.
            let undo_inbox = "ALTER TABLE request_inbox DROP COLUMN idempotency_key; \
                              ALTER TABLE request_inbox DROP COLUMN metadata;";
            let undo_members = "DROP FUNCTION berth_beat; ALTER TABLE members DROP COLUMN config;";
            psql(
                url,
                &format!(
                    "{UNDO_KEY_METADATA} {undo_inbox} {undo_members} {UNDO_FAILURE_COLUMNS} \
                     {UNDO_PACKING} UPDATE berth_schema SET version = 8"
                ),
            )
            .unwrap();
        }
        None => {
            let db = rusqlite::Connection::open(dir.path().join("state/berth.db")).unwrap();
            let version: u32 = db
                .pragma_query_value(None, "user_version", |r| r.get(0))
                .unwrap();
            assert_eq!(
                version, 7,
                "a step after the requests' key and metadata: undo it here too"
            );
            db.execute_batch(&format!(
                "{UNDO_KEY_METADATA} {UNDO_FAILURE_COLUMNS} {UNDO_PACKING} \
                 PRAGMA user_version = 4;"
            ))
            .unwrap();
        }
    }

    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    server.until_ready(30, "ready on the older store").await;
    assert_eq!(nodes_as_stored(&server).await, before);
    // The slot is still its holder's to give back.
    let (s, answer) = server
        .call("POST", &format!("/v1/nodes/{slot}/release"), Some(CI), None)
        .await;
    assert_eq!(s, 200, "{answer}");
    server.terminate().await.assert_success();
    // Each node has its packing back, and no failure: none failed a try.
    let column = "SELECT count(*) FROM nodes WHERE packing IS NOT NULL AND failure IS NULL";
    let rows = match &url {
        Some(url) => psql(url, column).unwrap().trim().parse::<usize>().unwrap(),
        None => rusqlite::Connection::open(dir.path().join("state/berth.db"))
            .unwrap()
            .query_row(column, [], |r| r.get(0))
            .unwrap(),
    };
    assert!(rows >= 2, "{rows} nodes with a packing");
}

/// A driver built against contract 0.1 and one built against 0.2 serve one
/// pool side by side in one `berth serve`: each on a cloud of its own, a
/// request served by both at once, and each one's nodes deleted again.
/// `/v1/drivers` names the contract each speaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_01_driver_and_a_02_driver_serve_one_pool_side_by_side() {
    let new_cloud = SimServer::start().await;
    let old_cloud = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    // Built in different directories: both in one plugins directory.
    let plugins = plugins_dir_with(
        &dir.path().join("plugins"),
        &[&plugin("sim"), &plugin("sim-0.1")],
    );
    let (_, old) = plugins_dir_and_name(&plugin("sim-0.1"));
    let extra = format!(
        "[providers.sim.limits]\nmax-instances = 2\n\
         [providers.old]\ndriver = {old:?}\nallow-hosts = [\"{}\"]\n\
         config = {{ endpoint = \"{}\" }}\n\
         [providers.old.limits]\nmax-instances = 2\n\
         [labels.small.providers.old]\ninstance-type = \"small\"\nimage = \"img\"\n\
         vcpus = 1\nram = \"1GiB\"\nprice = 0.1\n",
        old_cloud.addr(),
        old_cloud.url(),
    );
    let (_, sim) = plugins_dir_and_name(&plugin("sim"));
    let config = serve_config_with(&new_cloud, dir.path(), &plugins.join(sim), "", &extra);
    let cfg = config.display().to_string();
    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    server.until_ready(30, "ready").await;

    let drivers = server.client(OPS).drivers().await.unwrap();
    let contract_of = |file: &str| {
        let d = drivers.iter().find(|d| d.file == file);
        d.map(|d| d.contract.clone()).unwrap_or_default()
    };
    assert_eq!(contract_of("berth_driver_sim"), "0.2.0", "{drivers:?}");
    assert_eq!(contract_of("berth_driver_sim_0_1"), "0.1.0", "{drivers:?}");

    // Four nodes, two limits of two: both providers serve the request.
    let asked = server.request(CI, &[("small", 4)]).await;
    let served = server.fulfilled(CI, &asked.id).await;
    let mut by_provider: Vec<&str> = served.nodes.iter().map(|n| n.provider.as_str()).collect();
    by_provider.sort();
    assert_eq!(by_provider, ["old", "old", "sim", "sim"], "{served:?}");
    assert_eq!(live(&new_cloud.cloud).len(), 2);
    assert_eq!(live(&old_cloud.cloud).len(), 2);

    for node in &served.nodes {
        server.client(CI).release(&node.id).await.unwrap();
    }
    until(30, "both clouds empty", || async {
        (live(&new_cloud.cloud).is_empty() && live(&old_cloud.cloud).is_empty()).then_some(())
    })
    .await;
}

/// An instance the cloud reports failed is deleted and replaced at once,
/// through the binary: with `boot-timeout` at ten minutes, the request is
/// served within seconds of the cloud giving up on its first instance, and
/// berth deletes that instance. The cloud's reason shows on the failed node
/// (`failure`) and on the request (`last_failure`), across a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_the_cloud_reports_failed_is_replaced_at_once() {
    let sim = SimServer::start_with(berth::sim::Knobs {
        boot_delay_ms: 1000,
        boot_failure_rate: 1.0,
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = serve_config_with(
        &sim,
        dir.path(),
        &plugin("sim"),
        "boot-timeout = \"10m\"\nlaunch-retries = 3",
        "",
    );
    // The request waits out a failed launch try: its requestor's lease
    // must outlast that without renewals.
    set_lease_ttl(&config, "60s");
    let cfg = config.display().to_string();
    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    server.until_ready(30, "ready").await;
    let asked = server.request(CI, &[("small", 1)]).await;

    // The cloud decides at its create whether an instance's boot fails:
    // the first one will, once its boot delay has passed. Instances made
    // from now on boot, so the replacement serves the request. (Turned off
    // as soon as the first instance exists, not once it failed: berth
    // replaces it at once, and a replacement made before the knob turns
    // fails too.)
    let failed = until(30, "the first instance", || async {
        sim.cloud.instances().into_iter().next().map(|i| i.id)
    })
    .await;
    sim.cloud
        .set_knobs(berth::sim::Knobs {
            boot_failure_rate: 0.0,
            ..sim.cloud.knobs()
        })
        .unwrap();
    let served = server.fulfilled(CI, &asked.id).await;
    assert_ne!(served.nodes[0].instance.as_deref(), Some(failed.as_str()));
    let nodes = server.client(OPS).nodes(&Default::default()).await.unwrap();
    let old = nodes
        .iter()
        .find(|n| n.instance.as_deref() == Some(failed.as_str()))
        .unwrap_or_else(|| panic!("no node of {failed} in {nodes:?}"));
    assert!(matches!(old.state.as_str(), "deleting" | "gone"), "{old:?}");
    // Deleted by berth, not waited out.
    until(30, "the failed instance deleted", || async {
        let gone = (sim.cloud.instances().into_iter())
            .find(|i| i.id == failed)
            .is_none_or(|i| i.state == berth::sim::InstanceState::Terminated);
        gone.then_some(())
    })
    .await;
    let old = server.client(OPS).node(&old.id).await.unwrap();
    assert_eq!(
        (old.state.as_str(), old.reason.as_deref()),
        ("gone", Some("deleted")),
        "{old:?}"
    );

    // Why: the cloud's reason on the failed node, and that try, naming the
    // node and its provider, on the request; stored, so a restart shows
    // them too.
    let fault = berth::sim::BOOT_FAULT;
    let said = format!("the cloud reports instance {failed} failed: {fault}");
    failure_shown(&server, &old.id, &asked.id, &said).await;
    // The published document describes both.
    let (_, doc) = server.call("GET", "/openapi.json", None, None).await;
    for (schema, field) in [("Node", "failure"), ("Request", "last_failure")] {
        let property = &doc["components"]["schemas"][schema]["properties"][field];
        assert!(property.is_object(), "{schema}.{field} is not documented");
    }
    server.terminate().await.assert_success();
    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    server.until_ready(30, "ready again").await;
    failure_shown(&server, &old.id, &asked.id, &said).await;
    server.terminate().await.assert_success();
}

/// Node `node` shows `said` as its failure, and request `request` its
/// last failed try as its last failure, naming the node and provider
/// `sim`: that is `node`'s, unless a replacement made before the sim's
/// knob turned (on a busy machine) failed after it, the same way. The
/// request's node that served it has none.
async fn failure_shown(server: &Berth, node: &str, request: &str, said: &str) {
    let failure = |id: String| async move {
        let (s, n) = server
            .call("GET", &format!("/v1/nodes/{id}"), Some(OPS), None)
            .await;
        assert_eq!(s, 200, "{n}");
        n["failure"].as_str().map(str::to_owned)
    };
    assert_eq!(failure(node.to_owned()).await.as_deref(), Some(said));
    let (s, r) = server
        .call("GET", &format!("/v1/requests/{request}"), Some(CI), None)
        .await;
    assert_eq!(s, 200, "{r}");
    let last = r["last_failure"].as_str().unwrap_or_default();
    let (named, why) = (last.strip_prefix("node "))
        .and_then(|l| l.split_once(" on provider `sim`: "))
        .unwrap_or_else(|| panic!("no last failure naming a node on `sim`: {r}"));
    if named == node {
        assert_eq!(why, said, "{r}");
    } else {
        assert_eq!(failure(named.to_owned()).await.as_deref(), Some(why));
        assert!(why.ends_with(berth::sim::BOOT_FAULT), "{r}");
    }
    assert_eq!(r["nodes"][0].get("failure"), None, "{r}");
}

/// Creates and deletes due together reach the cloud in batches through the
/// binary, the sim driver declaring `create-many` and `delete-many`: a
/// request for six nodes is one batch create, and six nodes released
/// together, while the provider's rate limit (two calls a second) holds
/// them, are deleted in fewer calls than six, by the cloud's own record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_due_together_reach_the_cloud_in_batches() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = serve_config_with(&sim, dir.path(), &plugin("sim"), "", "");
    let server = start_batching(&config, dir.path()).await;
    let asked = server.request(CI, &[("small", 6)]).await;
    let served = server.fulfilled(CI, &asked.id).await;
    let posts = |path: &str| -> Vec<berth::sim::Call> {
        (sim.cloud.calls().into_iter())
            .filter(|c| c.method == "POST" && c.path == path)
            .collect()
    };
    let batches = posts("/v1/batch/create");
    assert_eq!(posts("/v1/instances").len(), 0, "no create alone");
    assert_eq!(batches.len(), 1, "{batches:?}");
    assert_eq!(batches[0].items.len(), 6, "{batches:?}");
    assert!(batches[0].items.iter().all(|i| i.status == 201));

    release_together(&server, &served).await;
    until(30, "every instance deleted", || async {
        let deleted = crate::support::deletes(&sim.cloud);
        (deleted.iter().filter(|(_, s)| *s == 204).count() == 6).then_some(())
    })
    .await;
    let calls = sim.cloud.calls();
    let alone = (calls.iter()).filter(|c| c.method == "DELETE").count();
    let batched = posts("/v1/batch/delete");
    eprintln!(
        "six deletes: {alone} alone, {} in {} batches",
        batched.iter().map(|c| c.items.len()).sum::<usize>(),
        batched.len()
    );
    assert!(!batched.is_empty(), "no batch delete: {calls:?}");
    assert!(alone + batched.len() < 6, "{calls:?}");
    assert_eq!(crate::support::deletes(&sim.cloud).len(), 6, "{calls:?}");
    // The driver's calls as berth counts them.
    let metrics = server.metrics(Some(OPS)).await;
    let series = "berth_driver_calls_total{provider=\"sim\",call=\"create-many\",outcome=\"ok\"}";
    assert_eq!(metric(&metrics, series), Some(1.0), "{metrics}");
}

/// `berth serve` on `config`, its provider held to 2 calls a second (a
/// burst of 1), so that calls due together wait for the rate and go as a
/// batch; leases of 60 s. Waits until it is ready.
async fn start_batching(config: &Path, dir: &Path) -> Berth {
    let limited = "[providers.sim]\nrate = 2\nburst = 1\n";
    edit_config(config, "[providers.sim]\n", limited);
    set_lease_ttl(config, "60s");
    let cfg = config.display().to_string();
    let server = Berth::start(&["--config", &cfg], dir).await;
    server.until_ready(30, "ready").await;
    server
}

/// Releases every node of `served` (a request of `CI`'s) at once.
async fn release_together(server: &Berth, served: &berth::client::types::Request) {
    let mut released = tokio::task::JoinSet::new();
    for n in &served.nodes {
        let client = server.client(CI);
        let id = n.id.clone();
        released.spawn(async move { client.release(&id).await });
    }
    for r in released.join_all().await {
        r.expect("release");
    }
}

/// A driver whose batches answer one result fewer than they were given
/// (the careless fixture, `short-batches`; it does every item). Which
/// answer is whose cannot be told, so berth believes none of them: the
/// creates wait for a list, which shows every instance made, and none is
/// asked for twice; the deletes are settled by the lists too, and no node
/// is left waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_answered_short_make_no_second_instance_and_leave_no_node_waiting() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let keys = format!(
        "allow-hosts = [\"{}\"]\nconfig = {{ endpoint = \"{}\", mistake = \"short-batches\" }}",
        sim.addr(),
        sim.url()
    );
    let config = serve_config_for(dir.path(), &plugin("careless"), &keys, "", "");
    let server = start_batching(&config, dir.path()).await;
    let asked = server.request(CI, &[("small", 4)]).await;
    let served = server.fulfilled(CI, &asked.id).await;
    // The cloud's own record: four creates, four instances, one per node.
    assert_eq!(creates(&sim.cloud), 4, "{:?}", sim.cloud.calls());
    assert_eq!(instances_and_nodes(&sim.cloud), (4, 4));
    let metrics = server.metrics(Some(OPS)).await;
    let series = "berth_driver_calls_total{provider=\"sim\",call=\"create-many\",outcome=\"ok\"}";
    assert_eq!(metric(&metrics, series), Some(1.0), "one batch: {metrics}");

    release_together(&server, &served).await;
    for n in &served.nodes {
        let path = format!("/v1/nodes/{}", n.id);
        until(60, "each released node gone", || async {
            let (_, node) = server.call("GET", &path, Some(OPS), None).await;
            (node["state"] == "gone").then_some(())
        })
        .await;
    }
    assert!(live(&sim.cloud).is_empty(), "{:?}", live(&sim.cloud));
    let metrics = server.metrics(Some(OPS)).await;
    let series = "berth_driver_calls_total{provider=\"sim\",call=\"delete-many\",outcome=\"ok\"}";
    assert!(
        metric(&metrics, series).is_some(),
        "a batch delete: {metrics}"
    );
    server.terminate().await.assert_success();
}

/// Booting nodes are polled by id through the binary: with `sync-interval`
/// at a minute and a 3 s boot polled every 100 ms, the driver is asked for
/// the booting instances by `get`, again and again, while whole lists stay
/// the few of start-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn booting_nodes_are_polled_by_get_not_by_lists() {
    let sim = SimServer::start_with(berth::sim::Knobs {
        boot_delay_ms: 3000,
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = serve_config_with(&sim, dir.path(), &plugin("sim"), "", "");
    edit_config(&config, "sync-interval = \"1s\"", "sync-interval = \"60s\"");
    set_lease_ttl(&config, "60s");
    let cfg = config.display().to_string();
    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    server.until_ready(30, "ready").await;
    let calls = |m: &str, call: &str| {
        let series =
            format!("berth_driver_calls_total{{provider=\"sim\",call=\"{call}\",outcome=\"ok\"}}");
        metric(m, &series).unwrap_or(0.0)
    };
    let before = server.metrics(Some(OPS)).await;
    let asked = server.request(CI, &[("small", 3)]).await;
    server.fulfilled(CI, &asked.id).await;
    let after = server.metrics(Some(OPS)).await;
    let lists = calls(&after, "list") - calls(&before, "list");
    let gets = calls(&after, "get") - calls(&before, "get");
    eprintln!("{gets} gets, {lists} lists while three nodes booted");
    assert!(
        gets >= 5.0,
        "{gets} gets, {lists} lists while three nodes booted"
    );
    assert!(
        lists <= 1.0,
        "{gets} gets, {lists} lists while three nodes booted"
    );
}

/// A request stalled on the cloud's quota says why it waits, through the
/// binary: `GET /v1/requests/{id}` names the reason, the provider and when
/// the pause ends (with the two nodes set aside from the ready ones
/// waiting for the third), and `berth requests` and `berth request
/// --wait` print it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_stalled_on_the_clouds_quota_says_why_it_waits() {
    let dir = tempfile::tempdir().unwrap();
    let (_sim, config) = quota_of_two(dir.path()).await;
    let cfg = config.display().to_string();
    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    server.until_label_ready(60, "small", 2, "two ready").await;
    let (status, mut providers) =
        crate::events::Stream::open(&server.base, CI, "?kinds=provider", None).await;
    assert_eq!(status, 200);
    let r = server.request(CI, &[("small", 3)]).await;
    // The pause comes on the event stream too, to every caller.
    let paused = providers
        .until("a provider event with the quota pause", |e| {
            e.iter().any(|e| e.data["quota_paused_until"].is_string())
        })
        .await;
    let paused = paused.last().unwrap();
    assert_eq!(
        (paused.event.as_str(), &paused.data["provider"]),
        ("provider", &Value::from("sim"))
    );
    let path = format!("/v1/requests/{}", r.id);
    let waiting = until(30, "the request waits for the quota", || async {
        let (_, body) = server.call("GET", &path, Some(CI), None).await;
        let waiting = body["waiting"].as_array()?.clone();
        waiting
            .iter()
            .any(|w| w["reason"] == "quota")
            .then_some(waiting)
    })
    .await;
    let quota: Vec<&Value> = waiting.iter().filter(|w| w["reason"] == "quota").collect();
    assert_eq!(quota.len(), 1, "{waiting:#?}");
    let q = quota[0];
    assert_eq!(
        (q["label"].as_str(), q["provider"].as_str()),
        (Some("small"), Some("sim"))
    );
    assert_eq!(q["nodes"], 1, "{q}");
    let until_ms = berth::duration::parse_rfc3339(q["until"].as_str().unwrap()).unwrap();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(until_ms > now_ms + 3_000_000, "an hour's pause: {q}");
    assert!(
        (q["detail"].as_str().unwrap())
            .contains("provider `sim`'s cloud said its quota is exhausted"),
        "{q}"
    );
    let others = waiting.iter().filter(|w| w["reason"] == "others").count();
    assert_eq!(
        others, 2,
        "the two ready nodes wait for the third: {waiting:#?}"
    );

    // The CLI says the same.
    let base = server.base.clone();
    let ran = run_berth(["requests", "--server", &base, "--token", CI], &[]).await;
    assert!(ran.success(), "{ran}");
    assert!(ran.stdout.contains("waits: "), "{ran}");
    let ran = run_berth(
        [
            "request", "small", "--wait", "1s", "--server", &base, "--token", CI,
        ],
        &[],
    )
    .await;
    assert!(!ran.success(), "{ran}");
    assert!(
        ran.stdout
            .contains("waits: 1 × small: provider `sim`'s cloud said its quota is exhausted"),
        "{ran}"
    );
    println!(
        "berth request small --wait 1s, on the quota:\n{}",
        ran.stdout
    );
    server.terminate().await.assert_success();
}

/// `berth serve` tells systemd how it is doing, on the socket the test
/// gives it as `NOTIFY_SOCKET` (as systemd does for `Type=notify`):
/// `READY=1` once it listens, with the address; `WATCHDOG=1` every half of
/// `WATCHDOG_USEC`; `STOPPING=1` when told to stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_notifies_readiness_its_watchdog_and_its_stop_on_the_notify_socket() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = serve_config(&sim, dir.path()).display().to_string();
    let path = dir.path().join("notify.sock");
    let socket = tokio::net::UnixDatagram::bind(&path).unwrap();
    let notify = path.display().to_string();
    let args = ["--config", cfg.as_str()];
    let env = [
        ("NOTIFY_SOCKET", notify.as_str()),
        ("WATCHDOG_USEC", "200000"),
    ];
    let server = Berth::launch(Launch {
        env: &env,
        ..Launch::new(&args, dir.path())
    })
    .await;
    let mut said: Vec<String> = Vec::new();
    let mut hear = async |until: &dyn Fn(&[String]) -> bool| {
        let end = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut buf = vec![0u8; 4096];
        while !until(&said) {
            let n = tokio::time::timeout_at(end, socket.recv(&mut buf))
                .await
                .unwrap_or_else(|_| panic!("not said within 10 s: {said:?}"))
                .unwrap();
            said.extend(
                String::from_utf8_lossy(&buf[..n])
                    .lines()
                    .map(str::to_owned),
            );
        }
    };
    hear(&|s| s.iter().any(|l| l == "READY=1")).await;
    let addr = server.base.strip_prefix("http://").unwrap().to_owned();
    hear(&|s| {
        s.iter()
            .any(|l| *l == format!("STATUS=listening on http://{addr}"))
    })
    .await;
    // Every 100 ms: three within a second or so.
    hear(&|s| s.iter().filter(|l| *l == "WATCHDOG=1").count() >= 3).await;
    server.signal(SIGTERM);
    hear(&|s| s.iter().any(|l| l == "STOPPING=1")).await;
    server
        .exit_within(Duration::from_secs(30))
        .await
        .assert_success();
}
