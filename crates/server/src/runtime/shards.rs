//! Providers shared out over the berth processes on one PostgreSQL pool.
//!
//! The process that holds the pool's lease decides everything (which node
//! goes to which request, what to launch and delete), as before. The
//! providers' cloud calls are carried out by whichever process holds each
//! provider's lease: the leases spread over the live processes
//! ([`berth_store::PgShards`]), so the drivers' work (the sandboxed guests,
//! the cloud's HTTP, the waits for its rate limits) is shared, and a process
//! that joins takes a share of it.
//!
//! - **The holder of the pool** sends each call to the provider's holder:
//!   itself (the local driver), or another process over
//!   `POST /internal/v1/calls`, authenticated with the pool's peer secret
//!   (kept in the database). The call names the epoch of the pool's lease it
//!   was decided under.
//! - **The holder of a provider** carries out a call only while it holds the
//!   provider's lease, for the pool's lease of the epoch it last read, and
//!   while that lease is certain. Its driver's [`Gate`] for the provider is
//!   open until shortly before either lease could lapse, by the last
//!   heartbeat, and every outbound request checks it: a process paused past
//!   either lease sends nothing when it resumes.
//! - **A call refused before anything was sent** (the provider is moving,
//!   nobody holds it yet, the holder's view is a beat behind, its host
//!   refuses the connection) waits for the leases to settle and goes to the
//!   new holder. A call whose holder fails or changes hands while it runs is
//!   failed with its outcome unknown, and the pool resolves it from the next
//!   list, as after a crash.
//! - **Spreading out.** Each heartbeat takes free leases up to the process's
//!   share (providers over live processes, rounded up). A process holding
//!   more than its share gives the rest up: it stops taking their calls,
//!   waits (briefly) for those running to end, and releases them.
//! - **One config.** Each heartbeat records the digest of the config this
//!   process runs (`berth_config::fleet_digest`) and reads every live
//!   process's: a config reload on the pool's holder waits for the fleet
//!   to agree ([`Shards::fleet_now`]), and a process whose config differs
//!   from the others' says so in its log.

// Time here is tokio's clock, which tests on paused time move.
#![deny(clippy::disallowed_methods)]

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::{Notify, watch};

use berth_config::ProviderIx;
use berth_core::driver::{Call as Which, CreateSpec, Instance, Page, Tags};
use berth_core::pool::Batches;
use berth_plugin::{CallError, CallErrorKind, Deletion, Gate};
use berth_store::{Member, PgShards, Roster, RosterLease};

use super::observer::Observer;
use super::providers::{BoxFuture, Cloud, Many, Providers};
use super::wire::{self, Answer};

/// The header that carries the pool's peer secret.
pub const PEER_HEADER: &str = "x-berth-peer";

/// Where calls are carried out for other processes.
pub const CALLS_PATH: &str = "/internal/v1/calls";

/// How much longer than a call may run (its `call-deadline`) a provider
/// being given up waits for its running calls.
const DRAIN_MARGIN: Duration = Duration::from_secs(1);

/// The most a call's answer may hold (a list of many instances).
const MAX_ANSWER: usize = 64 << 20;

/// The longest gap between two heartbeats: a provider given up is taken
/// by another process within about this long.
const BEAT_MAX: Duration = Duration::from_secs(1);

/// The first wait before a refused call is sent again; it doubles up to a
/// quarter of the TTL.
const RETRY_FIRST: Duration = Duration::from_millis(50);

/// The providers' leases as this process sees them.
pub struct Shards {
    me: String,
    ttl: Duration,
    /// The configured providers, in the config's order; a config reload
    /// adds providers at the end ([`Shards::add`]). Plain lock: held only
    /// to read or grow the list.
    list: RwLock<Vec<Arc<Shard>>>,
    roster: watch::Sender<Arc<Roster>>,
    /// Providers being given up: no new call starts on them.
    leaving: Mutex<HashSet<usize>>,
    /// Woken when a beat is wanted now.
    nudge: Notify,
    /// Woken when a running call ends: looked at only while providers are
    /// being given up, so that calls ending do not make heartbeats.
    ended: Notify,
    /// Woken when a process has given the pool's lease up (`NOTIFY`), so
    /// that a process standing by takes it at once.
    pool_given_up: Notify,
    /// Woken when a process has put requests into the inbox (`NOTIFY`),
    /// so that the pool's holder takes them in at once; keeps the news
    /// until the holder looks.
    requests_sent: Notify,
    secret: String,
    client: Client<super::peers::Connector, Full<Bytes>>,
    /// How the other processes are reached, for the relay as well.
    connector: super::peers::Connector,
    /// The digest of the config this process runs, recorded at each beat.
    config: Mutex<String>,
    /// The processes last said to run another config than this one's.
    differing: Mutex<Vec<String>>,
}

