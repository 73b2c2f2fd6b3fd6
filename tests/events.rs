//! `GET /v1/events` through the binary: the pool's changes as Server-Sent
//! Events, a client token seeing only its own, a reconnect resuming from
//! `Last-Event-ID` with nothing lost, an id from elsewhere answered with a
//! `reset`, and the stream ending when berth stops.

use std::time::Duration;

use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use crate::support::SimServer;
use crate::support::config::{CI, OPS, OTHER, serve_config};
use crate::support::server::{Berth, http};

/// One event as received.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Received {
    pub(crate) id: Option<String>,
    pub(crate) event: String,
    pub(crate) data: Value,
}

impl Received {
    /// The sequence number of its id (`GENERATION-SEQUENCE`).
    fn seq(&self) -> u64 {
        let id = self.id.as_deref().expect("an id");
        id.rsplit_once('-').unwrap().1.parse().unwrap()
    }
}

/// A stream being read.
pub(crate) struct Stream {
    body: hyper::body::Incoming,
    buf: String,
}

impl Stream {
    /// Opens `/v1/events{query}` as `token`, resuming after `last`.
    pub(crate) async fn open(
        base: &str,
        token: &str,
        query: &str,
        last: Option<&str>,
    ) -> (u16, Stream) {
        let client = Client::builder(TokioExecutor::new())
            .build_http::<http_body_util::Empty<bytes::Bytes>>();
        let mut req = hyper::Request::get(format!("{base}/v1/events{query}"))
            .header("authorization", format!("Bearer {token}"));
        if let Some(last) = last {
            req = req.header("last-event-id", last);
        }
        let answer = client
            .request(req.body(Default::default()).unwrap())
            .await
            .unwrap();
        let status = answer.status().as_u16();
        (
            status,
            Stream {
                body: answer.into_body(),
                buf: String::new(),
            },
        )
    }

    /// The next event within `within`, keep-alive comments skipped; `None`
    /// if none came, or the stream ended.
    async fn next(&mut self, within: Duration) -> Option<Received> {
        let end = tokio::time::Instant::now() + within;
        loop {
            if let Some(at) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..at + 2).collect();
                let (mut id, mut event, mut data) = (None, String::from("message"), String::new());
                for line in block.lines() {
                    match line.split_once(':') {
                        Some(("id", v)) => id = Some(v.trim().to_owned()),
                        Some(("event", v)) => event = v.trim().to_owned(),
                        Some(("data", v)) => data.push_str(v.trim_start()),
                        _ => {}
                    }
                }
                if data.is_empty() && id.is_none() {
                    continue; // a keep-alive comment
                }
                let data = serde_json::from_str(&data).unwrap_or(Value::String(data));
                return Some(Received { id, event, data });
            }
            let frame = tokio::time::timeout_at(end, self.body.frame())
                .await
                .ok()??
                .ok()?;
            if let Ok(bytes) = frame.into_data() {
                self.buf.push_str(&String::from_utf8_lossy(&bytes));
            }
        }
    }

    /// Whether the stream ends within `within`, whatever events come
    /// before its end.
    async fn ends_within(&mut self, within: Duration) -> bool {
        let end = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(end, self.body.frame()).await {
                Err(_) => return false,
                Ok(None | Some(Err(_))) => return true,
                Ok(Some(Ok(_))) => {}
            }
        }
    }

    /// Events until `done` holds of the ones so far (30 s at most).
    pub(crate) async fn until(
        &mut self,
        what: &str,
        done: impl Fn(&[Received]) -> bool,
    ) -> Vec<Received> {
        let mut got = Vec::new();
        let end = tokio::time::Instant::now() + Duration::from_secs(30);
        while !done(&got) {
            let left = end.saturating_duration_since(tokio::time::Instant::now());
            match self.next(left).await {
                Some(e) => got.push(e),
                None => panic!("{what}: not within 30 s; got {got:#?}"),
            }
        }
        got
    }
}

