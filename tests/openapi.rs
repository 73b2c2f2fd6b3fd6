//! The OpenAPI document `berth serve` publishes, held to what the same
//! binary answers: the document parses as OpenAPI 3.1, every method the
//! router serves on a path is described there (any other is 405), and every
//! status an operation answers in a walk through the API is one the
//! document lists for it; so is every error code.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use crate::support::config::{CI, OPS, OTHER, serve_config_with};
use crate::support::server::{Berth, until};
use crate::support::{SimServer, plugin};

const METHODS: [&str; 5] = ["GET", "POST", "PUT", "DELETE", "PATCH"];

/// Statuses seen, per documented operation (method, path template).
type Seen = BTreeMap<(String, String), BTreeSet<u16>>;

struct Walk<'a> {
    server: &'a Berth,
    doc: &'a Value,
    codes: BTreeSet<String>,
    seen: Seen,
}

impl Walk<'_> {
    /// [`Walk::call`] for each `(method, template, path, token, body)`.
    async fn each(&mut self, calls: Vec<(&str, &str, String, &str, Option<Value>)>) {
        for (method, template, path, token, body) in calls {
            self.call(method, template, &path, Some(token), body).await;
        }
    }

    /// Calls `method path` and records its status against the operation
    /// `template` names; checks the status and any error code are documented.
    async fn call(
        &mut self,
        method: &str,
        template: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let (status, v) = self.server.call(method, path, token, body).await;
        self.record(method, template, path, status, v)
    }

    /// `POST /v1/requests` with `body` and an `Idempotency-Key`.
    async fn post_keyed(&mut self, key: &str, body: Value) -> (u16, Value) {
        let (status, v) = crate::schedulers::post_keyed(self.server, CI, key, &body).await;
        self.record("POST", "/v1/requests", "/v1/requests", status, v)
    }

    /// Checks an answer against the document, and notes its status as seen.
    fn record(
        &mut self,
        method: &str,
        template: &str,
        path: &str,
        status: u16,
        v: Value,
    ) -> (u16, Value) {
        let op = &self.doc["paths"][template][method.to_ascii_lowercase()];
        assert!(op.is_object(), "{method} {template} is not documented");
        assert!(
            op["responses"][status.to_string()].is_object(),
            "{method} {path} answered {status}, which the document does not list for {method} {template}: {v}"
        );
        if let Some(code) = v["error"]["code"].as_str() {
            assert!(
                self.codes.contains(code),
                "{method} {path}: error code `{code}` is not in the document's ErrorCode"
            );
        }
        self.seen
            .entry((method.to_owned(), template.to_owned()))
            .or_default()
            .insert(status);
        (status, v)
    }
}

