//! A throwaway PostgreSQL 15 cluster for tests, made and run by
//! `scripts/postgres` (`init`, `start`, `stop`, `watch`): it lives in a
//! temporary directory, listens on a free port of 127.0.0.1 only, and has a
//! role `berth` (LOGIN, CREATEDB, a random password) owning a database
//! `berth`.
//!
//! ```ignore
//! let cluster = PgCluster::shared(&workspace_root); // one per test process
//! let url = cluster.fresh_database("leases"); // a new, empty database
//! ```
//!
//! Tests in one process share one cluster ([`PgCluster::shared`]) but each
//! takes its own database ([`PgCluster::fresh_database`]); a test that stops
//! the server ([`PgCluster::stop_immediate`]) starts a cluster of its own
//! ([`PgCluster::start`]).
//!
//! No cluster outlives its test process, however that process ends: each
//! cluster has a watcher (`scripts/postgres watch DIR`) that reads its stdin
//! from a pipe whose only writing end this process holds. When this process
//! exits (normally, by a panic, or killed even by SIGKILL) the kernel closes
//! that end, the watcher reads end of file, stops the server and removes the
//! directory. That is what cleans up the shared cluster, which sits in a
//! static and so is never dropped. The watcher is in a process group of its
//! own and ignores SIGINT and SIGHUP, so a Ctrl-C of `cargo test` ends the
//! test process but not the cleanup.
//!
//! Needs PostgreSQL 15 (`scripts/setup tests` installs it). As root, the server
//! runs as the `postgres` system user and the directory is chowned to it.
//!
//! Uses std and `tempfile` only, and nothing else from tests/support: it is
//! included by path from tests/support.rs and from the store crate's tests.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

/// How many free ports [`PgCluster::start`] tries when the one it picked is
/// taken before the server binds it.
const PORT_ATTEMPTS: usize = 20;

/// A running PostgreSQL cluster in a temporary directory; dropping it stops
/// the server and removes the directory.
pub struct PgCluster {
    /// `scripts/postgres`.
    script: PathBuf,
    /// The cluster: `data/`, `log`, `password` and the server's socket.
    dir: tempfile::TempDir,
    port: u16,
    password: String,
    /// `scripts/postgres watch DIR`, its stdin the pipe that only this
    /// process writes to; taken by `Drop`.
    watcher: Mutex<Option<Child>>,
}

impl PgCluster {
    /// Makes a cluster in a new temporary directory and starts it on a free
    /// port of 127.0.0.1. `workspace_root` is the directory holding
    /// `scripts/` (the workspace root: the parent of `host/`, or two above
    /// `crates/store/`). Panics if that fails, e.g. when PostgreSQL 15 is not
    /// installed (`scripts/setup tests` installs it).
    pub fn start(workspace_root: &Path) -> PgCluster {
        Self::start_with(workspace_root, false)
    }

    /// [`PgCluster::start`] with a server that syncs its writes to disk
    /// (`fsync = on`), as a real one does: for benchmarks. The tests' one
    /// does not, for speed.
    pub fn start_durable(workspace_root: &Path) -> PgCluster {
        Self::start_with(workspace_root, true)
    }

    fn start_with(workspace_root: &Path, durable: bool) -> PgCluster {
        let script = workspace_root.join("scripts/postgres");
        let dir = tempfile::Builder::new()
            .prefix("berth-pg.")
            .tempdir()
            .expect("temporary directory for a PostgreSQL cluster");

        // Started first, so that a panic below (or this process dying) still
        // has the directory removed and any server in it stopped.
        let mut watch = Command::new(&script);
        watch
            .arg("watch")
            .arg(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Away from the terminal's process group: Ctrl-C is for the tests.
            .process_group(0);
        let watcher = watch
            .spawn()
            .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));

        let init = run(Command::new(&script)
            .arg("init")
            .arg(dir.path())
            .env("BERTH_PG_FSYNC", if durable { "on" } else { "off" }));
        let password = String::from_utf8_lossy(&init.stdout).trim().to_owned();
        assert!(
            !password.is_empty(),
            "scripts/postgres init printed no password"
        );

