//! Store round trips: every state, role and request shape survives a commit
//! and a reopen; the schema is versioned; a slot cannot be held twice.

use std::path::Path;

use super::*;
use crate::driver::Connection as Login;

fn config() -> Arc<Config> {
    let text = r#"
pool-id = "p"
[providers.a]
driver = "x.wasm"
[labels.big]
[labels.big.providers.a]
instance-type = "big"
image = "img"
vcpus = 8
ram = "32GiB"
[labels.slot]
slots = 3
backing-label = "big"
"#;
    Arc::new(crate::config::parse(text, Path::new("."), &|_| None).expect("config"))
}

fn node(id: u64, state: NodeState) -> Node {
    Node {
        id: NodeId(id),
        label: LabelIx(0),
        provider: ProviderIx(0),
        instance_type: "big".into(),
        resources: Resources {
            vcpus: 8,
            ram_mib: 32768,
        },
        price: 0.25,
        instance: Some(format!("i-{id}")),
        state,
        idle: Idle::Run,
        role: Role::Plain,
        assigned: None,
        created: Time(5),
        endpoint: None,
    }
}

fn sorted(mut nodes: Vec<Node>) -> Vec<Node> {
    nodes.sort_by_key(|n| n.id);
    nodes
}

#[test]
fn every_state_role_and_request_round_trips_across_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("berth.db");
    let t = Time(1000);
    let r = RequestId(77);
    let mut nodes = vec![
        node(
            1,
            NodeState::Creating {
                since: t,
                attempt: 2,
            },
        ),
        node(2, NodeState::Booting { since: t }),
        node(3, NodeState::Ready { since: t }),
        node(
            4,
            NodeState::InUse {
                request: r,
                since: t,
            },
        ),
        node(5, NodeState::Used { since: t }),
        node(
            6,
            NodeState::Deleting {
                since: t,
                reason: DeleteReason::BootTimeout,
            },
        ),
        node(
            7,
            NodeState::Gone {
                since: t,
                reason: GoneReason::Vanished,
            },
        ),
        node(
            8,
            NodeState::Failed {
                since: t,
                reason: "no image".into(),
            },
        ),
    ];
    nodes[2].idle = Idle::Hold;
    nodes[2].endpoint = Some(Box::new(Endpoint {
        addresses: Addresses {
            private_ipv4: Some("10.0.0.1".into()),
            ..Default::default()
        },
        connection: Login {
            username: Some("berth".into()),
            port: Some(22),
            host_keys: vec!["ssh-ed25519 AAA".into()],
        },
    }));
    nodes[1].assigned = Some(RequestId(78));
    // A backing node with slots 0 and 2 taken.
    let mut backing = node(10, NodeState::Ready { since: t });
    backing.role = Role::Backing {
        slot_label: LabelIx(1),
        slots: vec![Some(NodeId(11)), None, Some(NodeId(12))],
        free_since: None,
    };
    let mut s1 = node(
        11,
        NodeState::InUse {
            request: r,
            since: t,
        },
    );
    s1.label = LabelIx(1);
    s1.resources = Resources::default();
    s1.role = Role::Slot {
        backing: NodeId(10),
        index: 0,
    };
    let mut s2 = s1.clone();
    s2.id = NodeId(12);
    s2.role = Role::Slot {
        backing: NodeId(10),
        index: 2,
    };
    nodes.extend([backing, s1, s2]);
    let requests = vec![
        Request {
            id: r,
            requestor: "ci".into(),
            priority: -3,
            created: t,
            wants: vec![(LabelIx(0), 1), (LabelIx(1), 2)],
            state: RequestState::Fulfilled { at: Time(2000) },
            nodes: vec![NodeId(4), NodeId(11), NodeId(12)],
            failures: 1,
        },
        Request {
            id: RequestId(78),
            requestor: "ci".into(),
            priority: 0,
            created: t,
            wants: vec![(LabelIx(0), 1)],
            state: RequestState::Pending,
            nodes: vec![NodeId(2)],
            failures: 0,
        },
        Request {
            id: RequestId(79),
            requestor: "x".into(),
            priority: 0,
            created: t,
            wants: vec![(LabelIx(0), 1)],
            state: RequestState::Failed {
                at: t,
                reason: "because".into(),
            },
            nodes: vec![],
            failures: 4,
        },
        Request {
            id: RequestId(80),
            requestor: "x".into(),
            priority: 0,
            created: t,
            wants: vec![(LabelIx(0), 1)],
            state: RequestState::Cancelled { at: t },
            nodes: vec![],
            failures: 0,
        },
    ];
    {
        let mut store = SqliteStore::open(&path, config()).unwrap();
        store
            .commit(&Changes {
                nodes: nodes.clone(),
                requests: requests.clone(),
                ..Default::default()
            })
            .unwrap();
    }
    let mut store = SqliteStore::open(&path, config()).unwrap();
    assert_eq!(store.schema_version().unwrap(), MIGRATIONS.len() as u32);
    let loaded = store.load(&config()).unwrap();
    assert!(loaded.dropped.is_empty(), "{:?}", loaded.dropped);
    assert_eq!(sorted(loaded.snapshot.nodes), sorted(nodes));
    let mut got = loaded.snapshot.requests;
    got.sort_by_key(|r| r.id);
    assert_eq!(got, requests);

    // Purges remove rows; freeing a slot rewrites the backing's assignments.
    let mut freed = node(10, NodeState::Ready { since: t });
    freed.role = Role::Backing {
        slot_label: LabelIx(1),
        slots: vec![None, None, Some(NodeId(12))],
        free_since: None,
    };
    store
        .commit(&Changes {
            nodes: vec![freed],
            purged_nodes: vec![NodeId(11), NodeId(7)],
            purged_requests: vec![RequestId(80)],
            ..Default::default()
        })
        .unwrap();
    assert!(!node_row_exists(&store, NodeId(11)));
    let loaded = store.load(&config()).unwrap();
    assert_eq!(loaded.snapshot.nodes.len(), 9);
    assert_eq!(loaded.snapshot.requests.len(), 3);
}

