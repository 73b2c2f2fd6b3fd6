//! Every shipped driver kept by berth itself, not only by the conformance
//! kit: a pool on the driver prewarms, serves a request from a ready node,
//! deletes the node once it is released and refills, and a restart on the
//! same state adopts the ready nodes without launching any. (The aws-ec2
//! driver's run is in `ec2.rs`, against moto.)

use std::path::Path;

use berth::config::{self, LabelIx};
use berth::pool::NodeState;

use crate::support::pool::{fulfil, live_instances, live_nodes, start, until_pool};
use crate::support::{SimServer, plugin, plugins_dir_and_name, scripted_plugin};

/// The config: one provider `p` on `driver` with `provider` TOML (its
/// `allow-hosts` and `config`), one label `small` with min-ready 2.
fn config_text(state: &Path, driver: &Path, provider: &str, instance_type: &str) -> String {
    format!(
        r#"
pool-id = "itest"
ready = "running"
state-dir = {state:?}
plugins-dir = {plugins:?}
sync-interval = "1s"
boot-poll-interval = "100ms"
leak-grace = "1s"
delete-retry = "1s"

[providers.p]
driver = {driver:?}
max-concurrent-calls = 2
{provider}

[labels.small]
min-ready = 2
[labels.small.providers.p]
instance-type = "{instance_type}"
image = "img"
vcpus = 1
ram = "1GiB"
"#,
        state = state.display().to_string(),
        plugins = plugins_dir_and_name(driver).0,
        driver = plugins_dir_and_name(driver).1,
    )
}

/// One round through berth; returns the ids of the instances berth holds at
/// the end (the two ready nodes), after the restart adopted them.
async fn one_round(name: &str, text: &str, state: &Path) -> Vec<String> {
    let config = config::parse(text, state, &|_| None)
        .unwrap_or_else(|e| panic!("{name} config: {e}\n{text}"));
    let small = LabelIx(0);
    let service = start(config.clone()).await;
    let h = service.handle.clone();
    // Cold starts compile the driver (seconds for Python or JavaScript).
    until_pool(&h, 120, "two ready nodes", move |p| {
        p.free_ready(small) == 2
    })
    .await;
    let ready = h.inspect(live_nodes).await.unwrap();
    assert_eq!(ready.len(), 2, "{name}: {ready:?}");

    let node = fulfil(&h, "ci", vec![(small, 1)]).await.nodes[0];
    assert!(ready.contains_key(&node), "{name}: {node} was not ready");
    h.release(node).await.expect("release");
    until_pool(&h, 30, "released node gone", move |p| {
        p.node(node)
            .is_some_and(|n| matches!(n.state, NodeState::Gone { .. }))
    })
    .await;
    until_pool(&h, 30, "refilled", move |p| p.free_ready(small) == 2).await;
    let before = h.inspect(live_nodes).await.unwrap();
    service.stop().await.expect("clean stop");

    // A restart on the same state: the same nodes, from the store and the
    // driver's list; nothing launched.
    let service = start(config).await;
    let h = service.handle.clone();
    until_pool(&h, 60, "listed after the restart", move |p| {
        p.provider_status(berth::config::ProviderIx(0)).listed && p.free_ready(small) == 2
    })
    .await;
    let after = h.inspect(live_nodes).await.unwrap();
    assert_eq!(after, before, "{name}: the restart changed the nodes");
    service.stop().await.expect("clean stop");
    after.into_values().flatten().collect()
}

/// A driver of the sim cloud's API (the Python and JavaScript ones): the
/// cloud's own record must match what berth holds.
async fn sim_driver_in_berth(name: &'static str) {
    let wasm = tokio::task::spawn_blocking(move || scripted_plugin(name))
        .await
        .unwrap();
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let provider = format!(
        "allow-hosts = [\"{}\"]\nconfig = {{ endpoint = \"{}\" }}",
        sim.addr(),
        sim.url()
    );
    let text = config_text(dir.path(), &wasm, &provider, "small");
    let mut held = one_round(name, &text, dir.path()).await;
    held.sort();
    // Three launched (two, then the refill), one deleted.
    let mut live: Vec<String> = live_instances(&sim.cloud).into_values().collect();
    live.sort();
    assert_eq!(live, held, "{name}: the cloud and berth disagree");
    assert_eq!(sim.cloud.instances().len(), 3, "{name}: launched once each");
}

#[tokio::test]
async fn berth_keeps_a_pool_on_the_python_driver() {
    sim_driver_in_berth("python-example").await;
}

#[tokio::test]
async fn berth_keeps_a_pool_on_the_javascript_driver() {
    sim_driver_in_berth("js-example").await;
}

#[tokio::test]
async fn berth_keeps_a_pool_on_the_static_driver() {
    // Three hosts of one job each, each port answering the ready check.
    let mut listeners = Vec::new();
    for _ in 0..3 {
        listeners.push(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let addrs: Vec<_> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let allow: Vec<String> = addrs.iter().map(|a| format!("\"{a}\"")).collect();
    let provider = format!(
        "allow-hosts = [{}]\nconfig = {}",
        allow.join(", "),
        toml::Value::try_from(crate::support::config::hosts(&addrs, 1)).expect("TOML")
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let text = config_text(dir.path(), &plugin("static"), &provider, "small");
    let held = one_round("static", &text, dir.path()).await;
    // Two hosts held, as two different instances.
    assert_eq!(held.len(), 2, "{held:?}");
    assert_ne!(held[0], held[1]);
}
