//! The static-hosts driver (`plugins/static`) through the real sandbox: its
//! slots live in the host's driver records (the `state` import) and its ready
//! check is the host's TCP probe (the `net` import), both under the
//! provider's allow-list.

use berth::conformance::{self, TestConfig};
use berth::driver::{InstanceState, POOL_TAG};
use berth::plugin::SandboxLimits;
use serde_json::json;

use crate::support::config::hosts;
use crate::support::plugin;
use crate::support::sandbox::{engine, provider, spec};

#[tokio::test]
async fn static_driver_passes_the_conformance_kit() {
    let a = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let b = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addrs = [a.local_addr().unwrap(), b.local_addr().unwrap()];
    let config: TestConfig = serde_json::from_value(json!({
        "config": hosts(&addrs, 2),
        "allow_hosts": addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "create": {"instance_type": "small", "image": "static"},
    }))
    .unwrap();
    let report = conformance::test(&engine(), &plugin("static"), &config).await;
    assert!(report.passed(), "{report}");
}

#[tokio::test]
async fn slots_are_shared_by_every_instance_and_run_out_as_capacity() {
    let a = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = a.local_addr().unwrap();
    let limits = SandboxLimits {
        max_instances: 4,
        ..SandboxLimits::default()
    };
    let p = provider(
        &engine(),
        "static",
        "lab",
        hosts(&[addr], 2),
        limits,
        &[&addr.to_string()],
    )
    .await;
    // Concurrent creates land on different driver instances; the records
    // (compare-and-swap) still hand out each slot once.
    let (x, y, z) = tokio::join!(
        p.create(spec("n-1")),
        p.create(spec("n-2")),
        p.create(spec("n-3"))
    );
    let results = [("n-1", x), ("n-2", y), ("n-3", z)];
    let mut ok: Vec<String> = results
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok().map(|i| i.id.clone()))
        .collect();
    ok.sort();
    assert_eq!(ok, ["build-0/0", "build-0/1"], "{results:?}");
    let refused = results.iter().find_map(|(_, r)| r.as_ref().err()).unwrap();
    assert!(
        refused.to_string().contains("capacity"),
        "the third create: {refused}"
    );
    // A retried create of a node that holds a slot gets the same slot.
    let (node, first) = results.iter().find(|(_, r)| r.is_ok()).unwrap();
    let again = p.create(spec(node)).await.unwrap();
    assert_eq!(again.id, first.as_ref().unwrap().id);
}

#[tokio::test]
async fn a_host_is_pending_until_its_port_answers_and_probes_obey_the_allow_list() {
    // A port with nothing listening: bind, note it, let go.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = free.local_addr().unwrap();
    drop(free);
    let p = provider(
        &engine(),
        "static",
        "lab",
        hosts(&[addr], 1),
        SandboxLimits::default(),
        &[&addr.to_string()],
    )
    .await;
    let made = p.create(spec("n-1")).await.unwrap();
    assert_eq!(made.state, InstanceState::Pending);
    let pool = [(POOL_TAG.to_string(), "pool".to_string())].into();
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let listed = p.list(pool).await.unwrap();
    assert_eq!(listed[0].state, InstanceState::Running, "{listed:?}");
    assert_eq!(p.denied_requests(), 0);
    drop(listener);

    // The same host with nothing allowed: the probe is refused by the host,
    // counted, and the slot stays pending.
    let p = provider(
        &engine(),
        "static",
        "closed",
        hosts(&[addr], 1),
        SandboxLimits::default(),
        &[],
    )
    .await;
    let _listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let made = p.create(spec("n-2")).await.unwrap();
    assert_eq!(made.state, InstanceState::Pending);
    assert!(p.denied_requests() >= 1);
}