#[test]
fn a_slot_cannot_be_held_twice_and_the_bad_commit_writes_nothing() {
    let mut store = SqliteStore::open_in_memory(config()).unwrap();
    let mut backing = node(10, NodeState::Ready { since: Time(1) });
    backing.role = Role::Backing {
        slot_label: LabelIx(1),
        slots: vec![Some(NodeId(11)), Some(NodeId(11)), None],
        free_since: None,
    };
    let err = store
        .commit(&Changes {
            nodes: vec![node(20, NodeState::Ready { since: Time(1) }), backing],
            ..Default::default()
        })
        .unwrap_err();
    assert!(err.to_string().contains("slot"), "{err}");
    assert!(!node_row_exists(&store, NodeId(20)));
}

#[test]
fn records_that_no_longer_fit_the_config_are_dropped_or_failed() {
    let mut store = SqliteStore::open_in_memory(config()).unwrap();
    store
        .commit(&Changes {
            nodes: vec![node(1, NodeState::Ready { since: Time(1) })],
            requests: vec![Request {
                id: RequestId(2),
                requestor: "ci".into(),
                priority: 0,
                created: Time(1),
                wants: vec![(LabelIx(0), 1)],
                state: RequestState::Pending,
                nodes: vec![],
                failures: 0,
            }],
            ..Default::default()
        })
        .unwrap();
    let mut other = (*config()).clone();
    other.labels[0].name = "renamed".into();
    let loaded = store.load(&other).unwrap();
    assert!(loaded.snapshot.nodes.is_empty());
    assert!(
        loaded.dropped[0].contains("deleted as a leak"),
        "{:?}",
        loaded.dropped
    );
    assert_eq!(
        loaded.snapshot.requests[0].state,
        RequestState::Failed {
            at: Time(1),
            reason: "label `big` is no longer configured".into()
        }
    );
}

#[test]
fn a_newer_schema_is_refused_and_reopening_is_a_no_op() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("berth.db");
    drop(SqliteStore::open(&path, config()).unwrap());
    drop(SqliteStore::open(&path, config()).unwrap());
    let conn = Connection::open(&path).unwrap();
    conn.pragma_update(None, "user_version", 99).unwrap();
    drop(conn);
    match SqliteStore::open(&path, config()) {
        Err(StoreError::TooNew { found: 99, known }) => assert_eq!(known, MIGRATIONS.len() as u32),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("opened a newer schema"),
    }
}

#[test]
fn ten_thousand_nodes_commit_and_load() {
    let mut store = SqliteStore::open_in_memory(config()).unwrap();
    let nodes: Vec<Node> = (1..=10_000)
        .map(|i| node(i, NodeState::Ready { since: Time(i) }))
        .collect();
    store
        .commit(&Changes {
            nodes: nodes.clone(),
            ..Default::default()
        })
        .unwrap();
    let loaded = store.load(&config()).unwrap();
    assert_eq!(sorted(loaded.snapshot.nodes), nodes);
}
