//! With the `embedded-sim` feature (on by default), builds the sim driver
//! (`plugins/sim`) for wasm32-wasip2 and leaves it in OUT_DIR as `sim.wasm`,
//! for `src/embedded.rs` to carry inside the binary: `berth serve` with no
//! config then runs a working pool with no separate driver build.
//!
//! The nested cargo builds into `target/plugins`, the directory that
//! `scripts/build-plugins` and `tests/support.rs` use: the artifact is shared
//! between them, and the nested build never waits on the lock of the build
//! that is running this script.

#![forbid(unsafe_code)]

use std::env;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

const TARGET: &str = "wasm32-wasip2";

/// Variables that cargo sets for this script, or that a tool wrapping cargo
/// sets, which would make the nested build differ from the one that
/// `scripts/build-plugins` and the tests run, and so rebuild the shared
/// artifact back and forth. `CARGO_TARGET_DIR` is set explicitly.
const REMOVED: &[&str] = &[
    "RUSTFLAGS",
    "CARGO_ENCODED_RUSTFLAGS",
    "CARGO_BUILD_RUSTFLAGS",
    "CARGO_BUILD_TARGET",
    "CARGO_BUILD_TARGET_DIR",
    "CARGO_BUILD_BUILD_DIR",
    // `cargo clippy` and `cargo fix` run their tools as this wrapper.
    "RUSTC_WORKSPACE_WRAPPER",
    "RUSTC_LINKER",
    "CARGO_MANIFEST_DIR",
    "CARGO_MANIFEST_PATH",
    "CARGO_MANIFEST_LINKS",
    "OUT_DIR",
    "TARGET",
    "HOST",
    "NUM_JOBS",
    "OPT_LEVEL",
    "DEBUG",
    "PROFILE",
];
const REMOVED_PREFIXES: &[&str] = &[
    "CARGO_FEATURE_",
    "CARGO_CFG_",
    "CARGO_PKG_",
    "DEP_",
    "CLIPPY_",
    "__CARGO",
];

fn main() -> ExitCode {
    println!("cargo::rerun-if-changed=build.rs");
    if env::var_os("CARGO_FEATURE_EMBEDDED_SIM").is_none() {
        return ExitCode::SUCCESS;
    }
    let Err(failure) = build_sim() else {
        return ExitCode::SUCCESS;
    };
    let (message, code) = match failure {
        // `cargo::error` alone fails the build with just these lines.
        Failure::Plain(message) => (message, ExitCode::SUCCESS),
        // A failed exit makes cargo also show this script's stderr, which
        // holds the nested cargo's errors.
        Failure::Nested(message) => (message, ExitCode::FAILURE),
    };
    println!("cargo::error={message}");
    println!(
        "cargo::error=if the {TARGET} target is missing, run `scripts/setup`; \
         or build berth with `--no-default-features` to leave the embedded sim driver out"
    );
    code
}

/// Why the build failed, which decides whether cargo shows this script's
/// stderr: only a failed nested cargo has anything useful there.
enum Failure {
    Plain(String),
    Nested(String),
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Failure::Plain(message)
    }
}

fn build_sim() -> Result<(), Failure> {
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    // This crate is crates/server in the workspace.
    let root = manifest_dir
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| "crates/server has no workspace above it".to_owned())?
        .to_path_buf();
    if !root.join("plugins/sim/Cargo.toml").is_file() {
        return Err(Failure::Plain(format!(
            "the embedded sim driver is built from the berth workspace, but {} is not there",
            root.join("plugins/sim").display()
        )));
    }
    for path in [
        "plugins/sim",
        "sdk/src",
        "sdk/Cargo.toml",
        "wit",
        "Cargo.toml",
        "Cargo.lock",
    ] {
        println!("cargo::rerun-if-changed={}", root.join(path).display());
    }

    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    check_target(&rustc)?;

    let target_dir = root.join("target").join("plugins");
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args([
            "build",
            "--quiet",
            "--target",
            TARGET,
            "--profile",
            "plugin",
        ])
        .args(["-p", "berth-driver-sim"])
        .env("CARGO_TARGET_DIR", &target_dir)
        // Same compiler as this build. CARGO_MAKEFLAGS stays too, so the
        // nested cargo takes its jobs from this build's jobserver.
        .env("RUSTC", &rustc);
    for (key, _) in env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        if REMOVED.contains(&key) || REMOVED_PREFIXES.iter().any(|p| key.starts_with(p)) {
            cmd.env_remove(key);
        }
    }
    // The nested cargo's own messages go to this script's stderr, which
    // cargo shows when the build fails.
    let status = cmd
        .status()
        .map_err(|e| format!("running cargo to build the sim driver: {e}"))?;
    if !status.success() {
        return Err(Failure::Nested(format!(
            "building the sim driver (plugins/sim) for {TARGET} failed ({status}); \
             cargo's errors are below, under `--- stderr`"
        )));
    }

    let built = target_dir
        .join(TARGET)
        .join("plugin")
        .join("berth_driver_sim.wasm");
    let bytes = std::fs::read(&built).map_err(|e| format!("reading {}: {e}", built.display()))?;
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR")).join("sim.wasm");
    write_if_changed(&out, &bytes).map_err(|e| format!("writing {}: {e}", out.display()).into())
}

/// Fails early, with a clear message, when the standard library for the
/// driver target is not installed: that is the usual first-build failure.
fn check_target(rustc: &OsString) -> Result<(), String> {
    let out = Command::new(rustc)
        .args(["--print", "target-libdir", "--target", TARGET])
        .output()
        .map_err(|e| format!("running {}: {e}", Path::new(rustc).display()))?;
    let libdir = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || libdir.is_empty() || !Path::new(&libdir).is_dir() {
        return Err(format!(
            "the {TARGET} target is not installed, and the embedded sim driver is built for it"
        ));
    }
    Ok(())
}

fn write_if_changed(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if std::fs::read(path).is_ok_and(|old| old == bytes) {
        return Ok(());
    }
    std::fs::write(path, bytes)
}
