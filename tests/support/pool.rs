//! A pool run in the test process, through the real host: its config, its
//! start, and waits and reads on it.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use berth::config::{self, LabelIx, Settings};
use berth::driver::{NODE_TAG, POOL_TAG};
use berth::pool::{NewRequest, NodeId, NodeState, Pool, Request, RequestState};
use berth::runtime::{self, Handle, Service, StartOptions};
use berth::sim::SimCloud;

use crate::support::config::test_store;
use crate::support::{SimServer, live, plugin, plugins_dir_and_name};

/// A config for one sim provider (plus `extra` TOML), with short timings.
pub fn pool_config(sim: &SimServer, state: &Path, extra: &str) -> Settings {
    let (plugins, driver) = plugins_dir_and_name(&plugin("sim"));
    let text = format!(
        r#"
pool-id = "itest"
ready = "running"
state-dir = {state:?}
plugins-dir = {plugins:?}
sync-interval = "1s"
boot-poll-interval = "100ms"
leak-grace = "1s"
delete-retry = "1s"
quota-pause = "1h"
capacity-pause = "1h"

[providers.sim]
driver = {driver:?}
max-concurrent-calls = 4
allow-hosts = ["{addr}"]
config = {{ endpoint = "{url}" }}

{extra}
"#,
        state = state.display().to_string(),
        addr = sim.addr(),
        url = sim.url(),
    );
    let text = text + &test_store(state);
    config::parse(&text, state, &|_| None).unwrap_or_else(|e| panic!("config: {e}\n{text}"))
}

pub async fn start(config: Settings) -> Service {
    runtime::start(
        config,
        StartOptions {
            seed: Some(7),
            ..Default::default()
        },
    )
    .await
    .expect("pool starts")
}

/// Polls `check` on the pool every 20 ms until it holds (at most `secs`).
pub async fn until_pool<F>(handle: &Handle, secs: u64, what: &str, check: F)
where
    F: Fn(&Pool) -> bool + Clone + Send + 'static,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if handle.inspect(check.clone()).await.expect("pool runs") {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            let state = handle
                .inspect(|p| {
                    p.nodes()
                        .map(|n| {
                            format!("{} {} {} {:?}", n.id, n.state.name(), n.label.0, n.instance)
                        })
                        .collect::<Vec<_>>()
                })
                .await;
            let providers = handle
                .inspect(|p| {
                    (0..p.config().providers.len())
                        .map(|i| {
                            format!(
                                "{:?}",
                                p.provider_status(berth::config::ProviderIx(i as u16))
                            )
                        })
                        .collect::<Vec<_>>()
                })
                .await;
            panic!("timed out waiting for {what}; nodes: {state:?}; providers: {providers:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Live nodes (not gone or failed) by id, with their instance ids.
pub fn live_nodes(p: &Pool) -> BTreeMap<NodeId, Option<String>> {
    p.nodes()
        .filter(|n| !matches!(n.state, NodeState::Gone { .. } | NodeState::Failed { .. }))
        .map(|n| (n.id, n.instance.clone()))
        .collect()
}

/// Submits a request of `requestor` for `wants`, waits for it and checks
/// it was fulfilled.
pub async fn fulfil(h: &Handle, requestor: &str, wants: Vec<(LabelIx, u32)>) -> Request {
    let id = h
        .submit(NewRequest {
            requestor: requestor.into(),
            priority: 0,
            wants,
            ..NewRequest::default()
        })
        .await
        .expect("request taken");
    let r = h.wait(id).await.unwrap().expect("request exists");
    assert!(matches!(r.state, RequestState::Fulfilled { .. }), "{r:?}");
    r
}

/// Live (not terminated) instances of this pool in the sim cloud, by node tag.
pub fn live_instances(cloud: &SimCloud) -> BTreeMap<String, String> {
    live(cloud)
        .into_iter()
        .filter(|i| i.tags.get(POOL_TAG).map(String::as_str) == Some("itest"))
        .map(|i| (i.tags.get(NODE_TAG).cloned().unwrap_or_default(), i.id))
        .collect()
}