/// Whether `events` has request `id` in `state`.
pub(crate) fn has_request(events: &[Received], id: &str, state: &str) -> bool {
    (events.iter()).any(|e| e.event == "request" && e.data["id"] == id && e.data["state"] == state)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_stream_the_pools_changes_to_their_owners_and_resume_with_nothing_lost() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = serve_config(&sim, dir.path()).display().to_string();
    let server = Berth::start(&["--config", &config], dir.path()).await;
    server.until_label_ready(60, "small", 2, "two ready").await;
    let base = server.base.clone();

    let (status, mut admin) = Stream::open(&base, OPS, "", None).await;
    assert_eq!(status, 200);
    let (status, mut ci) = Stream::open(&base, CI, "?kinds=request", None).await;
    assert_eq!(status, 200);

    let theirs = server.request(OTHER, &[("small", 1)]).await;
    server.fulfilled(OTHER, &theirs.id).await;
    let mine = server.request(CI, &[("small", 1)]).await;
    let mine = server.fulfilled(CI, &mine.id).await;
    let node = mine.nodes[0].id.clone();

    // The admin sees every change: both requests, and the nodes handed out.
    let seen = admin
        .until(
            "the admin sees both requests fulfilled and the node in use",
            |e| {
                has_request(e, &theirs.id, "fulfilled")
                    && has_request(e, &mine.id, "fulfilled")
                    && (e.iter()).any(|e| {
                        e.event == "node"
                            && e.data["id"] == node.as_str()
                            && e.data["state"] == "in-use"
                    })
            },
        )
        .await;
    let in_use = (seen.iter())
        .find(|e| e.event == "node" && e.data["id"] == node.as_str() && e.data["state"] == "in-use")
        .unwrap();
    assert_eq!(in_use.data["requestor"], "ci", "{in_use:?}");
    // Every event has the next id: none left out.
    for pair in seen.windows(2) {
        assert_eq!(pair[1].seq(), pair[0].seq() + 1, "{pair:#?}");
    }

    // The client sees its own requests, and only them; no node events (it
    // asked for requests only).
    let own = ci
        .until("ci sees its request fulfilled", |e| {
            has_request(e, &mine.id, "fulfilled")
        })
        .await;
    assert!(
        own.iter()
            .all(|e| e.event == "request" && e.data["requestor"] == "ci"),
        "{own:#?}"
    );
    assert!(!has_request(&own, &theirs.id, "pending"), "{own:#?}");

    // The admin's stream drops after an event in the middle; meanwhile
    // ci releases its node. Resumed from that event's id, it gets every
    // event after it: those it had, and the release it missed.
    let cut = seen.len() / 2;
    let last = seen[cut].id.clone().unwrap();
    drop(admin);
    let (status, _) = http(
        &base,
        "POST",
        &format!("/v1/nodes/{node}/release"),
        Some(CI),
        None,
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    let (status, mut resumed) = Stream::open(&base, OPS, "", Some(&last)).await;
    assert_eq!(status, 200);
    let again = resumed
        .until("the resumed stream has the release", |e| {
            (e.iter()).any(|e| {
                e.event == "node" && e.data["id"] == node.as_str() && e.data["state"] != "in-use"
            })
        })
        .await;
    assert_eq!(
        again[..seen.len() - cut - 1],
        seen[cut + 1..],
        "the events after the id, as sent before"
    );
    assert_eq!(again[0].seq(), seen[cut].seq() + 1);
    for pair in again.windows(2) {
        assert_eq!(pair[1].seq(), pair[0].seq() + 1, "{pair:#?}");
    }

    // An id from elsewhere (another process, a restart): a reset first.
    let (_, mut elsewhere) = Stream::open(&base, OPS, "", Some("0badc0de-7")).await;
    let first = elsewhere
        .next(Duration::from_secs(10))
        .await
        .expect("an event");
    assert_eq!(first.event, "reset", "{first:?}");

    // A kind that is not one: 400, naming the field.
    let (status, body) = http(
        &base,
        "GET",
        "/v1/events?kinds=request,nodes",
        Some(OPS),
        None,
    )
    .await
    .unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("\"field\":\"kinds\""), "{body}");

    // The stream ends when berth stops (after the events of its stop), and
    // does not hold the stop up: the stop waits up to 10 s for answers in
    // progress, and a stream is not left to be one.
    server.signal(libc::SIGTERM);
    server
        .exit_within(Duration::from_secs(5))
        .await
        .assert_success();
    assert!(
        resumed.ends_within(Duration::from_secs(10)).await,
        "the stream goes on"
    );
}
