//! The fake Nova over real HTTP, as a client of Nova sees it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request as HttpRequest};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

use super::*;
use crate::common::fixed_tokens;

const TOKEN: &str = "gAAAAB-fake-token";

struct Client {
    base: String,
    token: Option<String>,
    version: Option<String>,
    http: HyperClient<HttpConnector, Full<Bytes>>,
}

/// An answer: status, headers, body as JSON (`Null` when empty).
struct Got {
    status: u16,
    headers: HeaderMap,
    body: Value,
}

impl Client {
    fn new(nova: &Nova) -> Client {
        Client {
            base: nova.compute_url(),
            token: Some(TOKEN.into()),
            version: Some("compute 2.38".into()),
            http: HyperClient::builder(TokioExecutor::new()).build_http(),
        }
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Got {
        let mut req = HttpRequest::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.header("x-auth-token", t);
        }
        if let Some(v) = &self.version {
            req = req.header("openstack-api-version", v);
        }
        let bytes = body.map(|b| b.to_string()).unwrap_or_default();
        if !bytes.is_empty() {
            req = req.header("content-type", "application/json");
        }
        let req = req.body(Full::new(Bytes::from(bytes))).expect("request");
        let resp = self.http.request(req).await.expect("an answer");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        let body = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&body).unwrap_or_else(|e| panic!("{e}: {body:?}"))
        };
        Got {
            status,
            headers,
            body,
        }
    }

    async fn create(&self, name: &str, metadata: Value) -> Got {
        self.call(
            "POST",
            "/servers",
            Some(json!({"server": {
                "name": name,
                "flavorRef": "2",
                "imageRef": IMAGE_ID,
                "networks": [{"uuid": NETWORK_ID}],
                "metadata": metadata,
            }})),
        )
        .await
    }

    /// Creates a server named `name`; its id.
    async fn made(&self, name: &str) -> String {
        let got = self.create(name, json!({"berth-pool": "p"})).await;
        assert_eq!(got.status, 202, "{}", got.body);
        got.body["server"]["id"].as_str().expect("an id").to_owned()
    }

    async fn server(&self, id: &str) -> Got {
        self.call("GET", &format!("/servers/{id}"), None).await
    }
}

async fn nova_with(config: NovaConfig) -> Nova {
    let tokens = fixed_tokens(Arc::new(Mutex::new(vec![TOKEN.to_owned()])));
    Nova::start_with(config, tokens).await
}

/// A cloud whose builds and deletes take a second: long enough to be seen
/// on a busy machine, short enough to wait out.
async fn nova() -> Nova {
    nova_with(NovaConfig {
        boot_time: Duration::from_secs(1),
        delete_time: Duration::from_secs(1),
        ..NovaConfig::default()
    })
    .await
}

