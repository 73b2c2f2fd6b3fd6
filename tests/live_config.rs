//! The config a running `berth serve` would read again, compared with the
//! one it runs: `berth config check FILE --against URL`, through the binary.

use crate::support::config::{CI, OPS, serve_config_on};
use crate::support::server::{Berth, run_berth, until};
use crate::support::{SimServer, metric, plugin};

#[tokio::test]
async fn config_check_against_a_running_berth_names_what_a_reload_would_change() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = serve_config_on(&sim, dir.path(), &plugin("sim"));
    let args = ["--config", &config.display().to_string()];
    let server = Berth::start(&args, dir.path()).await;
    let running = std::fs::read_to_string(&config).expect("the config");
    let check = |text: String, token: &'static str| {
        let file = dir.path().join("next.toml");
        std::fs::write(&file, text).expect("write");
        let base = server.base.clone();
        async move {
            let file = file.display().to_string();
            let args = [
                "config",
                "check",
                &file,
                "--against",
                &base,
                "--token",
                token,
            ];
            run_berth(args, &[]).await
        }
    };

    let ran = check(running.clone(), OPS).await;
    assert!(
        ran.success() && ran.stdout.contains("a reload would change nothing"),
        "{ran}"
    );

    // A label added and min-ready raised: both live.
    let more = running.replace("min-ready = 2", "min-ready = 3")
        + "\n[labels.big]\n[labels.big.providers.sim]\ninstance-type = \"big\"\nimage = \"img\"\nvcpus = 4\nram = \"8GiB\"\n";
    let ran = check(more, OPS).await;
    for line in ["labels.small.min-ready: 2 → 3", "labels.big: added"] {
        assert!(ran.stdout.contains(line), "{line}: {ran}");
    }
    assert!(ran.success(), "{ran}");
    assert!(
        ran.stdout.contains("a reload would make 2 changes"),
        "{ran}"
    );

    // The pool's id cannot change live: refused whole, with the reason.
    let renamed = running.replace("pool-id = \"serve-test\"", "pool-id = \"other\"");
    let ran = check(renamed, OPS).await;
    assert!(!ran.success(), "{ran}");
    assert!(
        ran.stdout
            .contains("pool-id: serve-test → other (cannot change while berth runs")
            && ran.stdout.contains("a reload would be refused"),
        "{ran}"
    );

    // An invalid file: its problem, by key.
    let invalid = running.replace("min-ready = 2", "min-ready = 2\nmin-redy = 3");
    let ran = check(invalid, OPS).await;
    assert!(!ran.success(), "{ran}");
    assert!(ran.stdout.contains("labels.small.min-redy"), "{ran}");

    // An admin's only.
    let ran = check(running, CI).await;
    assert!(!ran.success() && ran.stderr.contains("admin"), "{ran}");
    server.terminate().await.assert_success();
}

/// Every node as the admin sees it: id, label and state, by id.
async fn nodes(server: &Berth) -> std::collections::BTreeMap<String, (String, String)> {
    let (status, all) = server.call("GET", "/v1/nodes", Some(OPS), None).await;
    assert_eq!(status, 200, "{all}");
    (all.as_array().expect("nodes").iter())
        .map(|n| {
            let s = |k: &str| n[k].as_str().unwrap_or_default().to_owned();
            (s("id"), (s("label"), s("state")))
        })
        .collect()
}

