//! What the tests of the drivers for the fake clouds of tests/clouds share:
//! a pool under `berth serve` killed during creates and during deletes,
//! judged by the fake cloud's own record.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use berth_test_clouds::common::{Knobs, Machine, live_by_node};

use super::config::{CI, OPS};
use super::server::{Berth, Launch, until};

/// Creates cut off by SIGKILL, one per round.
pub const KILLS: usize = 4;

/// A pool of label `ci` (`min-ready = 1`) on one fake cloud, run by the
/// config at `config`.
pub struct KilledPool<'a> {
    pub knobs: &'a Knobs,
    /// The cloud's record of its machines.
    pub machines: &'a dyn Fn() -> Vec<Machine>,
    /// The cloud's operation names for a create and a delete.
    pub create: &'static str,
    pub delete: &'static str,
    /// The pool id as the cloud stores it in `berth-pool`.
    pub pool: &'static str,
    pub config: &'a Path,
    pub dir: &'a Path,
    pub env: &'a [(&'a str, &'a str)],
}

/// Nodes berth holds that are not gone, with their instance ids.
pub async fn held_nodes(server: &Berth) -> Vec<(String, String)> {
    let (_, nodes) = server.call("GET", "/v1/nodes", Some(OPS), None).await;
    (nodes.as_array().into_iter().flatten())
        .filter(|n| n["state"] != "gone")
        .map(|n| {
            let field = |k: &str| n[k].as_str().unwrap_or_default().to_owned();
            (field("id"), field("instance"))
        })
        .collect()
}

/// SIGKILL while creates are answered (the cloud made the machine, berth
/// never heard: answers held 1 s), with lists lagging 3 s behind creates,
/// [`KILLS`] times; then while deletes are. Afterwards the cloud's own
/// record holds one machine per node berth holds and nothing else, one per
/// cut-off create, deleted only for the nodes given back; and a restart's
/// adoption makes no create. Returns the record.
pub async fn survives_sigkill_during_creates_and_deletes(p: KilledPool<'_>) -> Vec<Machine> {
    p.knobs.hold(p.create, Duration::from_secs(1));
    p.knobs.set_lag(Duration::from_secs(3));
    let cfg = p.config.display().to_string();
    let args = ["--config", cfg.as_str()];
    let launch = || Launch {
        env: p.env,
        ..Launch::new(&args, p.dir)
    };
    let mut handed = Vec::new();
    for round in 0..KILLS {
        let server = Berth::launch(launch()).await;
        if round > 0 {
            server
                .until_label_ready(60, "ci", 1, "the cut-off create resolved")
                .await;
            let request = server.request(CI, &[("ci", 1)]).await;
            let r = server.fulfilled(CI, &request.id).await;
            handed.extend(r.nodes.into_iter().map(|n| n.id));
        }
        until(30, "the cloud to make the next machine", || async {
            ((p.machines)().len() > round).then_some(())
        })
        .await;
        server.signal(libc::SIGKILL);
        server.exit_within(Duration::from_secs(30)).await;
    }
    // Deletes cut off: the released nodes' deletes are held, and berth is
    // killed once the cloud has taken the first.
    p.knobs.hold(p.delete, Duration::from_secs(1));
    let server = Berth::launch(launch()).await;
    server
        .until_label_ready(60, "ci", 1, "the last create resolved")
        .await;
    let deletes = p.knobs.count(p.delete);
    for node in &handed {
        let (s, n) = server
            .call("POST", &format!("/v1/nodes/{node}/release"), Some(CI), None)
            .await;
        assert_eq!(s, 200, "{n}");
    }
    until(30, "a delete to reach the cloud", || async {
        (p.knobs.count(p.delete) > deletes).then_some(())
    })
    .await;
    server.signal(libc::SIGKILL);
    server.exit_within(Duration::from_secs(30)).await;

    p.knobs.hold(p.delete, Duration::ZERO);
    let server = Berth::launch(launch()).await;
    server
        .until_label_ready(60, "ci", 1, "the pool settled")
        .await;
    until(60, "every released node's machine to be gone", || async {
        let machines = (p.machines)();
        let live = live_by_node(&machines, "berth-pool", p.pool, "berth-node");
        (live.len() == 1).then_some(())
    })
    .await;
    // The cloud's record: one live machine per node berth holds, none
    // twice, none berth does not hold.
    let machines = (p.machines)();
    let live = live_by_node(&machines, "berth-pool", p.pool, "berth-node");
    assert!(live.values().all(|m| m.len() == 1), "duplicates: {live:#?}");
    let held: BTreeSet<String> = (held_nodes(&server).await.into_iter())
        .map(|(n, _)| n)
        .collect();
    let in_cloud: BTreeSet<String> = live.keys().cloned().collect();
    assert_eq!(in_cloud, held, "leaks or losses: {machines:#?}");
    // Each cut-off create, sent again after the kill, was answered with
    // the machine the first one made: one machine per round, none made
    // again (a create given up would leave its machine to be deleted as a
    // leak, and launch another), and the only ones deleted are the nodes
    // given back.
    assert_eq!(
        machines.len(),
        KILLS,
        "one machine per cut-off create: {machines:#?}"
    );
    let deleted: BTreeSet<String> = (machines.iter())
        .filter(|m| m.deleted)
        .filter_map(|m| m.tag("berth-node").map(str::to_owned))
        .collect();
    assert_eq!(deleted, handed.iter().cloned().collect(), "{machines:#?}");
    assert!(
        p.knobs.count(p.create) > KILLS as u64,
        "the creates were sent again: {:?}",
        p.knobs.calls()
    );

    // A restart adopts what is there and makes nothing.
    let creates = p.knobs.count(p.create);
    server.terminate().await.assert_success();
    let server = Berth::launch(launch()).await;
    server.until_ready(60, "the restarted pool listed").await;
    server
        .until_label_ready(60, "ci", 1, "the node adopted")
        .await;
    assert_eq!(p.knobs.count(p.create), creates, "{:?}", p.knobs.calls());
    assert_eq!((p.machines)().len(), machines.len());
    server.terminate().await.assert_success();
    machines
}