/// Polls `check` every 10 ms until it holds, for at most 10 s.
async fn until<F: std::future::Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(
            tokio::time::Instant::now() < end,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls server `id` until its status is `status`; the server then.
async fn until_status(c: &Client, id: &str, status: &str) -> Value {
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let server = c.server(id).await.body["server"].clone();
        if server["status"] == status {
            return server;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "{id} is not {status}: {server}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_request_without_a_live_token_gets_keystones_401() {
    let nova = nova().await;
    let mut c = Client::new(&nova);
    c.token = None;
    let got = c.call("GET", "/servers/detail", None).await;
    assert_eq!(got.status, 401);
    assert_eq!(got.body["error"]["message"], UNAUTHORIZED);
    assert_eq!(got.body["error"]["code"], 401);
    assert!(
        (got.headers
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok()))
        .is_some_and(|v| v.starts_with("Keystone uri="))
    );
    c.token = Some("stolen".into());
    assert_eq!(
        c.call("POST", "/servers", Some(json!({}))).await.status,
        401
    );
    assert!(nova.machines().is_empty());
    // Counted all the same.
    assert_eq!(nova.knobs().count("servers.detail"), 1);
    assert_eq!(nova.knobs().count("servers.create"), 1);
}

#[tokio::test]
async fn a_server_builds_then_runs_with_its_metadata_and_addresses() {
    let nova = nova().await;
    let c = Client::new(&nova);
    let got = c
        .create("n-0001", json!({"berth-pool": "p", "berth-node": "n-0001"}))
        .await;
    assert_eq!(got.status, 202, "{}", got.body);
    let id = got.body["server"]["id"].as_str().expect("id").to_owned();
    assert!(got.body["server"]["adminPass"].is_string());
    let location = got.headers.get("location").and_then(|v| v.to_str().ok());
    assert_eq!(
        location,
        Some(format!("{}/servers/{id}", nova.compute_url()).as_str())
    );
    assert_eq!(
        got.headers
            .get("openstack-api-version")
            .and_then(|v| v.to_str().ok()),
        Some("compute 2.38")
    );

    let building = c.server(&id).await.body["server"].clone();
    assert_eq!(building["status"], "BUILD", "{building}");
    assert_eq!(building["OS-EXT-STS:vm_state"], "building");
    assert!(building["OS-EXT-STS:task_state"].is_string());
    assert_eq!(building["addresses"], json!({}));
    assert_eq!(building["flavor"]["id"], "2");

    let active = until_status(&c, &id, "ACTIVE").await;
    assert_eq!(active["OS-EXT-STS:task_state"], Value::Null);
    assert_eq!(active["metadata"]["berth-node"], "n-0001");
    assert_eq!(active["addresses"]["private"][0]["version"], 4);
    assert!(
        active["addresses"]["private"][0]["addr"]
            .as_str()
            .is_some_and(|a| a.starts_with("10.0."))
    );
    assert!(active["OS-SRV-USG:launched_at"].is_string());
    assert!(
        active["created"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z') && t.len() == 20)
    );

    let listed = c.call("GET", "/servers/detail", None).await;
    assert_eq!(listed.body["servers"][0]["id"], id.as_str());
    assert_eq!(listed.body["servers"][0]["metadata"]["berth-pool"], "p");
    assert!(listed.body.get("servers_links").is_none());
    let summary = c.call("GET", "/servers", None).await;
    assert_eq!(
        summary.body["servers"][0],
        json!({
            "id": id,
            "name": "n-0001",
            "links": summary.body["servers"][0]["links"].clone(),
        })
    );

    let machines = nova.machines();
    assert_eq!(machines.len(), 1);
    assert_eq!(
        (machines[0].status.as_str(), machines[0].deleted),
        ("ACTIVE", false)
    );
    assert_eq!(machines[0].tag("berth-pool"), Some("p"));
}

#[tokio::test]
async fn create_checks_its_body_as_nova_does() {
    let nova = nova().await;
    let c = Client::new(&nova);
    let base = json!({
        "name": "a",
        "flavorRef": "2",
        "imageRef": IMAGE_ID,
        "networks": "auto",
    });
    let with = |k: &str, v: Value| {
        let mut s = base.clone();
        s[k] = v;
        json!({ "server": s })
    };
    let without = |k: &str| {
        let mut s = base.clone();
        s.as_object_mut().expect("object").remove(k);
        json!({ "server": s })
    };
    for (body, status, needle) in [
        (
            with("flavorRef", json!("9")),
            400,
            "Flavor 9 could not be found.",
        ),
        (
            with("imageRef", json!("nope")),
            400,
            "Can not find requested image",
        ),
        (without("imageRef"), 400, "Missing imageRef attribute"),
        (
            without("networks"),
            400,
            "'networks' is a required property",
        ),
        (without("name"), 400, "'name' is a required property"),
        (
            with("name", json!(" a")),
            400,
            "Can not start or end with whitespace",
        ),
        (
            with("networks", json!([{"uuid": "x"}])),
            400,
            "Network x could not be found.",
        ),
        (
            with("key_name", json!("nokey")),
            400,
            "Invalid key_name provided.",
        ),
        (
            with("user_data", json!("not base64!")),
            400,
            "is not a 'base64'",
        ),
        (
            with("user_data", json!("A".repeat(MAX_USER_DATA + 1))),
            400,
            "user_data",
        ),
        (
            with("metadata", json!({"k": "v".repeat(256)})),
            400,
            "is too long",
        ),
        (
            with("metadata", json!({"k/x": "v"})),
            400,
            "'k/x' was unexpected",
        ),
        (with("surprise", json!(1)), 400, "'surprise' was unexpected"),
        (
            with("security_groups", json!([{"name": "web"}])),
            400,
            "Security group web not found.",
        ),
        (
            with("availability_zone", json!("mars")),
            400,
            "availability zone is not available",
        ),
    ] {
        let got = c.call("POST", "/servers", Some(body.clone())).await;
        assert_eq!(got.status, status, "{body}: {}", got.body);
        let fault = got.body["badRequest"]["message"]
            .as_str()
            .unwrap_or_default();
        assert!(fault.contains(needle), "{body}: {}", got.body);
        assert_eq!(got.body["badRequest"]["code"], 400);
    }
    let many: Map<String, Value> = (0..129).map(|i| (format!("k{i}"), json!("v"))).collect();
    let got = c
        .call(
            "POST",
            "/servers",
            Some(with("metadata", Value::Object(many))),
        )
        .await;
    assert_eq!(got.status, 403, "{}", got.body);
    assert_eq!(
        got.body["forbidden"]["message"],
        "Maximum number of metadata items exceeds 128"
    );
    assert!(nova.machines().is_empty());

    // Good user data, and names Nova lets two servers share.
    let ok = with("user_data", json!("IyEvYmluL3NoCg=="));
    assert_eq!(
        c.call("POST", "/servers", Some(ok.clone())).await.status,
        202
    );
    assert_eq!(c.call("POST", "/servers", Some(ok)).await.status, 202);
    let names: Vec<String> = nova.machines().into_iter().map(|m| m.name).collect();
    assert_eq!(names, ["a", "a"]);
    let id = &nova.machines()[0].id;
    assert_eq!(nova.user_data(id).as_deref(), Some("IyEvYmluL3NoCg=="));

    // Before 2.37 the networks may be left out: the only one is taken.
    let mut old = Client::new(&nova);
    old.version = None;
    assert_eq!(
        old.call("POST", "/servers", Some(without("networks")))
            .await
            .status,
        202
    );
}

#[tokio::test]
async fn quota_is_counted_and_refused_in_novas_words() {
    let nova = nova().await;
    nova.set_quota(Quota {
        instances: 2,
        ..Quota::default()
    });
    let c = Client::new(&nova);
    let a = c.made("a").await;
    c.made("b").await;
    let got = c.create("c", json!({})).await;
    assert_eq!(got.status, 403, "{}", got.body);
    assert_eq!(
        got.body,
        json!({"forbidden": {"code": 403, "message": "Quota exceeded for instances: Requested 1, but already used 2 of 2 instances"}})
    );
    let limits = c.call("GET", "/limits", None).await.body;
    let absolute = &limits["limits"]["absolute"];
    assert_eq!(absolute["maxTotalInstances"], 2);
    assert_eq!(absolute["totalInstancesUsed"], 2);
    assert_eq!(absolute["totalCoresUsed"], 2);
    assert_eq!(absolute["totalRAMUsed"], 4096);
    assert_eq!(absolute["maxServerMeta"], 128);
    // A server being deleted still counts; once gone it no longer does.
    assert_eq!(
        c.call("DELETE", &format!("/servers/{a}"), None)
            .await
            .status,
        204
    );
    assert_eq!(c.create("c", json!({})).await.status, 403);
    until("the server to be gone", || async {
        c.server(&a).await.status == 404
    })
    .await;
    assert_eq!(c.create("c", json!({})).await.status, 202);
    // Cores too.
    nova.set_quota(Quota {
        cores: 2,
        ..Quota::default()
    });
    let got = c.create("d", json!({})).await;
    assert_eq!(
        got.body["forbidden"]["message"],
        "Quota exceeded for cores: Requested 1, but already used 2 of 2 cores"
    );
}

#[tokio::test]
async fn lists_page_with_limit_and_marker_and_filter_by_name_and_status() {
    // Builds that outlast the test; deletes of a moment.
    let nova = nova_with(NovaConfig {
        max_limit: 3,
        boot_time: Duration::from_secs(3600),
        delete_time: Duration::from_millis(50),
        ..NovaConfig::default()
    })
    .await;
    let c = Client::new(&nova);
    let mut ids = Vec::new();
    for i in 0..7 {
        ids.push(c.made(&format!("web-{i}")).await);
    }
    c.made("db-0").await;
    // Every page through the `next` links: pages of three at most (the
    // limit asked is cut to max_limit), each server once.
    let mut seen = Vec::new();
    let mut path = "/servers/detail?name=%5Eweb-&limit=50".to_owned();
    let mut pages = 0;
    loop {
        let got = c.call("GET", &path, None).await;
        assert_eq!(got.status, 200, "{}", got.body);
        let servers = got.body["servers"].as_array().expect("servers").clone();
        assert!(servers.len() <= 3);
        seen.extend(
            servers
                .iter()
                .map(|s| s["id"].as_str().expect("id").to_owned()),
        );
        pages += 1;
        let Some(next) = got.body["servers_links"][0]["href"].as_str() else {
            break;
        };
        assert_eq!(got.body["servers_links"][0]["rel"], "next");
        let next = next
            .strip_prefix(&nova.compute_url())
            .expect("a link of the cloud");
        assert!(
            next.contains("name=%5Eweb-") && next.contains("limit=50"),
            "{next}"
        );
        path = next.to_owned();
    }
    assert_eq!(pages, 3);
    let asked: Vec<String> = (nova.requests().into_iter())
        .filter(|r| r.starts_with("GET /v2.1/servers/detail?") && r.contains("name=%5Eweb-"))
        .collect();
    assert_eq!(asked.len(), 3, "{asked:?}");
    assert!(
        asked[1].contains(&format!("marker={}", seen[2])),
        "{asked:?}"
    );
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(sorted, want);
    // Newest first (by whole second, then id, both descending).
    assert_eq!(seen.len(), 7);

    // A page exactly full has a next link; the page after is empty.
    let two = c
        .call("GET", "/servers?limit=3&name=%5Eweb-%5B0-2%5D%24", None)
        .await;
    assert_eq!(two.body["servers"].as_array().map(Vec::len), Some(3));
    let next = two.body["servers_links"][0]["href"]
        .as_str()
        .expect("next")
        .to_owned();
    let next = next.strip_prefix(&nova.compute_url()).expect("link");
    let after = c.call("GET", next, None).await;
    assert_eq!(after.body["servers"], json!([]));
    assert!(after.body.get("servers_links").is_none());

    let got = c.call("GET", "/servers?marker=nope", None).await;
    assert_eq!(got.status, 400);
    assert_eq!(got.body["badRequest"]["message"], "marker [nope] not found");
    assert_eq!(c.call("GET", "/servers?limit=-1", None).await.status, 400);
    assert_eq!(c.call("GET", "/servers?limit=x", None).await.status, 400);
    assert_eq!(c.call("GET", "/servers?name=%28", None).await.status, 400);
    // A regular expression, searched: `eb-` finds the seven, a page of
    // them.
    let got = c
        .call("GET", "/servers/detail?name=eb-&limit=100", None)
        .await;
    assert_eq!(got.body["servers"].as_array().map(Vec::len), Some(3));
    let got = c.call("GET", "/servers?name=%5Edb-0%24", None).await;
    assert_eq!(got.body["servers"][0]["name"], "db-0");

    let building = c.call("GET", "/servers?status=BUILD", None).await;
    assert_eq!(building.body["servers"].as_array().map(Vec::len), Some(3));
    let active = c.call("GET", "/servers?status=active", None).await;
    assert_eq!(active.body["servers"], json!([]));
    let got = c.call("GET", "/servers?status=WHATEVER", None).await;
    assert_eq!(got.status, 400);
    assert_eq!(got.body["badRequest"]["message"], "Invalid status value");

    // A marker may be a server deleted since.
    let first = c.call("GET", "/servers?limit=1", None).await;
    let marker = first.body["servers"][0]["id"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_eq!(
        c.call("DELETE", &format!("/servers/{marker}"), None)
            .await
            .status,
        204
    );
    until("the marker to be gone", || async {
        c.server(&marker).await.status == 404
    })
    .await;
    let got = c
        .call("GET", &format!("/servers?marker={marker}"), None)
        .await;
    assert_eq!(got.status, 200, "{}", got.body);
}

#[tokio::test]
async fn metadata_waits_for_the_build_and_a_delete_is_asynchronous() {
    let nova = nova().await;
    let c = Client::new(&nova);
    let id = c.made("a").await;
    let meta = format!("/servers/{id}/metadata");
    let got = c
        .call("PUT", &meta, Some(json!({"metadata": {"k": "v"}})))
        .await;
    assert_eq!(got.status, 409, "{}", got.body);
    assert_eq!(
        got.body["conflictingRequest"]["message"],
        format!("Cannot 'update metadata' instance {id} while it is in vm_state building")
    );
    until_status(&c, &id, "ACTIVE").await;

    let got = c
        .call(
            "PUT",
            &meta,
            Some(json!({"metadata": {"k": "v", "other": "x"}})),
        )
        .await;
    assert_eq!(got.body, json!({"metadata": {"k": "v", "other": "x"}}));
    assert_eq!(
        nova.machines()[0].tags.get("berth-pool"),
        None,
        "replaced all"
    );
    let got = c
        .call(
            "POST",
            &meta,
            Some(json!({"metadata": {"k": "w", "n": "1"}})),
        )
        .await;
    assert_eq!(
        got.body,
        json!({"metadata": {"k": "w", "n": "1", "other": "x"}})
    );
    let got = c.call("GET", &format!("{meta}/k"), None).await;
    assert_eq!(got.body, json!({"meta": {"k": "w"}}));
    let got = c
        .call(
            "PUT",
            &format!("{meta}/z"),
            Some(json!({"meta": {"k": "1"}})),
        )
        .await;
    assert_eq!(
        got.body["badRequest"]["message"],
        "Request body and URI mismatch"
    );
    let got = c
        .call(
            "PUT",
            &format!("{meta}/z"),
            Some(json!({"meta": {"z": "1"}})),
        )
        .await;
    assert_eq!(got.body, json!({"meta": {"z": "1"}}));
    assert_eq!(
        c.call("DELETE", &format!("{meta}/other"), None)
            .await
            .status,
        204
    );
    let got = c.call("DELETE", &format!("{meta}/other"), None).await;
    assert_eq!(got.status, 404);
    assert_eq!(
        got.body["itemNotFound"]["message"],
        "Metadata item was not found"
    );
    let got = c.call("GET", &meta, None).await;
    assert_eq!(
        got.body,
        json!({"metadata": {"k": "w", "n": "1", "z": "1"}})
    );
    let got = c
        .call("PUT", &meta, Some(json!({"metadata": {"k": 1}})))
        .await;
    assert_eq!(got.status, 400);
    assert_eq!(nova.knobs().count("metadata.replace"), 3);

    assert_eq!(
        c.call("DELETE", &format!("/servers/{id}"), None)
            .await
            .status,
        204
    );
    let deleting = c.server(&id).await.body["server"].clone();
    assert_eq!(deleting["OS-EXT-STS:task_state"], "deleting");
    assert_eq!(deleting["status"], "ACTIVE");
    let got = c
        .call("POST", &meta, Some(json!({"metadata": {"k": "v"}})))
        .await;
    assert_eq!(
        got.body["conflictingRequest"]["message"],
        format!("Cannot 'update metadata' instance {id} while it is in task_state deleting")
    );
    // Deleting again is accepted.
    assert_eq!(
        c.call("DELETE", &format!("/servers/{id}"), None)
            .await
            .status,
        204
    );
    until("the server to be gone", || async {
        c.server(&id).await.status == 404
    })
    .await;
    let got = c.server(&id).await;
    assert_eq!(
        got.body["itemNotFound"]["message"],
        format!("Instance {id} could not be found.")
    );
    assert_eq!(
        c.call("DELETE", &format!("/servers/{id}"), None)
            .await
            .status,
        404
    );
    assert_eq!(
        c.call("GET", "/servers/detail", None).await.body["servers"],
        json!([])
    );
    let m = &nova.machines()[0];
    assert!(m.deleted && m.status == "DELETED", "{m:?}");
}

#[tokio::test]
async fn a_build_can_end_in_error_with_its_fault() {
    let nova = nova().await;
    nova.fail_next_builds(1, BuildFault::no_valid_host());
    let c = Client::new(&nova);
    let failed = c.made("a").await;
    let fine = c.made("b").await;
    let server = until_status(&c, &failed, "ERROR").await;
    assert_eq!(server["fault"]["code"], 500);
    assert_eq!(server["fault"]["message"], NO_VALID_HOST);
    assert!(server["fault"]["created"].is_string());
    assert_eq!(server["OS-EXT-STS:vm_state"], "error");
    until_status(&c, &fine, "ACTIVE").await;
    let got = c
        .call(
            "PUT",
            &format!("/servers/{failed}/metadata"),
            Some(json!({"metadata": {}})),
        )
        .await;
    assert_eq!(got.status, 409);
    assert_eq!(nova.machines()[0].status, "ERROR");
}

#[tokio::test]
async fn a_lag_hides_new_servers_from_lists_and_name_filters_not_from_a_get() {
    let nova = nova().await;
    let c = Client::new(&nova);
    nova.knobs().set_lag(Duration::from_secs(600));
    let id = c.made("n-1").await;
    assert_eq!(
        c.call("GET", "/servers/detail", None).await.body["servers"],
        json!([])
    );
    assert_eq!(
        c.call("GET", "/servers?name=%5En-1%24", None).await.body["servers"],
        json!([])
    );
    assert_eq!(c.server(&id).await.status, 200);
    nova.knobs().set_lag(Duration::ZERO);
    assert_eq!(
        c.call("GET", "/servers?name=%5En-1%24", None).await.body["servers"][0]["id"],
        id.as_str()
    );
}

#[tokio::test]
async fn rate_limits_and_injected_answers_say_when_to_come_back() {
    let nova = nova().await;
    let c = Client::new(&nova);
    nova.knobs().inject("servers.create", over_limit(413, 5), 1);
    let got = c.create("a", json!({})).await;
    assert_eq!(got.status, 413);
    assert_eq!(got.body["overLimit"]["retryAfter"], "5");
    assert_eq!(
        got.headers.get("retry-after").and_then(|v| v.to_str().ok()),
        Some("5")
    );
    assert!(nova.machines().is_empty());
    assert_eq!(c.create("a", json!({})).await.status, 202);

    nova.set_rate_limit(Some((2, 429)));
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let got = c.call("GET", "/servers", None).await;
        statuses.push(got.status);
        if got.status == 429 {
            assert_eq!(got.body["overLimit"]["code"], 429);
            assert_eq!(
                got.body["overLimit"]["message"],
                "This request was rate-limited."
            );
            assert!(got.headers.contains_key("retry-after"));
        }
    }
    assert_eq!(statuses, [200, 200, 429]);
    nova.set_rate_limit(None);
    assert_eq!(nova.knobs().count("servers.create"), 2);
    assert_eq!(nova.knobs().count("servers.list"), 3);
}

#[tokio::test]
async fn a_held_answer_comes_after_the_server_exists() {
    let nova = nova().await;
    nova.knobs().hold("servers.create", Duration::from_secs(1));
    let c = Client::new(&nova);
    let pending = tokio::spawn({
        let c = Client::new(&nova);
        async move { c.create("a", json!({})).await.status }
    });
    until("the server to exist", || async {
        nova.machines().len() == 1
    })
    .await;
    assert!(!pending.is_finished());
    assert_eq!(pending.await.expect("create"), 202);
    nova.knobs().hold("servers.create", Duration::ZERO);
    assert_eq!(c.create("b", json!({})).await.status, 202);
}

#[tokio::test]
async fn microversions_choose_the_flavor_view_and_refuse_the_unknown() {
    let nova = nova().await;
    let mut c = Client::new(&nova);
    let id = c.made("a").await;
    c.version = Some("compute 2.47".into());
    let got = c.server(&id).await;
    assert_eq!(got.body["server"]["flavor"]["original_name"], "m1.small");
    assert_eq!(got.body["server"]["flavor"]["vcpus"], 1);
    c.version = None;
    let got = c.server(&id).await;
    assert_eq!(got.body["server"]["flavor"]["id"], "2");
    assert_eq!(
        (got.headers.get("openstack-api-version")).and_then(|v| v.to_str().ok()),
        Some("compute 2.1")
    );
    c.version = Some("compute 2.200".into());
    let got = c.server(&id).await;
    assert_eq!(got.status, 406);
    assert_eq!(
        got.body["notAcceptable"]["message"],
        "Version 2.200 is not supported by the API. Minimum is 2.1 and maximum is 2.104."
    );
    c.version = Some("compute two".into());
    assert_eq!(c.server(&id).await.status, 400);
    c.version = Some("compute latest".into());
    assert_eq!(c.server(&id).await.body["server"]["locked"], false);
}

#[test]
fn times_are_written_as_nova_writes_them() {
    let at = UNIX_EPOCH + Duration::from_micros(1_764_352_800_123_456);
    assert_eq!(iso(at, false), "2025-11-28T18:00:00Z");
    assert_eq!(iso(at, true), "2025-11-28T18:00:00.123456");
    assert_eq!(iso(UNIX_EPOCH, false), "1970-01-01T00:00:00Z");
    let id = uuid4();
    assert_eq!(id.len(), 36);
    assert_eq!(&id[14..15], "4");
}
