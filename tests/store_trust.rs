//! What berth does when its store cannot be trusted, through the `berth
//! serve` binary: a store damaged, emptied, replaced or set back to an
//! older copy, a state directory removed under a running process, and
//! instances made by hand in the cloud with the pool's tags. The rule each
//! test holds: no machine in use is deleted or handed out again, and no
//! instance berth cannot vouch for is adopted or deleted (docs/tags.md).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::SimServer;
use crate::support::config::{CI, OPS, OTHER, serve_config, set_lease_ttl};
use crate::support::server::{Berth, http, until};

/// A config of [`serve_config`] whose clients' leases outlast the test:
/// what is held here stays held because nobody gave it back, not because a
/// client renews.
fn config(sim: &SimServer, dir: &Path) -> String {
    let path = serve_config(sim, dir);
    set_lease_ttl(&path, "10m");
    path.display().to_string()
}

/// A sim cloud and `berth serve` on it with [`config`], ready: the sim, the
/// directory (state, config, log), the config's path and the server.
async fn started() -> (SimServer, tempfile::TempDir, String, Berth) {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&sim, dir.path());
    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    server.until_ready(30, "ready").await;
    (sim, dir, cfg, server)
}

/// The store's file in the state directory of [`serve_config`].
fn store_file(dir: &Path) -> PathBuf {
    dir.join("state").join("berth.db")
}

/// The sim's record of one instance.
fn instance(sim: &SimServer, id: &str) -> berth::sim::Instance {
    sim.cloud
        .instances()
        .into_iter()
        .find(|i| i.id == id)
        .unwrap_or_else(|| panic!("no instance {id} in the sim"))
}

fn is_live(sim: &SimServer, id: &str) -> bool {
    instance(sim, id).state != berth::sim::InstanceState::Terminated
}

/// How many deletes of `id` (alone or in a batch) reached the cloud.
fn deletes_of(sim: &SimServer, id: &str) -> usize {
    let all = crate::support::deletes(&sim.cloud).into_iter();
    all.filter(|(i, _)| i == id).count()
}

/// A node's view, as an admin sees it.
async fn node(server: &Berth, id: &str) -> Value {
    let (s, n) = server
        .call("GET", &format!("/v1/nodes/{id}"), Some(OPS), None)
        .await;
    assert_eq!(s, 200, "{n}");
    n
}

/// The sim provider's view.
async fn provider(server: &Berth) -> Value {
    let (_, all) = server.call("GET", "/v1/providers", Some(OPS), None).await;
    all.as_array()
        .and_then(|a| a.iter().find(|p| p["name"] == "sim").cloned())
        .unwrap_or_else(|| panic!("no provider sim in {all}"))
}

/// Waits until berth has listed the cloud `lists` more times: enough for
/// whatever those lists would make it do to have been done.
async fn lists_pass(server: &Berth, sim: &SimServer, lists: usize) {
    let count = || {
        (sim.cloud.calls().iter())
            .filter(|c| c.method == "GET" && c.path == "/v1/instances")
            .count()
    };
    let from = count();
    until(30, &format!("{lists} more lists"), || async {
        (count() >= from + lists).then_some(())
    })
    .await;
    // The last list's answer is taken in before the next call is made.
    let _ = server.call("GET", "/healthz", None, None).await;
}

/// Requests `count` nodes of `small` as `token` and waits until they are
/// handed out; their node ids and instance ids.
async fn hand_out(server: &Berth, token: &str, count: u32) -> Vec<(String, String)> {
    let r = server.request(token, &[("small", count)]).await;
    let r = server.fulfilled(token, &r.id).await;
    let mut held = Vec::new();
    for n in &r.nodes {
        let view = node(server, &n.id).await;
        let instance = view["instance"].as_str().expect("instance").to_owned();
        held.push((n.id.clone(), instance));
    }
    held
}

