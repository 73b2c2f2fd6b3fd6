//! The fake Compute Engine over real HTTP, as a driver calls it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::BodyExt;
use serde_json::{Value, json};

use super::*;
use crate::common::fixed_tokens;

const TOKEN: &str = "ya29.test-token";
const P: &str = "berth-test-project";
const Z: &str = "us-central1-a";

async fn cloud(cfg: GceConfig) -> Gce {
    let tokens = Arc::new(Mutex::new(vec![TOKEN.to_owned()]));
    Gce::start(cfg, fixed_tokens(tokens)).await
}

fn quick() -> GceConfig {
    GceConfig {
        boot: Duration::from_millis(200),
        operation: Duration::from_millis(100),
        stop: Duration::from_millis(100),
        wait_max: Duration::from_millis(400),
        ..GceConfig::default()
    }
}

/// One request: the status and the JSON answer.
async fn call(
    gce: &Gce,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let stream = tokio::net::TcpStream::connect(gce.addr()).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let bytes = body.map(|b| b.to_string()).unwrap_or_default();
    let mut req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", gce.addr().to_string())
        .header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req
        .body(http_body_util::Full::new(bytes::Bytes::from(bytes)))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

async fn api(gce: &Gce, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    call(
        gce,
        method,
        &format!("/compute/v1/projects/{P}{path}"),
        Some(TOKEN),
        body,
    )
    .await
}

fn instance(name: &str, labels: Value) -> Value {
    json!({
        "name": name,
        "machineType": format!("zones/{Z}/machineTypes/e2-small"),
        "labels": labels,
        "disks": [{"boot": true, "autoDelete": true,
                   "initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
        "networkInterfaces": [{"network": "global/networks/default",
                               "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]}],
        "metadata": {"items": [{"key": "ssh-keys", "value": "berth:ssh-ed25519 AAAA test"}]},
    })
}

fn reason(v: &Value) -> &str {
    v["error"]["errors"][0]["reason"]
        .as_str()
        .unwrap_or_default()
}

async fn insert(gce: &Gce, name: &str, request: &str, labels: Value) -> (u16, Value) {
    let path = format!("/zones/{Z}/instances?requestId={request}");
    api(gce, "POST", &path, Some(instance(name, labels))).await
}

async fn wait_op(gce: &Gce, op: &Value) -> Value {
    let name = op["name"].as_str().expect("an operation name");
    let (status, v) = api(
        gce,
        "POST",
        &format!("/zones/{Z}/operations/{name}/wait"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{v}");
    v
}

const R1: &str = "3f2c1a4e-7b6d-8e9f-a0b1-c2d3e4f5a6b7";
const R2: &str = "4f2c1a4e-7b6d-8e9f-a0b1-c2d3e4f5a6b7";
const R3: &str = "5f2c1a4e-7b6d-8e9f-a0b1-c2d3e4f5a6b7";

#[tokio::test]
async fn a_call_without_a_live_token_is_refused_as_google_refuses_it() {
    let gce = cloud(quick()).await;
    let path = format!("/compute/v1/projects/{P}/zones/{Z}/instances");
    for token in [None, Some("ya29.someone-else")] {
        let (status, v) = call(&gce, "GET", &path, token, None).await;
        assert_eq!(status, 401, "{v}");
        assert_eq!(reason(&v), "authError", "{v}");
        assert_eq!(v["error"]["status"], "UNAUTHENTICATED");
    }
    assert_eq!(gce.knobs().count("instances.list"), 2);
    let (status, v) = call(
        &gce,
        "GET",
        "/compute/v1/projects/other/zones/us-central1-a/instances",
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!((status, reason(&v)), (404, "notFound"), "{v}");
}

#[tokio::test]
async fn an_insert_makes_one_instance_per_request_id_and_boots_it() {
    let gce = cloud(quick()).await;
    let (status, op) = insert(&gce, "vm-1", R1, json!({"berth-pool": "p"})).await;
    assert_eq!(status, 200, "{op}");
    assert_eq!(op["kind"], "compute#operation");
    assert_eq!(op["operationType"], "insert");
    assert!(
        matches!(op["status"].as_str(), Some("PENDING" | "RUNNING")),
        "{op}"
    );
    assert_eq!(op["clientOperationId"], R1);
    // Again with the same request id: the same operation, nothing more.
    let (status, again) = insert(&gce, "vm-1", R1, json!({"berth-pool": "p"})).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["name"], op["name"]);
    assert_eq!(gce.machines().len(), 1);
    assert_eq!(
        gce.request_ids(),
        [(R1.to_owned(), "insert", Some("vm-1".to_owned()))]
    );
    // Another request id for the same name: it exists already.
    let (status, v) = insert(&gce, "vm-1", R2, json!({})).await;
    assert_eq!((status, reason(&v)), (409, "alreadyExists"), "{v}");
    let done = wait_op(&gce, &op).await;
    assert_eq!(done["status"], "DONE", "{done}");
    assert!(done.get("error").is_none(), "{done}");
    let (status, i) = api(&gce, "GET", &format!("/zones/{Z}/instances/vm-1"), None).await;
    assert_eq!(status, 200, "{i}");
    assert!(
        matches!(i["status"].as_str(), Some("PROVISIONING" | "STAGING")),
        "{i}"
    );
    assert_eq!(i["labels"]["berth-pool"], "p");
    assert!(
        i["machineType"]
            .as_str()
            .unwrap()
            .ends_with("/machineTypes/e2-small")
    );
    assert!(
        i["networkInterfaces"][0]["accessConfigs"][0]["natIP"].is_string(),
        "{i}"
    );
    assert_eq!(i["metadata"]["items"][0]["key"], "ssh-keys");
    tokio::time::sleep(Duration::from_millis(250)).await;
    let (_, i) = api(&gce, "GET", &format!("/zones/{Z}/instances/vm-1"), None).await;
    assert_eq!(i["status"], "RUNNING", "{i}");
    assert_eq!(gce.knobs().count("instances.insert"), 3);
}

#[tokio::test]
async fn bad_creates_are_refused_naming_the_field() {
    let gce = cloud(quick()).await;
    for (name, labels, want) in [
        ("Bad_Name", json!({}), (400, "invalid")),
        ("vm", json!({"Env": "x"}), (400, "invalid")),
        ("vm", json!({"env": "Prod"}), (400, "invalid")),
        ("vm", json!({"env": "x".repeat(64)}), (400, "invalid")),
    ] {
        let (status, v) = insert(&gce, name, R1, labels).await;
        assert_eq!((status, reason(&v)), want, "{name}: {v}");
    }
    let mut body = instance("vm", json!({}));
    body["machineType"] = "zones/us-central1-a/machineTypes/e2-huge".into();
    let (status, v) = api(&gce, "POST", &format!("/zones/{Z}/instances"), Some(body)).await;
    assert_eq!((status, reason(&v)), (400, "invalid"), "{v}");
    let mut body = instance("vm", json!({}));
    body["disks"][0]["initializeParams"]["sourceImage"] = "global/images/nope".into();
    let (status, v) = api(&gce, "POST", &format!("/zones/{Z}/instances"), Some(body)).await;
    assert_eq!((status, reason(&v)), (404, "notFound"), "{v}");
    let (status, v) = insert(&gce, "vm", "not-a-uuid", json!({})).await;
    assert_eq!((status, reason(&v)), (400, "invalid"), "{v}");
    assert!(gce.machines().is_empty());
}

#[tokio::test]
async fn lists_page_filter_on_labels_and_lag() {
    let gce = cloud(quick()).await;
    for n in 0..5 {
        let request = format!("{n}f2c1a4e-7b6d-8e9f-a0b1-c2d3e4f5a6b7");
        let pool = if n < 4 { "p" } else { "other" };
        let (status, v) = insert(
            &gce,
            &format!("vm-{n}"),
            &request,
            json!({"berth-pool": pool}),
        )
        .await;
        assert_eq!(status, 200, "{v}");
    }
    let filter = "%28labels.berth-pool%20%3D%20%22p%22%29";
    let mut names = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut path = format!("/zones/{Z}/instances?maxResults=3&filter={filter}");
        if let Some(t) = &token {
            path.push_str(&format!("&pageToken={t}"));
        }
        let (status, v) = api(&gce, "GET", &path, None).await;
        assert_eq!(status, 200, "{v}");
        pages += 1;
        for i in v["items"].as_array().unwrap() {
            names.push(i["name"].as_str().unwrap().to_owned());
        }
        match v["nextPageToken"].as_str() {
            Some(t) => token = Some(t.to_owned()),
            None => break,
        }
    }
    assert_eq!(pages, 2);
    assert_eq!(names, ["vm-0", "vm-1", "vm-2", "vm-3"]);
    // The cloud's record of them: the second asked with the first's token.
    let seen: Vec<Seen> = (gce.seen().into_iter())
        .filter(|s| s.op == "instances.list")
        .collect();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[0].query.get("maxResults").map(String::as_str),
        Some("3")
    );
    assert_eq!(
        seen[1].query.get("pageToken"),
        seen[0].next_page_token.as_ref()
    );
    assert_eq!(seen[1].next_page_token, None);
    let (status, v) = api(
        &gce,
        "GET",
        &format!("/zones/{Z}/instances?maxResults=501"),
        None,
    )
    .await;
    assert_eq!((status, reason(&v)), (400, "invalid"), "{v}");
    let (status, v) = api(
        &gce,
        "GET",
        &format!("/zones/{Z}/instances?filter=name%20eq%20vm.%2A"),
        None,
    )
    .await;
    assert_eq!((status, reason(&v)), (400, "invalid"), "{v}");
    let (status, v) = api(
        &gce,
        "GET",
        &format!("/zones/{Z}/instances?pageToken=junk"),
        None,
    )
    .await;
    assert_eq!((status, reason(&v)), (400, "invalid"), "{v}");
    // A name filter joined by OR.
    let path = format!(
        "/zones/{Z}/instances?filter=%28name%20%3D%20%22vm-1%22%29%20OR%20%28name%20%3D%20%22vm-4%22%29"
    );
    let (_, v) = api(&gce, "GET", &path, None).await;
    assert_eq!(v["items"].as_array().unwrap().len(), 2, "{v}");
    // The aggregated list shows every zone.
    let (status, v) = api(&gce, "GET", "/aggregated/instances", None).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["items"][format!("zones/{Z}")]["instances"]
            .as_array()
            .unwrap()
            .len(),
        5
    );
    assert_eq!(
        v["items"]["zones/us-central1-b"]["warning"]["code"],
        "NO_RESULTS_ON_PAGE"
    );
    // A list lag hides what is new from lists, never from a get.
    gce.knobs().set_lag(Duration::from_secs(60));
    let (_, v) = api(&gce, "GET", &format!("/zones/{Z}/instances"), None).await;
    assert!(v.get("items").is_none(), "{v}");
    let (status, _) = api(&gce, "GET", &format!("/zones/{Z}/instances/vm-0"), None).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn set_labels_wants_the_latest_fingerprint() {
    let gce = cloud(quick()).await;
    insert(&gce, "vm-1", R1, json!({"berth-pool": "p"})).await;
    let (_, i) = api(&gce, "GET", &format!("/zones/{Z}/instances/vm-1"), None).await;
    let fingerprint = i["labelFingerprint"].as_str().unwrap().to_owned();
    let path = format!("/zones/{Z}/instances/vm-1/setLabels");
    let body = json!({"labels": {"berth-pool": "p", "berth-idle": "hold"}, "labelFingerprint": fingerprint});
    let (status, op) = api(&gce, "POST", &path, Some(body.clone())).await;
    assert_eq!(status, 200, "{op}");
    assert_eq!(op["operationType"], "setLabels");
    let (status, v) = api(&gce, "POST", &path, Some(body)).await;
    assert_eq!((status, reason(&v)), (412, "conditionNotMet"), "{v}");
    let (_, i) = api(&gce, "GET", &format!("/zones/{Z}/instances/vm-1"), None).await;
    assert_eq!(i["labels"]["berth-idle"], "hold");
    assert_ne!(i["labelFingerprint"], fingerprint.as_str());
    let stale = json!({"labels": {"Bad": "x"}, "labelFingerprint": i["labelFingerprint"]});
    let (status, v) = api(&gce, "POST", &path, Some(stale)).await;
    assert_eq!((status, reason(&v)), (400, "invalid"), "{v}");
}

#[tokio::test]
async fn a_delete_stops_the_instance_then_it_is_gone() {
    let gce = cloud(quick()).await;
    insert(&gce, "vm-1", R1, json!({})).await;
    let path = format!("/zones/{Z}/instances/vm-1");
    let (status, op) = api(&gce, "DELETE", &path, None).await;
    assert_eq!(status, 200, "{op}");
    assert_eq!(op["operationType"], "delete");
    let (_, i) = api(&gce, "GET", &path, None).await;
    assert_eq!(i["status"], "STOPPING", "{i}");
    // Deleting it again while it stops starts nothing new.
    let (status, _) = api(&gce, "DELETE", &path, None).await;
    assert_eq!(status, 200);
    tokio::time::sleep(Duration::from_millis(150)).await;
    let (status, v) = api(&gce, "GET", &path, None).await;
    assert_eq!((status, reason(&v)), (404, "notFound"), "{v}");
    let (status, v) = api(&gce, "DELETE", &path, None).await;
    assert_eq!((status, reason(&v)), (404, "notFound"), "{v}");
    let machines = gce.machines();
    assert_eq!(machines.len(), 1);
    assert!(machines[0].deleted, "{machines:?}");
    // The name is free again.
    let (status, _) = insert(&gce, "vm-1", R2, json!({})).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn quota_and_capacity_end_operations_in_their_errors() {
    let gce = cloud(quick()).await;
    gce.set_quota(1, 100);
    let (_, op) = insert(&gce, "vm-1", R1, json!({})).await;
    assert!(wait_op(&gce, &op).await.get("error").is_none());
    let (status, op) = insert(&gce, "vm-2", R2, json!({})).await;
    assert_eq!(status, 200, "{op}");
    let done = wait_op(&gce, &op).await;
    assert_eq!(
        done["error"]["errors"][0]["code"], "QUOTA_EXCEEDED",
        "{done}"
    );
    assert!(
        done["error"]["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("Quota 'INSTANCES' exceeded")
    );
    assert_eq!(done["httpErrorStatusCode"], 403);
    gce.set_quota(10, 100);
    gce.exhaust("e2-small", true);
    let (_, op) = insert(&gce, "vm-3", R3, json!({})).await;
    let done = wait_op(&gce, &op).await;
    assert_eq!(
        done["error"]["errors"][0]["code"], "ZONE_RESOURCE_POOL_EXHAUSTED",
        "{done}"
    );
    // Neither made anything.
    assert_eq!(gce.machines().len(), 1);
    gce.exhaust("e2-small", false);
    gce.fail_inserts(1, "RESOURCE_OPERATION_FAILED", "injected");
    let (_, op) = insert(
        &gce,
        "vm-4",
        "6f2c1a4e-7b6d-8e9f-a0b1-c2d3e4f5a6b7",
        json!({}),
    )
    .await;
    assert_eq!(
        wait_op(&gce, &op).await["error"]["errors"][0]["code"],
        "RESOURCE_OPERATION_FAILED"
    );
}

#[tokio::test]
async fn a_bulk_insert_names_each_instance_and_shares_the_rest() {
    let gce = cloud(quick()).await;
    let props = instance("ignored", json!({"berth-pool": "p"}));
    let body = json!({
        "count": "3",
        "minCount": "3",
        "perInstanceProperties": {"vm-a": {"name": "vm-a"}, "vm-b": {}, "vm-c": {}},
        "instanceProperties": props,
    });
    let path = format!("/zones/{Z}/instances/bulkInsert?requestId={R1}");
    let (status, op) = api(&gce, "POST", &path, Some(body.clone())).await;
    assert_eq!(status, 200, "{op}");
    assert_eq!(op["operationType"], "bulkInsert");
    let (_, again) = api(&gce, "POST", &path, Some(body)).await;
    assert_eq!(again["name"], op["name"]);
    let done = wait_op(&gce, &op).await;
    let status =
        &done["instancesBulkInsertOperationMetadata"]["perLocationStatus"][format!("zones/{Z}")];
    assert_eq!(status["createdVmCount"], 3, "{done}");
    let names: Vec<String> = gce.machines().into_iter().map(|m| m.name).collect();
    assert_eq!(names, ["vm-a", "vm-b", "vm-c"]);
    assert!(
        gce.machines()
            .iter()
            .all(|m| m.tag("berth-pool") == Some("p"))
    );
    // A pattern numbers after the biggest name that matches.
    let body = json!({"count": 2, "namePattern": "vm-##", "instanceProperties": props});
    let (status, _) = api(
        &gce,
        "POST",
        &format!("/zones/{Z}/instances/bulkInsert"),
        Some(body),
    )
    .await;
    assert_eq!(status, 200);
    let names: Vec<String> = gce.machines().into_iter().map(|m| m.name).skip(3).collect();
    assert_eq!(names, ["vm-01", "vm-02"]);
    // Over quota for the minimum: refused at once, nothing made.
    gce.set_quota(6, 100);
    let body =
        json!({"count": 2, "minCount": 2, "namePattern": "vm-##", "instanceProperties": props});
    let (status, v) = api(
        &gce,
        "POST",
        &format!("/zones/{Z}/instances/bulkInsert"),
        Some(body),
    )
    .await;
    assert_eq!((status, reason(&v)), (403, "quotaExceeded"), "{v}");
    gce.exhaust("e2-small", true);
    let body = json!({"count": 1, "namePattern": "vm-##", "instanceProperties": props});
    let (status, v) = api(
        &gce,
        "POST",
        &format!("/zones/{Z}/instances/bulkInsert"),
        Some(body),
    )
    .await;
    assert_eq!((status, reason(&v)), (503, "insufficientCapacity"), "{v}");
    assert_eq!(gce.machines().len(), 5);
}

#[tokio::test]
async fn rate_limits_and_injected_answers() {
    let gce = cloud(quick()).await;
    gce.set_rate_limit(Some(2));
    let path = format!("/zones/{Z}/instances");
    let mut refused = 0;
    for _ in 0..4 {
        let (status, v) = api(&gce, "GET", &path, None).await;
        if status == 403 {
            assert_eq!(reason(&v), "rateLimitExceeded", "{v}");
            refused += 1;
        }
    }
    assert!(refused >= 1);
    gce.set_rate_limit(None);
    gce.knobs().inject(
        "instances.list",
        google_error(
            429,
            "rateLimitExceeded",
            "Quota exceeded for quota metric 'Queries'",
        )
        .with_header("retry-after", "3"),
        1,
    );
    let (status, v) = api(&gce, "GET", &path, None).await;
    assert_eq!((status, reason(&v)), (429, "rateLimitExceeded"), "{v}");
    let (status, _) = api(&gce, "GET", &path, None).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_failed_start_ends_terminated_with_a_message_and_waits_are_bounded() {
    let gce = cloud(GceConfig {
        operation: Duration::from_secs(30),
        ..quick()
    })
    .await;
    gce.fail_boots(
        1,
        "Instance failed to start: the boot disk could not be attached.",
    );
    let (_, op) = insert(&gce, "vm-1", R1, json!({})).await;
    // The operation takes longer than the wait may hold.
    let started = std::time::Instant::now();
    let waited = wait_op(&gce, &op).await;
    assert_ne!(waited["status"], "DONE");
    assert!(started.elapsed() < Duration::from_secs(5));
    tokio::time::sleep(Duration::from_millis(250)).await;
    let (_, i) = api(&gce, "GET", &format!("/zones/{Z}/instances/vm-1"), None).await;
    assert_eq!(i["status"], "TERMINATED", "{i}");
    assert!(
        i["statusMessage"]
            .as_str()
            .unwrap()
            .contains("failed to start"),
        "{i}"
    );
    assert!(gce.stop("vm-1", "Instance was preempted."));
    let (_, i) = api(&gce, "GET", &format!("/zones/{Z}/instances/vm-1"), None).await;
    assert_eq!(i["statusMessage"], "Instance was preempted.");
}
