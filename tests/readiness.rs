//! Readiness through the `berth serve` binary, against a real OpenSSH
//! server: a node whose label says `ready = "ssh"` is handed out only once
//! an SSH key exchange with its instance completes, and carries the host
//! keys `ssh-keyscan` sees; a server that never answers costs the launch
//! after `boot-timeout`; a probe aimed at a metadata address is refused.
//!
//! Each sim instance is a machine of its own (the sim's `ssh_target`
//! knob): a port on 127.0.0.1 that refuses connections until the instance
//! has booted and its SSH accept delay has passed, then leads to the sshd.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::config::{CI, OPS, serve_config_with, set_lease_ttl};
use crate::support::server::{Berth, SIGTERM, http, run_berth, until};
use crate::support::sshd::{Sshd, banner};
use crate::support::{SimServer, creates, plugin};

/// A berth on `sim` whose label `small` has the keys `small`.
async fn berth_on(
    sim: &SimServer,
    dir: &std::path::Path,
    small: &str,
) -> (Berth, std::path::PathBuf) {
    let config = serve_config_with(sim, dir, &plugin("sim"), small, "");
    // Long enough that no request fails for want of renewals.
    set_lease_ttl(&config, "5m");
    let config_arg = config.display().to_string();
    let berth = Berth::start(&["--config", &config_arg], dir).await;
    berth.until_ready(30, "the sim provider listed").await;
    (berth, config)
}

/// The node's view as `token` sees it.
async fn node(berth: &Berth, token: &str, id: &str) -> Value {
    let (status, node) = berth
        .call("GET", &format!("/v1/nodes/{id}"), Some(token), None)
        .await;
    assert_eq!(status, 200, "{node}");
    node
}