        let mut cluster = PgCluster {
            script,
            dir,
            port: 0,
            password,
            watcher: Mutex::new(Some(watcher)),
        };
        for attempt in 1..=PORT_ATTEMPTS {
            // Postgres cannot listen on port 0: this takes a port the kernel
            // calls free and lets it go, and the server may lose it to
            // another bind in between; the script then exits 3.
            cluster.port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("binding 127.0.0.1:0")
                .port();
            if cluster.try_start() {
                return cluster;
            }
            eprintln!("port {} was taken (attempt {attempt})", cluster.port);
        }
        panic!("no free port for PostgreSQL in {PORT_ATTEMPTS} attempts");
    }

    /// The cluster of this test process, started on first use and cleaned
    /// up by its watcher when the process exits (see the module's doc).
    /// Tests share its server: a test that stops it would break the others,
    /// so outage tests use [`PgCluster::start`].
    pub fn shared(workspace_root: &Path) -> &'static PgCluster {
        static SHARED: OnceLock<PgCluster> = OnceLock::new();
        SHARED.get_or_init(|| PgCluster::start(workspace_root))
    }

    /// `postgres://berth:PASSWORD@127.0.0.1:PORT/berth`.
    pub fn url(&self) -> String {
        self.url_of("berth")
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The `berth` role's password.
    pub fn password(&self) -> &str {
        &self.password
    }

    /// The certificate (PEM) of the CA that signed the server's TLS
    /// certificate, which names 127.0.0.1 and localhost.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// The cluster's directory: `data/` (the data directory), `log` (the
    /// server's log), `password`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Creates a new, empty database owned by `berth`, named after
    /// `name_hint` and unique in this cluster, and returns its URL.
    pub fn fresh_database(&self, name_hint: &str) -> String {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let hint: String = name_hint
            .chars()
            .map(|c| c.to_ascii_lowercase())
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .take(40)
            .collect();
        let hint = if hint.is_empty() { "db".into() } else { hint };
        // At most 40 + 1 + 10 + 1 + 10 bytes: under Postgres' 63.
        let name = format!(
            "{hint}_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        psql(&self.url(), &format!("CREATE DATABASE \"{name}\""))
            .unwrap_or_else(|e| panic!("creating database {name}: {e}"));
        self.url_of(&name)
    }

    /// Stops the server the way a crash does (`pg_ctl stop -m immediate`: no
    /// shutdown checkpoint); connections to [`PgCluster::port`] are then
    /// refused until [`PgCluster::start_again`].
    pub fn stop_immediate(&self) {
        run(Command::new(&self.script)
            .arg("stop")
            .arg(self.dir.path())
            .arg("immediate"));
    }

    /// Starts the stopped server again on the same port and data (after a
    /// crash-stop it recovers from its WAL first); returns once it accepts
    /// connections. Panics if the port was taken meanwhile.
    pub fn start_again(&self) {
        if !self.try_start() {
            panic!("port {} was taken while the server was stopped", self.port);
        }
    }

    /// `scripts/postgres start` on `self.port`: false when the port is in
    /// use (the script's exit status 3); panics on any other failure.
    fn try_start(&self) -> bool {
        let out = output(
            Command::new(&self.script)
                .arg("start")
                .arg(self.dir.path())
                .arg(self.port.to_string()),
        );
        match out.status.code() {
            Some(0) => true,
            Some(3) => false,
            _ => panic!("{}", failure("scripts/postgres start", &out)),
        }
    }

    fn url_of(&self, database: &str) -> String {
        format!(
            "postgres://berth:{}@127.0.0.1:{}/{database}",
            self.password, self.port
        )
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        // Closing the watcher's stdin has it stop the server (immediately:
        // the data is thrown away) and remove the directory.
        let watcher = self.watcher.get_mut().ok().and_then(Option::take);
        if let Some(mut watcher) = watcher {
            drop(watcher.stdin.take());
            let _ = watcher.wait();
        }
        // Should the watcher have died before its time.
        if self.dir.path().join("data/postmaster.pid").exists() {
            let _ = Command::new(&self.script)
                .arg("stop")
                .arg(self.dir.path())
                .arg("immediate")
                .stdin(Stdio::null())
                .output();
        }
        // The TempDir removes whatever is left.
    }
}

/// Runs `sql` with `psql` against `url` (as one transaction unless it is a
/// single statement such as `CREATE DATABASE`), and returns its output
/// unaligned, without headers: a `select 1` gives `"1"`. Errors, a refused
/// connection included, come back as psql's stderr.
pub fn psql(url: &str, sql: &str) -> Result<String, String> {
    let out = Command::new(psql_binary())
        .args([
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            url,
            "-c",
            sql,
        ])
        .env("PGCONNECT_TIMEOUT", "10")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running psql: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim_end().to_owned())
    }
}

/// PostgreSQL 15's psql, else whichever `psql` is on PATH.
fn psql_binary() -> PathBuf {
    let debian = Path::new("/usr/lib/postgresql/15/bin/psql");
    if debian.exists() {
        debian.to_path_buf()
    } else {
        PathBuf::from("psql")
    }
}

/// Runs a `scripts/postgres` command; panics unless it succeeds.
fn run(command: &mut Command) -> Output {
    let out = output(command);
    if !out.status.success() {
        panic!("{}", failure(&format!("{command:?}"), &out));
    }
    out
}

fn output(command: &mut Command) -> Output {
    command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {command:?}: {e}"))
}

fn failure(what: &str, out: &Output) -> String {
    format!(
        "{what} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim_end()
    )
}
