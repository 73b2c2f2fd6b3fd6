//! Store round trips: every state, role and request shape survives a commit
//! and a reopen; records that no longer fit are dropped or failed with a
//! note; the schema is versioned; a slot cannot be held twice.
//!
//! The tests of what every store must do run on both backends
//! ([`on_both_backends!`]): as `NAME::sqlite` on a SQLite file and as
//! `NAME::postgres` on a fresh database of this test process's throwaway
//! PostgreSQL cluster (tests/support/postgres.rs; `scripts/setup tests` installs
//! PostgreSQL 15). What only one backend has (SQLite's WAL and
//! `user_version`, PostgreSQL's `berth_schema` and migration lock) is tested
//! on that one.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rusqlite::Connection;

use super::*;
use berth_config::StoreSync;
use berth_core::config::{Config, Label, LabelIx, LabelKind, Offer, Provider, ProviderIx, Timings};
use berth_core::driver::{Addresses, Connection as Login};
use berth_core::pool::{
    Changes, DeleteReason, Endpoint, GoneReason, Identity, Idle, Node, NodeId, NodeState, Packing,
    Request, RequestId, RequestState, RequestorLease, Resources, Time,
};

const BIG: LabelIx = LabelIx(0);
const SLOT: LabelIx = LabelIx(1);
const SMALL: LabelIx = LabelIx(2);
const A: ProviderIx = ProviderIx(0);
const B: ProviderIx = ProviderIx(1);
const T: Time = Time(1_700_000_000_000);

fn provider(name: &str) -> Provider {
    Provider::new(name)
}

fn label(name: &str, kind: LabelKind) -> Label {
    Label::new(name, kind)
}

fn machine(provider: ProviderIx) -> LabelKind {
    LabelKind::Machine {
        offers: vec![Offer {
            provider,
            instance_type: "big".into(),
            image: "img".into(),
            options: "{}".into(),
            vcpus: 8,
            ram_mib: 32768,
            price: 0.25,
        }],
    }
}

/// Providers `a`, `b`; labels `big` (machine), `slot` (3 slots on `big`),
/// `small` (machine on `b`).
fn config() -> Config {
    Config {
        pool_id: "p".into(),
        timings: Timings::default(),
        providers: vec![provider("a"), provider("b")],
        labels: vec![
            label("big", machine(A)),
            label(
                "slot",
                LabelKind::Slots {
                    slots: 3,
                    backing: BIG,
                    grace_time: Duration::from_secs(60),
                },
            ),
            label("small", machine(B)),
        ],
        requestor_lease_ttl: Config::DEFAULT_LEASE_TTL,
        requestor_caps: Default::default(),
    }
}

/// `config()` with label `old` renamed to `new` (or provider, by `providers`).
fn renamed(old: &str, new: &str) -> Config {
    let mut c = config();
    for l in &mut c.labels {
        if l.name == old {
            l.name = new.into();
        }
    }
    for p in &mut c.providers {
        if p.name == old {
            p.name = new.into();
        }
    }
    c
}

/// Which store a test of [`on_both_backends!`] runs on.
#[derive(Clone, Copy, Debug)]
enum Backend {
    Sqlite,
    Postgres,
}

/// An open store of either backend, with what a test needs to look under it:
/// row counts, raw SQL, a reopen.
#[allow(clippy::large_enum_variant)] // a handful per test
enum Db {
    Sqlite {
        store: SqliteStore,
        dir: Arc<tempfile::TempDir>,
    },
    Postgres {
        store: PgStore,
        url: String,
    },
}

#[path = "../../../tests/support/postgres.rs"]
#[allow(dead_code)]
mod cluster;

fn workspace_root() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

impl Backend {
    /// A new, empty store.
    async fn fresh(self) -> Db {
        match self {
            Backend::Sqlite => {
                let dir = Arc::new(tempfile::tempdir().unwrap());
                Db::sqlite(dir).await
            }
            Backend::Postgres => {
                let url = cluster::PgCluster::shared(&workspace_root()).fresh_database("store");
                Db::postgres(url).await
            }
        }
    }
}

impl Db {
    async fn sqlite(dir: Arc<tempfile::TempDir>) -> Db {
        let path = dir.path().join("berth.db");
        let store = SqliteStore::open(&path, Arc::new(config()), StoreSync::Normal).expect("open");
        Db::Sqlite { store, dir }
    }

    async fn postgres(url: String) -> Db {
        let store = PgStore::connect(&url, None, Arc::new(config()))
            .await
            .expect("connect");
        Db::Postgres { store, url }
    }

    /// Closes the store and opens the same database again.
    async fn reopen(self) -> Db {
        match self {
            Db::Sqlite { store, dir } => {
                drop(store);
                Db::sqlite(dir).await
            }
            Db::Postgres { store, url } => {
                drop(store);
                Db::postgres(url).await
            }
        }
    }

    /// A second store on the same database, as another writer.
    async fn other(&self) -> Db {
        match self {
            Db::Sqlite { dir, .. } => Db::sqlite(dir.clone()).await,
            Db::Postgres { url, .. } => Db::postgres(url.clone()).await,
        }
    }

    /// Runs `sql` (one or more statements) outside the store.
    async fn try_exec(&self, sql: &str) -> Result<(), String> {
        match self {
            Db::Sqlite { store, .. } => store.conn.execute_batch(sql).map_err(|e| e.to_string()),
            Db::Postgres { store, .. } => store
                .client()
                .batch_execute(sql)
                .await
                .map_err(|e| format!("{e:?}")),
        }
    }

    async fn exec(&self, sql: &str) {
        if let Err(e) = self.try_exec(sql).await {
            panic!("{sql}: {e}");
        }
    }

    /// The integers of the first row `sql` returns.
    async fn ints(&self, sql: &str) -> Vec<i64> {
        match self {
            Db::Sqlite { store, .. } => store
                .conn
                .query_row(sql, [], |r| {
                    (0..r.as_ref().column_count())
                        .map(|i| r.get(i))
                        .collect::<Result<Vec<i64>, _>>()
                })
                .expect(sql),
            Db::Postgres { store, .. } => {
                let row = store.client().query_one(sql, &[]).await.expect(sql);
                (0..row.len()).map(|i| row.get(i)).collect()
            }
        }
    }

    async fn count(&self, table: &str) -> i64 {
        self.ints(&format!("SELECT count(*) FROM {table}")).await[0]
    }

    /// The names of `table`'s columns, sorted.
    async fn columns(&self, table: &str) -> Vec<String> {
        let mut names: Vec<String> = match self {
            Db::Sqlite { store, .. } => {
                let mut q = store
                    .conn
                    .prepare("SELECT name FROM pragma_table_info(?1)")
                    .unwrap();
                q.query_map([table], |r| r.get(0))
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap()
            }
            Db::Postgres { store, .. } => store
                .client()
                .query(
                    "SELECT column_name::TEXT FROM information_schema.columns \
                     WHERE table_schema = current_schema() AND table_name = $1",
                    &[&table],
                )
                .await
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect(),
        };
        names.sort();
        names
    }

    /// The schema version the store is at.
    async fn schema_version(&self) -> u32 {
        match self {
            Db::Sqlite { store, .. } => store.schema_version().unwrap(),
            Db::Postgres { store, .. } => store.schema_version().await.unwrap(),
        }
    }
}

impl Store for Db {
    fn reconfigure(&mut self, config: std::sync::Arc<Config>) {
        match self {
            Db::Sqlite { store, .. } => store.reconfigure(config),
            Db::Postgres { store, .. } => store.reconfigure(config),
        }
    }

    fn load<'a>(&'a mut self, config: &'a Config) -> StoreFuture<'a, Loaded> {
        match self {
            Db::Sqlite { store, .. } => store.load(config),
            Db::Postgres { store, .. } => store.load(config),
        }
    }

    fn commit<'a>(&'a mut self, changes: &'a Changes) -> StoreFuture<'a, ()> {
        match self {
            Db::Sqlite { store, .. } => store.commit(changes),
            Db::Postgres { store, .. } => store.commit(changes),
        }
    }
}

/// What a failed statement was doing, whichever backend ran it.
fn doing(e: &StoreError) -> &'static str {
    match e {
        StoreError::Sql { doing, .. } | StoreError::Postgres { doing, .. } => doing,
        e => panic!("not a statement's error: {e:?}"),
    }
}

/// Each named `async fn NAME(backend: Backend)` runs as two tests,
/// `NAME::sqlite` and `NAME::postgres`.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn sqlite() {
                super::$name(super::Backend::Sqlite).await
            }
            #[tokio::test]
            async fn postgres() {
                super::$name(super::Backend::Postgres).await
            }
        }
    )*};
}

on_both_backends!(
    every_node_state_idle_and_endpoint_round_trips_across_a_reopen,
    backing_and_slot_roles_round_trip_through_the_slots_table,
    every_request_state_round_trips_with_wants_and_nodes_in_order,
    a_second_commit_replaces_rows_and_bumps_their_version,
    purges_remove_rows_and_a_freed_slot_leaves_the_slots_table,
    one_node_in_two_slots_is_refused_and_the_commit_writes_nothing,
    two_nodes_in_one_slot_are_refused_and_the_commit_writes_nothing,
    nodes_naming_an_unconfigured_label_or_provider_are_dropped_with_a_note,
    an_unconfigured_slot_label_drops_the_backing_and_its_slot_rows,
    a_pending_request_for_an_unconfigured_label_is_failed_and_frees_its_nodes,
    slot_rows_that_do_not_join_are_ignored_and_a_slotless_slot_node_ends,
    unknown_text_in_a_row_is_corrupt_naming_table_id_and_column,
    ten_thousand_nodes_commit_and_load_back,
    leases_round_trip_and_expired_ones_are_removed,
    a_commit_over_rows_written_elsewhere_is_refused_whole_until_reloaded,
    a_store_has_one_identity_for_life_and_records_its_confirmation,
    the_row_tables_have_the_columns_rows_are_written_with,
    a_store_from_before_the_failure_columns_loads_its_rows_without_one,
    a_requests_unreadable_metadata_or_key_is_left_out_with_a_note,
);

fn node(id: u64, state: NodeState) -> Node {
    Node {
        id: NodeId(id),
        label: BIG,
        provider: A,
        instance_type: "big".into(),
        resources: Resources {
            vcpus: 8,
            ram_mib: 32768,
        },
        price: 0.25,
        instance: Some(format!("i-{id}")),
        state,
        idle: Idle::Run,
        packing: Packing::Plain,
        assigned: None,
        created: Time(5),
        endpoint: None,
        failure: None,
    }
}

fn ready(id: u64) -> Node {
    node(id, NodeState::Ready { since: T })
}

fn backing(id: u64, slots: Vec<Option<u64>>) -> Node {
    let mut n = ready(id);
    n.packing = Packing::Backing {
        slot_label: SLOT,
        slots: slots.into_iter().map(|s| s.map(NodeId)).collect(),
        free_since: None,
    };
    n
}

