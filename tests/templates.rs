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
    let skipped = crate::support::skipped_but_declared(&test.stdout);
    assert!(skipped.is_empty(), "{lang}: {test}");
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

/// `berth driver wit DIR [--version V]`: the binary writes the newest
/// contract, or the version asked for, as one package (`driver.wit` with
/// its WASI `deps/`), byte for byte the repository's folder of that
/// version; a version it does not carry is refused, naming those it does.
#[tokio::test]
async fn the_binary_writes_each_contract_version_it_carries() {
    let dir = tempfile::tempdir().unwrap();
    let versions = ["0.1.0", "0.2.0"];
    for (i, version) in [None, Some("0.1.0"), Some("0.2.0")].into_iter().enumerate() {
        let out = dir.path().join(format!("wit-{i}"));
        let mut args = vec![OsStr::new("driver"), "wit".as_ref(), out.as_ref()];
        if let Some(v) = version {
            args.extend(["--version".as_ref(), OsStr::new(v)]);
        }
        let wrote = run_berth(args, &[]).await;
        assert!(wrote.success(), "{wrote}");
        let newest = versions[versions.len() - 1];
        let expect = version.unwrap_or(newest);
        assert!(
            wrote
                .stdout
                .contains(&format!("files of berth:driver@{expect}")),
            "{wrote}"
        );
        let source = workspace()
            .join("wit")
            .join(format!("berth-driver@{expect}"));
        for rel in ["driver.wit", "deps/http/http.wit", "deps/io/io.wit"] {
            let written = std::fs::read(out.join(rel)).unwrap();
            assert_eq!(written, std::fs::read(source.join(rel)).unwrap(), "{rel}");
        }
    }
    let out = dir.path().join("none");
    let refused = run_berth(
        [
            OsStr::new("driver"),
            "wit".as_ref(),
            out.as_ref(),
            "--version".as_ref(),
            "9.9.9".as_ref(),
        ],
        &[],
    )
    .await;
    assert!(!refused.success(), "{refused}");
    assert!(
        refused
            .stderr
            .contains("no contract version 9.9.9; it carries 0.1.0, 0.2.0"),
        "{refused}"
    );
    assert!(!out.join("driver.wit").exists());
}
