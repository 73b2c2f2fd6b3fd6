//! The allocation logic against an in-memory stand-in for the host, with
//! hooks to run another driver instance's writes between two of ours.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use berth_sdk::tags::{NODE_TAG, POOL_TAG};
use berth_sdk::types::CapacityScope;

use super::*;
use crate::config;

/// The host as the driver sees it: records, reachable ports, a clock.
#[derive(Default)]
struct Fake {
    records: RefCell<BTreeMap<String, String>>,
    answering: RefCell<BTreeSet<(String, u16)>>,
    probes: Cell<u32>,
    now: Cell<u64>,
    /// Each runs right before one of the driver's compare-and-swaps, in
    /// order: another call changing the records between our read and write.
    meddle: RefCell<VecDeque<Meddle>>,
}

/// Another call's writes, run on the records.
type Meddle = Box<dyn FnOnce(&Fake)>;

impl Fake {
    fn new() -> Fake {
        let fake = Fake::default();
        fake.now.set(1_000);
        fake
    }

    fn before_next_write(&self, f: impl FnOnce(&Fake) + 'static) {
        self.meddle.borrow_mut().push_back(Box::new(f));
    }

    fn answer(&self, host: &str, port: u16) {
        self.answering.borrow_mut().insert((host.into(), port));
    }

    fn put(&self, key: &str, value: &str) {
        self.records.borrow_mut().insert(key.into(), value.into());
    }

    fn keys(&self) -> Vec<String> {
        self.records.borrow().keys().cloned().collect()
    }
}

impl Env for Fake {
    fn get(&self, key: &str) -> Result<Option<String>, Error> {
        Ok(self.records.borrow().get(key).cloned())
    }

    fn scan(&self, prefix: &str) -> Result<Vec<(String, String)>, Error> {
        Ok(self
            .records
            .borrow()
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn compare_and_swap(
        &self,
        key: &str,
        expected: Option<&str>,
        value: Option<&str>,
    ) -> Result<bool, Error> {
        let meddle = self.meddle.borrow_mut().pop_front();
        if let Some(f) = meddle {
            f(self);
        }
        let mut records = self.records.borrow_mut();
        if records.get(key).map(String::as_str) != expected {
            return Ok(false);
        }
        match value {
            Some(v) => records.insert(key.into(), v.into()),
            None => records.remove(key),
        };
        Ok(true)
    }

    fn probe(&self, host: &str, port: u16, _timeout_ms: u32) -> Result<(), String> {
        self.probes.set(self.probes.get() + 1);
        if self.answering.borrow().contains(&(host.to_owned(), port)) {
            Ok(())
        } else {
            Err("connection refused".into())
        }
    }

    fn now_ms(&self) -> u64 {
        self.now.get()
    }

    fn warn(&self, _message: &str, _fields: &[(&str, &str)]) {}

    fn debug(&self, _message: &str, _fields: &[(&str, &str)]) {}
}

const HOSTS: &str = r#"{"hosts": [
    {"name": "a", "address": "10.0.0.1", "labels": ["small"], "max-parallel-jobs": 2,
     "username": "ci", "host-keys": ["ssh-ed25519 AAAA"]},
    {"name": "b", "address": "b.example.com", "labels": ["small", "large"], "port": 2222},
    {"name": "c", "address": "2001:db8::1", "labels": ["large"]}
]}"#;

fn slots(pool: &str, config: &str) -> Slots {
    Slots {
        pool_id: pool.into(),
        config: config::parse(config).expect("valid config"),
    }
}

