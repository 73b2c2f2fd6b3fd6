//! The throwaway PostgreSQL cluster that the PostgreSQL store's tests run
//! against (tests/support/postgres.rs over scripts/postgres): it serves the
//! berth database and fresh ones over TCP with a password, survives a crash
//! stop, and leaves nothing behind when its test process exits.

#![forbid(unsafe_code)]

#[path = "support/postgres.rs"]
#[allow(dead_code)] // the benchmarks and other tests use the rest
mod postgres;

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use postgres::{PgCluster, psql};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

#[test]
fn databases_crash_stop_and_restart() {
    let started = Instant::now();
    let cluster = PgCluster::start(&workspace());
    eprintln!("cluster started in {:?}", started.elapsed());
    assert_eq!(
        cluster.url(),
        format!(
            "postgres://berth:{}@127.0.0.1:{}/berth",
            cluster.password(),
            cluster.port()
        )
    );
    assert_eq!(
        psql(
            &cluster.url(),
            "select current_user || ' ' || current_database()"
        )
        .unwrap(),
        "berth berth"
    );

    let a = cluster.fresh_database("fresh one");
    let b = cluster.fresh_database("fresh one");
    assert_ne!(a, b);
    for url in [&a, &b] {
        assert_eq!(psql(url, "select 1").unwrap(), "1", "{url}");
        let owner = "select pg_get_userbyid(datdba) from pg_database \
                     where datname = current_database()";
        assert_eq!(psql(url, owner).unwrap(), "berth", "{url}");
    }
    // Separate databases: what one holds the other does not see.
    psql(&a, "create table t (x int); insert into t values (7)").unwrap();
    let missing = psql(&b, "select x from t").unwrap_err();
    assert!(missing.contains("does not exist"), "{missing}");
    // The password is checked.
    let wrong = a.replacen(cluster.password(), "wrong", 1);
    let refused = psql(&wrong, "select 1").unwrap_err();
    assert!(
        refused.contains("password authentication failed"),
        "{refused}"
    );

    cluster.stop_immediate();
    let down = psql(&a, "select 1").unwrap_err();
    assert!(down.contains("Connection refused"), "{down}");
    assert!(TcpStream::connect(("127.0.0.1", cluster.port())).is_err());

    let restarted = Instant::now();
    cluster.start_again();
    eprintln!("cluster restarted in {:?}", restarted.elapsed());
    assert_eq!(psql(&a, "select x from t").unwrap(), "7");
    assert_eq!(psql(&b, "select 1").unwrap(), "1");

    let (dir, port) = (cluster.dir().to_path_buf(), cluster.port());
    drop(cluster);
    assert!(!dir.exists(), "{} left behind", dir.display());
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
}

#[test]
fn shared_cluster_is_gone_after_the_process_exits() {
    // A test process that starts the shared cluster and exits without
    // dropping it (statics never are).
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "shared_cluster_child",
            "--nocapture",
        ])
        .output()
        .expect("running this test binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("shared cluster: "))
        .unwrap_or_else(|| panic!("no cluster line in:\n{stdout}"));
    let (dir, rest) = line.split_once(' ').unwrap();
    let (port, pid) = rest.split_once(' ').unwrap();
    let port: u16 = port.parse().unwrap();

    // The watcher cleans up just after the exit.
    let deadline = Instant::now() + Duration::from_secs(20);
    while Path::new(dir).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!Path::new(dir).exists(), "{dir} left behind");
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "a server still listens on {port}"
    );
    // The postmaster is gone (or a zombie, not yet reaped by init).
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = state.rsplit_once(") ").map(|(_, s)| &s[..1]);
    assert!(
        matches!(state, None | Some("Z")),
        "postmaster {pid} still runs"
    );
}

#[test]
#[ignore = "run in a child process by shared_cluster_is_gone_after_the_process_exits"]
fn shared_cluster_child() {
    let cluster = PgCluster::shared(&workspace());
    assert!(std::ptr::eq(cluster, PgCluster::shared(&workspace())));
    let url = cluster.fresh_database("shared");
    assert_eq!(psql(&url, "select 1").unwrap(), "1");
    let pid = std::fs::read_to_string(cluster.dir().join("data/postmaster.pid")).unwrap();
    println!(
        "shared cluster: {} {} {}",
        cluster.dir().display(),
        cluster.port(),
        pid.lines().next().unwrap()
    );
}
