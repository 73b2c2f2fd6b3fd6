//! Drivers replaced while `berth serve` runs: a changed file in the driver's
//! directory is noticed, loaded beside the running driver and switched to
//! once it configured; a file that fails anything leaves the provider on
//! the driver it runs, saying why; a removed file stops nothing; a
//! rollback returns to the driver before. All through the binary.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use serde_json::{Value, json};

use crate::support::config::{CI, OPS, edit_config, serve_config_on};
use crate::support::server::{Berth, run_berth, until};
use crate::support::{
    SimServer, instances_and_nodes, live, metric, plugin, put, with_custom_section,
};

/// A sim cloud, and a plugins directory holding its driver as `sim.wasm`
/// with a config of provider `sim` on it.
struct Plugins {
    sim: SimServer,
    dir: tempfile::TempDir,
    config: PathBuf,
    driver: PathBuf,
    /// The driver's bytes, and their sha256.
    bytes: Vec<u8>,
    first: String,
}

impl Plugins {
    async fn new() -> Plugins {
        let sim = SimServer::start().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let plugins = dir.path().join("plugins");
        std::fs::create_dir(&plugins).expect("mkdir");
        let driver = plugins.join("sim.wasm");
        let bytes = std::fs::read(plugin("sim")).expect("the sim driver");
        put(&driver, &bytes);
        let config = serve_config_on(&sim, dir.path(), &driver);
        let first = sha256(&bytes);
        Plugins {
            sim,
            dir,
            config,
            driver,
            bytes,
            first,
        }
    }

    /// `berth serve` on the config, once it runs the first driver.
    async fn serve(&self) -> Berth {
        let args = ["--config", &self.config.display().to_string()];
        let server = Berth::start(&args, self.dir.path()).await;
        until_running(&server, &self.first, "the first driver").await;
        server
    }
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// `/v1/drivers`' entry of provider `sim`.
async fn sim_driver(server: &Berth) -> Value {
    let (status, drivers) = server.call("GET", "/v1/drivers", Some(OPS), None).await;
    assert_eq!(status, 200, "{drivers}");
    (drivers.as_array().into_iter().flatten())
        .find(|d| {
            d["providers"]
                .as_array()
                .is_some_and(|p| p.contains(&"sim".into()))
        })
        .cloned()
        .unwrap_or(Value::Null)
}

/// Waits until provider `sim` runs the driver of sha256 `sha`.
async fn until_running(server: &Berth, sha: &str, what: &str) -> Value {
    until(60, what, || async {
        let d = sim_driver(server).await;
        (d["sha256"] == sha).then_some(d)
    })
    .await
}

/// Waits until provider `sim` shows a reload error for the file of sha256
/// `sha` (empty: a file that could not be read), and answers it.
async fn until_refused(server: &Berth, sha: &str, what: &str) -> Value {
    until(60, what, || async {
        let d = sim_driver(server).await;
        (d["reload_error"]["sha256"] == sha).then_some(d)
    })
    .await
}

/// A request for one `small` node, fulfilled, and its node released.
async fn served(server: &Berth) {
    let r = server.request(CI, &[("small", 1)]).await;
    let r = server.fulfilled(CI, &r.id).await;
    let client = server.client(CI);
    for n in &r.nodes {
        client.release(&n.id).await.expect("release");
    }
}

#[tokio::test]
async fn a_driver_replaced_ten_times_under_churn_fails_no_request_and_loses_no_call() {
    let p = Plugins::new().await;
    let (sim, driver, bytes) = (&p.sim, &p.driver, &p.bytes);
    let server = Arc::new(p.serve().await);
    server
        .until_label_ready(60, "small", 2, "the first driver's nodes")
        .await;

    // Two clients request and release, one node at a time, all along.
    let stop = Arc::new(AtomicBool::new(false));
    let served_count = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..2 {
        let (server, stop, count) = (server.clone(), stop.clone(), served_count.clone());
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                served(&server).await;
                count.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }

    let mut before = p.first.clone();
    for n in 1..=10u8 {
        let build = with_custom_section(bytes, n);
        let sha = sha256(&build);
        put(driver, &build);
        let d = until_running(&server, &sha, &format!("build {n} running")).await;
        assert_eq!(d["previous_sha256"], before.as_str(), "{d}");
        assert!(d.get("reload_error").is_none(), "{d}");
        before = sha;
    }
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        // A request that failed panicked its client.
        c.await.expect("every request was served");
    }
    let served_count = served_count.load(Ordering::SeqCst);
    assert!(served_count >= 10, "{served_count} requests served");