fn slot_node(id: u64, backing: u64, index: u16, state: NodeState) -> Node {
    let mut n = node(id, state);
    n.label = SLOT;
    n.instance = None;
    n.resources = Resources::default();
    n.price = 0.0;
    n.packing = Packing::Slot {
        backing: NodeId(backing),
        index,
    };
    n
}

fn request(id: u64, state: RequestState) -> Request {
    Request {
        id: RequestId(id),
        requestor: "ci".into(),
        priority: 0,
        created: T,
        wants: vec![(BIG, 1)],
        state,
        nodes: vec![],
        failures: 0,
        last_failure: None,
        key: None,
        metadata: Default::default(),
    }
}

fn nodes(n: Vec<Node>) -> Changes {
    Changes {
        nodes: n,
        ..Default::default()
    }
}

fn requests(r: Vec<Request>) -> Changes {
    Changes {
        requests: r,
        ..Default::default()
    }
}

async fn load(store: &mut impl Store) -> Loaded {
    store.load(&config()).await.expect("load")
}

fn count(store: &SqliteStore, table: &str) -> i64 {
    store
        .conn
        .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
        .expect("count")
}

fn sorted(mut nodes: Vec<Node>) -> Vec<Node> {
    nodes.sort_by_key(|n| n.id);
    nodes
}

fn every_state() -> Vec<Node> {
    let states = [
        NodeState::Creating {
            since: T,
            attempt: 2,
        },
        NodeState::Booting { since: T },
        NodeState::Ready { since: T },
        NodeState::InUse {
            request: RequestId(77),
            since: T,
        },
        NodeState::Used { since: T },
        NodeState::Deleting {
            since: T,
            reason: DeleteReason::BootTimeout,
        },
        NodeState::Gone {
            since: T,
            reason: GoneReason::Vanished,
        },
        NodeState::Failed {
            since: T,
            reason: "no image `x`".into(),
        },
    ];
    let mut out: Vec<Node> = (1..).zip(states).map(|(i, s)| node(i, s)).collect();
    out[0].instance = None;
    out[0].assigned = Some(RequestId(78));
    out[1].idle = Idle::Hold;
    out[2].idle = Idle::Drain;
    out[2].provider = B;
    out[2].label = SMALL;
    out[2].endpoint = Some(Box::new(Endpoint {
        addresses: Addresses {
            public_ipv4: Some("203.0.113.9".into()),
            private_ipv4: Some("10.0.0.1".into()),
            ipv6: Some("2001:db8::1".into()),
            hostname: Some("n3.example".into()),
        },
        connection: Login {
            username: Some("berth".into()),
            port: Some(2222),
            host_keys: vec!["ssh-ed25519 AAA".into(), "ssh-rsa BBB".into()],
        },
    }));
    out[3].endpoint = Some(Box::default());
    // Why a launch try failed: on a node trying again, on one deleted for
    // it, on one given up.
    out[0].failure = Some("create: transient error: try again".into());
    out[5].failure = Some("not running after the boot timeout (600s)".into());
    out[7].failure = Some("create: permanent error: no image `x` — nötig\\n…".into());
    out
}

/// The words in the enum columns are a file format: a database written by
/// one version is read by the next. They come from the core's variant names,
/// so renaming a variant, or adding one, must fail here and not in a user's
/// store.
#[tokio::test]
async fn the_stored_words_are_pinned() {
    use berth_core::pool::{NodeStateName, PackingName, RequestStateName};
    use strum::VariantNames;
    let pinned: [(&str, &[&str]); 6] = [
        (
            "nodes.state",
            &[
                "creating", "booting", "ready", "in-use", "used", "deleting", "gone", "failed",
            ],
        ),
        (
            "nodes.reason (deleting)",
            &[
                "released",
                "recycled",
                "idle-timeout",
                "boot-timeout",
                "drained",
                "admin",
                "slots-idle",
                "launch-failed",
                "evicted",
                "instance-failed",
            ],
        ),
        (
            "nodes.reason (gone)",
            &[
                "deleted",
                "vanished",
                "slot-freed",
                "backing-lost",
                "aborted",
            ],
        ),
        ("nodes.idle", &["run", "hold", "drain"]),
        ("nodes.packing", &["plain", "backing", "slot"]),
        (
            "requests.state",
            &["pending", "fulfilled", "failed", "cancelled"],
        ),
    ];
    let have: [&[&str]; 6] = [
        NodeStateName::VARIANTS,
        DeleteReason::VARIANTS,
        GoneReason::VARIANTS,
        Idle::VARIANTS,
        PackingName::VARIANTS,
        RequestStateName::VARIANTS,
    ];
    for ((column, want), have) in pinned.iter().zip(have) {
        assert_eq!(have, *want, "{column}");
    }
    // And each word reads back as what wrote it.
    for word in pinned[0].1 {
        assert_eq!(word.parse::<NodeStateName>().map(|_| ()), Ok(()), "{word}");
    }
    for word in pinned[1].1 {
        let r: DeleteReason = word.parse().unwrap();
        assert_eq!(r.as_str(), *word);
    }
    for word in pinned[2].1 {
        let r: GoneReason = word.parse().unwrap();
        assert_eq!(r.as_str(), *word);
    }
    for word in pinned[3].1 {
        let r: Idle = word.parse().unwrap();
        assert_eq!(r.as_str(), *word);
        // Tags are written with its Display.
        assert_eq!(r.to_string(), *word);
    }
    // So are the columns rows are written and read with: a column renamed
    // or added takes a schema step on each backend
    // (`the_row_tables_have_the_columns_rows_are_written_with`).
    assert_eq!(
        rows::NodeRow::COLUMNS,
        "id, label, provider, instance_type, vcpus, ram_mib, price, instance, state, since, \
         attempt, request, reason, idle, packing, slot_label, slot_count, free_since, \
         slot_backing, slot_index, assigned, created, endpoint, failure"
    );
    assert_eq!(
        rows::RequestRow::COLUMNS,
        "id, requestor, priority, created, state, at, reason, failures, last_failure, \
         idempotency_key, metadata"
    );
}

/// The schema steps make the columns the rows are written and read with
/// (and each row's `version`), on either backend.
async fn the_row_tables_have_the_columns_rows_are_written_with(backend: Backend) {
    let store = backend.fresh().await;
    for (table, columns) in [
        ("nodes", rows::NodeRow::COLUMNS),
        ("requests", rows::RequestRow::COLUMNS),
    ] {
        let mut want: Vec<String> = columns.split(", ").map(str::to_owned).collect();
        want.push("version".into());
        want.sort();
        assert_eq!(store.columns(table).await, want, "{table}");
    }
}

/// A request row whose metadata is not what the API takes (not a JSON
/// object of strings, a value with a direction-changing character) or
/// whose idempotency key is not one (written by hand, by another tool) is
/// loaded without it, with a note naming the request: the request itself
/// stays.
async fn a_requests_unreadable_metadata_or_key_is_left_out_with_a_note(backend: Backend) {
    let mut store = backend.fresh().await;
    let mut rs: Vec<Request> = (1..=3).map(|i| request(i, RequestState::Pending)).collect();
    for r in &mut rs {
        r.key = Some(format!("key-{}", r.id.0));
        r.metadata = [("job".to_owned(), "7".to_owned())].into();
    }
    store.commit(&requests(rs.clone())).await.unwrap();
    let id = |i: u64| RequestId(i).to_string();
    store
        .exec(&format!(
            "UPDATE requests SET metadata = '[1, 2]' WHERE id = '{}'; \
             UPDATE requests SET metadata = '{{\"job\": \"a\u{202e}b\"}}' WHERE id = '{}'; \
             UPDATE requests SET idempotency_key = 'has space' WHERE id = '{}';",
            id(1),
            id(2),
            id(3)
        ))
        .await;
    let loaded = load(&mut store.reopen().await).await;
    let by_id = |i: u64| {
        (loaded.snapshot.requests.iter())
            .find(|r| r.id == RequestId(i))
            .expect("the request stays")
    };
    assert!(by_id(1).metadata.is_empty());
    assert!(by_id(2).metadata.is_empty());
    assert_eq!(by_id(1).key.as_deref(), Some("key-1"));
    assert_eq!(by_id(3).key, None);
    assert_eq!(by_id(3).metadata, rs[2].metadata);
    let notes = loaded.dropped.join("\n");
    for (i, says) in [
        (1, "its metadata is left out: not a JSON object of strings"),
        (2, "its metadata is left out: metadata.job"),
        (
            3,
            "its idempotency key `has space` is not one the API takes",
        ),
    ] {
        assert!(
            notes.contains(&format!("request {}: {says}", id(i))),
            "{notes}"
        );
    }
}

/// A store from before the failure columns (SQLite step 6, PostgreSQL
/// step 10) opens: the step adds them, its rows load with none, and they
/// are written from then on. So do the requests' idempotency key and
/// metadata (SQLite step 7, PostgreSQL step 12), undone here too.
async fn a_store_from_before_the_failure_columns_loads_its_rows_without_one(backend: Backend) {
    let mut store = backend.fresh().await;
    let mut n = ready(1);
    let mut r = request(1, RequestState::Pending);
    r.failures = 1;
    store
        .commit(&Changes {
            nodes: vec![n.clone()],
            requests: vec![r.clone()],
            ..Default::default()
        })
        .await
        .unwrap();
    let (steps, back) = match &store {
        Db::Sqlite { .. } => (
            schema::MIGRATIONS.len(),
            "ALTER TABLE requests DROP COLUMN idempotency_key; \
             ALTER TABLE requests DROP COLUMN metadata; PRAGMA user_version = 5",
        ),
        Db::Postgres { .. } => (
            pg::MIGRATIONS.len(),
            "ALTER TABLE requests DROP COLUMN idempotency_key; \
             ALTER TABLE requests DROP COLUMN metadata; \
             ALTER TABLE request_inbox DROP COLUMN idempotency_key; \
             ALTER TABLE request_inbox DROP COLUMN metadata; \
             DROP FUNCTION berth_beat; ALTER TABLE members DROP COLUMN config; \
             UPDATE berth_schema SET version = 9",
        ),
    };
    let last = if matches!(backend, Backend::Sqlite) {
        7
    } else {
        12
    };
    assert_eq!(
        steps, last,
        "a step after the failure columns: undo it here too"
    );
    store
        .exec(&format!(
            "ALTER TABLE nodes DROP COLUMN failure; \
             ALTER TABLE requests DROP COLUMN last_failure; {back}"
        ))
        .await;
    let mut store = store.reopen().await;
    assert_eq!(store.schema_version().await, steps as u32);
    let loaded = load(&mut store).await;
    assert!(loaded.dropped.is_empty(), "{:?}", loaded.dropped);
    assert_eq!(loaded.snapshot.nodes, vec![n.clone()]);
    assert_eq!(loaded.snapshot.requests, vec![r.clone()]);
    n.failure = Some("not running after the boot timeout (600s)".into());
    r.last_failure = Some("node n-0000000000000001 on provider `a`: not running".into());
    r.key = Some("8d1e5a7c-retry".into());
    r.metadata = [("zuul.build", "b-17"), ("tenant", "ci \"north\"")]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .into();
    store
        .commit(&Changes {
            nodes: vec![n.clone()],
            requests: vec![r.clone()],
            ..Default::default()
        })
        .await
        .unwrap();
    let loaded = load(&mut store.reopen().await).await;
    assert_eq!(loaded.snapshot.nodes, vec![n]);
    assert_eq!(loaded.snapshot.requests, vec![r]);
}

