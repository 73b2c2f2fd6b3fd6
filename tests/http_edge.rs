//! The API's edge through the `berth serve` binary: clients that are slow
//! or idle on purpose cannot hold berth's sockets, and input it cannot trust
//! (duplicate keys, other content types, control and direction-changing
//! characters) is refused with the field named.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::SimServer;
use crate::support::config::{CI, OPS, code, serve_config};
use crate::support::server::{Berth, Launch, http, http_raw, until};

/// The open-file limit berth runs under here: small, so that a flood would
/// exhaust it without a connection cap (berth takes at most half of it, 64,
/// in connections).
const NOFILE: u64 = 128;

/// berth with a 2 s header and body timeout and the small fd limit.
async fn limited_berth(sim: &SimServer, dir: &std::path::Path) -> Berth {
    let config = serve_config(sim, dir);
    let text = std::fs::read_to_string(&config).unwrap().replacen(
        "lease-ttl = \"3s\"",
        "lease-ttl = \"30s\"\nheader-timeout = \"2s\"\nbody-timeout = \"2s\"",
        1,
    );
    std::fs::write(&config, text).unwrap();
    let cfg = config.display().to_string();
    Berth::launch(Launch {
        nofile: Some(NOFILE),
        ..Launch::new(&["--config", &cfg], dir)
    })
    .await
}

/// How one flooding connection ended.
#[derive(Debug)]
struct Ended {
    /// How long it was open (from the end of the TCP handshake, which the
    /// kernel may delay under a flood, to berth closing it or the end of
    /// the flood).
    open_for: Duration,
    /// Whether berth closed it.
    closed: bool,
    /// The status berth answered before closing, if any.
    status: Option<u16>,
    /// How the connection failed, if it did not end with berth's FIN.
    #[allow(dead_code)] // shown in failure messages
    error: Option<String>,
}

/// Opens a connection, sends `head`, then one byte of `trickle` every
/// `every` until berth closes the connection or `hold` passes.
async fn flood_one(
    addr: String,
    head: String,
    trickle: Option<(u8, Duration)>,
    hold: Duration,
    start: Instant,
) -> Ended {
    let end = tokio::time::Instant::now() + hold.saturating_sub(start.elapsed());
    let Ok(Ok(mut s)) = tokio::time::timeout_at(end, TcpStream::connect(&addr)).await else {
        return Ended {
            open_for: Duration::ZERO,
            closed: false,
            status: None,
            error: Some("no connection".into()),
        };
    };
    let connected = Instant::now();
    let mut error = s
        .write_all(head.as_bytes())
        .await
        .err()
        .map(|e| e.to_string());
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let wait = match trickle {
            Some((_, every)) => every,
            None => hold,
        };
        let deadline = (tokio::time::Instant::now() + wait).min(end);
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) => break,
            Ok(Err(e)) => {
                error = Some(e.to_string());
                break;
            }
            Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
            Err(_) => {
                if tokio::time::Instant::now() >= end {
                    return Ended {
                        open_for: connected.elapsed(),
                        closed: false,
                        status: status_of(&answer),
                        error,
                    };
                }
                if let Some((byte, _)) = trickle
                    && let Err(e) = s.write_all(&[byte]).await
                {
                    error = Some(e.to_string());
                    break;
                }
            }
        }
    }
    Ended {
        open_for: connected.elapsed(),
        closed: true,
        status: status_of(&answer),
        error,
    }
}

fn status_of(answer: &[u8]) -> Option<u16> {
    std::str::from_utf8(answer)
        .ok()?
        .strip_prefix("HTTP/1.1 ")?
        .get(..3)?
        .parse()
        .ok()
}