/// Where a provider's calls go now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    Here,
    There {
        holder: String,
        address: String,
        epoch: i64,
    },
    /// Nobody holds it (it is moving, or its holder died), or this process
    /// is giving it up.
    Nowhere,
}

/// Why this process did not take a call on a provider; nothing was done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotTaken {
    #[error("no provider {0} is configured here")]
    Unknown(String),
    #[error("this process does not hold provider {0} (now)")]
    NotHeld(String),
    /// The pool changed hands between the decision and the call.
    #[error(
        "the call was decided under the pool's lease of epoch {decided}, and this process \
         last saw {}",
        saw(*.seen)
    )]
    OtherEpoch { decided: i64, seen: Option<i64> },
    #[error("this process's lease of provider {0}, or the pool's, is not certain now")]
    Uncertain(String),
}

/// The pool's lease this process last saw, in words.
fn saw(epoch: Option<i64>) -> String {
    epoch.map_or("no holder".to_owned(), |e| format!("epoch {e}"))
}

/// One provider, as the leases share it out.
struct Shard {
    name: String,
    /// Open while this process may send its calls.
    gate: Arc<Gate>,
    /// How long it waits for its calls when given up: its `call-deadline`,
    /// and a margin.
    drain: Duration,
    /// Its calls running here.
    running: AtomicUsize,
}

/// A provider a config reload added: its name, its driver's gate (shut
/// until this process holds its lease), and its `call-deadline`.
pub struct Added {
    pub name: String,
    pub gate: Arc<Gate>,
    pub call_deadline: Duration,
}

/// A call counted as running on a provider until dropped.
pub struct Running<'a> {
    shards: &'a Shards,
    shard: Arc<Shard>,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.shard.running.fetch_sub(1, Ordering::SeqCst);
        self.shards.ended.notify_one();
    }
}

/// Stops the heartbeats: gives every lease up once the calls running here
/// have ended (within the grace), and leaves the pool's members.
pub struct Beating {
    stop: Option<tokio::sync::oneshot::Sender<Duration>>,
    task: tokio::task::JoinHandle<()>,
}

impl Beating {
    pub async fn leave(mut self, grace: Duration) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(grace);
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for Beating {
    fn drop(&mut self) {
        if self.stop.is_some() {
            self.task.abort();
        }
    }
}

impl Shards {
    /// How this process reaches the others: the relay of its API uses it.
    pub fn connector(&self) -> &super::peers::Connector {
        &self.connector
    }

    /// Reads the peer secret, takes part in the first heartbeat, and keeps
    /// beating in the background. Each provider's gate comes from
    /// [`Shards::gate`].
    /// `deadlines`: each provider's `call-deadline`, the longest its calls
    /// run, which a provider being given up waits for. `config`: the
    /// digest of the config this process runs. `connector`: how the other
    /// processes are reached ([`super::peers`]).
    pub async fn start(
        mut pg: PgShards,
        deadlines: Vec<Duration>,
        observer: Arc<dyn Observer>,
        config: String,
        connector: super::peers::Connector,
    ) -> Result<(Arc<Shards>, Beating), berth_store::StoreError> {
        let secret = pg.peer_secret().await?;
        pg.set_config(config.clone());
        let me = pg.me().clone();
        let list = (pg.providers().iter().enumerate())
            .map(|(i, name)| {
                Arc::new(Shard {
                    name: name.clone(),
                    gate: Arc::new(Gate::shut()),
                    drain: deadlines.get(i).copied().unwrap_or_default() + DRAIN_MARGIN,
                    running: AtomicUsize::new(0),
                })
            })
            .collect();
        let shards = Arc::new(Shards {
            me: me.holder,
            ttl: me.ttl,
            list: RwLock::new(list),
            roster: watch::Sender::new(Arc::new(Roster::default())),
            leaving: Mutex::new(HashSet::new()),
            nudge: Notify::new(),
            ended: Notify::new(),
            pool_given_up: Notify::new(),
            requests_sent: Notify::new(),
            secret,
            client: Client::builder(TokioExecutor::new()).build(connector.clone()),
            connector,
            config: Mutex::new(config),
            differing: Mutex::new(Vec::new()),
        });
        let first = pg.beat(&[]).await?;
        shards.read_roster(first);
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(keep_beating(shards.clone(), pg, observer, stopped));
        Ok((
            shards,
            Beating {
                stop: Some(stop),
                task,
            },
        ))
    }

