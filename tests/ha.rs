//! Several `berth serve` processes sharing one pool on one PostgreSQL
//! database and one sim cloud (or one per provider), through the binary. Each process names
//! itself in its sim endpoint (`/c/bN`), so the cloud's own call record says
//! which process sent what. What is checked is the cloud's record and the
//! clients' view, not only berth's:
//! - a holder paused (SIGSTOP) past its lease sends nothing to the cloud
//!   once another process has taken the pool over, and writes nothing;
//! - PostgreSQL crash-stopped under churn: no process calls the cloud while
//!   it is down, and nothing is lost, doubled or leaked once it is back;
//! - a holder cut off from the database while it keeps running calls no
//!   cloud once its lease is uncertain, and its `/readyz` says so;
//! - on the static driver, whose hosts are driver records in the shared
//!   database, a SIGKILLed holder's successor keeps every node on its host
//!   and gives out only a free one;
//! - with three providers (each on a sim cloud of its own), the providers'
//!   leases spread one to each process, and every call on a provider is
//!   sent by its holder while the pool's holder decides them all;
//! - SIGKILLing the holder of each provider in turn under churn (some of
//!   them the pool's holder too): another process takes the provider over
//!   within the TTL and a beat, and the churn loses, doubles and leaks
//!   nothing, on any of the clouds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::support::config::{CI, OPS, serve_config_for, set_lease_ttl};
use crate::support::config::{database, store_table};
use crate::support::postgres::{PgCluster, psql};
use crate::support::server::{Berth, http, run_berth, until};
use crate::support::{SimServer, live, metric, plugin, plugins_dir_and_name};

/// The pool's lease TTL in these tests.
const TTL: Duration = Duration::from_secs(1);

/// The providers of a [`Fleet::sharded`].
const SHARDS: [&str; 3] = ["sim", "sim2", "sim3"];

/// Processes on one database, each in a directory of its own.
struct Fleet {
    sim: SimServer,
    /// The clouds of the other providers of a [`Fleet::sharded`].
    others: Vec<SimServer>,
    url: String,
    root: tempfile::TempDir,
    configs: Vec<PathBuf>,
    procs: Vec<Option<Berth>>,
}

impl Fleet {
    /// `n` configs (nothing started yet), each process naming itself in its
    /// sim endpoint. Requestor leases last a minute here: a client holding
    /// a node across a failover keeps it.
    fn new(sim: SimServer, n: usize) -> Fleet {
        Fleet::on_driver(sim, n, &plugin("sim"), "min-ready = 2", sim_provider)
    }

    /// As [`Fleet::new`], with three providers ([`SHARDS`]), each on a sim
    /// cloud of its own (as providers are distinct accounts), each offering
    /// `small` and holding at most 4 instances.
    fn sharded(sims: [SimServer; 3], n: usize) -> Fleet {
        let root = tempfile::tempdir().unwrap();
        let (url, store) = database(root.path(), None);
        let driver = plugin("sim");
        // Every provider on the same file, in the plugins directory the
        // config names for the first.
        let (_, file) = plugins_dir_and_name(&driver);
        let [sim, others @ ..] = sims;
        let others = Vec::from(others);
        let endpoints: Vec<(String, String)> = std::iter::once(&sim)
            .chain(&others)
            .map(|s| (s.addr().to_string(), s.url()))
            .collect();
        let keys = |_: &SimServer, i: usize| {
            let mut text = String::new();
            for (k, (name, (addr, url))) in SHARDS.iter().zip(&endpoints).enumerate() {
                if k > 0 {
                    text.push_str(&format!("[providers.{name}]\ndriver = {file:?}\n"));
                }
                text.push_str(&format!(
                    "allow-hosts = [\"{addr}\"]\nconfig = {{ endpoint = \"{url}/c/b{i}\" }}\n\
                     [providers.{name}.limits]\nmax-instances = 4\n"
                ));
            }
            text
        };
        let mut offers = String::new();
        for name in &SHARDS[1..] {
            offers.push_str(&format!(
                "[labels.small.providers.{name}]\ninstance-type = \"small\"\nimage = \"img\"\n\
                 vcpus = 1\nram = \"1GiB\"\nprice = 0.1\n"
            ));
        }
        let extra = format!("{offers}\n{store}");
        let mut fleet = Fleet::build(sim, n, root, url, &extra, &driver, "min-ready = 2", keys);
        fleet.others = others;
        fleet
    }

    /// As [`Fleet::new`], on a database of `cluster` of the test's own.
    fn on(cluster: &PgCluster, sim: SimServer, n: usize) -> Fleet {
        let root = tempfile::tempdir().unwrap();
        let url = cluster.url();
        let store = store_table(cluster, &url, root.path(), None);
        Fleet::build(
            sim,
            n,
            root,
            url,
            &store,
            &plugin("sim"),
            "min-ready = 2",
            sim_provider,
        )
    }