/// Open fds of a process.
fn fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// 300 slowloris connections (a header line every 500 ms), 20 slow bodies
/// (a byte every 500 ms), 2,000 idle connections and a request declaring a
/// 10 GB body, all at once against a berth limited to 128 open files:
/// `/healthz` answers within 100 ms throughout, berth's fds stay bounded,
/// the pool goes on serving (a request is fulfilled, which takes driver
/// calls and their sockets), and berth itself closes every slow or idle
/// connection, none of them held past the 2 s timeouts for long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard is a lock between tests, each on a runtime of its own.
#[allow(clippy::await_holding_lock)]
async fn slow_and_idle_clients_cannot_hold_berth() {
    // Its /healthz times are berth's own only without a driver build
    // loading the machine beside it.
    // (Waiting here blocks only this test's own runtime, which has
    // nothing else to run yet.)
    let _heavy = crate::support::machine_to_myself();
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let server = limited_berth(&sim, dir.path()).await;
    let pid = server.pid();
    server
        .until_label_ready(60, "small", 2, "two ready nodes")
        .await;
    let addr = server.base.strip_prefix("http://").unwrap().to_owned();
    let hold = Duration::from_secs(12);
    // A body declared as 10 GB, of which a few bytes come: refused before
    // it is read. Once alone, once in the flood below, where it may as well
    // be closed to make room as answered; either way it is not held.
    let huge = format!(
        "POST /v1/requests HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {CI}\r\n\
         Content-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n{{\"labels\":"
    );
    let alone = flood_one(addr.clone(), huge.clone(), None, hold, Instant::now()).await;
    assert_eq!(alone.status, Some(413), "{alone:?}");
    assert!(
        alone.closed && alone.open_for < Duration::from_secs(2),
        "{alone:?}"
    );
    let start = Instant::now();
    let huge = tokio::spawn(flood_one(addr.clone(), huge, None, hold, start));

    let mut slow_bodies = Vec::new();
    for _ in 0..20 {
        let head = format!(
            "POST /v1/requests HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {CI}\r\n\
             Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        );
        slow_bodies.push(tokio::spawn(flood_one(
            addr.clone(),
            head,
            Some((b' ', Duration::from_millis(500))),
            hold,
            start,
        )));
    }
    // The slow bodies' heads are in (and being answered) before the rest
    // of the flood comes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut slowloris = Vec::new();
    for _ in 0..300 {
        let head = format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nX-Slow: ");
        slowloris.push(tokio::spawn(flood_one(
            addr.clone(),
            head,
            Some((b'a', Duration::from_millis(500))),
            hold,
            start,
        )));
    }
    let mut idle = Vec::new();
    for _ in 0..2000 {
        idle.push(tokio::spawn(flood_one(
            addr.clone(),
            String::new(),
            None,
            hold,
            start,
        )));
    }

    // Meanwhile: /healthz every 50 ms, from a thread of its own so that
    // what is timed is berth, not this test's runtime busy with the flood's
    // thousands of tasks.
    let prober = {
        let base = server.base.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let (mut worst, mut probes, mut failed) = (Duration::ZERO, 0, Vec::new());
                while start.elapsed() < hold {
                    let t = Instant::now();
                    let answer = tokio::time::timeout(
                        Duration::from_secs(5),
                        http(&base, "GET", "/healthz", None, None),
                    )
                    .await;
                    probes += 1;
                    worst = worst.max(t.elapsed());
                    match answer {
                        Ok(Ok((200, _))) => {}
                        other => failed.push(format!("{:?}: {other:?}", start.elapsed())),
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                (worst, probes, failed)
            })
        })
    };
    // And berth's fds, and a request served.
    let mut most_fds = 0;
    let mut request: Option<String> = None;
    let mut fulfilled = false;
    while start.elapsed() < hold {
        most_fds = most_fds.max(fds(pid));
        if start.elapsed() > Duration::from_secs(1) && !fulfilled {
            match &request {
                None => {
                    let (status, r) = server
                        .call(
                            "POST",
                            "/v1/requests",
                            Some(CI),
                            Some(json!({"labels": {"small": 3}})),
                        )
                        .await;
                    assert_eq!(status, 201, "{r}");
                    request = r["id"].as_str().map(str::to_owned);
                }
                Some(id) => {
                    let (_, r) = server
                        .call("GET", &format!("/v1/requests/{id}"), Some(CI), None)
                        .await;
                    fulfilled = r["state"] == "fulfilled";
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let (worst, probes, failed) = prober.join().unwrap();
    let huge = huge.await.unwrap();
    let slowloris = join(slowloris).await;
    let slow_bodies = join(slow_bodies).await;
    let idle = join(idle).await;
    let longest = |ended: &[Ended]| ended.iter().map(|e| e.open_for).max().unwrap_or_default();
    let closed_by_berth = |ended: &[Ended]| ended.iter().filter(|e| e.closed).count();
    let metrics = server.metrics(Some(OPS)).await;
    let closed: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("berth_http_connections_closed_total"))
        .collect();
    eprintln!(
        "{probes} /healthz probes under the flood: worst {worst:?}, {} failed; berth's fds at most {most_fds} (limit {NOFILE}); \
         10 GB body alone answered {:?} after {:?}, in the flood {:?} after {:?}; open at most: slowloris {:?}, slow bodies {:?}, idle {:?}; \
         closed by berth: {} of 300 slowloris, {} of 20 slow bodies (answers {:?}), {} of 2000 idle; counted: {closed:?}",
        failed.len(),
        alone.status,
        alone.open_for,
        huge.status,
        huge.open_for,
        longest(&slowloris),
        longest(&slow_bodies),
        longest(&idle),
        closed_by_berth(&slowloris),
        closed_by_berth(&slow_bodies),
        slow_bodies
            .iter()
            .map(|e| e.status)
            .collect::<std::collections::BTreeSet<_>>(),
        closed_by_berth(&idle),
    );
    assert!(failed.is_empty(), "/healthz failed: {failed:?}");
    // Not a speed figure (that takes a quiet machine; it is printed above):
    // a server the flood holds answers in seconds or never, one it does not
    // hold in milliseconds, even beside other tests on two cores.
    assert!(
        worst < Duration::from_secs(2),
        "/healthz took {worst:?} under the flood"
    );
    assert!(fulfilled, "no request was fulfilled during the flood");
    assert!(
        huge.closed && huge.open_for < Duration::from_secs(2),
        "{huge:?}"
    );
    assert!(
        slow_bodies.iter().all(|e| e.status == Some(408)),
        "{slow_bodies:?}"
    );
    // No connection was held past the 2 s timeouts and some slack (the
    // flood lasts 12 s): berth closed each one, by a timeout or to make
    // room for a newer one.
    for (what, ended) in [
        ("slowloris", &slowloris),
        ("slow body", &slow_bodies),
        ("idle", &idle),
    ] {
        let longest = longest(ended);
        assert!(
            longest < Duration::from_secs(6),
            "a {what} connection was held {longest:?}"
        );
    }
    assert!(
        most_fds < NOFILE as usize - 8,
        "berth's fds reached {most_fds} of {NOFILE}"
    );
    let log = server.log_text();
    assert!(!log.contains("cannot accept connections"), "{log}");
    assert!(!log.contains("ConnectionRefused"), "{log}");
}

/// Clients long-polling their pending request (`?wait=300s`) until
/// berth's connections are full, under a 128-file limit (a cap of 64) and at
/// the default cap of 1,024. Before: every connection held a long-poll, so
/// 106 of 106 health probes failed under the small limit and `/healthz`
/// timed out at the default cap: a liveness probe would have restarted berth
/// in a loop. Now long-polls hold at most all but a reserve: every health
/// probe, an admin call and a new request are answered, and the long-polls
/// past the reserve are answered at once with `Retry-After`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard is a lock between tests, each on a runtime of its own.
#[allow(clippy::await_holding_lock)]
async fn long_polls_at_the_connection_cap_leave_room_for_health_and_admin_calls() {
    let _heavy = crate::support::machine_to_myself();
    for (nofile, cap, pollers) in [(NOFILE, 64usize, 100usize), (4096, 1024, 1100)] {
        // Its creates fail for want of capacity: the request stays pending.
        let sim = SimServer::start_with(berth::sim::Knobs {
            out_of_capacity: vec!["small".into()],
            ..Default::default()
        })
        .await;
        let dir = tempfile::tempdir().unwrap();
        let config = serve_config(&sim, dir.path());
        crate::support::config::set_lease_ttl(&config, "10m");
        let cfg = config.display().to_string();
        let server = Berth::launch(Launch {
            nofile: Some(nofile),
            ..Launch::new(&["--config", &cfg], dir.path())
        })
        .await;
        let pid = server.pid();
        let waiting = server.request(CI, &[("small", 1)]).await;
        let addr = server.base.strip_prefix("http://").unwrap().to_owned();
        let head = format!(
            "GET /v1/requests/{}?wait=300s HTTP/1.1\r\nHost: {addr}\r\n\
             Authorization: Bearer {CI}\r\n\r\n",
            waiting.id
        );
        let before = fds(pid);
        let polls: Vec<_> = (0..pollers)
            .map(|_| {
                let (addr, head) = (addr.clone(), head.clone());
                tokio::spawn(async move {
                    let mut s = TcpStream::connect(&addr).await.ok()?;
                    s.write_all(head.as_bytes()).await.ok()?;
                    // Held open, reading whatever comes, until dropped.
                    let mut answer = Vec::new();
                    let _ =
                        tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut answer))
                            .await;
                    Some(answer)
                })
            })
            .collect();
        // Every long-poll berth lets wait is waiting: all its connections
        // but the reserve (a sixteenth, at least 16).
        let held = cap - (cap / 16).max(16);
        until(60, &format!("{held} long-polls held of {cap}"), || async {
            (fds(pid) >= before + held).then_some(())
        })
        .await;
        let mut slow = Vec::new();
        for _ in 0..20 {
            let asked = Instant::now();
            // Answered at all, not how fast: a probe's own timeout is
            // the operator's to set.
            let answered = tokio::time::timeout(
                Duration::from_secs(5),
                http(&server.base, "GET", "/healthz", None, None),
            )
            .await;
            match answered {
                Ok(Ok((200, _))) => slow.push(asked.elapsed()),
                other => panic!("cap {cap}: /healthz not answered: {other:?}"),
            }
        }
        let (s, nodes) = tokio::time::timeout(
            Duration::from_secs(5),
            http(&server.base, "GET", "/v1/nodes", Some(OPS), None),
        )
        .await
        .expect("an admin call answered")
        .unwrap();
        assert_eq!(s, 200, "cap {cap}: {nodes}");
        let (s, r) = http(
            &server.base,
            "POST",
            "/v1/requests",
            Some(CI),
            Some(json!({"labels": {"small": 1}})),
        )
        .await
        .unwrap();
        assert_eq!(s, 201, "cap {cap}: {r}");
        for p in polls {
            p.abort();
        }
        let worst = slow.iter().max().copied().unwrap_or_default();
        eprintln!(
            "cap {cap}: {pollers} long-polls; 20 of 20 health probes answered, the slowest in {worst:?}"
        );
        server.terminate().await.assert_success();
    }
}