/// Waits until the cloud shows each instance of `held` tagged as handed
/// out (`berth-request`): what the store's loss is checked against.
async fn tagged_as_held(sim: &SimServer, held: &[(String, String)]) {
    until(20, "hand-outs tagged in the cloud", || async {
        held.iter()
            .all(|(_, i)| instance(sim, i).tags.contains_key("berth-request"))
            .then_some(())
    })
    .await;
}

/// One corrupted character in `berth.db`, in the instance id of a node in
/// use. Before: berth started without a word and, 5 s later, deleted the
/// machine in use as a leak (its own `berth-node` tag named the node in
/// use). Now the machine is kept (in quarantine) while its node is in use,
/// and deleted only once its holder releases it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_corrupted_character_in_the_store_never_costs_the_machine_in_use() {
    let (sim, dir, cfg, server) = started().await;
    let held = hand_out(&server, CI, 1).await;
    let (id, inst) = held[0].clone();
    tagged_as_held(&sim, &held).await;
    server.terminate().await.assert_success();

    // The first place the id is written is the node row's `instance`
    // column; its last character is changed.
    let path = store_file(dir.path());
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes
        .windows(inst.len())
        .position(|w| w == inst.as_bytes())
        .expect("the instance id in the store");
    bytes[at + inst.len() - 1] = b'z';
    std::fs::write(&path, &bytes).unwrap();

    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    server.until_ready(30, "ready again").await;
    lists_pass(&server, &sim, 8).await;
    assert_eq!(deletes_of(&sim, &inst), 0, "{}", server.log_text());
    assert!(is_live(&sim, &inst));
    assert_eq!(node(&server, &id).await["state"], "in-use");
    let p = provider(&server).await;
    let kept = p["quarantined"].as_array().expect("in quarantine");
    assert!(
        kept.iter().any(|q| q["instance"] == inst.as_str()
            && q["why"].as_str().unwrap_or("").contains("which is in use")),
        "{p}"
    );

    // Released by its holder: the node goes, and its machine with it.
    let (s, _) = server
        .call("POST", &format!("/v1/nodes/{id}/release"), Some(CI), None)
        .await;
    assert_eq!(s, 200);
    until(30, "the released machine deleted", || async {
        (!is_live(&sim, &inst)).then_some(())
    })
    .await;
    server.terminate().await.assert_success();
}

