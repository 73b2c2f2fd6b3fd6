//! The configs and tables the tests write: `berth serve` configs with the
//! tests' tokens, the `[store]` table of the store the tests run on, and
//! the static driver's hosts.

use std::path::Path;

use serde_json::{Value, json};

use crate::support::postgres::PgCluster;
use crate::support::{SimServer, plugin, plugins_dir_and_name, workspace};

pub const CI: &str = "ci-token-0123456789abcdef";
pub const OTHER: &str = "other-token-0123456789ab";
pub const OPS: &str = "ops-token-0123456789abcde";

/// A config for `berth serve` against `sim`, with client tokens `ci` and
/// `other`, admin `ops`, and a 3 s lease.
pub fn serve_config(sim: &SimServer, dir: &Path) -> std::path::PathBuf {
    serve_config_on(sim, dir, &plugin("sim"))
}

/// A sim cloud whose quota is two instances, and a [`serve_config`] for it
/// in `dir` whose quota pause lasts an hour: a request for more than two
/// waits for the quota through any test.
pub async fn quota_of_two(dir: &Path) -> (SimServer, std::path::PathBuf) {
    let sim = SimServer::start_with(berth::sim::Knobs {
        quota: Some(2),
        ..berth::sim::Knobs::default()
    })
    .await;
    let config = serve_config(&sim, dir);
    edit_config(
        &config,
        "sync-interval = \"1s\"",
        "sync-interval = \"1s\"\nquota-pause = \"1h\"",
    );
    (sim, config)
}

/// [`serve_config`] with the provider on `driver`, a driver of the sim
/// cloud's API.
pub fn serve_config_on(sim: &SimServer, dir: &Path, driver: &Path) -> std::path::PathBuf {
    serve_config_with(sim, dir, driver, "min-ready = 2", "")
}

/// [`serve_config_on`] with `small` as the keys of `[labels.small]` and
/// `extra` appended (tables such as `[providers.sim.limits]`).
pub fn serve_config_with(
    sim: &SimServer,
    dir: &Path,
    driver: &Path,
    small: &str,
    extra: &str,
) -> std::path::PathBuf {
    let keys = format!(
        "allow-hosts = [\"{}\"]\nconfig = {{ endpoint = \"{}\" }}",
        sim.addr(),
        sim.url()
    );
    serve_config_for(dir, driver, &keys, small, extra)
}

/// Sets the requestors' `lease-ttl` of the config at `path`, written by
/// [`serve_config_for`] (3 s there), to `ttl`.
pub fn set_lease_ttl(path: &Path, ttl: &str) {
    edit_config(path, "lease-ttl = \"3s\"", &format!("lease-ttl = {ttl:?}"));
}

/// Replaces `from` with `to` in the config file at `path`, which must hold
/// `from`.
pub fn edit_config(path: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    let edited = text.replace(from, to);
    assert_ne!(edited, text, "{from:?} is not in {}", path.display());
    std::fs::write(path, edited).unwrap();
}

/// The config of [`serve_config_with`] for any driver: provider `sim` on
/// `driver` with `provider` as its other keys (`allow-hosts`, `config`).
pub fn serve_config_for(
    dir: &Path,
    driver: &Path,
    provider: &str,
    small: &str,
    extra: &str,
) -> std::path::PathBuf {
    let (plugins, driver) = plugins_dir_and_name(driver);
    let text = format!(
        r#"
pool-id = "serve-test"
ready = "running"
state-dir = {state:?}
plugins-dir = {plugins:?}
sync-interval = "1s"
boot-poll-interval = "100ms"
leak-grace = "1s"

[api]
listen = "127.0.0.1:0"
lease-ttl = "3s"
[api.tokens.ci]
role = "client"
token = "{CI}"
[api.tokens.other]
role = "client"
token = "{OTHER}"
[api.tokens.ops]
role = "admin"
token = "{OPS}"

[providers.sim]
driver = {driver:?}
{provider}

[labels.small]
{small}
[labels.small.providers.sim]
instance-type = "small"
image = "img"
vcpus = 1
ram = "1GiB"
price = 0.1
{extra}
"#,
        state = dir.join("state").display().to_string(),
    );
    let text = if extra.contains("[store]") {
        text
    } else {
        text + &test_store(dir)
    };
    let path = dir.join("berth.toml");
    std::fs::write(&path, text).expect("write config");
    path
}

/// Whether these tests run with the pool on PostgreSQL
/// (`BERTH_TEST_STORE=postgres`, as `scripts/test` runs them a second time):
/// each config gets a fresh database of the test process's cluster.
pub fn on_postgres() -> bool {
    std::env::var("BERTH_TEST_STORE").is_ok_and(|v| v == "postgres")
}

pub fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("")
}

/// The `[store]` table these tests add to a config in `dir`: none (the
/// SQLite store in the state directory), or with `BERTH_TEST_STORE=postgres`
/// a fresh database of the test process's PostgreSQL cluster, its password
/// in `dir`.
pub fn test_store(dir: &Path) -> String {
    if on_postgres() {
        database(dir, None).1
    } else {
        String::new()
    }
}

/// A fresh database: its url with the password (for psql) and a `[store]`
/// table that names it without one and reads the password from a file in
/// `dir`.
pub fn database(dir: &Path, password: Option<&str>) -> (String, String) {
    let cluster = PgCluster::shared(&workspace());
    let url = cluster.fresh_database("serve");
    let store = store_table(cluster, &url, dir, password);
    (url, store)
}

/// A `[store]` table for the database at `url` of `cluster`: the url
/// without its password, which goes into `dir/pgpass` (`password`, or the
/// cluster's own).
pub fn store_table(cluster: &PgCluster, url: &str, dir: &Path, password: Option<&str>) -> String {
    let bare = url.replacen(&format!("berth:{}@", cluster.password()), "berth@", 1);
    assert_ne!(bare, url);
    std::fs::write(
        dir.join("pgpass"),
        format!("{}\n", password.unwrap_or(cluster.password())),
    )
    .unwrap();
    // A short lease, so that a process restarted after a SIGKILL takes its
    // pool back in seconds.
    format!("[store]\nurl = {bare:?}\npassword-file = \"pgpass\"\npool-lease-ttl = \"1s\"\n")
}

/// A config of one host per address (`build-N`), each serving `small`
/// with `jobs` slots and a ready check of its port.
pub fn hosts(addrs: &[std::net::SocketAddr], jobs: u32) -> serde_json::Value {
    let hosts: Vec<_> = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| {
            json!({
                "name": format!("build-{i}"),
                "address": a.ip().to_string(),
                "port": a.port(),
                "labels": ["small"],
                "max-parallel-jobs": jobs,
                "username": "ci",
                "ready-check": {"timeout-ms": 500},
            })
        })
        .collect();
    json!({ "hosts": hosts })
}

/// Labels that pack: `slot`, four to a `big` machine of provider `sim`
/// (`extra` of [`serve_config_with`], or a pool config's).
pub const SLOTS: &str = r#"
[labels.big]
[labels.big.providers.sim]
instance-type = "big"
image = "img"
vcpus = 8
ram = "32GiB"

[labels.slot]
slots = 4
backing-label = "big"
grace-time = "500ms"
"#;