    /// The gate of provider `p`'s driver.
    pub fn gate(&self, p: usize) -> Option<Arc<Gate>> {
        self.shard(p).map(|s| s.gate.clone())
    }

    /// Provider `p`, if it is configured (yet).
    fn shard(&self, p: usize) -> Option<Arc<Shard>> {
        let list = self.list.read().unwrap_or_else(|e| e.into_inner());
        list.get(p).cloned()
    }

    /// Every configured provider, in the config's order.
    fn all(&self) -> Vec<Arc<Shard>> {
        self.list.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Provider `p`'s name, if it is configured (yet).
    fn name(&self, p: usize) -> Option<String> {
        self.shard(p).map(|s| s.name.clone())
    }

    /// The configured providers' names, in the config's order.
    fn names(&self) -> Vec<String> {
        self.all().iter().map(|s| s.name.clone()).collect()
    }

    /// Takes part in the leases of the providers a config reload added
    /// (after those configured), from the next beat on, which comes now.
    pub fn add(&self, added: Vec<Added>) {
        if added.is_empty() {
            return;
        }
        let mut list = self.list.write().unwrap_or_else(|e| e.into_inner());
        for a in added {
            list.push(Arc::new(Shard {
                name: a.name,
                gate: a.gate,
                drain: a.call_deadline + DRAIN_MARGIN,
                running: AtomicUsize::new(0),
            }));
        }
        drop(list);
        self.nudge.notify_one();
    }

    /// Every lease as last read.
    pub fn roster(&self) -> Arc<Roster> {
        self.roster.borrow().clone()
    }

    /// This process, as the leases name it.
    pub fn me(&self) -> &str {
        &self.me
    }

    /// The digest of the config this process runs.
    pub fn config(&self) -> String {
        self.config
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records that this process now runs the config of `digest`, from the
    /// next beat on ([`Shards::fleet_now`] makes it now).
    pub fn set_config(&self, digest: String) {
        *self.config.lock().unwrap_or_else(|e| e.into_inner()) = digest;
    }

    /// Beats now, and answers every live process with the config it runs,
    /// as of a beat sent after this was called (which records this
    /// process's own config too); `None` if no beat got through within
    /// twice the TTL (at least 5 s).
    pub async fn fleet_now(&self) -> Option<Vec<Member>> {
        let asked = Instant::now();
        let mut roster = self.roster.subscribe();
        self.nudge.notify_one();
        let after = (self.ttl * 2).max(Duration::from_secs(5));
        let mine = self.config();
        // A beat sent after this, that recorded this process's config as
        // it now is (one that read the config just before it was set does
        // not count).
        let fresh = roster.wait_for(|r| {
            r.sent.is_some_and(|sent| sent >= asked)
                && (r.fleet.iter()).any(|m| m.holder == self.me && m.config == mine)
        });
        match tokio::time::timeout(after, fresh).await {
            Ok(Ok(r)) => Some(r.fleet.clone()),
            _ => None,
        }
    }

    /// The providers this process holds, by name.
    pub fn held(&self) -> Vec<String> {
        let roster = self.roster();
        roster
            .held_by(&self.me)
            .into_iter()
            .filter_map(|i| self.name(i))
            .collect()
    }

    fn leaving(&self) -> std::sync::MutexGuard<'_, HashSet<usize>> {
        self.leaving.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where provider `p`'s calls go now.
    pub fn route(&self, p: usize) -> Route {
        let roster = self.roster();
        match roster.providers.get(p).and_then(Option::as_ref) {
            Some(l) if l.holder == self.me => {
                if self.leaving().contains(&p) {
                    Route::Nowhere
                } else {
                    Route::Here
                }
            }
            Some(l) => Route::There {
                holder: l.holder.clone(),
                address: l.address.clone(),
                epoch: l.epoch,
            },
            None => Route::Nowhere,
        }
    }

    /// Completes when a process gives the pool's lease up, as the database
    /// announces it (a clean stop); only a waiter already waiting is woken.
    pub async fn pool_given_up(&self) {
        self.pool_given_up.notified().await;
    }

    /// Completes when requests were put into the inbox since this was last
    /// looked at (a process standing by accepted them), as the database
    /// announces it.
    pub async fn requests_sent(&self) {
        self.requests_sent.notified().await;
    }

    /// Counts a call as running on `shard`.
    fn run(&self, shard: Arc<Shard>) -> Running<'_> {
        shard.running.fetch_add(1, Ordering::SeqCst);
        Running {
            shards: self,
            shard,
        }
    }

    /// The pool's peer secret, which calls between its processes carry.
    pub fn peer_secret(&self) -> &str {
        &self.secret
    }

    /// Whether `secret` is the pool's peer secret.
    pub fn admits(&self, secret: &[u8]) -> bool {
        use subtle::ConstantTimeEq;
        self.secret.as_bytes().ct_eq(secret).into()
    }

    /// Takes a call on `provider` from the process that decided it under
    /// the pool's lease of `pool_epoch`, or says why not (nothing was done).
    pub fn accept(
        &self,
        provider: &str,
        pool_epoch: i64,
    ) -> Result<(usize, Running<'_>), NotTaken> {
        let Some(p) = self.all().iter().position(|s| s.name == provider) else {
            return Err(NotTaken::Unknown(provider.to_owned()));
        };
        self.take(p, pool_epoch).map(|running| (p, running))
    }

    /// Takes a call on provider `p` decided under the pool's lease of
    /// `pool_epoch`, here or from another process: only while this process
    /// holds `p`, last saw the pool under that epoch, and may send.
    fn take(&self, p: usize, pool_epoch: i64) -> Result<Running<'_>, NotTaken> {
        let Some(shard) = self.shard(p) else {
            return Err(NotTaken::Unknown(format!("#{p}")));
        };
        let provider = &shard.name;
        if self.route(p) != Route::Here {
            return Err(NotTaken::NotHeld(provider.clone()));
        }
        let seen = self.roster().pool.as_ref().map(|l| l.epoch);
        if seen != Some(pool_epoch) {
            // A holder that took the pool over since this process last
            // looked: look again now, so that its next try is taken.
            self.nudge.notify_one();
            return Err(NotTaken::OtherEpoch {
                decided: pool_epoch,
                seen,
            });
        }
        if !shard.gate.is_open() {
            return Err(NotTaken::Uncertain(provider.clone()));
        }
        Ok(self.run(shard))
    }