/// The store emptied to 0 bytes. Before: berth started as a new pool,
/// adopted every machine as ready, and handed the machines in use to other
/// clients. Now the new store finds instances it cannot vouch for: it
/// creates, hands out and deletes nothing on that provider and says why;
/// `--adopt-instances` then takes them on purpose, the ones in use on
/// hold, so only the free ones are handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emptied_store_never_hands_a_machine_in_use_to_another_client() {
    let (sim, dir, cfg, server) = started().await;
    let held = hand_out(&server, CI, 2).await;
    tagged_as_held(&sim, &held).await;
    until(20, "min-ready refilled", || async {
        (crate::support::live(&sim.cloud).len() == 4).then_some(())
    })
    .await;
    server.terminate().await.assert_success();
    let before: Vec<String> = (crate::support::live(&sim.cloud).iter())
        .map(|i| i.id.clone())
        .collect();

    let path = store_file(dir.path());
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(0)
        .unwrap();
    let creates = crate::support::creates(&sim.cloud);

    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    let p = until(30, "the provider held", || async {
        let p = provider(&server).await;
        (p["status"] == "store-mismatch").then_some(p)
    })
    .await;
    let why = p["store_mismatch"].as_str().unwrap_or_default();
    assert!(
        why.contains("4 live instances") && why.contains("not faced the clouds"),
        "{p}"
    );
    assert_eq!(p["quarantined"].as_array().map(Vec::len), Some(4), "{p}");
    let (s, ready) = server.call("GET", "/readyz", None, None).await;
    assert_eq!(s, 503, "{ready}");
    assert!(ready.to_string().contains("creates nothing"), "{ready}");
    assert!(
        server
            .log_text()
            .contains("put back the store that made them")
            || server
                .log_text()
                .contains("Put back the store that made them"),
        "{}",
        server.log_text()
    );
    let wants = server.request(OTHER, &[("small", 1)]).await;
    lists_pass(&server, &sim, 5).await;
    let r = server.client(OTHER).request(&wants.id, None).await.unwrap();
    assert_eq!(r.state, "pending", "{r:?}");
    assert_eq!(
        crate::support::creates(&sim.cloud),
        creates,
        "nothing created"
    );
    for i in &before {
        assert_eq!(deletes_of(&sim, i), 0, "{i} deleted");
    }
    server.terminate().await.assert_success();

    // Adopted on purpose: the machines in use on hold, the free ones ready.
    let server = Berth::start(&["--config", &cfg, "--adopt-instances"], dir.path()).await;
    let r = server.fulfilled(OTHER, &wants.id).await;
    let given = node(&server, &r.nodes[0].id).await;
    let given = given["instance"].as_str().unwrap_or_default().to_owned();
    assert!(before.contains(&given), "one of the free machines: {given}");
    for (id, inst) in &held {
        assert_ne!(&given, inst, "a machine in use handed out again");
        let view = node(&server, id).await;
        assert_eq!(view["idle"], "hold", "{view}");
    }
    assert!(server.log_text().contains("adopting on purpose"));
    for i in &before {
        assert_eq!(deletes_of(&sim, i), 0, "{i} deleted");
    }
    server.terminate().await.assert_success();

    // From then on the store vouches for them without being told.
    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    server.until_ready(30, "ready on the adopting store").await;
    assert_eq!(provider(&server).await["status"], "ok");
    server.terminate().await.assert_success();
}

/// The store set back to an older copy of itself (what a damaged log's
/// last commits lost): a node it has ready was handed out since. Its
/// machine's tags say so, so it is put on hold, and another client gets
/// another machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_lost_its_last_commits_never_hands_a_machine_out_twice() {
    let (sim, dir, cfg, server) = started().await;
    until(20, "two ready", || async {
        (crate::support::live(&sim.cloud).len() == 2).then_some(())
    })
    .await;
    server.terminate().await.assert_success();
    let path = store_file(dir.path());
    let older = std::fs::read(&path).unwrap();

    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    server.until_ready(30, "ready").await;
    let held = hand_out(&server, CI, 1).await;
    tagged_as_held(&sim, &held).await;
    server.terminate().await.assert_success();

    std::fs::write(&path, older).unwrap();
    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    let (id, inst) = &held[0];
    until(30, "the lost hand-out put on hold", || async {
        (node(&server, id).await["idle"] == "hold").then_some(())
    })
    .await;
    assert!(
        server.log_text().contains("put on hold"),
        "{}",
        server.log_text()
    );
    let theirs = hand_out(&server, OTHER, 2).await;
    for (other, i) in &theirs {
        assert_ne!(other, id);
        assert_ne!(i, inst, "handed out twice");
    }
    assert_eq!(deletes_of(&sim, inst), 0);
    server.terminate().await.assert_success();
}

/// The state directory removed, or the store file replaced, while berth
/// runs. Before: berth went on as if nothing had happened (its commits
/// went to a file nobody would read again) and `/healthz` stayed 200. Now
/// it stops within seconds with code 3, as with a full disk, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_removed_or_replaced_under_berth_ends_it_with_code_3() {
    type Harm = fn(&Path);
    let harms: [(&str, Harm, &str); 2] = [
        (
            "state directory removed",
            |dir| std::fs::remove_dir_all(dir.join("state")).unwrap(),
            "is gone",
        ),
        (
            "store file replaced",
            |dir| {
                let path = store_file(dir);
                let copy = path.with_extension("copy");
                std::fs::copy(&path, &copy).unwrap();
                std::fs::rename(&copy, &path).unwrap();
            },
            "was replaced",
        ),
    ];
    for (what, harm, says) in harms {
        let (_sim, dir, _cfg, server) = started().await;
        harm(dir.path());
        let exited = server.exit_within(Duration::from_secs(10)).await;
        exited.assert_code(3);
        let log = exited.log_text();
        assert!(log.contains(says), "{what}: {log}");
    }
}

