//! The operator's page (`/ui`) in headless Chromium, through the `berth
//! serve` binary: signing in with a token, nodes appearing and leaving with
//! no reload, an admin's hold and the same button refused for a client, a
//! request stalled on the cloud's quota, and the page finding berth again
//! after a restart. Screenshots go to `target/ui-screenshots/`.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::browser::Browser;
use crate::support::config::{CI, OPS, quota_of_two, serve_config_with};
use crate::support::server::{Berth, http_raw, until};
use crate::support::{SimServer, plugin};

/// Signs the page in with `token`, from the sign-in form.
async fn sign_in(b: &Browser, token: &str) {
    b.until(
        30,
        "the sign-in form",
        "return !document.getElementById('signin').hidden",
    )
    .await;
    b.type_into("#token", token).await;
    b.click("#login button[type=submit]").await;
    b.until(
        30,
        "the board",
        "return !document.getElementById('board').hidden",
    )
    .await;
}

/// The nodes the API shows in a state other than `gone`.
async fn live_nodes(berth: &Berth) -> Vec<Value> {
    let (_, all) = berth.call("GET", "/v1/nodes", Some(OPS), None).await;
    (all.as_array().cloned().unwrap_or_default().into_iter())
        .filter(|n| n["state"] != "gone")
        .collect()
}

/// A script: whether the page's nodes table has a row for `id`.
fn row(id: &str) -> String {
    format!("return {}", has_row(id))
}

