//! Tests of the simulated cloud through its router, in process, mostly with
//! paused tokio time so delays are stepped through rather than slept.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use http::{Request, StatusCode};
use serde_json::{Value, json};
use tower::ServiceExt;

use super::*;

struct Reply {
    status: StatusCode,
    headers: http::HeaderMap,
    body: Value,
}

async fn send(
    app: &Router,
    method: &str,
    uri: &str,
    body: Option<Value>,
    token: Option<&str>,
) -> Reply {
    let mut request = Request::builder().method(method).uri(uri);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let body = match body {
        Some(v) => Body::from(v.to_string()),
        None => Body::empty(),
    };
    let request = request
        .header("content-type", "application/json")
        .body(body)
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap()
    };
    Reply {
        status,
        headers,
        body,
    }
}

async fn create(app: &Router, body: Value) -> Reply {
    send(app, "POST", "/v1/instances", Some(body), None).await
}

fn small(tags: Value) -> Value {
    json!({"instance_type": "small", "image": "ubuntu-24.04", "tags": tags})
}

fn sim(knobs: Knobs) -> (SimCloud, Router) {
    let cloud = SimCloud::new(knobs, None).unwrap();
    let app = cloud.router();
    (cloud, app)
}

fn ids(reply: &Reply) -> Vec<String> {
    reply.body["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap().to_owned())
        .collect()
}

fn error_code(reply: &Reply) -> &str {
    reply.body["error"]["code"].as_str().unwrap_or("<none>")
}

#[tokio::test(start_paused = true)]
async fn create_list_tag_delete_lifecycle() {
    let (_cloud, app) = sim(Knobs {
        terminated_retention_ms: 10_000,
        ..Knobs::default()
    });

    let first = create(
        &app,
        small(json!({"berth-pool": "p1", "berth-node": "n-1", "owner": "ci"})),
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.body["id"], "i-0000000000000001");
    assert_eq!(first.body["state"], "running");
    // Loopback, outside 127.0.0.0/16: probing it sends nothing off the host.
    assert_eq!(first.body["private_ipv4"], "127.1.0.1");
    assert_eq!(first.body["hostname"], "i-0000000000000001.sim.internal");
    assert_eq!(first.body["ssh_port"], 22);
    assert_eq!(first.body["username"], "berth");
    assert_eq!(first.body["public_ipv4"], Value::Null);
    for n in 2..=6 {
        let pool = if n == 4 { "p2" } else { "p1" };
        let reply = create(
            &app,
            small(json!({"berth-pool": pool, "berth-node": format!("n-{n}")})),
        )
        .await;
        assert_eq!(reply.status, StatusCode::CREATED);
    }

    // Tag filter, with the key percent-encoded as a careful client would send it.
    let p2 = send(&app, "GET", "/v1/instances?tag%3Aberth-pool=p2", None, None).await;
    assert_eq!(p2.status, StatusCode::OK);
    assert_eq!(ids(&p2), ["i-0000000000000004"]);
    let two_tags = send(
        &app,
        "GET",
        "/v1/instances?tag:berth-pool=p1&tag:owner=ci",
        None,
        None,
    )
    .await;
    assert_eq!(ids(&two_tags), ["i-0000000000000001"]);

    // Paging over the five p1 instances, two at a time, in id order.
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    loop {
        let uri = match &token {
            Some(t) => format!("/v1/instances?tag:berth-pool=p1&page_size=2&page_token={t}"),
            None => "/v1/instances?tag:berth-pool=p1&page_size=2".to_owned(),
        };
        let page = send(&app, "GET", &uri, None, None).await;
        assert_eq!(page.status, StatusCode::OK);
        pages += 1;
        assert!(ids(&page).len() <= 2);
        seen.extend(ids(&page));
        match page.body["next_page_token"].as_str() {
            Some(t) => token = Some(t.to_owned()),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(
        seen,
        [
            "i-0000000000000001",
            "i-0000000000000002",
            "i-0000000000000003",
            "i-0000000000000005",
            "i-0000000000000006"
        ]
    );
    let exact = send(&app, "GET", "/v1/instances?page_size=6", None, None).await;
    assert_eq!(ids(&exact).len(), 6);
    assert_eq!(
        exact.body["next_page_token"],
        Value::Null,
        "a full last page has no next page"
    );

    // set-tags replaces berth- tags and keeps the rest.
    let tagged = send(
        &app,
        "PUT",
        "/v1/instances/i-0000000000000001/tags",
        Some(json!({"tags": {"berth-node": "n-9", "owner": "someone-else"}})),
        None,
    )
    .await;
    assert_eq!(tagged.status, StatusCode::NO_CONTENT);
    let got = send(&app, "GET", "/v1/instances/i-0000000000000001", None, None).await;
    assert_eq!(
        got.body["tags"],
        json!({"berth-node": "n-9", "owner": "ci"})
    );

    // Delete: terminated, still listed, second delete is 404.
    let deleted = send(
        &app,
        "DELETE",
        "/v1/instances/i-0000000000000004",
        None,
        None,
    )
    .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    let listed = send(&app, "GET", "/v1/instances?tag:berth-pool=p2", None, None).await;
    assert_eq!(listed.body["instances"][0]["state"], "terminated");
    let again = send(
        &app,
        "DELETE",
        "/v1/instances/i-0000000000000004",
        None,
        None,
    )
    .await;
    assert_eq!(again.status, StatusCode::NOT_FOUND);
    assert_eq!(error_code(&again), "not_found");
    let tag_dead = send(
        &app,
        "PUT",
        "/v1/instances/i-0000000000000004/tags",
        Some(json!({"tags": {}})),
        None,
    )
    .await;
    assert_eq!(tag_dead.status, StatusCode::NOT_FOUND);
    let unknown = send(&app, "GET", "/v1/instances/i-00000000000000ff", None, None).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);

    // After the retention time the terminated instance is gone.
    tokio::time::advance(Duration::from_millis(9_999)).await;
    let still = send(&app, "GET", "/v1/instances/i-0000000000000004", None, None).await;
    assert_eq!(still.status, StatusCode::OK);
    tokio::time::advance(Duration::from_millis(1)).await;
    let gone = send(&app, "GET", "/v1/instances/i-0000000000000004", None, None).await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    let listed = send(&app, "GET", "/v1/instances?tag:berth-pool=p2", None, None).await;
    assert!(ids(&listed).is_empty());
}

#[tokio::test(start_paused = true)]
async fn boot_delay_keeps_instances_pending() {
    let (cloud, app) = sim(Knobs {
        boot_delay_ms: 2_000,
        ..Knobs::default()
    });
    let created = create(&app, small(json!({}))).await;
    assert_eq!(created.body["state"], "pending");
    let id = created.body["id"].as_str().unwrap().to_owned();
    let uri = format!("/v1/instances/{id}");

    tokio::time::advance(Duration::from_millis(1_999)).await;
    assert_eq!(
        send(&app, "GET", &uri, None, None).await.body["state"],
        "pending"
    );
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(
        send(&app, "GET", &uri, None, None).await.body["state"],
        "running"
    );
    assert_eq!(cloud.instances()[0].state, InstanceState::Running);
}

#[tokio::test(start_paused = true)]
async fn create_latency_delays_the_answer() {
    let (_cloud, app) = sim(Knobs {
        create_latency_ms: 750,
        ..Knobs::default()
    });
    let started = tokio::time::Instant::now();
    let created = create(&app, small(json!({}))).await;
    assert_eq!(created.status, StatusCode::CREATED);
    assert_eq!(started.elapsed(), Duration::from_millis(750));
}

#[tokio::test(start_paused = true)]
async fn a_create_answer_delay_makes_the_instance_before_it_answers() {
    let (cloud, app) = sim(Knobs {
        create_answer_delay_ms: 2_000,
        ..Knobs::default()
    });
    let call = tokio::spawn({
        let app = app.clone();
        async move { create(&app, small(json!({}))).await }
    });
    // Made at once; answered only when the delay has passed.
    tokio::time::advance(Duration::from_millis(10)).await;
    assert_eq!(cloud.instances().len(), 1);
    assert!(!call.is_finished());
    tokio::time::advance(Duration::from_millis(2_000)).await;
    assert_eq!(call.await.unwrap().status, StatusCode::CREATED);
}

#[tokio::test(start_paused = true)]
async fn a_new_instance_is_left_out_of_reads_for_the_list_lag() {
    let (cloud, app) = sim(Knobs {
        list_lag_ms: 3_000,
        ..Knobs::default()
    });
    let created = create(&app, small(json!({"berth-node": "n-1"}))).await;
    let id = created.body["id"].as_str().unwrap().to_owned();
    let uri = format!("/v1/instances/{id}");
    let by_id = format!("/v1/instances?id={id}");
    tokio::time::advance(Duration::from_millis(2_999)).await;
    assert!(ids(&send(&app, "GET", "/v1/instances", None, None).await).is_empty());
    assert!(ids(&send(&app, "GET", &by_id, None, None).await).is_empty());
    let got = send(&app, "GET", &uri, None, None).await;
    assert_eq!(got.status, StatusCode::NOT_FOUND);
    // The cloud's own record has it all along.
    assert_eq!(cloud.instances().len(), 1);
    tokio::time::advance(Duration::from_millis(1)).await;
    for listed in ["/v1/instances", by_id.as_str()] {
        assert_eq!(
            ids(&send(&app, "GET", listed, None, None).await),
            [id.as_str()]
        );
    }
    assert_eq!(
        send(&app, "GET", &uri, None, None).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn quota_counts_live_instances() {
    let (_cloud, app) = sim(Knobs {
        quota: Some(2),
        ..Knobs::default()
    });
    let a = create(&app, small(json!({}))).await;
    create(&app, small(json!({}))).await;
    let over = create(&app, small(json!({}))).await;
    assert_eq!(over.status, StatusCode::FORBIDDEN);
    assert_eq!(error_code(&over), "quota_exceeded");
    let limits = send(&app, "GET", "/v1/limits", None, None).await;
    assert_eq!(
        limits.body,
        json!({"max_instances": 2, "used_instances": 2})
    );

    // A terminated instance no longer counts.
    let uri = format!("/v1/instances/{}", a.body["id"].as_str().unwrap());
    send(&app, "DELETE", &uri, None, None).await;
    assert_eq!(
        create(&app, small(json!({}))).await.status,
        StatusCode::CREATED
    );
}

#[tokio::test(start_paused = true)]
async fn rate_limit_rejects_then_refills() {
    let (cloud, app) = sim(Knobs {
        rate_limit: Some(2.0),
        ..Knobs::default()
    });
    // Capacity is two tokens.
    assert_eq!(
        send(&app, "GET", "/v1/limits", None, None).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&app, "GET", "/v1/limits", None, None).await.status,
        StatusCode::OK
    );
    let limited = send(&app, "GET", "/v1/limits", None, None).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(error_code(&limited), "rate_limited");
    // One token at two per second is 500 ms away; Retry-After rounds up to 1 s.
    assert_eq!(limited.body["retry_after_ms"], 500);
    assert_eq!(limited.headers["retry-after"], "1");

    // Control endpoints are never limited.
    assert_eq!(
        send(&app, "GET", "/sim/knobs", None, None).await.status,
        StatusCode::OK
    );

    tokio::time::advance(Duration::from_millis(499)).await;
    assert_eq!(
        send(&app, "GET", "/v1/limits", None, None).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    tokio::time::advance(Duration::from_millis(1)).await;
    // The rejected call above spent nothing, so the bucket holds exactly one token.
    assert_eq!(
        send(&app, "GET", "/v1/limits", None, None).await.status,
        StatusCode::OK
    );

    let statuses: Vec<u16> = cloud.calls().iter().map(|c| c.status).collect();
    assert_eq!(statuses, [200, 200, 429, 429, 200]);
    let logged = send(&app, "GET", "/sim/calls", None, None).await;
    assert_eq!(logged.body[2]["status"], 429);
    assert_eq!(logged.body[2]["path"], "/v1/limits");
    assert_eq!(logged.body[2]["method"], "GET");
}

#[tokio::test(start_paused = true)]
async fn slow_rate_limit_retry_after_is_whole_seconds() {
    let (_cloud, app) = sim(Knobs {
        rate_limit: Some(0.4),
        ..Knobs::default()
    });
    assert_eq!(
        send(&app, "GET", "/v1/limits", None, None).await.status,
        StatusCode::OK
    );
    let limited = send(&app, "GET", "/v1/limits", None, None).await;
    assert_eq!(limited.body["retry_after_ms"], 2_500);
    assert_eq!(limited.headers["retry-after"], "3");
}

#[tokio::test]
async fn out_of_capacity_names_the_type() {
    let (_cloud, app) = sim(Knobs {
        out_of_capacity: vec!["gpu".into()],
        ..Knobs::default()
    });
    let refused = create(&app, json!({"instance_type": "gpu", "image": "x"})).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(error_code(&refused), "insufficient_capacity");
    assert_eq!(refused.body["instance_type"], "gpu");
    assert_eq!(
        create(&app, small(json!({}))).await.status,
        StatusCode::CREATED
    );
}

#[tokio::test]
async fn token_is_required_when_set() {
    let (cloud, app) = sim(Knobs {
        token: Some("s3cret".into()),
        ..Knobs::default()
    });
    let missing = send(&app, "GET", "/v1/limits", None, None).await;
    assert_eq!(missing.status, StatusCode::UNAUTHORIZED);
    assert_eq!(error_code(&missing), "unauthorized");
    let wrong = send(&app, "GET", "/v1/limits", None, Some("guess")).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    let right = send(&app, "GET", "/v1/limits", None, Some("s3cret")).await;
    assert_eq!(right.status, StatusCode::OK);
    // Control endpoints need no token.
    assert_eq!(
        send(&app, "GET", "/sim/instances", None, None).await.status,
        StatusCode::OK
    );
    let statuses: Vec<u16> = cloud.calls().iter().map(|c| c.status).collect();
    assert_eq!(statuses, [401, 401, 200]);
    assert!(
        !format!("{:?}", cloud.knobs()).contains("s3cret"),
        "token leaked into Debug"
    );
}

#[tokio::test]
async fn client_token_makes_create_idempotent() {
    let (cloud, app) = sim(Knobs::default());
    let body = json!({"instance_type": "small", "image": "img", "client_token": "n-1"});
    let first = create(&app, body.clone()).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let retry = create(&app, body.clone()).await;
    assert_eq!(retry.status, StatusCode::OK);
    assert_eq!(retry.body["id"], first.body["id"]);
    assert_eq!(retry.body["client_token"], "n-1");
    assert_eq!(cloud.instances().len(), 1);

    // Once that instance is terminated the token is free again.
    let uri = format!("/v1/instances/{}", first.body["id"].as_str().unwrap());
    send(&app, "DELETE", &uri, None, None).await;
    let fresh = create(&app, body).await;
    assert_eq!(fresh.status, StatusCode::CREATED);
    assert_ne!(fresh.body["id"], first.body["id"]);
}

#[tokio::test]
async fn failure_rate_one_always_fails_creates() {
    let (cloud, app) = sim(Knobs {
        failure_rate: 1.0,
        ..Knobs::default()
    });
    for _ in 0..5 {
        let failed = create(&app, small(json!({}))).await;
        assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(error_code(&failed), "internal_error");
    }
    assert!(cloud.instances().is_empty());
    // Only creates fail.
    assert_eq!(
        send(&app, "GET", "/v1/instances", None, None).await.status,
        StatusCode::OK
    );
    cloud
        .set_knobs(Knobs {
            failure_rate: 0.0,
            ..cloud.knobs()
        })
        .unwrap();
    assert_eq!(
        create(&app, small(json!({}))).await.status,
        StatusCode::CREATED
    );
}

#[tokio::test(start_paused = true)]
async fn an_instance_whose_boot_fails_is_pending_then_failed_with_its_fault() {
    let (cloud, app) = sim(Knobs {
        boot_delay_ms: 1000,
        boot_failure_rate: 1.0,
        ..Knobs::default()
    });
    let made = create(&app, small(json!({}))).await;
    assert_eq!(made.status, StatusCode::CREATED);
    assert_eq!(made.body["state"], "pending");
    assert!(made.body.get("fault").is_none(), "{}", made.body);
    let id = made.body["id"].as_str().unwrap().to_owned();
    tokio::time::advance(Duration::from_millis(1001)).await;
    let seen = send(&app, "GET", &format!("/v1/instances/{id}"), None, None).await;
    assert_eq!(seen.body["state"], "failed");
    assert_eq!(seen.body["fault"], state::BOOT_FAULT);
    // It still counts against the quota until deleted.
    assert_eq!(cloud.instances().len(), 1);
    // Only the instances created while the knob is set fail.
    cloud
        .set_knobs(Knobs {
            boot_failure_rate: 0.0,
            ..cloud.knobs()
        })
        .unwrap();
    let next = create(&app, small(json!({}))).await;
    tokio::time::advance(Duration::from_millis(1001)).await;
    let id = next.body["id"].as_str().unwrap();
    let seen = send(&app, "GET", &format!("/v1/instances/{id}"), None, None).await;
    assert_eq!(seen.body["state"], "running");
}

#[tokio::test]
async fn a_list_by_ids_shows_those_alone() {
    let (_cloud, app) = sim(Knobs::default());
    let mut ids = Vec::new();
    for _ in 0..4 {
        let made = create(&app, small(json!({}))).await;
        ids.push(made.body["id"].as_str().unwrap().to_owned());
    }
    let uri = format!("/v1/instances?id={}&id={}", ids[1], ids[3]);
    let page = send(&app, "GET", &uri, None, None).await;
    assert_eq!(page.status, StatusCode::OK);
    let listed: Vec<&str> = (page.body["instances"].as_array().unwrap().iter())
        .map(|i| i["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [ids[1].as_str(), ids[3].as_str()]);
    let many: String = (0..101).map(|_| format!("id={}&", ids[0])).collect();
    let refused = send(&app, "GET", &format!("/v1/instances?{many}"), None, None).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    let bad = send(&app, "GET", "/v1/instances?id=nope", None, None).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn state_file_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sim.json");
    let knobs = Knobs {
        boot_delay_ms: 3_600_000,
        ..Knobs::default()
    };
    let first = SimCloud::new(knobs.clone(), Some(path.clone())).unwrap();
    let app = first.router();
    let a = create(&app, small(json!({"berth-pool": "p1"}))).await;
    let b = create(&app, small(json!({"berth-pool": "p1"}))).await;
    let uri = format!("/v1/instances/{}", b.body["id"].as_str().unwrap());
    assert_eq!(
        send(&app, "DELETE", &uri, None, None).await.status,
        StatusCode::NO_CONTENT
    );
    let tags_uri = format!("/v1/instances/{}/tags", a.body["id"].as_str().unwrap());
    send(
        &app,
        "PUT",
        &tags_uri,
        Some(json!({"tags": {"berth-node": "n-7"}})),
        None,
    )
    .await;
    assert!(path.exists());

    let second = SimCloud::new(knobs, Some(path.clone())).unwrap();
    assert_eq!(second.instances(), first.instances());
    assert_eq!(second.instances()[0].state, InstanceState::Pending);
    assert_eq!(second.instances()[0].tags["berth-node"], "n-7");
    assert_eq!(second.instances()[1].state, InstanceState::Terminated);
    assert!(second.calls().is_empty(), "the call log is not persisted");
    // The id counter survives too: no id is handed out twice.
    let c = create(&second.router(), small(json!({}))).await;
    assert_eq!(c.body["id"], "i-0000000000000003");

    second.reset().unwrap();
    let third = SimCloud::new(Knobs::default(), Some(path)).unwrap();
    assert!(third.instances().is_empty());
}

#[tokio::test]
async fn knobs_are_patched_over_http() {
    let (cloud, app) = sim(Knobs {
        quota: Some(5),
        ..Knobs::default()
    });
    let patched = send(
        &app,
        "PUT",
        "/sim/knobs",
        Some(json!({"boot_delay_ms": 1500, "token": "t"})),
        None,
    )
    .await;
    assert_eq!(patched.status, StatusCode::OK);
    assert_eq!(cloud.knobs().boot_delay_ms, 1_500);
    assert_eq!(cloud.knobs().quota, Some(5), "absent fields are left alone");
    send(
        &app,
        "PUT",
        "/sim/knobs",
        Some(json!({"quota": null})),
        None,
    )
    .await;
    assert_eq!(cloud.knobs().quota, None, "null disarms a knob");
    let got = send(&app, "GET", "/sim/knobs", None, None).await;
    assert_eq!(got.body["boot_delay_ms"], 1500);
    assert_eq!(got.body["terminated_retention_ms"], 60_000);

    let bad = send(
        &app,
        "PUT",
        "/sim/knobs",
        Some(json!({"failure_rate": 2.0, "rate_limit": 0})),
        None,
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let message = bad.body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("failure_rate") && message.contains("rate_limit"),
        "{message}"
    );
    let unknown = send(&app, "PUT", "/sim/knobs", Some(json!({"quotas": 1})), None).await;
    assert_eq!(unknown.status, StatusCode::BAD_REQUEST);
    assert_eq!(cloud.knobs().failure_rate, 0.0);
}

#[tokio::test]
async fn malformed_requests_are_400() {
    let (cloud, app) = sim(Knobs::default());
    let cases = [
        ("POST", "/v1/instances", Some(json!({"image": "x"}))),
        (
            "POST",
            "/v1/instances",
            Some(json!({"instance_type": "small", "image": "x", "colour": 1})),
        ),
        (
            "POST",
            "/v1/instances",
            Some(json!({"instance_type": "", "image": "x"})),
        ),
        ("GET", "/v1/instances?page_size=0", None),
        ("GET", "/v1/instances?page_size=1001", None),
        ("GET", "/v1/instances?page_token=nope", None),
        ("GET", "/v1/instances?colour=red", None),
    ];
    for (method, uri, body) in cases {
        let reply = send(&app, method, uri, body.clone(), None).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{method} {uri} {body:?}"
        );
        assert_eq!(error_code(&reply), "invalid_request");
    }
    let raw = Request::post("/v1/instances")
        .body(Body::from("{not json"))
        .unwrap();
    assert_eq!(
        app.clone().oneshot(raw).await.unwrap().status(),
        StatusCode::BAD_REQUEST
    );
    assert!(cloud.instances().is_empty());
}

#[tokio::test]
async fn reset_forgets_instances_and_calls() {
    let (cloud, app) = sim(Knobs::default());
    create(&app, small(json!({}))).await;
    assert_eq!(
        send(&app, "GET", "/sim/instances", None, None)
            .await
            .body
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        send(&app, "POST", "/sim/reset", None, None).await.status,
        StatusCode::NO_CONTENT
    );
    assert!(cloud.instances().is_empty());
    assert!(cloud.calls().is_empty());
    // Ids are not reused after a reset.
    assert_eq!(
        create(&app, small(json!({}))).await.body["id"],
        "i-0000000000000002"
    );
}

#[tokio::test]
async fn serves_over_tcp_until_shutdown() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cloud = SimCloud::new(
        Knobs {
            quota: Some(7),
            ..Knobs::default()
        },
        None,
    )
    .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(cloud.serve(listener, async {
        let _ = stopped.await;
    }));

    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /v1/limits HTTP/1.1\r\nhost: sim\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(
        response.contains(r#"{"max_instances":7,"used_instances":0}"#),
        "{response}"
    );

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[test]
fn sim_args_become_knobs() {
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimArgs,
    }

    let cli = Cli::try_parse_from([
        "berth",
        "--listen",
        "127.0.0.1:0",
        "--boot-delay",
        "2s",
        "--create-latency",
        "250ms",
        "--quota",
        "50",
        "--rate-limit",
        "20",
        "--failure-rate",
        "0.25",
        "--out-of-capacity",
        "gpu,big",
        "--out-of-capacity",
        "huge",
        "--terminated-retention",
        "1m",
        "--state",
        "sim.json",
    ])
    .unwrap();
    let knobs = cli.sim.knobs();
    assert_eq!(knobs.boot_delay_ms, 2_000);
    assert_eq!(knobs.create_latency_ms, 250);
    assert_eq!(knobs.quota, Some(50));
    assert_eq!(knobs.rate_limit, Some(20.0));
    assert_eq!(knobs.failure_rate, 0.25);
    assert_eq!(knobs.out_of_capacity, ["gpu", "big", "huge"]);
    assert_eq!(knobs.terminated_retention_ms, 60_000);
    assert_eq!(cli.sim.listen.port(), 0);
    assert_eq!(
        cli.sim.state.as_deref(),
        Some(std::path::Path::new("sim.json"))
    );

    let defaults = Cli::try_parse_from(["berth"]).unwrap();
    assert_eq!(defaults.sim.listen.to_string(), "127.0.0.1:8181");
    // The environment may carry a token; compare the rest.
    let expected = Knobs {
        token: defaults.sim.token.clone(),
        ..Knobs::default()
    };
    assert_eq!(defaults.sim.knobs(), expected);

    assert!(Cli::try_parse_from(["berth", "--boot-delay", "2"]).is_err());
    assert!(Cli::try_parse_from(["berth", "--failure-rate", "1.5"]).is_err());
}

#[tokio::test(start_paused = true)]
async fn a_caller_named_in_the_endpoint_is_recorded_with_its_calls() {
    let (cloud, app) = sim(Knobs::default());
    let made = send(
        &app,
        "POST",
        "/c/b1/v1/instances",
        Some(small(json!({}))),
        None,
    )
    .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let id = made.body["id"].as_str().unwrap().to_owned();
    let listed = send(&app, "GET", "/c/b2/v1/instances", None, None).await;
    assert_eq!(ids(&listed), std::slice::from_ref(&id));
    // Calls on one instance take its id from the path under `/c/NAME` too.
    let tags = json!({"tags": {"berth-idle": "hold"}});
    let tagged = send(
        &app,
        "PUT",
        &format!("/c/b3/v1/instances/{id}/tags"),
        Some(tags),
        None,
    )
    .await;
    assert!(tagged.status.is_success(), "{}", tagged.body);
    let got = send(&app, "GET", &format!("/c/b3/v1/instances/{id}"), None, None).await;
    assert_eq!(got.body["tags"]["berth-idle"], "hold", "{}", got.body);
    let gone = send(
        &app,
        "DELETE",
        &format!("/c/b3/v1/instances/{id}"),
        None,
        None,
    )
    .await;
    assert!(gone.status.is_success(), "{}", gone.body);
    send(&app, "DELETE", &format!("/v1/instances/{id}"), None, None).await;
    let recorded = cloud.calls();
    let seen: Vec<(Option<&str>, &str, &str)> = recorded
        .iter()
        .map(|c| (c.caller.as_deref(), c.method.as_str(), c.path.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            (Some("b1"), "POST", "/v1/instances"),
            (Some("b2"), "GET", "/v1/instances"),
            (
                Some("b3"),
                "PUT",
                format!("/v1/instances/{id}/tags").as_str()
            ),
            (Some("b3"), "GET", format!("/v1/instances/{id}").as_str()),
            (Some("b3"), "DELETE", format!("/v1/instances/{id}").as_str()),
            (None, "DELETE", format!("/v1/instances/{id}").as_str()),
        ]
    );
}

/// A server that answers every connection with a line of its own.
async fn greeter() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            use tokio::io::AsyncWriteExt;
            let _ = conn.write_all(b"SSH-2.0-greeter\r\n").await;
        }
    });
    addr
}

async fn first_line(addr: &str) -> std::io::Result<String> {
    use tokio::io::AsyncBufReadExt;
    let conn = tokio::net::TcpStream::connect(addr).await?;
    let mut line = String::new();
    tokio::io::BufReader::new(conn).read_line(&mut line).await?;
    Ok(line)
}

#[tokio::test]
async fn with_an_ssh_target_each_instance_is_reachable_once_booted_and_accepting() {
    let target = greeter().await;
    let (_cloud, app) = sim(Knobs {
        boot_delay_ms: 100,
        ssh_target: Some(target.to_string()),
        ssh_accept_delay_ms: 300,
        ..Knobs::default()
    });
    let started = std::time::Instant::now();
    let a = create(&app, small(json!({}))).await.body;
    let b = create(&app, small(json!({}))).await.body;
    assert_eq!(a["private_ipv4"], "127.0.0.1");
    assert_ne!(a["ssh_port"], b["ssh_port"], "a port of its own each");
    let addr = format!("127.0.0.1:{}", a["ssh_port"]);
    // Booted after 100 ms, accepting 300 ms after that: refused until then.
    let refused = first_line(&addr).await.unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    let line = loop {
        match first_line(&addr).await {
            Ok(line) => break line,
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    };
    assert!(started.elapsed() >= Duration::from_millis(400));
    assert_eq!(line, "SSH-2.0-greeter\r\n", "passed through to the target");
    // Deleting the instance closes its port.
    let id = a["id"].as_str().unwrap();
    let deleted = send(&app, "DELETE", &format!("/v1/instances/{id}"), None, None).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(first_line(&addr).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn an_instance_can_be_pointed_at_another_address_and_port() {
    let (_cloud, app) = sim(Knobs::default());
    let a = create(&app, small(json!({}))).await.body;
    let id = a["id"].as_str().unwrap();
    let uri = format!("/sim/instances/{id}/endpoint");
    let body = json!({"address": "169.254.169.254", "port": 2222});
    assert_eq!(
        send(&app, "PUT", &uri, Some(body), None).await.status,
        StatusCode::NO_CONTENT
    );
    let got = send(&app, "GET", &format!("/v1/instances/{id}"), None, None)
        .await
        .body;
    assert_eq!(got["private_ipv4"], "169.254.169.254");
    assert_eq!(got["ssh_port"], 2222);
    let bad = send(&app, "PUT", &uri, Some(json!({"address": 1})), None).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let missing = send(
        &app,
        "PUT",
        "/sim/instances/i-00000000000000ff/endpoint",
        Some(json!({"address": "10.0.0.1", "port": 22})),
        None,
    )
    .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    let knobs = send(
        &app,
        "PUT",
        "/sim/knobs",
        Some(json!({"ssh_target": "nowhere"})),
        None,
    )
    .await;
    assert_eq!(knobs.status, StatusCode::BAD_REQUEST);
}

#[tokio::test(start_paused = true)]
async fn a_call_is_in_flight_from_when_it_comes_in_until_it_is_recorded_or_dropped() {
    let (cloud, app) = sim(Knobs {
        create_latency_ms: 1000,
        ..Knobs::default()
    });
    let create = |app: Router| async move {
        send(
            &app,
            "POST",
            "/c/b1/v1/instances",
            Some(small(json!({}))),
            None,
        )
        .await
    };
    let answered = tokio::spawn(create(app.clone()));
    // Paused time moves only once every task waits: the create is then
    // inside its latency, come in and not recorded.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(cloud.in_flight(Some("b1")), 1);
    assert_eq!(cloud.in_flight(Some("b2")), 0);
    assert_eq!(cloud.in_flight(None), 0);
    assert!(cloud.calls().is_empty());
    let made = answered.await.unwrap();
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    assert_eq!(cloud.in_flight(Some("b1")), 0);
    assert_eq!(cloud.calls().len(), 1);

    // A client that goes away mid-call leaves nothing counted.
    let gone = tokio::spawn(create(app));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(cloud.in_flight(Some("b1")), 1);
    gone.abort();
    assert!(gone.await.is_err_and(|e| e.is_cancelled()));
    assert_eq!(cloud.in_flight(Some("b1")), 0);
    assert_eq!(cloud.calls().len(), 1);
}

fn results_id(reply: &Reply, i: usize) -> String {
    reply.body["results"][i]["instance"]["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A batch create is each create in one call: items within the quota get
/// their instance, the one past it its error, in order; a client token
/// finds the instance it made before. A batch delete answers per id too.
#[tokio::test(start_paused = true)]
async fn batches_answer_each_item_as_its_own_call_would() {
    let (cloud, app) = sim(Knobs {
        quota: Some(2),
        ..Knobs::default()
    });
    let mut first = small(json!({"k": "v"}));
    first["client_token"] = json!("t-1");
    let batch = json!({"instances": [first.clone(), small(json!({})), small(json!({}))]});
    let made = send(&app, "POST", "/v1/batch/create", Some(batch), None).await;
    assert_eq!(made.status, StatusCode::OK, "{:?}", made.body);
    let results = made.body["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    let id = results[0]["instance"]["id"].as_str().unwrap().to_owned();
    assert_eq!(results[0]["instance"]["tags"]["k"], "v");
    assert!(results[1]["instance"]["id"].is_string());
    assert_eq!(results[2]["error"]["code"], "quota_exceeded");
    assert_eq!(results[2]["status"], 403);
    // The same token again: the same instance, and no third.
    let again = json!({"instances": [first]});
    let again = send(&app, "POST", "/v1/batch/create", Some(again), None).await;
    assert_eq!(again.body["results"][0]["instance"]["id"], id.as_str());
    assert_eq!(cloud.instances().len(), 2);

    let gone = json!({"ids": [id.clone(), "i-00000099", id.clone()]});
    let deleted = send(&app, "POST", "/v1/batch/delete", Some(gone), None).await;
    assert_eq!(deleted.status, StatusCode::OK, "{:?}", deleted.body);
    let results = deleted.body["results"].as_array().unwrap();
    assert_eq!(results[0], json!({}));
    assert_eq!(results[1]["error"]["code"], "not_found");
    assert_eq!(
        results[2]["error"]["code"], "not_found",
        "already terminated"
    );
    // Three calls, as the cloud records them, with each item's status.
    let batches: Vec<Vec<(u16, Option<String>)>> = (cloud.calls().into_iter())
        .filter(|c| c.path.starts_with("/v1/batch/"))
        .map(|c| c.items.into_iter().map(|i| (i.status, i.id)).collect())
        .collect();
    let second = results_id(&made, 1);
    let gone = "i-00000099".to_owned();
    assert_eq!(
        batches,
        [
            vec![(201, Some(id.clone())), (201, Some(second)), (403, None)],
            vec![(200, Some(id.clone()))],
            vec![
                (204, Some(id.clone())),
                (404, Some(gone)),
                (404, Some(id.clone()))
            ],
        ]
    );

    for bad in [
        json!({"ids": []}),
        json!({"instances": []}),
        json!({"ids": vec!["x"; 101]}),
    ] {
        let path = if bad.get("ids").is_some() {
            "delete"
        } else {
            "create"
        };
        let r = send(&app, "POST", &format!("/v1/batch/{path}"), Some(bad), None).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
    }
}