/// Every `$ref` in `v`.
fn collect_refs<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get("$ref") {
                out.push(r);
            }
            m.values().for_each(|v| collect_refs(v, out));
        }
        Value::Array(a) => a.iter().for_each(|v| collect_refs(v, out)),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_published_document_describes_every_route_and_status_the_binary_serves() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    // A limit, so that a request for more than it is unsatisfiable.
    let config = serve_config_with(
        &sim,
        dir.path(),
        &plugin("sim"),
        "min-ready = 2",
        "[providers.sim.limits]\nmax-instances = 50\n",
    );
    let cfg = config.display().to_string();
    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    server.until_ready(30, "ready").await;

    let (status, doc) = server.call("GET", "/openapi.json", None, None).await;
    assert_eq!(status, 200);
    let spec = oas3::from_json(doc.to_string()).expect("the document parses as OpenAPI");
    assert!(spec.openapi.starts_with("3.1"), "{}", spec.openapi);
    let paths = spec.paths.as_ref().expect("paths");
    let documented: BTreeSet<(String, String)> = paths
        .iter()
        .flat_map(|(path, item)| {
            item.methods()
                .into_iter()
                .map(move |(m, _)| (m.as_str().to_owned(), path.clone()))
        })
        .collect();
    assert_eq!(documented.len(), 22, "{documented:?}");
    // Every reference points at something the document holds.
    let mut refs = Vec::new();
    collect_refs(&doc, &mut refs);
    assert!(refs.len() > 50, "{} refs", refs.len());
    for r in refs {
        let target = r
            .strip_prefix('#')
            .and_then(|pointer| doc.pointer(pointer))
            .unwrap_or(&Value::Null);
        assert!(target.is_object(), "`{r}` resolves to nothing");
    }
    let codes: BTreeSet<String> = doc["components"]["schemas"]["ErrorCode"]["enum"]
        .as_array()
        .expect("ErrorCode enum")
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect();

    // Every method the router serves on a documented path is documented:
    // any other is 405. An undocumented path is 404.
    for path in paths.keys() {
        let concrete = path
            .replace("{id}", "x")
            .replace("/v1/requests/x", "/v1/requests/r-0000000000000001")
            .replace("/v1/nodes/x", "/v1/nodes/n-0000000000000001");
        for method in METHODS {
            if documented.contains(&(method.to_owned(), path.clone())) {
                continue;
            }
            let (status, e) = server.call(method, &concrete, Some(OPS), None).await;
            assert_eq!(
                status, 405,
                "{method} {concrete} is served but not documented: {e}"
            );
        }
    }
    for path in ["/v1", "/v1/requests/r-0000000000000001/x", "/v2/nodes"] {
        assert_eq!(server.call("GET", path, Some(OPS), None).await.0, 404);
    }

    let mut walk = Walk {
        server: &server,
        doc: &doc,
        codes,
        seen: Seen::new(),
    };
    // Each operation without a token, with a malformed id, an unknown id,
    // and an unknown query parameter.
    for (method, template) in &documented {
        let unknown = template
            .replace("/v1/requests/{id}", "/v1/requests/r-0000000000000001")
            .replace("/v1/nodes/{id}", "/v1/nodes/n-0000000000000001");
        let body = match (method.as_str(), template.as_str()) {
            ("POST", "/v1/requests") => Some(json!({"labels": {"small": 1}})),
            ("PUT", _) => Some(json!({"idle": "hold"})),
            _ => None,
        };
        walk.call(method, template, &unknown, None, body.clone())
            .await;
        if template.contains("{id}") {
            walk.call(method, template, &unknown, Some(OPS), body.clone())
                .await;
            let malformed = template.replace("{id}", "x");
            walk.call(method, template, &malformed, Some(OPS), body.clone())
                .await;
        }
        walk.call(
            method,
            template,
            &format!("{unknown}?nope=1"),
            Some(OPS),
            body,
        )
        .await;
    }

    // A walk through the API as clients and an operator use it.
    let (s, r) = walk
        .call(
            "POST",
            "/v1/requests",
            "/v1/requests",
            Some(CI),
            Some(json!({"labels": {"small": 1}})),
        )
        .await;
    assert_eq!(s, 201, "{r}");
    let rid = r["id"].as_str().unwrap().to_owned();
    let rpath = format!("/v1/requests/{rid}");
    let (s, r) = walk
        .call(
            "GET",
            "/v1/requests/{id}",
            &format!("{rpath}?wait=20s"),
            Some(CI),
            None,
        )
        .await;
    assert_eq!((s, r["state"].as_str()), (200, Some("fulfilled")), "{r}");
    let nid = r["nodes"][0]["id"].as_str().unwrap().to_owned();
    let npath = format!("/v1/nodes/{nid}");
    let bad_bodies = [
        json!({"labels": {"small": 0}}),
        json!({"labels": {"huge": 1}}),
        json!({"labels": {"small": 9999}}),
        json!({"labels": {"small": 1}, "requestor": "other"}),
    ];
    for body in bad_bodies {
        let (s, e) = walk
            .call("POST", "/v1/requests", "/v1/requests", Some(CI), Some(body))
            .await;
        assert!((400..500).contains(&s), "{s} {e}");
    }
    // A key given again: the request it made (200); with another body,
    // refused (422).
    let keyed = json!({"labels": {"small": 1}, "metadata": {"walk": "1"}});
    let (s, made) = walk.post_keyed("walk-1", keyed.clone()).await;
    assert_eq!(s, 201, "{made}");
    let (s, again) = walk.post_keyed("walk-1", keyed).await;
    assert_eq!((s, &again["id"]), (200, &made["id"]), "{again}");
    let (s, e) = walk
        .post_keyed("walk-1", json!({"labels": {"small": 2}}))
        .await;
    assert_eq!(s, 422, "{e}");
    let (s, e) = walk
        .call(
            "DELETE",
            "/v1/requests/{id}",
            &format!("/v1/requests/{}", made["id"].as_str().unwrap()),
            Some(CI),
            None,
        )
        .await;
    assert!(s == 200 || s == 409, "{s} {e}");
    walk.each(vec![
        (
            "GET",
            "/v1/requests",
            "/v1/requests?state=pending".into(),
            CI,
            None,
        ),
        (
            "GET",
            "/v1/requests",
            "/v1/requests?state=soon".into(),
            CI,
            None,
        ),
        ("GET", "/v1/requests/{id}", rpath.clone(), OTHER, None),
        ("DELETE", "/v1/requests/{id}", rpath.clone(), OTHER, None),
        ("DELETE", "/v1/requests/{id}", rpath.clone(), CI, None),
    ])
    .await;
    for state in doc["paths"]["/v1/nodes"]["get"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "state")
        .unwrap()["schema"]["enum"]
        .as_array()
        .unwrap()
    {
        let (s, e) = walk
            .call(
                "GET",
                "/v1/nodes",
                &format!("/v1/nodes?state={}", state.as_str().unwrap()),
                Some(CI),
                None,
            )
            .await;
        assert_eq!(s, 200, "documented state {state} refused: {e}");
    }
    for filter in ["state=soon", "label=huge", "provider=elsewhere"] {
        walk.call(
            "GET",
            "/v1/nodes",
            &format!("/v1/nodes?{filter}"),
            Some(CI),
            None,
        )
        .await;
    }
    let release = format!("{npath}/release");
    let idle = format!("{npath}/idle");
    let set = |idle: &str| Some(json!({ "idle": idle }));
    walk.each(vec![
        ("GET", "/v1/nodes/{id}", npath.clone(), OTHER, None),
        (
            "POST",
            "/v1/nodes/{id}/release",
            release.clone(),
            OTHER,
            None,
        ),
        ("PUT", "/v1/nodes/{id}/idle", idle.clone(), CI, set("hold")),
        (
            "PUT",
            "/v1/nodes/{id}/idle",
            idle.clone(),
            OPS,
            set("sleep"),
        ),
        ("PUT", "/v1/nodes/{id}/idle", idle.clone(), OPS, set("run")),
        ("POST", "/v1/nodes/{id}/release", release.clone(), CI, None),
        ("POST", "/v1/nodes/{id}/release", release, CI, None),
    ])
    .await;
    // A node gone for good takes no idle behaviour.
    until(30, "the released node to be gone", || async {
        let (_, n) = server.call("GET", &npath, Some(OPS), None).await;
        (n["state"] == "gone").then_some(())
    })
    .await;
    let (s, e) = walk
        .call(
            "PUT",
            "/v1/nodes/{id}/idle",
            &idle,
            Some(OPS),
            Some(json!({"idle": "hold"})),
        )
        .await;
    assert_eq!(s, 409, "{e}");
    walk.call("DELETE", "/v1/nodes/{id}", &npath, Some(CI), None)
        .await;
    // An operator deletes a ready node, then again.
    let ready = until(30, "a ready node", || async {
        let (_, list) = server
            .call("GET", "/v1/nodes?state=ready", Some(OPS), None)
            .await;
        list[0]["id"].as_str().map(str::to_owned)
    })
    .await;
    let rpath = format!("/v1/nodes/{ready}");
    for _ in 0..2 {
        walk.call("DELETE", "/v1/nodes/{id}", &rpath, Some(OPS), None)
            .await;
    }
    // A request still pending (nothing boots for a minute) is cancelled. It
    // asks for more nodes than the pool has in any state, so that no timing
    // of boots and deletes before it can fulfil it at once.
    sim.cloud
        .set_knobs(berth::sim::Knobs {
            boot_delay_ms: 60_000,
            ..Default::default()
        })
        .expect("knobs");
    let (s, all) = server.call("GET", "/v1/nodes", Some(OPS), None).await;
    assert_eq!(s, 200, "{all}");
    let more = 1 + all
        .as_array()
        .expect("a list of nodes")
        .iter()
        .filter(|n| n["state"] != "gone")
        .count();
    let (s, r) = walk
        .call(
            "POST",
            "/v1/requests",
            "/v1/requests",
            Some(CI),
            Some(json!({"labels": {"small": more}})),
        )
        .await;
    assert_eq!((s, r["state"].as_str()), (201, Some("pending")), "{r}");
    let pending = format!("/v1/requests/{}", r["id"].as_str().unwrap());
    let (s, r) = walk
        .call("DELETE", "/v1/requests/{id}", &pending, Some(CI), None)
        .await;
    assert_eq!((s, r["state"].as_str()), (200, Some("cancelled")), "{r}");
    walk.call("POST", "/v1/lease", "/v1/lease", Some(CI), None)
        .await;
    // The event stream does not end: its status is read from the answer's
    // first line.
    let streaming = first_status(&server.base, "/v1/events?kinds=node", OPS).await;
    assert_eq!(streaming, 200);
    (walk
        .seen
        .entry(("GET".into(), "/v1/events".into()))
        .or_default())
    .insert(streaming);
    walk.call(
        "POST",
        "/v1/lease",
        "/v1/lease?requestor=other",
        Some(CI),
        None,
    )
    .await;
    // Driver reloads and rollbacks are an admin's; this pool's driver file
    // has not changed, so there is nothing to roll back to.
    let rollback = "/v1/drivers/{provider}/rollback";
    walk.each(vec![
        (
            "POST",
            "/v1/drivers/reload",
            "/v1/drivers/reload".into(),
            CI,
            None,
        ),
        (
            "POST",
            "/v1/drivers/reload",
            "/v1/drivers/reload".into(),
            OPS,
            None,
        ),
        (
            "POST",
            rollback,
            "/v1/drivers/sim/rollback".into(),
            CI,
            None,
        ),
        (
            "POST",
            rollback,
            "/v1/drivers/sim/rollback".into(),
            OPS,
            None,
        ),
        (
            "POST",
            rollback,
            "/v1/drivers/elsewhere/rollback".into(),
            OPS,
            None,
        ),
    ])
    .await;
    let check = "/v1/config/check";
    let text = |t: &str| Some(json!({ "text": t }));
    walk.each(vec![
        ("POST", check, check.into(), CI, text("")),
        (
            "POST",
            check,
            check.into(),
            OPS,
            text("pool-id = \"other\""),
        ),
        ("POST", check, check.into(), OPS, Some(json!({"txt": ""}))),
    ])
    .await;
    // The file read again as it is: nothing to change.
    let reload = "/v1/config/reload";
    walk.each(vec![
        ("POST", reload, reload.into(), CI, None),
        ("POST", reload, reload.into(), OPS, None),
    ])
    .await;
    for path in [
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
        "/v1/labels",
        "/v1/providers",
        "/v1/drivers",
    ] {
        walk.call("GET", path, path, Some(CI), None).await;
    }

    // Every documented status was seen, but those the walk cannot
    // provoke: a stop or a full disk or queue (503), and a request
    // forgotten between its commit and its answer (404).
    let seen = walk.seen;
    for (method, path) in &documented {
        let op = &doc["paths"][path][method.to_ascii_lowercase()];
        let listed: BTreeSet<u16> = op["responses"]
            .as_object()
            .unwrap()
            .keys()
            .map(|s| s.parse().unwrap())
            .collect();
        let mut unseen: BTreeSet<u16> = listed
            .difference(&seen[&(method.clone(), path.clone())])
            .copied()
            .collect();
        unseen.remove(&503);
        if (method.as_str(), path.as_str()) == ("POST", "/v1/requests") {
            unseen.remove(&404);
        }
        // A rollback that succeeds needs a driver switched first
        // (tests/reload.rs).
        if (method.as_str(), path.as_str()) == ("POST", rollback) {
            unseen.remove(&200);
        }
        // Only the embedded default runs with no config file to compare.
        if (method.as_str(), path.as_str()) == ("POST", check)
            || (method.as_str(), path.as_str()) == ("POST", reload)
        {
            unseen.remove(&409);
        }
        assert!(
            unseen.is_empty(),
            "{method} {path}: documented statuses never answered in the walk: {unseen:?} (seen {:?})",
            seen[&(method.clone(), path.clone())]
        );
    }
    server.terminate().await.assert_success();
}

/// The status of `GET path` as `token`, from the answer's first line, for
/// an answer that does not end (a stream).
async fn first_status(base: &str, path: &str, token: &str) -> u16 {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let addr = base.strip_prefix("http://").expect("http url");
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req =
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\r\n");
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut line = String::new();
    tokio::io::BufReader::new(tcp)
        .read_line(&mut line)
        .await
        .unwrap();
    line.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{line:?}"))
}
