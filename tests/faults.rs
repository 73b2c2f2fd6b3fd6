//! Lists that lie, through the `berth serve` binary: a fault-injecting
//! proxy sits between berth's sim driver and the sim cloud and answers the
//! lists wrongly (one empty answer, empty answers for 40 s, the first page
//! only, later pages that fail, pages that never end, a page token too
//! large to keep, `500`, a malformed body, no answer, a reset connection) while
//! berth holds five nodes in use and five ready. Whatever the lists say,
//! checked against the sim cloud's own record: no instance is deleted, none
//! is created, the nodes in use stay with their holder, the provider's
//! trouble is visible through the API, and afterwards every node is where it
//! was. docs/missing-instances.md states the rules.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::fault_proxy::{FaultProxy, ListFault};
use crate::support::server::{Berth, Launch, http, until};
use crate::support::{SimServer, live, plugin, plugins_dir_and_name};

/// Most instances the provider may hold.
const MAX: usize = 12;

struct Rig {
    sim: SimServer,
    proxy: FaultProxy,
    server: Berth,
    _dir: tempfile::TempDir,
}

/// berth on the sim behind the proxy: label `small` keeps 5 ready, pages of
/// 4, a 3 s call deadline, `missing-confirm` as given (or its default, 1
/// minute). The sim forgets a
/// deleted instance at once, so that it goes missing from lists rather than
/// being listed as terminated.
async fn rig(missing_confirm: Option<&str>) -> Rig {
    let sim = SimServer::start_with(berth::sim::Knobs {
        terminated_retention_ms: 0,
        ..Default::default()
    })
    .await;
    let proxy = FaultProxy::start(sim.addr()).await;
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        r#"
pool-id = "faults"
ready = "running"
state-dir = {state:?}
plugins-dir = {plugins:?}
sync-interval = "1s"
boot-poll-interval = "100ms"
leak-grace = "1s"
delete-retry = "2s"
{missing_confirm}

[api]
listen = "127.0.0.1:0"

[providers.sim]
driver = {driver:?}
allow-hosts = ["{addr}"]
config = {{ endpoint = "{url}", page_size = 4 }}
[providers.sim.sandbox]
call-deadline = "3s"
[providers.sim.limits]
max-instances = {MAX}

[labels.small]
min-ready = 5
[labels.small.providers.sim]
instance-type = "small"
image = "img"
vcpus = 1
ram = "1GiB"
"#,
        state = dir.path().join("state").display().to_string(),
        plugins = plugins_dir_and_name(&plugin("sim")).0,
        driver = plugins_dir_and_name(&plugin("sim")).1,
        addr = proxy.addr(),
        url = proxy.url(),
        missing_confirm = missing_confirm
            .map(|d| format!("missing-confirm = \"{d}\""))
            .unwrap_or_default(),
    );
    let text = text + &crate::support::config::test_store(dir.path());
    let config = dir.path().join("berth.toml");
    std::fs::write(&config, text).unwrap();
    let cfg = config.display().to_string();
    let server = Berth::launch(Launch::new(&["--config", &cfg], dir.path())).await;
    Rig {
        sim,
        proxy,
        server,
        _dir: dir,
    }
}

impl Rig {
    /// Live instances in the sim cloud's own record.
    fn live(&self) -> BTreeSet<String> {
        live(&self.sim.cloud).into_iter().map(|i| i.id).collect()
    }

    async fn ready(&self) -> u64 {
        let (_, l) = self.server.call("GET", "/v1/labels", None, None).await;
        l[0]["ready"].as_u64().unwrap_or(0)
    }

    /// Five nodes in use (one request) and five ready; their node views.
    async fn settle_ten(&self) -> Vec<Value> {
        until(60, "5 ready", || async {
            (self.ready().await >= 5).then_some(())
        })
        .await;
        let (s, r) = self
            .server
            .call(
                "POST",
                "/v1/requests",
                None,
                Some(json!({"labels": {"small": 5}})),
            )
            .await;
        assert_eq!(s, 201, "{r}");
        let id = r["id"].as_str().unwrap().to_owned();
        let (_, r) = self
            .server
            .call("GET", &format!("/v1/requests/{id}?wait=60s"), None, None)
            .await;
        assert_eq!(r["state"], "fulfilled", "{r}");
        until(60, "5 ready again", || async {
            (self.ready().await >= 5).then_some(())
        })
        .await;
        // A believed list after the refill, so all ten are known.
        tokio::time::sleep(Duration::from_secs(2)).await;
        r["nodes"].as_array().unwrap().clone()
    }

