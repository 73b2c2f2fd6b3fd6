//! A failover between two pools' tasks on one shared store, in paused
//! time: the holder is cut off from the store, its lease runs out, the
//! other takes the pool over at that moment and not before, and the first,
//! back in reach, stands by. The store is a fake of the PostgreSQL one's
//! lease semantics (claim, fence and renew by tokio's clock) over one
//! SQLite file both open, so the records the new holder loads are the
//! ones the old holder wrote.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use tokio::time::Instant;

use super::*;
use berth_core::pool::Changes;
use berth_plugin::Gate;
use berth_store::{Holding, Loaded, Store, StoreError, StoreFuture, Tenure};

use crate::runtime::task::STANDBY_POLL;

/// The pool's lease as the fake database keeps it.
#[derive(Debug, Default)]
struct LeaseRow {
    holder: Option<String>,
    epoch: i64,
    expires: Option<Instant>,
}

/// One process's connection to the shared store: its records in the
/// SQLite file every process opens, the lease in the shared row. While
/// `cut`, every call fails as a lost store.
struct SharedStore {
    me: String,
    ttl: Duration,
    records: SqliteStore,
    row: Arc<Mutex<LeaseRow>>,
    cut: Arc<AtomicBool>,
    held: Option<Holding>,
}

impl SharedStore {
    fn open(
        me: &str,
        file: &Path,
        config: &Arc<Config>,
        row: &Arc<Mutex<LeaseRow>>,
        ttl: Duration,
    ) -> (SharedStore, Arc<AtomicBool>) {
        let records = SqliteStore::open(file, config.clone(), Default::default()).expect("store");
        let cut = Arc::new(AtomicBool::new(false));
        let store = SharedStore {
            me: me.into(),
            ttl,
            records,
            row: row.clone(),
            cut: cut.clone(),
            held: None,
        };
        (store, cut)
    }

    fn reach(&self) -> Result<(), StoreError> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(StoreError::TimedOut {
                doing: "reaching the shared store",
                after: self.ttl,
            });
        }
        Ok(())
    }

    fn renewed(&mut self, epoch: i64, now: Instant) -> Holding {
        let held = Holding {
            epoch,
            renewed: now,
            valid_until: now + self.ttl - self.ttl / 5,
            expires: SystemTime::now() + self.ttl,
        };
        self.held = Some(held);
        held
    }

    /// The commit's fence: renews the lease if this process still holds it
    /// under its epoch, and refuses otherwise.
    fn fence(&mut self) -> Result<(), StoreError> {
        self.reach()?;
        let now = Instant::now();
        let epoch = self.held.map(|h| h.epoch);
        let mut row = self.row.lock().unwrap();
        let mine = row.holder.as_deref() == Some(self.me.as_str())
            && Some(row.epoch) == epoch
            && row.expires.is_some_and(|e| now < e);
        if !mine {
            drop(row);
            self.held = None;
            return Err(StoreError::Fenced { epoch });
        }
        row.expires = Some(now + self.ttl);
        let epoch = row.epoch;
        drop(row);
        self.renewed(epoch, now);
        Ok(())
    }
}

impl Store for SharedStore {
    fn reconfigure(&mut self, config: Arc<Config>) {
        self.records.reconfigure(config);
    }

    fn load<'a>(&'a mut self, config: &'a Config) -> StoreFuture<'a, Loaded> {
        if let Err(e) = self.reach() {
            return Box::pin(std::future::ready(Err(e)));
        }
        self.records.load(config)
    }

    fn commit<'a>(&'a mut self, changes: &'a Changes) -> StoreFuture<'a, ()> {
        if let Err(e) = self.fence() {
            return Box::pin(std::future::ready(Err(e)));
        }
        self.records.commit(changes)
    }