    /// As [`Fleet::new`], with provider `sim` on `driver`, its keys for
    /// process `i` given by `provider`, and `small` as the keys of
    /// `[labels.small]`.
    fn on_driver(
        sim: SimServer,
        n: usize,
        driver: &Path,
        small: &str,
        provider: impl Fn(&SimServer, usize) -> String,
    ) -> Fleet {
        let root = tempfile::tempdir().unwrap();
        let (url, store) = database(root.path(), None);
        Fleet::build(sim, n, root, url, &store, driver, small, provider)
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        sim: SimServer,
        n: usize,
        root: tempfile::TempDir,
        url: String,
        store: &str,
        driver: &Path,
        small: &str,
        provider: impl Fn(&SimServer, usize) -> String,
    ) -> Fleet {
        let mut configs = Vec::new();
        for i in 0..n {
            let dir = root.path().join(format!("b{i}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::copy(root.path().join("pgpass"), dir.join("pgpass")).unwrap();
            let path = serve_config_for(&dir, driver, &provider(&sim, i), small, store);
            set_lease_ttl(&path, "60s");
            configs.push(path);
        }
        Fleet {
            sim,
            others: Vec::new(),
            url,
            procs: (0..n).map(|_| None).collect(),
            root,
            configs,
        }
    }

    fn dir(&self, i: usize) -> PathBuf {
        self.root.path().join(format!("b{i}"))
    }

    async fn start(&mut self, i: usize) {
        let cfg = self.configs[i].display().to_string();
        let berth = Berth::start(&["--config", &cfg], &self.dir(i)).await;
        self.procs[i] = Some(berth);
    }

    fn get(&self, i: usize) -> &Berth {
        self.procs[i].as_ref().expect("running")
    }

    /// Which process the lease row names, and its epoch.
    fn lease(&self) -> (Option<usize>, i64) {
        let row = psql(&self.url, "SELECT address || ' ' || epoch FROM pool_lease").unwrap();
        let (address, epoch) = row.rsplit_once(' ').expect("a lease row");
        let holder = self
            .procs
            .iter()
            .position(|p| p.as_ref().is_some_and(|b| b.base == address));
        (holder, epoch.parse().unwrap())
    }

    /// Which process holds each of [`SHARDS`] by the lease table, and the
    /// lease's epoch (`None` for one held by no running process, or
    /// expired).
    fn shard_holders(&self) -> Vec<(Option<usize>, i64)> {
        // One psql for all of them (-A: `|` between the columns).
        let rows = psql(
            &self.url,
            "SELECT provider, CASE WHEN expires > clock_timestamp() THEN address ELSE '' END, \
             epoch FROM provider_lease",
        )
        .unwrap_or_default();
        let by_name: BTreeMap<&str, (&str, i64)> = (rows.lines())
            .filter_map(|row| {
                let mut cols = row.split('|');
                let (name, address, epoch) = (cols.next()?, cols.next()?, cols.next()?);
                Some((name, (address, epoch.parse().unwrap_or(0))))
            })
            .collect();
        SHARDS
            .iter()
            .map(|name| {
                let Some(&(address, epoch)) = by_name.get(name) else {
                    return (None, 0);
                };
                let holder = self
                    .procs
                    .iter()
                    .position(|p| p.as_ref().is_some_and(|b| b.base == address));
                (holder, epoch)
            })
            .collect()
    }

    /// Three processes started on a [`Fleet::sharded`], once each holds
    /// one provider: which process holds the pool, and each provider's
    /// holder and epoch.
    async fn spread_out() -> (Fleet, usize, Vec<(Option<usize>, i64)>) {
        let mut fleet = Fleet::sharded(three_clouds().await, 3);
        for i in 0..3 {
            fleet.start(i).await;
        }
        let pool = fleet.until_held(30, "a holder of the pool").await;
        let holders = until(30, "each process holds one provider", || async {
            let all = fleet.shard_holders();
            let mut held: Vec<usize> = all.iter().filter_map(|h| h.0).collect();
            held.sort();
            held.dedup();
            (held.len() == 3).then_some(all)
        })
        .await;
        (fleet, pool, holders)
    }

    /// Each provider's cloud, by name.
    fn clouds(&self) -> Vec<(&str, &berth::sim::SimCloud)> {
        let all = std::iter::once(&self.sim).chain(&self.others);
        SHARDS.iter().copied().zip(all.map(|s| &s.cloud)).collect()
    }

    /// Every call on provider `name`'s cloud, with the process that sent
    /// it.
    fn calls_on(&self, name: &str) -> Vec<(usize, berth::sim::Call)> {
        let (_, cloud) = *self
            .clouds()
            .iter()
            .find(|(n, _)| *n == name)
            .expect("a provider");
        (cloud.calls().into_iter())
            .filter_map(|c| {
                let i = c.caller.as_deref()?.strip_prefix('b')?.parse().ok()?;
                Some((i, c))
            })
            .collect()
    }

    /// The cloud calls process `i` sent, to any of the clouds.
    fn calls_of(&self, i: usize) -> Vec<berth::sim::Call> {
        let me = format!("b{i}");
        (self.clouds().into_iter())
            .flat_map(|(_, cloud)| cloud.calls())
            .filter(|c| c.caller.as_deref() == Some(me.as_str()))
            .collect()
    }

    /// The cloud calls of process `i` that came in and are not yet answered,
    /// by the clouds' own count.
    fn in_flight_of(&self, i: usize) -> usize {
        let me = format!("b{i}");
        (self.clouds().iter())
            .map(|(_, cloud)| cloud.in_flight(Some(&me)))
            .sum()
    }

    /// Waits until no process has a driver call in flight (by its own
    /// `berth_driver_calls_in_flight`, which counts a call from the commit
    /// that decided it) and no cloud is answering one: every call sent
    /// before now has been recorded, and none is on its way.
    async fn until_no_call_in_flight(&self, what: &str) {
        until(20, what, || async {
            for (i, b) in self.procs.iter().enumerate() {
                let Some(b) = b else { continue };
                let (s, text) = b.try_call("GET", "/metrics", Some(OPS), None).await.ok()?;
                if s != 200 {
                    return None;
                }
                let counts: Vec<f64> = (text.as_str()?.lines())
                    .filter(|l| l.starts_with("berth_driver_calls_in_flight{"))
                    .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
                    .collect();
                // Each provider's count is there from the start.
                assert!(!counts.is_empty(), "b{i} counts no call in flight: {text}");
                if counts.iter().any(|&n| n != 0.0) || self.in_flight_of(i) != 0 {
                    return None;
                }
            }
            Some(())
        })
        .await
    }

    /// SIGSTOPs process `i` just after one of its calls has reached a
    /// cloud, and returns when (ms since the epoch). So the pause does not
    /// fall between a request's check at the drivers' gate and its bytes on
    /// the wire: a request whose sending had begun before the pause still
    /// arrives after it, as no process can take back bytes it has begun to
    /// write (docs/high-availability.md).
    async fn pause_between_calls(&self, i: usize) -> u64 {
        let before = self.calls_of(i).len();
        let end = Instant::now() + Duration::from_secs(30);
        while self.calls_of(i).len() == before {
            assert!(Instant::now() < end, "b{i} made no call in 30 s");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        self.get(i).signal(libc::SIGSTOP);
        now_ms()
    }

    /// Waits until the process holding the pool is ready; returns it.
    async fn until_held(&self, secs: u64, what: &str) -> usize {
        until(secs, what, || async {
            for (i, p) in self.procs.iter().enumerate() {
                let Some(b) = p else { continue };
                if matches!(readyz(b).await, Some((200, _))) {
                    return Some(i);
                }
            }
            None
        })
        .await
    }

    /// Settles, then checks that every instance the cloud has live is one
    /// of the pool's nodes and the other way round, and that no node id was
    /// ever given two instances.
    async fn assert_no_leak_and_no_double_create(&self, at: usize) {
        let berth = self.get(at);
        until(
            60,
            "the pool's nodes and the cloud's instances agree",
            || async {
                let (s, nodes) = berth
                    .try_call("GET", "/v1/nodes", Some(OPS), None)
                    .await
                    .ok()?;
                if s != 200 {
                    return None;
                }
                let mut known: Vec<(String, String)> = nodes
                    .as_array()?
                    .iter()
                    .filter(|n| !matches!(n["state"].as_str(), Some("gone" | "failed")))
                    .filter_map(|n| {
                        let instance = n["instance"].as_str()?.to_owned();
                        Some((n["provider"].as_str()?.to_owned(), instance))
                    })
                    .collect();
                known.sort();
                let mut cloud: Vec<(String, String)> = (self.clouds().into_iter())
                    .flat_map(|(name, c)| live(c).into_iter().map(|i| (name.to_owned(), i.id)))
                    .collect();
                cloud.sort();
                (known == cloud).then_some(())
            },
        )
        .await;
        let mut per_node: BTreeMap<String, Vec<(&str, String)>> = BTreeMap::new();
        for (name, cloud) in self.clouds() {
            for i in cloud.instances() {
                if let Some(node) = i.tags.get("berth-node") {
                    per_node.entry(node.clone()).or_default().push((name, i.id));
                }
            }
        }
        let twice: Vec<_> = per_node.iter().filter(|(_, v)| v.len() > 1).collect();
        assert!(
            twice.is_empty(),
            "node ids created more than once: {twice:?}"
        );
    }
}

impl Fleet {
    /// After a takeover by b1: a third request, sent through b0, is served
    /// with a node neither earlier request (`first`, `second`) was given;
    /// the pool and the cloud agree; both processes stop cleanly.
    async fn serves_a_third_and_ends_whole(&mut self, first: &str, second: &str) {
        let third = self.get(0).request(CI, &[("small", 1)]).await;
        let third = self.get(0).fulfilled(CI, &third.id).await;
        let mut handed = vec![first, second, third.nodes[0].id.as_str()];
        handed.sort();
        handed.dedup();
        assert_eq!(handed.len(), 3, "a node handed out twice");
        self.assert_no_leak_and_no_double_create(1).await;
        for p in self.procs.iter_mut() {
            p.take().unwrap().terminate().await.assert_success();
        }
    }
}

/// The sim provider's keys for process `i`, which names itself in its
/// endpoint (`/c/bN`) so that the cloud's call record tells the processes
/// apart.
fn sim_provider(sim: &SimServer, i: usize) -> String {
    format!(
        "allow-hosts = [\"{}\"]\nconfig = {{ endpoint = \"{}/c/b{i}\" }}",
        sim.addr(),
        sim.url()
    )
}

/// A sim cloud for each of [`SHARDS`].
async fn three_clouds() -> [SimServer; 3] {
    [
        SimServer::start().await,
        SimServer::start().await,
        SimServer::start().await,
    ]
}

/// When a process's log (`log`) first says it holds `provider` at or after
/// `since` (ms since the epoch), and under which epoch: from its lines
/// `this process holds these providers now … providers=NAME@EPOCH, …`.
fn taken_since(log: &str, provider: &str, since: u64) -> Option<(u64, i64)> {
    log.lines()
        .filter(|l| l.contains("this process holds these providers now"))
        .find_map(|l| {
            let at = berth::duration::parse_rfc3339(l.split_whitespace().next()?)?;
            let (_, taken) = l.split_once("providers=")?;
            let epoch = taken.split(", ").find_map(|t| {
                let (name, epoch) = t.trim().rsplit_once('@')?;
                (name == provider).then(|| epoch.parse().ok())?
            })?;
            (at >= since).then_some((at, epoch))
        })
}

/// Milliseconds since the Unix epoch, as the sim stamps its calls.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A holder stopped with SIGSTOP past its lease: requests sent meanwhile to
/// the process standing by are accepted (the holder does not answer them:
/// into the store's inbox) and all served once it has taken the pool over; when the stopped one
/// resumes, it sends nothing to the cloud (by the sim's own call record),
/// writes nothing (its commits are fenced), and stands by, relaying to the
/// new holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holder_sends_and_writes_nothing_once_another_took_the_pool_over() {
    let mut fleet = Fleet::new(SimServer::start().await, 2);
    fleet.start(0).await;
    fleet.get(0).until_ready(30, "b0 holds the pool").await;
    fleet.start(1).await;
    assert_eq!(fleet.lease(), (Some(0), 1));
    // Served through the one standing by.
    let first = fleet.get(1).request(CI, &[("small", 1)]).await;
    let first = fleet.get(1).fulfilled(CI, &first.id).await;
    assert!(!fleet.calls_of(0).is_empty());
    assert!(fleet.calls_of(1).is_empty(), "b1 stands by");

    fleet.pause_between_calls(0).await;
    let paused = Instant::now();
    // New requests are b1's to take while b0 is stopped: offered to b0,
    // which does not answer, and accepted into the store's inbox.
    let asked: Vec<_> = (0..4)
        .map(|_| {
            let b1 = fleet.get(1).base.clone();
            tokio::spawn(async move {
                let body = json!({"labels": {"small": 1}});
                let answer = http(&b1, "POST", "/v1/requests", Some(CI), Some(body)).await;
                (answer, now_ms())
            })
        })
        .collect();
    // A call b1 relays to the paused b0 is not left waiting on it once b1
    // has taken the pool over.
    let b1 = fleet.get(1).base.clone();
    let relayed =
        tokio::spawn(async move { http(&b1, "GET", "/v1/requests", Some(CI), None).await });
    let mut accepted = Vec::new();
    for a in asked {
        let (answer, at) = a.await.unwrap();
        let (status, body) = answer.unwrap();
        let body: Value = serde_json::from_str(&body).unwrap_or_default();
        assert_eq!(status, 201, "{body}");
        accepted.push((body["id"].as_str().unwrap().to_owned(), at));
    }
    let held = fleet.until_held(30, "b1 takes the pool over").await;
    assert_eq!(held, 1);
    let took_over = fleet
        .get(1)
        .log_text()
        .lines()
        .find(|l| l.contains("this process took the pool over"))
        .and_then(|l| berth::duration::parse_rfc3339(l.split_whitespace().next()?))
        .expect("b1 says when it took the pool over");
    let answered = accepted.iter().map(|(_, at)| *at).max().unwrap();
    println!(
        "4 requests accepted by b1 while b0 was stopped, the last {} ms before b1 took the pool over",
        took_over as i64 - answered as i64
    );
    let relayed = tokio::time::timeout(Duration::from_secs(3), relayed)
        .await
        .expect("the call relayed to the paused holder still waits after the takeover")
        .unwrap()
        .unwrap();
    assert_eq!(relayed.0, 503, "{relayed:?}");
    assert!(relayed.1.contains("changed hands"), "{relayed:?}");
    println!(
        "b1 took the pool over {:?} after b0 was paused",
        paused.elapsed()
    );
    assert_eq!(fleet.lease(), (Some(1), 2));
    // b1 acts: it lists, serves every request it accepted while b0 was
    // stopped, each with a node of its own, and a new one.
    let mut handed = vec![first.nodes[0].id.clone()];
    for (id, _) in &accepted {
        let r = fleet.get(1).fulfilled(CI, id).await;
        handed.push(r.nodes[0].id.clone());
    }
    let second = fleet.get(1).request(CI, &[("small", 1)]).await;
    let second = fleet.get(1).fulfilled(CI, &second.id).await;
    handed.push(second.nodes[0].id.clone());
    let all = handed.len();
    handed.sort();
    handed.dedup();
    assert_eq!(handed.len(), all, "a node handed out twice");
    let waiting = psql(&fleet.url, "SELECT count(*) FROM request_inbox").unwrap();
    assert_eq!(waiting.trim(), "0", "requests left in the inbox");
    // b1 counted what went through the inbox: it put the four there while
    // standing by, and took them in once it held the pool; all but any that
    // b0 had committed from its offer just before it stopped (answered too
    // late, so inboxed too: b1 finds those in the pool it took over, and
    // only removes their inbox entries).
    let m = fleet.get(1).metrics(Some(OPS)).await;
    assert_eq!(metric(&m, "berth_requests_inboxed_total"), Some(4.0), "{m}");
    let taken_in = metric(&m, "berth_requests_taken_in_total").unwrap_or(0.0);
    assert!((1.0..=4.0).contains(&taken_in), "{m}");
    // b1's first lists were sent to b0, which held the provider and did not
    // answer: each went to the provider's next holder once it moved, none
    // failed (a failed list waits out a backoff: `boot-poll-interval`, 5 s
    // by default, with /readyz 503 meanwhile).
    let failed: Vec<&str> = (m.lines())
        .filter(|l| l.starts_with("berth_driver_calls_total{") && l.contains("call=\"list\""))
        .filter(|l| !l.contains("outcome=\"ok\""))
        .collect();
    assert!(failed.is_empty(), "lists that failed on b1: {failed:?}");
    until(30, "b1 calls the cloud", || async {
        (!fleet.calls_of(1).is_empty()).then_some(())
    })
    .await;

    // What b0 sent before its pause came in seconds ago: once the clouds
    // have answered it, whatever b0 sends is sent after it resumed.
    until(
        10,
        "the clouds answered what b0 sent before its pause",
        || async { (fleet.in_flight_of(0) == 0).then_some(()) },
    )
    .await;
    let sent_before = fleet.calls_of(0).len();
    fleet.get(0).signal(libc::SIGCONT);
    let resumed = now_ms();
    // b0's timers are all overdue (lists every second, its lease renewal):
    // whatever it tries is fenced or refused at the gate. A change sent to
    // it is refused as standing by, or relayed to b1 once it knows.
    let (s, answer) = fleet
        .get(0)
        .call(
            "POST",
            "/v1/requests",
            Some(CI),
            Some(json!({"labels": {"small": 1}})),
        )
        .await;
    assert!(
        s == 201 || (s == 503 && answer["error"]["code"] == "standby"),
        "{s} {answer}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let late: Vec<_> = fleet.calls_of(0)[sent_before..]
        .iter()
        .map(|c| {
            format!(
                "{} {} at {} (resumed at {resumed})",
                c.method, c.path, c.at_ms
            )
        })
        .collect();
    assert!(
        late.is_empty(),
        "b0 sent to the cloud after it was paused: {late:?}\n{}",
        fleet.get(0).log_text()
    );
    let (s, e) = fleet.get(0).call("GET", "/readyz", None, None).await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (503, Some("standby")),
        "{e}"
    );
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains(&fleet.get(1).base),
        "{e}"
    );
    let log = fleet.get(0).log_text();
    assert!(
        log.contains("another berth process took the pool over"),
        "{log}"
    );
    // Still b1's, under the same epoch: b0 took nothing back.
    assert_eq!(fleet.lease(), (Some(1), 2));
    // b1 still serves, through b0 too.
    fleet
        .serves_a_third_and_ends_whole(&first.nodes[0].id, &second.nodes[0].id)
        .await;
}

/// What one churn client saw of one node it was handed.
#[derive(Clone, Debug)]
struct Held {
    node: String,
    got: Instant,
    /// When the client sent its release (the node may be handed on only
    /// after that).
    released: Option<Instant>,
}

/// Requests, holds and releases nodes until told to stop, spreading its
/// calls over every running process (`bases`), and records each 201's id
/// and each node it held.
async fn churn(
    client: usize,
    bases: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    accepted: Arc<Mutex<Vec<String>>>,
    held: Arc<Mutex<Vec<Held>>>,
) {
    let mut turn = client;
    let pick = |turn: &mut usize| {
        let b = bases.lock().unwrap();
        *turn += 1;
        b[*turn % b.len()].clone()
    };
    while !stop.load(Ordering::SeqCst) {
        let body = json!({"labels": {"small": 1}});
        let id = match http(
            &pick(&mut turn),
            "POST",
            "/v1/requests",
            Some(CI),
            Some(body),
        )
        .await
        {
            Ok((201, text)) => {
                let v: Value = serde_json::from_str(&text).unwrap();
                v["id"].as_str().unwrap().to_owned()
            }
            _ => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        accepted.lock().unwrap().push(id.clone());
        // Waits for it through any process; given up (still pending) after
        // a minute.
        let end = Instant::now() + Duration::from_secs(60);
        let mut node = None;
        while Instant::now() < end {
            let path = format!("/v1/requests/{id}?wait=2s");
            if let Ok((200, text)) = http(&pick(&mut turn), "GET", &path, Some(CI), None).await {
                let v: Value = serde_json::from_str(&text).unwrap();
                match v["state"].as_str() {
                    Some("fulfilled") => {
                        node = v["nodes"][0]["id"].as_str().map(str::to_owned);
                        break;
                    }
                    Some("pending") => continue,
                    _ => break,
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let Some(node) = node else { continue };
        let got = Instant::now();
        tokio::time::sleep(Duration::from_millis(50 + 37 * (client as u64 % 4))).await;
        let mut record = Held {
            node: node.clone(),
            got,
            released: None,
        };
        let end = Instant::now() + Duration::from_secs(60);
        while Instant::now() < end {
            let path = format!("/v1/nodes/{node}/release");
            let sent = Instant::now();
            match http(&pick(&mut turn), "POST", &path, Some(CI), None).await {
                Ok((200, _)) => {
                    record.released = Some(sent);
                    break;
                }
                // Released by an attempt whose answer was lost.
                Ok((409 | 404, _)) if record.released.is_none() => {
                    record.released = Some(sent);
                    break;
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        held.lock().unwrap().push(record);
    }
}

/// Churn clients running against a fleet until stopped.
struct Churn {
    bases: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    accepted: Arc<Mutex<Vec<String>>>,
    held: Arc<Mutex<Vec<Held>>>,
    clients: Vec<tokio::task::JoinHandle<()>>,
}

impl Churn {
    /// Four clients over every process of `fleet`.
    fn start(fleet: &Fleet) -> Churn {
        let bases = Arc::new(Mutex::new(
            fleet
                .procs
                .iter()
                .map(|p| p.as_ref().unwrap().base.clone())
                .collect::<Vec<_>>(),
        ));
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(Mutex::new(Vec::new()));
        let held = Arc::new(Mutex::new(Vec::new()));
        let clients = (0..4)
            .map(|c| {
                tokio::spawn(churn(
                    c,
                    bases.clone(),
                    stop.clone(),
                    accepted.clone(),
                    held.clone(),
                ))
            })
            .collect();
        Churn {
            bases,
            stop,
            accepted,
            held,
            clients,
        }
    }

    /// Process `i` was restarted at a new address.
    fn moved(&self, i: usize, base: &str) {
        self.bases.lock().unwrap()[i] = base.to_owned();
    }

    /// How many nodes the clients have held and released so far.
    fn served(&self) -> usize {
        self.held.lock().unwrap().len()
    }

    /// Stops the clients; the ids of every 201 and the nodes they held.
    async fn stop(self) -> (Vec<String>, Vec<Held>) {
        self.stop.store(true, Ordering::SeqCst);
        for c in self.clients {
            tokio::time::timeout(Duration::from_secs(180), c)
                .await
                .expect("a churn client ended")
                .unwrap();
        }
        let accepted = self.accepted.lock().unwrap().clone();
        let held = self.held.lock().unwrap().clone();
        (accepted, held)
    }
}

impl Fleet {
    /// After churn: every 201 names a request that is still there
    /// (fulfilled, failed with a reason, cancelled, or pending); no node was
    /// handed to a client while another still held it; and the cloud
    /// agrees with the pool. Returns the requests' states, counted.
    async fn assert_churn_lost_and_doubled_nothing(
        &self,
        at: usize,
        accepted: &[String],
        held: &[Held],
    ) -> BTreeMap<String, usize> {
        let mut states: BTreeMap<String, usize> = BTreeMap::new();
        for id in accepted {
            let (s, r) = self
                .get(at)
                .call("GET", &format!("/v1/requests/{id}"), Some(CI), None)
                .await;
            assert_eq!(s, 200, "request {id} is lost: {r}");
            let state = r["state"].as_str().unwrap_or_default().to_owned();
            if state == "failed" {
                assert!(r["reason"].is_string(), "failed without a reason: {r}");
                println!("request {id} failed: {}", r["reason"]);
            }
            *states.entry(state).or_default() += 1;
        }
        let mut by_node: BTreeMap<&str, Vec<&Held>> = BTreeMap::new();
        for h in held {
            by_node.entry(&h.node).or_default().push(h);
        }
        for (node, mut spans) in by_node {
            spans.sort_by_key(|h| h.got);
            for pair in spans.windows(2) {
                let released = pair[0].released.expect("every held node was released");
                assert!(
                    pair[1].got > released,
                    "node {node} handed out again while its holder still held it: {pair:?}"
                );
            }
        }
        self.assert_no_leak_and_no_double_create(at).await;
        states
    }
}

/// Three processes and three providers: the providers' leases spread so
/// that each process holds one, and by the cloud's own record every call
/// on a provider is sent by its holder while the holder of the pool
/// decides them all, so every process launches instances. Every process
/// shows the same holders in `/v1/providers`, and `/readyz` says what each
/// holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_providers_spread_over_the_processes_and_each_sends_only_its_own() {
    let (mut fleet, pool, spread) = Fleet::spread_out().await;
    let holders: Vec<usize> = spread.iter().map(|h| h.0.unwrap()).collect();
    let settled = now_ms();
    // Enough nodes to fill every provider (4 each, with the 2 kept ready).
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(fleet.get(pool).request(CI, &[("small", 2)]).await.id);
    }
    for id in &ids {
        fleet.get((pool + 1) % 3).fulfilled(CI, id).await;
    }
    let now: Vec<Option<usize>> = fleet.shard_holders().iter().map(|h| h.0).collect();
    assert_eq!(now, holders.iter().map(|&h| Some(h)).collect::<Vec<_>>());
    for (k, name) in SHARDS.iter().enumerate() {
        let since: Vec<_> = (fleet.calls_on(name).into_iter())
            .filter(|(_, c)| c.at_ms >= settled)
            .collect();
        let others: Vec<_> = since.iter().filter(|(i, _)| *i != holders[k]).collect();
        assert!(
            others.is_empty(),
            "{name} is held by b{}, and other processes called it: {others:?}",
            holders[k]
        );
        // Creates alone, and the items of batches.
        let creates: usize = (since.iter())
            .filter(|(_, c)| c.method == "POST")
            .map(|(_, c)| match c.path.ends_with("/v1/batch/create") {
                true => c.items.len(),
                false => usize::from(c.path.ends_with("/v1/instances")),
            })
            .sum();
        println!(
            "{name}: held by b{}, {} calls, {creates} creates",
            holders[k],
            since.len()
        );
        assert!(creates > 0, "b{} created nothing on {name}", holders[k]);
    }
    for b in 0..3 {
        let (s, listed) = fleet
            .get(b)
            .call("GET", "/v1/providers", Some(OPS), None)
            .await;
        assert_eq!(s, 200, "{listed}");
        for (k, p) in listed.as_array().unwrap().iter().enumerate() {
            let holder = p["holder"].as_str().unwrap_or_default();
            assert!(
                holder.starts_with(&format!("{} ", fleet.get(holders[k]).base)),
                "b{b} says {} is held by {holder}",
                SHARDS[k]
            );
            assert!(p["lease_expires"].is_string(), "{p}");
        }
        let (status, said) = readyz(fleet.get(b)).await.expect("readyz answers");
        let held = SHARDS[holders.iter().position(|&h| h == b).unwrap()];
        let text = said.to_string();
        assert!(
            text.contains(&format!("provider(s) {held} ")),
            "b{b}: {text}"
        );
        assert_eq!(status == 200, b == pool, "b{b}: {text}");
    }
    fleet.assert_no_leak_and_no_double_create(pool).await;
    for p in fleet.procs.iter_mut() {
        p.take().unwrap().terminate().await.assert_success();
    }
}

/// A provider's holder (not the pool's) stopped with SIGSTOP past its
/// lease: another process takes the provider over with a new epoch and the
/// pool's calls on it go on there; when the stopped one resumes, it sends
/// nothing to any cloud (by the clouds' own records) until it has taken a
/// provider again under a new lease, and then only on that provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_provider_holder_sends_nothing_once_its_provider_moved() {
    let (mut fleet, pool, holders) = Fleet::spread_out().await;
    let k = (0..3).find(|&k| holders[k].0 != Some(pool)).unwrap();
    let (victim, epoch) = (holders[k].0.unwrap(), holders[k].1);
    let name = SHARDS[k];

    let stopped = fleet.pause_between_calls(victim).await;
    let (next, new_epoch) = until(30, "another process takes the provider over", || async {
        let (h, e) = fleet.shard_holders()[k];
        h.filter(|&h| h != victim).map(|h| (h, e))
    })
    .await;
    assert!(new_epoch > epoch);
    // The pool's calls on the provider go to its new holder: a request that
    // needs new nodes everywhere is served.
    let r = fleet.get(pool).request(CI, &[("small", 6)]).await;
    fleet.get(pool).fulfilled(CI, &r.id).await;
    until(30, "the new holder calls the provider's cloud", || async {
        (fleet.calls_on(name).iter())
            .any(|(i, c)| *i == next && c.at_ms >= stopped)
            .then_some(())
    })
    .await;

    fleet.get(victim).signal(libc::SIGCONT);
    let resumed = now_ms();
    // It takes a provider again only once the others give one up to it,
    // which may be within a beat of its return, and then only under a new
    // lease: what it sends before it took the provider again (by its own
    // log), or to a provider it does not hold, is a stale process acting.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let now: Vec<(Option<usize>, i64)> = fleet.shard_holders();
    let log = fleet.get(victim).log_text();
    let mut regained = Vec::new();
    for (j, provider) in SHARDS.iter().enumerate() {
        let taken = taken_since(&log, provider, resumed);
        for (i, c) in fleet.calls_on(provider) {
            if i != victim || c.at_ms < resumed {
                continue;
            }
            let after = c.at_ms - resumed;
            let (at, taken_epoch) = taken.unwrap_or_else(|| {
                panic!("b{victim} called {provider} {after} ms after it resumed without taking it again: {c:?}\n{log}")
            });
            assert!(
                c.at_ms >= at && now[j].0 == Some(victim),
                "b{victim} called {provider} {after} ms after it resumed, {} ms after it took it again \
                 (it holds it now: {}): {c:?}",
                c.at_ms as i64 - at as i64,
                now[j].0 == Some(victim)
            );
            if j == k {
                assert!(
                    taken_epoch > new_epoch,
                    "{provider} again under epoch {taken_epoch}"
                );
            }
            regained.push((*provider, after));
        }
    }
    regained.dedup_by_key(|r| r.0);
    println!(
        "{name}: b{victim} (epoch {epoch}) paused -> b{next} (epoch {new_epoch}); after it \
         resumed, b{victim} called only provider(s) it took again, first after (provider, ms): \
         {regained:?}"
    );
    fleet.assert_no_leak_and_no_double_create(pool).await;
    for p in fleet.procs.iter_mut() {
        p.take().unwrap().terminate().await.assert_success();
    }
}

/// Three processes and three providers, churn clients spreading their calls
/// over all three, and the holder of each provider SIGKILLed in turn (each
/// time restarted; it may hold the pool too): another process takes the
/// provider over, no request is lost, no node is handed to two clients at
/// once, no node id is created twice, and nothing leaks. The time from each
/// kill to the provider's first cloud call by its new holder is printed
/// (`BERTH_HA_KILLS` sets how many kills; docs/BENCHMARKS.md has the
/// figures).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_holder_again_and_again_loses_leaks_and_doubles_nothing() {
    let kills: usize = std::env::var("BERTH_HA_KILLS")
        .ok()
        .and_then(|k| k.parse().ok())
        .unwrap_or(10);
    let mut fleet = Fleet::sharded(three_clouds().await, 3);
    for i in 0..3 {
        fleet.start(i).await;
        if i == 0 {
            fleet.get(0).until_ready(30, "b0 holds the pool").await;
        }
    }
    let churning = Churn::start(&fleet);

    let mut failovers = Vec::new();
    let mut pool_kills = 0;
    for kill in 0..kills {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let k = kill % SHARDS.len();
        let name = SHARDS[k];
        let (holder, epoch) = until(30, "every provider held", || async {
            let all = fleet.shard_holders();
            all.iter()
                .all(|h| h.0.is_some())
                .then(|| (all[k].0.unwrap(), all[k].1))
        })
        .await;
        let pool = fleet.until_held(30, "a holder of the pool").await;
        let (_, pool_epoch) = fleet.lease();
        let victim = fleet.procs[holder].take().unwrap();
        victim.signal(libc::SIGKILL);
        let killed_ms = now_ms();
        let killed = Instant::now();
        victim.exit_within(Duration::from_secs(30)).await;
        let (next, new_epoch) = until(30, "another process takes the provider over", || async {
            let (h, e) = fleet.shard_holders()[k];
            h.map(|h| (h, e))
        })
        .await;
        assert_ne!(next, holder);
        assert!(new_epoch > epoch, "{name}: epoch {epoch} -> {new_epoch}");
        let next_pool = fleet.until_held(30, "a process holds the pool").await;
        if pool == holder {
            pool_kills += 1;
            assert_ne!(next_pool, holder);
            assert_eq!(fleet.lease().1, pool_epoch + 1);
        }
        let first_call = until(30, "the provider's new holder calls the cloud", || async {
            (fleet.calls_on(name).iter())
                .find(|(i, c)| *i != holder && c.at_ms >= killed_ms)
                .map(|(_, c)| c.at_ms)
        })
        .await;
        failovers.push(Duration::from_millis(first_call - killed_ms));
        println!(
            "kill {}: {name}: b{holder} (epoch {epoch}{}) -> b{next}: first cloud call {} ms after the kill, taken over after {:?}",
            kill + 1,
            if pool == holder {
                ", the pool's holder too"
            } else {
                ""
            },
            first_call - killed_ms,
            killed.elapsed()
        );
        fleet.start(holder).await;
        churning.moved(holder, &fleet.get(holder).base);
    }
    let (accepted, held) = churning.stop().await;
    let at = fleet.until_held(30, "a holder at the end").await;
    let states = fleet
        .assert_churn_lost_and_doubled_nothing(at, &accepted, &held)
        .await;
    failovers.sort();
    let pick = |q: f64| failovers[((failovers.len() - 1) as f64 * q).round() as usize];
    println!(
        "{} requests accepted ({states:?}), {} nodes held and released, {kills} kills \
         ({pool_kills} of the pool's holder too); kill to the provider's first cloud call by \
         its new holder: p50 {:?}, p99 {:?}, max {:?} (lease TTL {TTL:?})",
        accepted.len(),
        held.len(),
        pick(0.5),
        pick(0.99),
        failovers.last().unwrap()
    );
    assert!(
        held.len() >= kills,
        "too little churn to mean anything: {}",
        held.len()
    );
    for p in fleet.procs.iter_mut() {
        p.take().unwrap().terminate().await.assert_success();
    }
}

/// PostgreSQL crash-stopped (`pg_ctl stop -m immediate`) under churn over
/// three processes: while it is down, no process sends anything to the
/// cloud (by the sim's own record); once it is back, one process holds the
/// pool again and the churn's outcome is as whole as after the kills.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_under_churn_stops_every_process_calling_the_cloud() {
    let cluster = PgCluster::start(&crate::support::workspace());
    let mut fleet = Fleet::on(&cluster, SimServer::start().await, 3);
    for i in 0..3 {
        fleet.start(i).await;
        if i == 0 {
            fleet.get(0).until_ready(30, "b0 holds the pool").await;
        }
    }
    let churning = Churn::start(&fleet);
    tokio::time::sleep(Duration::from_secs(2)).await;

    cluster.stop_immediate();
    // Calls committed before the outage are still sent and answered; once
    // no process holds the pool (none can commit) and none of those is in
    // flight, nothing more may reach the cloud.
    until(20, "no process holds the pool", || async {
        for p in fleet.procs.iter().flatten() {
            if readyz(p).await.is_none_or(|(s, _)| s == 200) {
                return None;
            }
        }
        Some(())
    })
    .await;
    fleet
        .until_no_call_in_flight("the calls committed before the outage answered")
        .await;
    let at_outage = fleet.sim.cloud.calls().len();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let during: Vec<String> = fleet.sim.cloud.calls()[at_outage..]
        .iter()
        .map(|c| format!("{:?} {} {}", c.caller, c.method, c.path))
        .collect();
    assert!(
        during.is_empty(),
        "cloud calls while the database was down: {during:?}"
    );
    for p in fleet.procs.iter().flatten() {
        // Alive, waiting: nothing for a supervisor to restart.
        assert_eq!(p.call("GET", "/healthz", None, None).await.0, 200);
    }

    cluster.start_again();
    let at = fleet
        .until_held(60, "a holder once the database is back")
        .await;
    // The churn goes on for a while on the recovered pool.
    let served = churning.served();
    until(60, "churn served again", || async {
        (churning.served() > served + 20).then_some(())
    })
    .await;
    // Each process says what it is once the database answers: the holder
    // ready, the others standing by. Before, one that lost the pool during
    // the outage kept saying the database did not answer (40-90 s in every
    // run) while it was connected and carrying out calls.
    for (i, p) in fleet.procs.iter().flatten().enumerate() {
        let said = until(20, &format!("b{i}'s /readyz true again"), || async {
            let (status, body) = readyz(p).await?;
            let text = body.to_string();
            let true_now = status == 200 || text.contains("standby");
            true_now.then_some(text)
        })
        .await;
        assert!(!said.contains("does not answer"), "b{i}: {said}");
    }
    let (accepted, held) = churning.stop().await;
    let states = fleet
        .assert_churn_lost_and_doubled_nothing(at, &accepted, &held)
        .await;
    println!(
        "{} requests accepted ({states:?}), {} nodes held and released across the outage",
        accepted.len(),
        held.len()
    );
    for p in fleet.procs.iter_mut() {
        p.take().unwrap().terminate().await.assert_success();
    }
}

/// The static driver keeps which host each node has in its records, and on
/// PostgreSQL those are in the shared database: once the holder is
/// SIGKILLed, the process that takes the pool over lists the same hosts,
/// keeps every node on its host (the one in use stays in use), and gives
/// out only the host that was free, never a held one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_pool_keeps_its_hosts_when_another_process_takes_it_over() {
    let mut listeners = Vec::new();
    for _ in 0..3 {
        listeners.push(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let addrs: Vec<_> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let allow: Vec<String> = addrs.iter().map(|a| format!("\"{a}\"")).collect();
    let hosts = toml::Value::try_from(crate::support::config::hosts(&addrs, 1)).unwrap();
    let provider = format!("allow-hosts = [{}]\nconfig = {hosts}", allow.join(", "));
    let mut fleet = Fleet::on_driver(
        SimServer::start().await,
        2,
        &plugin("static"),
        "min-ready = 1",
        |_, _| provider.clone(),
    );
    fleet.start(0).await;
    fleet.get(0).until_ready(60, "b0 holds the pool").await;
    fleet.start(1).await;
    // b0 holds the pool: one node in use, one ready, one host free.
    let b0 = fleet.get(0);
    let request = b0.request(CI, &[("small", 1)]).await;
    let mine = b0.fulfilled(CI, &request.id).await.nodes[0].id.clone();
    let before = until(30, "one node in use and one ready", || async {
        let h = static_nodes(b0).await?;
        let states: Vec<&str> = h.values().map(|(_, s)| s.as_str()).collect();
        (states.len() == 2 && states.contains(&"in-use") && states.contains(&"ready")).then_some(h)
    })
    .await;
    let taken: Vec<&String> = before.values().map(|(i, _)| i).collect();
    assert!(taken.iter().all(|i| i.starts_with("build-")), "{before:?}");
    assert_ne!(taken[0], taken[1]);

    // SIGKILL the holder; b1 takes the pool over and lists the same hosts.
    fleet.procs[0].take().unwrap().signal(libc::SIGKILL);
    let b1 = fleet.get(1);
    b1.until_ready(30, "b1 takes the pool over").await;
    let after = until(30, "b1 lists both held hosts", || async {
        let h = static_nodes(b1).await?;
        (h == before).then_some(h)
    })
    .await;
    assert_eq!(after[&mine].1, "in-use");

    // The ready node is handed out, and the refill gets the free host.
    let request = b1.request(CI, &[("small", 1)]).await;
    let second = b1.fulfilled(CI, &request.id).await.nodes[0].id.clone();
    assert!(before.contains_key(&second), "not the ready node: {second}");
    let full = until(30, "the free host taken by the refill", || async {
        let h = static_nodes(b1).await?;
        (h.len() == 3 && h.values().all(|(_, s)| s == "in-use" || s == "ready")).then_some(h)
    })
    .await;
    let mut instances: Vec<&String> = full.values().map(|(i, _)| i).collect();
    instances.sort();
    instances.dedup();
    assert_eq!(instances.len(), 3, "a host given to two nodes: {full:?}");
    assert_eq!(
        full[&mine], before[&mine],
        "the node in use moved: {full:?}"
    );
    let records = psql(
        &fleet.url,
        "SELECT count(*) FROM driver_records WHERE provider = 'sim'",
    )
    .unwrap();
    assert_ne!(
        records, "0",
        "the static driver's records are not in the database"
    );
    drop(listeners);
}

/// The nodes `berth` holds (not gone or failed): id to instance and state.
async fn static_nodes(berth: &Berth) -> Option<BTreeMap<String, (String, String)>> {
    let (status, nodes) = berth
        .try_call("GET", "/v1/nodes", Some(OPS), None)
        .await
        .ok()?;
    if status != 200 {
        return None;
    }
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    Some(
        nodes
            .as_array()?
            .iter()
            .filter(|n| !matches!(n["state"].as_str(), Some("gone" | "failed")))
            .map(|n| (text(&n["id"]), (text(&n["instance"]), text(&n["state"]))))
            .collect(),
    )
}

/// A TCP relay to PostgreSQL that a test can cut: while cut, it passes no
/// byte either way and keeps every connection open, as a network partition
/// does (the peers see silence, not a reset). Healing passes on what was
/// held.
struct Partition {
    addr: std::net::SocketAddr,
    cut: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Partition {
    async fn start(upstream: std::net::SocketAddr) -> Partition {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (cut, watch) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((down, _)) = listener.accept().await {
                let watch = watch.clone();
                tokio::spawn(async move {
                    // A connection made while cut waits, as its SYN would.
                    Partition::passable(&mut watch.clone()).await;
                    let Ok(up) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (dr, dw) = down.into_split();
                    let (ur, uw) = up.into_split();
                    tokio::join!(
                        Partition::pass(dr, uw, watch.clone()),
                        Partition::pass(ur, dw, watch)
                    );
                });
            }
        });
        Partition { addr, cut, task }
    }

    /// Returns once the relay is not cut.
    async fn passable(watch: &mut tokio::sync::watch::Receiver<bool>) {
        let _ = watch.wait_for(|cut| !cut).await;
    }

    async fn pass(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        mut watch: tokio::sync::watch::Receiver<bool>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            Partition::passable(&mut watch).await;
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            // Read before the cut, held until it heals.
            Partition::passable(&mut watch).await;
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }

    fn set(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The holder cut off from the database while it keeps running (its
/// timers fire, its API answers): it stops calling the cloud within 0.8 ×
/// the TTL of its last confirmed renewal, by the sim's own record; another
/// process takes the pool over; a request sent to the cut-off holder is not
/// served by it; and once the partition heals, the old holder is fenced and
/// stands by, and the pool is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cut_off_from_the_database_calls_no_cloud_once_its_lease_is_uncertain() {
    let mut fleet = Fleet::new(SimServer::start().await, 2);
    let port = fleet
        .url
        .rsplit_once('@')
        .and_then(|(_, rest)| rest.split_once('/'))
        .map(|(host, _)| host.to_owned())
        .unwrap();
    let partition = Partition::start(port.parse().unwrap()).await;
    // b0 reaches the database through the partition, b1 directly.
    let text = std::fs::read_to_string(&fleet.configs[0]).unwrap();
    let through = text.replace(&format!("@{port}/"), &format!("@{}/", partition.addr));
    assert_ne!(through, text);
    std::fs::write(&fleet.configs[0], through).unwrap();
    fleet.start(0).await;
    fleet.get(0).until_ready(30, "b0 holds the pool").await;
    fleet.start(1).await;
    let first = fleet.get(0).request(CI, &[("small", 1)]).await;
    let first = fleet.get(0).fulfilled(CI, &first.id).await;

    partition.set(true);
    let cut = now_ms();
    let cut_at = Instant::now();
    // A change sent to b0 while it is cut off: it cannot be stored, so it is
    // not served by b0.
    let b0 = fleet.get(0).base.clone();
    let during = tokio::spawn(async move {
        http(
            &b0,
            "POST",
            "/v1/requests",
            Some(CI),
            Some(json!({"labels": {"small": 1}})),
        )
        .await
    });
    // b0 still runs and answers, but says it cannot vouch for the pool: a
    // load balancer's health check takes it out.
    let said = until(
        10,
        "b0's readyz to say its store is out of reach",
        || async {
            let (s, e) = readyz(fleet.get(0)).await?;
            (s == 503 && e["error"]["code"] == "store_unavailable").then_some(e)
        },
    )
    .await;
    println!(
        "b0 said it was out of reach {:?} after the cut: {said}",
        cut_at.elapsed()
    );
    until(30, "b1 takes the pool over", || async {
        let (s, _) = readyz(fleet.get(1)).await?;
        (s == 200).then_some(())
    })
    .await;
    println!(
        "b1 took the pool over {:?} after b0 was cut off",
        cut_at.elapsed()
    );
    // b1 serves while b0 is still cut off.
    let second = fleet.get(1).request(CI, &[("small", 1)]).await;
    let second = fleet.get(1).fulfilled(CI, &second.id).await;
    // The change sent to b0 is answered while b0 is still cut off: its
    // commit is given up past the database's deadline (twice the TTL, at
    // least 5 s) rather than held until the partition heals (before: 15 s
    // with packets dropped, without end behind a frozen proxy).
    let answered = tokio::time::timeout(Duration::from_secs(15), during)
        .await
        .expect("the change sent to the cut-off holder is still waiting")
        .unwrap();
    let (status, body) = answered.unwrap();
    let body: Value = serde_json::from_str(&body).unwrap_or_default();
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("store_unavailable")),
        "{body}"
    );
    println!(
        "the change sent to b0 was answered {status} {:?} after the cut",
        cut_at.elapsed()
    );
    // Alive, and saying what it waits for.
    let (status, said) = http(&fleet.get(0).base, "GET", "/healthz", None, None)
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert!(
        said.contains("does not answer") || said.contains("out of reach"),
        "{said}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    // b0 may send until 0.8 × TTL after its last confirmed renewal, which
    // was before the cut; 100 ms more for a call sent at that moment to
    // arrive.
    let limit = cut + (TTL.as_millis() as u64) * 8 / 10 + 100;
    let late: Vec<String> = fleet
        .calls_of(0)
        .iter()
        .filter(|c| c.at_ms > limit)
        .map(|c| format!("{} {} at +{} ms", c.method, c.path, c.at_ms - cut))
        .collect();
    assert!(
        late.is_empty(),
        "b0 called the cloud while cut off past its lease: {late:?}\n{}",
        fleet.get(0).log_text()
    );

    partition.set(false);
    // b0's stalled renewal or commit reaches the database now and is fenced.
    until(30, "b0 stands by", || async {
        let (s, e) = readyz(fleet.get(0)).await?;
        (s == 503 && e["error"]["code"] == "standby").then_some(())
    })
    .await;
    assert_eq!(fleet.lease(), (Some(1), 2));
    let late: Vec<_> = fleet
        .calls_of(0)
        .into_iter()
        .filter(|c| c.at_ms > limit)
        .collect();
    assert!(
        late.is_empty(),
        "b0 called the cloud after it healed: {late:?}"
    );
    // The pool is whole, served through either process.
    fleet
        .serves_a_third_and_ends_whole(&first.nodes[0].id, &second.nodes[0].id)
        .await;
}

/// What `/readyz` of `berth` answers, if it answers within half a second (a
/// paused process does not answer at all).
async fn readyz(berth: &Berth) -> Option<(u16, Value)> {
    let asked = berth.try_call("GET", "/readyz", None, None);
    tokio::time::timeout(Duration::from_millis(500), asked)
        .await
        .ok()?
        .ok()
}

/// Processes joining a pool of eight providers that one process held:
/// each move of providers is said in one line per process and kind, however
/// many providers it moves. Before: one line per provider and process, and
/// a line in every other process for every lease given up ("a berth process
/// gave leases up"), up to 161 lines for one join.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn providers_moving_between_processes_are_said_in_a_line_per_move() {
    const EXTRA: usize = 7;
    let sim = SimServer::start().await;
    let driver = plugin("sim");
    let (_, file) = plugins_dir_and_name(&driver);
    let keys = |sim: &SimServer, i: usize| {
        let mut text = sim_provider(sim, i);
        for k in 0..EXTRA {
            text.push_str(&format!(
                "\n[providers.p{k}]\ndriver = {file:?}\n{}\n",
                sim_provider(sim, i)
            ));
        }
        text
    };
    let mut fleet = Fleet::on_driver(sim, 4, &driver, "min-ready = 0", keys);
    let held_by = |fleet: &Fleet| {
        let rows = psql(
            &fleet.url,
            "SELECT address FROM provider_lease WHERE expires > clock_timestamp()",
        )
        .unwrap_or_default();
        (0..4)
            .map(|i| {
                let base = fleet.procs[i].as_ref().map(|b| b.base.clone());
                (rows.lines())
                    .filter(|a| base.as_deref() == Some(*a))
                    .count()
            })
            .collect::<Vec<usize>>()
    };
    let providers = 1 + EXTRA;
    for joined in 1..=4 {
        fleet.start(joined - 1).await;
        let share = providers.div_ceil(joined);
        until(
            60,
            &format!("{joined} processes share the providers"),
            || async {
                let held = held_by(&fleet);
                (held.iter().sum::<usize>() == providers && held.iter().all(|&h| h <= share))
                    .then_some(())
            },
        )
        .await;
    }
    let said = [
        "this process holds these providers now",
        "this process no longer holds these providers",
        "giving providers up",
        // As berth said it before, a line per provider.
        "this process holds the provider",
        "this process no longer holds the provider",
        "giving the provider up",
        "gave leases up",
    ];
    for i in 0..4 {
        let log = fleet.get(i).log_text();
        let on_leases: Vec<&str> = (log.lines())
            .filter(|l| said.iter().any(|s| l.contains(s)))
            .collect();
        let lines = on_leases.len();
        // At most one line per kind for each move this process saw: its
        // own start, and each process that joined after it.
        let moves = 4 - i;
        println!("b{i}: {lines} lines on leases over {moves} moves");
        assert!(
            lines <= 2 * moves,
            "b{i} said {lines} lines on leases over {moves} moves:\n{}",
            on_leases.join("\n")
        );
    }
    for p in fleet.procs.iter_mut() {
        p.take().unwrap().terminate().await.assert_success();
    }
}

/// A process gives a provider up to one that joins while a slow create (10 s)
/// of that provider runs: it keeps renewing the provider's lease until the
/// create has returned, and only then gives it up. Before: the lease was no
/// longer renewed from the moment the provider was to be given up, lapsed,
/// and the joining process took the provider while the create still ran
/// (1.4 s before it returned, in one run), against the promise that calls
/// in flight end first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_is_given_up_only_once_its_calls_in_flight_have_ended() {
    let sim = SimServer::start().await;
    let slow = SimServer::start_with(berth::sim::Knobs {
        create_latency_ms: 10_000,
        ..Default::default()
    })
    .await;
    let driver = plugin("sim");
    let (_, file) = plugins_dir_and_name(&driver);
    let (slow_addr, slow_url) = (slow.addr(), slow.url());
    // `slow` is the second provider, the one the first process gives up
    // when the second joins, and the preferred one for `small`.
    let keys = move |sim: &SimServer, i: usize| {
        format!(
            "{}\npriority = 2\n[providers.slow]\ndriver = {file:?}\npriority = 1\n\
             allow-hosts = [\"{slow_addr}\"]\nconfig = {{ endpoint = \"{slow_url}/c/b{i}\" }}\n",
            sim_provider(sim, i)
        )
    };
    let offer = "[labels.small.providers.slow]\ninstance-type = \"small\"\nimage = \"img\"\n\
                 vcpus = 1\nram = \"1GiB\"\nprice = 0.1\n";
    let root = tempfile::tempdir().unwrap();
    let (url, store) = database(root.path(), None);
    let extra = format!("{offer}\n{store}");
    let mut fleet = Fleet::build(
        sim,
        2,
        root,
        url,
        &extra,
        &plugin("sim"),
        "min-ready = 0",
        keys,
    );
    fleet.start(0).await;
    fleet
        .get(0)
        .until_ready(30, "b0 holds the pool and both providers")
        .await;
    let request = fleet.get(0).request(CI, &[("small", 1)]).await;
    // Its node is stored as creating before the create is sent, and the
    // create is sent at once (the sim records a call only once answered).
    until(20, "the slow create on its way", || async {
        let (_, nodes) = (fleet.get(0))
            .call("GET", "/v1/nodes?state=creating", Some(OPS), None)
            .await;
        nodes
            .as_array()
            .is_some_and(|n| !n.is_empty())
            .then_some(())
    })
    .await;
    fleet.start(1).await;
    let done = fleet.get(0).fulfilled(CI, &request.id).await;
    let created = until(20, "the instance made", || async {
        live(&slow.cloud).first().map(|i| i.created_at_ms)
    })
    .await;
    let (taken, _) = until(30, "b1 takes the slow provider", || async {
        taken_since(&fleet.get(1).log_text(), "slow", 0)
    })
    .await;
    println!(
        "the create returned at {created}, b1 took the provider {} ms later",
        taken as i64 - created as i64
    );
    assert!(
        taken >= created,
        "b1 took the provider {} ms before its create returned",
        created - taken
    );
    let creates = (slow.cloud.calls().iter())
        .filter(|c| c.method == "POST")
        .count();
    assert_eq!(creates, 1, "the create was made again");
    assert_eq!(done.nodes.len(), 1);
    for p in fleet.procs.iter_mut() {
        p.take().unwrap().terminate().await.assert_success();
    }
}

/// A config reload on two processes sharing one pool: each process reads
/// its own file (never relayed), the pool's holder refuses its reload until
/// every other process runs the same config, and once the holder takes it
/// too the pool decides with it, through a failover: the process that
/// takes the pool over runs it already. The reload adds a provider on a
/// cloud of its own: the process standing by takes its lease and carries
/// out its calls for the holder. No node is lost on the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_takes_a_config_reload_once_every_process_runs_it_the_holder_last() {
    let mut fleet = Fleet::new(SimServer::start().await, 2);
    let sim2 = SimServer::start().await;
    let (_, driver) = plugins_dir_and_name(&plugin("sim"));
    let big = |i: usize| {
        format!(
            "\n[providers.sim2]\ndriver = {driver:?}\nallow-hosts = [\"{}\"]\n\
             config = {{ endpoint = \"{}/c/b{i}\" }}\n\n\
             [labels.big]\nmin-ready = 1\n[labels.big.providers.sim2]\n\
             instance-type = \"big\"\nimage = \"img\"\nvcpus = 4\nram = \"8GiB\"\n",
            sim2.addr(),
            sim2.url()
        )
    };
    fleet.start(0).await;
    fleet.get(0).until_ready(30, "b0 holds the pool").await;
    fleet.start(1).await;
    assert_eq!(fleet.lease(), (Some(0), 1));
    let b1_address = fleet.get(1).base.clone();
    // The event stream, relayed by b1 from the holder.
    let (status, mut events) =
        crate::events::Stream::open(&b1_address, CI, "?kinds=request", None).await;
    assert_eq!(status, 200);
    let used = fleet.get(1).request(CI, &[("small", 1)]).await;
    events
        .until("the relayed stream has the request fulfilled", |e| {
            crate::events::has_request(e, &used.id, "fulfilled")
        })
        .await;
    let used = fleet.get(1).fulfilled(CI, &used.id).await.nodes[0]
        .id
        .clone();
    fleet
        .get(0)
        .until_label_ready(60, "small", 2, "small refilled")
        .await;
    let reload = |i: usize| {
        let base = fleet.get(i).base.clone();
        async move { run_berth(["config", "reload", "--server", &base, "--token", OPS], &[]).await }
    };
    let configs_in_store = || {
        psql(
            &fleet.url,
            "SELECT count(DISTINCT config) FROM members WHERE expires > clock_timestamp()",
        )
        .unwrap()
    };
    assert_eq!(configs_in_store(), "1", "both start on one config");

    // Both files now raise `small`'s min-ready and add provider `sim2`
    // with label `big` on it; each keeps its own driver endpoints.
    for (i, path) in fleet.configs.iter().enumerate() {
        let text = std::fs::read_to_string(path).unwrap();
        assert!(text.contains("min-ready = 2"), "{text}");
        std::fs::write(
            path,
            text.replace("min-ready = 2", "min-ready = 3") + &big(i),
        )
        .unwrap();
    }

    // The holder first: refused, naming the process that does not run it.
    let ran = reload(0).await;
    assert!(!ran.success(), "{ran}");
    assert!(
        ran.stdout.contains("does not run this config yet") && ran.stdout.contains(&b1_address),
        "{ran}"
    );
    assert_eq!(
        min_ready(fleet.get(0)).await,
        (Some(2), None),
        "nothing changed"
    );

    // b1, standing by, takes its own file: the call is not relayed.
    let ran = reload(1).await;
    assert!(ran.success(), "{ran}");
    for line in ["labels.big: added", "providers.sim2: added"] {
        assert!(ran.stdout.contains(line), "{line}: {ran}");
    }
    assert_eq!(
        configs_in_store(),
        "2",
        "b1's new config is recorded before its reload answered"
    );
    // The pool is still decided by its holder's config, and each process
    // says that the other runs another one.
    assert_eq!(min_ready(fleet.get(1)).await, (Some(2), None));
    for i in 0..2 {
        log_says(fleet.get(i), "run another config than this one").await;
    }

    // The holder last, by SIGHUP: the pool takes the new config.
    fleet.get(0).signal(libc::SIGHUP);
    fleet
        .get(1)
        .until_label_ready(60, "small", 3, "min-ready raised on the holder")
        .await;
    fleet
        .get(1)
        .until_label_ready(60, "big", 1, "the new label prewarmed")
        .await;
    assert_eq!(min_ready(fleet.get(1)).await, (Some(3), Some(1)));
    assert_eq!(configs_in_store(), "1");
    // `sim2`'s calls, the holder's decisions, were carried out by b1,
    // which took its lease when it reloaded.
    fleet.others.push(sim2);
    let on_sim2 = fleet.calls_on("sim2");
    assert!(
        on_sim2.iter().any(|(_, c)| c.method == "POST"),
        "nothing created on sim2: {on_sim2:?}"
    );
    assert!(on_sim2.iter().all(|(i, _)| *i == 1), "{on_sim2:?}");
    log_says(
        fleet.get(1),
        "every berth process on the store runs the same config again",
    )
    .await;

    // The holder is killed: b1 takes the pool over, running the new
    // config already, and the node in use is still in use.
    fleet.procs[0].take().unwrap().signal(libc::SIGKILL);
    let b1 = fleet.get(1);
    b1.until_ready(30, "b1 takes the pool over").await;
    assert_eq!(min_ready(b1).await, (Some(3), Some(1)));
    let (status, node) = b1
        .call("GET", &format!("/v1/nodes/{used}"), Some(OPS), None)
        .await;
    assert_eq!(
        (status, node["state"].as_str()),
        (200, Some("in-use")),
        "{node}"
    );
    let big = b1.request(CI, &[("big", 1)]).await;
    b1.fulfilled(CI, &big.id).await;
    fleet.procs[1]
        .take()
        .unwrap()
        .terminate()
        .await
        .assert_success();
}

/// Waits until `berth`'s log has `needle`.
async fn log_says(berth: &Berth, needle: &str) {
    until(10, needle, || async {
        berth.log_text().contains(needle).then_some(())
    })
    .await;
}

/// What the pool decides with, as its holder shows it (`/v1/labels` is
/// relayed there): `small`'s min-ready, and `big`'s if it is there.
async fn min_ready(berth: &Berth) -> (Option<u64>, Option<u64>) {
    let (status, labels) = berth.call("GET", "/v1/labels", Some(OPS), None).await;
    assert_eq!(status, 200, "{labels}");
    let min = |name: &str| {
        (labels.as_array().unwrap().iter())
            .find(|l| l["name"] == name)
            .map(|l| l["min_ready"].as_u64().unwrap())
    };
    (min("small"), min("big"))
}

/// A request sent again with its `Idempotency-Key` through every way a
/// fleet takes one is one request with one set of nodes: made at the
/// holder; relayed by the process standing by; accepted into the store's
/// inbox while the holder is stopped (SIGSTOP), the key found taken there
/// and the body compared; at the process that took the pool over; and
/// relayed by the old holder, SIGKILLed and started again. The same key
/// with another body is refused on each way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_sent_again_through_a_fleet_and_its_failover_makes_one_request() {
    use crate::schedulers::post_keyed;
    let sim = SimServer::start().await;
    let mut fleet = Fleet::on_driver(sim, 2, &plugin("sim"), "min-ready = 0", sim_provider);
    fleet.start(0).await;
    fleet.get(0).until_ready(30, "b0 holds the pool").await;
    fleet.start(1).await;
    assert_eq!(fleet.lease(), (Some(0), 1));
    let body = json!({"labels": {"small": 2}, "metadata": {"build": "7"}});
    let other = json!({"labels": {"small": 2}, "metadata": {"build": "8"}});
    let refused = |(s, e): (u16, Value), way: &str| {
        assert_eq!(s, 422, "{way}: {e}");
        assert_eq!(e["error"]["code"], "idempotency_key_reused", "{way}: {e}");
    };