    // The sim's own record: no node got a second instance (no create made
    // twice), and every live instance is a node berth holds (none lost).
    let (instances, nodes) = instances_and_nodes(&sim.cloud);
    assert_eq!(instances, nodes, "a node got two instances");
    until(
        60,
        "berth's nodes and the sim's live instances agree",
        || async {
            let client = server.client(OPS);
            let held: std::collections::BTreeSet<String> = (client.nodes(&Default::default()))
                .await
                .expect("nodes")
                .into_iter()
                .filter(|n| !matches!(n.state.as_str(), "gone" | "failed" | "deleting"))
                .filter_map(|n| n.instance)
                .collect();
            let in_cloud: std::collections::BTreeSet<String> =
                live(&sim.cloud).into_iter().map(|i| i.id).collect();
            (held == in_cloud).then_some(())
        },
    )
    .await;
    let metrics = server.metrics(Some(OPS)).await;
    assert_eq!(
        metric(
            &metrics,
            "berth_driver_reloads_total{provider=\"sim\",outcome=\"switched\"}"
        ),
        Some(10.0),
        "{metrics}"
    );
    let server = Arc::into_inner(server).expect("the clients are done");
    server.terminate().await.assert_success();
}

#[tokio::test]
async fn a_bad_new_file_leaves_the_running_driver_serving() {
    let p = Plugins::new().await;
    let (driver, bytes, first) = (&p.driver, &p.bytes, &p.first);
    let server = p.serve().await;

    let wrong_contract = std::fs::read(plugin("wrong-version")).expect("fixture");
    let traps = std::fs::read(plugin("trap-configure")).expect("fixture");
    let cases: [(&str, Vec<u8>, &str); 3] = [
        (
            "not a component",
            b"\0asm but not a component".to_vec(),
            "loading it",
        ),
        ("the wrong contract", wrong_contract, "loading it"),
        (
            "a trap in configure",
            traps.clone(),
            "starting the new driver",
        ),
    ];
    for (what, file, says) in cases {
        let sha = sha256(&file);
        put(driver, &file);
        let d = until_refused(&server, &sha, what).await;
        assert_eq!(d["sha256"], first.as_str(), "{what}: {d}");
        let error = d["reload_error"]["error"].as_str().unwrap_or_default();
        assert!(error.contains(says), "{what}: {error}");
        served(&server).await;
    }
    let metrics = server.metrics(Some(OPS)).await;
    assert_eq!(
        metric(&metrics, "berth_driver_reload_failing{provider=\"sim\"}"),
        Some(1.0),
        "{metrics}"
    );
    // `berth drivers` says so too, with the refused file's digest.
    let cli = ["drivers", "--server", server.base.as_str(), "--token", OPS];
    let ran = run_berth(cli, &[]).await;
    let refused = format!("{} refused: starting the new driver", &sha256(&traps)[..12]);
    assert!(ran.success() && ran.stdout.contains(&refused), "{ran}");

    // A copy still being written: half of a new build, in place. It is
    // refused; once the copy ends the whole file loads.
    let build = with_custom_section(bytes, 1);
    let half = &build[..build.len() / 2];
    let mut copy = std::fs::File::create(driver).expect("open for the copy");
    copy.write_all(half).expect("half");
    copy.flush().expect("flush");
    let d = until_refused(&server, &sha256(half), "the half copy").await;
    assert_eq!(d["sha256"], first.as_str(), "{d}");
    served(&server).await;
    copy.write_all(&build[half.len()..]).expect("the rest");
    drop(copy);
    let d = until_running(&server, &sha256(&build), "the whole copy").await;
    assert!(d.get("reload_error").is_none(), "{d}");
    assert_eq!(d["previous_sha256"], first.as_str(), "{d}");
    served(&server).await;
    let metrics = server.metrics(Some(OPS)).await;
    assert_eq!(
        metric(&metrics, "berth_driver_reload_failing{provider=\"sim\"}"),
        Some(0.0),
        "{metrics}"
    );
    server.terminate().await.assert_success();
}

