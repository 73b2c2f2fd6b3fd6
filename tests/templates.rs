//! `berth driver new`: each language's project, written into a clean
//! folder by the binary, builds with its one command, passes `berth driver
//! check`, and, as written for the simulated cloud, `berth driver test`
//! with the paging and error-mapping steps.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Command;

use crate::support::server::run_berth;
use crate::support::{KIT_STEPS, SimServer, workspace};

async fn a_new_project_builds_and_passes_the_kit(lang: &str) {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("my-cloud");
    let made = run_berth(
        [
            OsStr::new("driver"),
            "new".as_ref(),
            "my-cloud".as_ref(),
            "--lang".as_ref(),
            lang.as_ref(),
            "--dir".as_ref(),
            project.as_ref(),
        ],
        &[],
    )
    .await;
    assert!(made.success(), "{made}");

    // The one build command, from the clean folder. Rust builds share a
    // target folder across runs, so the SDK's dependencies compile once.
    let build = project.join("build");
    let target = workspace().join("target").join("templates");
    let built = tokio::task::spawn_blocking(move || {
        let _heavy = crate::support::machine_to_myself();
        Command::new(&build)
            .env("CARGO_TARGET_DIR", target)
            .output()
            .expect("running ./build")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&built.stdout);
    assert!(
        built.status.success(),
        "{lang}: ./build failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let wasm = PathBuf::from(stdout.lines().last().expect("the driver's path").trim());
    let wasm = if wasm.is_absolute() {
        wasm
    } else {
        project.join(wasm)
    };
    assert!(wasm.is_file(), "{lang}: {} not built", wasm.display());

    let cache = dir.path().join("cache");
    let env = [("BERTH_CACHE_DIR", cache.as_os_str())];
    let check = run_berth(
        [OsStr::new("driver"), "check".as_ref(), wasm.as_ref()],
        &env,
    )
    .await;
    assert!(check.success(), "{lang}: {check}");

    let sim = SimServer::start().await;
    let config = sim.provider_json(dir.path(), Some(2));
    // The project's own recorded responses.
    let faults = project.join("faults.json");
    let test = run_berth(
        [
            OsStr::new("driver"),
            "test".as_ref(),
            wasm.as_ref(),
            "--config".as_ref(),
            config.as_ref(),
            "--faults".as_ref(),
            faults.as_ref(),
        ],
        &env,
    )
    .await;
    assert!(test.success(), "{lang}: {test}");
    for step in KIT_STEPS.iter().chain(&["paging"]) {
        assert!(
            test.stdout.contains(&format!("PASS  {step}")),
            "{lang}: {step}\n{test}"
        );
    }
    assert!(!test.stdout.contains("SKIP"), "{lang}: {test}");
    assert!(crate::support::live(&sim.cloud).is_empty());
}

#[tokio::test]
async fn a_new_rust_driver_builds_and_passes_the_kit() {
    a_new_project_builds_and_passes_the_kit("rust").await;
}

#[tokio::test]
async fn a_new_python_driver_builds_and_passes_the_kit() {
    a_new_project_builds_and_passes_the_kit("python").await;
}

#[tokio::test]
async fn a_new_javascript_driver_builds_and_passes_the_kit() {
    a_new_project_builds_and_passes_the_kit("js").await;
}