    let (s, first) = post_keyed(fleet.get(0), CI, "build-7", &body).await;
    assert_eq!(s, 201, "{first}");
    let id = first["id"].as_str().unwrap().to_owned();
    let same = |(s, r): (u16, Value), way: &str| {
        assert_eq!(
            (s, r["id"].as_str()),
            (200, Some(id.as_str())),
            "{way}: {r}"
        );
    };
    same(
        post_keyed(fleet.get(1), CI, "build-7", &body).await,
        "relayed",
    );
    refused(
        post_keyed(fleet.get(1), CI, "build-7", &other).await,
        "relayed",
    );

    // b0 stopped: b1 offers to it, gets no answer, and takes the calls
    // into the inbox, where the key's id is taken already.
    fleet.pause_between_calls(0).await;
    let (again, differs) = tokio::join!(
        post_keyed(fleet.get(1), CI, "build-7", &body),
        post_keyed(fleet.get(1), CI, "build-7", &other)
    );
    same(again, "through the inbox");
    refused(differs, "through the inbox");
    let m = fleet.get(1).metrics(Some(OPS)).await;
    assert_eq!(metric(&m, "berth_requests_inboxed_total"), Some(1.0), "{m}");

    assert_eq!(fleet.until_held(30, "b1 takes the pool over").await, 1);
    same(
        post_keyed(fleet.get(1), CI, "build-7", &body).await,
        "after the failover",
    );
    let held = fleet.get(1).fulfilled(CI, &id).await;
    assert_eq!(held.nodes.len(), 2);

    // b0, SIGKILLed while stopped and started again, stands by and relays.
    fleet.get(0).signal(libc::SIGKILL);
    fleet.procs[0]
        .take()
        .unwrap()
        .exit_within(Duration::from_secs(30))
        .await;
    fleet.start(0).await;
    let (s, relayed) = post_keyed(fleet.get(0), CI, "build-7", &body).await;
    same((s, relayed.clone()), "relayed by the restarted b0");
    assert_eq!(relayed["state"], "fulfilled");
    refused(
        post_keyed(fleet.get(0), CI, "build-7", &other).await,
        "relayed again",
    );

    // One request, one set of nodes: the cloud made two instances.
    let (s, all) = fleet
        .get(1)
        .call("GET", "/v1/requests", Some(OPS), None)
        .await;
    assert_eq!(s, 200, "{all}");
    let all = all.as_array().unwrap();
    assert_eq!(all.len(), 1, "{all:#?}");
    assert_eq!(all[0]["metadata"], json!({"build": "7"}));
    assert_eq!(live(&fleet.sim.cloud).len(), 2);
    let waiting = psql(&fleet.url, "SELECT count(*) FROM request_inbox").unwrap();
    assert_eq!(waiting.trim(), "0", "requests left in the inbox");
}