#[tokio::test]
async fn a_removed_file_stops_nothing_and_a_rollback_returns_to_the_driver_before() {
    let p = Plugins::new().await;
    let (driver, bytes, first) = (&p.driver, &p.bytes, &p.first);
    let server = p.serve().await;
    // The driver's changes come on the event stream, to a client too.
    let (status, mut events) =
        crate::events::Stream::open(&server.base, CI, "?kinds=driver", None).await;
    assert_eq!(status, 200);
    let driver_event = |sha: &str| {
        let sha = sha.to_owned();
        move |e: &[crate::events::Received]| {
            (e.iter()).any(|e| e.event == "driver" && e.data["sha256"] == sha.as_str())
        }
    };
    let build = with_custom_section(bytes, 1);
    let second = sha256(&build);
    put(driver, &build);
    until_running(&server, &second, "the new build").await;
    let switched = events
        .until("the switch on the stream", driver_event(&second))
        .await;
    let last = switched.last().unwrap();
    assert_eq!(
        (&last.data["provider"], &last.data["state"]),
        (&json!("sim"), &json!("up"))
    );

    // Removed: the provider goes on, and says so.
    std::fs::remove_file(driver).expect("remove");
    let d = until_refused(&server, "", "the removed file").await;
    assert_eq!(d["sha256"], second.as_str(), "{d}");
    served(&server).await;
    events
        .until("the refused reload on the stream", |e| {
            (e.iter())
                .any(|e| e.data["reload_error"][0] == "" && e.data["sha256"] == second.as_str())
        })
        .await;

    // `berth driver rollback`: back to the first driver.
    let cli = ["--server", server.base.as_str(), "--token", OPS];
    let ran = run_berth([&["driver", "rollback", "sim"][..], &cli].concat(), &[]).await;
    assert!(ran.success(), "{ran}");
    assert!(ran.stdout.contains("switched"), "{ran}");
    let d = until_running(&server, first, "the rollback").await;
    assert_eq!(d["previous_sha256"], second.as_str(), "{d}");
    served(&server).await;
    events
        .until("the rollback on the stream", driver_event(first))
        .await;

    // A client may not.
    let client = ["--server", server.base.as_str(), "--token", CI];
    let ran = run_berth([&["driver", "rollback", "sim"][..], &client].concat(), &[]).await;
    assert!(!ran.success() && ran.stderr.contains("admin"), "{ran}");

    // The build rolled back from, put back, is passed over until an
    // operator asks: `berth driver reload` loads it.
    put(driver, &build);
    let ran = run_berth([&["driver", "reload"][..], &cli].concat(), &[]).await;
    assert!(ran.success(), "{ran}");
    assert!(ran.stdout.contains("switched"), "{ran}");
    until_running(&server, &second, "the build reloaded").await;

    // SIGHUP reads the files again too.
    let third = with_custom_section(bytes, 2);
    put(driver, &third);
    server.signal(libc::SIGHUP);
    until_running(&server, &sha256(&third), "the build after SIGHUP").await;
    served(&server).await;
    server.terminate().await.assert_success();
}

#[tokio::test]
async fn a_pinned_provider_refuses_a_new_file_that_is_not_the_pinned_one() {
    let p = Plugins::new().await;
    let first = &p.first;
    edit_config(
        &p.config,
        "[providers.sim]\n",
        &format!("[providers.sim]\ndriver-sha256 = \"{first}\"\n"),
    );
    let server = p.serve().await;
    let build = with_custom_section(&p.bytes, 1);
    put(&p.driver, &build);
    let d = until_refused(&server, &sha256(&build), "the unpinned build").await;
    assert_eq!(d["sha256"], first.as_str(), "{d}");
    let error = d["reload_error"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("driver-sha256"), "{error}");
    served(&server).await;
    assert!(!live(&p.sim.cloud).is_empty());
    server.terminate().await.assert_success();
}