/// A config reload through the binary: SIGHUP takes a file that raises
/// `min-ready`, adds a label and a token, with no restart, and every node
/// (one of them in use) goes on as it was. A file that cannot be taken
/// changes nothing, and `berth config reload` prints why. A label removed
/// is asked for no more, and its nodes are deleted once idle.
#[tokio::test]
async fn a_config_reload_adds_and_removes_labels_and_raises_min_ready_with_no_node_lost() {
    const NEW_TOKEN: &str = "token-of-a-client-added-by-a-reload";
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = serve_config_on(&sim, dir.path(), &plugin("sim"));
    let args = ["--config", &config.display().to_string()];
    let server = Berth::start(&args, dir.path()).await;
    server
        .until_label_ready(60, "small", 2, "two small nodes")
        .await;
    let held = server.request(CI, &[("small", 1)]).await;
    let held = server.fulfilled(CI, &held.id).await;
    server
        .until_label_ready(60, "small", 2, "small refilled")
        .await;
    let before = nodes(&server).await;
    assert_eq!(before.len(), 3, "{before:?}");

    let running = std::fs::read_to_string(&config).expect("the config");
    let without_big = running.replace("min-ready = 2", "min-ready = 3").replace(
        "[api.tokens.ops]",
        &format!("[api.tokens.new]\nrole = \"client\"\ntoken = \"{NEW_TOKEN}\"\n[api.tokens.ops]"),
    );
    let next = without_big.clone()
        + "\n[labels.big]\nmin-ready = 1\n[labels.big.providers.sim]\n\
          instance-type = \"big\"\nimage = \"img\"\nvcpus = 4\nram = \"8GiB\"\n";
    std::fs::write(&config, &next).expect("write");
    server.signal(libc::SIGHUP);
    server
        .until_label_ready(60, "small", 3, "min-ready raised")
        .await;
    server
        .until_label_ready(60, "big", 1, "the new label prewarmed")
        .await;

    // No node lost, none changed but by the pool's own doing: the one in
    // use is still in use, by the same requestor.
    let after = nodes(&server).await;
    for (id, (label, state)) in &before {
        let now = after
            .get(id)
            .unwrap_or_else(|| panic!("{id} lost: {after:?}"));
        assert_eq!(&now.0, label, "{id}");
        if *id == held.nodes[0].id {
            assert_eq!(
                (now.1.as_str(), state.as_str()),
                ("in-use", "in-use"),
                "{id}"
            );
        }
    }
    assert_eq!(after.len(), before.len() + 2, "{after:?}");
    // The token added serves at once, and the new label too.
    let big = server.request(NEW_TOKEN, &[("big", 1)]).await;
    let big = server.fulfilled(NEW_TOKEN, &big.id).await;
    let big_node = big.nodes[0].id.clone();
    let (status, _) = server
        .call(
            "POST",
            &format!("/v1/nodes/{}/release", held.nodes[0].id),
            Some(CI),
            None,
        )
        .await;
    assert_eq!(status, 200, "the node in use before the reload is released");
    server.until_label_ready(60, "big", 1, "big refilled").await;

    // Refused whole, berth goes on with what it runs: the pool's id and
    // where the API listens, and a key the file does not know.
    let bad = next
        .replace("pool-id = \"serve-test\"", "pool-id = \"other\"")
        .replace("listen = \"127.0.0.1:0\"", "listen = \"127.0.0.1:1\"")
        .replace("min-ready = 3", "min-ready = 5");
    std::fs::write(&config, &bad).expect("write");
    let ran = reload(&server).await;
    assert!(!ran.success(), "{ran}");
    for line in [
        "refused: pool-id: serve-test → other (cannot change while berth runs: restart it)",
        "refused: api.listen: 127.0.0.1:0 → 127.0.0.1:1 (cannot change while berth runs",
        "labels.small.min-ready: 3 → 5",
        "reload refused; berth goes on with the config it runs",
    ] {
        assert!(ran.stdout.contains(line), "{line}: {ran}");
    }
    std::fs::write(&config, next.replace("min-ready = 3", "min-redy = 5")).expect("write");
    let ran = reload(&server).await;
    assert!(
        !ran.success() && ran.stdout.contains("labels.small.min-redy"),
        "{ran}"
    );
    let labels = async || {
        let (_, labels) = server.call("GET", "/v1/labels", Some(OPS), None).await;
        labels.as_array().expect("labels").clone()
    };
    let names: Vec<String> = (labels().await.iter())
        .filter_map(|l| l["name"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(names, ["small", "big"]);
    assert!(
        (labels().await.iter()).all(|l| l["name"] != "small" || l["min_ready"] == 3),
        "{:?}",
        labels().await
    );
    assert!(server.log_text().contains("config reload refused"));
    let metrics = server.metrics(Some(OPS)).await;
    for (outcome, n) in [("applied", 1.0), ("refused", 2.0)] {
        let series = format!("berth_config_reloads_total{{outcome=\"{outcome}\"}}");
        assert_eq!(metric(&metrics, &series), Some(n), "{series}: {metrics}");
    }

    // `big` removed: its ready node is deleted at once, the one in use
    // once released; it is asked for no more. `small` goes on.
    std::fs::write(&config, &without_big).expect("write");
    let ran = reload(&server).await;
    assert!(ran.success(), "{ran}");
    assert!(ran.stdout.contains("labels.big: removed"), "{ran}");
    until(60, "big's ready node deleted", || async {
        let all = labels().await;
        let big = all.iter().find(|l| l["name"] == "big")?;
        let nodes = big["nodes"].as_object()?;
        (big["removed"] == true && big["ready"] == 0 && nodes.keys().all(|s| s == "in-use"))
            .then_some(())
    })
    .await;
    let (status, refused) = server
        .call(
            "POST",
            "/v1/requests",
            Some(NEW_TOKEN),
            Some(serde_json::json!({"labels": {"big": 1}})),
        )
        .await;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (422, Some("unknown_label")),
        "{refused}"
    );
    let (status, _) = server
        .call(
            "POST",
            &format!("/v1/nodes/{big_node}/release"),
            Some(NEW_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, 200);
    until(60, "big's node in use deleted once released", || async {
        let all = labels().await;
        let big = all.iter().find(|l| l["name"] == "big")?;
        big["nodes"].as_object()?.is_empty().then_some(())
    })
    .await;
    server
        .until_label_ready(60, "small", 3, "small goes on")
        .await;

    // The file as it was applied: read again, nothing changes.
    let ran = reload(&server).await;
    assert!(
        ran.success() && ran.stdout.contains("nothing changed"),
        "{ran}"
    );
    // A client may not reload.
    let ran = run_berth(
        ["config", "reload", "--server", &server.base, "--token", CI],
        &[],
    )
    .await;
    assert!(!ran.success() && ran.stderr.contains("admin"), "{ran}");
    server.terminate().await.assert_success();
}

/// `berth config reload` as the admin.
async fn reload(server: &Berth) -> crate::support::server::Ran {
    run_berth(
        ["config", "reload", "--server", &server.base, "--token", OPS],
        &[],
    )
    .await
}