    async fn node(&self, id: &str) -> Value {
        self.server
            .call("GET", &format!("/v1/nodes/{id}"), None, None)
            .await
            .1
    }

    async fn provider(&self) -> Value {
        let (_, p) = self.server.call("GET", "/v1/providers", None, None).await;
        p[0].clone()
    }
}

/// Runs `fault` for `hold` (or, for `EmptyOnce`, until it has been given
/// once), then checks everything the module docs promise; the list errors
/// `/v1/providers` showed meanwhile.
async fn under(fault: ListFault, hold: Duration) -> BTreeSet<String> {
    under_confirming(fault, hold, None).await
}

/// [`under`] with `missing-confirm` as given.
async fn under_confirming(
    fault: ListFault,
    hold: Duration,
    missing_confirm: Option<&str>,
) -> BTreeSet<String> {
    let rig = rig(missing_confirm).await;
    let in_use = rig.settle_ten().await;
    let before = rig.live();
    assert_eq!(before.len(), 10, "{before:?}");
    let calls_before = rig.sim.cloud.calls().len();
    let creates_before = crate::support::creates(&rig.sim.cloud);
    let deletes_before = crate::support::deletes(&rig.sim.cloud).len();

    rig.proxy.arm(Some(fault));
    let started = Instant::now();
    let mut seen_status = BTreeSet::new();
    let mut seen_errors = BTreeSet::new();
    let mut most_live = 0;
    loop {
        most_live = most_live.max(rig.live().len());
        let p = rig.provider().await;
        seen_errors.extend(p["list_error"].as_str().map(str::to_owned));
        let status = p["status"].as_str().unwrap_or("").to_owned();
        let missing = p["missing"].as_u64().unwrap_or(0);
        seen_status.insert(if missing > 0 {
            format!("{status}, {missing} missing")
        } else {
            status
        });
        let faulted = rig.proxy.lists().1;
        let done = match fault {
            ListFault::EmptyOnce => faulted >= 1 && started.elapsed() > Duration::from_secs(1),
            _ => started.elapsed() >= hold,
        };
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (lists, faulted) = rig.proxy.lists();
    rig.proxy.arm(None);
    // Lists are believed again.
    until(30, "the provider ok again", || async {
        let p = rig.provider().await;
        (p["status"] == "ok" && p["missing"].as_u64().unwrap_or(0) == 0).then_some(())
    })
    .await;
    // And nothing happened meanwhile, by the cloud's own record.
    let after_calls: Vec<_> = rig.sim.cloud.calls()[calls_before..].to_vec();
    let deletes = crate::support::deletes(&rig.sim.cloud).len() - deletes_before;
    let creates = crate::support::creates(&rig.sim.cloud) - creates_before;
    eprintln!(
        "{fault:?}: {faulted} of {lists} lists answered wrongly over {:?}; statuses seen {seen_status:?}; {deletes} deletes, {creates} creates, at most {most_live} live",
        started.elapsed()
    );
    assert_eq!(deletes, 0, "instances deleted: {after_calls:?}");
    assert_eq!(creates, 0, "instances created: {after_calls:?}");
    assert!(most_live <= MAX, "{most_live} live instances, above {MAX}");
    assert_eq!(rig.live(), before, "the cloud's instances changed");
    assert!(
        seen_status.iter().any(|s| s != "ok"),
        "the trouble never showed in /v1/providers"
    );
    for n in &in_use {
        let now = rig.node(n["id"].as_str().unwrap()).await;
        assert_eq!(now["state"], "in-use", "{now}");
        assert_eq!(now["instance"], n["instance"], "{now}");
    }
    // The holder gives one back, and it is deleted as usual.
    let id = in_use[0]["id"].as_str().unwrap();
    let (s, body) = rig
        .server
        .call("POST", &format!("/v1/nodes/{id}/release"), None, None)
        .await;
    assert_eq!(s, 200, "{body}");
    rig.server.terminate().await.assert_success();
    seen_errors
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_empty_list_costs_nothing() {
    under(ListFault::EmptyOnce, Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_lists_for_40_seconds_cost_nothing() {
    under(ListFault::Empty, Duration::from_secs(40)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_of_the_first_page_only_cost_nothing() {
    under(ListFault::Truncated, Duration::from_secs(20)).await;
}

/// Lists of the first page only for five times `missing-confirm`: the
/// instances they leave out are suspected, then looked up by id (`get`),
/// which shows them, so none is replaced and the cloud never holds more
/// than `max-instances`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_of_the_first_page_only_for_longer_than_missing_confirm_replace_nothing() {
    under_confirming(ListFault::Truncated, Duration::from_secs(15), Some("3s")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_that_fail_with_500_cost_nothing() {
    under(ListFault::Status500, Duration::from_secs(15)).await;
}

/// Lists whose first page comes back and whose next pages fail (ten
/// instances, pages of four): the first page is never taken for the whole
/// list, and nothing is replaced, created or deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_whose_later_pages_fail_cost_nothing() {
    under(ListFault::LaterPages500, Duration::from_secs(15)).await;
}

/// A cloud whose pages never end (each names a next one): berth follows
/// 1,000 pages, then gives that list up as an answer it cannot use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_that_never_end_cost_nothing() {
    let errors = under(ListFault::EndlessPages, Duration::from_secs(15)).await;
    assert!(
        errors
            .iter()
            .any(|e| e.contains("the list did not end after 1000 pages")),
        "{errors:?}"
    );
}

/// A page token larger than berth keeps (4,096 bytes) ends the list there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_token_too_large_to_keep_costs_nothing() {
    let errors = under(ListFault::HugeCursor, Duration::from_secs(10)).await;
    assert!(
        errors
            .iter()
            .any(|e| e.contains("a page's cursor of 5000 bytes (at most 4096)")),
        "{errors:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_lists_cost_nothing() {
    under(ListFault::Malformed, Duration::from_secs(15)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_that_never_answer_cost_nothing() {
    under(ListFault::Hang, Duration::from_secs(15)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_whose_connection_is_reset_cost_nothing() {
    under(ListFault::Reset, Duration::from_secs(15)).await;
}

/// The rule's other side: an instance that really is gone (deleted behind
/// berth's back) is confirmed after `missing-confirm`. A ready node is
/// replaced; a node in use stays with its holder, marked, and goes once
/// released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_really_gone_is_confirmed_and_only_a_free_node_replaced() {
    let rig = rig(Some("3s")).await;
    let in_use = rig.settle_ten().await;
    let (_, nodes) = rig
        .server
        .call("GET", "/v1/nodes?state=ready", None, None)
        .await;
    let ready = nodes[0].clone();
    let held = in_use[0].clone();
    for n in [&ready, &held] {
        let path = format!("/v1/instances/{}", n["instance"].as_str().unwrap());
        let (s, body) = http(&rig.sim.url(), "DELETE", &path, None, None)
            .await
            .expect("sim");
        assert!(s < 300, "{s} {body}");
    }
    until(30, "the ready node given up", || async {
        (rig.node(ready["id"].as_str().unwrap()).await["state"] == "gone").then_some(())
    })
    .await;
    let held_now = until(30, "the held node marked", || async {
        let n = rig.node(held["id"].as_str().unwrap()).await;
        (n["missing"]["state"] == "confirmed").then_some(n)
    })
    .await;
    assert_eq!(held_now["state"], "in-use", "{held_now}");
    until(30, "the ready node replaced", || async {
        (rig.ready().await >= 5).then_some(())
    })
    .await;
    let id = held["id"].as_str().unwrap();
    let (s, body) = rig
        .server
        .call("POST", &format!("/v1/nodes/{id}/release"), None, None)
        .await;
    assert_eq!(s, 200, "{body}");
    until(30, "the held node gone once released", || async {
        (rig.node(id).await["state"] == "gone").then_some(())
    })
    .await;
    let log = rig.server.log_text();
    assert!(
        log.contains("suspected missing"),
        "no WARN of the suspicion"
    );
    rig.server.terminate().await.assert_success();
}