fn t(pairs: &[(&str, &str)]) -> Tags {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn spec(pool: &str, node: &str, ty: &str) -> CreateSpec {
    CreateSpec {
        node_id: node.into(),
        token: format!("token-of-{node}"),
        instance_type: ty.into(),
        image: "ignored".into(),
        tags: t(&[(POOL_TAG, pool), (NODE_TAG, node), ("berth-label", "l")]),
        user_data: None,
        ssh_public_key: None,
        options: "{}".into(),
    }
}

fn pool_filter(pool: &str) -> Tags {
    t(&[(POOL_TAG, pool)])
}

/// The contract's types have no `PartialEq`; their `Debug` text shows
/// every field.
fn dbg(value: &impl std::fmt::Debug) -> String {
    format!("{value:?}")
}

fn ids(instances: &[Instance]) -> Vec<&str> {
    instances.iter().map(|i| i.id.as_str()).collect()
}

/// Takes one slot of `host` for another pool, straight into the records.
fn take(fake: &Fake, host: &str, index: u32, pool: &str, node: &str) {
    let record = Record {
        pool: pool.into(),
        node: node.into(),
        instance_type: "small".into(),
        tags: t(&[(POOL_TAG, pool), (NODE_TAG, node)]),
        created_at_ms: 1,
        ready_at_ms: Some(1),
        host: HostSnapshot {
            address: "old".into(),
            username: None,
            port: None,
            host_keys: vec![],
        },
    };
    let slot = SlotId {
        host: host.into(),
        index,
    };
    fake.put(&slot.key(), &record.encode().unwrap());
}

#[test]
fn choose_prefers_fewest_jobs_then_config_order() {
    let config = config::parse(HOSTS).unwrap();
    fn check(config: &Config, taken: &[(&str, u32)], ty: &str, expect: Option<&str>) {
        let taken: Vec<Stored> = taken
            .iter()
            .map(|(h, i)| Stored {
                slot: SlotId {
                    host: (*h).into(),
                    index: *i,
                },
                text: String::new(),
                record: Err("not read".into()),
            })
            .collect();
        let got = choose(config, &taken, ty).map(|(s, _)| s.to_string());
        assert_eq!(got.as_deref(), expect, "taken {taken:?}, type {ty}");
    }
    check(&config, &[], "small", Some("a/0"));
    // a runs one job, b none: b first.
    check(&config, &[("a", 0)], "small", Some("b/0"));
    // One each: config order, lowest free index.
    check(&config, &[("a", 0), ("b", 0)], "small", Some("a/1"));
    check(&config, &[("a", 1), ("b", 0)], "small", Some("a/0"));
    check(&config, &[("a", 0), ("a", 1), ("b", 0)], "small", None);
    check(&config, &[("b", 0)], "large", Some("c/0"));
    check(&config, &[("b", 0), ("c", 0)], "large", None);
    check(&config, &[], "gpu", None);
    // Slots beyond a lowered `max-parallel-jobs` still count as jobs.
    check(&config, &[("a", 5), ("a", 7)], "small", Some("b/0"));
    check(&config, &[("a", 5), ("a", 7), ("b", 0)], "small", None);
    // Records of hosts no longer configured take nothing from the others.
    check(&config, &[("gone", 0)], "small", Some("a/0"));
}

#[test]
fn create_list_set_tags_delete() {
    let fake = Fake::new();
    let s = slots("p", HOSTS);

    let mut first = spec("p", "n-1", "small");
    first.tags.push(("other".into(), "kept".into()));
    let made = s.create(&fake, &first).unwrap();
    assert_eq!(made.id, "a/0");
    assert_eq!(made.state, InstanceState::Running);
    assert_eq!(made.instance_type, "small");
    assert_eq!(made.tags, first.tags, "tags verbatim");
    assert_eq!(made.created_at_ms, Some(1_000));
    assert_eq!(made.addresses.private_ipv4.as_deref(), Some("10.0.0.1"));
    assert_eq!(made.connection.username.as_deref(), Some("ci"));
    assert_eq!(made.connection.port, Some(22));
    assert_eq!(
        made.connection.host_keys,
        vec!["ssh-ed25519 AAAA".to_owned()]
    );

    let second = s.create(&fake, &spec("p", "n-2", "small")).unwrap();
    assert_eq!(second.id, "b/0");
    assert_eq!(second.addresses.hostname.as_deref(), Some("b.example.com"));
    assert_eq!(second.connection.port, Some(2222));
    let third = s.create(&fake, &spec("p", "n-3", "large")).unwrap();
    assert_eq!(third.id, "c/0");
    assert_eq!(third.addresses.ipv6.as_deref(), Some("2001:db8::1"));

    let listed = s.list(&fake, &pool_filter("p")).unwrap();
    assert_eq!(ids(&listed), ["a/0", "b/0", "c/0"]);
    assert_eq!(
        dbg(&listed[0]),
        dbg(&made),
        "list shows what create returned"
    );
    let by_node = s
        .list(&fake, &t(&[(POOL_TAG, "p"), (NODE_TAG, "n-2")]))
        .unwrap();
    assert_eq!(ids(&by_node), ["b/0"]);
    assert!(s.list(&fake, &pool_filter("p-foreign")).unwrap().is_empty());

    // set-tags replaces berth tags only and keeps the pool tag.
    s.set_tags(&fake, "a/0", &t(&[("berth-idle", "hold")]))
        .unwrap();
    let tagged = &s.list(&fake, &pool_filter("p")).unwrap()[0];
    assert_eq!(
        tagged.tags,
        t(&[("other", "kept"), ("berth-idle", "hold"), (POOL_TAG, "p")])
    );
    assert!(matches!(
        s.set_tags(&fake, "a/0", &t(&[(POOL_TAG, "q")])),
        Err(Error::Permanent(_))
    ));
    assert!(matches!(
        s.set_tags(&fake, "a/1", &t(&[])),
        Err(Error::NotFound(_))
    ));

    assert_eq!(
        dbg(&s.limits(&fake).unwrap()),
        dbg(&AccountLimits {
            max_instances: Some(4),
            used_instances: Some(3),
            max_cores: None,
            used_cores: None,
            max_ram_mib: None,
            used_ram_mib: None,
        })
    );

    s.delete(&fake, "a/0").unwrap();
    assert!(matches!(s.delete(&fake, "a/0"), Err(Error::NotFound(_))));
    for bad in ["a", "a/x", "nope/0", "a/00"] {
        assert!(
            matches!(s.delete(&fake, bad), Err(Error::NotFound(_))),
            "{bad}"
        );
    }
    assert_eq!(
        ids(&s.list(&fake, &pool_filter("p")).unwrap()),
        ["b/0", "c/0"]
    );
    // The node's index went with its slot.
    assert!(
        !fake.keys().iter().any(|k| k.contains("n-1")),
        "{:?}",
        fake.keys()
    );
    // The freed slot is taken again.
    assert_eq!(
        s.create(&fake, &spec("p", "n-4", "small")).unwrap().id,
        "a/0"
    );
}

#[test]
fn a_retried_create_returns_the_first_allocation() {
    let fake = Fake::new();
    let s = slots("p", HOSTS);
    let first = s.create(&fake, &spec("p", "n-1", "small")).unwrap();
    fake.now.set(2_000);
    let again = s.create(&fake, &spec("p", "n-1", "small")).unwrap();
    assert_eq!(dbg(&again), dbg(&first));
    assert_eq!(s.list(&fake, &pool_filter("p")).unwrap().len(), 1);

    // A first attempt that stopped before writing the node's index.
    let key = node_key("p", "n-1").unwrap();
    fake.records.borrow_mut().remove(&key);
    let third = s.create(&fake, &spec("p", "n-1", "small")).unwrap();
    assert_eq!(dbg(&third), dbg(&first));
    assert_eq!(fake.get(&key).unwrap().as_deref(), Some("a/0"));
}

#[test]
fn no_free_slot_is_a_capacity_error_for_that_type() {
    let fake = Fake::new();
    let s = slots("p", HOSTS);
    for n in 0..3 {
        s.create(&fake, &spec("p", &format!("n-{n}"), "small"))
            .unwrap();
    }
    match s.create(&fake, &spec("p", "n-9", "small")) {
        Err(Error::Capacity(c)) => {
            assert!(matches!(c.scope, CapacityScope::InstanceType(ref t) if t == "small"))
        }
        other => panic!("{other:?}"),
    }
    // Another type still fits.
    assert_eq!(
        s.create(&fake, &spec("p", "n-8", "large")).unwrap().id,
        "c/0"
    );
    assert!(matches!(
        s.create(&fake, &spec("p", "n-7", "gpu")),
        Err(Error::InvalidConfig(m)) if m.contains("\"gpu\"")
    ));
    let mut opts = spec("p", "n-6", "large");
    opts.options = r#"{"zone": "a"}"#.into();
    assert!(matches!(
        s.create(&fake, &opts),
        Err(Error::InvalidConfig(m)) if m.contains("zone")
    ));
}

#[test]
fn pools_share_the_hosts_but_not_the_records() {
    let fake = Fake::new();
    let p = slots("p", HOSTS);
    let q = slots("q", HOSTS);
    assert_eq!(
        p.create(&fake, &spec("p", "n-1", "small")).unwrap().id,
        "a/0"
    );
    // Same node id in another pool: a node of its own, on the next slot.
    assert_eq!(
        q.create(&fake, &spec("q", "n-1", "small")).unwrap().id,
        "b/0"
    );
    assert_eq!(ids(&p.list(&fake, &pool_filter("p")).unwrap()), ["a/0"]);
    assert_eq!(ids(&q.list(&fake, &pool_filter("q")).unwrap()), ["b/0"]);
    assert!(p.list(&fake, &pool_filter("q")).unwrap().is_empty());
    assert!(matches!(q.delete(&fake, "a/0"), Err(Error::NotFound(_))));
    assert!(matches!(
        q.set_tags(&fake, "a/0", &t(&[])),
        Err(Error::NotFound(_))
    ));
    // A create whose spec names another pool still lands in its own.
    let made = p.create(&fake, &spec("q", "n-2", "small")).unwrap();
    assert_eq!(berth_sdk::tags::tag(&made.tags, POOL_TAG), Some("p"));
    assert_eq!(p.limits(&fake).unwrap().used_instances, Some(3));
}

#[test]
fn a_host_removed_from_the_config_is_still_listed_and_deletable() {
    let fake = Fake::new();
    let before = slots("p", HOSTS);
    before.create(&fake, &spec("p", "n-1", "large")).unwrap(); // b/0
    before.create(&fake, &spec("p", "n-2", "large")).unwrap(); // c/0
    let after = slots(
        "p",
        r#"{"hosts": [{"name": "a", "address": "10.0.0.1", "labels": ["small"]}]}"#,
    );
    let listed = after.list(&fake, &pool_filter("p")).unwrap();
    assert_eq!(ids(&listed), ["b/0", "c/0"]);
    // The details recorded at create time.
    assert_eq!(listed[0].state, InstanceState::Running);
    assert_eq!(
        listed[0].addresses.hostname.as_deref(),
        Some("b.example.com")
    );
    assert_eq!(listed[0].connection.port, Some(2222));
    assert_eq!(listed[1].addresses.ipv6.as_deref(), Some("2001:db8::1"));
    assert_eq!(
        after.limits(&fake).unwrap().max_instances,
        Some(1),
        "only configured slots are offered"
    );
    assert_eq!(after.limits(&fake).unwrap().used_instances, Some(2));
    after.delete(&fake, "b/0").unwrap();
    assert_eq!(ids(&after.list(&fake, &pool_filter("p")).unwrap()), ["c/0"]);
}

#[test]
fn a_ready_check_holds_nodes_pending_until_the_host_answers() {
    let fake = Fake::new();
    let s = slots(
        "p",
        r#"{"hosts": [{"name": "a", "address": "127.0.0.1", "labels": ["small"],
                        "max-parallel-jobs": 3, "ready-check": {"port": 7001}}]}"#,
    );
    let made = s.create(&fake, &spec("p", "n-1", "small")).unwrap();
    assert_eq!(made.state, InstanceState::Pending);
    s.create(&fake, &spec("p", "n-2", "small")).unwrap();
    assert_eq!(fake.probes.get(), 2, "each create probes once");

    let listed = s.list(&fake, &pool_filter("p")).unwrap();
    assert!(listed.iter().all(|i| i.state == InstanceState::Pending));
    assert_eq!(fake.probes.get(), 3, "one probe per host per list");

    fake.answer("127.0.0.1", 7001);
    fake.now.set(5_000);
    let listed = s.list(&fake, &pool_filter("p")).unwrap();
    assert!(listed.iter().all(|i| i.state == InstanceState::Running));
    assert_eq!(fake.probes.get(), 4);

    // Remembered: the host going away later does not make them pending,
    // and no more probes are made for them.
    fake.answering.borrow_mut().clear();
    let listed = s.list(&fake, &pool_filter("p")).unwrap();
    assert!(listed.iter().all(|i| i.state == InstanceState::Running));
    assert_eq!(fake.probes.get(), 4);
    let record = Record::decode(&fake.get("slot/a/0").unwrap().unwrap()).unwrap();
    assert_eq!(record.ready_at_ms, Some(5_000));

    // A create on an answering host is running at once.
    fake.answer("127.0.0.1", 7001);
    let made = s.create(&fake, &spec("p", "n-3", "small")).unwrap();
    assert_eq!(made.state, InstanceState::Running);
}

