//! Shared test fixtures: the plugins built for wasm32-wasip2, an in-process
//! sim cloud on 127.0.0.1:0, and a log capture.

// Paths relative to this file, so that the benchmarks, which include it by
// path, find them too.
// Headless Chromium through chromedriver (tests/ui.rs).
#[path = "support/browser.rs"]
pub mod browser;
// A pool on a fake cloud killed during creates and deletes.
#[path = "support/clouds.rs"]
pub mod clouds;
// The configs the tests write.
#[path = "support/config.rs"]
#[allow(dead_code)]
pub mod config;
#[path = "support/disk.rs"]
pub mod disk;
#[path = "support/echo.rs"]
pub mod echo;
#[path = "support/fault_proxy.rs"]
pub mod fault_proxy;
// For the PostgreSQL store's tests (the store crate's tests include it by
// path too).
#[path = "support/mtls.rs"]
pub mod mtls;
#[path = "support/pool.rs"]
#[allow(dead_code)]
pub mod pool;
#[path = "support/postgres.rs"]
#[allow(dead_code)]
pub mod postgres;
#[path = "support/sandbox.rs"]
#[allow(dead_code)]
pub mod sandbox;
#[path = "support/server.rs"]
pub mod server;
#[path = "support/sshd.rs"]
pub mod sshd;
// Each binary that includes this uses part of it.
#[path = "support/sys.rs"]
#[allow(dead_code)]
pub mod sys;
// The token servers of the credential tests; each test uses part of it.
#[path = "support/tokens.rs"]
#[allow(dead_code)]
pub mod tokens;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

/// The conformance kit's steps that exercise a driver's contract (after
/// load, describe and configure): every driver must pass each.
pub const KIT_STEPS: [&str; 11] = [
    "create with tags",
    "listed with tags",
    "get by id",
    "one token, one instance",
    "seen by another instance",
    "set-tags visible",
    "foreign pool isolation",
    "gone after delete",
    "get after delete",
    "delete again",
    "cleanup",
];

/// What the kit says when it skips a recorded failed instance for a 0.1
/// driver.
pub const NO_FAILED_STATE: &str = "contract 0.1 has no failed state";

/// The kit's skipped steps in `out` (`berth driver test`'s report) but the
/// ones a driver runs only if it has what they check: the batches, which
/// only a driver declaring them runs, and recorded failed instances, which
/// a 0.1 driver cannot report.
pub fn skipped_but_declared(out: &str) -> Vec<&str> {
    (out.lines())
        .filter(|l| l.starts_with("SKIP") && !l.starts_with("SKIP  batches"))
        .filter(|l| !(l.starts_with("SKIP  error mapping") && l.contains(NO_FAILED_STATE)))
        .collect()
}

/// The instances of `cloud` that are not terminated, by its own record.
pub fn live(cloud: &berth::sim::SimCloud) -> Vec<berth::sim::Instance> {
    cloud
        .instances()
        .into_iter()
        .filter(|i| i.state != berth::sim::InstanceState::Terminated)
        .collect()
}

/// How many instances `cloud` has made, by its own record (terminated ones
/// it still keeps included), and for how many nodes (`berth-node` tags):
/// equal when no node got a second instance.
pub fn instances_and_nodes(cloud: &berth::sim::SimCloud) -> (usize, usize) {
    let instances = cloud.instances();
    let nodes: std::collections::BTreeSet<&str> = (instances.iter())
        .filter_map(|i| i.tags.get("berth-node").map(String::as_str))
        .collect();
    (instances.len(), nodes.len())
}

/// `component` with a custom section appended that holds `n`: a valid
/// component, the same driver, other bytes for each `n` (a new build, as
/// far as its sha256 tells).
pub fn with_custom_section(component: &[u8], n: u8) -> Vec<u8> {
    let mut bytes = component.to_vec();
    // Section id 0 (custom), size 8: a 1-byte name "x", then "berth" and n.
    bytes.extend_from_slice(&[0x00, 0x08, 0x01, b'x', b'b', b'e', b'r', b't', b'h', n]);
    bytes
}