#[tokio::test]
async fn a_provider_whose_driver_failed_to_start_starts_on_the_file_that_replaces_it() {
    let p = Plugins::new().await;
    let traps = std::fs::read(plugin("trap-configure")).expect("fixture");
    put(&p.driver, &traps);
    let args = ["--config", &p.config.display().to_string()];
    let server = Berth::start(&args, p.dir.path()).await;
    until(60, "the provider failed", || async {
        let (_, providers) = server.call("GET", "/v1/providers", Some(OPS), None).await;
        (providers[0]["status"] == "failed").then_some(())
    })
    .await;
    // The working driver dropped in: its next start reads it.
    put(&p.driver, &p.bytes);
    until_running(&server, &p.first, "the provider started on the new file").await;
    served(&server).await;
    server.terminate().await.assert_success();
}

/// A config reload that changes a provider's driver settings starts its
/// driver on them beside the one it runs, and switches once that
/// configured: the driver's config (the sim's page size), then its file
/// (another name, other bytes), which the watch then follows. Settings the
/// driver refuses in `configure` leave every part of the reload undone.
#[tokio::test]
async fn a_config_reload_switches_a_drivers_settings_whole_or_not_at_all() {
    let p = Plugins::new().await;
    let server = p.serve().await;
    server.until_label_ready(60, "small", 2, "prewarmed").await;
    let running = std::fs::read_to_string(&p.config).expect("the config");
    let url = p.sim.url();
    let endpoint = format!("config = {{ endpoint = \"{url}\" }}");
    assert!(running.contains(&endpoint), "{running}");
    let with = |page: u32, min: u32| {
        running
            .replace(
                &endpoint,
                &format!("config = {{ endpoint = \"{url}\", page_size = {page} }}"),
            )
            .replace("min-ready = 2", &format!("min-ready = {min}"))
    };
    let reload = || async {
        let base = server.base.clone();
        run_berth(["config", "reload", "--server", &base, "--token", OPS], &[]).await
    };
    let min_ready = || async {
        let (_, labels) = server.call("GET", "/v1/labels", Some(OPS), None).await;
        labels[0]["min_ready"].as_u64()
    };
    let lists_of_one = || {
        (p.sim.cloud.calls().iter())
            .filter(|c| c.method == "GET" && c.path == "/v1/instances")
            .filter(|c| (c.query.as_deref().unwrap_or("").split('&')).any(|q| q == "page_size=1"))
            .count()
    };

    // The driver refuses the new config: nothing of the reload is taken.
    std::fs::write(&p.config, with(0, 3)).expect("write");
    let ran = reload().await;
    assert!(!ran.success(), "{ran}");
    for line in [
        "refused: providers.sim: its new settings could not start",
        "page_size",
        "providers.sim.config: changed",
        "labels.small.min-ready: 2 → 3",
    ] {
        assert!(ran.stdout.contains(line), "{line}: {ran}");
    }
    assert_eq!(min_ready().await, Some(2));
    assert_eq!(sim_driver(&server).await["sha256"], p.first.as_str());

    // Taken whole: lists ask for pages of one, and min-ready is 3.
    std::fs::write(&p.config, with(1, 3)).expect("write");
    let ran = reload().await;
    assert!(ran.success(), "{ran}");
    server
        .until_label_ready(60, "small", 3, "min-ready raised")
        .await;
    until(60, "a list in pages of one", || async {
        (lists_of_one() > 0).then_some(())
    })
    .await;
    assert_eq!(
        sim_driver(&server).await["sha256"],
        p.first.as_str(),
        "the same driver"
    );

    // Another file, by the config: loaded, switched to, and watched.
    let plugins = p.driver.parent().expect("the plugins directory");
    let second = with_custom_section(&p.bytes, 1);
    put(&plugins.join("sim-b.wasm"), &second);
    let renamed = with(1, 3).replace("driver = \"sim.wasm\"", "driver = \"sim-b.wasm\"");
    assert_ne!(renamed, with(1, 3));
    std::fs::write(&p.config, renamed).expect("write");
    let ran = reload().await;
    assert!(
        ran.success() && ran.stdout.contains("providers.sim.driver"),
        "{ran}"
    );
    let d = until_running(&server, &sha256(&second), "the file the config names").await;
    assert_eq!(d["previous_sha256"], p.first.as_str(), "{d}");
    let third = with_custom_section(&p.bytes, 2);
    put(&plugins.join("sim-b.wasm"), &third);
    until_running(
        &server,
        &sha256(&third),
        "a new build of the file the config names",
    )
    .await;
    server.until_label_ready(60, "small", 3, "serving").await;
    server.terminate().await.assert_success();
}

