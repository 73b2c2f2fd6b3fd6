//! `berth serve` on the PostgreSQL store (`[store] url`), through the
//! binary, on a fresh database of this test process's throwaway cluster
//! (support/postgres.rs): the pool's records live in PostgreSQL and survive
//! a SIGKILL, a second process on the same database is refused, and a wrong
//! password is a clear error.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::serve::{CI, OPS, serve_config_with};
use crate::support::postgres::{PgCluster, psql};
use crate::support::server::{Berth, Launch, until};
use crate::support::{SimServer, plugin, workspace};

/// A fresh database: its url with the password (for psql) and a `[store]`
/// table that names it without one and reads the password from a file in
/// `dir`.
fn database(dir: &Path, password: Option<&str>) -> (String, String) {
    let cluster = PgCluster::shared(&workspace());
    let url = cluster.fresh_database("serve");
    let bare = url.replacen(&format!("berth:{}@", cluster.password()), "berth@", 1);
    assert_ne!(bare, url);
    std::fs::write(
        dir.join("pgpass"),
        format!("{}\n", password.unwrap_or(cluster.password())),
    )
    .unwrap();
    let store = format!("[store]\nurl = {bare:?}\npassword-file = \"pgpass\"\n");
    (url, store)
}

fn config(sim: &SimServer, dir: &Path, store: &str) -> String {
    serve_config_with(sim, dir, &plugin("sim"), "min-ready = 2", store)
        .display()
        .to_string()
}

async fn nodes(server: &Berth) -> Vec<Value> {
    let (s, v) = server.call("GET", "/v1/nodes", Some(OPS), None).await;
    assert_eq!(s, 200, "{v}");
    v.as_array().unwrap().clone()
}

/// The sim's instances that are not deleted, by id.
fn live_instances(sim: &SimServer) -> Vec<String> {
    let mut ids: Vec<String> = sim
        .cloud
        .instances()
        .into_iter()
        .filter(|i| i.state != berth::sim::InstanceState::Terminated)
        .map(|i| i.id)
        .collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_keeps_its_pool_in_postgres_across_a_sigkill() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (url, store) = database(dir.path(), None);
    let cfg = config(&sim, dir.path(), &store);
    let server = Berth::start(&["--config", &cfg], dir.path()).await;

    let request = server.request(CI, &[("small", 1)]).await;
    let done = server.fulfilled(CI, &request.id).await;
    let mine = done.nodes[0].id.clone();
    until(30, "two ready nodes", || async {
        let n = nodes(&server).await;
        (n.iter().filter(|n| n["state"] == "ready").count() == 2).then_some(())
    })
    .await;
    // The records are in PostgreSQL, not in a file.
    let stored = psql(
        &url,
        "SELECT count(*) FROM nodes WHERE state IN ('ready', 'in-use')",
    )
    .unwrap();
    assert_eq!(stored, "3");
    assert!(!dir.path().join("state/berth.db").exists());

    let before = nodes(&server).await;
    server.signal(libc::SIGKILL);
    server.exit_within(Duration::from_secs(30)).await;
    let creates = || {
        sim.cloud
            .calls()
            .iter()
            .filter(|c| c.method == "POST" && c.path == "/v1/instances")
            .count()
    };
    let created = creates();

    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    until(30, "ready again", || async {
        (server.call("GET", "/readyz", None, None).await.0 == 200).then_some(())
    })
    .await;
    let (_, n) = server
        .call("GET", &format!("/v1/nodes/{mine}"), Some(OPS), None)
        .await;
    assert_eq!(n["state"], "in-use", "kept across the SIGKILL: {n}");
    let after = nodes(&server).await;
    let key = |v: &[Value]| {
        let mut k: Vec<(String, String, String)> = v
            .iter()
            .map(|n| {
                (
                    n["id"].as_str().unwrap_or_default().to_owned(),
                    n["state"].as_str().unwrap_or_default().to_owned(),
                    n["instance"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        k.sort();
        k
    };
    assert_eq!(
        key(&after),
        key(&before),
        "the same nodes after the restart"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(creates(), created, "no create after the restart");
    // Every live instance of the cloud is one of berth's nodes.
    let mut known: Vec<String> = after
        .iter()
        .filter_map(|n| n["instance"].as_str().map(str::to_owned))
        .collect();
    known.sort();
    assert_eq!(live_instances(&sim), known);
    server.terminate().await.assert_success();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_berth_on_the_same_database_is_refused() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (_url, store) = database(dir.path(), None);
    let cfg = config(&sim, dir.path(), &store);
    let first = Berth::start(&["--config", &cfg], dir.path()).await;

    let other = tempfile::tempdir().unwrap();
    std::fs::copy(dir.path().join("pgpass"), other.path().join("pgpass")).unwrap();
    let cfg2 = config(&sim, other.path(), &store);
    let exited = Berth::spawn(Launch::new(&["--config", &cfg2], other.path()))
        .exit_within(Duration::from_secs(60))
        .await;
    assert_ne!(exited.status.code(), Some(0));
    let log = exited.log_text();
    assert!(
        log.contains("another berth process uses this PostgreSQL database"),
        "{log}"
    );
    // The first goes on serving.
    let request = first.request(CI, &[("small", 1)]).await;
    first.fulfilled(CI, &request.id).await;
    first.terminate().await.assert_success();
}

#[tokio::test]
async fn a_wrong_password_ends_the_start_naming_the_database() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (_url, store) = database(dir.path(), Some("not-the-password"));
    let cfg = config(&sim, dir.path(), &store);
    let exited = Berth::spawn(Launch::new(&["--config", &cfg], dir.path()))
        .exit_within(Duration::from_secs(60))
        .await;
    assert_ne!(exited.status.code(), Some(0));
    let log = exited.log_text();
    assert!(
        log.contains("opening the PostgreSQL store postgres://berth@127.0.0.1:"),
        "{log}"
    );
    assert!(log.contains("password authentication failed"), "{log}");
    assert!(!log.contains("not-the-password"), "{log}");
}
