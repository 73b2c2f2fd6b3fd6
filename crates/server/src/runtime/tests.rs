//! The pool's task on fake providers, in paused time: every timer, retry,
//! backoff, lease and grace below runs in tokio's virtual clock, so a test
//! that waits out 90 seconds of `retry-after` or a 10-minute lease takes
//! milliseconds, and "nothing happened before t" is exact instead of a real
//! sleep that hopes.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::observer::Deaf;
use super::*;
use berth_config::{Config, Label, LabelIx, LabelKind, Offer, Provider, ProviderIx, Timings};
use berth_core::driver::{
    Addresses, Call, CapacityScope, Connection, CreateSpec, DriverError, InstanceState,
};
use berth_core::driver::{Instance, Page, Tags};
use berth_core::pool::{NewRequest, Pool, Time};
use berth_core::pool::{NodeState, RequestState};
use berth_plugin::Deletion;
use berth_plugin::{CallError, CallErrorKind};
use berth_store::SqliteStore;

mod failover;

/// Where every test's wall clock starts.
const T0: Time = Time(1_700_000_000_000);

/// A provider's cloud in memory. Creates answer from `script` first (an
/// error, or `None` to hang forever), then succeed; every call is recorded
/// with the virtual time since the test began.
struct Fake {
    began: tokio::time::Instant,
    instances: Mutex<BTreeMap<String, Instance>>,
    calls: Mutex<Vec<(Call, Duration)>>,
    script: Mutex<VecDeque<Option<DriverError>>>,
}

impl Fake {
    fn new(script: Vec<Option<DriverError>>) -> Arc<Fake> {
        Arc::new(Fake {
            began: tokio::time::Instant::now(),
            instances: Mutex::default(),
            calls: Mutex::default(),
            script: Mutex::new(script.into()),
        })
    }

    fn record(&self, call: Call) {
        let at = self.began.elapsed();
        self.calls.lock().unwrap().push((call, at));
    }

    /// When each call of this kind was made, since the test began.
    fn times(&self, call: Call) -> Vec<Duration> {
        let calls = self.calls.lock().unwrap();
        calls.iter().filter(|c| c.0 == call).map(|c| c.1).collect()
    }

    fn error(&self, call: Call, e: DriverError) -> CallError {
        CallError {
            provider: "fake".into(),
            call,
            kind: CallErrorKind::Driver(e),
        }
    }
}

impl Cloud for Fake {
    fn create(&self, spec: CreateSpec) -> BoxFuture<'_, Result<Instance, CallError>> {
        Box::pin(async move {
            self.record(Call::Create);
            let next = self.script.lock().unwrap().pop_front();
            match next {
                Some(Some(e)) => return Err(self.error(Call::Create, e)),
                Some(None) => std::future::pending::<()>().await,
                None => {}
            }
            let id = format!("i-{}", spec.node_id);
            let instance = Instance {
                id: id.clone(),
                state: InstanceState::Running,
                instance_type: spec.instance_type,
                tags: spec.tags,
                addresses: Addresses::default(),
                created_at_ms: None,
                connection: Connection::default(),
                failure: None,
            };
            self.instances.lock().unwrap().insert(id, instance.clone());
            Ok(instance)
        })
    }

    /// Every instance on one page.
    fn list_page(
        &self,
        filter: Tags,
        _cursor: Option<String>,
    ) -> BoxFuture<'_, Result<Page, CallError>> {
        Box::pin(async move {
            self.record(Call::List);
            let all = self.instances.lock().unwrap();
            let matches = |i: &&Instance| filter.iter().all(|(k, v)| i.tags.get(k) == Some(v));
            Ok(Page {
                instances: all.values().filter(matches).cloned().collect(),
                next: None,
            })
        })
    }

    fn get(&self, ids: Vec<String>) -> BoxFuture<'_, Result<Vec<Instance>, CallError>> {
        Box::pin(async move {
            self.record(Call::Get);
            let all = self.instances.lock().unwrap();
            Ok(ids.iter().filter_map(|id| all.get(id)).cloned().collect())
        })
    }

    fn delete<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Deletion, CallError>> {
        Box::pin(async move {
            self.record(Call::Delete);
            Ok(match self.instances.lock().unwrap().remove(id) {
                Some(_) => Deletion::Deleted,
                None => Deletion::AlreadyGone,
            })
        })
    }

    fn set_tags<'a>(&'a self, id: &'a str, tags: Tags) -> BoxFuture<'a, Result<(), CallError>> {
        Box::pin(async move {
            self.record(Call::SetTags);
            if let Some(i) = self.instances.lock().unwrap().get_mut(id) {
                i.tags.extend(tags);
            }
            Ok(())
        })
    }
}

/// One provider `fake`, one label `small` on it (single use, nothing kept
/// ready), and the pool's task running on them with an in-memory store.
fn start(fake: &Arc<Fake>, lease_ttl: Duration) -> Service {
    start_on(fake.clone(), lease_ttl)
}