    /// A heartbeat's answer: opens the gates of the providers held here
    /// until shortly before their lease or the pool's could lapse, shuts the
    /// others, and gives up what is beyond this process's share.
    fn read_roster(&self, roster: Roster) {
        let before = self.roster();
        let sent = roster.sent.unwrap_or_else(Instant::now);
        let margin = self.ttl / 5;
        let certain = |l: &RosterLease| (sent + l.remaining).checked_sub(margin);
        let pool_until = roster.pool.as_ref().and_then(certain);
        let mut leaving = self.leaving();
        // What changed is said in one line per kind, however many providers
        // a rebalance moves at once.
        let (mut taken, mut lost, mut given) = (Vec::new(), Vec::new(), Vec::new());
        let all = self.all();
        // The beat answers the providers it was sent with: those added
        // since are looked at by the next one.
        for ((i, lease), shard) in roster.providers.iter().enumerate().zip(&all) {
            let was = before.providers.get(i).and_then(Option::as_ref);
            match lease {
                Some(l) if l.holder == self.me => {
                    match certain(l).zip(pool_until).map(|(a, b)| a.min(b)) {
                        Some(until) => shard.gate.open_until(until),
                        None => shard.gate.shut_now(),
                    }
                    if was.is_none_or(|w| w.holder != self.me || w.epoch != l.epoch) {
                        taken.push(format!("{}@{}", shard.name, l.epoch));
                    }
                }
                _ => {
                    shard.gate.shut_now();
                    leaving.remove(&i);
                    if was.is_some_and(|w| w.holder == self.me) {
                        lost.push(shard.name.as_str());
                    }
                }
            }
        }
        let held = roster.held_by(&self.me);
        let keeping: Vec<usize> = held
            .iter()
            .copied()
            .filter(|i| !leaving.contains(i))
            .collect();
        let share = roster.share();
        // The last ones past the share, so that who holds what moves little.
        for &i in keeping.iter().skip(share) {
            if let Some(shard) = all.get(i) {
                given.push(shard.name.as_str());
                leaving.insert(i);
            }
        }
        drop(leaving);
        if !taken.is_empty() {
            tracing::info!(providers = %taken.join(", "), "this process holds these providers now (name@epoch): it carries out their cloud calls");
        }
        if !lost.is_empty() {
            tracing::info!(providers = %lost.join(", "), "this process no longer holds these providers");
        }
        if !given.is_empty() {
            tracing::info!(
                providers = %given.join(", "),
                processes = roster.members,
                share,
                "giving providers up once their calls have ended, to spread the providers over the processes"
            );
        }
        self.differs(&roster.fleet);
        self.roster.send_replace(Arc::new(roster));
    }