async fn every_node_state_idle_and_endpoint_round_trips_across_a_reopen(backend: Backend) {
    let all = every_state();
    let mut store = backend.fresh().await;
    store.commit(&nodes(all.clone())).await.unwrap();
    assert_eq!(sorted(load(&mut store).await.snapshot.nodes), all);
    let mut store = store.reopen().await;
    let loaded = load(&mut store).await;
    assert!(loaded.dropped.is_empty(), "{:?}", loaded.dropped);
    assert_eq!(loaded.snapshot.nodes, all, "sorted by id");
}

async fn backing_and_slot_roles_round_trip_through_the_slots_table(backend: Backend) {
    let mut store = backend.fresh().await;
    let mut b = backing(10, vec![Some(11), None, Some(12)]);
    if let Packing::Backing { free_since, .. } = &mut b.packing {
        *free_since = Some(Time(3));
    }
    let all = vec![
        b,
        slot_node(
            11,
            10,
            0,
            NodeState::InUse {
                request: RequestId(1),
                since: T,
            },
        ),
        slot_node(
            12,
            10,
            2,
            NodeState::Creating {
                since: T,
                attempt: 0,
            },
        ),
        // A finished slot node keeps its role (for history) without a slot.
        slot_node(
            13,
            10,
            1,
            NodeState::Gone {
                since: T,
                reason: GoneReason::SlotFreed,
            },
        ),
        backing(20, vec![None, None, None]),
    ];
    store.commit(&nodes(all.clone())).await.unwrap();
    assert_eq!(store.count("slots").await, 2);
    let loaded = load(&mut store).await;
    assert!(loaded.dropped.is_empty(), "{:?}", loaded.dropped);
    assert_eq!(loaded.snapshot.nodes, all);
}

async fn every_request_state_round_trips_with_wants_and_nodes_in_order(backend: Backend) {
    let mut store = backend.fresh().await;
    let mut fulfilled = request(1, RequestState::Fulfilled { at: Time(9) });
    fulfilled.wants = vec![(SMALL, 2), (BIG, 1), (SLOT, 3)];
    fulfilled.nodes = vec![NodeId(5), NodeId(3), NodeId(4)];
    fulfilled.priority = -3;
    fulfilled.failures = 2;
    fulfilled.last_failure = Some(
        "node n-0000000000000002 on provider `a`: the cloud reports instance i-2 failed: \
         No valid host was found."
            .into(),
    );
    let mut pending = request(2, RequestState::Pending);
    pending.nodes = vec![NodeId(9)];
    pending.failures = 1;
    pending.last_failure = Some("node n-0000000000000009 on provider `b`: create: ✗".into());
    let mut failed = request(
        3,
        RequestState::Failed {
            at: Time(8),
            reason: "no capacity".into(),
        },
    );
    failed.failures = 4;
    failed.last_failure = Some("node n-0000000000000003 on provider `a`: create: …".into());
    let all = vec![
        fulfilled,
        pending,
        failed,
        request(4, RequestState::Cancelled { at: Time(7) }),
    ];
    store.commit(&requests(all.clone())).await.unwrap();
    let loaded = load(&mut store).await;
    assert!(loaded.dropped.is_empty(), "{:?}", loaded.dropped);
    assert_eq!(loaded.snapshot.requests, all);
}

async fn a_second_commit_replaces_rows_and_bumps_their_version(backend: Backend) {
    let mut store = backend.fresh().await;
    let mut r = request(1, RequestState::Pending);
    r.wants = vec![(BIG, 1), (SMALL, 1)];
    r.nodes = vec![NodeId(1), NodeId(2)];
    store
        .commit(&Changes {
            nodes: vec![ready(1)],
            requests: vec![r.clone()],
            ..Default::default()
        })
        .await
        .unwrap();
    let mut n = ready(1);
    n.state = NodeState::InUse {
        request: RequestId(1),
        since: Time(99),
    };
    n.endpoint = Some(Box::default());
    r.state = RequestState::Fulfilled { at: Time(99) };
    r.wants = vec![(SMALL, 1)];
    r.nodes = vec![NodeId(1)];
    r.priority = 4;
    store
        .commit(&Changes {
            nodes: vec![n.clone()],
            requests: vec![r.clone()],
            ..Default::default()
        })
        .await
        .unwrap();
    let loaded = load(&mut store).await;
    assert_eq!(loaded.snapshot.nodes, vec![n]);
    assert_eq!(loaded.snapshot.requests, vec![r]);
    assert_eq!(store.count("request_wants").await, 1);
    assert_eq!(store.count("request_nodes").await, 1);
    let versions = store
        .ints("SELECT (SELECT version FROM nodes), (SELECT version FROM requests)")
        .await;
    assert_eq!(versions, [1, 1]);
}