async fn join(tasks: Vec<tokio::task::JoinHandle<Ended>>) -> Vec<Ended> {
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// What berth says to a body it will not read as given.
async fn refused(server: &Berth, head_extra: &str, body: &str) -> (u16, Value) {
    let addr = server.base.strip_prefix("http://").unwrap();
    let req = format!(
        "POST /v1/requests HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Authorization: Bearer {OPS}\r\n{head_extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let (status, text) = http_raw(&server.base, req.as_bytes()).await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Duplicate keys, bodies that are not JSON, and names with control or
/// direction-changing characters are refused with 400 or 415, the field
/// named, and nothing is asked of the pool.
#[tokio::test]
async fn input_it_cannot_trust_is_refused_by_name() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let server = limited_berth(&sim, dir.path()).await;
    let json = "Content-Type: application/json\r\n";

    let (status, e) = refused(
        &server,
        json,
        r#"{"labels": {"small": 1}, "labels": {"small": 2}}"#,
    )
    .await;
    assert_eq!((status, code(&e)), (400, "bad_request"), "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`labels` is given twice"),
        "{e}"
    );
    let (status, e) = refused(&server, json, r#"{"labels": {"small": 1, "small": 2}}"#).await;
    assert_eq!(status, 400, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`small` is given twice"),
        "{e}"
    );

    // serde would read a struct from an array; the API takes objects.
    let (status, e) = refused(&server, json, r#"[{"labels": {"small": 1}}]"#).await;
    assert_eq!(
        (status, e["error"]["field"].as_str()),
        (400, Some("body")),
        "{e}"
    );
    // An unknown field is named, escaped.
    let (status, e) = refused(
        &server,
        json,
        &json!({"labels": {"small": 1}, "prio\u{202e}": 1}).to_string(),
    )
    .await;
    assert_eq!(status, 400, "{e}");
    let field = e["error"]["field"].as_str().unwrap();
    assert!(
        field.starts_with("prio") && !field.contains('\u{202e}'),
        "{e}"
    );

    for head in ["Content-Type: text/plain\r\n", ""] {
        let (status, e) = refused(&server, head, r#"{"labels": {"small": 1}}"#).await;
        assert_eq!((status, code(&e)), (415, "unsupported_media_type"), "{e}");
        assert_eq!(e["error"]["field"], "Content-Type", "{e}");
    }

    for name in ["ops\u{202e}nimda", "ops\u{7}", "a\u{2066}b"] {
        let (status, e) = refused(
            &server,
            json,
            &json!({"labels": {"small": 1}, "requestor": name}).to_string(),
        )
        .await;
        assert_eq!(
            (status, e["error"]["field"].as_str()),
            (400, Some("requestor")),
            "{e}"
        );
        let (status, e) = refused(
            &server,
            json,
            &json!({"labels": {format!("small{name}"): 1}}).to_string(),
        )
        .await;
        assert_eq!(
            (status, e["error"]["field"].as_str()),
            (400, Some("labels")),
            "{e}"
        );
        let message = e["error"]["message"].as_str().unwrap();
        assert!(
            !message.chars().any(|c| c.is_control()
                || ('\u{2066}'..='\u{2069}').contains(&c)
                || c == '\u{202e}'),
            "the message echoes the name unescaped: {message:?}"
        );
    }

    let (_, requests) = server.call("GET", "/v1/requests", Some(OPS), None).await;
    assert_eq!(requests.as_array().map(Vec::len), Some(0), "{requests}");
    // A proper body is still taken.
    let (status, e) = refused(&server, json, r#"{"labels": {"small": 1}}"#).await;
    assert_eq!(status, 201, "{e}");
}