    /// Says in the log when the processes running another config than this
    /// one's change: which they are, and when none is left.
    fn differs(&self, fleet: &[Member]) {
        let mine = self.config();
        let now: Vec<String> = (fleet.iter())
            .filter(|m| m.config != mine)
            .map(|m| m.holder.clone())
            .collect();
        let mut differing = self.differing.lock().unwrap_or_else(|e| e.into_inner());
        if *differing == now {
            return;
        }
        if now.is_empty() {
            tracing::info!("every berth process on the store runs the same config again");
        } else {
            tracing::warn!(
                processes = %now.join(", "),
                "these berth processes run another config than this one: reload each with the \
                 same file, the pool's holder last"
            );
        }
        *differing = now;
    }

    /// The leases this process renews: those it holds, the ones it is
    /// giving up included, until their calls have ended and they are given
    /// up (so that no other process takes a provider while a call of it
    /// still runs here).
    fn keep(&self) -> Vec<String> {
        let roster = self.roster();
        (roster.held_by(&self.me).into_iter())
            .filter_map(|i| self.name(i))
            .collect()
    }

    /// The providers being given up whose calls have ended, or which have
    /// waited for them since `since` long enough.
    fn drained(&self, since: &mut std::collections::HashMap<usize, Instant>) -> Vec<usize> {
        let leaving = self.leaving().clone();
        since.retain(|i, _| leaving.contains(i));
        let now = Instant::now();
        leaving
            .into_iter()
            .filter(|&i| {
                let started = *since.entry(i).or_insert(now);
                self.shard(i).is_none_or(|s| {
                    s.running.load(Ordering::SeqCst) == 0 || now >= started + s.drain
                })
            })
            .collect()
    }