/// [`start`] on any [`Cloud`].
fn start_on(cloud: Arc<dyn Cloud>, lease_ttl: Duration) -> Service {
    let config = config(lease_ttl);
    let store = SqliteStore::open_in_memory(config.clone()).expect("store");
    let parts = Parts {
        providers: Providers::fixed(vec![("fake".into(), cloud)]),
        store: Box::new(store),
        clock: Clock::starting_at(T0),
        observer: Arc::new(Deaf),
        gate: Arc::new(berth_plugin::Gate::always()),
        backend: Backend::Embedded,
    };
    Service::spawn(Pool::new(config, 7), parts)
}

/// The config of [`start`]: provider `fake`, label `small`, requestor
/// leases of `lease_ttl`.
fn config(lease_ttl: Duration) -> Arc<Config> {
    let offer = Offer {
        provider: ProviderIx(0),
        instance_type: "s".into(),
        image: "img".into(),
        options: "{}".into(),
        vcpus: 1,
        ram_mib: 1024,
        price: 1.0,
    };
    let label = Label {
        // The fake's instances have nothing to probe.
        ready: berth_config::Readiness::RUNNING,
        ..Label::new(
            "small",
            LabelKind::Machine {
                offers: vec![offer],
            },
        )
    };
    Arc::new(Config {
        pool_id: "paused".into(),
        timings: Timings::default(),
        providers: vec![Provider::new("fake")],
        labels: vec![label],
        requestor_lease_ttl: lease_ttl,
        requestor_caps: Default::default(),
    })
}

fn one_small() -> NewRequest {
    NewRequest {
        requestor: "ci".into(),
        priority: 0,
        wants: vec![(LabelIx(0), 1)],
        ..NewRequest::default()
    }
}