async fn purges_remove_rows_and_a_freed_slot_leaves_the_slots_table(backend: Backend) {
    let mut store = backend.fresh().await;
    let mut r = request(1, RequestState::Pending);
    r.nodes = vec![NodeId(11)];
    store
        .commit(&Changes {
            nodes: vec![
                backing(10, vec![Some(11), Some(12), None]),
                slot_node(11, 10, 0, NodeState::Ready { since: T }),
                slot_node(12, 10, 1, NodeState::Ready { since: T }),
                ready(1),
            ],
            requests: vec![r, request(2, RequestState::Pending)],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(store.count("slots").await, 2);
    // Slot 0 freed (its node ended, then purged) and a plain node and a
    // request forgotten, in one commit.
    store
        .commit(&Changes {
            nodes: vec![backing(10, vec![None, Some(12), None])],
            purged_nodes: vec![NodeId(11), NodeId(1)],
            purged_requests: vec![RequestId(1)],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(store.count("nodes").await, 2);
    assert_eq!(store.count("slots").await, 1);
    assert_eq!(store.count("requests").await, 1);
    assert_eq!(store.count("request_wants").await, 1);
    assert_eq!(store.count("request_nodes").await, 0);
    // Purging the backing node takes its slot rows with it.
    store
        .commit(&Changes {
            purged_nodes: vec![NodeId(10)],
            purged_requests: vec![RequestId(2)],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(store.count("slots").await, 0);
    assert_eq!(store.count("request_wants").await, 0);
    let loaded = load(&mut store).await;
    assert!(loaded.snapshot.requests.is_empty());
    // The slot node left behind lost its slot: ended, with a note.
    assert_eq!(loaded.snapshot.nodes.len(), 1);
    assert!(matches!(
        loaded.snapshot.nodes[0].state,
        NodeState::Gone {
            reason: GoneReason::BackingLost,
            ..
        }
    ));
    assert_eq!(loaded.dropped.len(), 1, "{:?}", loaded.dropped);
}

async fn one_node_in_two_slots_is_refused_and_the_commit_writes_nothing(backend: Backend) {
    let mut store = backend.fresh().await;
    store
        .commit(&nodes(vec![backing(10, vec![None; 3])]))
        .await
        .unwrap();
    let before = load(&mut store).await.snapshot.nodes;
    let err = store
        .commit(&nodes(vec![
            ready(1),
            backing(10, vec![Some(11), None, None]),
            backing(20, vec![None, Some(11), None]),
            slot_node(11, 10, 0, NodeState::Ready { since: T }),
        ]))
        .await
        .unwrap_err();
    assert_eq!(doing(&err), "writing a slot assignment", "{err}");
    assert!(err.to_string().to_lowercase().contains("unique"), "{err}");
    assert_eq!(load(&mut store).await.snapshot.nodes, before);
    assert_eq!(store.count("slots").await, 0);
}

async fn two_nodes_in_one_slot_are_refused_and_the_commit_writes_nothing(backend: Backend) {
    let mut store = backend.fresh().await;
    // The same backing node twice in one commit, each time with a different
    // node in slot 0: the primary key must refuse the second.
    let err = store
        .commit(&nodes(vec![
            backing(10, vec![Some(11), None, None]),
            backing(10, vec![Some(12), None, None]),
            slot_node(11, 10, 0, NodeState::Ready { since: T }),
            slot_node(12, 10, 0, NodeState::Ready { since: T }),
        ]))
        .await
        .unwrap_err();
    assert!(err.to_string().to_lowercase().contains("unique"), "{err}");
    assert_eq!(store.count("nodes").await, 0);
    assert_eq!(store.count("slots").await, 0);
    // Written row by row, outside the store, the table refuses it too.
    store
        .exec("INSERT INTO slots VALUES ('n-000000000000000a', 0, 'n-000000000000000b')")
        .await;
    let raw = store
        .try_exec("INSERT INTO slots VALUES ('n-000000000000000a', 0, 'n-000000000000000c')")
        .await;
    assert!(raw.is_err());
}

async fn nodes_naming_an_unconfigured_label_or_provider_are_dropped_with_a_note(backend: Backend) {
    let mut store = backend.fresh().await;
    let mut on_b = ready(2);
    on_b.provider = B;
    on_b.label = SMALL;
    store.commit(&nodes(vec![ready(1), on_b])).await.unwrap();

    let loaded = store.load(&renamed("big", "huge")).await.unwrap();
    assert_eq!(loaded.snapshot.nodes.len(), 1);
    assert_eq!(loaded.snapshot.nodes[0].id, NodeId(2));
    assert_eq!(loaded.dropped.len(), 1);
    assert!(
        loaded.dropped[0].contains("label `big` is no longer configured")
            && loaded.dropped[0].contains("deleted as a leak"),
        "{:?}",
        loaded.dropped
    );

    let loaded = store.load(&renamed("b", "c")).await.unwrap();
    assert_eq!(loaded.snapshot.nodes.len(), 1);
    assert!(
        loaded.dropped[0].contains("provider `b`"),
        "{:?}",
        loaded.dropped
    );
    // The rows stay: the config may come back.
    assert_eq!(store.count("nodes").await, 2);
}

async fn an_unconfigured_slot_label_drops_the_backing_and_its_slot_rows(backend: Backend) {
    let mut store = backend.fresh().await;
    store
        .commit(&nodes(vec![
            backing(10, vec![Some(11), None, None]),
            slot_node(11, 10, 0, NodeState::Ready { since: T }),
        ]))
        .await
        .unwrap();
    let loaded = store.load(&renamed("slot", "slice")).await.unwrap();
    assert!(loaded.snapshot.nodes.is_empty());
    // Backing node, slot node, and the slot row joining them.
    assert_eq!(loaded.dropped.len(), 3, "{:?}", loaded.dropped);
}

async fn a_pending_request_for_an_unconfigured_label_is_failed_and_frees_its_nodes(
    backend: Backend,
) {
    let mut store = backend.fresh().await;
    let mut set_aside = ready(1);
    set_aside.label = SMALL;
    set_aside.provider = B;
    set_aside.assigned = Some(RequestId(1));
    let mut pending = request(1, RequestState::Pending);
    pending.wants = vec![(SMALL, 1), (BIG, 1)];
    pending.nodes = vec![NodeId(1)];
    let mut done = request(2, RequestState::Fulfilled { at: Time(9) });
    done.wants = vec![(SMALL, 1), (BIG, 1)];
    store
        .commit(&Changes {
            nodes: vec![set_aside],
            requests: vec![pending, done],
            ..Default::default()
        })
        .await
        .unwrap();
    let loaded = store.load(&renamed("big", "huge")).await.unwrap();
    let [failed, done] = &loaded.snapshot.requests[..] else {
        panic!("{:?}", loaded.snapshot.requests);
    };
    assert_eq!(
        failed.state,
        RequestState::Failed {
            at: T,
            reason: "label `big` is no longer configured".into()
        }
    );
    assert!(failed.nodes.is_empty());
    assert_eq!(loaded.snapshot.nodes[0].assigned, None);
    // A finished request keeps what still resolves.
    assert_eq!(done.state, RequestState::Fulfilled { at: Time(9) });
    assert_eq!(done.wants, vec![(SMALL, 1)]);
    assert_eq!(loaded.dropped.len(), 2, "{:?}", loaded.dropped);
}

async fn slot_rows_that_do_not_join_are_ignored_and_a_slotless_slot_node_ends(backend: Backend) {
    let mut store = backend.fresh().await;
    let mut waiting = slot_node(12, 10, 1, NodeState::Ready { since: T });
    waiting.assigned = Some(RequestId(1));
    let mut r = request(1, RequestState::Pending);
    r.wants = vec![(SLOT, 1)];
    r.nodes = vec![NodeId(12)];
    store
        .commit(&Changes {
            nodes: vec![
                backing(10, vec![Some(11), Some(12), None]),
                slot_node(
                    11,
                    10,
                    0,
                    NodeState::Gone {
                        since: T,
                        reason: GoneReason::SlotFreed,
                    },
                ),
                waiting,
                ready(1),
            ],
            requests: vec![r],
            ..Default::default()
        })
        .await
        .unwrap();
    // Slot 1's row lost, plus rows for a node that is not stored, a plain
    // node, and a slot the backing does not have.
    store
        .exec(
            "DELETE FROM slots WHERE idx = 1;
         INSERT INTO slots VALUES ('n-000000000000000a', 2, 'n-0000000000000063');
         INSERT INTO slots VALUES ('n-0000000000000014', 0, 'n-0000000000000001');
         INSERT INTO slots VALUES ('n-000000000000000a', 7, 'n-000000000000000c');",
        )
        .await;
    let loaded = load(&mut store).await;
    let got: Vec<_> = loaded
        .snapshot
        .nodes
        .iter()
        .map(|n| (n.id.0, n.state.name(), n.assigned))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, "ready", None),
            (10, "ready", None),
            (11, "gone", None),
            (12, "gone", None),
        ]
    );
    assert_eq!(loaded.snapshot.nodes[0].packing, Packing::Plain);
    assert_eq!(
        loaded.snapshot.nodes[1].packing,
        Packing::Backing {
            slot_label: SLOT,
            slots: vec![None; 3],
            free_since: None
        }
    );
    assert!(loaded.snapshot.requests[0].nodes.is_empty());
    // Four ignored rows (the gone node's included) and the ended node.
    assert_eq!(loaded.dropped.len(), 5, "{:?}", loaded.dropped);
    assert!(
        loaded.dropped.iter().any(|d| d.contains("backing-lost")),
        "{:?}",
        loaded.dropped
    );
}

async fn unknown_text_in_a_row_is_corrupt_naming_table_id_and_column(backend: Backend) {
    let cases = [
        (
            "UPDATE nodes SET state = 'sleeping'",
            "nodes",
            "n-0000000000000001",
            "state",
        ),
        (
            "UPDATE nodes SET idle = 'nap'",
            "nodes",
            "n-0000000000000001",
            "idle",
        ),
        (
            "UPDATE nodes SET packing = 'other'",
            "nodes",
            "n-0000000000000001",
            "packing",
        ),
        (
            "UPDATE nodes SET state = 'gone', reason = 'stolen'",
            "nodes",
            "n-0000000000000001",
            "reason",
        ),
        (
            "UPDATE nodes SET endpoint = '{'",
            "nodes",
            "n-0000000000000001",
            "endpoint",
        ),
        ("UPDATE nodes SET id = 'x-1'", "nodes", "x-1", "id"),
        (
            "UPDATE requests SET state = 'lost'",
            "requests",
            "r-0000000000000002",
            "state",
        ),
        (
            "UPDATE requests SET state = 'fulfilled', at = NULL",
            "requests",
            "r-0000000000000002",
            "at",
        ),
        (
            "UPDATE request_nodes SET node = 'n-1'",
            "request_nodes",
            "r-0000000000000002",
            "node",
        ),
    ];
    for (sql, table, id, column) in cases {
        let mut store = backend.fresh().await;
        let mut r = request(2, RequestState::Pending);
        r.nodes = vec![NodeId(1)];
        store
            .commit(&Changes {
                nodes: vec![ready(1)],
                requests: vec![r],
                ..Default::default()
            })
            .await
            .unwrap();
        store.exec(sql).await;
        match store.load(&config()).await {
            Err(StoreError::Corrupt {
                table: t,
                id: i,
                column: c,
                ..
            }) => assert_eq!((t, i.as_str(), c), (table, id, column), "{sql}"),
            other => panic!("{sql}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn reopening_is_a_no_op_and_the_file_is_in_wal_mode() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("berth.db");
    let mut store = SqliteStore::open(&path, Arc::new(config()), StoreSync::Full).unwrap();
    store.commit(&nodes(vec![ready(1)])).await.unwrap();
    drop(store);
    let store = SqliteStore::open(&path, Arc::new(config()), StoreSync::Full).unwrap();
    assert_eq!(
        store.schema_version().unwrap(),
        schema::MIGRATIONS.len() as u32
    );
    let mode: String = store
        .conn
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    assert_eq!(count(&store, "nodes"), 1);
}

#[tokio::test]
async fn a_newer_schema_is_refused_naming_both_versions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("berth.db");
    drop(SqliteStore::open(&path, Arc::new(config()), StoreSync::Full).unwrap());
    let conn = Connection::open(&path).unwrap();
    conn.pragma_update(None, "user_version", 99).unwrap();
    drop(conn);
    let known = schema::MIGRATIONS.len() as u32;
    match SqliteStore::open(&path, Arc::new(config()), StoreSync::Full) {
        Err(
            e @ StoreError::TooNew {
                found: 99,
                known: k,
            },
        ) if k == known => {
            let text = e.to_string();
            assert!(
                text.contains("99") && text.contains(&known.to_string()),
                "{text}"
            );
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("opened a newer schema"),
    }
}

#[tokio::test]
async fn migrations_apply_in_order_and_a_failed_step_changes_nothing() {
    let mut store = SqliteStore::open_in_memory(Arc::new(config())).unwrap();
    let base = schema::MIGRATIONS.len() as u32;
    let mut two = schema::MIGRATIONS.to_vec();
    two.push("ALTER TABLE nodes ADD COLUMN note TEXT");
    two.push("CREATE TABLE provider_leases (provider TEXT PRIMARY KEY)");
    schema::migrate(&mut store.conn, &two).unwrap();
    assert_eq!(store.schema_version().unwrap(), base + 2);
    // Again: nothing left to apply (a re-run would fail on the duplicate).
    schema::migrate(&mut store.conn, &two).unwrap();

    let mut bad = two.clone();
    bad.push("CREATE TABLE extra (x); CREATE TABLE nodes (x);");
    match schema::migrate(&mut store.conn, &bad) {
        Err(StoreError::Migrate { from, to, .. }) => assert_eq!((from, to), (base + 2, base + 3)),
        other => panic!("{other:?}"),
    }
    assert_eq!(store.schema_version().unwrap(), base + 2);
    let extra: i64 = store
        .conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE name = 'extra'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(extra, 0, "the failed step's first statement was kept");
}

#[tokio::test]
async fn opening_in_a_missing_directory_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-such-dir").join("berth.db");
    match SqliteStore::open(&path, Arc::new(config()), StoreSync::Full) {
        Err(StoreError::Unwritable { path: p, .. }) => assert!(p.contains("no-such-dir")),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("opened"),
    }
}

async fn ten_thousand_nodes_commit_and_load_back(backend: Backend) {
    let mut store = backend.fresh().await;
    let all: Vec<Node> = (1..=10_000)
        .map(|i| {
            let mut n = node(i, NodeState::Ready { since: Time(i) });
            n.endpoint = Some(Box::default());
            n
        })
        .collect();
    store.commit(&nodes(all.clone())).await.unwrap();
    let loaded = load(&mut store).await;
    assert_eq!(loaded.snapshot.nodes, all);
    // And all of them changed again, as one commit of updates.
    let moved: Vec<Node> = all
        .into_iter()
        .map(|mut n| {
            n.state = NodeState::Used { since: T };
            n
        })
        .collect();
    store.commit(&nodes(moved.clone())).await.unwrap();
    assert_eq!(load(&mut store).await.snapshot.nodes, moved);
}

async fn leases_round_trip_and_expired_ones_are_removed(backend: Backend) {
    let mut store = backend.fresh().await;
    let lease = |r: &str, t: u64| RequestorLease {
        requestor: r.into(),
        expires: Time(t),
        ttl: Duration::from_millis(t * 1000 + 7),
    };
    store
        .commit(&Changes {
            leases: vec![lease("ci", 10), lease("batch", 20)],
            ..Default::default()
        })
        .await
        .unwrap();
    store
        .commit(&Changes {
            leases: vec![lease("ci", 30)],
            purged_leases: vec!["batch".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        load(&mut store).await.snapshot.leases,
        vec![lease("ci", 30)]
    );
}

#[tokio::test]
async fn a_version_one_store_gains_the_leases_table_and_keeps_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("berth.db");
    // Back to what a berth that knew only the first step wrote.
    left_by_an_older_berth(
        &path,
        vec![ready(1)],
        "ALTER TABLE nodes DROP COLUMN failure; ALTER TABLE requests DROP COLUMN last_failure; \
         ALTER TABLE nodes RENAME COLUMN packing TO role; DROP TABLE leases; \
         DROP TABLE pool_identity; PRAGMA user_version = 1;",
    )
    .await;
    let mut store = SqliteStore::open(&path, Arc::new(config()), StoreSync::Full).unwrap();
    assert_eq!(
        store.schema_version().unwrap(),
        schema::MIGRATIONS.len() as u32
    );
    assert_eq!(load(&mut store).await.snapshot.nodes, vec![ready(1)]);
    assert_eq!(count(&store, "leases"), 0);
}

/// A lease stored before its renewal's length was kept is read as lasting
/// the configured `api.lease-ttl`.
#[tokio::test]
async fn a_lease_stored_without_its_ttl_is_read_as_the_configured_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("berth.db");
    // As a berth that knew only the first two steps wrote it.
    left_by_an_older_berth(
        &path,
        Vec::new(),
        "ALTER TABLE nodes DROP COLUMN failure; ALTER TABLE requests DROP COLUMN last_failure; \
         ALTER TABLE nodes RENAME COLUMN packing TO role; ALTER TABLE leases DROP COLUMN ttl; \
         DROP TABLE pool_identity; PRAGMA user_version = 2; \
         INSERT INTO leases (requestor, expires) VALUES ('ci', 40);",
    )
    .await;
    let config = config();
    let mut store = SqliteStore::open(&path, Arc::new(config.clone()), StoreSync::Full).unwrap();
    assert_eq!(
        load(&mut store).await.snapshot.leases,
        vec![RequestorLease {
            requestor: "ci".into(),
            expires: Time(40),
            ttl: config.requestor_lease_ttl,
        }]
    );
}

/// A new PostgreSQL database of the shared test cluster, and the URL.
/// A SQLite store at `path` as an older berth left it: `first` committed,
/// then `sql` run over it (dropping what later steps made, and setting the
/// schema version back). The steps after the failure columns (6) are
/// undone here first, for every caller: a step added later is undone here
/// too.
async fn left_by_an_older_berth(path: &std::path::Path, first: Vec<Node>, sql: &str) {
    let mut store = SqliteStore::open(path, Arc::new(config()), StoreSync::Full).unwrap();
    if !first.is_empty() {
        store.commit(&nodes(first)).await.unwrap();
    }
    assert_eq!(
        schema::MIGRATIONS.len(),
        7,
        "a step after the requests' key and metadata: undo it here too"
    );
    store
        .conn
        .execute_batch(
            "ALTER TABLE requests DROP COLUMN idempotency_key; \
             ALTER TABLE requests DROP COLUMN metadata;",
        )
        .unwrap();
    store.conn.execute_batch(sql).unwrap();
}

async fn pg_fresh() -> (PgStore, String) {
    let url = cluster::PgCluster::shared(&workspace_root()).fresh_database("store");
    let store = PgStore::connect(&url, None, Arc::new(config()))
        .await
        .expect("connect");
    (store, url)
}

#[tokio::test]
async fn postgres_reconnecting_is_a_no_op_at_the_current_schema_version() {
    let (mut store, url) = pg_fresh().await;
    let known = pg::MIGRATIONS.len() as u32;
    assert_eq!(store.schema_version().await.unwrap(), known);
    store.commit(&nodes(vec![ready(1)])).await.unwrap();
    drop(store);
    let mut store = PgStore::connect(&url, None, Arc::new(config()))
        .await
        .unwrap();
    assert_eq!(store.schema_version().await.unwrap(), known);
    assert_eq!(load(&mut store).await.snapshot.nodes, vec![ready(1)]);
}

#[tokio::test]
async fn postgres_processes_connecting_at_once_migrate_one_after_the_other() {
    let url = cluster::PgCluster::shared(&workspace_root()).fresh_database("store");
    // Six connections race to migrate the new database: the advisory lock
    // makes one apply each step and the others find it applied.
    let mut tries = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let url = url.clone();
        tries.spawn(async move { PgStore::connect(&url, None, Arc::new(config())).await });
    }
    let stores: Vec<PgStore> = tries
        .join_all()
        .await
        .into_iter()
        .map(|r| r.expect("connect"))
        .collect();
    for s in &stores {
        assert_eq!(
            s.schema_version().await.unwrap(),
            pg::MIGRATIONS.len() as u32
        );
    }
    let rows = stores[0]
        .client()
        .query_one("SELECT count(*) FROM berth_schema", &[])
        .await
        .unwrap();
    assert_eq!(rows.get::<_, i64>(0), 1);
}

#[tokio::test]
async fn postgres_a_newer_schema_is_refused_naming_both_versions() {
    let (store, url) = pg_fresh().await;
    store
        .client()
        .batch_execute("UPDATE berth_schema SET version = 99")
        .await
        .unwrap();
    drop(store);
    let known = pg::MIGRATIONS.len() as u32;
    match PgStore::connect(&url, None, Arc::new(config())).await {
        Err(StoreError::TooNew {
            found: 99,
            known: k,
        }) => assert_eq!(k, known),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("opened a newer schema"),
    }
}

#[tokio::test]
async fn postgres_migrations_apply_in_order_and_a_failed_step_changes_nothing() {
    let (mut store, _url) = pg_fresh().await;
    let base = pg::MIGRATIONS.len() as u32;
    let mut two = pg::MIGRATIONS.to_vec();
    two.push("ALTER TABLE nodes ADD COLUMN note TEXT");
    two.push("CREATE TABLE provider_leases (provider TEXT PRIMARY KEY)");
    pg::migrate(store.client_mut(), &two).await.unwrap();
    assert_eq!(store.schema_version().await.unwrap(), base + 2);
    // Again: nothing left to apply (a re-run would fail on the duplicate).
    pg::migrate(store.client_mut(), &two).await.unwrap();

    let mut bad = two.clone();
    bad.push("CREATE TABLE extra (x INT); CREATE TABLE nodes (x INT);");
    match pg::migrate(store.client_mut(), &bad).await {
        Err(StoreError::PostgresMigrate { from, to, .. }) => {
            assert_eq!((from, to), (base + 2, base + 3))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(store.schema_version().await.unwrap(), base + 2);
    let extra = store
        .client()
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE tablename = 'extra'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        extra.get::<_, i64>(0),
        0,
        "the failed step's first statement was kept"
    );
}

#[tokio::test]
async fn postgres_a_wrong_password_is_refused_saying_so() {
    let cluster = cluster::PgCluster::shared(&workspace_root());
    let url = cluster.url().replacen(cluster.password(), "wrong", 1);
    match PgStore::connect(&url, None, Arc::new(config())).await {
        Err(e) => {
            let text = format!("{e}");
            assert!(text.contains("connecting to PostgreSQL"), "{text}");
            assert!(text.contains("password authentication failed"), "{text}");
        }
        Ok(_) => panic!("connected with a wrong password"),
    }
}

fn claimant(name: &str, ttl: Duration) -> Claimant {
    Claimant {
        holder: name.to_owned(),
        address: format!("http://{name}.example:8080"),
        ttl,
    }
}

async fn pg_open(url: &str, who: &Claimant) -> PgStore {
    let settings = berth_config::Postgres {
        url: url.to_owned(),
        password: None,
        pool_lease_ttl: who.ttl,
        ca_file: None,
    };
    PgStore::open(&settings, Arc::new(config()), Some(who.clone()))
        .await
        .unwrap()
}

#[tokio::test]
async fn postgres_one_process_holds_the_pool_and_another_takes_it_over_only_once_its_lease_expired()
{
    let (_, url) = pg_fresh().await;
    let ttl = Duration::from_millis(600);
    let (a, b) = (claimant("a", ttl), claimant("b", ttl));
    let mut first = pg_open(&url, &a).await;
    let mut second = pg_open(&url, &b).await;
    // Nobody may write before holding the pool.
    assert!(
        first
            .commit(&nodes(vec![ready(1)]))
            .await
            .unwrap_err()
            .is_fenced()
    );
    let Tenure::Held(held) = first.claim().await.unwrap() else {
        panic!("a free lease was not taken");
    };
    assert_eq!(held.epoch, 1);
    assert_eq!(first.holding(), Some(held));
    // A holder stopped mid-commit loses its session after half the lease,
    // so its row lock cannot keep the pool from being taken over.
    let idle: String = first
        .client()
        .query_one("SHOW idle_in_transaction_session_timeout", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(idle, "300ms");
    match second.claim().await.unwrap() {
        Tenure::Other {
            holder,
            address,
            expires_in,
        } => {
            assert_eq!(
                (holder.as_str(), address.as_str()),
                ("a", "http://a.example:8080")
            );
            assert!(expires_in <= ttl, "{expires_in:?}");
        }
        other => panic!("{other:?}"),
    }
    // Each commit renews the lease: the holder keeps it for as long as it
    // writes more often than the TTL.
    for id in 1..=4 {
        tokio::time::sleep(ttl / 3).await;
        first.commit(&nodes(vec![ready(id)])).await.unwrap();
        assert!(matches!(
            second.claim().await.unwrap(),
            Tenure::Other { .. }
        ));
    }
    assert!(first.holding().unwrap().valid_until > held.valid_until);

    // The holder stops renewing (it was paused): once the lease has
    // expired, the other process takes the pool over with the next epoch.
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    let Tenure::Held(taken) = second.claim().await.unwrap() else {
        panic!("an expired lease was not taken over");
    };
    assert_eq!(taken.epoch, 2);
    // The old holder resumes: its commit is refused whole, and so are its
    // renewals and claims, while the new holder writes.
    match first.commit(&nodes(vec![ready(5)])).await {
        Err(e @ StoreError::Fenced { epoch: Some(1) }) => {
            assert!(e.to_string().contains("took the pool over"), "{e}");
            assert!(!e.is_lost());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(first.holding(), None);
    assert!(first.confirm().await.unwrap_err().is_fenced());
    assert!(matches!(first.claim().await.unwrap(), Tenure::Other { holder, .. } if holder == "b"));
    second.commit(&nodes(vec![ready(6)])).await.unwrap();
    let ids: Vec<NodeId> = load(&mut second)
        .await
        .snapshot
        .nodes
        .iter()
        .map(|n| n.id)
        .collect();
    assert_eq!(ids, [1, 2, 3, 4, 6].map(NodeId));

    // A clean stop gives the lease up: the other process takes the pool at
    // once, without waiting for the TTL.
    second.release().await.unwrap();
    let Tenure::Held(back) = first.claim().await.unwrap() else {
        panic!("a released lease was not taken");
    };
    assert_eq!(back.epoch, 3);
}

#[tokio::test]
async fn postgres_a_lost_server_is_told_from_a_refused_commit_and_reconnecting_resumes() {
    // A cluster of its own: this test stops it.
    let cluster = cluster::PgCluster::start(&workspace_root());
    let url = cluster.fresh_database("lost");
    let mut store = PgStore::connect(&url, None, Arc::new(config()))
        .await
        .unwrap();
    store.commit(&nodes(vec![ready(1)])).await.unwrap();
    // A statement the server refuses is not a lost store.
    let refused = store
        .commit(&nodes(vec![
            backing(10, vec![Some(11), None, None]),
            backing(20, vec![Some(11), None, None]),
        ]))
        .await
        .unwrap_err();
    assert!(!refused.is_lost(), "{refused}");
    store.confirm().await.unwrap();

    cluster.stop_immediate();
    let e = store.commit(&nodes(vec![ready(2)])).await.unwrap_err();
    assert!(e.is_lost(), "{e}");
    let e = store.confirm().await.unwrap_err();
    assert!(e.is_lost(), "{e}");
    let e = store.reconnect().await.unwrap_err();
    assert!(e.is_lost(), "{e}");

    cluster.start_again();
    store.reconnect().await.unwrap();
    store.commit(&nodes(vec![ready(2)])).await.unwrap();
    assert_eq!(
        load(&mut store).await.snapshot.nodes,
        vec![ready(1), ready(2)]
    );
}

#[tokio::test]
async fn postgres_a_holder_keeps_its_epoch_across_a_server_restart_unless_another_took_over() {
    let cluster = cluster::PgCluster::start(&workspace_root());
    let url = cluster.fresh_database("taken");
    let ttl = Duration::from_millis(800);
    let (a, b) = (claimant("a", ttl), claimant("b", ttl));
    let mut first = pg_open(&url, &a).await;
    let Tenure::Held(held) = first.claim().await.unwrap() else {
        panic!("not held");
    };
    // The server restarts while nobody else wants the pool: the holder
    // connects again and goes on under the same epoch, even though its
    // lease expired meanwhile.
    cluster.stop_immediate();
    assert!(
        first
            .commit(&nodes(vec![ready(1)]))
            .await
            .unwrap_err()
            .is_lost()
    );
    tokio::time::sleep(ttl).await;
    cluster.start_again();
    first.reconnect().await.unwrap();
    assert!(matches!(first.claim().await.unwrap(), Tenure::Held(h) if h.epoch == held.epoch));
    first.commit(&nodes(vec![ready(1)])).await.unwrap();

    // Again, but another process takes the pool over while the holder is
    // away: the holder's next commit is fenced, not lost.
    cluster.stop_immediate();
    cluster.start_again();
    tokio::time::sleep(ttl).await;
    let mut second = pg_open(&url, &b).await;
    assert!(matches!(second.claim().await.unwrap(), Tenure::Held(h) if h.epoch == held.epoch + 1));
    let e = match first.commit(&nodes(vec![ready(2)])).await {
        Err(e) if e.is_lost() => {
            first.reconnect().await.unwrap();
            first.commit(&nodes(vec![ready(2)])).await.unwrap_err()
        }
        other => other.unwrap_err(),
    };
    assert!(e.is_fenced(), "{e}");
}

#[tokio::test]
async fn a_sqlite_pool_is_copied_into_an_empty_postgres_database_whole() {
    let mut source = Backend::Sqlite.fresh().await;
    let mut r = request(1, RequestState::Fulfilled { at: Time(9) });
    r.nodes = vec![NodeId(11)];
    let all = Changes {
        nodes: vec![
            backing(10, vec![Some(11), None, None]),
            slot_node(
                11,
                10,
                0,
                NodeState::InUse {
                    request: RequestId(1),
                    since: T,
                },
            ),
            ready(1),
        ],
        requests: vec![r, request(2, RequestState::Pending)],
        leases: vec![RequestorLease {
            requestor: "ci".into(),
            expires: Time(99),
            ttl: Duration::from_secs(30),
        }],
        ..Default::default()
    };
    source.commit(&all).await.unwrap();
    let mut target = Backend::Postgres.fresh().await;
    let copied = copy_into_empty(&mut source, &mut target, &config())
        .await
        .unwrap();
    assert_eq!(
        (copied.nodes, copied.requests, copied.leases),
        (3, 2, 1),
        "{copied:?}"
    );
    assert_eq!(
        load(&mut target).await.snapshot,
        load(&mut source).await.snapshot
    );
    assert_eq!(target.count("slots").await, 1);

    // Again: the target is no longer empty, and nothing is written.
    match copy_into_empty(&mut source, &mut target, &config()).await {
        Err(
            e @ StoreError::NotEmpty {
                nodes: 3,
                requests: 2,
                leases: 1,
            },
        ) => {
            assert!(
                e.to_string().contains("only copied into an empty one"),
                "{e}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(target.count("nodes").await, 3);
}

/// The drivers' records in PostgreSQL: every process reads them, only the
/// holder of a provider's lease writes that provider's, sixteen writers
/// racing for a key from their own connections leave one winner, and the
/// records answer as every backend must.
#[tokio::test]
async fn postgres_driver_records_are_shared_and_written_only_by_the_provider_holder() {
    use berth_core::driver::records::{Records, RecordsError, kit};
    let (plain, url) = pg_fresh().await;
    let ttl = Duration::from_millis(600);
    let (a, b) = (claimant("a", ttl), claimant("b", ttl));
    let first = pg_open(&url, &a).await;
    let second = pg_open(&url, &b).await;
    let (ra, rb) = (first.records(), second.records());
    let names = || ["p", "q", "s", "full"].map(String::from).to_vec();
    let mut sa = first.shards(names()).unwrap();
    let mut sb = second.shards(names()).unwrap();
    let p: Arc<str> = "p".into();
    let not_holder = Err(RecordsError::NotHolder {
        backend: "PostgreSQL",
    });

    // Nobody writes before holding the provider.
    let e = kit::cas(&ra, "p", "k", None, Some("1")).await;
    assert_eq!(e, not_holder);
    let text = e.unwrap_err().to_string();
    assert!(
        text.contains("does not hold the provider's lease"),
        "{text}"
    );
    // Alone, the first process takes all four providers.
    let roster = sa.beat(&[]).await.unwrap();
    assert_eq!(roster.held_by("a"), [0, 1, 2, 3]);
    kit::compare_and_swap_decides_and_spaces_are_apart(&ra).await;
    kit::a_scan_answers_in_byte_order_within_its_budget(&ra).await;
    // The other process reads what the holder stored, and cannot write.
    assert_eq!(rb.get(p.clone(), "k".into()).await, Ok(Some("4".into())));
    let keys = rb.scan("s".into(), "k%".into(), 1 << 20).await;
    assert_eq!(keys, Ok(vec![("k%2".into(), "v".into())]));
    assert_eq!(kit::cas(&rb, "p", "k2", None, Some("x")).await, not_holder);

    // Sixteen writers race for one key: exactly one wins.
    let ra = Arc::new(ra);
    let racers: Vec<_> = (0..16)
        .map(|i| {
            let (ra, p) = (ra.clone(), p.clone());
            tokio::spawn(async move {
                ra.compare_and_swap(p, "race".into(), None, Some(i.to_string()))
                    .await
            })
        })
        .collect();
    let mut won = 0;
    for r in racers {
        won += usize::from(r.await.unwrap().unwrap());
    }
    assert_eq!(won, 1);

    // A full provider takes no new key but may change its own.
    plain
        .client()
        .execute(
            "INSERT INTO driver_records SELECT 'full', 'h/' || i, 'v' \
             FROM generate_series(1, $1::bigint) i",
            &[&i64::try_from(berth_core::driver::records::MAX_KEYS).unwrap()],
        )
        .await
        .unwrap();
    kit::a_full_provider_takes_no_new_key_but_changes_its_own(&*ra).await;

    // Once another process took the provider over, the old holder's
    // driver stores nothing, and the new one's does.
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    assert_eq!(sb.beat(&[]).await.unwrap().held_by("b"), [0, 1, 2, 3]);
    assert_eq!(
        kit::cas(&*ra, "p", "k", Some("4"), Some("stale")).await,
        not_holder
    );
    assert_eq!(
        kit::cas(&rb, "p", "k", Some("4"), Some("5")).await,
        Ok(true)
    );
    // A store opened without a claimant (`berth store migrate`) writes.
    assert_eq!(
        kit::cas(&plain.records(), "p", "m", None, Some("1")).await,
        Ok(true)
    );
}

/// The providers' leases spread over the live processes: a process alone
/// takes every provider, one that joins gets what the others give up
/// beyond their share, and the providers of one that stops beating are
/// taken over (with a new epoch) once its leases expire. Every process
/// reads the same peer secret.
#[tokio::test]
async fn postgres_provider_leases_spread_over_the_live_processes() {
    let (_plain, url) = pg_fresh().await;
    let ttl = Duration::from_millis(800);
    let names: Vec<String> = (1..=6).map(|i| format!("p{i}")).collect();
    let open = |who: &str| {
        let url = url.clone();
        let me = claimant(who, ttl);
        let names = names.clone();
        async move { pg_open(&url, &me).await.shards(names).unwrap() }
    };
    let (mut a, mut b, mut c) = (open("a").await, open("b").await, open("c").await);
    let kept = |roster: &Roster, who: &str| -> Vec<String> {
        roster
            .held_by(who)
            .into_iter()
            .map(|i| format!("p{}", i + 1))
            .collect()
    };

    let alone = a.beat(&[]).await.unwrap();
    assert_eq!((alone.members, alone.share()), (1, 6));
    let all = kept(&alone, "a");
    assert_eq!(all.len(), 6);
    // A second process finds everything held and its share at 3.
    let joined = b.beat(&[]).await.unwrap();
    assert_eq!((joined.members, joined.share()), (2, 3));
    assert!(joined.held_by("b").is_empty());
    // The first gives up what is beyond its share; the second takes it.
    let roster = a.beat(&all[..3]).await.unwrap();
    assert_eq!(roster.share(), 3);
    a.release(&all[3..]).await.unwrap();
    // Announced to every process listening. (Right after it connected,
    // requests count as announced: nobody listened before.)
    let requests = Announced {
        requests: true,
        ..Announced::default()
    };
    assert_eq!(b.announced().await, requests);
    let heard = tokio::time::timeout(Duration::from_secs(5), b.announced()).await;
    let providers = Announced {
        providers: true,
        ..Announced::default()
    };
    assert_eq!(heard, Ok(providers));
    let roster = b.beat(&[]).await.unwrap();
    assert_eq!(kept(&roster, "a"), all[..3]);
    assert_eq!(kept(&roster, "b"), all[3..]);
    // A third: each of the others gives one up.
    assert_eq!(c.beat(&[]).await.unwrap().share(), 2);
    a.release(&all[2..3]).await.unwrap();
    b.release(&all[5..]).await.unwrap();
    let roster = c.beat(&[]).await.unwrap();
    assert_eq!(kept(&roster, "c"), [all[2].clone(), all[5].clone()]);
    let epochs: Vec<i64> = (roster.providers.iter())
        .map(|l| l.as_ref().unwrap().epoch)
        .collect();
    assert_eq!(epochs, [1, 1, 2, 2, 2, 3]);
    assert_eq!(
        roster.providers[0].as_ref().unwrap().address,
        "http://a.example:8080"
    );

    // The third stops beating: once its leases (and its membership) have
    // expired, the other two take its providers over between them.
    let deadline = tokio::time::Instant::now() + ttl + Duration::from_millis(200);
    let (mut keep_a, mut keep_b) = (kept(&roster, "a"), kept(&roster, "b"));
    let mut last = roster;
    while tokio::time::Instant::now() < deadline {
        keep_a = kept(&a.beat(&keep_a).await.unwrap(), "a");
        last = b.beat(&keep_b).await.unwrap();
        keep_b = kept(&last, "b");
        tokio::time::sleep(ttl / 4).await;
    }
    assert_eq!((last.members, last.share()), (2, 3));
    assert_eq!(kept(&last, "a"), ["p1", "p2", "p3"], "{last:?}");
    assert_eq!(kept(&last, "b"), ["p4", "p5", "p6"], "{last:?}");
    // Taken over: a new epoch.
    assert_eq!(last.providers[2].as_ref().unwrap().epoch, 3);
    assert_eq!(last.providers[5].as_ref().unwrap().epoch, 4);

    // RequestorLeases a process does not keep lapse unrenewed; beating on, it
    // takes them again under new epochs.
    let deadline = tokio::time::Instant::now() + ttl + Duration::from_millis(200);
    let mut again = last.clone();
    while tokio::time::Instant::now() < deadline {
        again = a.beat(&[]).await.unwrap();
        b.beat(&keep_b).await.unwrap();
        tokio::time::sleep(ttl / 4).await;
    }
    assert_eq!(kept(&again, "a"), ["p1", "p2", "p3"]);
    let epochs: Vec<i64> = (again.providers.iter())
        .map(|l| l.as_ref().unwrap().epoch)
        .collect();
    assert_eq!(epochs, [2, 2, 4, 2, 2, 4]);
    // The pool's own lease is answered too, once somebody holds it.
    assert!(again.pool.is_none());
    let mut holder = pg_open(&url, &claimant("d", ttl)).await;
    assert!(matches!(holder.claim().await.unwrap(), Tenure::Held(_)));
    let pool = b.beat(&keep_b).await.unwrap().pool.unwrap();
    assert_eq!((pool.holder.as_str(), pool.epoch), ("d", 1));
    // The pool's lease given up is announced too.
    Store::release(&mut holder).await.unwrap();
    let heard = tokio::time::timeout(Duration::from_secs(5), async {
        while !b.announced().await.pool {}
    })
    .await;
    assert!(heard.is_ok(), "the pool's lease given up was not announced");

    // One secret for all.
    let secret = a.peer_secret().await.unwrap();
    assert_eq!(secret.len(), 64);
    assert_eq!(b.peer_secret().await.unwrap(), secret);
    // Leaving gives everything up at once.
    a.leave().await.unwrap();
    let left = b.beat(&keep_b).await.unwrap();
    assert_eq!(left.members, 1);
    assert_eq!(left.held_by("b").len(), 6);
}

/// Each beat records the digest of the config its process runs and
/// answers every live process's, so that the pool's holder sees which
/// processes run which config; one that left is no longer among them.
#[tokio::test]
async fn postgres_each_beat_records_its_config_and_answers_every_live_processs() {
    let (_plain, url) = pg_fresh().await;
    let ttl = Duration::from_secs(10);
    let names = vec!["p1".to_owned()];
    let mut a = pg_open(&url, &claimant("a", ttl))
        .await
        .shards(names.clone())
        .unwrap();
    let mut b = pg_open(&url, &claimant("b", ttl))
        .await
        .shards(names)
        .unwrap();
    a.set_config("one".into());
    b.set_config("one".into());
    a.beat(&[]).await.unwrap();
    let fleet = |r: &Roster| -> Vec<(String, String)> {
        (r.fleet.iter())
            .map(|m| (m.holder.clone(), m.config.clone()))
            .collect()
    };
    let roster = b.beat(&[]).await.unwrap();
    assert_eq!(roster.members, 2);
    assert_eq!(
        fleet(&roster),
        [("a".into(), "one".into()), ("b".into(), "one".into())]
    );
    assert_eq!(roster.fleet[0].address, "http://a.example:8080");
    assert_eq!(
        roster.providers.len(),
        1,
        "the leases are answered as before"
    );

    b.set_config("two".into());
    b.beat(&[]).await.unwrap();
    let roster = a.beat(&[]).await.unwrap();
    assert_eq!(
        fleet(&roster),
        [("a".into(), "one".into()), ("b".into(), "two".into())]
    );
    b.leave().await.unwrap();
    assert_eq!(
        fleet(&a.beat(&[]).await.unwrap()),
        [("a".into(), "one".into())]
    );
}

/// Requests a process standing by put into the inbox are read oldest
/// first by the pool's holder, and the commit that stores one takes its
/// entry out, under the same fence: once. A commit whose entry is gone is
/// refused whole, and one whose entry another transaction is claiming is
/// refused at once rather than made to wait.
#[tokio::test]
async fn postgres_inbox_entries_are_taken_in_once_by_the_commit_that_stores_them() {
    let (_, url) = pg_fresh().await;
    let ttl = Duration::from_secs(10);
    let mut holder = pg_open(&url, &claimant("a", ttl)).await;
    let mut standby = pg_open(&url, &claimant("b", ttl)).await;
    assert!(matches!(holder.claim().await.unwrap(), Tenure::Held(_)));
    let inbox = standby
        .request_inbox()
        .expect("a claimant's store has an inbox");
    let entry = |id| InboxEntry {
        id: RequestId(id),
        requestor: "ci".into(),
        priority: -2,
        created: T,
        wants: vec![("big".into(), 1)],
        key: None,
        metadata: Default::default(),
    };
    for id in [1, 2, 3] {
        assert!(inbox.send(&entry(id)).await.unwrap());
    }
    // An id already in the inbox, or of a stored request, is not taken.
    assert!(!inbox.send(&entry(1)).await.unwrap());
    holder
        .commit(&requests(vec![request(9, RequestState::Pending)]))
        .await
        .unwrap();
    assert!(!inbox.send(&entry(9)).await.unwrap());
    assert_eq!(
        holder.inbox(10).await.unwrap(),
        [entry(1), entry(2), entry(3)]
    );
    assert_eq!(holder.inbox(1).await.unwrap(), [entry(1)]);

    let mut taken = request(1, RequestState::Pending);
    taken.priority = -2;
    let take = |r: Request| Changes {
        taken_in: vec![r.id],
        requests: vec![r],
        ..Default::default()
    };
    holder.commit(&take(taken.clone())).await.unwrap();
    assert_eq!(holder.inbox(10).await.unwrap(), [entry(2), entry(3)]);
    // Gone already: refused whole, the request not written either.
    let refused = holder
        .commit(&Changes {
            requests: vec![request(4, RequestState::Pending)],
            taken_in: vec![RequestId(1)],
            ..Default::default()
        })
        .await;
    conflict_on(refused, "request_inbox", &RequestId(1).to_string());
    // Locked by another transaction's claim: refused without waiting.
    let other = standby.client_mut().transaction().await.unwrap();
    other
        .execute(
            "SELECT 1 FROM request_inbox WHERE id = $1 FOR UPDATE",
            &[&RequestId(2).to_string()],
        )
        .await
        .unwrap();
    let refused = tokio::time::timeout(
        Duration::from_secs(5),
        holder.commit(&take(request(2, RequestState::Pending))),
    )
    .await
    .expect("the commit waited on an entry another transaction holds");
    conflict_on(refused, "request_inbox", &RequestId(2).to_string());
    other.rollback().await.unwrap();
    holder
        .commit(&take(request(2, RequestState::Pending)))
        .await
        .unwrap();
    assert_eq!(holder.inbox(10).await.unwrap(), [entry(3)]);
    let loaded = load(&mut holder).await;
    let ids: Vec<RequestId> = loaded.snapshot.requests.iter().map(|r| r.id).collect();
    assert_eq!(ids, [RequestId(1), RequestId(2), RequestId(9)]);
    assert_eq!(loaded.snapshot.requests[0], taken);
}

/// An entry carries its idempotency key and metadata to the pool's
/// holder, and what an id holds is read back as the same entry, from the
/// inbox or from the stored request it became: a key given again is
/// compared with it.
#[tokio::test]
async fn postgres_inbox_entries_carry_their_key_and_metadata_and_are_read_back_by_id() {
    let (_, url) = pg_fresh().await;
    let ttl = Duration::from_secs(10);
    let mut holder = pg_open(&url, &claimant("a", ttl)).await;
    let standby = pg_open(&url, &claimant("b", ttl)).await;
    assert!(matches!(holder.claim().await.unwrap(), Tenure::Held(_)));
    let inbox = standby.request_inbox().expect("an inbox");
    let metadata: berth_core::pool::Metadata = [("zuul.build", "b-17"), ("note", "ünïcode ok")]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .into();
    let entry = InboxEntry {
        id: berth_core::pool::keyed_id("ci", "k-1"),
        requestor: "ci".into(),
        priority: 0,
        created: T,
        wants: vec![("big".into(), 1)],
        key: Some("k-1".into()),
        metadata: metadata.clone(),
    };
    assert_eq!(inbox.asked(entry.id).await.unwrap(), None);
    assert!(inbox.send(&entry).await.unwrap());
    assert_eq!(
        holder.inbox(10).await.unwrap(),
        std::slice::from_ref(&entry)
    );
    let waiting = inbox.asked(entry.id).await.unwrap().expect("in the inbox");
    assert_eq!(waiting, entry);
    let mut other = entry.clone();
    other.metadata.insert("note".into(), "another".into());
    assert_ne!(waiting, other);

    // Taken in and stored: read back from the requests.
    let mut stored = request(entry.id.0, RequestState::Pending);
    stored.key = entry.key.clone();
    stored.metadata = metadata;
    holder
        .commit(&Changes {
            taken_in: vec![stored.id],
            requests: vec![stored.clone()],
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(holder.inbox(10).await.unwrap().is_empty());
    let from_requests = inbox.asked(entry.id).await.unwrap().expect("stored");
    assert_eq!(from_requests, entry);
    assert!(!inbox.send(&entry).await.unwrap());
    assert_eq!(load(&mut holder).await.snapshot.requests, [stored]);
}

/// The conflict `result` must be, naming `table` and `id`.
fn conflict_on(result: Result<(), StoreError>, table: &str, id: &str) {
    match result {
        Err(StoreError::Conflict { table: t, id: i }) if t == table && i == id => {}
        other => panic!("expected a conflict on {table} `{id}`, got {other:?}"),
    }
}

async fn a_commit_over_rows_written_elsewhere_is_refused_whole_until_reloaded(backend: Backend) {
    let mut store = backend.fresh().await;
    let lease = |t: u64| RequestorLease {
        requestor: "ci".into(),
        expires: Time(t),
        ttl: Duration::from_secs(60),
    };
    store
        .commit(&Changes {
            nodes: vec![ready(1), ready(2)],
            requests: vec![request(1, RequestState::Pending)],
            leases: vec![lease(10)],
            ..Default::default()
        })
        .await
        .unwrap();
    let mut other = store.other().await;
    load(&mut other).await;
    let mut failed = ready(1);
    failed.state = NodeState::Failed {
        since: Time(50),
        reason: "written elsewhere".into(),
    };
    let elsewhere = Changes {
        nodes: vec![failed.clone(), ready(4)],
        leases: vec![lease(20)],
        purged_requests: vec![RequestId(1)],
        ..Default::default()
    };
    other.commit(&elsewhere).await.unwrap();
    let one = NodeId(1).to_string();
    let four = NodeId(4).to_string();

    // A row changed elsewhere: refused, and the new node of the same commit
    // is not written either.
    let mut in_use = ready(1);
    in_use.state = NodeState::InUse {
        request: RequestId(1),
        since: Time(99),
    };
    let refused = store
        .commit(&Changes {
            nodes: vec![in_use.clone(), ready(3)],
            ..Default::default()
        })
        .await;
    let e = refused.as_ref().unwrap_err().to_string();
    assert!(e.contains(&format!("nodes row `{one}`")), "{e}");
    conflict_on(refused, "nodes", &one);
    // A row added elsewhere under an id this store takes for new.
    conflict_on(store.commit(&nodes(vec![ready(4)])).await, "nodes", &four);
    // A row removed elsewhere is not brought back.
    let mut fulfilled = request(1, RequestState::Fulfilled { at: Time(99) });
    fulfilled.nodes = vec![NodeId(1)];
    conflict_on(
        store.commit(&requests(vec![fulfilled.clone()])).await,
        "requests",
        &RequestId(1).to_string(),
    );
    // A row renewed elsewhere is neither overwritten nor removed.
    let renew = Changes {
        leases: vec![lease(15)],
        ..Default::default()
    };
    conflict_on(store.commit(&renew).await, "leases", "ci");
    let purge = Changes {
        purged_leases: vec!["ci".into()],
        ..Default::default()
    };
    conflict_on(store.commit(&purge).await, "leases", "ci");
    let loaded = load(&mut store).await;
    assert_eq!(
        loaded.snapshot.nodes,
        vec![failed.clone(), ready(2), ready(4)]
    );
    assert_eq!(loaded.snapshot.requests, vec![]);
    assert_eq!(loaded.snapshot.leases, vec![lease(20)]);

    // Once it has read what is stored, the same store writes again, over
    // the other's rows; and the other, which has not read them, is refused.
    let over = Changes {
        nodes: vec![in_use.clone(), ready(3)],
        leases: vec![lease(30)],
        purged_nodes: vec![NodeId(4)],
        ..Default::default()
    };
    store.commit(&over).await.unwrap();
    conflict_on(other.commit(&nodes(vec![ready(1)])).await, "nodes", &one);
    conflict_on(
        other.commit(&nodes(vec![ready(3)])).await,
        "nodes",
        &NodeId(3).to_string(),
    );
    let loaded = load(&mut other).await;
    assert_eq!(loaded.snapshot.nodes, vec![in_use, ready(2), ready(3)]);
    assert_eq!(loaded.snapshot.leases, vec![lease(30)]);
}

/// Whether the server says `store`'s session is TLS.
async fn over_tls(store: &PgStore) -> bool {
    let sql = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()";
    store.client().query_one(sql, &[]).await.unwrap().get(0)
}

/// `sslmode=verify-full` with the cluster's CA connects over TLS (the server
/// says so of the session); a CA file that cannot be read or holds no
/// certificate is refused before anything is sent, naming the file; and the
/// system's roots do not make a private CA's server trusted.
#[tokio::test]
async fn postgres_over_tls_trusts_only_the_ca_file_given() {
    let cluster = cluster::PgCluster::shared(&workspace_root());
    let url = cluster.fresh_database("tls");
    let open = |url: String, ca_file: Option<std::path::PathBuf>| async move {
        let settings = berth_config::Postgres {
            url,
            password: None,
            pool_lease_ttl: Duration::from_secs(10),
            ca_file,
        };
        PgStore::open(&settings, Arc::new(config()), None).await
    };
    let verified = format!("{url}?sslmode=verify-full");
    let store = open(verified.clone(), Some(cluster.ca_file()))
        .await
        .unwrap();
    assert!(over_tls(&store).await);
    // Without TLS asked for, none is used, even with the server offering it.
    let plain = open(url.clone(), None).await.unwrap();
    assert!(!over_tls(&plain).await);

    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pem");
    let e = open(verified.clone(), Some(missing.clone()))
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains(&format!("reading the CA file {}", missing.display())),
        "{e}"
    );
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let e = open(verified.clone(), Some(junk))
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("holds no certificate"), "{e}");
    let e = open(verified, None).await.err().unwrap().to_string();
    assert!(
        e.contains("invalid peer certificate") || e.contains("no root certificates"),
        "{e}"
    );
}

/// A new store draws its identity (unconfirmed: it has not faced the
/// clouds), keeps it across reopens, and records its confirmation.
async fn a_store_has_one_identity_for_life_and_records_its_confirmation(backend: Backend) {
    let mut store = backend.fresh().await;
    let first = load(&mut store).await.snapshot.identity;
    assert!(berth_core::pool::is_generation(&first.generation));
    assert!(!first.confirmed, "new: not yet faced the clouds");
    assert_ne!(first.key, [0; 32]);
    let other = store.other().await;
    let mut other = other;
    assert_eq!(
        load(&mut other).await.snapshot.identity,
        first,
        "one per store"
    );
    drop(other);
    let confirmed = Identity {
        confirmed: true,
        ..first.clone()
    };
    store
        .commit(&Changes {
            identity: Some(confirmed.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut store = store.reopen().await;
    assert_eq!(load(&mut store).await.snapshot.identity, confirmed);
    // Another store has another.
    let mut elsewhere = backend.fresh().await;
    let theirs = load(&mut elsewhere).await.snapshot.identity;
    assert_ne!(theirs.generation, first.generation);
    assert_ne!(theirs.key, first.key);
}

/// A store made before identities, holding records, gains one confirmed:
/// its instances are its own, and the first start signs them.
#[tokio::test]
async fn a_store_in_use_from_before_identities_gains_a_confirmed_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("berth.db");
    let before = "ALTER TABLE nodes DROP COLUMN failure; \
                  ALTER TABLE requests DROP COLUMN last_failure; \
                  ALTER TABLE nodes RENAME COLUMN packing TO role; DROP TABLE pool_identity; \
                  PRAGMA user_version = 3;";
    left_by_an_older_berth(&path, vec![ready(1)], before).await;
    let mut store = SqliteStore::open(&path, Arc::new(config()), StoreSync::Full).unwrap();
    let identity = load(&mut store).await.snapshot.identity;
    assert!(identity.confirmed);
    // An empty one gains an unconfirmed one.
    let empty = dir.path().join("empty.db");
    left_by_an_older_berth(&empty, Vec::new(), before).await;
    let mut store = SqliteStore::open(&empty, Arc::new(config()), StoreSync::Full).unwrap();
    assert!(!load(&mut store).await.snapshot.identity.confirmed);
}

/// An identity row that cannot be read back stops the load, naming it.
#[tokio::test]
async fn a_damaged_identity_is_corrupt_naming_its_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("berth.db");
    let mut store = SqliteStore::open(&path, Arc::new(config()), StoreSync::Full).unwrap();
    for (sql, column) in [
        ("UPDATE pool_identity SET generation = 'XYZ'", "generation"),
        (
            "UPDATE pool_identity SET generation = '0011223344556677', key = 'ab'",
            "key",
        ),
        (
            "UPDATE pool_identity SET key = printf('%064d', 0), confirmed = 7",
            "confirmed",
        ),
        ("DELETE FROM pool_identity", "id"),
    ] {
        store.conn.execute_batch(sql).unwrap();
        let e = store.load(&config()).await.unwrap_err();
        assert!(
            matches!(&e, StoreError::Corrupt { table: "pool_identity", column: c, .. } if *c == column),
            "{sql}: {e}"
        );
    }
}

/// SQLite's integrity check runs at open: a damaged page refuses the
/// store, saying what SQLite found.
#[tokio::test]
async fn a_damaged_file_is_refused_at_open_with_what_sqlite_found() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("berth.db");
    {
        let mut store = SqliteStore::open(&path, Arc::new(config()), StoreSync::Full).unwrap();
        let many: Vec<Node> = (1..=400).map(ready).collect();
        store.commit(&nodes(many)).await.unwrap();
    }
    // Overwrite the middle of the second page onwards (a b-tree page of the
    // nodes table) with garbage.
    let mut bytes = std::fs::read(&path).unwrap();
    assert!(bytes.len() > 3 * 4096, "{} bytes", bytes.len());
    for b in &mut bytes[4096 + 8..4096 + 200] {
        *b = 0xa5;
    }
    std::fs::write(&path, &bytes).unwrap();
    let e = SqliteStore::open(&path, Arc::new(config()), StoreSync::Full)
        .err()
        .expect("refused");
    let text = e.to_string();
    assert!(matches!(e, StoreError::Damaged { .. }), "{e:?}");
    assert!(text.contains("integrity check found"), "{text}");
}

/// The store's file removed, replaced or emptied, or its directory
/// removed, under an open store: the next commit (and a check) fails
/// naming what happened, so nothing is acted on as if recorded.
#[tokio::test]
async fn a_store_file_removed_replaced_or_emptied_is_noticed() {
    type Harm = fn(&std::path::Path);
    let harms: [(Harm, &str); 4] = [
        (|p| std::fs::remove_file(p).unwrap(), "is gone"),
        (
            |p| {
                let other = p.with_extension("other");
                std::fs::copy(p, &other).unwrap();
                std::fs::rename(&other, p).unwrap();
            },
            "was replaced",
        ),
        (
            |p| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(p)
                    .unwrap()
                    .set_len(0)
                    .unwrap()
            },
            "emptied",
        ),
        (
            |p| std::fs::remove_dir_all(p.parent().unwrap()).unwrap(),
            "directory",
        ),
    ];
    for (harm, says) in harms {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state").join("berth.db");
        std::fs::create_dir(path.parent().unwrap()).unwrap();
        let mut store = SqliteStore::open(&path, Arc::new(config()), StoreSync::Full).unwrap();
        store.commit(&nodes(vec![ready(1)])).await.unwrap();
        store.confirm().await.unwrap();
        assert_eq!(store.watch_every(), Some(Duration::from_secs(1)));
        harm(&path);
        let e = store.confirm().await.unwrap_err();
        assert!(
            matches!(&e, StoreError::Vanished { what, .. } if what.contains(says)),
            "{says}: {e}"
        );
        let e = store.commit(&nodes(vec![ready(2)])).await;
        assert!(
            matches!(e, Err(StoreError::Vanished { .. })),
            "{says}: {e:?}"
        );
    }
}