    /// Provider `p`'s calls, routed per call.
    pub fn cloud(
        self: &Arc<Self>,
        p: ProviderIx,
        providers: Arc<Providers>,
        pool_epoch: i64,
    ) -> Arc<dyn Cloud> {
        Arc::new(Routed {
            shards: self.clone(),
            name: providers.name(p),
            providers,
            p,
            pool_epoch,
        })
    }
}

/// Beats every quarter of the TTL, at least every [`BEAT_MAX`], and sooner
/// when nudged or when the database announces leases given up; gives up
/// the providers past this process's share once drained.
async fn keep_beating(
    shards: Arc<Shards>,
    mut pg: PgShards,
    observer: Arc<dyn Observer>,
    mut stop: tokio::sync::oneshot::Receiver<Duration>,
) {
    let every = (shards.ttl / 4).min(BEAT_MAX);
    let mut draining = std::collections::HashMap::new();
    let mut failing = false;
    let grace = loop {
        let drained = shards.drained(&mut draining);
        if !drained.is_empty() {
            let names: Vec<String> = drained.iter().filter_map(|&i| shards.name(i)).collect();
            match pg.release(&names).await {
                Ok(()) => {
                    // No longer held, as of now: the next beat must not
                    // renew what was just given up (a renewal of a lease
                    // still naming this process would take it back, and it
                    // would be given up again at every beat).
                    shards.roster.send_modify(|roster| {
                        let mut now = Roster::clone(roster);
                        for i in &drained {
                            now.providers[*i] = None;
                        }
                        *roster = Arc::new(now);
                    });
                    let mut leaving = shards.leaving();
                    for i in &drained {
                        leaving.remove(i);
                        if let Some(gate) = shards.gate(*i) {
                            gate.shut_now();
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not give providers up; they lapse instead")
                }
            }
        }
        let started = Instant::now();
        pg.set_config(shards.config());
        pg.set_providers(shards.names());
        let beat = pg.beat(&shards.keep()).await;
        observer.heartbeat(started.elapsed());
        match beat {
            Ok(roster) => {
                if failing {
                    tracing::info!("the providers' leases are renewed again");
                }
                failing = false;
                shards.read_roster(roster);
            }
            Err(e) => {
                // The gates shut on their own when the leases could lapse.
                if !failing {
                    tracing::warn!(error = %e, "could not renew the providers' leases; their calls stop when the leases could lapse");
                }
                failing = true;
            }
        }
        let leaving = !shards.leaving().is_empty();
        let wait = if leaving {
            every.min(Duration::from_millis(100))
        } else {
            every
        };
        // A call ending matters only to a provider being given up.
        let ended = async {
            if leaving {
                shards.ended.notified().await
            } else {
                std::future::pending().await
            }
        };
        let sleep = tokio::time::sleep(wait);
        tokio::pin!(ended, sleep);
        let stopped = loop {
            tokio::select! {
                grace = &mut stop => break Some(grace.unwrap_or(Duration::ZERO)),
                () = &mut sleep => break None,
                () = shards.nudge.notified() => break None,
                () = &mut ended => break None,
                // RequestorLeases given up (a clean stop, spreading out) are taken
                // at once, not at the next beat; requests put into the
                // inbox are the pool's holder's to take in, and need no
                // beat.
                seen = pg.announced() => {
                    if seen.requests {
                        shards.requests_sent.notify_one();
                    }
                    if seen.pool {
                        shards.pool_given_up.notify_waiters();
                    }
                    if seen.pool || seen.providers {
                        // What it changes here is said by `read_roster`.
                        tracing::debug!(pool = seen.pool, providers = seen.providers, "a berth process gave leases up: looking at the leases now");
                        break None;
                    }
                }
            }
        };
        if let Some(grace) = stopped {
            break grace;
        }
    };
    // Stopping: no new call is taken; those running end first, within the
    // grace.
    let all = shards.all();
    shards.leaving().extend(0..all.len());
    let until = tokio::time::Instant::now() + grace;
    while all.iter().any(|s| s.running.load(Ordering::SeqCst) > 0)
        && tokio::time::Instant::now() < until
    {
        tokio::select! {
            () = shards.ended.notified() => {}
            () = tokio::time::sleep_until(until) => {}
        }
    }
    for s in &all {
        s.gate.shut_now();
    }
    match pg.leave().await {
        Ok(()) => tracing::info!("gave the providers' leases up"),
        Err(e) => {
            tracing::warn!(error = %e, "could not give the providers' leases up; they lapse instead")
        }
    }
}

/// One provider's calls as the pool's holder makes them: carried out here
/// or by the provider's holder.
struct Routed {
    shards: Arc<Shards>,
    /// The provider's name.
    name: String,
    providers: Arc<Providers>,
    p: ProviderIx,
    pool_epoch: i64,
}

/// What sending a call to another process came to.
enum Sent {
    Answered(Box<Answer>),
    /// Refused before anything was done: send it again once the leases
    /// settle.
    Refused(String),
    /// Failed with its outcome unknown.
    Lost(String),
}

impl Routed {
    fn name(&self) -> &str {
        &self.name
    }

    fn error(&self, which: Which, kind: CallErrorKind) -> CallError {
        CallError {
            provider: self.name().into(),
            call: which,
            kind,
        }
    }

    /// Carries the call out where the provider is held, waiting (up to
    /// twice the TTL) for a holder while there is none.
    async fn run(&self, which: Which, call: wire::Call) -> Result<Answer, CallError> {
        let i = self.p.0 as usize;
        let mut give_up = tokio::time::Instant::now() + self.shards.ttl * 2;
        let mut retry = RETRY_FIRST;
        let mut roster = self.shards.roster.subscribe();
        let mut why = String::new();
        while tokio::time::Instant::now() < give_up {
            roster.mark_unchanged();
            match self.shards.route(i) {
                Route::Here => match self.shards.take(i, self.pool_epoch) {
                    // The same checks as for a call from another process: a
                    // call decided before this process was taken over is
                    // not carried out here either; one decided just after
                    // it took the pool over waits for its next beat.
                    Ok(_running) => {
                        let cloud = self
                            .providers
                            .get(self.p)
                            .await
                            .map_err(|e| self.error(which, CallErrorKind::NotStarted(e)))?;
                        return execute(&*cloud, call).await;
                    }
                    Err(e) => why = format!("not carried out here yet: {e}"),
                },
                Route::There {
                    holder,
                    address,
                    epoch,
                } => match self.send(&address, epoch, &call).await {
                    Sent::Answered(answer) => match *answer {
                        Answer::Failed(e) => return Err(self.error(which, e.into_kind(&holder))),
                        answer => return Ok(answer),
                    },
                    // A list, a delete or a set-tags may be made again:
                    // once the provider has changed hands (its holder
                    // paused or died), it goes to the next holder rather
                    // than failing, so that a takeover does not cost a
                    // failed list and its backoff. A create may not be.
                    Sent::Lost(e)
                        if call.repeatable()
                            && self.shards.route(i)
                                != Route::There {
                                    holder: holder.clone(),
                                    address: address.clone(),
                                    epoch,
                                } =>
                    {
                        why = format!("{holder} did not answer before the provider moved: {e}");
                        // The wait for the next holder starts now.
                        give_up = tokio::time::Instant::now() + self.shards.ttl * 2;
                    }
                    Sent::Lost(e) => {
                        return Err(self.error(
                            which,
                            CallErrorKind::PeerLost(
                                format!("{holder}, which holds the provider: {e}; the outcome is not known").into(),
                            ),
                        ));
                    }
                    Sent::Refused(e) => why = format!("{holder} did not take the call: {e}"),
                },
                Route::Nowhere => why = "no berth process holds the provider's lease".into(),
            }
            // Look at the leases again now rather than at the next beat: a
            // free provider is taken, a new holder seen.
            self.shards.nudge.notify_one();
            tokio::select! {
                _ = roster.changed() => {}
                () = tokio::time::sleep(retry) => {}
            }
            retry = (retry * 2).min(self.shards.ttl / 4);
        }
        Err(self.error(
            which,
            CallErrorKind::Peer(
                format!("{why}; nothing was sent for {:?}", self.shards.ttl * 2).into(),
            ),
        ))
    }

    /// Sends the call to the process at `address` that holds the provider
    /// under `epoch`, and gives up on it if the provider changes hands
    /// before it answers.
    async fn send(&self, address: &str, epoch: i64, call: &wire::Call) -> Sent {
        let body = wire::CallBody {
            provider: self.name().to_owned(),
            pool_epoch: self.pool_epoch,
            call: call.clone(),
        };
        let body = match serde_json::to_vec(&body) {
            Ok(b) => b,
            Err(e) => return Sent::Lost(format!("the call could not be written: {e}")),
        };
        let request =
            hyper::Request::post(format!("{}{CALLS_PATH}", address.trim_end_matches('/')))
                .header(hyper::header::CONTENT_TYPE, "application/json")
                .header(PEER_HEADER, &self.shards.secret)
                .body(Full::new(Bytes::from(body)));
        let request = match request {
            Ok(r) => r,
            Err(e) => return Sent::Refused(format!("its address {address} is not usable: {e}")),
        };
        let i = self.p.0 as usize;
        let mut roster = self.shards.roster.subscribe();
        let moved = roster.wait_for(|r| {
            r.providers
                .get(i)
                .and_then(Option::as_ref)
                .is_none_or(|l| l.epoch != epoch)
        });
        let answer = async {
            let response = self.shards.client.request(request).await.map_err(|e| {
                let said = berth_core::text::causes(&e);
                if e.is_connect() {
                    Sent::Refused(format!("could not connect to {address}: {said}"))
                } else {
                    Sent::Lost(format!("no answer from {address}: {said}"))
                }
            })?;
            let status = response.status();
            let bytes = Limited::new(response.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| Sent::Lost(format!("the answer from {address} broke off: {e}")))?
                .to_bytes();
            if status == hyper::StatusCode::MISDIRECTED_REQUEST {
                return Err(Sent::Refused(String::from_utf8_lossy(&bytes).into_owned()));
            }
            if !status.is_success() {
                return Err(Sent::Lost(format!(
                    "{address} answered {status}: {}",
                    String::from_utf8_lossy(&bytes[..bytes.len().min(300)])
                )));
            }
            serde_json::from_slice(&bytes)
                .map(|a| Sent::Answered(Box::new(a)))
                .map_err(|e| Sent::Lost(format!("{address} answered something unreadable: {e}")))
        };
        tokio::select! {
            sent = answer => sent.unwrap_or_else(|s| s),
            _ = moved => Sent::Lost("the provider changed hands before it answered".into()),
        }
    }

    fn unexpected(&self, which: Which, answer: Answer) -> CallError {
        self.error(
            which,
            CallErrorKind::Peer(
                format!("the provider's holder answered {answer:?} to a {which:?}").into(),
            ),
        )
    }
}

/// Carries out `call` on a driver here: for the pool's own process, or for
/// another through [`CALLS_PATH`].
pub async fn execute(cloud: &dyn Cloud, call: wire::Call) -> Result<Answer, CallError> {
    Ok(match call {
        wire::Call::Create(spec) => Answer::Created(Box::new(cloud.create(spec).await?)),
        wire::Call::List { filter, cursor } => {
            Answer::Listed(cloud.list_page(filter, cursor).await?)
        }
        wire::Call::Get(ids) => Answer::Got(cloud.get(ids).await?),
        wire::Call::Delete(id) => cloud.delete(&id).await?.into(),
        wire::Call::CreateMany(specs) => Answer::CreatedMany(cloud.create_many(specs).await?),
        wire::Call::DeleteMany(ids) => Answer::DeletedMany(
            (cloud.delete_many(ids).await?.into_iter())
                .map(|d| d.map(|d| d == Deletion::AlreadyGone))
                .collect(),
        ),
        wire::Call::SetTags { id, tags } => {
            cloud.set_tags(&id, tags).await?;
            Answer::Tagged
        }
    })
}

/// Carries out a call taken through [`Shards::accept`].
pub async fn carry_out(providers: &Providers, p: usize, call: wire::Call) -> Answer {
    let cloud = match providers.get(ProviderIx(p as u16)).await {
        Ok(c) => c,
        Err(e) => {
            return Answer::Failed(wire::Error::Other(format!(
                "the provider has not started: {e}"
            )));
        }
    };
    execute(&*cloud, call)
        .await
        .unwrap_or_else(|e| Answer::Failed(wire::Error::from(&e)))
}

impl Cloud for Routed {
    fn create(&self, spec: CreateSpec) -> BoxFuture<'_, Result<Instance, CallError>> {
        Box::pin(async move {
            match self.run(Which::Create, wire::Call::Create(spec)).await? {
                Answer::Created(instance) => Ok(*instance),
                other => Err(self.unexpected(Which::Create, other)),
            }
        })
    }

    fn list_page(
        &self,
        filter: Tags,
        cursor: Option<String>,
    ) -> BoxFuture<'_, Result<Page, CallError>> {
        Box::pin(async move {
            match self
                .run(Which::List, wire::Call::List { filter, cursor })
                .await?
            {
                Answer::Listed(page) => Ok(page),
                other => Err(self.unexpected(Which::List, other)),
            }
        })
    }

    fn get(&self, ids: Vec<String>) -> BoxFuture<'_, Result<Vec<Instance>, CallError>> {
        Box::pin(async move {
            match self.run(Which::Get, wire::Call::Get(ids)).await? {
                Answer::Got(found) => Ok(found),
                other => Err(self.unexpected(Which::Get, other)),
            }
        })
    }