fn host_keys(node: &Value) -> Vec<String> {
    let mut keys: Vec<String> = node["connection"]["host_keys"]
        .as_array()
        .map(|a| a.iter().map(|k| k.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default();
    keys.sort();
    keys
}

/// The only node of the pool, as an admin sees it, once there is one.
async fn only_node(berth: &Berth) -> Value {
    until(10, "a node", || async {
        let (_, nodes) = berth.call("GET", "/v1/nodes", Some(OPS), None).await;
        nodes.as_array().and_then(|n| n.first().cloned())
    })
    .await
}

/// The only node, once its last probe failed with an error that says
/// `why`.
async fn failed_probe(berth: &Berth, why: &str) -> Value {
    until(15, &format!("a probe that failed with {why:?}"), || async {
        let n = only_node(berth).await;
        let e = n["probe"]["last_error"].as_str().unwrap_or_default();
        e.contains(why).then_some(n)
    })
    .await
}

#[tokio::test]
async fn a_node_is_handed_out_once_sshd_accepts_and_carries_the_host_keys_it_showed() {
    let sshd = Sshd::start();
    let expected = sshd.keyscan();
    assert_eq!(expected.len(), 3, "ed25519, ECDSA and RSA: {expected:?}");
    let sim = SimServer::start_with(berth::sim::Knobs {
        boot_delay_ms: 100,
        ssh_target: Some(sshd.addr.to_string()),
        ssh_accept_delay_ms: 1500,
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let (berth, config) =
        berth_on(&sim, dir.path(), "ready = \"ssh\"\nready-timeout = \"2s\"").await;

    let asked = Instant::now();
    let request = berth.request(CI, &[("small", 1)]).await;
    // While the machine refuses connections, the node is booting and says
    // why it is not ready.
    let refused = failed_probe(&berth, "refused").await;
    assert_eq!(refused["state"], "booting", "{refused}");
    assert_eq!(refused["probe"]["check"], "ssh", "{refused}");
    assert!(
        refused["probe"]["failed"].as_u64().unwrap() >= 1,
        "{refused}"
    );
    let done = berth.fulfilled(CI, &request.id).await;
    let took = asked.elapsed();
    // Boot (0.1 s) and the accept delay (1.5 s) passed before the hand-out,
    // and by then the machine's sshd answers.
    assert!(
        took >= Duration::from_millis(1600),
        "handed out after {took:?}"
    );
    let id = &done.nodes[0].id;
    let shown = node(&berth, CI, id).await;
    let port = shown["connection"]["port"].as_u64().unwrap();
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    // Off this thread: the sim's machines run on this test's runtime.
    let answered = tokio::task::spawn_blocking(move || banner(addr))
        .await
        .unwrap();
    assert!(answered.is_some(), "sshd answers on the node's address");
    assert_eq!(host_keys(&shown), expected, "the keys ssh-keyscan prints");
    assert!(shown.get("probe").is_none(), "{shown}");

    // The CLI shows them too.
    let ran = run_berth(
        ["nodes", "--json", "--server", berth.base.as_str()],
        &[("BERTH_TOKEN", std::ffi::OsStr::new(CI))],
    )
    .await;
    assert!(ran.success(), "{ran}");
    let listed: Value = serde_json::from_str(&ran.stdout).expect("JSON");
    let mine = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == id.as_str())
        .expect("the node is listed");
    assert_eq!(host_keys(mine), expected, "{ran}");

    // They are stored: a restarted berth shows the same keys.
    berth.signal(SIGTERM);
    berth
        .exit_within(Duration::from_secs(30))
        .await
        .assert_success();
    let config_arg = config.display().to_string();
    let berth = Berth::start(&["--config", &config_arg], dir.path()).await;
    berth.until_ready(30, "the sim provider listed again").await;
    let again = node(&berth, CI, id).await;
    assert_eq!(again["state"], "in-use");
    assert_eq!(host_keys(&again), expected);
}

/// A sim whose instances lead to [`silent`], booting at once.
async fn leading_to_silence() -> SimServer {
    let quiet = silent().await;
    SimServer::start_with(berth::sim::Knobs {
        ssh_target: Some(quiet.to_string()),
        ..Default::default()
    })
    .await
}

/// A server that accepts connections and never says a word.
async fn silent() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    addr
}

#[tokio::test]
async fn a_server_that_never_answers_fails_the_launch_after_the_boot_timeout_and_it_is_retried() {
    let sim = leading_to_silence().await;
    let dir = tempfile::tempdir().unwrap();
    let small =
        "ready = \"ssh\"\nready-timeout = \"500ms\"\nboot-timeout = \"3s\"\nlaunch-retries = 1";
    let (berth, _) = berth_on(&sim, dir.path(), small).await;
    let request = berth.request(CI, &[("small", 1)]).await;
    let waiting = failed_probe(&berth, "no answer within the ready-timeout").await;
    assert_eq!(waiting["state"], "booting", "{waiting}");
    let r = berth
        .client(CI)
        .request(&request.id, Some(Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(r.state, "failed", "{r:?}");
    let reason = r.reason.unwrap_or_default();
    assert!(
        reason.contains("running but not ready after the boot timeout (3s)")
            && reason.contains("no answer within the ready-timeout"),
        "{reason}"
    );
    // One launch and one retry, each deleted, by the cloud's own record.
    assert_eq!(creates(&sim.cloud), 2);
    until(10, "both instances deleted", || async {
        let all = crate::support::deletes(&sim.cloud).into_iter();
        let deletes = all.filter(|(_, status)| *status == 204).count();
        (deletes == 2).then_some(())
    })
    .await;
    let metrics = berth.metrics(Some(OPS)).await;
    let failed = metrics
        .lines()
        .find(|l| {
            l.starts_with("berth_probes_total{")
                && l.contains("check=\"ssh\"")
                && l.contains("outcome=\"not_ready\"")
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(failed >= 4.0, "two boots of 3 s, 0.5 s a probe: {failed}");
    assert!(metrics.contains("berth_probe_seconds_bucket{"), "{metrics}");
}

#[tokio::test]
async fn a_tcp_check_only_needs_the_port_to_accept() {
    let sim = leading_to_silence().await;
    let dir = tempfile::tempdir().unwrap();
    let (berth, _) = berth_on(&sim, dir.path(), "ready = \"tcp\"").await;
    let request = berth.request(CI, &[("small", 1)]).await;
    let done = berth.fulfilled(CI, &request.id).await;
    let shown = node(&berth, CI, &done.nodes[0].id).await;
    assert!(host_keys(&shown).is_empty(), "a TCP check learns no keys");
}

/// Makes the sim's first instance, once there is one, report `address`
/// (port 22) as its own.
async fn point_the_instance_at(sim: &SimServer, address: &str) {
    let id = until(10, "the instance", || async {
        sim.cloud.instances().first().map(|i| i.id.clone())
    })
    .await;
    let (status, body) = http(
        &sim.url(),
        "PUT",
        &format!("/sim/instances/{id}/endpoint"),
        None,
        Some(json!({"address": address, "port": 22})),
    )
    .await
    .unwrap();
    assert_eq!(status, 204, "{body}");
}

#[tokio::test]
async fn a_probe_aimed_at_a_metadata_address_is_refused() {
    let sim = SimServer::start_with(berth::sim::Knobs {
        boot_delay_ms: 1500,
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let (berth, _) = berth_on(&sim, dir.path(), "ready = \"ssh\"").await;
    berth.request(CI, &[("small", 1)]).await;
    // While it boots, the cloud starts to report the metadata address as
    // the instance's.
    point_the_instance_at(&sim, "169.254.169.254").await;
    let refused = failed_probe(&berth, "169.254.169.254").await;
    let e = refused["probe"]["last_error"].as_str().unwrap();
    assert!(e.contains("never reachable"), "{e}");
    assert_eq!(refused["state"], "booting", "never ready: {refused}");
}

/// Regression: the sim cloud gave its instances private addresses
/// (10.0.0.x), so with `ready = "ssh"` berth's probes of them went out
/// through the default route, off the machine. Now each instance reports a
/// loopback address of its own, which berth does not probe unless the
/// provider's allow-list names it: the probe is refused and nothing is sent
/// (the suite's switch, below, would fail the test on any probe off this
/// host).
#[tokio::test]
async fn the_sims_machines_are_on_loopback_and_no_probe_leaves_the_host() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (berth, _) = berth_on(
        &sim,
        dir.path(),
        "ready = \"ssh\"\nready-timeout = \"500ms\"",
    )
    .await;
    berth.request(CI, &[("small", 1)]).await;
    let refused = failed_probe(&berth, "this host's loopback").await;
    assert_eq!(refused["state"], "booting", "never ready: {refused}");
    let instances = sim.cloud.instances();
    let address = &instances[0].private_ipv4;
    let ip: std::net::IpAddr = address.parse().unwrap();
    assert!(ip.is_loopback(), "the sim reports {address}");
    berth.terminate().await.assert_success();
}

/// The suite's guard: every `berth serve` a test starts runs with the
/// probes' loopback-only switch, under which a probe of an address off
/// this host is refused and logged instead of sent, and the test fails when
/// it ends. Here an instance's cloud starts to report a public address
/// (TEST-NET-1, never routed) while it boots.
#[tokio::test]
async fn under_the_suites_switch_a_probe_off_this_host_is_refused_not_sent() {
    let sim = SimServer::start_with(berth::sim::Knobs {
        boot_delay_ms: 1500,
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let (mut berth, _) = berth_on(&sim, dir.path(), "ready = \"ssh\"").await;
    berth.expect_off_host_probes();
    berth.request(CI, &[("small", 1)]).await;
    point_the_instance_at(&sim, "192.0.2.1").await;
    let refused = failed_probe(&berth, "192.0.2.1").await;
    let e = refused["probe"]["last_error"].as_str().unwrap();
    assert!(e.contains(berth::runtime::probe::OFF_HOST_REFUSED), "{e}");
    assert!(
        berth
            .log_text()
            .contains(berth::runtime::probe::OFF_HOST_REFUSED),
        "not in the log"
    );
    berth.terminate().await.assert_success();
}
