//! Paths stay inside their directories, through the `berth` binary: a
//! provider's `driver` names a file inside `plugins-dir`, and neither `..`,
//! an absolute path nor a symlink out of the directory loads anything
//! outside it (`berth config check` and `berth serve` refuse them, and
//! nothing of the file runs); a symlink that stays inside loads. A file
//! berth keeps in its state directory that is a symlink leading out of it
//! stops `berth serve` before it writes anything there.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::config::{edit_config, serve_config_on, serve_config_with};
use crate::support::server::{Berth, Launch, run_berth};
use crate::support::{SimServer, live, plugin};

/// A test's directory: `plugins/` (empty) and, outside it, `outside/sim.wasm`,
/// a real driver.
struct Dirs {
    root: tempfile::TempDir,
}

impl Dirs {
    fn new() -> Dirs {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(root.path().join("plugins")).expect("mkdir");
        std::fs::create_dir(root.path().join("outside")).expect("mkdir");
        std::fs::copy(plugin("sim"), root.path().join("outside/sim.wasm")).expect("copy");
        Dirs { root }
    }

    fn path(&self) -> &Path {
        self.root.path()
    }

    fn plugins(&self) -> PathBuf {
        self.path().join("plugins")
    }

    fn outside(&self) -> PathBuf {
        self.path().join("outside/sim.wasm")
    }

    /// A `berth serve` config with `plugins-dir` this test's `plugins/`
    /// and the provider's `driver` as `name`, written as it is.
    fn config_naming(&self, sim: &SimServer, name: &str) -> PathBuf {
        let config = serve_config_on(sim, self.path(), &self.plugins().join("placeholder.wasm"));
        edit_config(
            &config,
            "driver = \"placeholder.wasm\"",
            &format!("driver = {name:?}"),
        );
        config
    }
}

/// `berth config check CONFIG`: whether it passed, and what it said.
async fn config_check(config: &Path) -> (bool, String) {
    let ran = run_berth(["config", "check", &config.display().to_string()], &[]).await;
    (
        ran.status.success(),
        format!("{}{}", ran.stdout, ran.stderr),
    )
}

/// `config check` and `serve` both refuse `config`, each saying every
/// one of `said` (the key at fault among them), and the sim cloud is
/// asked nothing.
async fn refused(sim: &SimServer, dir: &Path, config: &Path, said: &[&str]) {
    let (ok, out) = config_check(config).await;
    assert!(!ok, "config check passed: {out}");
    for part in said {
        assert!(out.contains(part), "`{part}` not in config check's {out}");
    }
    let args = ["--config", &config.display().to_string()];
    let exited = Berth::spawn(Launch::new(&args, dir))
        .exit_within(Duration::from_secs(30))
        .await;
    exited.assert_code(2);
    let log = exited.log_text();
    for part in said {
        assert!(log.contains(part), "`{part}` not in serve's {log}");
    }
    assert!(sim.cloud.calls().is_empty(), "{:?}", sim.cloud.calls());
    assert!(live(&sim.cloud).is_empty());
}

/// Regression: `driver = "../../etc/passwd"` passed `berth config check`
/// without a word. A name with `..` or an absolute path is refused as it
/// is written, whether or not a driver is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_named_with_dots_or_an_absolute_path_is_refused() {
    let sim = SimServer::start().await;
    let dirs = Dirs::new();
    // `..` out of plugins-dir, to a real driver.
    std::fs::copy(plugin("sim"), dirs.path().join("x.wasm")).expect("copy");
    let config = dirs.config_naming(&sim, "../x.wasm");
    let plugins = dirs.plugins().display().to_string();
    refused(
        &sim,
        dirs.path(),
        &config,
        &[
            "providers.sim.driver",
            "`../x.wasm` holds `..`",
            "relative to plugins-dir",
            &plugins,
        ],
    )
    .await;

    // An absolute path, to a real driver.
    let config = dirs.config_naming(&sim, &dirs.outside().display().to_string());
    refused(
        &sim,
        dirs.path(),
        &config,
        &[
            "providers.sim.driver",
            "is an absolute path",
            "relative to plugins-dir",
        ],
    )
    .await;
}