/// Replaces the file at `path` with `bytes` at once (a rename), as a deploy
/// would.
pub fn put(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

/// The value of the metric line of `/metrics` text that starts with
/// `series` (name and labels), if there is one.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// How many creates `cloud` has been sent, by its own record: alone, or
/// as items of a batch.
pub fn creates(cloud: &berth::sim::SimCloud) -> usize {
    create_statuses(cloud).len()
}

/// When each create `cloud` was sent (alone, or as an item of a batch)
/// came, and what it answered, in its own record.
pub fn create_statuses(cloud: &berth::sim::SimCloud) -> Vec<(u64, u16)> {
    let mut all = Vec::new();
    for c in cloud.calls() {
        if c.method != "POST" {
            continue;
        }
        if c.path.ends_with("/v1/instances") {
            all.push((c.at_ms, c.status));
        } else if c.path.ends_with("/v1/batch/create") {
            all.extend(c.items.iter().map(|i| (c.at_ms, i.status)));
        }
    }
    all
}

/// Each delete `cloud` was sent (alone, or as an item of a batch): the
/// instance id, and what it answered, in its own record.
pub fn deletes(cloud: &berth::sim::SimCloud) -> Vec<(String, u16)> {
    let mut all = Vec::new();
    for c in cloud.calls() {
        if c.method == "DELETE"
            && let Some((_, id)) = c.path.rsplit_once("/v1/instances/")
        {
            all.push((id.to_owned(), c.status));
        } else if c.method == "POST" && c.path.ends_with("/v1/batch/delete") {
            let items = c.items.iter();
            all.extend(items.map(|i| (i.id.clone().unwrap_or_default(), i.status)));
        }
    }
    all
}

/// The workspace root (host/ is one below it).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// Builds every plugin once per test process and returns the path of the one
/// named `name` (`sim`, `example`, `hostile`, `broken`, `wrong-version`,
/// `aws-ec2`, `static`, `careless`, `trap-configure`); `sim-0.1` is the build of the sim
/// driver for contract 0.1 kept in the tree, built by nothing. The drivers
/// for the clouds of tests/clouds (`hetzner`, `openstack`, …) are built one by one, the
/// first time a test asks for each.
pub fn plugin(name: &str) -> PathBuf {
    if name == "sim-0.1" {
        return workspace().join("plugins/fixtures/sim-0.1/berth_driver_sim_0_1.wasm");
    }
    if let Some(package) = CLOUD_DRIVERS
        .iter()
        .find(|p| p.strip_prefix("berth-driver-") == Some(name))
    {
        return built_alone(package);
    }
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let dir =
        BUILT.get_or_init(|| build_plugins().unwrap_or_else(|e| panic!("building plugins: {e}")));
    let file = match name {
        "sim" => "berth_driver_sim",
        "example" => "berth_driver_example",
        "hostile" => "berth_fixture_hostile",
        "broken" => "berth_fixture_broken",
        "wrong-version" => "berth_fixture_wrong_version",
        "aws-ec2" => "berth_driver_aws_ec2",
        "static" => "berth_driver_static",
        "careless" => "berth_fixture_careless",
        "trap-configure" => "berth_fixture_trap_configure",
        other => panic!("unknown plugin {other}"),
    };
    dir.join(format!("{file}.wasm"))
}

/// The `plugins-dir` and `driver` of a config for the driver file at
/// `file`: its directory, and its name there (a config names a driver only
/// as a file inside its plugins directory).
pub fn plugins_dir_and_name(file: &Path) -> (String, String) {
    let dir = file.parent().expect("a driver file's directory");
    let name = file.file_name().expect("a driver file's name");
    (
        dir.display().to_string(),
        Path::new(name).display().to_string(),
    )
}

/// A plugins directory `dir` holding each of `files` under its own name
/// (a hard link, or a copy where none can be made), for a config whose
/// drivers were built or written in different directories.
pub fn plugins_dir_with(dir: &Path, files: &[&Path]) -> PathBuf {
    std::fs::create_dir_all(dir).expect("plugins dir");
    for file in files {
        let to = dir.join(file.file_name().expect("a driver file's name"));
        if to.exists() {
            continue;
        }
        if std::fs::hard_link(file, &to).is_err() {
            std::fs::copy(file, &to).expect("copying a driver file");
        }
    }
    dir.to_path_buf()
}

/// The drivers for the fake clouds of tests/clouds, each built only for the
/// tests that ask for it.
const CLOUD_DRIVERS: [&str; 4] = [
    "berth-driver-hetzner",
    "berth-driver-azure",
    "berth-driver-openstack",
    "berth-driver-gce",
];

/// Builds the driver `package` alone, once per test process, and returns
/// its component.
fn built_alone(package: &'static str) -> PathBuf {
    static BUILT: Mutex<BTreeMap<&'static str, PathBuf>> = Mutex::new(BTreeMap::new());
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(path) = built.get(package) {
        return path.clone();
    }
    let dir = build_packages(&[package]).unwrap_or_else(|e| panic!("building {package}: {e}"));
    let path = dir.join(format!("{}.wasm", package.replace('-', "_")));
    built.insert(package, path.clone());
    path
}

/// Runs `cargo build --target wasm32-wasip2` for the plugins into a target
/// directory of their own, so it never waits on the lock of the build that
/// is running these tests.
pub fn build_plugins() -> Result<PathBuf, String> {
    build_packages(&[
        "berth-driver-sim",
        "berth-driver-example",
        "berth-fixture-hostile",
        "berth-fixture-broken",
        "berth-fixture-wrong-version",
        "berth-driver-aws-ec2",
        "berth-driver-static",
        "berth-fixture-careless",
        "berth-fixture-trap-configure",
    ])
}

/// `cargo build --target wasm32-wasip2 --profile plugin` of `packages`, into
/// the plugins' own target directory; the directory of the components.
fn build_packages(packages: &[&str]) -> Result<PathBuf, String> {
    let root = workspace();
    let target = root.join("target").join("plugins");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(&root)
        .args([
            "build",
            "--quiet",
            "--target",
            "wasm32-wasip2",
            "--profile",
            "plugin",
        ])
        .args(packages.iter().flat_map(|p| ["-p", p]))
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !status.success() {
        return Err(format!(
            "cargo build of the plugins failed ({status}); is the wasm32-wasip2 target installed?"
        ));
    }
    Ok(target.join("wasm32-wasip2").join("plugin"))
}

/// A sim cloud serving on 127.0.0.1:0 until dropped.
pub struct SimServer {
    pub cloud: berth::sim::SimCloud,
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl SimServer {
    /// Writes `dir/provider.json` for `berth driver test` against this sim
    /// (with `page_size` in the driver config when given) and returns its path.
    pub fn provider_json(&self, dir: &std::path::Path, page_size: Option<u32>) -> PathBuf {
        let mut config = serde_json::json!({"endpoint": self.url()});
        if let Some(n) = page_size {
            config["page_size"] = n.into();
        }
        let path = dir.join("provider.json");
        let json = serde_json::json!({"config": config, "allow_hosts": [self.addr().to_string()]});
        std::fs::write(&path, json.to_string()).expect("writing provider.json");
        path
    }

    pub async fn start() -> SimServer {
        Self::start_with(berth::sim::Knobs::default()).await
    }

    pub async fn start_with(knobs: berth::sim::Knobs) -> SimServer {
        let cloud = berth::sim::SimCloud::new(knobs, None).expect("sim cloud");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(cloud.clone().serve(listener, async move {
            let _ = stopped.await;
        }));
        SimServer {
            cloud,
            addr,
            stop: Some(stop),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for SimServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Captures this thread's tracing output (use with a current-thread runtime,
/// so the tasks under test log on this thread).
pub struct LogCapture {
    buffer: Arc<Mutex<Vec<u8>>>,
    _guard: tracing::subscriber::DefaultGuard,
}

impl LogCapture {
    /// Captures every event of this thread from now on.
    ///
    /// tracing caches, per callsite, whether any subscriber wants it. While
    /// only one subscriber is registered, that is decided by the subscriber
    /// of the thread that first reaches the callsite; on another test's
    /// thread (none), a callsite is then off for good, also for a capture.
    /// A second, permanent subscriber that wants nothing itself keeps the
    /// decision with every registered one.
    pub fn install() -> LogCapture {
        static KEEPER: OnceLock<tracing::Dispatch> = OnceLock::new();
        KEEPER.get_or_init(|| tracing::Dispatch::new(Undecided));
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter("berth=debug")
            .with_ansi(false)
            .with_writer(move || BufWriter(writer.clone()))
            .finish();
        LogCapture {
            buffer,
            _guard: tracing::subscriber::set_default(subscriber),
        }
    }

    pub fn contents(&self) -> String {
        String::from_utf8_lossy(&self.buffer.lock().unwrap()).into_owned()
    }
}

/// A subscriber that enables nothing but leaves every callsite to the
/// current thread's subscriber ("sometimes").
struct Undecided;

impl tracing::Subscriber for Undecided {
    fn register_callsite(
        &self,
        _: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::sometimes()
    }
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::OFF)
    }
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        false
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {}
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

struct BufWriter(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for BufWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A driver built by its own script (`plugins/NAME/build`, for drivers not
/// written in Rust), once per test process; the path the script printed last.
/// Held by what would load both cores for minutes (a driver build from
/// nothing) and by the tests that time berth under a flood, so that these
/// measure berth and not the builds beside them.
pub fn machine_to_myself() -> std::sync::MutexGuard<'static, ()> {
    static HEAVY: Mutex<()> = Mutex::new(());
    HEAVY.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn scripted_plugin(name: &'static str) -> PathBuf {
    static BUILT: Mutex<Vec<(&'static str, PathBuf)>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, path)) = built.iter().find(|(n, _)| *n == name) {
        return path.clone();
    }
    let root = workspace();
    let script = root.join("plugins").join(name).join("build");
    let _heavy = machine_to_myself();
    let out = Command::new(&script)
        .current_dir(&root)
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} failed ({})",
        script.display(),
        out.status
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default().trim();
    let path = root.join(last);
    assert!(
        path.is_file(),
        "{} printed {last:?}, not a file",
        script.display()
    );
    built.push((name, path.clone()));
    path
}