fn has_row(id: &str) -> String {
    format!("document.querySelector('#nodes tr[data-node=\"{id}\"]') !== null")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_follows_the_pool_live_and_lets_only_an_admin_act() {
    let Some(b) = Browser::start("live").await else {
        return;
    };
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = serve_config_with(&sim, dir.path(), &plugin("sim"), "min-ready = 1", "");
    let cfg = config.display().to_string();
    let berth = Berth::start(&["--config", &cfg], dir.path()).await;
    berth.until_label_ready(60, "small", 1, "one ready").await;

    b.client.goto(&format!("{}/ui", berth.base)).await.unwrap();
    sign_in(&b, OPS).await;
    b.until(
        30,
        "a ready node",
        "return document.querySelector('#nodes tr[data-state=ready]')",
    )
    .await;
    let who = b
        .eval("return document.getElementById('who').textContent")
        .await;
    assert_eq!(who, "ops (admin)");
    b.until(
        30,
        "the event stream live",
        "return document.getElementById('link').dataset.state === 'live'",
    )
    .await;
    let errors = b.console_errors().await;
    assert!(errors.is_empty(), "console errors on load: {errors:#?}");
    b.screenshot("signed-in").await;
    // A reload would lose this.
    b.eval("window.stillTheSamePage = true; return true").await;

    // A node appearing: a request for two takes the ready one and launches
    // another; the page shows each new node within a second of the API.
    let before: Vec<String> = (live_nodes(&berth).await.iter())
        .map(|n| n["id"].as_str().unwrap().to_owned())
        .collect();
    let request = berth.request(OPS, &[("small", 2)]).await;
    let (new, seen_at) = until(30, "a new node in the API", || async {
        let now = live_nodes(&berth).await;
        let new = now
            .iter()
            .find(|n| !before.contains(&n["id"].as_str().unwrap().to_owned()))?;
        Some((new["id"].as_str().unwrap().to_owned(), Instant::now()))
    })
    .await;
    b.until(5, "the new node", &row(&new)).await;
    let appeared = seen_at.elapsed();
    assert!(
        appeared < Duration::from_secs(1),
        "shown {appeared:?} after the API"
    );
    let fulfilled = berth.fulfilled(OPS, &request.id).await;
    b.until(
        10,
        "the request fulfilled",
        &format!(
            "return document.querySelector('#requests tr[data-request=\"{}\"][data-state=fulfilled]')",
            request.id
        ),
    )
    .await;
    b.screenshot("a-request-fulfilled").await;

    // A node leaving: deleted, it goes from the table within a second of
    // the API saying it is gone.
    let gone = fulfilled.nodes[0].id.clone();
    let path = format!("/v1/nodes/{gone}");
    let (status, _) = berth.call("DELETE", &path, Some(OPS), None).await;
    assert_eq!(status, 200);
    let gone_at = until(30, "the node gone in the API", || async {
        let (_, n) = berth.call("GET", &path, Some(OPS), None).await;
        (n["state"] == "gone").then(Instant::now)
    })
    .await;
    b.until(
        5,
        "the deleted node leaving",
        &format!("return !({})", has_row(&gone)),
    )
    .await;
    let left = gone_at.elapsed();
    assert!(left < Duration::from_secs(1), "gone {left:?} after the API");

    // An admin's hold, from the node's own button.
    let ready = until(60, "a ready node", || async {
        (live_nodes(&berth).await.into_iter())
            .find(|n| n["state"] == "ready" && n["idle"] == "run")
            .map(|n| n["id"].as_str().unwrap().to_owned())
    })
    .await;
    b.until(5, "the ready node's row", &row(&ready)).await;
    b.click(&format!(
        "#nodes tr[data-node=\"{ready}\"] button[data-action=hold]"
    ))
    .await;
    b.until(
        10,
        "the node held",
        &format!(
            "return document.querySelector('#nodes tr[data-node=\"{ready}\"][data-idle=hold]')"
        ),
    )
    .await;
    let (_, n) = berth
        .call("GET", &format!("/v1/nodes/{ready}"), Some(OPS), None)
        .await;
    assert_eq!(n["idle"], "hold", "{n}");
    b.screenshot("held").await;
    let errors = b.console_errors().await;
    assert!(errors.is_empty(), "console errors: {errors:#?}");
    assert_eq!(
        b.eval("return window.stillTheSamePage === true").await,
        true
    );

    // A client token: no actions shown; the same button, shown anyway, is
    // refused by berth, and the page says so.
    b.click("#logout").await;
    sign_in(&b, CI).await;
    assert_eq!(
        b.eval("return document.getElementById('who').textContent")
            .await,
        "ci (client)"
    );
    b.until(10, "the held node's row", &row(&ready)).await;
    let shown = b
        .eval(&format!(
            "return document.querySelector('#nodes tr[data-node=\"{ready}\"] button[data-action=run]').offsetParent !== null"
        ))
        .await;
    assert_eq!(shown, false, "a client sees no actions");
    b.eval("document.body.classList.add('admin'); return true")
        .await;
    b.click(&format!(
        "#nodes tr[data-node=\"{ready}\"] button[data-action=run]"
    ))
    .await;
    let said = b
        .until(
            10,
            "the refusal",
            "return document.getElementById('notice').textContent",
        )
        .await;
    assert!(said.as_str().unwrap().contains("admin"), "{said}");
    let (_, n) = berth
        .call("GET", &format!("/v1/nodes/{ready}"), Some(OPS), None)
        .await;
    assert_eq!(n["idle"], "hold", "unchanged: {n}");
    b.screenshot("refused-for-a-client").await;
    // A call the client may make, from the page signed in by its cookie:
    // refused without the page's CSRF value, taken with it.
    let post = |csrf: &str| {
        format!(
            "return fetch('/v1/requests', {{method: 'POST', headers: {{'content-type': \
             'application/json'{csrf}}}, body: '{{\"labels\": {{\"small\": 1}}}}'}}) \
             .then((r) => r.text().then((t) => r.status + ' ' + t))"
        )
    };
    let said = b.eval(&post("")).await;
    let said = said.as_str().unwrap();
    assert!(
        said.starts_with("403 ") && said.contains("X-Berth-CSRF"),
        "{said}"
    );
    let said = b.eval(&post(", 'x-berth-csrf': state.session.csrf")).await;
    assert!(said.as_str().unwrap().starts_with("201 "), "{said}");

    // A browser's call from a page of another origin that changes
    // something is refused, whatever its token; the same call from no
    // browser goes through.
    let put = |origin: &str| {
        let body = r#"{"idle": "run"}"#;
        format!(
            "PUT /v1/nodes/{ready}/idle HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OPS}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n{origin}\
             Connection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let (status, said) = http_raw(
        &berth.base,
        put("Origin: http://elsewhere.example\r\n").as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(status, 403, "{said}");
    assert!(said.contains("another origin"), "{said}");
    let (status, said) = http_raw(&berth.base, put("").as_bytes()).await.unwrap();
    assert_eq!(status, 200, "{said}");

    // That node is nobody's (no request has it): the client's stream says
    // nothing of it, and its page reads it again all the same. An admin
    // deletes it, and it leaves the client's page too.
    let path = format!("/v1/nodes/{ready}");
    assert_eq!(berth.call("DELETE", &path, Some(OPS), None).await.0, 200);
    b.until(
        15,
        "the node leaving the client's page",
        &format!("return !({})", has_row(&ready)),
    )
    .await;
    b.close().await;

    // The page's budget: every file it loads, 150 KB at most.
    let mut total = 0;
    for file in ["/ui", "/ui/app.js", "/ui/app.css"] {
        let get = format!("GET {file} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let (status, body) = http_raw(&berth.base, get.as_bytes()).await.unwrap();
        assert_eq!(status, 200, "{file}");
        total += body.len();
    }
    println!("the page's files: {total} bytes");
    assert!(total <= 150_000, "{total} bytes");
    berth.terminate().await.assert_success();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_says_a_request_waits_for_quota_and_finds_berth_again_after_a_restart() {
    let Some(b) = Browser::start("quota-and-restart").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (_sim, config) = quota_of_two(dir.path()).await;
    let cfg = config.display().to_string();
    let berth = Berth::start(&["--config", &cfg], dir.path()).await;
    berth.until_label_ready(60, "small", 2, "two ready").await;
    b.client.goto(&format!("{}/ui", berth.base)).await.unwrap();
    sign_in(&b, CI).await;
    let r = berth.request(CI, &[("small", 3)]).await;
    let said = b
        .until(
            30,
            "the request waiting for the quota",
            &format!(
                "const w = document.querySelector('#requests tr[data-request=\"{}\"] .wait[data-reason=quota]'); \
                 return w && w.textContent",
                r.id
            ),
        )
        .await;
    assert!(
        said.as_str().unwrap().contains("quota is exhausted"),
        "{said}"
    );
    // The provider's pause, too.
    b.until(
        10,
        "the provider paused",
        "return document.querySelector('#providers tr[data-provider=sim]').textContent.includes('quota for')",
    )
    .await;
    let errors = b.console_errors().await;
    assert!(errors.is_empty(), "console errors: {errors:#?}");
    b.screenshot("waiting-for-quota").await;
    b.eval("window.stillTheSamePage = true; return true").await;

    // berth stops and starts again on the same address: the page finds it
    // by itself, and shows what the new process does.
    let addr = berth.base.trim_start_matches("http://").to_owned();
    berth.terminate().await.assert_success();
    b.until(
        30,
        "the page reconnecting",
        "return document.getElementById('link').dataset.state === 'reconnecting'",
    )
    .await;
    let berth = Berth::start(&["--config", &cfg, "--listen", &addr], dir.path()).await;
    b.until(
        30,
        "the page live again",
        "return document.getElementById('link').dataset.state === 'live'",
    )
    .await;
    // A request made after the restart shows up on the page.
    let after = berth.request(CI, &[("small", 1)]).await;
    b.until(
        30,
        "a request made after the restart",
        &format!(
            "return document.querySelector('#requests tr[data-request=\"{}\"]')",
            after.id
        ),
    )
    .await;
    assert_eq!(
        b.eval("return window.stillTheSamePage === true").await,
        true
    );
    b.screenshot("after-a-restart").await;
    // While berth was down the browser said it could not connect; nothing
    // else is an error.
    let errors: Vec<String> = (b.console_errors().await.into_iter())
        .filter(|m| !m.contains("ERR_CONNECTION_REFUSED") && !m.contains("503"))
        .collect();
    assert!(errors.is_empty(), "console errors: {errors:#?}");
    b.close().await;
    berth.terminate().await.assert_success();
}

/// With no tokens (the embedded default, on a loopback address) the page is
/// open, as the API is, with an admin's actions; and a page of another
/// origin still cannot make berth change anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tokens_the_page_is_open_and_other_origins_still_change_nothing() {
    let Some(b) = Browser::start("open").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let berth = Berth::start(&["--listen", "127.0.0.1:0"], dir.path()).await;
    b.client.goto(&format!("{}/ui", berth.base)).await.unwrap();
    b.until(
        30,
        "the board",
        "return !document.getElementById('board').hidden",
    )
    .await;
    assert_eq!(
        b.eval("return document.getElementById('who').textContent")
            .await,
        "open (no tokens configured)"
    );
    assert_eq!(
        b.eval("return document.getElementById('signin').hidden && document.getElementById('logout').hidden")
            .await,
        true
    );
    let node = b
        .until(60, "a ready node", "const r = document.querySelector('#nodes tr[data-state=ready]'); return r && r.dataset.node")
        .await;
    let node = node.as_str().unwrap().to_owned();
    let shown = b
        .eval(&format!(
            "return document.querySelector('#nodes tr[data-node=\"{node}\"] button[data-action=hold]').offsetParent !== null"
        ))
        .await;
    assert_eq!(shown, true, "an admin's actions");
    let errors = b.console_errors().await;
    assert!(errors.is_empty(), "console errors: {errors:#?}");
    b.screenshot("open").await;
    b.close().await;

    let put = |extra: &str| {
        let body = r#"{"idle": "hold"}"#;
        format!(
            "PUT /v1/nodes/{node}/idle HTTP/1.1\r\nHost: {}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n{extra}\
             Connection: close\r\n\r\n{body}",
            berth.base.trim_start_matches("http://"),
            body.len()
        )
    };
    for from in [
        "Origin: http://elsewhere.example\r\n",
        "Sec-Fetch-Site: cross-site\r\n",
    ] {
        let (status, said) = http_raw(&berth.base, put(from).as_bytes()).await.unwrap();
        assert_eq!(status, 403, "{from}: {said}");
    }
    let (_, n) = berth
        .call("GET", &format!("/v1/nodes/{node}"), None, None)
        .await;
    assert_eq!(n["idle"], "run", "unchanged: {n}");
    // From its own origin, or from no browser, the same call is taken.
    let own = format!("Origin: {}\r\n", berth.base);
    let (status, said) = http_raw(&berth.base, put(&own).as_bytes()).await.unwrap();
    assert_eq!(status, 200, "{said}");
    // A page of a name that resolves to this host (DNS rebinding) is its
    // own origin to the browser, and is refused even what it reads; the
    // same name from no browser is answered.
    let port = berth.base.rsplit(':').next().unwrap().to_owned();
    let get = |extra: &str| {
        format!(
            "GET /v1/nodes HTTP/1.1\r\nHost: rebound.example:{port}\r\n{extra}\
             Connection: close\r\n\r\n"
        )
    };
    let (status, said) = http_raw(&berth.base, get("Sec-Fetch-Mode: cors\r\n").as_bytes())
        .await
        .unwrap();
    assert_eq!(status, 403, "{said}");
    assert!(said.contains("loopback address"), "{said}");
    let (status, said) = http_raw(&berth.base, get("").as_bytes()).await.unwrap();
    assert_eq!(status, 200, "{said}");
    berth.terminate().await.assert_success();
}