/// A config reload that adds a provider and removes one, moving label
/// `small` from `sim` to `other` (a second cloud): `small` is prewarmed on
/// `other`; `sim`'s free nodes are deleted and its node in use once
/// released, and `sim` is still listed meanwhile, marked removed.
#[tokio::test]
async fn a_config_reload_adds_a_provider_and_drains_one_it_removes() {
    let p = Plugins::new().await;
    let other = SimServer::start().await;
    let server = p.serve().await;
    server
        .until_label_ready(60, "small", 2, "prewarmed on sim")
        .await;
    let held = server.request(CI, &[("small", 1)]).await;
    let held = server.fulfilled(CI, &held.id).await;
    server
        .until_label_ready(60, "small", 2, "refilled on sim")
        .await;
    assert_eq!(live(&p.sim.cloud).len(), 3);

    let running = std::fs::read_to_string(&p.config).expect("the config");
    let moved = running
        .replace("[providers.sim]", "[providers.other]")
        .replace(
            "[labels.small.providers.sim]",
            "[labels.small.providers.other]",
        )
        .replace(&p.sim.url(), &other.url())
        .replace(&p.sim.addr().to_string(), &other.addr().to_string());
    std::fs::write(&p.config, moved).expect("write");
    let ran = run_berth(
        ["config", "reload", "--server", &server.base, "--token", OPS],
        &[],
    )
    .await;
    assert!(ran.success(), "{ran}");
    for line in ["providers.sim: removed", "providers.other: added"] {
        assert!(ran.stdout.contains(line), "{line}: {ran}");
    }
    until(
        60,
        "small prewarmed on other, sim left with the node in use",
        || async { (live(&other.cloud).len() == 2 && live(&p.sim.cloud).len() == 1).then_some(()) },
    )
    .await;
    server
        .until_label_ready(60, "small", 2, "ready on other")
        .await;
    let (_, providers) = server.call("GET", "/v1/providers", Some(OPS), None).await;
    let removed: Vec<(&str, bool)> = (providers.as_array().expect("providers").iter())
        .map(|p| (p["name"].as_str().unwrap_or(""), p["removed"] == true))
        .collect();
    assert_eq!(removed, [("sim", true), ("other", false)], "{providers}");

    let lists = || {
        (p.sim.cloud.calls().iter())
            .filter(|c| c.method == "GET" && c.path == "/v1/instances")
            .count()
    };
    let before = lists();
    let (status, _) = server
        .call(
            "POST",
            &format!("/v1/nodes/{}/release", held.nodes[0].id),
            Some(CI),
            None,
        )
        .await;
    assert_eq!(status, 200);
    until(60, "the node in use deleted once released", || async {
        live(&p.sim.cloud).is_empty().then_some(())
    })
    .await;
    until(60, "sim still listed", || async {
        (lists() > before).then_some(())
    })
    .await;
    let (instances, nodes) = instances_and_nodes(&other.cloud);
    assert_eq!(instances, nodes, "no node got two instances on other");
    server.terminate().await.assert_success();
}