/// Waits (in virtual time) until `f` holds of the pool.
async fn until(h: &Handle, what: &str, f: impl Fn(&Pool) -> bool + Send + Sync + 'static) {
    let f = Arc::new(f);
    for _ in 0..100_000 {
        let f = f.clone();
        if h.inspect(move |p| f(p)).await.unwrap() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("never: {what}");
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// Asks for one node from a cloud whose creates answer `script` first;
/// when each create was made, once the request is fulfilled.
async fn creates_until_fulfilled(script: Vec<Option<DriverError>>) -> Vec<Duration> {
    let fake = Fake::new(script);
    let service = start(&fake, Config::DEFAULT_LEASE_TTL);
    let h = service.handle.clone();
    let id = h.submit(one_small()).await.unwrap();
    let request = h.wait(id).await.unwrap().expect("the request");
    assert!(
        matches!(request.state, RequestState::Fulfilled { .. }),
        "{request:?}"
    );
    service.stop().await.unwrap();
    fake.times(Call::Create)
}

/// The one create after a refusal comes when the pause it set is over:
/// not before (nothing reaches the cloud in between), and not a poll late.
async fn paused_then_made_once(refusal: DriverError, pause: Duration) {
    let creates = creates_until_fulfilled(vec![Some(refusal)]).await;
    assert_eq!(creates.len(), 2, "{creates:?}");
    let gap = creates[1] - creates[0];
    assert!(gap >= pause && gap < pause + secs(1), "{gap:?}");
}

#[tokio::test(start_paused = true)]
async fn a_rate_limited_create_is_made_again_exactly_when_the_cloud_said() {
    let refusal = DriverError::RateLimited {
        retry_after: secs(90),
        message: "slow down".into(),
    };
    paused_then_made_once(refusal, secs(90)).await;
}

#[tokio::test(start_paused = true)]
async fn creates_stay_paused_after_quota_exceeded_for_the_quota_pause() {
    let refusal = DriverError::QuotaExceeded("instance limit".into());
    paused_then_made_once(refusal, Timings::DEFAULT_QUOTA_PAUSE).await;
}

#[tokio::test(start_paused = true)]
async fn an_instance_type_out_of_capacity_is_paused_for_the_capacity_pause() {
    let refusal = DriverError::Capacity {
        scope: CapacityScope::InstanceType("s".into()),
        message: "none left".into(),
    };
    paused_then_made_once(refusal, Timings::DEFAULT_CAPACITY_PAUSE).await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_create_is_made_again_after_a_backoff_that_doubles() {
    let transient = || Some(DriverError::Transient("try again".into()));
    let t = creates_until_fulfilled(vec![transient(), transient(), transient()]).await;
    assert_eq!(t.len(), 4, "{t:?}");
    let gaps: Vec<Duration> = t.windows(2).map(|w| w[1] - w[0]).collect();
    for (gap, want) in gaps.iter().zip([secs(1), secs(2), secs(4)]) {
        assert!(*gap >= want && *gap < want + secs(1), "{gaps:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_lapsed_lease_gives_its_nodes_back_at_the_ttl_and_not_before() {
    let fake = Fake::new(Vec::new());
    let service = start(&fake, secs(600));
    let h = service.handle.clone();
    let id = h.submit_renewing(one_small(), secs(600)).await.unwrap();
    let request = h.wait(id).await.unwrap().expect("the request");
    assert!(
        matches!(request.state, RequestState::Fulfilled { .. }),
        "{request:?}"
    );
    let node = request.nodes[0];
    let handed = fake.began.elapsed();

    // A second short of the lease, the node is still the requestor's.
    tokio::time::sleep(secs(599) - handed).await;
    let state = h
        .inspect(move |p| p.node(node).unwrap().state.clone())
        .await;
    assert!(matches!(state, Ok(NodeState::InUse { .. })), "{state:?}");
    assert!(fake.times(Call::Delete).is_empty());

    // Past it, the node is returned as the requestor would have, and (single
    // use) its instance deleted.
    until(&h, "the node deleted", move |p| {
        p.node(node).is_some_and(|n| n.state.is_final())
    })
    .await;
    let deleted = fake.times(Call::Delete);
    assert_eq!(deleted.len(), 1);
    assert!(
        deleted[0] >= secs(600) && deleted[0] < secs(602),
        "{deleted:?}"
    );
    service.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_stop_waits_out_its_grace_for_a_hung_call_and_no_longer() {
    let fake = Fake::new(vec![None]);
    let service = start(&fake, Config::DEFAULT_LEASE_TTL);
    let h = service.handle.clone();
    h.submit(one_small()).await.unwrap();
    let f = fake.clone();
    until(&h, "the create made", move |_| {
        !f.times(Call::Create).is_empty()
    })
    .await;

    let asked = tokio::time::Instant::now();
    service.stop_within(secs(30)).await.expect("a clean stop");
    let took = asked.elapsed();
    assert!(took >= secs(30) && took < secs(31), "{took:?}");
    // The create's intent was stored; what became of it is the next
    // start's to find out, by listing.
    assert_eq!(fake.times(Call::Create).len(), 1);
}

/// A cloud that takes creates in batches and answers its first batch with
/// no result at all, then each as [`Fake`] would.
struct Miscounting {
    fake: Arc<Fake>,
    answered: AtomicBool,
}

impl Cloud for Miscounting {
    fn create(&self, spec: CreateSpec) -> BoxFuture<'_, Result<Instance, CallError>> {
        self.fake.create(spec)
    }
    fn list_page(
        &self,
        filter: Tags,
        cursor: Option<String>,
    ) -> BoxFuture<'_, Result<Page, CallError>> {
        self.fake.list_page(filter, cursor)
    }
    fn get(&self, ids: Vec<String>) -> BoxFuture<'_, Result<Vec<Instance>, CallError>> {
        self.fake.get(ids)
    }
    fn delete<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Deletion, CallError>> {
        self.fake.delete(id)
    }
    fn set_tags<'a>(&'a self, id: &'a str, tags: Tags) -> BoxFuture<'a, Result<(), CallError>> {
        self.fake.set_tags(id, tags)
    }
    fn batches(&self) -> berth_core::pool::Batches {
        berth_core::pool::Batches {
            create: true,
            delete: true,
        }
    }
    fn create_many(&self, specs: Vec<CreateSpec>) -> BoxFuture<'_, providers::Many<Instance>> {
        Box::pin(async move {
            if !self.answered.swap(true, Ordering::SeqCst) {
                return Ok(Vec::new());
            }
            let mut all = Vec::new();
            for spec in specs {
                all.push(Ok(self.fake.create(spec).await.expect("a fake create")));
            }
            Ok(all)
        })
    }
}

/// A batch answered with another number of results than it had items
/// believes none of them: each node's try fails and is made again, and no
/// node is left waiting for an answer that never comes.
#[tokio::test(start_paused = true)]
async fn a_batch_answered_with_the_wrong_number_of_results_is_tried_again() {
    let fake = Fake::new(Vec::new());
    let cloud: Arc<dyn Cloud> = Arc::new(Miscounting {
        fake: fake.clone(),
        answered: AtomicBool::new(false),
    });
    let service = start_on(cloud, Config::DEFAULT_LEASE_TTL);
    let h = service.handle.clone();
    let two = NewRequest {
        wants: vec![(LabelIx(0), 2)],
        ..one_small()
    };
    let id = h.submit(two).await.unwrap();
    let request = tokio::time::timeout(secs(600), h.wait(id))
        .await
        .expect("the request settles")
        .unwrap()
        .expect("the request");
    assert!(
        matches!(request.state, RequestState::Fulfilled { .. }),
        "{request:?}"
    );
    assert_eq!(
        fake.times(Call::Create).len(),
        2,
        "two instances, once each"
    );
    service.stop().await.unwrap();
}
