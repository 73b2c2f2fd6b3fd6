//! Commands through the `berth serve` binary, raced the way real clients race
//! them: a client that retries, two clients at once. Each command is checked
//! ("may this caller do this?") and carried out in one step of the pool, so
//! nothing can change hands between the check and the change.

use std::path::Path;

use serde_json::Value;
use tokio::task::JoinSet;

use crate::support::config::{CI, OPS, OTHER, code, serve_config_with};
use crate::support::server::{Berth, http, until};
use crate::support::{SimServer, plugin};

/// One node (`max-instances = 1`), reused when it is returned.
fn one_reused_node(sim: &SimServer, dir: &Path) -> String {
    serve_config_with(
        sim,
        dir,
        &plugin("sim"),
        "min-ready = 1\nreuse = true",
        "[providers.sim.limits]\nmax-instances = 1\n",
    )
    .display()
    .to_string()
}

/// Creates a request for one `small` node as `token`; its id.
async fn ask(server: &Berth, token: &str) -> String {
    server.request(token, &[("small", 1)]).await.id
}

/// Waits for request `id` to be fulfilled; its one node's id.
async fn handed(server: &Berth, token: &str, id: &str) -> String {
    let r = server.fulfilled(token, id).await;
    r.nodes[0].id.clone()
}

/// `ci` holds the only node and `other` waits for it. `ci` returns it from
/// many connections at once, as a client retrying a release does. One of
/// them releases it; the node goes back to ready and is handed to `other`
/// at once. A release checked against the holder in one step and carried
/// out in another could then free `other`'s node: the holder it checked
/// was `ci`, the node it frees is `other`'s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_release_never_frees_a_node_handed_to_another_requestor() {
    const ROUNDS: usize = 12;
    const AT_ONCE: usize = 24;
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = one_reused_node(&sim, dir.path());
    let server = Berth::start(&["--config", &cfg], dir.path()).await;
    let mut answers: Vec<(u16, String)> = Vec::new();
    for round in 0..ROUNDS {
        let mine = ask(&server, CI).await;
        let node = handed(&server, CI, &mine).await;
        let theirs = ask(&server, OTHER).await;
        let (_, r) = server
            .call("GET", &format!("/v1/requests/{theirs}"), Some(OTHER), None)
            .await;
        assert_eq!(r["state"], "pending", "round {round}: {r}");

        let path = format!("/v1/nodes/{node}/release");
        let mut releases = JoinSet::new();
        for _ in 0..AT_ONCE {
            let (base, path) = (server.base.clone(), path.clone());
            releases.spawn(async move { http(&base, "POST", &path, Some(CI), None).await });
        }
        let mut released = 0;
        while let Some(answer) = releases.join_next().await {
            let (status, text) = answer.unwrap().expect("release answered");
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
            match status {
                200 => released += 1,
                // Not in use any more (409), or in use by `other` (403).
                409 | 403 => answers.push((status, code(&v).to_owned())),
                _ => panic!("round {round}: release answered {status}: {v}"),
            }
        }
        assert_eq!(released, 1, "round {round}: released {released} times");

        // `other` has the node, and still has it once every release of
        // `ci` is answered.
        assert_eq!(handed(&server, OTHER, &theirs).await, node);
        let (s, n) = server
            .call("GET", &format!("/v1/nodes/{node}"), Some(OPS), None)
            .await;
        assert_eq!(s, 200, "{n}");
        assert_eq!(
            (n["state"].as_str(), n["requestor"].as_str()),
            (Some("in-use"), Some("other")),
            "round {round}: a late release of `ci` freed the node `other` was handed: {n}"
        );
        let (s, n) = server.call("POST", &path, Some(OTHER), None).await;
        assert_eq!(s, 200, "round {round}: `other` releases its node: {n}");
        until(30, "the node to be ready again", || async {
            let (_, n) = server
                .call("GET", &format!("/v1/nodes/{node}"), Some(OPS), None)
                .await;
            (n["state"] == "ready").then_some(())
        })
        .await;
    }
    // Every late release was refused with a reason, not carried out.
    for (status, code) in &answers {
        assert!(
            (*status, code.as_str()) == (409, "conflict")
                || (*status, code.as_str()) == (403, "forbidden"),
            "{status} {code}"
        );
    }
    assert_eq!(answers.len(), ROUNDS * (AT_ONCE - 1));
    let after_hand_out = answers.iter().filter(|(s, _)| *s == 403).count();
    eprintln!(
        "{} late releases refused: {} as not in use (409), {after_hand_out} as held by `other` (403)",
        answers.len(),
        answers.len() - after_hand_out
    );
    server.terminate().await.assert_success();
}

/// `berth completions SHELL` prints a script the shell takes, which
/// completes `berth`; `berth man` prints the manual page, and `berth man
/// --dir DIR` writes one page per command.
#[tokio::test]
async fn the_binary_prints_shell_completions_and_manual_pages() {
    let dir = tempfile::tempdir().unwrap();
    let ran = crate::support::server::run_berth(["completions", "bash"], &[]).await;
    assert!(ran.success(), "{ran}");
    let script = dir.path().join("berth.bash");
    std::fs::write(&script, &ran.stdout).unwrap();
    let bash = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("source {} && complete -p berth", script.display()))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&bash.stdout);
    assert!(
        bash.status.success() && said.contains("berth"),
        "{said} {bash:?}"
    );
    for shell in ["zsh", "fish"] {
        let ran = crate::support::server::run_berth(["completions", shell], &[]).await;
        assert!(
            ran.success() && ran.stdout.contains("berth"),
            "{shell}: {ran}"
        );
    }

    let ran = crate::support::server::run_berth(["man"], &[]).await;
    assert!(ran.success(), "{ran}");
    assert!(ran.stdout.contains(".TH berth 1"), "{ran}");
    assert!(ran.stdout.contains("serve"), "{ran}");
    let pages = dir.path().join("man");
    let pages_arg = pages.display().to_string();
    let ran = crate::support::server::run_berth(["man", "--dir", &pages_arg], &[]).await;
    assert!(ran.success(), "{ran}");
    for page in [
        "berth.1",
        "berth-serve.1",
        "berth-requests.1",
        "berth-config-reload.1",
    ] {
        let text = std::fs::read_to_string(pages.join(page)).unwrap_or_default();
        assert!(text.contains(".TH"), "{page}: {text}");
    }
}

/// `packaging/berth.service` passes `systemd-analyze verify`, with no
/// warning (an unknown or misspelt key is one), its `ExecStart` pointed at
/// the binary built here. Skipped, saying so, where systemd's tools are
/// missing.
#[test]
fn the_systemd_unit_passes_systemd_analyze_verify() {
    let unit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/berth.service");
    let text = std::fs::read_to_string(&unit).unwrap();
    assert!(text.contains("ExecStart=/usr/bin/berth serve"), "{text}");
    if std::process::Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: systemd-analyze is not installed here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let here = dir.path().join("berth.service");
    let text = text.replace("/usr/bin/berth", env!("CARGO_BIN_EXE_berth"));
    std::fs::write(&here, text).unwrap();
    let out = std::process::Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&here)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && said.trim().is_empty(), "{said}");
}
