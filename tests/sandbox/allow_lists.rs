//! Each provider's allow-list is its own: lists that overlap are warned of.

use serde_json::json;

use super::{Hostile, start};
use crate::support::server::{run_berth, until};
use crate::support::{plugin, plugins_dir_and_name};

/// Regression: nothing said when two providers' allow-lists overlapped,
/// and a driver that could reach another provider's cloud deleted 8 of that
/// provider's machines. Now `berth config check` warns of each overlap
/// (naming both providers and the hosts, exit code 0: it is a warning), and
/// so does `berth serve` as it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_allow_lists_are_warned_of() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("berth.toml");
    let (plugins, driver) = plugins_dir_and_name(&plugin("sim"));
    std::fs::write(
        &file,
        format!(
            r#"pool-id = "p"
plugins-dir = {plugins:?}
[providers.east]
driver = {driver:?}
allow-hosts = ["ec2.us-east-1.amazonaws.com:443"]
[providers.west]
driver = {driver:?}
allow-hosts = ["*.amazonaws.com"]
[providers.lab]
driver = {driver:?}
allow-hosts = ["127.0.0.1:9001"]
"#
        ),
    )
    .unwrap();
    let out = run_berth(["config", "check", file.to_str().unwrap()], &[]).await;
    eprintln!("{out}");
    assert_eq!(out.code(), Some(0), "{out}");
    let warning = out
        .stdout
        .lines()
        .find(|l| l.contains("warning:"))
        .unwrap_or_else(|| panic!("no warning in\n{out}"));
    for part in [
        "providers.west.allow-hosts[0]",
        "`*.amazonaws.com`",
        "`ec2.us-east-1.amazonaws.com:443`",
        "providers east and west",
    ] {
        assert!(warning.contains(part), "`{part}` not in {warning}");
    }
    assert_eq!(out.stdout.matches("warning:").count(), 1, "{out}");
    assert!(
        out.stdout.contains("ok (3 providers, 0 labels), 1 warning"),
        "{out}"
    );

    // `berth serve` says so too: here a hostile provider may reach any
    // port of the sim cloud's address (127.0.0.1).
    let nosy = Hostile {
        allow: vec!["127.0.0.1".into()],
        ..Hostile::new("nosy", json!({"mode": "ok"}))
    };
    let (sim, _dir, server) = start(&[nosy], &[]).await;
    let line = until(20, "a warning of the overlap", || async {
        server
            .log_text()
            .lines()
            .find(|l| l.contains("WARN") && l.contains("overlaps"))
            .map(str::to_owned)
    })
    .await;
    assert!(
        line.contains("providers nosy and sim") && line.contains(&sim.addr().to_string()),
        "{line}"
    );
    server.terminate().await.assert_success();
}
