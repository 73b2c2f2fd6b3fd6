//! A `get` is believed only for the ids it asked about.

use serde_json::json;

use super::{Hostile, fulfilled, start};
use crate::support::server::until;

/// A driver whose `get` also answers for instances it was not asked about,
/// calling them terminated. The node in use is one of them each time the
/// booting node is looked at; berth takes the answer for the booting node
/// only, so the node in use stays with its holder, on its instance, and is
/// not even suspected missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_that_answers_for_instances_not_asked_about_changes_none_of_them() {
    let (_sim, _dir, server) = start(
        &[Hostile::new(
            "unasked",
            json!({"mode": "ok", "get": "unasked", "label": "unasked"}),
        )],
        &[],
    )
    .await;
    // One ready node (for min-ready), handed out; then its replacement
    // boots alone.
    server
        .until_label_ready(60, "unasked", 1, "a ready node")
        .await;
    let request = fulfilled(&server, "unasked", 60).await;
    let held = request["nodes"][0].clone();
    let path = format!("/v1/nodes/{}", held["id"].as_str().expect("node id"));
    // Its replacement for min-ready boots: looked at by `get`, which lies
    // about the node in use.
    until(60, "the driver to lie about the node in use", || async {
        (server.log_text())
            .contains("get answered for instances not asked about")
            .then_some(())
    })
    .await;
    server
        .until_label_ready(60, "unasked", 1, "the replacement ready")
        .await;
    let (_, node) = server.call("GET", &path, None, None).await;
    assert_eq!(node["state"], "in-use", "{node}");
    assert_eq!(node["instance"], held["instance"], "{node}");
    assert!(node.get("missing").is_none_or(|m| m.is_null()), "{node}");
    let (_, nodes) = server.call("GET", "/v1/nodes", None, None).await;
    let ours: Vec<_> = (nodes.as_array().expect("nodes").iter())
        .filter(|n| n["label"] == "unasked")
        .collect();
    assert_eq!(ours.len(), 2, "no node replaced: {nodes}");
    server.terminate().await.assert_success();
}