    fn confirm(&mut self) -> StoreFuture<'_, ()> {
        Box::pin(std::future::ready(self.fence()))
    }

    fn reconnect(&mut self) -> StoreFuture<'_, ()> {
        Box::pin(std::future::ready(self.reach()))
    }

    fn claim(&mut self) -> StoreFuture<'_, Tenure> {
        let claimed = self.reach().map(|()| {
            let now = Instant::now();
            let mut row = self.row.lock().unwrap();
            let free = row.expires.is_none_or(|e| now >= e);
            let mine = row.holder.as_deref() == Some(self.me.as_str());
            if !free && !mine {
                self.held = None;
                return Tenure::Other {
                    holder: row.holder.clone().unwrap_or_default(),
                    address: format!("http://{}", row.holder.as_deref().unwrap_or("")),
                    expires_in: row.expires.map_or(Duration::ZERO, |e| e - now),
                };
            }
            if free || Some(row.epoch) != self.held.map(|h| h.epoch) {
                row.epoch += 1;
            }
            row.holder = Some(self.me.clone());
            row.expires = Some(now + self.ttl);
            let epoch = row.epoch;
            drop(row);
            Tenure::Held(self.renewed(epoch, now))
        });
        Box::pin(std::future::ready(claimed))
    }

    fn holding(&self) -> Option<Holding> {
        self.held
    }

    fn release(&mut self) -> StoreFuture<'_, ()> {
        let mut row = self.row.lock().unwrap();
        if row.holder.as_deref() == Some(self.me.as_str()) {
            row.expires = Some(Instant::now());
        }
        drop(row);
        self.held = None;
        Box::pin(std::future::ready(Ok(())))
    }
}

/// The shared cloud as one process reaches it: every call it makes is
/// noted with the process and the virtual time.
struct Via {
    who: &'static str,
    cloud: Arc<Fake>,
    log: Arc<Mutex<Vec<(&'static str, Instant)>>>,
}

impl Via {
    fn note(&self) {
        self.log.lock().unwrap().push((self.who, Instant::now()));
    }
}

impl Cloud for Via {
    fn create(&self, spec: CreateSpec) -> BoxFuture<'_, Result<Instance, CallError>> {
        self.note();
        self.cloud.create(spec)
    }
    fn list_page(
        &self,
        filter: Tags,
        cursor: Option<String>,
    ) -> BoxFuture<'_, Result<Page, CallError>> {
        self.note();
        self.cloud.list_page(filter, cursor)
    }
    fn get(&self, ids: Vec<String>) -> BoxFuture<'_, Result<Vec<Instance>, CallError>> {
        self.note();
        self.cloud.get(ids)
    }
    fn delete<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Deletion, CallError>> {
        self.note();
        self.cloud.delete(id)
    }
    fn set_tags<'a>(&'a self, id: &'a str, tags: Tags) -> BoxFuture<'a, Result<(), CallError>> {
        self.note();
        self.cloud.set_tags(id, tags)
    }
}