    fn delete<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Deletion, CallError>> {
        Box::pin(async move {
            match self
                .run(Which::Delete, wire::Call::Delete(id.to_owned()))
                .await?
            {
                Answer::Deleted { already_gone } => Ok(if already_gone {
                    Deletion::AlreadyGone
                } else {
                    Deletion::Deleted
                }),
                other => Err(self.unexpected(Which::Delete, other)),
            }
        })
    }

    /// The holder runs the same driver file: what it declares here.
    fn batches(&self) -> Batches {
        self.providers.batches(self.p).unwrap_or_default()
    }

    fn create_many(&self, specs: Vec<CreateSpec>) -> BoxFuture<'_, Many<Instance>> {
        // The answers as they came, however many: the runtime counts them
        // (`effects::per_item`), as it does a driver's here.
        Box::pin(async move {
            match self
                .run(Which::CreateMany, wire::Call::CreateMany(specs))
                .await?
            {
                Answer::CreatedMany(all) => Ok(all),
                other => Err(self.unexpected(Which::CreateMany, other)),
            }
        })
    }

    fn delete_many(&self, ids: Vec<String>) -> BoxFuture<'_, Many<Deletion>> {
        Box::pin(async move {
            match self
                .run(Which::DeleteMany, wire::Call::DeleteMany(ids))
                .await?
            {
                Answer::DeletedMany(all) => Ok((all.into_iter())
                    .map(|a| {
                        a.map(|gone| match gone {
                            true => Deletion::AlreadyGone,
                            false => Deletion::Deleted,
                        })
                    })
                    .collect()),
                other => Err(self.unexpected(Which::DeleteMany, other)),
            }
        })
    }

    fn set_tags<'a>(&'a self, id: &'a str, tags: Tags) -> BoxFuture<'a, Result<(), CallError>> {
        Box::pin(async move {
            let call = wire::Call::SetTags {
                id: id.to_owned(),
                tags,
            };
            match self.run(Which::SetTags, call).await? {
                Answer::Tagged => Ok(()),
                other => Err(self.unexpected(Which::SetTags, other)),
            }
        })
    }
}
