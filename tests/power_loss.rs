//! Power loss, through the `berth serve` binary: berth keeps its state on an
//! ext4 file system on a loop device; right after a client has seen a
//! hand-out, the device's backing image is copied (what the disk holds at
//! that moment; what was written but not synced is lost) and berth is
//! killed. berth is started again on the copy, against the same cloud, and
//! a second client asks for nodes. The first client's nodes must still be
//! its own, and none of their instances may be handed to the second.
//! Needs root (loop mounts); skipped elsewhere with a message.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use berth::client::types::{Node, Request};

use crate::support::SimServer;
use crate::support::config::{CI, OPS, OTHER, serve_config};
use crate::support::disk::{LoopFs, skip};
use crate::support::server::{Berth, until};

/// Trials per run.
const TRIALS: u64 = 20;

/// What one trial found after the restart on the copy.
#[derive(Debug, Default)]
struct Found {
    /// The first client's nodes no longer in use by it.
    lost: Vec<String>,
    /// Instances handed to both clients.
    twice: Vec<String>,
}

/// berth's config for the trial: the serve tests' pool (label `small`, two
/// ready) with a long lease, so that nothing is taken back while berth is
/// down, and the given store sync level.
fn config(sim: &SimServer, dir: &Path, sync: &str) -> String {
    let path = serve_config(sim, dir);
    let text = std::fs::read_to_string(&path).unwrap().replacen(
        "lease-ttl = \"3s\"",
        "lease-ttl = \"10m\"",
        1,
    ) + &format!("\n[store]\nsync = \"{sync}\"\n");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

async fn kill(server: Berth) {
    server.signal(9);
    let _ = server.exit_within(Duration::from_secs(30)).await;
}

/// Node ids and instances of a fulfilled request view.
fn handed(request: &Request) -> Vec<(String, String)> {
    let instance = |n: &Node| n.instance.clone().unwrap_or_default();
    request
        .nodes
        .iter()
        .map(|n| (n.id.clone(), instance(n)))
        .collect()
}

/// One hand-out, a power cut `delay` after it, a restart on the copy and a
/// second client's request.
async fn trial(dir: &Path, sync: &str, delay: Duration) -> Result<Found, String> {
    let sim = SimServer::start().await;
    let cfg = config(&sim, dir, sync);
    let state = dir.join("state");
    let disk = LoopFs::create(&dir.join("disk.img"), &state, 64)?;
    let server = Berth::start(&["--config", &cfg], dir).await;
    server
        .until_label_ready(60, "small", 2, "two ready nodes")
        .await;
    let request = server.request(CI, &[("small", 2)]).await;
    assert_eq!(request.state, "fulfilled", "{request:?}");
    // The client has seen its nodes; the power goes.
    tokio::time::sleep(delay).await;
    let cut = dir.join("cut.img");
    disk.power_cut(&cut);
    kill(server).await;
    drop(disk);
    let a = handed(&request);
    assert_eq!(a.len(), 2, "{request:?}");

    let disk = LoopFs::mount(&cut, &state)?;
    let server = Berth::start(&["--config", &cfg], dir).await;
    let mut found = Found::default();
    for (node, _) in &a {
        let (_, n) = server
            .call("GET", &format!("/v1/nodes/{node}"), Some(OPS), None)
            .await;
        if n["state"] != "in-use" || n["requestor"] != "ci" {
            found
                .lost
                .push(format!("{node}: {} for {}", n["state"], n["requestor"]));
        }
    }
    let id = server.request(OTHER, &[("small", 2)]).await.id;
    let other = server.client(OTHER);
    let b = until(60, "the second request fulfilled", || async {
        let r = other.request(&id, None).await.ok()?;
        (r.state == "fulfilled").then_some(r)
    })
    .await;
    let a_instances: BTreeSet<String> = a.into_iter().map(|(_, i)| i).collect();
    found.twice = handed(&b)
        .into_iter()
        .map(|(_, i)| i)
        .filter(|i| a_instances.contains(i))
        .collect();
    kill(server).await;
    drop(disk);
    let _ = std::fs::remove_file(&cut);
    let _ = std::fs::remove_file(dir.join("disk.img"));
    Ok(found)
}

/// Runs the trials at sync level `sync`; `None` if this machine cannot.
async fn trials(sync: &str) -> Option<Vec<Found>> {
    let mut all = Vec::new();
    for i in 0..TRIALS {
        let dir = tempfile::tempdir().unwrap();
        // Cuts spread over the first 10 ms after the answer.
        let delay = Duration::from_micros(i * 10_000 / TRIALS);
        match trial(dir.path(), sync, delay).await {
            Ok(found) => all.push(found),
            Err(why) if i == 0 => {
                skip("a_hand_out_a_client_has_seen_survives_power_loss", &why);
                return None;
            }
            Err(why) => panic!("trial {i}: {why}"),
        }
    }
    Some(all)
}

/// With `sync = "full"` (the default), 20 power cuts right after
/// hand-outs: every hand-out survives and no instance is handed out twice.
#[tokio::test]
async fn a_hand_out_a_client_has_seen_survives_power_loss() {
    let Some(found) = trials("full").await else {
        return;
    };
    let lost: Vec<&String> = found.iter().flat_map(|f| &f.lost).collect();
    let twice: Vec<&String> = found.iter().flat_map(|f| &f.twice).collect();
    eprintln!(
        "{TRIALS} power cuts after hand-outs: {} hand-outs lost, {} instances handed out twice",
        lost.len(),
        twice.len()
    );
    assert!(lost.is_empty(), "hand-outs lost: {lost:?}");
    assert!(twice.is_empty(), "instances handed out twice: {twice:?}");
}
