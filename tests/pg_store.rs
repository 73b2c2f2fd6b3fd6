//! `berth serve` on the PostgreSQL store (`[store] url`), through the
//! binary, on a fresh database of this test process's throwaway cluster
//! (support/postgres.rs): the pool's records live in PostgreSQL and survive
//! a SIGKILL, a second process on the same database stands by and relays
//! calls to the holder, and a wrong password is a clear error. Several
//! processes failing over are in `ha.rs`.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::config::{CI, OPS, OTHER, serve_config_with, set_lease_ttl};
use crate::support::config::{database, store_table};
use crate::support::postgres::{PgCluster, psql};
use crate::support::server::{Berth, Launch, http_raw, until};
use crate::support::{SimServer, creates, live, metric, plugin, workspace};

fn config(sim: &SimServer, dir: &Path, store: &str) -> String {
    serve_config_with(sim, dir, &plugin("sim"), "min-ready = 2", store)
        .display()
        .to_string()
}

/// [`config`] with requestor leases of a minute, for a test whose client
/// holds a node across a takeover without renewing.
fn config_holding(sim: &SimServer, dir: &Path, store: &str) -> String {
    let path = config(sim, dir, store);
    set_lease_ttl(Path::new(&path), "60s");
    path
}

/// A sim, a state directory, a fresh database (its url) and `berth serve`
/// on it with [`config`].
async fn serve_on_postgres() -> (SimServer, tempfile::TempDir, String, Berth) {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (url, store) = database(dir.path(), None);
    let cfg = config(&sim, dir.path(), &store);
    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    (sim, dir, url, server)
}

async fn nodes(server: &Berth) -> Vec<Value> {
    let (s, v) = server.call("GET", "/v1/nodes", Some(OPS), None).await;
    assert_eq!(s, 200, "{v}");
    v.as_array().unwrap().clone()
}