/// A symlink in plugins-dir to a driver outside it, by an absolute or a
/// relative target, or a directory in it linked to one outside: refused,
/// naming the key and the directory. A symlink that stays inside loads,
/// and its driver serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_out_of_the_plugins_directory_is_refused_and_one_inside_loads() {
    let sim = SimServer::start().await;
    let dirs = Dirs::new();
    let plugins = dirs.plugins();
    symlink(dirs.outside(), plugins.join("abs.wasm")).expect("symlink");
    symlink("../outside/sim.wasm", plugins.join("up.wasm")).expect("symlink");
    symlink("../outside", plugins.join("away")).expect("symlink");
    let shown = plugins.display().to_string();
    for name in ["abs.wasm", "up.wasm", "away/sim.wasm"] {
        let config = dirs.config_naming(&sim, name);
        let file = plugins.join(name).display().to_string();
        refused(
            &sim,
            dirs.path(),
            &config,
            &["providers.sim.driver", &file, "leads outside", &shown],
        )
        .await;
    }

    // Inside: a link to a file in a subdirectory, as a deploy that keeps
    // versions side by side would make.
    std::fs::create_dir(plugins.join("v1")).expect("mkdir");
    std::fs::copy(plugin("sim"), plugins.join("v1/sim.wasm")).expect("copy");
    symlink("v1/sim.wasm", plugins.join("current.wasm")).expect("symlink");
    let config = dirs.config_naming(&sim, "current.wasm");
    let (ok, said) = config_check(&config).await;
    assert!(ok, "{said}");
    let args = ["--config", &config.display().to_string()];
    let server = Berth::start(&args, dirs.path()).await;
    server
        .until_label_ready(60, "small", 2, "the linked driver's nodes")
        .await;
    server.terminate().await.assert_success();
}

/// The store berth writes in its state directory is opened there, never
/// where a symlink in it points: `berth serve` refuses to start on a
/// `berth.db` or `driver-state.sqlite` that leads out of the directory, and
/// writes nothing through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_file_that_leads_out_of_the_state_directory_stops_serve() {
    let sim = SimServer::start().await;
    let dirs = Dirs::new();
    // The SQLite store, whatever store the suite runs on: these are its files.
    let config = serve_config_with(
        &sim,
        dirs.path(),
        &dirs.plugins().join("sim.wasm"),
        "min-ready = 2",
        "[store]\nsync = \"full\"\n",
    );
    std::fs::copy(plugin("sim"), dirs.plugins().join("sim.wasm")).expect("copy");
    let state = dirs.path().join("state");
    std::fs::create_dir(&state).expect("mkdir");
    let args = ["--config", &config.display().to_string()];
    for (file, target) in [
        ("berth.db", "../outside/berth.db"),
        ("berth.db-wal", "../outside/berth.db-wal"),
        ("driver-state.sqlite", "../outside/driver-state.sqlite"),
    ] {
        let link = state.join(file);
        symlink(target, &link).expect("symlink");
        let exited = Berth::spawn(Launch::new(&args, dirs.path()))
            .exit_within(Duration::from_secs(30))
            .await;
        exited.assert_code(2);
        let log = exited.log_text();
        assert!(
            log.contains(&link.display().to_string()) && log.contains("leads outside"),
            "{log}"
        );
        let written: Vec<_> = std::fs::read_dir(dirs.path().join("outside"))
            .expect("outside")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(written, ["sim.wasm"], "written outside the state directory");
        assert!(sim.cloud.calls().is_empty(), "{:?}", sim.cloud.calls());
        std::fs::remove_file(&link).expect("unlink");
    }
    // Without links it starts, and its store is in the state directory.
    let server = Berth::start(&args, dirs.path()).await;
    server
        .until_label_ready(60, "small", 2, "nodes on the plain state directory")
        .await;
    server.terminate().await.assert_success();
    assert!(state.join("berth.db").is_file());
}