/// A server made by hand in the cloud, with every tag of the pool right
/// but the signature (the store's generation too). Before: adopted as a
/// ready node and handed to a CI client. Now it is never handed out nor
/// deleted, and shown in quarantine for a person. And instances made
/// before signed tags, whose nodes the store knows, are signed at the
/// next start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_instance_is_never_handed_out_and_known_ones_are_signed() {
    let (sim, dir, cfg, server) = started().await;
    let real = until(20, "a signed instance", || async {
        crate::support::live(&sim.cloud)
            .into_iter()
            .find(|i| i.tags.contains_key("berth-sig"))
    })
    .await;
    let mut tags = real.tags.clone();
    tags.insert("berth-node".into(), "n-00000000deadbeef".into());
    tags.insert("berth-sig".into(), "0".repeat(32));
    let (s, forged) = http(
        &sim.url(),
        "POST",
        "/v1/instances",
        None,
        Some(json!({"instance_type": "small", "image": "img", "tags": tags})),
    )
    .await
    .unwrap();
    assert_eq!(s, 201, "{forged}");
    let forged: Value = serde_json::from_str(&forged).unwrap();
    let forged = forged["id"].as_str().unwrap().to_owned();
    let p = until(20, "the forged instance in quarantine", || async {
        let p = provider(&server).await;
        p["quarantined"]
            .as_array()
            .is_some_and(|q| !q.is_empty())
            .then_some(p)
    })
    .await;
    let q = &p["quarantined"][0];
    assert_eq!(q["instance"], forged.as_str(), "{p}");
    assert!(
        q["why"].as_str().unwrap_or("").contains("does not match"),
        "{p}"
    );
    let m = server.metrics(Some(OPS)).await;
    assert_eq!(
        crate::support::metric(&m, "berth_instances_quarantined{provider=\"sim\"}"),
        Some(1.0)
    );
    let mine = hand_out(&server, CI, 3).await;
    assert!(mine.iter().all(|(_, i)| *i != forged), "forged handed out");
    lists_pass(&server, &sim, 4).await;
    assert_eq!(deletes_of(&sim, &forged), 0);
    assert!(is_live(&sim, &forged));
    server.terminate().await.assert_success();

    // A ready node's instance as a berth before signed tags left it.
    let ready = crate::support::live(&sim.cloud)
        .into_iter()
        .find(|i| i.id != forged && !i.tags.contains_key("berth-request"))
        .expect("a ready node's instance");
    let mut old = ready.tags.clone();
    old.retain(|k, _| !matches!(k.as_str(), "berth-sig" | "berth-store" | "berth-request"));
    let (s, _) = http(
        &sim.url(),
        "PUT",
        &format!("/v1/instances/{}/tags", ready.id),
        None,
        Some(json!({ "tags": old })),
    )
    .await
    .unwrap();
    assert_eq!(s, 204);
    assert!(!instance(&sim, &ready.id).tags.contains_key("berth-sig"));
    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    server.until_ready(30, "ready again").await;
    until(20, "the known instance signed", || async {
        let tags = instance(&sim, &ready.id).tags;
        tags.get("berth-sig")
            .is_some_and(|s| s.len() == 32)
            .then_some(())
    })
    .await;
    let p = provider(&server).await;
    assert_eq!(
        p["quarantined"].as_array().map(Vec::len),
        Some(1),
        "only the forged: {p}"
    );
    server.terminate().await.assert_success();
}