#[test]
fn a_slot_taken_between_scan_and_claim_is_skipped() {
    let fake = Fake::new();
    let s = slots("p", HOSTS);
    // Another instance takes a/0 right before our claim of it.
    fake.before_next_write(|f| take(f, "a", 0, "p", "n-other"));
    let made = s.create(&fake, &spec("p", "n-1", "small")).unwrap();
    assert_eq!(made.id, "b/0");
    assert_eq!(s.list(&fake, &pool_filter("p")).unwrap().len(), 2);
}

#[test]
fn a_concurrent_create_for_the_same_node_is_returned_not_doubled() {
    let fake = Fake::new();
    let s = slots("p", HOSTS);
    // Another instance creates the same node right before our slot claim:
    // our claim of a/0 fails, and the next scan finds its slot.
    let other = slots("p", HOSTS);
    fake.before_next_write(move |f| {
        assert_eq!(
            other.create(f, &spec("p", "n-1", "small")).unwrap().id,
            "a/0"
        );
    });
    assert_eq!(
        s.create(&fake, &spec("p", "n-1", "small")).unwrap().id,
        "a/0"
    );
    assert_eq!(s.list(&fake, &pool_filter("p")).unwrap().len(), 1);
}

#[test]
fn the_node_index_decides_between_two_claims_for_one_node() {
    let fake = Fake::new();
    let s = slots("p", HOSTS);
    // Our slot claim (a/0) goes through; right before we set the node's
    // index, another create for the same node, which scanned before our
    // claim, has taken b/0 and set the index.
    fake.before_next_write(|_| {});
    fake.before_next_write(|f| {
        take(f, "b", 0, "p", "n-1");
        f.put(&node_key("p", "n-1").unwrap(), "b/0");
    });
    let made = s.create(&fake, &spec("p", "n-1", "small")).unwrap();
    assert_eq!(made.id, "b/0");
    assert_eq!(ids(&s.list(&fake, &pool_filter("p")).unwrap()), ["b/0"]);
    assert!(
        fake.get("slot/a/0").unwrap().is_none(),
        "our claim was freed"
    );
}