/// The sim's instances that are not terminated, by id.
fn live_instances(sim: &SimServer) -> Vec<String> {
    let mut ids: Vec<String> = live(&sim.cloud).into_iter().map(|i| i.id).collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_keeps_its_pool_in_postgres_across_a_sigkill() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (url, store) = database(dir.path(), None);
    let cfg = config(&sim, dir.path(), &store);
    let server = Berth::start(&["--config", &cfg], dir.path()).await;

    let request = server.request(CI, &[("small", 1)]).await;
    let done = server.fulfilled(CI, &request.id).await;
    let mine = done.nodes[0].id.clone();
    until(30, "two ready nodes", || async {
        let n = nodes(&server).await;
        (n.iter().filter(|n| n["state"] == "ready").count() == 2).then_some(())
    })
    .await;
    // The records are in PostgreSQL, not in a file.
    let stored = psql(
        &url,
        "SELECT count(*) FROM nodes WHERE state IN ('ready', 'in-use')",
    )
    .unwrap();
    assert_eq!(stored, "3");
    assert!(!dir.path().join("state/berth.db").exists());

    let before = nodes(&server).await;
    // The requestor's lease (3 s) is renewed just before the kill: the
    // restarted process takes the pool back only once the dead one's pool
    // lease (1 s) has expired.
    let (s, _) = server.call("POST", "/v1/lease", Some(CI), None).await;
    assert_eq!(s, 200);
    server.signal(libc::SIGKILL);
    server.exit_within(Duration::from_secs(30)).await;
    let created = creates(&sim.cloud);

    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    server.until_ready(30, "ready again").await;
    let (s, _) = server.call("POST", "/v1/lease", Some(CI), None).await;
    assert_eq!(s, 200);
    let (_, n) = server
        .call("GET", &format!("/v1/nodes/{mine}"), Some(OPS), None)
        .await;
    assert_eq!(n["state"], "in-use", "kept across the SIGKILL: {n}");
    let after = nodes(&server).await;
    let key = |v: &[Value]| {
        let mut k: Vec<(String, String, String)> = v
            .iter()
            .map(|n| {
                (
                    n["id"].as_str().unwrap_or_default().to_owned(),
                    n["state"].as_str().unwrap_or_default().to_owned(),
                    n["instance"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        k.sort();
        k
    };
    assert_eq!(
        key(&after),
        key(&before),
        "the same nodes after the restart"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(creates(&sim.cloud), created, "no create after the restart");
    // Every live instance of the cloud is one of berth's nodes.
    let mut known: Vec<String> = after
        .iter()
        .filter_map(|n| n["instance"].as_str().map(str::to_owned))
        .collect();
    known.sort();
    assert_eq!(
        live_instances(&sim),
        known,
        "{:#?}\n{}",
        sim.cloud.calls(),
        server.log_text()
    );
    server.terminate().await.assert_success();
}

/// Cloud calls ending do not make heartbeats: `berth serve` on PostgreSQL
/// beats its providers' leases about every quarter of the lease TTL however
/// many calls its drivers make. Before, every call that ended woke the
/// heartbeat, so a busy pool sent hundreds of lease transactions a second
/// to the database, each a WAL flush beside the pool's commits. Checked
/// through the binary's `berth_lease_heartbeat_seconds` count against the
/// sim's own call record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_keep_their_pace_however_many_calls_end() {
    let (sim, _dir, _, server) = serve_on_postgres().await;
    server.until_ready(30, "holding the pool").await;
    let beats = || async {
        metric(
            &server.metrics(Some(OPS)).await,
            "berth_lease_heartbeat_seconds_count",
        )
        .expect("berth_lease_heartbeat_seconds_count in /metrics")
    };
    let (beats_before, calls_before) = (beats().await, sim.cloud.calls().len());
    let started = std::time::Instant::now();
    // Each hand-out and release makes a delete, a create to refill, and the
    // lists that watch the new node boot.
    for _ in 0..40 {
        let request = server.request(CI, &[("small", 1)]).await;
        let done = server.fulfilled(CI, &request.id).await;
        let path = format!("/v1/nodes/{}/release", done.nodes[0].id);
        let (s, n) = server.call("POST", &path, Some(CI), None).await;
        assert_eq!(s, 200, "{n}");
    }
    let calls = sim.cloud.calls().len() - calls_before;
    let beats = beats().await - beats_before;
    let elapsed = started.elapsed();
    // The lease TTL is 1 s: a beat every 250 ms, and a few more when a
    // lease changes hands (none should here).
    let allowed = (elapsed.as_secs_f64() / 0.25).ceil() + 4.0;
    println!("{calls} cloud calls and {beats} heartbeats in {elapsed:?} (at most {allowed})");
    assert!(calls >= 60, "too few cloud calls to tell: {calls}");
    assert!(
        beats <= allowed,
        "{beats} heartbeats in {elapsed:?} while the drivers made {calls} calls: at most {allowed} were due"
    );
    server.terminate().await.assert_success();
}

/// A second `berth serve` on the same database stands by: `/readyz` says
/// who holds the pool, `/v1` calls made to it are relayed to the holder and
/// answered as the holder answers them, and when the holder stops cleanly
/// it gives the lease up and the second takes the pool over at once,
/// listing before it acts: no create of its own for nodes that exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_berth_stands_by_relays_calls_and_takes_over_when_the_first_stops() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (url, store) = database(dir.path(), None);
    // A lease far longer than the takeover may take: only the first giving
    // it up lets the second in that soon.
    let store = store.replace("pool-lease-ttl = \"1s\"", "pool-lease-ttl = \"30s\"");
    let cfg = config_holding(&sim, dir.path(), &store);
    let first = Berth::start(&["--config", &cfg], dir.path()).await;
    first.until_ready(30, "the first holds the pool").await;

    let other = tempfile::tempdir().unwrap();
    std::fs::copy(dir.path().join("pgpass"), other.path().join("pgpass")).unwrap();
    let cfg2 = config_holding(&sim, other.path(), &store);
    let second = Berth::start(&["--config", &cfg2], other.path()).await;
    let (s, e) = second.call("GET", "/readyz", None, None).await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (503, Some("standby")),
        "{e}"
    );
    let said = e["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(said.contains(&first.base), "{said}");
    assert_eq!(second.call("GET", "/healthz", None, None).await.0, 200);
    // Each process serves its own metrics (before: a standby's answered
    // `503 standby`); the pool's gauges are the holder's alone.
    let theirs = second.metrics(Some(OPS)).await;
    assert_eq!(metric(&theirs, "berth_pool_held"), Some(0.0), "{theirs}");
    assert!(!theirs.contains("berth_nodes{"), "{theirs}");
    assert!(
        theirs.contains("berth_lease_heartbeat_seconds_count"),
        "{theirs}"
    );
    let mine = first.metrics(Some(OPS)).await;
    assert_eq!(metric(&mine, "berth_pool_held"), Some(1.0), "{mine}");

    // A request made to the one standing by is offered to the holder and
    // served by it.
    let request = second.request(CI, &[("small", 1)]).await;
    let done = second.fulfilled(CI, &request.id).await;
    // Only a berth process (with the pool's peer secret) names the id of
    // a request it offers.
    for secret in [None, Some("not-the-secret")] {
        let body = r#"{"labels": {"small": 1}}"#;
        let peer = secret
            .map(|s| format!("x-berth-peer: {s}\r\n"))
            .unwrap_or_default();
        let raw = format!(
            "POST /v1/requests HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {CI}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\
             x-berth-request-id: r-00000000000000b1\r\n{peer}Connection: close\r\n\r\n{body}",
            body.len()
        );
        let (s, body) = http_raw(&first.base, raw.as_bytes()).await.unwrap();
        assert_eq!(s, 403, "{body}");
        assert!(body.contains("x-berth-request-id"), "{body}");
    }
    // What the one standing by refuses, it refuses as the holder would,
    // and puts nothing into the inbox.
    for (token, body, status, code) in [
        (CI, json!({"labels": {"gpu": 1}}), 422, "unknown_label"),
        (CI, json!({"labels": {}}), 400, "bad_request"),
        (
            CI,
            json!({"labels": {"small": 1}, "requestor": "x"}),
            403,
            "forbidden",
        ),
    ] {
        let (s, e) = second
            .call("POST", "/v1/requests", Some(token), Some(body))
            .await;
        assert_eq!(
            (s, e["error"]["code"].as_str()),
            (status, Some(code)),
            "{e}"
        );
    }
    assert_eq!(
        psql(&url, "SELECT count(*) FROM request_inbox").unwrap(),
        "0"
    );
    let (_, held) = first
        .call(
            "GET",
            &format!("/v1/requests/{}", request.id),
            Some(CI),
            None,
        )
        .await;
    assert_eq!(held["state"], "fulfilled", "{held}");
    // Errors come back as the holder gives them.
    let (s, e) = second
        .call("GET", "/v1/requests/r-nonesuch", Some(CI), None)
        .await;
    assert_eq!((s, e["error"]["field"].as_str()), (400, Some("id")), "{e}");
    let (s, _) = second.call("GET", "/v1/nodes", Some("wrong"), None).await;
    assert_eq!(s, 401);
    let (_, providers) = second.call("GET", "/v1/providers", Some(OPS), None).await;
    let holder = providers[0]["holder"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(holder.starts_with(&first.base), "{providers}");
    assert!(providers[0]["lease_expires"].is_string(), "{providers}");
    assert_eq!(
        psql(&url, "SELECT holder || ' ' || epoch FROM pool_lease").unwrap(),
        format!("{holder} 1")
    );
    until(30, "two ready nodes", || async {
        let n = nodes(&first).await;
        (n.iter().filter(|n| n["state"] == "ready").count() == 2).then_some(())
    })
    .await;
    let created = creates(&sim.cloud);

    // A clean stop gives the pool to the second at once (well within the
    // lease's TTL).
    let stopped = std::time::Instant::now();
    first.terminate().await.assert_success();
    second
        .until_ready(30, "the second took the pool over")
        .await;
    let took = stopped.elapsed();
    println!("the second took the pool over {took:?} after the first was told to stop");
    assert!(took < Duration::from_secs(2), "took {took:?}");
    let (_, n) = second
        .call(
            "GET",
            &format!("/v1/nodes/{}", done.nodes[0].id),
            Some(OPS),
            None,
        )
        .await;
    assert_eq!(n["state"], "in-use", "{n}");
    let log = second.log_text();
    assert!(log.contains("this process took the pool over"), "{log}");
    // Woken by the first's announcement, not by its own polling.
    assert!(
        log.contains("the pool's lease was given up: asking for it now"),
        "{log}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(creates(&sim.cloud), created, "no create after the takeover");
    let mut known: Vec<String> = nodes(&second)
        .await
        .iter()
        .filter_map(|n| n["instance"].as_str().map(str::to_owned))
        .collect();
    known.sort();
    assert_eq!(
        live_instances(&sim),
        known,
        "{:#?}\n{}",
        nodes(&second).await,
        second.log_text()
    );
    assert!(
        psql(&url, "SELECT holder || ' ' || epoch FROM pool_lease")
            .unwrap()
            .ends_with(" 2")
    );
    second.terminate().await.assert_success();
}

/// Requests waiting in the inbox that nobody announced (written here by
/// hand, as a process standing by writes them, without its `NOTIFY`) are
/// found by the holder through the binary: a `DELETE` or `GET` of an id it
/// does not know takes the inbox in first. One naming a label the holder
/// does not have fails with the reason; one of another requestor stays
/// theirs. Nothing is left in the inbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_finds_a_request_waiting_in_the_inbox_by_its_id() {
    let (_sim, _dir, url, server) = serve_on_postgres().await;
    server.until_ready(30, "holding the pool").await;
    let put = |id: &str, label: &str, count: u32| {
        psql(
            &url,
            &format!(
                "INSERT INTO request_inbox (id, requestor, priority, created, labels, counts, \
                 accepted_by) VALUES ('{id}', 'ci', 0, \
                 (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT, ARRAY['{label}'], \
                 ARRAY[{count}::BIGINT], 'by hand')"
            ),
        )
        .unwrap();
    };
    let waiting = || psql(&url, "SELECT count(*) FROM request_inbox").unwrap();
    let ask = |method: &'static str, id: &str, token: &'static str| {
        let path = format!("/v1/requests/{id}");
        let server = &server;
        async move { server.call(method, &path, Some(token), None).await }
    };

    // More than are ready: still pending when the cancel comes.
    put("r-00000000000000a1", "small", 5);
    let (s, cancelled) = ask("DELETE", "r-00000000000000a1", CI).await;
    assert_eq!(
        (s, cancelled["state"].as_str()),
        (200, Some("cancelled")),
        "{cancelled}"
    );
    assert_eq!(waiting(), "0");

    put("r-00000000000000a2", "small", 1);
    put("r-00000000000000a3", "gpu", 1);
    let (s, theirs) = ask("GET", "r-00000000000000a2", OTHER).await;
    assert_eq!(
        (s, theirs["error"]["code"].as_str()),
        (403, Some("forbidden")),
        "{theirs}"
    );
    let served = server.fulfilled(CI, "r-00000000000000a2").await;
    assert_eq!(served.nodes.len(), 1);
    let (s, failed) = ask("GET", "r-00000000000000a3", CI).await;
    assert_eq!(
        (s, failed["state"].as_str()),
        (200, Some("failed")),
        "{failed}"
    );
    let reason = failed["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("no label `gpu`"), "{failed}");
    assert_eq!(waiting(), "0");
    // More than one step takes in: the holder reads on until the inbox is
    // drained before it answers (the last one here, in the last read).
    psql(
        &url,
        "INSERT INTO request_inbox (id, requestor, priority, created, labels, counts, accepted_by) \
         SELECT 'r-' || lpad(to_hex(x), 16, '0'), 'ci', 0, 0, ARRAY['gpu'], ARRAY[1::BIGINT], \
         'by hand' FROM generate_series(4096, 4096 + 599) AS x",
    )
    .unwrap();
    let last = format!("r-{:016x}", 4096 + 599);
    let (s, failed) = ask("GET", &last, CI).await;
    assert_eq!(
        (s, failed["state"].as_str()),
        (200, Some("failed")),
        "{failed}"
    );
    assert_eq!(waiting(), "0");
    // A row the table's checks would have refused (written with a check
    // dropped) or a requestor the API would have refused costs only itself:
    // removed, named in the log; the rows beside it are taken in and the
    // pool serves on.
    psql(
        &url,
        "ALTER TABLE request_inbox DROP CONSTRAINT request_inbox_priority_check",
    )
    .unwrap();
    psql(
        &url,
        "INSERT INTO request_inbox (id, requestor, priority, created, labels, counts, accepted_by) \
         VALUES ('r-00000000000000b1', 'ci', 1099511627776, 0, ARRAY['small'], ARRAY[1::BIGINT], \
         'by hand'), ('r-00000000000000b2', E'c\\u202ei', 0, 0, ARRAY['small'], \
         ARRAY[1::BIGINT], 'by hand')",
    )
    .unwrap();
    put("r-00000000000000b3", "small", 1);
    let served = server.fulfilled(CI, "r-00000000000000b3").await;
    assert_eq!(served.nodes.len(), 1);
    assert_eq!(waiting(), "0");
    for (bad, why) in [
        (
            "r-00000000000000b1",
            "priority 1099511627776 is out of range",
        ),
        ("r-00000000000000b2", "is not 1 to 128 printable characters"),
    ] {
        let (s, e) = ask("GET", bad, OPS).await;
        assert_eq!(s, 404, "{e}");
        let log = server.log_text();
        assert!(
            log.lines()
                .any(|l| l.contains("unreadable") && l.contains(bad) && l.contains(why)),
            "{log}"
        );
    }
    // An id nobody gave is still unknown.
    let (s, _) = ask("GET", "r-00000000000000ff", CI).await;
    assert_eq!(s, 404);
    server.terminate().await.assert_success();
}

/// `POST /internal/v1/calls` (a driver call handed over by the pool's
/// holder) through the binary: without the pool's peer secret it is 401,
/// an unreadable call 400, a call for a provider this process does not hold
/// or under another pool epoch 421 (nothing done), and a right one is
/// carried out; the pool serves on. A process with a store of its own has
/// no such endpoint (404).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_call_endpoint_refuses_what_it_cannot_trust() {
    let (sim, _dir, url, berth) = serve_on_postgres().await;
    berth.until_ready(30, "it holds the pool").await;
    let peer = |secret: Option<&str>, body: &str| {
        let mut req = format!(
            "POST /internal/v1/calls HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        );
        if let Some(secret) = secret {
            req.push_str(&format!("x-berth-peer: {secret}\r\n"));
        }
        req.push_str(&format!("\r\n{body}"));
        let base = berth.base.clone();
        async move { http_raw(&base, req.as_bytes()).await.unwrap() }
    };
    let secret = psql(&url, "SELECT secret FROM peer_secret").unwrap();
    let epoch = psql(&url, "SELECT epoch FROM pool_lease").unwrap();
    let list = |provider: &str, epoch: &str| {
        format!(
            r#"{{"provider":"{provider}","pool_epoch":{epoch},"call":{{"list":{{"filter":{{"berth-pool":"serve-test"}},"cursor":null}}}}}}"#
        )
    };

    let right = list("sim", &epoch);
    assert_eq!(peer(None, &right).await.0, 401);
    assert_eq!(peer(Some("nope"), &right).await.0, 401);
    // The secret with its last character changed (never to itself).
    let last = if secret.ends_with('0') { '1' } else { '0' };
    let wrong = format!("{}{last}", &secret[..secret.len() - 1]);
    assert_eq!(peer(Some(&wrong), &right).await.0, 401);
    let (s, said) = peer(Some(&secret), r#"{"provider":"#).await;
    assert_eq!(s, 400, "{said}");
    let (s, said) = peer(Some(&secret), &list("nonesuch", &epoch)).await;
    assert_eq!(
        (s, said.contains("no provider nonesuch")),
        (421, true),
        "{said}"
    );
    let (s, said) = peer(Some(&secret), &list("sim", "7")).await;
    assert_eq!((s, said.contains("epoch 7")), (421, true), "{said}");

    let (s, said) = peer(Some(&secret), &right).await;
    assert_eq!(s, 200, "{said}");
    let answer: Value = serde_json::from_str(&said).unwrap();
    // One page: every instance of the pool, and no cursor after it.
    let listed = answer["listed"]["instances"].as_array().expect("a page");
    assert_eq!(listed.len(), live_instances(&sim).len(), "{said}");
    assert!(answer["listed"]["next"].is_null(), "{said}");
    // It serves on.
    let r = berth.request(CI, &[("small", 1)]).await;
    berth.fulfilled(CI, &r.id).await;
    berth.terminate().await.assert_success();

    let own = tempfile::tempdir().unwrap();
    let cfg = config(&sim, own.path(), "");
    let alone = Berth::start(&["--config", &cfg], own.path()).await;
    let (s, said) = http_raw(
        &alone.base,
        format!(
            "POST /internal/v1/calls HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
             Content-Type: application/json\r\nx-berth-peer: {secret}\r\n\
             Content-Length: {}\r\n\r\n{right}",
            right.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(s, 404, "{said}");
    alone.terminate().await.assert_success();
}

/// Another writer (an operator's SQL, a process the lease did not stop)
/// takes both ready nodes out of service in the database. berth's next
/// commit that hands one out is conditional on the row as berth last read
/// it, so it is refused whole; berth reloads the pool from the store and
/// decides again on what is stored: neither retired node is handed out or
/// written over, and the request is served by a node launched for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_over_rows_another_writer_changed_is_refused_and_decided_again() {
    let (_sim, _dir, url, server) = serve_on_postgres().await;
    let ready: Vec<String> = until(30, "two ready nodes", || async {
        let n = nodes(&server).await;
        let ready: Vec<String> = n
            .iter()
            .filter(|n| n["state"] == "ready")
            .filter_map(|n| n["id"].as_str().map(str::to_owned))
            .collect();
        (ready.len() == 2).then_some(ready)
    })
    .await;
    let retired = psql(
        &url,
        "UPDATE nodes SET state = 'failed', reason = 'retired by hand', version = version + 1 \
         WHERE state = 'ready' RETURNING id",
    )
    .unwrap();
    assert_eq!(retired.lines().count(), 2, "{retired}");

    // The commit that would hand a retired node out is refused; the call is
    // answered 503 while the pool reloads, and served once asked again.
    let body = serde_json::json!({"labels": {"small": 1}});
    let id = until(30, "a request taken", || async {
        let (s, v) = server
            .call("POST", "/v1/requests", Some(CI), Some(body.clone()))
            .await;
        match s {
            201 => Some(v["id"].as_str().unwrap().to_owned()),
            503 => None,
            _ => panic!("{s} {v}"),
        }
    })
    .await;
    let done = server.fulfilled(CI, &id).await;
    let handed = &done.nodes[0].id;
    assert!(
        !ready.contains(handed),
        "a retired node was handed out: {handed}"
    );
    let log = server.log_text();
    assert!(
        log.contains("a commit was refused") && log.contains("after a refused commit"),
        "{log}"
    );
    for id in &ready {
        let row = psql(
            &url,
            &format!("SELECT state || ' ' || reason FROM nodes WHERE id = '{id}'"),
        )
        .unwrap();
        assert_eq!(row, "failed retired by hand", "{id} written over");
        let (_, n) = server
            .call("GET", &format!("/v1/nodes/{id}"), Some(OPS), None)
            .await;
        assert_eq!(n["state"], "failed", "{n}");
    }
    server.terminate().await.assert_success();
}

#[tokio::test]
async fn a_wrong_password_ends_the_start_naming_the_database() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (_url, store) = database(dir.path(), Some("not-the-password"));
    let cfg = config(&sim, dir.path(), &store);
    let exited = Berth::spawn(Launch::new(&["--config", &cfg], dir.path()))
        .exit_within(Duration::from_secs(60))
        .await;
    assert_ne!(exited.status.code(), Some(0));
    let log = exited.log_text();
    assert!(
        log.contains("opening the PostgreSQL store postgres://berth@127.0.0.1:"),
        "{log}"
    );
    assert!(log.contains("password authentication failed"), "{log}");
    assert!(!log.contains("not-the-password"), "{log}");
}

/// With `sslmode=verify-full` and the server's CA as `ca-file`, every
/// connection berth makes is TLS, as the server itself reports; without the CA, the same server's
/// certificate is not trusted and the start ends saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_reaches_postgres_over_tls_only_with_a_certificate_it_trusts() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let cluster = PgCluster::shared(&workspace());
    let (url, store) = database(dir.path(), None);
    let database_name = url.rsplit('/').next().unwrap().to_owned();
    let tls = |extra: &str| {
        store.replacen(
            "\"\npassword-file",
            &format!("?sslmode=verify-full\"\n{extra}password-file"),
            1,
        )
    };
    let ca = format!("ca-file = {:?}\n", cluster.ca_file().display().to_string());
    let cfg = config(&sim, dir.path(), &tls(&ca));
    assert!(
        std::fs::read_to_string(&cfg)
            .unwrap()
            .contains("sslmode=verify-full")
    );
    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    let request = server.request(CI, &[("small", 1)]).await;
    server.fulfilled(CI, &request.id).await;
    let sessions = psql(
        &url,
        &format!(
            "SELECT count(*) FILTER (WHERE s.ssl) || ' of ' || count(*) \
             FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.application_name = 'berth' AND a.datname = '{database_name}'"
        ),
    )
    .unwrap();
    let (tls_count, all) = sessions.split_once(" of ").unwrap();
    assert_eq!(tls_count, all, "sessions over TLS: {sessions}");
    // The pool's connection and the leases' (driver records connect when a
    // driver first keeps one).
    assert!(all.parse::<u32>().unwrap() >= 2, "{sessions}");
    server.terminate().await.assert_success();

    // The system's roots do not include this cluster's own CA.
    let untrusted = config(&sim, dir.path(), &tls(""));
    let exited = Berth::spawn(Launch::new(&["--config", &untrusted], dir.path()))
        .exit_within(Duration::from_secs(60))
        .await;
    assert_ne!(exited.status.code(), Some(0));
    let log = exited.log_text();
    assert!(
        log.contains("opening the PostgreSQL store postgres://berth@127.0.0.1:")
            && log.contains("invalid peer certificate"),
        "{log}"
    );
}

/// A process sharing a pool that listens on every address cannot tell the
/// others where to reach it: without `api.advertise` its start ends saying
/// so, before it touches the database.
#[tokio::test]
async fn listening_on_every_address_without_advertise_ends_the_start() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (url, store) = database(dir.path(), None);
    let cfg = config(&sim, dir.path(), &store);
    // Plain HTTP allowed on every address, as behind a proxy that ends TLS.
    let text = std::fs::read_to_string(&cfg).unwrap();
    let text = text.replace("[api]\n", "[api]\nallow-plain-http = true\n");
    std::fs::write(&cfg, text).unwrap();
    let exited = Berth::spawn(Launch::new(
        &["--config", &cfg, "--listen", "0.0.0.0:0"],
        dir.path(),
    ))
    .exit_within(Duration::from_secs(60))
    .await;
    assert_ne!(exited.status.code(), Some(0));
    let log = exited.log_text();
    assert!(log.contains("set api.advertise"), "{log}");
    // It ended before it even connected: the database is untouched.
    assert_eq!(
        psql(
            &url,
            "SELECT count(*) FROM pg_tables WHERE tablename = 'pool_lease'"
        )
        .unwrap(),
        "0"
    );
}

/// PostgreSQL stopped as by a crash under a running `berth serve`: berth
/// calls no cloud while it is down, answers changes 503 `store_unavailable`
/// with `Retry-After`, and once the server is back reloads the pool from it
/// and serves again, with every instance of the cloud still one of its
/// nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_stops_every_cloud_call_until_it_ends() {
    let cluster = PgCluster::start(&workspace());
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let store = store_table(&cluster, &cluster.url(), dir.path(), None);
    let cfg = config(&sim, dir.path(), &store);
    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    let before = server.request(CI, &[("small", 1)]).await;
    server.fulfilled(CI, &before.id).await;

    cluster.stop_immediate();
    let calls_at_outage = sim.cloud.calls().len();
    // Idle for 2.5 s: with a sync interval of 1 s, lists are due, and find
    // the store gone before they reach the cloud.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // A change finds the store gone.
    let body = serde_json::json!({"labels": {"small": 1}});
    until(30, "a 503 store_unavailable", || async {
        let (s, e) = server
            .call("POST", "/v1/requests", Some(CI), Some(body.clone()))
            .await;
        (s == 503 && e["error"]["code"] == "store_unavailable").then_some(())
    })
    .await;
    // Down for 3 s more, with a client asking all along: every change
    // refused, not one call to the cloud.
    let down = std::time::Instant::now();
    while down.elapsed() < Duration::from_secs(3) {
        let (s, e) = server
            .call("POST", "/v1/requests", Some(CI), Some(body.clone()))
            .await;
        assert_eq!(
            (s, e["error"]["code"].as_str()),
            (503, Some("store_unavailable")),
            "{e}"
        );
        assert_eq!(server.call("GET", "/readyz", None, None).await.0, 503);
        // Alive, only waiting: nothing for a supervisor to restart.
        assert_eq!(server.call("GET", "/healthz", None, None).await.0, 200);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let head = response_head(
        &server.base,
        &format!(
            "POST /v1/requests HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {CI}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.to_string().len()
        ),
    )
    .await
    .to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 503"), "{head}");
    assert!(head.contains("\r\nretry-after: 1\r\n"), "{head}");
    let new_calls: Vec<String> = sim.cloud.calls()[calls_at_outage..]
        .iter()
        .map(|c| format!("{} {}", c.method, c.path))
        .collect();
    assert_eq!(
        new_calls,
        Vec::<String>::new(),
        "cloud calls while the store was down"
    );

    cluster.start_again();
    server.until_ready(30, "ready again").await;
    let after = server.request(CI, &[("small", 1)]).await;
    server.fulfilled(CI, &after.id).await;
    // The request fulfilled before the outage still holds its node.
    let (_, r) = server
        .call(
            "GET",
            &format!("/v1/requests/{}", before.id),
            Some(CI),
            None,
        )
        .await;
    assert_eq!(r["state"], "fulfilled", "{r}");
    until(
        30,
        "berth's nodes and the cloud's instances agree",
        || async {
            let mut known: Vec<String> = nodes(&server)
                .await
                .iter()
                .filter(|n| !matches!(n["state"].as_str(), Some("gone" | "failed")))
                .filter_map(|n| n["instance"].as_str().map(str::to_owned))
                .collect();
            known.sort();
            (known == live_instances(&sim)).then_some(())
        },
    )
    .await;
    assert!(
        server
            .log_text()
            .contains("the store is back; the pool is reloaded"),
        "{}",
        server.log_text()
    );
    server.terminate().await.assert_success();
}

/// The status line and headers of the answer to `request`.
async fn response_head(base: &str, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.strip_prefix("http://").expect("http url");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    text.split("\r\n\r\n").next().unwrap_or_default().to_owned()
}

/// `berth store migrate` moves a pool kept in SQLite onto PostgreSQL: the
/// same nodes in the same states, adopted by `berth serve` on the new
/// store with no create, and a second migrate refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_migrate_moves_a_sqlite_pool_onto_postgres() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_holding(&sim, dir.path(), "");
    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    let request = server.request(CI, &[("small", 1)]).await;
    let mine = server.fulfilled(CI, &request.id).await.nodes[0].id.clone();
    until(30, "two ready nodes", || async {
        let n = nodes(&server).await;
        (n.iter().filter(|n| n["state"] == "ready").count() == 2).then_some(())
    })
    .await;
    let before = nodes(&server).await;
    server.terminate().await.assert_success();
    // A driver's record beside the store, as the static driver keeps its
    // hosts: it goes along.
    let records = berth::plugin::DriverState::on(std::sync::Arc::new(
        berth::store::SqliteRecords::open(&dir.path().join("state/driver-state.sqlite")).unwrap(),
    ))
    .space("sim");
    let stored = records
        .compare_and_swap("host/a".into(), None, Some("node 1".into()))
        .await;
    assert_eq!(stored, Ok(true));
    drop(records);

    // The same config with the PostgreSQL store (the same state-dir).
    let (url, store) = database(dir.path(), None);
    let cfg = config_holding(&sim, dir.path(), &store);
    let migrate = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["store", "migrate", "--config", &cfg])
            .output()
            .unwrap()
    };
    let out = migrate();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.starts_with(&format!(
            "copied {} nodes, 1 request, 1 requestor lease and 1 driver record from ",
            before.len()
        )),
        "{said}"
    );
    let stored = psql(&url, "SELECT count(*) FROM nodes").unwrap();
    assert_eq!(stored, before.len().to_string());
    let record = "SELECT provider || ' ' || key || ' ' || value FROM driver_records";
    assert_eq!(psql(&url, record).unwrap(), "sim host/a node 1");

    let created = creates(&sim.cloud);
    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    server.until_ready(30, "ready on PostgreSQL").await;
    let (_, n) = server
        .call("GET", &format!("/v1/nodes/{mine}"), Some(OPS), None)
        .await;
    assert_eq!(n["state"], "in-use", "{n}");
    let ids = |v: &[Value]| {
        let mut k: Vec<String> = v.iter().map(|n| n["id"].to_string()).collect();
        k.sort();
        k
    };
    assert_eq!(ids(&nodes(&server).await), ids(&before));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(creates(&sim.cloud), created, "no create on the new store");
    server.terminate().await.assert_success();

    // Into a database that already holds a pool: refused, exit code 3.
    let out = migrate();
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("records are only copied into an empty one"),
        "{err}"
    );
}
