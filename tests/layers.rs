//! The workspace's crates are its architecture, and these tests hold the
//! lower ones to what ARCHITECTURE.md says they are: the pool core and the
//! config model carry no async runtime, sandbox, database or HTTP stack.

use std::collections::BTreeSet;
use std::process::Command;

use crate::support::workspace;

/// Crates no part below the service may pull in.
const HEAVY: &[&str] = &["wasmtime", "tokio", "rusqlite", "axum", "hyper"];

/// The names of every crate in `package`'s normal (non-dev, non-build)
/// dependency tree, as `cargo tree` prints them.
fn normal_dependencies(package: &str) -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(workspace())
        .args(["tree", "--offline", "-e", "normal", "--prefix", "none"])
        .args(["--format", "{p}", "-p", package])
        .output()
        .expect("running cargo tree");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

fn heavy_in(package: &str) -> Vec<&'static str> {
    let deps = normal_dependencies(package);
    HEAVY
        .iter()
        .copied()
        .filter(|heavy| {
            deps.iter()
                .any(|d| d == heavy || d.starts_with(&format!("{heavy}-")))
        })
        .collect()
}

#[test]
fn the_pool_core_and_the_config_model_have_no_runtime_sandbox_database_or_http_stack() {
    for package in ["berth-core", "berth-config"] {
        assert_eq!(
            heavy_in(package),
            Vec::<&str>::new(),
            "{package} must not depend on these; `cargo tree -p {package} -e normal -i NAME` \
             shows the path"
        );
    }
}

#[test]
fn the_check_sees_the_stacks_where_they_are() {
    // The service does use every one of them, so an empty answer above is
    // the core's own and not a tree the check failed to read.
    assert_eq!(heavy_in("berth-server"), HEAVY.to_vec());
}

/// HTTP client crates the service must not pull in: it reaches other berth
/// processes through hyper, which it serves with anyway (with hyper-rustls's
/// connector for TLS), and takes the
/// API's bodies from `berth-types`, not from the client crate.
const CLIENTS: &[&str] = &["reqwest", "berth-client"];

#[test]
fn the_service_pulls_in_no_http_client_crate() {
    let deps = normal_dependencies("berth-server");
    let found: Vec<&str> = CLIENTS
        .iter()
        .copied()
        .filter(|c| deps.contains(*c))
        .collect();
    assert_eq!(
        found,
        Vec::<&str>::new(),
        "berth-server must not depend on these; `cargo tree -p berth-server -e normal -i NAME` \
         shows the path"
    );
    // The client crate does pull one in, so an empty answer above is the
    // service's own and not a tree the check failed to read.
    assert!(normal_dependencies("berth-client").contains("reqwest"));
}