/// A pool's task of process `who` on `store`, the shared cloud reached
/// through [`Via`], its gate opened as `berth serve` opens it at start.
fn process(
    who: &'static str,
    store: SharedStore,
    config: &Arc<Config>,
    cloud: &Arc<Fake>,
    log: &Arc<Mutex<Vec<(&'static str, Instant)>>>,
    tenure: Tenure,
) -> (Service, Arc<Gate>) {
    let gate = Arc::new(Gate::shut());
    if let Tenure::Held(held) = tenure {
        gate.open_until(held.valid_until);
    }
    let via: Arc<dyn Cloud> = Arc::new(Via {
        who,
        cloud: cloud.clone(),
        log: log.clone(),
    });
    let parts = Parts {
        providers: Providers::fixed(vec![("fake".into(), via)]),
        store: Box::new(store),
        clock: Clock::starting_at(T0),
        observer: Arc::new(Deaf),
        gate: gate.clone(),
        backend: Backend::Embedded,
    };
    (Service::spawn(Pool::new(config.clone(), 7), parts), gate)
}

/// Waits in virtual time, 10 ms a look, until `f` holds.
async fn until_true(what: &str, f: impl Fn() -> bool) {
    for _ in 0..100_000 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never: {what}");
}

fn in_use_by_ci(p: &Pool) -> bool {
    p.nodes()
        .any(|n| matches!(n.state, NodeState::InUse { .. }) && p.requestor_of(n.id) == Some("ci"))
}

#[tokio::test(start_paused = true)]
async fn a_holder_cut_off_from_the_store_is_taken_over_when_its_lease_runs_out_and_not_before() {
    let ttl = secs(10);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("berth.db");
    let config = config(Config::DEFAULT_LEASE_TTL);
    let row = Arc::new(Mutex::new(LeaseRow::default()));
    let cloud = Fake::new(Vec::new());
    let log = Arc::new(Mutex::new(Vec::new()));

    let (mut store_a, cut_a) = SharedStore::open("b0", &file, &config, &row, ttl);
    let tenure = store_a.claim().await.unwrap();
    assert!(matches!(tenure, Tenure::Held(_)), "{tenure:?}");
    let (a, gate_a) = process("b0", store_a, &config, &cloud, &log, tenure);
    let (store_b, _) = SharedStore::open("b1", &file, &config, &row, ttl);
    let (b, gate_b) = process("b1", store_b, &config, &cloud, &log, Tenure::Alone);
    let (ha, hb) = (a.handle.clone(), b.handle.clone());

    // b1 finds at its first step that it does not hold the pool.
    until_true("b1 stands by for b0", || {
        hb.mode()
            == Mode::Standby(Some(Holder {
                name: "b0".into(),
                address: "http://b0".into(),
            }))
    })
    .await;
    let id = ha.submit(one_small()).await.unwrap();
    let served = ha.wait(id).await.unwrap().unwrap();
    assert!(
        matches!(served.state, RequestState::Fulfilled { .. }),
        "{served:?}"
    );

    // b0 loses the store. Its lease was last renewed before this, and runs
    // out at `expires` unless renewed; until then nobody may take over.
    cut_a.store(true, Ordering::SeqCst);
    let cut_at = Instant::now();
    let expires = row.lock().unwrap().expires.unwrap();
    assert!(expires > cut_at && expires <= cut_at + ttl, "{expires:?}");
    let epoch_a = row.lock().unwrap().epoch;
    let renewed = expires - ttl;

    // b0 finds out when its lease is next due for renewal (halfway through
    // the time it is certain for), before the lease stops being certain:
    // from then on it decides nothing and its drivers' gate is shut.
    until_true("b0 finds the store out of reach", || {
        matches!(ha.mode(), Mode::StoreLost(_))
    })
    .await;
    let noticed_at = Instant::now();
    let certain_until = renewed + ttl - ttl / 5;
    assert!(noticed_at <= renewed + (certain_until - renewed) / 2 + Duration::from_millis(20));
    assert!(
        !gate_a.is_open(),
        "the gate is open after the store was lost"
    );

    until_true("b1 holds the pool", || hb.mode() == Mode::Holding).await;
    let taken_at = Instant::now();
    // Not before the lease ran out, and not a standby poll late: a process
    // standing by asks again the moment the holder's lease could expire.
    assert!(taken_at >= expires, "taken {:?} early", expires - taken_at);
    assert!(
        taken_at <= expires + Duration::from_millis(30),
        "taken {:?} late (a standby poll is {STANDBY_POLL:?})",
        taken_at - expires
    );
    assert_eq!(row.lock().unwrap().holder.as_deref(), Some("b1"));
    assert_eq!(row.lock().unwrap().epoch, epoch_a + 1);

    // b0 still decides nothing, says its lease is uncertain, and called no
    // cloud since it found the store out of reach.
    assert!(matches!(ha.mode(), Mode::StoreLost(_)), "{:?}", ha.mode());
    assert!(ha.lease_uncertain().is_some());
    assert!(!gate_a.is_open());
    assert!(gate_b.is_open());
    let late: Vec<_> = (log.lock().unwrap().iter())
        .filter(|(who, at)| *who == "b0" && *at >= noticed_at)
        .map(|(_, at)| *at - cut_at)
        .collect();
    assert!(
        late.is_empty(),
        "b0 called the cloud after it lost the store: {late:?}"
    );

    // The new holder has what the old one stored: the node in use stays
    // with its requestor, and new requests are served.
    until(&hb, "the node in use is still ci's", in_use_by_ci).await;
    let id = hb.submit(one_small()).await.unwrap();
    let served = hb.wait(id).await.unwrap().unwrap();
    assert!(
        matches!(served.state, RequestState::Fulfilled { .. }),
        "{served:?}"
    );

    // Back in reach, b0 finds b1 holding the pool and stands by.
    cut_a.store(false, Ordering::SeqCst);
    until_true("b0 stands by for b1", || {
        ha.mode()
            == Mode::Standby(Some(Holder {
                name: "b1".into(),
                address: "http://b1".into(),
            }))
    })
    .await;
    assert!(!gate_a.is_open());

    b.stop().await.unwrap();
    a.stop().await.unwrap();
}