#[test]
fn a_stale_node_index_is_taken_over() {
    let fake = Fake::new();
    let s = slots("p", HOSTS);
    let key = node_key("p", "n-1").unwrap();
    fake.put(&key, "a/1"); // names a slot that is free
    assert_eq!(
        s.create(&fake, &spec("p", "n-1", "small")).unwrap().id,
        "a/0"
    );
    assert_eq!(fake.get(&key).unwrap().as_deref(), Some("a/0"));
    // An index naming another node's slot is stale too.
    take(&fake, "b", 0, "p", "n-other");
    fake.put(&node_key("p", "n-2").unwrap(), "b/0");
    assert_eq!(
        s.create(&fake, &spec("p", "n-2", "small")).unwrap().id,
        "a/1"
    );
}

#[test]
fn writes_that_lose_a_race_read_again() {
    let fake = Fake::new();
    let s = slots("p", HOSTS);
    s.create(&fake, &spec("p", "n-1", "small")).unwrap();
    // Another call changes the tags right before our set-tags writes: ours
    // is retried on the new record, and the last write wins.
    let other = slots("p", HOSTS);
    fake.before_next_write(move |f| {
        other
            .set_tags(f, "a/0", &t(&[("berth-idle", "drain")]))
            .unwrap();
    });
    s.set_tags(&fake, "a/0", &t(&[("berth-idle", "hold")]))
        .unwrap();
    let listed = s.list(&fake, &pool_filter("p")).unwrap();
    assert_eq!(
        listed[0].tags,
        t(&[("berth-idle", "hold"), (POOL_TAG, "p")])
    );

    // A delete racing a tag change still deletes.
    let other = slots("p", HOSTS);
    fake.before_next_write(|_| {}); // the node index removal
    fake.before_next_write(move |f| {
        other.set_tags(f, "a/0", &t(&[("berth-x", "1")])).unwrap();
    });
    s.delete(&fake, "a/0").unwrap();
    assert!(s.list(&fake, &pool_filter("p")).unwrap().is_empty());
}

#[test]
fn an_unreadable_record_keeps_its_slot_and_is_nobodys() {
    let fake = Fake::new();
    let s = slots("p", HOSTS);
    fake.put("slot/a/0", "not json");
    assert!(s.list(&fake, &pool_filter("p")).unwrap().is_empty());
    assert_eq!(
        s.create(&fake, &spec("p", "n-1", "small")).unwrap().id,
        "b/0"
    );
    assert!(matches!(s.delete(&fake, "a/0"), Err(Error::Permanent(_))));
    assert_eq!(s.limits(&fake).unwrap().used_instances, Some(2));
}
