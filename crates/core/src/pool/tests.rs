//! Table-driven tests of the pool core's decisions, each run through the
//! harness in `testkit`: a fake cloud carries out the calls the core makes,
//! and the clock only moves when a test moves it.

use std::time::Duration;

use super::testkit::*;
use super::*;
use crate::config::{Label, Offer};
use crate::driver::{DriverError, Instance, InstanceState, LABEL_TAG, NODE_TAG, POOL_TAG, Page};

/// One provider `p0` and one machine label `a` on it.
fn one(f: impl FnOnce(&mut Config)) -> Harness {
    let mut c = config(
        vec![provider("p0")],
        vec![machine("a", vec![offer(0, "t0")])],
    );
    f(&mut c);
    Harness::new(c)
}

/// One provider `p0` with room for `max` instances, machine label `a`
/// keeping `min_ready` ready, and machine label `other`.
fn a_and(other: &str, max: u32, min_ready: u32) -> Harness {
    let mut c = config(
        vec![provider("p0")],
        vec![
            machine("a", vec![offer(0, "ta")]),
            machine(other, vec![offer(0, &format!("t{other}"))]),
        ],
    );
    c.providers[0].limits.max_instances = Some(max);
    c.labels[0].min_ready = min_ready;
    Harness::new(c)
}

fn a_mut(c: &mut Config) -> &mut Label {
    &mut c.labels[0]
}

/// Steps, then asserts the harness saw nothing wrong.
fn settle(h: &mut Harness) {
    h.step();
    ok(h);
}

fn ok(h: &Harness) {
    if let Err(e) = h.check() {
        panic!("invariant broken at {:?}: {e}", h.now);
    }
}

fn creates(h: &Harness) -> Vec<(u16, NodeId)> {
    h.log
        .iter()
        .filter_map(|(_, e)| match e {
            Effect::Call(DriverCall::Create { provider, node, .. }) => Some((provider.0, *node)),
            _ => None,
        })
        .collect()
}

fn reason(h: &Harness, r: RequestId) -> String {
    match h.state(r) {
        RequestState::Failed { reason, .. } => reason,
        other => panic!("request is {other:?}, not failed"),
    }
}

/// The pool's tags without a signature: what someone without the store's
/// key can make.
fn owned_tags(h: &Harness, node: &str, label: &str) -> Tags {
    [
        (POOL_TAG.to_string(), h.config.pool_id.clone()),
        (NODE_TAG.to_string(), node.to_string()),
        (LABEL_TAG.to_string(), label.to_string()),
    ]
    .into()
}

// ---- prewarming and serving -------------------------------------------

#[test]
fn prewarm_fills_min_ready_and_refills() {
    let mut h = one(|c| a_mut(c).min_ready = 3);
    settle(&mut h);
    assert_eq!(h.count("a", "ready"), 3);
    assert_eq!(h.live(0), 3);
    // Nothing is created before the provider's first list.
    let first_list = h.calls(0, Call::List)[0];
    assert!(h.calls(0, Call::Create).iter().all(|t| *t >= first_list));
    let r = h.submit(&[("a", 2)], 0);
    settle(&mut h);
    assert!(h.fulfilled(r));
    assert_eq!(h.count("a", "in-use"), 2);
    assert_eq!(h.count("a", "ready"), 3, "min-ready is refilled");
    assert_eq!(h.calls(0, Call::Create).len(), 5);
}

#[test]
fn ready_nodes_are_served_oldest_first() {
    let mut h = one(|c| a_mut(c).reuse = true);
    settle(&mut h);
    let r1 = h.submit(&[("a", 1)], 0);
    let r2 = h.submit(&[("a", 1)], 0);
    settle(&mut h);
    let x = h.pool.request(r1).unwrap().nodes[0];
    let y = h.pool.request(r2).unwrap().nodes[0];
    h.advance(secs(10));
    h.release(y);
    h.advance(secs(10));
    h.release(x);
    settle(&mut h);
    assert_eq!(h.count("a", "ready"), 2);
    let r3 = h.submit(&[("a", 1)], 0);
    settle(&mut h);
    assert_eq!(
        h.pool.request(r3).unwrap().nodes,
        vec![y],
        "y has waited longest"
    );
    assert_eq!(
        h.calls(0, Call::Create).len(),
        2,
        "no launch while ready nodes wait"
    );
}

#[test]
fn a_node_set_is_served_whole_or_not_at_all() {
    let mut h = a_and("b", 3, 2);
    settle(&mut h);
    assert_eq!(h.count("a", "ready"), 2);
    // 2 a are ready, but only one b fits: nothing is set aside.
    let big = h.submit(&[("a", 2), ("b", 2)], 0);
    settle(&mut h);
    assert_eq!(h.state(big), RequestState::Pending);
    assert!(h.pool.request(big).unwrap().nodes.is_empty());
    assert_eq!(h.pool.free_ready(h.label("a")), 2);
    assert_eq!(h.count("b", "creating") + h.count("b", "ready"), 0);
    // A request that fits is not held up behind it.
    let small = h.submit(&[("a", 1), ("b", 1)], 5);
    settle(&mut h);
    assert!(h.fulfilled(small));
    assert_eq!(h.state(big), RequestState::Pending);
}

#[test]
fn requests_are_served_by_priority_and_a_blocked_one_does_not_block_others() {
    let mut h = one(|c| c.providers[0].limits.max_instances = Some(2));
    let low = h.submit(&[("a", 1)], 10);
    let high = h.submit(&[("a", 1)], 1);
    let higher = h.submit(&[("a", 1)], 0);
    settle(&mut h);
    assert!(h.fulfilled(higher) && h.fulfilled(high));
    assert_eq!(h.state(low), RequestState::Pending);
    // One node comes back: `low` gets the room.
    let n = h.pool.request(higher).unwrap().nodes[0];
    h.release(n);
    h.advance(secs(1));
    assert!(h.fulfilled(low), "{:?}", h.state(low));
    // Now a big request (2 nodes, 0 room) waits, a small later one (1 node)
    // still cannot: both wait; when one node is freed, the small one is
    // served because the big one cannot be.
    let big = h.submit(&[("a", 2)], 0);
    let small = h.submit(&[("a", 1)], 9);
    settle(&mut h);
    assert_eq!(h.state(big), RequestState::Pending);
    let n = h.pool.request(high).unwrap().nodes[0];
    h.release(n);
    h.advance(secs(1));
    assert!(h.fulfilled(small), "{:?}", h.state(small));
    assert_eq!(h.state(big), RequestState::Pending);
    for r in [low, small] {
        let n = h.pool.request(r).unwrap().nodes[0];
        h.release(n);
    }
    h.advance(secs(1));
    assert!(h.fulfilled(big));
    ok(&h);
}

#[test]
fn a_blocked_request_evicts_unused_ready_nodes_of_other_labels() {
    let mut c = config(
        vec![provider("p0"), provider("p1")],
        vec![
            machine("a", vec![offer(0, "t0"), offer(1, "t1")]),
            machine("x", vec![offer(0, "t0")]),
        ],
    );
    c.providers[0].limits.max_instances = Some(2);
    c.providers[1].priority = 1;
    c.labels[0].min_ready = 1;
    let mut h = Harness::new(c);
    settle(&mut h);
    let old = h.nodes("a", "ready")[0].id;
    assert_eq!(h.pool.node(old).unwrap().provider, ProviderIx(0));
    // x fits on p0 only if the ready a node goes; min-ready does not keep it.
    let r = h.submit(&[("x", 2)], 0);
    settle(&mut h);
    assert!(h.fulfilled(r), "{:?}", h.state(r));
    assert_eq!(
        h.pool.node(old).unwrap().state,
        NodeState::Gone {
            since: h.pool.node(old).unwrap().state.since(),
            reason: GoneReason::Deleted
        }
    );
    // The refill goes where there is room, and does not take p0's back.
    let a = h.nodes("a", "ready");
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].provider, ProviderIx(1));
    assert_eq!(h.pool.provider_status(ProviderIx(0)).usage.instances, 2);
}

#[test]
fn nothing_is_evicted_for_a_request_that_would_still_not_fit() {
    let mut h = a_and("x", 3, 1);
    settle(&mut h);
    let first = h.submit(&[("x", 2)], 0);
    settle(&mut h);
    assert!(h.fulfilled(first));
    // 3 of 3 used: the ready a would make room for one x, not for two.
    let second = h.submit(&[("x", 2)], 0);
    settle(&mut h);
    assert_eq!(h.state(second), RequestState::Pending);
    assert_eq!(h.count("a", "ready"), 1, "a is kept");
    // Held and in-use nodes are never evicted either: with one x returned,
    // the ready a goes and the request is served.
    let n = h.pool.request(first).unwrap().nodes[0];
    h.release(n);
    h.advance(secs(1));
    ok(&h);
    assert!(h.fulfilled(second), "{:?}", h.state(second));
    assert_eq!(h.count("a", "ready"), 0);
}

#[test]
fn held_ready_nodes_are_not_evicted() {
    let mut h = a_and("x", 1, 1);
    settle(&mut h);
    let a = h.nodes("a", "ready")[0].id;
    h.set_idle(a, Idle::Hold);
    let r = h.submit(&[("x", 1)], 0);
    settle(&mut h);
    assert_eq!(h.state(r), RequestState::Pending);
    assert_eq!(h.count("a", "ready"), 1);
}

#[test]
fn a_node_set_plans_its_most_constrained_label_first() {
    let mut c = config(
        vec![provider("p0"), provider("p1")],
        vec![
            machine("a", vec![offer(0, "t0"), offer(1, "t1")]),
            machine("x", vec![offer(0, "t0")]),
        ],
    );
    c.providers[0].limits.max_instances = Some(2);
    c.providers[1].limits.max_instances = Some(2);
    c.providers[1].priority = 1;
    let mut h = Harness::new(c);
    // a would take p0 first and leave x no room, though both fit.
    let r = h.submit(&[("a", 2), ("x", 2)], 0);
    settle(&mut h);
    assert!(h.fulfilled(r), "{:?}", h.state(r));
    assert!(
        h.nodes("a", "in-use")
            .iter()
            .all(|n| n.provider == ProviderIx(1))
    );
}

// ---- a new config while running --------------------------------------------

/// A reload raises `min-ready` and adds a label: the pool prewarms up to
/// the new figure, serves the new label at once, and keeps every node it
/// had. A reload that moves a label or changes the providers is refused
/// and changes nothing.
#[test]
fn a_new_config_is_taken_between_steps_and_keeps_every_node() {
    let mut h = one(|c| a_mut(c).min_ready = 2);
    settle(&mut h);
    let ids = |h: &Harness| -> Vec<NodeId> { h.nodes("a", "ready").iter().map(|n| n.id).collect() };
    let before = ids(&h);
    assert_eq!(before.len(), 2);

    let mut c = (*h.config).clone();
    c.labels[0].min_ready = 4;
    c.labels.push(machine("b", vec![offer(0, "tb")]));
    c.labels[1].min_ready = 1;
    c.providers[0].rate = Some(1.0);
    c.providers[0].burst = 1;
    let c = Arc::new(c);
    h.pool.reconfigure(c.clone(), h.now).expect("a live change");
    h.config = c;
    let (from, calls) = (h.now, h.log.len());
    h.advance(secs(10));
    ok(&h);
    assert_eq!(h.count("a", "ready"), 4, "min-ready raised");
    assert_eq!(h.count("b", "ready"), 1, "the new label prewarmed");
    let after = ids(&h);
    assert!(before.iter().all(|n| after.contains(n)), "no node lost");
    // The new rate: one call a second.
    let times: Vec<Time> = (h.log[calls..].iter())
        .filter(|(_, e)| matches!(e, Effect::Call(_)))
        .map(|(t, _)| *t)
        .collect();
    assert!(times.len() >= 3, "{times:?}");
    assert!(
        times.windows(2).all(|w| w[1] >= w[0] + secs(1)),
        "{from:?}: {times:?}"
    );
    let r = h.submit(&[("b", 2)], 0);
    h.advance(secs(10));
    ok(&h);
    assert!(h.fulfilled(r), "the new label served");

    // Refused whole: a label moved, a provider renamed (in its place), a
    // kind changed.
    let config = h.pool.config().clone();
    let mut moved = (*config).clone();
    moved.labels.swap(0, 1);
    let mut renamed = (*config).clone();
    renamed.providers[0].name = "p1".into();
    let mut kind = (*config).clone();
    kind.labels[1] = slots("b", 0, 2);
    for (bad, why) in [
        (moved, "is not at its index"),
        (renamed, "provider p0 is not at its index"),
        (kind, "cannot change its kind"),
    ] {
        let err = h.pool.reconfigure(Arc::new(bad), h.now).expect_err(why);
        assert!(err.contains(why), "{err}");
        assert!(
            Arc::ptr_eq(h.pool.config(), &config),
            "the running config stays"
        );
    }
    settle(&mut h);
}

/// A label removed by a reload: its pending request fails, its free
/// nodes are deleted, the one in use is deleted once released, and the
/// one an operator holds stays held; nothing is launched for it again,
/// and a request for it is refused. The other label goes on.
#[test]
fn a_label_removed_while_running_is_drained_and_asked_for_no_more() {
    let mut h = a_and("b", 6, 3);
    let mut c = (*h.config).clone();
    c.labels[1].min_ready = 1;
    let c = Arc::new(c);
    h.pool.reconfigure(c.clone(), h.now).expect("live");
    h.config = c;
    settle(&mut h);
    assert_eq!((h.count("a", "ready"), h.count("b", "ready")), (3, 1));
    let used = h.submit(&[("a", 1)], 0);
    settle(&mut h);
    let in_use = h.pool.request(used).unwrap().nodes[0];
    let held = h.nodes("a", "ready")[0].id;
    h.set_idle(held, Idle::Hold);
    // Six instances at most: this one waits.
    let waits = h.submit(&[("a", 5)], 0);
    settle(&mut h);
    assert_eq!(h.state(waits), RequestState::Pending);

    let mut c = (*h.config).clone();
    c.labels[0].retired = true;
    let c = Arc::new(c);
    h.pool.reconfigure(c.clone(), h.now).expect("live");
    h.config = c;
    h.persist();
    given_up_as_removed(&mut h, waits);
    assert_eq!(h.count("a", "ready"), 1, "only the held one");
    assert_eq!(h.nodes("a", "ready")[0].id, held);
    assert_eq!(h.count("a", "in-use"), 1);
    assert_eq!(h.count("b", "ready"), 1, "the other label goes on");
    h.release(in_use);
    h.advance(secs(5));
    ok(&h);
    assert_eq!(h.count("a", "in-use"), 0);
    assert_eq!(h.live(0), 2, "the held node and b's");
    let refused = h.pool.submit(
        h.now,
        NewRequest {
            requestor: "test".into(),
            priority: 0,
            wants: vec![(LabelIx(0), 1)],
            ..NewRequest::default()
        },
    );
    assert_eq!(refused, Err(Refused::Removed("a".into())));
    let launched = creates(&h).len();
    h.advance(secs(30));
    ok(&h);
    assert_eq!(creates(&h).len(), launched, "nothing launched for it again");
}

/// Five seconds on, request `waits` has failed because label `a` was
/// removed, and every invariant holds.
fn given_up_as_removed(h: &mut Harness, waits: RequestId) {
    h.advance(secs(5));
    ok(h);
    assert!(
        reason(h, waits).contains("label `a` was removed"),
        "{}",
        reason(h, waits)
    );
}

/// A process that reloaded a config without label `a` takes the pool over
/// from one that still ran `a`: restored under the new config, the pool
/// gives up `a`'s pending request and drains its free nodes, as a reload
/// would have, and stores both.
#[test]
fn a_pool_taken_over_under_a_config_that_retired_a_label_gives_it_up() {
    let mut h = a_and("b", 6, 3);
    settle(&mut h);
    let used = h.submit(&[("a", 1)], 0);
    settle(&mut h);
    let in_use = h.pool.request(used).unwrap().nodes[0];
    let waits = h.submit(&[("a", 6)], 0);
    settle(&mut h);
    assert_eq!(h.state(waits), RequestState::Pending);
    h.persist();

    let mut c = (*h.config).clone();
    c.labels[0].retired = true;
    h.config = Arc::new(c);
    h.crash();
    given_up_as_removed(&mut h, waits);
    assert_eq!(h.count("a", "ready"), 0);
    assert_eq!(h.count("a", "in-use"), 1, "the node in use stays");
    h.release(in_use);
    h.advance(secs(5));
    ok(&h);
    assert_eq!(h.count("a", "in-use"), 0);
    h.crash();
    assert_eq!(
        h.state(waits),
        h.pool.request(waits).unwrap().state,
        "stored"
    );
    assert!(matches!(h.state(waits), RequestState::Failed { .. }));
}

/// A reload adds provider `p1` and removes `p0`, moving label `a` over:
/// `a` is prewarmed on `p1`; `p0`'s free nodes are deleted and its node in
/// use once released; `p0` is still listed, so nothing on it is leaked.
#[test]
fn a_provider_added_serves_and_one_removed_is_drained() {
    let mut h = one(|c| a_mut(c).min_ready = 2);
    settle(&mut h);
    let r = h.submit(&[("a", 1)], 0);
    settle(&mut h);
    let in_use = h.pool.request(r).unwrap().nodes[0];
    assert_eq!(h.live(0), 3);

    let mut c = (*h.config).clone();
    c.providers.push(provider("p1"));
    c.providers[0].retired = true;
    c.labels[0].kind = LabelKind::Machine {
        offers: vec![offer(1, "t1")],
    };
    let c = Arc::new(c);
    h.cloud.providers.push(Default::default());
    h.pool.reconfigure(c.clone(), h.now).expect("live");
    h.config = c;
    h.persist();
    h.advance(secs(10));
    ok(&h);
    assert_eq!(h.live(1), 2, "prewarmed on the provider added");
    assert_eq!(h.live(0), 1, "only the node in use is left on p0");
    let on = |h: &Harness, p: u16| -> Vec<NodeId> {
        (h.nodes("a", "ready").iter())
            .filter(|n| n.provider.0 == p)
            .map(|n| n.id)
            .collect()
    };
    assert_eq!(on(&h, 1).len(), 2);
    assert!(on(&h, 0).is_empty());
    h.release(in_use);
    h.advance(secs(10));
    ok(&h);
    assert_eq!(h.live(0), 0, "deleted once released");
    let lists = h.calls(0, Call::List).len();
    h.advance(secs(120));
    ok(&h);
    assert!(h.calls(0, Call::List).len() > lists, "p0 is still listed");
    h.check_no_leaks().expect("nothing leaked");
}

// ---- providers ------------------------------------------------------------

/// What a provider is like in a provider-choice row.
#[derive(Clone, Copy)]
enum Cond {
    Fine,
    /// Its limit leaves no room.
    Full,
    /// Its first create says quota-exceeded.
    Quota,
    /// Its instance type has no capacity.
    NoCapacity,
    /// Creates paused by an earlier quota error on another label.
    Paused,
}

/// Three-column rows: each provider's priority, price and condition; and the
/// providers that get a create, in order, for one node of label `a`.
fn check_choice(rows: &[(i32, f64, Cond)], expect: &[u16]) {
    let providers = (0..rows.len())
        .map(|i| provider(&format!("p{i}")))
        .collect();
    let offers = rows
        .iter()
        .enumerate()
        .map(|(i, (_, price, _))| Offer {
            price: *price,
            ..offer(i as u16, &format!("t{i}"))
        })
        .collect();
    let mut c = config(providers, vec![machine("a", offers)]);
    for (i, (prio, _, cond)) in rows.iter().enumerate() {
        c.providers[i].priority = *prio;
        if let Cond::Full = cond {
            c.providers[i].limits.max_instances = Some(0);
        }
    }
    let mut h = Harness::new(c);
    for (i, (_, _, cond)) in rows.iter().enumerate() {
        let fp = &mut h.cloud.providers[i];
        match cond {
            Cond::Quota => fp.faults.push(Fault {
                call: Call::Create,
                failure: quota(),
                times: 1,
                reached: false,
            }),
            Cond::NoCapacity => fp.out_of_capacity.push(format!("t{i}")),
            Cond::Paused => {
                h.pool.ix.providers[i].quota_paused_until = Some(T0 + secs(600));
            }
            Cond::Fine | Cond::Full => {}
        }
    }
    let r = h.submit(&[("a", 1)], 0);
    settle(&mut h);
    let got: Vec<u16> = creates(&h).into_iter().map(|(p, _)| p).collect();
    assert_eq!(got, expect);
    assert!(h.fulfilled(r));
    assert_eq!(h.pool.request(r).unwrap().failures, 0, "no failed try");
}

#[test]
fn provider_choice() {
    use Cond::*;
    check_choice(&[(0, 1.0, Fine), (0, 0.5, Fine), (1, 0.1, Fine)], &[1]);
    check_choice(&[(1, 0.1, Fine), (0, 2.0, Fine)], &[1]);
    check_choice(&[(0, 0.5, Full), (0, 1.0, Fine)], &[1]);
    check_choice(&[(0, 0.5, Paused), (0, 1.0, Fine)], &[1]);
    check_choice(&[(0, 0.5, Quota), (0, 1.0, Fine)], &[0, 1]);
    check_choice(&[(0, 0.5, NoCapacity), (1, 1.0, Fine)], &[0, 1]);
    check_choice(
        &[(0, 0.5, Quota), (0, 0.7, NoCapacity), (2, 1.0, Fine)],
        &[0, 1, 2],
    );
}

#[test]
fn capacity_pauses_only_that_instance_type_on_that_provider() {
    let mut c = config(
        vec![provider("p0"), provider("p1")],
        vec![
            machine("a", vec![offer(0, "big"), offer(1, "big")]),
            machine("b", vec![offer(0, "small")]),
        ],
    );
    c.providers[1].priority = 1;
    // One call at a time, so the second create is still waiting when the
    // first one's answer comes.
    c.providers[0].max_calls = 1;
    let mut h = Harness::new(c);
    h.cloud.providers[0].out_of_capacity.push("big".into());
    let r = h.submit(&[("a", 2)], 0);
    settle(&mut h);
    assert!(h.fulfilled(r));
    assert!(
        h.nodes("a", "in-use")
            .iter()
            .all(|n| n.provider == ProviderIx(1))
    );
    assert_eq!(
        h.calls(0, Call::Create).len(),
        1,
        "the second a is not tried on p0"
    );
    let rb = h.submit(&[("b", 1)], 0);
    settle(&mut h);
    assert!(h.fulfilled(rb), "another type on p0 is not paused");
    assert!(
        h.notices.iter().any(
            |n| matches!(n, Notice::CapacityPaused { instance_type: Some(t), .. } if t == "big")
        )
    );
    // After the pause p0 is preferred again.
    h.cloud.providers[0].out_of_capacity.clear();
    h.advance(h.config.timings.capacity_pause);
    let r2 = h.submit(&[("a", 1)], 0);
    settle(&mut h);
    let n = h.pool.request(r2).unwrap().nodes[0];
    assert_eq!(h.pool.node(n).unwrap().provider, ProviderIx(0));
}

#[test]
fn launch_retries_go_to_another_provider_then_fail_with_a_reason() {
    let mut c = config(
        vec![provider("p0"), provider("p1")],
        vec![machine("a", vec![offer(0, "t0"), offer(1, "t1")])],
    );
    c.labels[0].launch_retries = 2;
    c.providers[1].priority = 1;
    let mut h = Harness::new(c);
    for fp in &mut h.cloud.providers {
        fp.faults.push(Fault {
            call: Call::Create,
            failure: transient(),
            times: u32::MAX,
            reached: false,
        });
    }
    let r = h.submit(&[("a", 1)], 0);
    h.advance(secs(10));
    ok(&h);
    let got: Vec<u16> = creates(&h).into_iter().map(|(p, _)| p).collect();
    assert_eq!(got, vec![0, 1, 0], "1 try + 2 retries, alternating");
    let why = reason(&h, r);
    assert!(why.contains("label `a`"), "{why}");
    assert!(why.contains("3 tries"), "{why}");
    assert!(why.contains("`p0`") && why.contains("try again"), "{why}");
    assert!(
        h.notices
            .iter()
            .any(|n| matches!(n, Notice::RequestFailed { request, .. } if *request == r))
    );
    assert_eq!(h.live(0) + h.live(1), 0);
    assert!(h.pool.nodes().all(|n| n.state.is_final()));
}

#[test]
fn a_create_failed_on_the_only_provider_is_tried_again_after_a_growing_backoff() {
    let mut h = one(|_| {});
    h.cloud.providers[0].faults.push(Fault {
        call: Call::Create,
        failure: transient(),
        times: 2,
        reached: false,
    });
    let r = h.submit(&[("a", 1)], 0);
    settle(&mut h);
    assert_eq!(h.calls(0, Call::Create).len(), 1, "not again at once");
    h.advance(secs(10));
    ok(&h);
    assert!(h.fulfilled(r), "{:?}", h.state(r));
    let t = h.calls(0, Call::Create);
    assert_eq!(t.len(), 3);
    let gaps = [t[1].since(t[0]), t[2].since(t[1])];
    assert!(gaps[0] >= secs(1) && gaps[0] < secs(2), "{gaps:?}");
    assert!(gaps[1] >= secs(2) && gaps[1] < secs(3), "{gaps:?}");
}

#[test]
fn a_node_deleted_while_its_create_waits_out_a_backoff_is_aborted() {
    let mut h = one(|_| {});
    h.cloud.providers[0].faults.push(Fault {
        call: Call::Create,
        failure: transient(),
        times: 1,
        reached: false,
    });
    let r = h.submit(&[("a", 1)], 0);
    settle(&mut h);
    let n = h.pool.request(r).unwrap().nodes[0];
    h.pool.delete(h.now, n).unwrap();
    settle(&mut h);
    assert!(
        matches!(
            h.pool.node(n).unwrap().state,
            NodeState::Gone {
                reason: GoneReason::Aborted,
                ..
            }
        ),
        "{:?}",
        h.pool.node(n).unwrap().state
    );
    // The request gets a new node; the aborted one is never created.
    h.advance(secs(10));
    ok(&h);
    assert!(h.fulfilled(r), "{:?}", h.state(r));
    assert_eq!(h.calls(0, Call::Create).len(), 2);
    assert_eq!(h.live(0), 1);
}

#[test]
fn a_booting_node_is_looked_at_soon_then_at_doubling_gaps_up_to_the_poll_interval() {
    use super::calls::boot_poll_after;
    let t0 = T0;
    let mut now = t0;
    let mut points = Vec::new();
    for _ in 0..8 {
        now = boot_poll_after(t0, now, secs(5));
        points.push(now.since(t0).as_millis());
    }
    assert_eq!(points, [100, 300, 700, 1500, 3100, 6300, 11300, 16300]);
    let late = boot_poll_after(t0, t0 + secs(40), secs(5));
    assert_eq!(late.since(t0).as_millis(), 41300);
    // A poll interval under the first gap is the gap.
    let tight = boot_poll_after(t0, t0, Duration::from_millis(40));
    assert_eq!(tight.since(t0).as_millis(), 40);
}

/// With the default 5 s poll interval, a boot of 100 ms is seen by the
/// first list 100 ms after the create, and a boot of 40 s costs about a
/// dozen lists rather than one per poll interval from the start.
#[test]
fn a_fast_boot_is_seen_at_once_and_a_slow_one_costs_few_lists() {
    for (boot, ready_within, most_lists) in [
        (Duration::from_millis(100), Duration::from_millis(100), 1),
        (secs(40), secs(45), 13),
    ] {
        let mut h = one(|_| {});
        assert_eq!(h.config.timings.boot_poll_interval, secs(5));
        h.dt = Duration::from_millis(10);
        settle(&mut h);
        h.cloud.providers[0].boot_delay = boot;
        let lists = h.calls(0, Call::List).len();
        let start = h.now;
        let r = h.submit(&[("a", 1)], 0);
        assert!(h.run_until(secs(60), |h| h.fulfilled(r)));
        let took = h.now.since(start);
        let listed = h.calls(0, Call::List).len() - lists;
        assert!(
            took <= ready_within && listed <= most_lists,
            "boot {boot:?}: ready after {took:?}, {listed} lists"
        );
        ok(&h);
    }
}

#[test]
fn prewarm_backs_off_until_a_node_becomes_ready_not_just_created() {
    let mut h = one(|c| {
        a_mut(c).min_ready = 1;
        a_mut(c).launch_retries = 0;
        a_mut(c).boot_timeout = secs(5);
    });
    // Creates succeed, but no instance ever runs.
    h.cloud.providers[0].boot_delay = secs(1_000_000);
    h.advance(secs(60));
    ok(&h);
    let t = h.calls(0, Call::Create);
    // Boot timeouts 5 s apart would make 12 creates; the backoff after
    // each failed launch (2, 4, 8, 16 s …) leaves far fewer.
    assert!(t.len() >= 3 && t.len() <= 6, "{} creates: {t:?}", t.len());
    let gaps: Vec<Duration> = t.windows(2).map(|w| w[1].since(w[0])).collect();
    assert!(gaps.windows(2).all(|g| g[1] > g[0]), "growing: {gaps:?}");
    // Once instances run again, a ready node ends the backoff.
    h.cloud.providers[0].boot_delay = Duration::ZERO;
    h.advance(secs(120));
    assert_eq!(h.count("a", "ready"), 1);
    let ready = h.nodes("a", "ready")[0].id;
    h.pool.delete(h.now, ready).unwrap();
    settle(&mut h);
    assert_eq!(h.count("a", "ready"), 1, "refilled at once");
}

#[test]
fn a_trap_after_the_create_went_through_leaks_nothing() {
    let mut h = one(|_| {});
    h.cloud.providers[0].faults.push(Fault {
        call: Call::Create,
        failure: trap(),
        times: 1,
        reached: true,
    });
    let r = h.submit(&[("a", 1)], 0);
    settle(&mut h);
    h.advance(secs(1));
    assert!(h.fulfilled(r), "tried again after a backoff");
    assert_eq!(h.live(0), 2, "the trapped create made an instance");
    h.advance(h.config.timings.leak_grace + h.config.timings.sync_interval * 2);
    ok(&h);
    // Its tags name a node in use: never deleted while it is.
    assert_eq!(h.live(0), 2);
    let node = h.pool.request(r).unwrap().nodes[0];
    h.release(node);
    h.advance(h.config.timings.leak_grace + h.config.timings.sync_interval * 2);
    ok(&h);
    assert_eq!(
        h.live(0),
        0,
        "released and deleted, and the other as a leak"
    );
    h.check_no_leaks().unwrap();
}

/// A create handed on to another process whose answer was lost
/// ([`Failure::Unknown`]) may have made its instance: the node is not
/// created again, here or on the other provider, before a list that
/// started afterwards; that list finds the instance, and the node is the
/// one it was.
#[test]
fn a_create_whose_answer_was_lost_is_found_by_the_next_list_not_made_twice() {
    for reached in [true, false] {
        let c = config(
            vec![provider("p0"), provider("p1")],
            vec![machine("a", vec![offer(0, "t0"), offer(1, "t1")])],
        );
        let mut h = Harness::new(c);
        h.cloud.providers[0].faults.push(Fault {
            call: Call::Create,
            failure: Failure::Unknown("no answer from the provider's holder".into()),
            times: 1,
            reached,
        });
        let r = h.submit(&[("a", 1)], 0);
        settle(&mut h);
        h.advance(secs(1));
        assert!(h.fulfilled(r), "reached: {reached}");
        let node = h.pool.request(r).unwrap().nodes[0];
        if reached {
            assert_eq!(h.pool.node(node).unwrap().provider, ProviderIx(0));
            assert_eq!(h.calls(0, Call::Create).len(), 1, "not made again");
            assert!(h.calls(1, Call::Create).is_empty(), "not made elsewhere");
            assert_eq!((h.live(0), h.live(1)), (1, 0));
        } else {
            // Not listed: tried again, on the other provider as any failed
            // create, and only after that list.
            assert_eq!(h.calls(0, Call::Create).len(), 1);
            assert_eq!(h.calls(1, Call::Create).len(), 1);
            assert!(h.calls(0, Call::List).len() >= 2);
            assert_eq!((h.live(0), h.live(1)), (0, 1));
        }
        h.check_no_leaks().unwrap();
        ok(&h);
    }
}

#[test]
fn quota_error_is_not_a_failed_try() {
    let mut h = one(|c| a_mut(c).launch_retries = 0);
    h.cloud.providers[0].faults.push(Fault {
        call: Call::Create,
        failure: quota(),
        times: 2,
        reached: false,
    });
    let r = h.submit(&[("a", 1)], 0);
    settle(&mut h);
    assert_eq!(h.state(r), RequestState::Pending);
    assert!(
        h.notices
            .iter()
            .any(|n| matches!(n, Notice::QuotaPaused { .. }))
    );
    let pause = h.config.timings.quota_pause;
    // The request says it waits for the quota, and until when.
    let w = h.pool.waiting(r);
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(
        (w[0].reason.name(), w[0].provider),
        ("quota", Some(ProviderIx(0)))
    );
    assert_eq!(w[0].reason.until(), Some(h.now + pause));
    h.advance(pause - secs(1));
    assert_eq!(h.calls(0, Call::Create).len(), 1, "no create while paused");
    h.advance(secs(1));
    assert_eq!(h.calls(0, Call::Create).len(), 2);
    h.advance(pause);
    assert!(h.fulfilled(r));
    assert_eq!(h.pool.request(r).unwrap().failures, 0);
    assert_eq!(h.calls(0, Call::Create).len(), 3);
    ok(&h);
}

#[test]
fn quota_pause_ends_when_an_instance_goes_away() {
    let mut h = one(|_| {});
    let r0 = h.submit(&[("a", 1)], 0);
    settle(&mut h);
    let x = h.pool.request(r0).unwrap().nodes[0];
    h.cloud.providers[0].faults.push(Fault {
        call: Call::Create,
        failure: quota(),
        times: 1,
        reached: false,
    });
    let r = h.submit(&[("a", 1)], 0);
    settle(&mut h);
    assert!(
        h.pool
            .provider_status(ProviderIx(0))
            .quota_paused_until
            .is_some()
    );
    h.advance(secs(5));
    assert_eq!(h.calls(0, Call::Create).len(), 2);
    // A node comes back and is deleted: there is room in the quota again.
    h.release(x);
    h.advance(secs(1));
    assert_eq!(
        h.pool.provider_status(ProviderIx(0)).quota_paused_until,
        None
    );
    assert!(h.fulfilled(r));
    assert_eq!(h.calls(0, Call::Create).len(), 3);
    ok(&h);
}

#[test]
fn rate_limited_holds_every_call_to_that_provider_only() {
    let mut h = Harness::new(config(
        vec![provider("p0"), provider("p1")],
        vec![
            machine("a", vec![offer(0, "t0")]),
            machine("b", vec![offer(1, "t1")]),
        ],
    ));
    settle(&mut h);
    h.cloud.providers[0].faults.push(Fault {
        call: Call::Create,
        failure: rate_limited(10_000),
        times: 1,
        reached: false,
    });
    let t = h.now;
    let r = h.submit(&[("a", 1)], 0);
    settle(&mut h);
    assert_eq!(h.state(r), RequestState::Pending);
    assert_eq!(
        h.pool.provider_status(ProviderIx(0)).held_until,
        Some(t + secs(10))
    );
    let rb = h.submit(&[("b", 1)], 0);
    h.advance(secs(9));
    assert!(h.fulfilled(rb), "the other provider is not held");
    let during = h
        .log
        .iter()
        .filter(|(at, e)| *at > t && effect_provider(e).0 == 0)
        .count();
    assert_eq!(during, 0, "no call to p0 inside its window");
    h.advance(secs(1));
    assert!(h.fulfilled(r));
    assert_eq!(h.pool.request(r).unwrap().failures, 0);
    ok(&h);
}

/// A cloud that takes one call a second, and lists due every second: once
/// the hold a refused create brought lifts, the create goes before the next
/// list. Were the list first, it would take the cloud's one call, the create
/// would be refused again, and so on every second, never creating anything.
#[test]
fn the_call_a_hold_refused_goes_before_the_next_list() {
    for batches in [false, true] {
        let mut h = one(|c| {
            a_mut(c).min_ready = 12;
            c.providers[0].max_calls = 1;
            c.timings.sync_interval = secs(1);
        });
        if batches {
            h.declare(
                0,
                Batches {
                    create: true,
                    delete: true,
                },
            );
        }
        h.cloud.providers[0].one_call_per = Some(secs(1));
        h.dt = Duration::from_millis(100);
        assert!(
            h.run_until(secs(120), |h| h.count("a", "ready") == 12),
            "batches {batches}: {} of 12 ready after {} calls",
            h.count("a", "ready"),
            h.log.len()
        );
        ok(&h);
    }
}

#[test]
fn host_rate_limiter_keeps_calls_under_rate() {
    let mut h = one(|c| {
        c.providers[0].rate = Some(2.0);
        c.providers[0].burst = 2;
        a_mut(c).min_ready = 20;
    });
    h.dt = Duration::from_millis(100);
    h.advance(secs(20));
    ok(&h);
    assert_eq!(h.count("a", "ready"), 20);
    let times: Vec<u64> = h.log.iter().map(|(t, _)| t.as_millis()).collect();
    for (i, a) in times.iter().enumerate() {
        for (j, b) in times.iter().enumerate().skip(i) {
            let allowed = 2.0 + 2.0 * (b - a) as f64 / 1000.0;
            assert!(
                (j - i + 1) as f64 <= allowed + 1e-9,
                "{} calls in {}ms",
                j - i + 1,
                b - a
            );
        }
    }
    // 21+ calls at 2/s after a burst of 2 take at least 9.5 s.
    assert!(times.last().unwrap() - times[0] >= 9_500);
}

#[test]
fn at_most_max_instances_calls_in_flight() {
    let mut h = one(|c| {
        c.providers[0].max_calls = 2;
        a_mut(c).min_ready = 10;
    });
    h.latency = secs(3);
    h.advance(secs(60));
    ok(&h);
    assert_eq!(h.count("a", "ready"), 10);
    assert_eq!(h.cloud.providers[0].max_in_flight, 2);
}

// ---- timers ---------------------------------------------------------------

#[test]
fn boot_timeout_deletes_and_relaunches() {
    let mut h = one(|c| a_mut(c).boot_timeout = secs(60));
    h.cloud.providers[0].boot_delay = secs(3600);
    let r = h.submit(&[("a", 1)], 0);
    settle(&mut h);
    let first = h.nodes("a", "booting")[0].clone();
    h.advance(secs(59));
    assert_eq!(h.calls(0, Call::Delete).len(), 0);
    h.cloud.providers[0].boot_delay = Duration::ZERO;
    h.advance(secs(2));
    ok(&h);
    let old = h.pool.node(first.id).unwrap();
    assert!(
        matches!(old.state, NodeState::Gone { .. })
            || matches!(
                old.state,
                NodeState::Deleting {
                    reason: DeleteReason::BootTimeout,
                    ..
                }
            ),
        "{:?}",
        old.state
    );
    assert_eq!(h.calls(0, Call::Delete).len(), 1);
    assert!(h.fulfilled(r), "{:?}", h.state(r));
    assert_eq!(h.pool.request(r).unwrap().failures, 1);
    assert!(
        h.log
            .iter()
            .any(|(_, e)| matches!(e, Effect::Call(DriverCall::Delete { node: Some(n), .. }) if *n == first.id))
    );
    assert_eq!(h.live(0), 1);
}

#[test]
fn a_failed_instance_is_deleted_and_replaced_at_the_next_look_not_at_boot_timeout() {
    let mut h = one(|c| a_mut(c).boot_timeout = secs(600));
    h.cloud.providers[0].boot_delay = secs(3600);
    let r = h.submit(&[("a", 1)], 0);
    settle(&mut h);
    let first = h.nodes("a", "booting")[0].clone();
    let instance = first.instance.clone().unwrap();
    let fake = h.cloud.providers[0].instances.get_mut(&instance).unwrap();
    fake.failed = Some("No valid host was found.".into());
    h.cloud.providers[0].boot_delay = Duration::ZERO;
    // The next boot poll sees it: far sooner than `boot-timeout`.
    let replaced = |h: &Harness| h.fulfilled(r);
    assert!(h.run_until(secs(30), replaced), "{:?}", h.state(r));
    let old = h.pool.node(first.id).unwrap();
    assert!(
        matches!(
            old.state,
            NodeState::Deleting {
                reason: DeleteReason::InstanceFailed,
                ..
            } | NodeState::Gone { .. }
        ),
        "{:?}",
        old.state
    );
    assert!(h.log.iter().any(|(_, e)| matches!(
        e,
        Effect::Call(DriverCall::Delete { node: Some(n), .. }) if *n == first.id
    )));
    assert_eq!(h.pool.request(r).unwrap().failures, 1);
    // The cloud's reason stays on the node and on the request, and is
    // stored with them.
    let why = format!("the cloud reports instance {instance} failed: No valid host was found.");
    assert_eq!(old.failure.as_deref(), Some(why.as_str()));
    let req = h.pool.request(r).unwrap();
    let last = format!("node {} on provider `p0`: {why}", first.id);
    assert_eq!(req.last_failure.as_deref(), Some(last.as_str()));
    assert_eq!(h.store.nodes[&first.id].failure, old.failure);
    assert_eq!(h.store.requests[&r].last_failure, req.last_failure);
    // The replacement that served it failed no try.
    let served = h.pool.node(req.nodes[0]).unwrap();
    assert_ne!(served.id, first.id);
    assert_eq!(served.failure, None);
    ok(&h);
}

/// A create the driver fails moves the same node to the other provider:
/// it keeps the driver's error as its failure, made printable and cut to
/// [`MAX_FAILURE`], and the request names the node and the provider that
/// failed it.
#[test]
fn a_node_tried_again_elsewhere_keeps_the_drivers_error_bounded() {
    let c = config(
        vec![provider("p0"), provider("p1")],
        vec![machine("a", vec![offer(0, "t0"), offer(1, "t1")])],
    );
    let mut h = Harness::new(c);
    let long = format!("no image `x`\n{}", "y".repeat(3 * MAX_FAILURE));
    h.cloud.providers[0].faults.push(Fault {
        call: Call::Create,
        failure: Failure::Driver(DriverError::Permanent(long)),
        times: 1,
        reached: false,
    });
    let r = h.submit(&[("a", 1)], 0);
    assert!(
        h.run_until(secs(30), |h| h.fulfilled(r)),
        "{:?}",
        h.state(r)
    );
    let req = h.pool.request(r).unwrap();
    let node = h.pool.node(req.nodes[0]).unwrap();
    assert_eq!(node.provider, ProviderIx(1), "tried again elsewhere");
    assert_eq!(
        creates(&h),
        vec![(0, node.id), (1, node.id)],
        "the same node"
    );
    let failure = node.failure.as_deref().expect("the failed try's reason");
    assert!(
        failure.starts_with("create: permanent error: no image `x`\\nyyy"),
        "{failure}"
    );
    assert!(failure.ends_with("y…"), "cut: {failure}");
    assert_eq!(failure.len(), MAX_FAILURE + "…".len());
    let last = req
        .last_failure
        .as_deref()
        .expect("the request's last failure");
    let named = format!("node {} on provider `p0`: create: permanent error", node.id);
    assert!(last.starts_with(&named), "{last}");
    assert_eq!(last.len(), MAX_FAILURE + "…".len());
    assert_eq!(h.store.nodes[&node.id].failure, node.failure);
    assert_eq!(h.store.requests[&r].last_failure, req.last_failure);
    ok(&h);
}

/// A node given up without an instance (failed) keeps why, as does the
/// request that failed with it.
#[test]
fn a_failed_node_and_its_failed_request_keep_the_last_try_s_reason() {
    let mut h = one(|c| a_mut(c).launch_retries = 0);
    h.cloud.providers[0].faults.push(Fault {
        call: Call::Create,
        failure: transient(),
        times: 1,
        reached: false,
    });
    let r = h.submit(&[("a", 1)], 0);
    settle(&mut h);
    assert!(reason(&h, r).contains("transient error: try again"));
    let (_, id) = creates(&h)[0];
    let node = h.pool.node(id).unwrap();
    assert_eq!(node.state.name(), "failed");
    let why = "create: transient error: try again";
    assert_eq!(node.failure.as_deref(), Some(why));
    assert_eq!(
        h.pool.request(r).unwrap().last_failure,
        Some(format!("node {id} on provider `p0`: {why}"))
    );
    assert_eq!(h.store.nodes[&id].failure, node.failure);
    ok(&h);
}

#[test]
fn boot_timeout_is_the_delete_reason() {
    let mut h = one(|c| a_mut(c).boot_timeout = secs(60));
    h.cloud.providers[0].boot_delay = secs(3600);
    h.latency = secs(5);
    h.submit(&[("a", 1)], 0);
    h.step();
    h.advance(secs(10));
    let first = h.nodes("a", "booting")[0].id;
    let deleting = |h: &Harness| h.pool.node(first).unwrap().state.name() == "deleting";
    assert!(h.run_until(secs(120), deleting));
    let state = h.pool.node(first).unwrap().state.clone();
    assert!(
        matches!(
            state,
            NodeState::Deleting {
                reason: DeleteReason::BootTimeout,
                ..
            }
        ),
        "{state:?}"
    );
}

/// A few booting nodes are looked at by id, all in one `get` a poll, not
/// by lists of the whole provider; more than one `get` takes are listed.
#[test]
fn booting_nodes_are_looked_at_by_id_and_many_are_listed() {
    for (count, by_get) in [(3, true), (GET_MAX as u32 + 1, false)] {
        let mut h = one(|_| {});
        h.dt = Duration::from_millis(10);
        settle(&mut h);
        h.cloud.providers[0].boot_delay = secs(10);
        let (lists, gets) = (h.calls(0, Call::List).len(), h.calls(0, Call::Get).len());
        let r = h.submit(&[("a", count)], 0);
        assert!(h.run_until(secs(30), |h| h.fulfilled(r)), "{count}");
        ok(&h);
        let lists = h.calls(0, Call::List).len() - lists;
        let gets = h.calls(0, Call::Get).len() - gets;
        if by_get {
            assert_eq!(lists, 0, "{count}: no list while they boot");
            assert!((1..=12).contains(&gets), "{count}: {gets} gets");
            let widest = (h.log.iter())
                .filter_map(|(_, e)| match e {
                    Effect::Call(DriverCall::Get { instances, .. }) => Some(instances.len()),
                    _ => None,
                })
                .max();
            assert_eq!(widest, Some(count as usize), "one get asks for them all");
        } else {
            assert_eq!(gets, 0, "{count}: more than a get takes");
            assert!(lists >= 2, "{count}: {lists} lists");
        }
    }
}

#[test]
fn a_booting_node_is_polled_until_it_runs() {
    let mut h = one(|_| {});
    settle(&mut h);
    // The first list found nothing to wait for: the next is a sync away.
    h.cloud.providers[0].boot_delay = secs(10);
    let r = h.submit(&[("a", 1)], 0);
    settle(&mut h);
    assert_eq!(h.count("a", "booting"), 1);
    let poll = h.config.timings.boot_poll_interval;
    assert!(
        h.run_until(secs(10) + poll, |h| h.fulfilled(r)),
        "ready within a poll of running"
    );
    ok(&h);
}

#[test]
fn a_node_deleted_while_its_create_is_rate_limited_is_not_stuck() {
    let mut h = one(|_| {});
    h.latency = secs(2);
    h.cloud.providers[0].faults.push(Fault {
        call: Call::Create,
        failure: rate_limited(5_000),
        times: 1,
        reached: false,
    });
    let r = h.submit(&[("a", 1)], 0);
    h.step();
    h.advance(secs(3));
    let n = h.pool.request(r).unwrap().nodes[0];
    assert_eq!(h.in_flight.len(), 1, "the create is in flight");
    h.pool.delete(h.now, n).unwrap();
    h.persist();
    h.advance(secs(30));
    ok(&h);
    assert_eq!(h.pool.node(n).unwrap().state.name(), "gone");
    assert!(h.fulfilled(r), "served by another node");
    assert_eq!(h.pool.provider_status(ProviderIx(0)).usage.instances, 1);
    assert_eq!(h.live(0), 1);
}

#[test]
fn next_wakeup_is_never_in_the_past() {
    // After a restart with a rate limiter, creates wait for the first list
    // while tokens are there: once a busy loop until the list answered.
    let mut h = one(|c| {
        a_mut(c).min_ready = 2;
        c.providers[0].rate = Some(10.0);
        c.providers[0].burst = 10;
    });
    h.latency = secs(5);
    h.step();
    h.advance(secs(5));
    assert_eq!(h.calls(0, Call::Create).len(), 2);
    h.crash();
    h.advance(secs(30));
    ok(&h);
    assert_eq!(h.count("a", "ready"), 2);
}

#[test]
fn max_ready_age_recycles() {
    let mut h = one(|c| {
        a_mut(c).min_ready = 1;
        a_mut(c).max_ready_age = Some(secs(300));
    });
    settle(&mut h);
    let first = h.nodes("a", "ready")[0].id;
    h.advance(secs(299));
    assert_eq!(h.nodes("a", "ready")[0].id, first);
    h.advance(secs(1));
    ok(&h);
    let ready = h.nodes("a", "ready");
    assert_eq!(ready.len(), 1);
    assert_ne!(ready[0].id, first);
    assert!(matches!(
        h.pool.node(first).unwrap().state,
        NodeState::Gone {
            reason: GoneReason::Deleted,
            ..
        }
    ));
    assert_eq!(h.live(0), 1);
}

#[test]
fn a_returned_node_is_deleted_reused_kept_or_drained() {
    // (label reuse, idle behaviour) → state after release
    let rows: &[(bool, Idle, &str)] = &[
        (false, Idle::Run, "gone"),
        (true, Idle::Run, "ready"),
        (false, Idle::Hold, "used"),
        (true, Idle::Hold, "used"),
        (true, Idle::Drain, "gone"),
    ];
    for &(reuse, idle, expect) in rows {
        let mut h = one(|c| a_mut(c).reuse = reuse);
        let r = h.submit(&[("a", 1)], 0);
        settle(&mut h);
        let n = h.pool.request(r).unwrap().nodes[0];
        h.set_idle(n, idle);
        h.release(n);
        settle(&mut h);
        assert_eq!(
            h.pool.node(n).unwrap().state.name(),
            expect,
            "reuse {reuse}, {idle}"
        );
        assert_eq!(
            h.live(0),
            usize::from(expect != "gone"),
            "reuse {reuse}, {idle}"
        );
    }
}

#[test]
fn hold_keeps_a_node_and_drain_deletes_it_when_idle() {
    let mut h = one(|c| {
        a_mut(c).min_ready = 1;
        a_mut(c).max_ready_age = Some(secs(100));
    });
    settle(&mut h);
    let held = h.nodes("a", "ready")[0].id;
    h.set_idle(held, Idle::Hold);
    settle(&mut h);
    // min-ready counts only nodes that can be handed out.
    assert_eq!(h.count("a", "ready"), 2);
    let r = h.submit(&[("a", 1)], 0);
    settle(&mut h);
    assert!(!h.pool.request(r).unwrap().nodes.contains(&held));
    h.advance(secs(200));
    assert_eq!(
        h.pool.node(held).unwrap().state.name(),
        "ready",
        "never recycled"
    );
    assert!(
        !h.calls(0, Call::SetTags).is_empty(),
        "hold is written to the instance tags"
    );
    let tags = &h.cloud.providers[0].instances
        [h.pool.node(held).unwrap().instance.as_deref().unwrap()]
    .tags;
    assert_eq!(
        tags.get(crate::driver::IDLE_TAG).map(String::as_str),
        Some("hold")
    );
    h.set_idle(held, Idle::Drain);
    settle(&mut h);
    assert_eq!(h.pool.node(held).unwrap().state.name(), "gone");
    ok(&h);
}

#[test]
fn drain_set_while_booting_deletes_once_running() {
    let mut h = one(|_| {});
    h.cloud.providers[0].boot_delay = secs(30);
    h.latency = secs(1);
    let r = h.submit(&[("a", 1)], 0);
    h.advance(secs(5));
    let n = h.nodes("a", "booting")[0].id;
    h.pool.cancel(h.now, r).unwrap();
    h.set_idle(n, Idle::Drain);
    h.advance(secs(60));
    ok(&h);
    assert_eq!(h.pool.node(n).unwrap().state.name(), "gone");
    assert_eq!(h.live(0), 0);
}

#[test]
fn idle_set_while_the_create_is_in_flight_reaches_the_tags() {
    let mut h = one(|_| {});
    h.latency = secs(2);
    let r = h.submit(&[("a", 1)], 0);
    h.step();
    h.advance(secs(2));
    assert_eq!(h.in_flight.len(), 1, "the create is in flight");
    let n = h.pool.request(r).unwrap().nodes[0];
    h.set_idle(n, Idle::Hold);
    h.advance(secs(10));
    let inst = h.pool.node(n).unwrap().instance.clone().unwrap();
    let tags = &h.cloud.providers[0].instances[&inst].tags;
    assert_eq!(
        tags.get(crate::driver::IDLE_TAG).map(String::as_str),
        Some("hold")
    );
}

#[test]
fn a_failed_tag_update_is_made_again_after_backoff() {
    let mut h = one(|c| a_mut(c).min_ready = 1);
    settle(&mut h);
    let n = h.nodes("a", "ready")[0].id;
    h.cloud.providers[0].faults.push(Fault {
        call: Call::SetTags,
        failure: transient(),
        times: 1,
        reached: false,
    });
    h.set_idle(n, Idle::Hold);
    settle(&mut h);
    assert_eq!(h.calls(0, Call::SetTags).len(), 1);
    h.advance(secs(5));
    ok(&h);
    assert_eq!(h.calls(0, Call::SetTags).len(), 2);
    let inst = h.pool.node(n).unwrap().instance.clone().unwrap();
    let tags = &h.cloud.providers[0].instances[&inst].tags;
    assert_eq!(
        tags.get(crate::driver::IDLE_TAG).map(String::as_str),
        Some("hold")
    );
}

// ---- slots ----------------------------------------------------------------

fn slotted() -> Harness {
    Harness::new(config(
        vec![provider("p0")],
        vec![machine("big", vec![offer(0, "big")]), slots("s", 0, 3)],
    ))
}

fn backings(h: &Harness) -> Vec<Node> {
    let mut v: Vec<Node> = h
        .pool
        .nodes()
        .filter(|n| matches!(n.packing, Packing::Backing { .. }) && !n.state.is_final())
        .cloned()
        .collect();
    v.sort_by_key(|n| n.created);
    v
}

/// An operator drains a ready backing node whose slot is in use: the
/// slot keeps its instance until it is released, and then the backing
/// node is deleted.
#[test]
fn a_drained_backing_node_waits_for_its_slots_in_use() {
    let mut h = slotted();
    let r = h.submit(&[("s", 1)], 0);
    settle(&mut h);
    assert!(h.fulfilled(r));
    let slot = h.pool.request(r).unwrap().nodes[0];
    let backing = backings(&h)[0].id;
    h.set_idle(backing, Idle::Drain);
    settle(&mut h);
    assert_eq!(h.count("s", "in-use"), 1, "the slot keeps its instance");
    assert!(matches!(
        h.pool.node(backing).unwrap().state,
        NodeState::Ready { .. }
    ));
    h.release(slot);
    h.advance(secs(5));
    ok(&h);
    assert_eq!(h.live(0), 0, "deleted once its slot was free");
}

#[test]
fn slots_are_packed_before_launching_and_never_given_twice() {
    let mut h = slotted();
    let r1 = h.submit(&[("s", 2)], 0);
    settle(&mut h);
    assert!(h.fulfilled(r1));
    assert_eq!(backings(&h).len(), 1);
    let r2 = h.submit(&[("s", 2)], 0);
    settle(&mut h);
    assert!(h.fulfilled(r2));
    let b = backings(&h);
    assert_eq!(b.len(), 2, "one slot packed, one backing launched");
    let mut taken: Vec<usize> = b
        .iter()
        .map(|n| match &n.packing {
            Packing::Backing { slots, .. } => slots.iter().flatten().count(),
            _ => 0,
        })
        .collect();
    taken.sort();
    assert_eq!(taken, vec![1, 3]);
    let r3 = h.submit(&[("s", 2)], 0);
    settle(&mut h);
    assert!(h.fulfilled(r3));
    assert_eq!(backings(&h).len(), 2);
    ok(&h);
    assert_eq!(h.pool.free_ready(h.label("s")), 0);
    assert_eq!(h.live(0), 2);
}

#[test]
fn a_backing_instance_free_for_grace_time_is_deleted() {
    let mut h = slotted();
    let r = h.submit(&[("s", 2)], 0);
    settle(&mut h);
    let nodes = h.pool.request(r).unwrap().nodes.clone();
    h.release(nodes[0]);
    h.advance(secs(30));
    h.release(nodes[1]);
    settle(&mut h);
    assert_eq!(h.pool.free_ready(h.label("s")), 3);
    h.advance(Label::DEFAULT_GRACE_TIME - secs(1));
    assert_eq!(backings(&h).len(), 1, "still inside grace time");
    // A slot taken and given back inside grace time restarts it.
    let r2 = h.submit(&[("s", 1)], 0);
    settle(&mut h);
    let n = h.pool.request(r2).unwrap().nodes[0];
    h.release(n);
    h.advance(Label::DEFAULT_GRACE_TIME - secs(1));
    assert_eq!(backings(&h).len(), 1);
    h.advance(secs(2));
    ok(&h);
    assert_eq!(backings(&h).len(), 0);
    assert_eq!(h.live(0), 0);
    assert_eq!(h.calls(0, Call::Create).len(), 1);
}

#[test]
fn a_held_backing_outlives_grace_time_and_goes_once_the_hold_is_lifted() {
    let mut h = slotted();
    let r = h.submit(&[("s", 1)], 0);
    settle(&mut h);
    let b = backings(&h)[0].id;
    h.set_idle(b, Idle::Hold);
    let n = h.pool.request(r).unwrap().nodes[0];
    h.release(n);
    h.advance(Label::DEFAULT_GRACE_TIME * 3);
    assert_eq!(
        h.pool.node(b).unwrap().state.name(),
        "ready",
        "hold is never shut down"
    );
    h.set_idle(b, Idle::Run);
    h.advance(Label::DEFAULT_GRACE_TIME + secs(1));
    ok(&h);
    assert_eq!(h.pool.node(b).unwrap().state.name(), "gone");
}

#[test]
fn a_slot_request_whose_backing_cannot_launch_fails() {
    let mut h = slotted();
    let mut c = (*h.config).clone();
    c.labels[0].launch_retries = 1;
    h = Harness::new(c);
    h.cloud.providers[0].faults.push(Fault {
        call: Call::Create,
        failure: transient(),
        times: u32::MAX,
        reached: false,
    });
    let r = h.submit(&[("s", 2)], 0);
    h.advance(secs(60));
    ok(&h);
    let why = reason(&h, r);
    assert!(why.contains("big"), "{why}");
    assert!(
        h.calls(0, Call::Create).len() <= 4,
        "{}",
        h.calls(0, Call::Create).len()
    );
}

#[test]
fn slot_min_ready_keeps_free_slots() {
    let mut h = slotted();
    let mut c = (*h.config).clone();
    c.labels[1].min_ready = 4;
    h = Harness::new(c);
    settle(&mut h);
    assert_eq!(h.pool.free_ready(h.label("s")), 6);
    h.advance(secs(600));
    assert_eq!(backings(&h).len(), 2, "not released below min-ready");
    ok(&h);
}

#[test]
fn a_blocked_request_evicts_a_backing_node_whose_slots_are_all_free() {
    // min-ready of s is met by the free slots of one big backing node; a
    // request for two big machines fits only if that backing node goes.
    let mut c = (*slotted().config).clone();
    c.labels[1].min_ready = 1;
    c.providers[0].limits.max_instances = Some(2);
    let mut h = Harness::new(c);
    settle(&mut h);
    let b = backings(&h);
    assert_eq!(b.len(), 1);
    let old = b[0].id;
    let r = h.submit(&[("big", 2)], 0);
    settle(&mut h);
    assert!(h.fulfilled(r), "{:?}", h.state(r));
    assert!(h.pool.node(old).unwrap().state.is_final());
    // A backing node with a slot in use is never evicted.
    let n = h.pool.request(r).unwrap().nodes.clone();
    h.release(n[0]);
    h.release(n[1]);
    settle(&mut h);
    let s = h.submit(&[("s", 1)], 0);
    settle(&mut h);
    assert!(h.fulfilled(s));
    let r2 = h.submit(&[("big", 2)], 0);
    settle(&mut h);
    assert_eq!(h.state(r2), RequestState::Pending);
    assert_eq!(backings(&h).len(), 1);
    ok(&h);
}

/// Three free `big` nodes fill p0; a request for one `big` and a slot of
/// `s` (backed by `big`) takes one of them and evicts one of the other two
/// for the slot's backing instance: of a label it wants, only the nodes
/// the request takes are spared.
#[test]
fn a_request_for_a_label_and_a_slot_it_backs_evicts_that_labels_spare_nodes() {
    let mut c = (*slotted().config).clone();
    c.labels[0].min_ready = 3;
    c.providers[0].limits.max_instances = Some(3);
    let mut h = Harness::new(c);
    settle(&mut h);
    assert_eq!(h.count("big", "ready"), 3);
    let r = h.submit(&[("big", 1), ("s", 1)], 0);
    settle(&mut h);
    assert!(h.fulfilled(r), "{:?}", h.state(r));
    assert_eq!(backings(&h).len(), 1);
    assert_eq!(h.live(0), 3, "one evicted for the backing instance");
    ok(&h);
}

// ---- the reconciler --------------------------------------------------------

#[test]
fn owned_instances_are_adopted_and_foreign_ones_left_alone() {
    let mut h = one(|_| {});
    let node = NodeId(0xabc);
    let tags = signed_tags(&h.config, node, "a", "t0");
    let adopted = h.cloud.plant(0, "t0", tags, T0);
    let foreign: Vec<String> = (0..2)
        .map(|i| {
            h.cloud.plant(
                0,
                "t0",
                [("Name".to_string(), format!("theirs{i}"))].into(),
                T0,
            )
        })
        .collect();
    settle(&mut h);
    let n = h.pool.node(node).expect("adopted");
    assert_eq!(n.state.name(), "ready");
    assert_eq!(n.instance.as_deref(), Some(adopted.as_str()));
    assert!(h.notices.contains(&Notice::Adopted {
        node,
        instance: adopted.clone()
    }));
    let r = h.submit(&[("a", 1)], 0);
    settle(&mut h);
    assert_eq!(
        h.pool.request(r).unwrap().nodes,
        vec![node],
        "an adopted node is handed out"
    );
    h.advance(h.config.timings.sync_interval * 5);
    ok(&h);
    let foreign_notices: Vec<&Notice> = h
        .notices
        .iter()
        .filter(|n| matches!(n, Notice::Foreign { .. }))
        .collect();
    assert_eq!(
        foreign_notices,
        vec![&Notice::Foreign {
            provider: ProviderIx(0),
            count: 2
        }]
    );
    for f in &foreign {
        assert!(!h.log.iter().any(|(_, e)| matches!(e, Effect::Call(DriverCall::Delete { instance, .. }) | Effect::Call(DriverCall::SetTags { instance, .. }) if instance == f)));
        assert!(h.cloud.providers[0].instances[f].terminated.is_none());
    }
    assert!(h.calls(0, Call::List).len() >= 5);
}

#[test]
fn an_owned_instance_no_node_accounts_for_is_deleted_after_leak_grace() {
    let mut h = one(|_| {});
    // Owned and signed, but its label is unknown here: it cannot be
    // adopted.
    let tags = signed_tags(&h.config, NodeId(5), "no-such-label", "t0");
    let leaked = h.cloud.plant(0, "t0", tags, T0);
    settle(&mut h);
    let grace = h.config.timings.leak_grace;
    h.advance(grace - secs(1));
    assert!(h.calls(0, Call::Delete).is_empty(), "inside leak grace");
    h.advance(h.config.timings.sync_interval + secs(1));
    ok(&h);
    let deletes = h.calls(0, Call::Delete);
    assert_eq!(deletes.len(), 1);
    assert!(deletes[0] >= T0 + grace);
    assert!(
        h.cloud.providers[0]
            .instances
            .get(&leaked)
            .is_none_or(|i| i.terminated.is_some())
    );
    assert!(h.notices.contains(&Notice::LeakDeleted {
        provider: ProviderIx(0),
        instance: leaked
    }));
    assert_eq!(h.pool.provider_status(ProviderIx(0)).leaks_deleted, 1);
}

#[test]
fn a_node_whose_instance_is_confirmed_missing_is_gone_and_its_request_served_again() {
    let mut h = Harness::new(config(
        vec![provider("p0"), provider("p1")],
        vec![
            machine("a", vec![offer(0, "t0")]),
            machine("b", vec![offer(1, "t1")]),
        ],
    ));
    // b boots well past the confirmation: the request still waits then.
    h.cloud.providers[1].boot_delay = secs(300);
    let r = h.submit(&[("a", 1), ("b", 1)], 0);
    settle(&mut h);
    let a = h.nodes("a", "ready")[0].id;
    assert_eq!(h.pool.node(a).unwrap().assigned, Some(r));
    // The a instance disappears behind berth's back: the next list makes
    // it a suspicion only; lists over `missing-confirm` confirm it.
    let inst = h.pool.node(a).unwrap().instance.clone().unwrap();
    h.cloud.providers[0].instances.remove(&inst);
    let t = h.config.timings.clone();
    h.advance(t.sync_interval + secs(1));
    ok(&h);
    assert_eq!(h.pool.node(a).unwrap().state.name(), "ready");
    assert!(h.pool.missing(a).is_some_and(|m| !m.confirmed));
    h.advance(t.missing_confirm + t.sync_interval);
    ok(&h);
    assert!(matches!(
        h.pool.node(a).unwrap().state,
        NodeState::Gone {
            reason: GoneReason::Vanished,
            ..
        }
    ));
    assert!(h.notices.contains(&Notice::Vanished { node: a }));
    assert!(!h.pool.request(r).unwrap().nodes.contains(&a));
    h.advance(secs(300));
    assert!(h.fulfilled(r));
    assert_eq!(h.calls(0, Call::Create).len(), 2);
}

#[test]
fn an_instance_still_listed_after_its_delete_is_deleted_again_after_delete_retry() {
    let mut h = one(|_| {});
    let r = h.submit(&[("a", 1)], 0);
    settle(&mut h);
    let n = h.pool.request(r).unwrap().nodes[0];
    let inst = h.pool.node(n).unwrap().instance.clone().unwrap();
    // The first delete answers fine but does nothing.
    h.cloud.providers[0].faults.push(Fault {
        call: Call::Delete,
        failure: Failure::Driver(DriverError::NotFound("already".into())),
        times: 1,
        reached: false,
    });
    let t = h.now;
    h.release(n);
    settle(&mut h);
    assert_eq!(h.pool.node(n).unwrap().state.name(), "gone");
    let retry = h.config.timings.delete_retry;
    h.advance(retry - secs(1));
    assert_eq!(h.calls(0, Call::Delete).len(), 1);
    h.advance(h.config.timings.sync_interval + secs(1));
    ok(&h);
    let deletes = h.calls(0, Call::Delete);
    assert_eq!(deletes.len(), 2, "deleted again");
    assert!(deletes[1] >= t + retry);
    assert!(
        h.cloud.providers[0]
            .instances
            .get(&inst)
            .is_none_or(|i| i.terminated.is_some())
    );
    assert!(
        !h.notices
            .iter()
            .any(|n| matches!(n, Notice::LeakDeleted { .. })),
        "not a leak: its node is known"
    );
}

#[test]
fn an_instance_listed_before_its_create_returned_is_counted_once() {
    let mut h = one(|c| c.providers[0].limits.max_instances = Some(1));
    h.latency = secs(100);
    let r = h.submit(&[("a", 1)], 0);
    h.step();
    assert!(matches!(
        h.in_flight[0].effect,
        Effect::Call(DriverCall::List { .. })
    ));
    h.deliver(0);
    h.tick();
    assert!(matches!(
        h.in_flight[0].effect,
        Effect::Call(DriverCall::Create { .. })
    ));
    h.now = h.now + h.config.timings.sync_interval;
    h.tick();
    let list = h
        .in_flight
        .iter()
        .position(|c| matches!(c.effect, Effect::Call(DriverCall::List { .. })))
        .expect("a list");
    h.deliver(list);
    h.tick();
    ok(&h);
    let status = h.pool.provider_status(ProviderIx(0));
    assert_eq!(status.usage.instances, 1);
    assert_eq!(status.leaks_pending, 0);
    assert_eq!(h.pool.nodes().count(), 1);
    let create = h
        .in_flight
        .iter()
        .position(|c| matches!(c.effect, Effect::Call(DriverCall::Create { .. })))
        .unwrap();
    h.deliver(create);
    h.tick();
    assert!(h.fulfilled(r));
    assert_eq!(h.pool.provider_status(ProviderIx(0)).usage.instances, 1);
    // The limit is full: another request waits.
    let r2 = h.submit(&[("a", 1)], 0);
    h.tick();
    assert_eq!(h.state(r2), RequestState::Pending);
    assert_eq!(h.calls(0, Call::Create).len(), 1);
    ok(&h);
}

// ---- crashes ------------------------------------------------------------

#[test]
fn restore_resolves_creates_and_deletes_left_in_flight() {
    // Whether the calls in flight at the crash reached the cloud.
    for reached in [true, false] {
        let mut h = one(|c| a_mut(c).min_ready = 2);
        h.latency = secs(30);
        h.reach_late = !reached;
        h.step();
        h.deliver(0);
        h.tick();
        let launched: Vec<NodeId> = creates(&h).into_iter().map(|(_, n)| n).collect();
        assert_eq!(launched.len(), 2);
        h.crash();
        h.latency = Duration::ZERO;
        h.reach_late = false;
        settle(&mut h);
        let mut now_creates: Vec<NodeId> = creates(&h).into_iter().map(|(_, n)| n).collect();
        if reached {
            assert_eq!(now_creates.len(), 2, "found by the list, not created again");
        } else {
            assert_eq!(
                now_creates.split_off(2),
                launched,
                "created again with the same ids"
            );
        }
        assert_eq!(h.count("a", "ready"), 2);
        assert_eq!(h.live(0), 2);
        h.check_no_leaks().unwrap();

        // Now a delete in flight at the crash.
        let victim = h.nodes("a", "ready")[0].id;
        h.latency = secs(30);
        h.reach_late = !reached;
        h.pool.delete(h.now, victim).unwrap();
        h.persist();
        h.step();
        assert!(
            h.in_flight
                .iter()
                .any(|c| matches!(c.effect, Effect::Call(DriverCall::Delete { .. })))
        );
        h.crash();
        h.latency = Duration::ZERO;
        h.reach_late = false;
        h.advance(secs(10));
        ok(&h);
        assert_eq!(h.pool.node(victim).unwrap().state.name(), "gone");
        assert_eq!(h.count("a", "ready"), 2);
        assert_eq!(h.live(0), 2);
        h.check_no_leaks().unwrap();
    }
}

/// The create token is what makes a create idempotent in the cloud: the
/// same for a create sent again after a crash, a new one for a try made
/// after the driver answered with an error.
#[test]
fn a_creates_token_holds_across_a_crash_and_changes_after_a_failed_try() {
    let mut h = one(|c| a_mut(c).min_ready = 1);
    h.latency = secs(30);
    h.reach_late = true;
    let sent = |h: &Harness| -> Vec<(NodeId, String)> {
        (h.log.iter())
            .filter_map(|(_, e)| match e {
                Effect::Call(DriverCall::Create { node, spec, .. }) => {
                    Some((*node, spec.token.clone()))
                }
                _ => None,
            })
            .collect()
    };
    // The first list's answer, then the create it allows.
    h.step();
    h.deliver(0);
    h.tick();
    let first = sent(&h);
    assert_eq!(first.len(), 1);
    let token = &first[0].1;
    let groups: Vec<usize> = token.split('-').map(str::len).collect();
    assert_eq!(groups, [8, 4, 4, 4, 12], "{token}");
    assert!(
        token
            .bytes()
            .all(|b| b == b'-' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    );
    assert_eq!(&token[14..15], "8", "version 8: {token}");
    h.crash();
    h.latency = Duration::ZERO;
    h.reach_late = false;
    h.cloud.providers[0].faults.push(Fault {
        call: Call::Create,
        failure: transient(),
        times: 1,
        reached: false,
    });
    assert!(h.run_until(secs(30), |h| h.count("a", "ready") == 1));
    let all = sent(&h);
    assert_eq!(all.len(), 3, "{all:?}");
    assert_eq!(
        all[1], first[0],
        "sent again after the crash: the same token"
    );
    assert_eq!(all[2].0, first[0].0, "the same node tried again");
    assert_ne!(all[2].1, first[0].1, "after a failed try: a new token");
    assert_eq!(h.live(0), 1);
    ok(&h);
}

#[test]
fn restore_keeps_slots_and_their_backing() {
    let mut h = slotted();
    let r = h.submit(&[("s", 2)], 0);
    settle(&mut h);
    assert!(h.fulfilled(r));
    h.crash();
    settle(&mut h);
    ok(&h);
    assert_eq!(backings(&h).len(), 1);
    assert_eq!(h.pool.free_ready(h.label("s")), 1);
    let r2 = h.submit(&[("s", 2)], 0);
    settle(&mut h);
    assert!(h.fulfilled(r2));
    assert_eq!(backings(&h).len(), 2);
    ok(&h);
}

/// A request of requestor `t` at priority 0.
fn asking(wants: Vec<(LabelIx, u32)>) -> NewRequest {
    NewRequest {
        requestor: "t".into(),
        priority: 0,
        wants,
        ..NewRequest::default()
    }
}

#[test]
fn submit_refuses_what_can_never_be_served() {
    let mut h = one(|c| c.providers[0].limits.max_instances = Some(2));
    let l = h.label("a");
    assert_eq!(h.pool.submit(h.now, asking(vec![])), Err(Refused::Empty));
    assert_eq!(
        h.pool.submit(h.now, asking(vec![(l, 0)])),
        Err(Refused::Empty)
    );
    assert!(matches!(
        h.pool.submit(h.now, asking(vec![(l, 1), (l, 1)])),
        Err(Refused::DuplicateLabel(_))
    ));
    assert!(matches!(
        h.pool.submit(h.now, asking(vec![(l, 3)])),
        Err(Refused::TooMany {
            wanted: 3,
            possible: 2,
            ..
        })
    ));
    assert!(h.pool.submit(h.now, asking(vec![(l, 2)])).is_ok());
}

#[test]
fn a_request_taken_in_from_another_process_keeps_its_id_and_is_served() {
    let mut h = one(|c| c.providers[0].limits.max_instances = Some(2));
    let l = h.label("a");
    let accepted = h.now;
    h.advance(secs(1));
    let id = RequestId(0xfeed);
    assert_eq!(
        h.pool
            .take_in(h.now, id, accepted, Ok(asking(vec![(l, 1)]))),
        TakenIn::Pending
    );
    // Taken in once: a second read of the same entry changes nothing.
    assert_eq!(
        h.pool
            .take_in(h.now, id, accepted, Ok(asking(vec![(l, 1)]))),
        TakenIn::Known
    );
    let changes = h.pool.take_changes();
    assert_eq!(changes.taken_in, vec![id, id]);
    assert_eq!(changes.requests.len(), 1);
    assert_eq!(changes.requests[0].created, accepted);
    assert!(h.pool.take_changes().taken_in.is_empty());
    settle(&mut h);
    assert!(h.fulfilled(id));
    ok(&h);
}

#[test]
fn a_request_under_a_given_id_is_taken_once_whichever_way_comes_first() {
    let mut h = one(|c| c.providers[0].limits.max_instances = Some(2));
    let l = h.label("a");
    let id = RequestId(0xbeef);
    // Relayed first, then found in the inbox: one request.
    assert_eq!(
        h.pool.submit_under(h.now, id, asking(vec![(l, 1)])),
        Ok(true)
    );
    assert_eq!(
        h.pool.submit_under(h.now, id, asking(vec![(l, 1)])),
        Ok(false)
    );
    assert_eq!(
        h.pool.take_in(h.now, id, h.now, Ok(asking(vec![(l, 1)]))),
        TakenIn::Known
    );
    // From the inbox first, then relayed late: still one.
    let other = RequestId(0xcafe);
    assert_eq!(
        h.pool
            .take_in(h.now, other, h.now, Ok(asking(vec![(l, 1)]))),
        TakenIn::Pending
    );
    assert_eq!(
        h.pool.submit_under(h.now, other, asking(vec![(l, 1)])),
        Ok(false)
    );
    assert_eq!(
        h.pool
            .submit_under(h.now, RequestId(1), asking(vec![(l, 3)])),
        Err(Refused::TooMany {
            label: "a".into(),
            wanted: 3,
            possible: 2
        })
    );
    let changes = h.pool.take_changes();
    assert_eq!(changes.requests.len(), 2);
    assert_eq!(changes.taken_in, vec![id, other]);
    settle(&mut h);
    assert!(h.fulfilled(id) && h.fulfilled(other));
    ok(&h);
}

#[test]
fn a_request_taken_in_that_cannot_be_served_here_fails_with_the_reason() {
    let mut h = one(|c| c.providers[0].limits.max_instances = Some(2));
    let l = h.label("a");
    let too_many = NewRequest {
        requestor: "t".into(),
        priority: 3,
        wants: vec![(l, 3)],
        ..NewRequest::default()
    };
    let id = RequestId(7);
    let TakenIn::Failed(reason) = h.pool.take_in(h.now, id, h.now, Ok(too_many)) else {
        panic!("taken in as pending");
    };
    assert!(reason.contains("at most 2"), "{reason}");
    let unknown = Refusal {
        requestor: "u".into(),
        priority: 0,
        reason: "no label `gpu`".into(),
    };
    let other = RequestId(8);
    assert!(matches!(
        h.pool.take_in(h.now, other, h.now, Err(unknown)),
        TakenIn::Failed(r) if r.contains("no label `gpu`")
    ));
    let changes = h.pool.take_changes();
    assert_eq!(changes.taken_in, vec![id, other]);
    for r in &changes.requests {
        assert!(matches!(&r.state, RequestState::Failed { .. }), "{r:?}");
    }
    assert_eq!(changes.requests.len(), 2);
    settle(&mut h);
    ok(&h);
}

// ---- leases -----------------------------------------------------------------

#[test]
fn a_client_that_stops_renewing_its_lease_loses_its_requests_and_nodes() {
    let mut h = one(|c| {
        a_mut(c).min_ready = 1;
        c.providers[0].limits.max_instances = Some(2);
    });
    settle(&mut h);
    h.renew("ci", secs(30));
    h.renew("other", secs(30));
    let held = h.submit_as("ci", &[("a", 1)], 0);
    let theirs = h.submit_as("other", &[("a", 1)], 0);
    settle(&mut h);
    assert!(h.fulfilled(held) && h.fulfilled(theirs));
    // 2 of 2 in use: this one waits.
    let waiting = h.submit_as("ci", &[("a", 1)], 0);
    settle(&mut h);
    assert_eq!(h.state(waiting), RequestState::Pending);
    // "other" keeps renewing, "ci" stops.
    h.advance(secs(20));
    h.renew("other", secs(30));
    h.advance(secs(20));
    ok(&h);
    assert!(
        reason(&h, waiting).contains("`ci` stopped renewing its lease"),
        "{}",
        reason(&h, waiting)
    );
    let n = h.pool.request(held).unwrap().nodes[0];
    assert!(
        matches!(h.pool.node(n).unwrap().state, NodeState::Gone { .. }),
        "reclaimed and, single use, deleted: {:?}",
        h.pool.node(n).unwrap().state
    );
    let m = h.pool.request(theirs).unwrap().nodes[0];
    assert!(matches!(
        h.pool.node(m).unwrap().state,
        NodeState::InUse { .. }
    ));
    assert_eq!(h.pool.lease("ci"), None);
    assert!(h.pool.lease("other").is_some());
    assert!(h.notices.iter().any(|n| matches!(
        n,
        Notice::LeaseExpired { requestor, failed: 1, reclaimed: 1 } if requestor == "ci"
    )));
}

#[test]
fn leases_survive_a_restart_and_still_expire() {
    let mut h = one(|c| c.requestor_lease_ttl = secs(60));
    h.renew("ci", secs(600));
    let r = h.submit_as("ci", &[("a", 1)], 0);
    settle(&mut h);
    assert!(h.fulfilled(r));
    h.crash();
    settle(&mut h);
    assert_eq!(
        h.pool.lease("ci"),
        Some(h.now + secs(600)),
        "kept as stored"
    );
    h.advance(secs(601));
    ok(&h);
    let n = h.pool.request(r).unwrap().nodes[0];
    assert!(h.pool.node(n).unwrap().state.is_final());
    h.crash();
    assert_eq!(h.pool.lease("ci"), None, "the expiry was stored");
}

/// A requestor cannot renew while no process decides (berth down, a
/// failover): a lease that expired meanwhile, or is about to, runs as long
/// from the restart as its last renewal made it last (here 60 s, not the
/// configured default of 10 minutes), and is stored so; a requestor that
/// renews within it keeps its nodes, and one that does not loses them then.
#[test]
fn a_restart_gives_every_lease_its_own_ttl_again_to_be_renewed() {
    let mut h = one(|c| c.requestor_lease_ttl = secs(600));
    h.renew("ci", secs(60));
    h.renew("gone", secs(60));
    h.renew("long", secs(3600));
    let kept = h.submit_as("ci", &[("a", 1)], 0);
    let lost = h.submit_as("gone", &[("a", 1)], 0);
    settle(&mut h);
    assert!(h.fulfilled(kept) && h.fulfilled(lost));
    // Down for five minutes (no step ran): both leases expired while nobody
    // could renew.
    h.now = h.now + secs(300);
    h.crash();
    settle(&mut h);
    assert_eq!(h.pool.lease("ci"), Some(h.now + secs(60)));
    assert!(
        h.fulfilled(kept) && h.fulfilled(lost),
        "nothing taken back at once"
    );
    assert_eq!(h.pool.lease("long"), Some(h.now + secs(3600)));
    let stored: Vec<_> = h.store.snapshot().leases;
    assert!(
        stored.iter().all(|l| l.expires == h.now + l.ttl
            && l.ttl == secs(if l.requestor == "long" { 3600 } else { 60 }))
            && stored.len() == 3,
        "the grace was stored: {stored:?}"
    );
    h.advance(secs(30));
    h.renew("ci", secs(60));
    h.advance(secs(31));
    ok(&h);
    let node = |r| h.pool.node(h.pool.request(r).unwrap().nodes[0]).unwrap();
    assert!(matches!(node(kept).state, NodeState::InUse { .. }));
    assert!(node(lost).state.is_final(), "{:?}", node(lost).state);
    assert_eq!(h.pool.lease("gone"), None);
}

#[test]
fn a_requestor_without_a_lease_keeps_its_nodes() {
    let mut h = one(|_| {});
    let r = h.submit(&[("a", 1)], 0);
    settle(&mut h);
    h.advance(secs(3600));
    ok(&h);
    let n = h.pool.request(r).unwrap().nodes[0];
    assert!(matches!(
        h.pool.node(n).unwrap().state,
        NodeState::InUse { .. }
    ));
}

#[test]
fn slot_nodes_filled_while_their_backing_launched_get_its_address() {
    let mut h = slotted();
    let r = h.submit(&[("s", 2)], 0);
    settle(&mut h);
    assert!(h.fulfilled(r));
    let b = &backings(&h)[0];
    for n in &h.pool.request(r).unwrap().nodes {
        let n = h.pool.node(*n).unwrap();
        assert_eq!(n.instance, b.instance);
        assert!(n.endpoint.is_some() && n.endpoint == b.endpoint, "{n:?}");
    }
}

/// Two nodes of label `a` on provider p0, both in use, settled.
fn two_nodes() -> (Harness, NodeId, NodeId) {
    let mut h = one(|_| {});
    let r = h.submit(&[("a", 2)], 0);
    settle(&mut h);
    let nodes = h.pool.request(r).unwrap().nodes.clone();
    assert!(h.fulfilled(r));
    (h, nodes[0], nodes[1])
}

#[test]
fn one_empty_list_changes_nothing() {
    let (mut h, a, b) = two_nodes();
    let creates_before = h.calls(0, Call::Create).len();
    h.cloud.providers[0].lies.push((Lie::Empty, 1));
    h.advance(h.config.timings.sync_interval + secs(1));
    ok(&h);
    // None of the known instances listed: the answer is not believed.
    let s = h.pool.provider_status(ProviderIx(0));
    assert!(
        matches!(s.list, ListHealth::Suspect { known: 2, .. }),
        "{s:?}"
    );
    assert_eq!(s.missing, 0);
    for n in [a, b] {
        assert_eq!(h.pool.node(n).unwrap().state.name(), "in-use");
    }
    assert!(
        h.notices
            .iter()
            .any(|n| matches!(n, Notice::ListSuspect { .. }))
    );
    // The next list is true: believed, and nothing happened.
    h.advance(h.config.timings.sync_interval + secs(1));
    ok(&h);
    assert_eq!(h.pool.provider_status(ProviderIx(0)).list, ListHealth::Ok);
    assert_eq!(h.calls(0, Call::Create).len(), creates_before);
    assert!(h.calls(0, Call::Delete).is_empty());
}

#[test]
fn a_suspected_instance_listed_again_is_simply_there() {
    let (mut h, _, _) = two_nodes();
    // A page lost once: one of the two instances not shown.
    h.cloud.providers[0].lies.push((Lie::Truncated, 1));
    h.advance(h.config.timings.sync_interval + secs(1));
    ok(&h);
    let missing: Vec<NodeId> = h
        .pool
        .nodes()
        .map(|n| n.id)
        .filter(|&n| h.pool.missing(n).is_some())
        .collect();
    assert_eq!(missing.len(), 1, "one suspected");
    h.advance(h.config.timings.sync_interval + secs(1));
    ok(&h);
    assert_eq!(h.pool.provider_status(ProviderIx(0)).missing, 0);
    assert!(
        h.notices
            .iter()
            .any(|n| matches!(n, Notice::Reappeared { .. }))
    );
    assert!(h.pool.nodes().all(|n| n.state.name() == "in-use"));
    assert!(h.calls(0, Call::Delete).is_empty());
}

/// Lists that lose a page for longer than `missing-confirm` replace
/// nothing that still runs: the instances they leave out are looked up by
/// id before their nodes are given up, and the look shows them.
#[test]
fn a_list_that_keeps_losing_a_page_replaces_nothing_that_still_runs() {
    let mut h = one(|c| c.labels[0].min_ready = 4);
    settle(&mut h);
    assert!(h.run_until(secs(30), |h| h.count("a", "ready") == 4));
    let creates_before = h.calls(0, Call::Create).len();
    let t = h.config.timings.clone();
    // Every list for the whole time loses its second half.
    h.cloud.providers[0].lies.push((Lie::Truncated, 1000));
    h.advance(t.missing_confirm + 4 * t.sync_interval);
    ok(&h);
    assert!(
        !h.calls(0, Call::Get).is_empty(),
        "the suspects were looked up by id"
    );
    assert_eq!(
        h.calls(0, Call::Create).len(),
        creates_before,
        "nothing replaced"
    );
    assert!(h.calls(0, Call::Delete).is_empty());
    assert_eq!(h.count("a", "ready"), 4);
    assert_eq!(h.live(0), 4);
    // An instance that really went is still confirmed gone by the look,
    // and replaced.
    let victim = h.nodes("a", "ready")[0].clone();
    h.cloud.providers[0]
        .instances
        .remove(victim.instance.as_deref().unwrap());
    h.advance(t.missing_confirm + 4 * t.sync_interval);
    ok(&h);
    assert_eq!(h.pool.node(victim.id).unwrap().state.name(), "gone");
    assert_eq!(h.count("a", "ready"), 4);
    assert_eq!(h.live(0), 4);
}

#[test]
fn a_node_in_use_whose_instance_is_gone_stays_with_its_holder_until_released() {
    let (mut h, a, _) = two_nodes();
    let inst = h.pool.node(a).unwrap().instance.clone().unwrap();
    h.cloud.providers[0].instances.remove(&inst);
    let t = h.config.timings.clone();
    h.advance(t.missing_confirm + 3 * t.sync_interval);
    ok(&h);
    assert_eq!(h.pool.node(a).unwrap().state.name(), "in-use");
    assert!(h.pool.missing(a).is_some_and(|m| m.confirmed));
    assert!(h.notices.contains(&Notice::LostInUse { node: a }));
    // It still counts against the provider until it is gone.
    assert_eq!(h.pool.provider_status(ProviderIx(0)).usage.instances, 2);
    h.release(a);
    settle(&mut h);
    h.advance(t.sync_interval + secs(1));
    ok(&h);
    assert_eq!(h.pool.node(a).unwrap().state.name(), "gone");
    assert_eq!(h.pool.provider_status(ProviderIx(0)).usage.instances, 1);
}

#[test]
fn lists_that_show_nothing_are_believed_once_that_has_lasted() {
    let mut h = one(|c| c.labels[0].min_ready = 2);
    settle(&mut h);
    h.advance(secs(5));
    assert_eq!(h.nodes("a", "ready").len(), 2);
    // The account really lost everything.
    for i in h.cloud.providers[0].instances.values_mut() {
        i.terminated = Some(T0);
    }
    h.cloud.providers[0].instances.clear();
    let t = h.config.timings.clone();
    h.advance(t.sync_interval + secs(1));
    assert!(matches!(
        h.pool.provider_status(ProviderIx(0)).list,
        ListHealth::Suspect { .. }
    ));
    assert_eq!(h.nodes("a", "ready").len(), 2, "not believed yet");
    // Believed after `missing-confirm`; then each node is suspected and
    // confirmed in turn, and the label is refilled.
    h.advance(2 * t.missing_confirm + 4 * t.sync_interval);
    ok(&h);
    assert_eq!(h.nodes("a", "ready").len(), 2);
    assert_eq!(h.cloud.providers[0].live().count(), 2);
    assert!(
        h.notices
            .iter()
            .any(|n| matches!(n, Notice::Vanished { .. }))
    );
}

#[test]
fn a_node_given_up_whose_instance_is_listed_again_is_back() {
    let mut h = one(|c| c.labels[0].min_ready = 1);
    settle(&mut h);
    h.advance(secs(5));
    let a = h.nodes("a", "ready")[0].id;
    let inst = h.pool.node(a).unwrap().instance.clone().unwrap();
    let hidden = h.cloud.providers[0].instances.remove(&inst).unwrap();
    let t = h.config.timings.clone();
    h.advance(t.missing_confirm + 3 * t.sync_interval);
    assert_eq!(h.pool.node(a).unwrap().state.name(), "gone");
    // It was there all along, and the label was refilled meanwhile: the
    // node comes back (the provider has room) rather than being deleted.
    h.cloud.providers[0].instances.insert(inst.clone(), hidden);
    h.advance(t.sync_interval + secs(1));
    ok(&h);
    assert_eq!(h.pool.node(a).unwrap().state.name(), "ready");
    assert!(h.notices.contains(&Notice::Revived {
        node: a,
        instance: inst
    }));
    assert!(h.calls(0, Call::Delete).is_empty());
}

#[test]
fn failed_lists_back_off_and_are_said_once_a_minute() {
    let mut h = one(|_| {});
    settle(&mut h);
    h.cloud.providers[0].faults.push(Fault {
        call: Call::List,
        failure: transient(),
        times: 1000,
        reached: false,
    });
    let t = h.config.timings.clone();
    let from = h.now;
    h.advance(t.sync_interval + secs(5 * 60));
    let lists: Vec<Time> = h
        .calls(0, Call::List)
        .into_iter()
        .filter(|&c| c > from)
        .collect();
    // Doubling from boot-poll-interval up to sync-interval: far fewer than
    // one per boot-poll-interval.
    assert!(lists.len() < 20, "{} lists in 6 minutes", lists.len());
    let gaps: Vec<u64> = lists
        .windows(2)
        .map(|w| w[1].since(w[0]).as_secs())
        .collect();
    assert!(gaps.windows(2).all(|g| g[1] >= g[0]), "{gaps:?}");
    let said = h
        .notices
        .iter()
        .filter(|n| matches!(n, Notice::ListFailing { .. }))
        .count();
    assert!((5..=8).contains(&said), "said {said} times in 6 minutes");
    assert!(matches!(
        h.pool.provider_status(ProviderIx(0)).list,
        ListHealth::Failing { .. }
    ));
}

// ---- readiness probes -------------------------------------------------------

fn probes(h: &Harness) -> usize {
    h.log
        .iter()
        .filter(|(_, e)| matches!(e, Effect::Probe(_)))
        .count()
}

const KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKey host";

/// One label `a` that is ready once an SSH probe passes; the instances run
/// at once and answer probes `ready_delay` after that.
fn probed(ready_delay: Option<Duration>, f: impl FnOnce(&mut Config)) -> Harness {
    let mut h = one(|c| {
        a_mut(c).ready = crate::config::Readiness::SSH;
        f(c);
    });
    h.dt = Duration::from_millis(10);
    h.cloud.providers[0].ready_delay = ready_delay;
    h.cloud.providers[0].host_keys = vec![KEY.into()];
    h
}

#[test]
fn a_node_is_handed_out_only_once_its_probe_passes_and_keeps_its_host_keys() {
    let mut h = probed(Some(secs(2)), |_| {});
    settle(&mut h);
    let start = h.now;
    let r = h.submit(&[("a", 1)], 0);
    assert!(!h.run_until(Duration::from_millis(1900), |h| h.fulfilled(r)));
    let n = h.pool.nodes().next().unwrap().id;
    let p = h.pool.probing(n).expect("probing");
    assert!(p.attempts >= 3, "tried again and again: {p:?}");
    assert_eq!(p.last_error.as_deref(), Some("connection refused"));
    assert!(h.run_until(secs(2), |h| h.fulfilled(r)));
    let took = h.now.since(start);
    // Refused probes are tried again at gaps of at most a second.
    assert!(took <= Duration::from_millis(3000), "{took:?}");
    assert_eq!(h.pool.probing(n), None);
    let keys = |h: &Harness| {
        (h.pool.node(n).unwrap().endpoint.as_ref())
            .map(|e| e.connection.host_keys.clone())
            .unwrap_or_default()
    };
    assert_eq!(keys(&h), [KEY]);
    // Lists that report no keys leave them, and so does a restart.
    h.advance(secs(150));
    assert!(h.calls(0, Call::List).len() >= 3);
    h.crash();
    settle(&mut h);
    h.advance(secs(70));
    assert_eq!(keys(&h), [KEY]);
    assert_eq!(
        h.store.nodes[&n]
            .endpoint
            .as_ref()
            .unwrap()
            .connection
            .host_keys,
        [KEY]
    );
    ok(&h);
}

#[test]
fn a_node_whose_probe_never_passes_is_relaunched_after_the_boot_timeout_as_a_failed_try() {
    let mut h = probed(None, |c| {
        a_mut(c).boot_timeout = secs(30);
        a_mut(c).launch_retries = 1;
    });
    settle(&mut h);
    let r = h.submit(&[("a", 1)], 0);
    assert!(h.run_until(secs(120), |h| h.state(r) != RequestState::Pending));
    let why = reason(&h, r);
    assert!(
        why.contains("running but not ready after the boot timeout (30s)")
            && why.contains("timed out waiting for the server's banner"),
        "{why}"
    );
    assert_eq!(
        h.calls(0, Call::Create).len(),
        2,
        "one launch and one retry"
    );
    assert_eq!(h.calls(0, Call::Delete).len(), 2, "both deleted");
    // About one probe a second for each 30 s boot, not a storm.
    let p = probes(&h);
    assert!((40..=80).contains(&p), "{p} probes");
    ok(&h);
}

#[test]
fn a_server_showing_other_host_keys_than_the_cloud_reported_is_not_ready() {
    let mut h = probed(Some(Duration::ZERO), |c| {
        a_mut(c).boot_timeout = secs(10);
        a_mut(c).launch_retries = 0;
    });
    h.cloud.providers[0].reported_keys = vec!["ssh-ed25519 AAAAOther cloud".into()];
    settle(&mut h);
    let r = h.submit(&[("a", 1)], 0);
    assert!(h.run_until(secs(60), |h| h.state(r) != RequestState::Pending));
    assert!(
        reason(&h, r).contains("not the ones the cloud reported"),
        "{}",
        reason(&h, r)
    );
    // The same key under another comment matches.
    let mut h = probed(Some(Duration::ZERO), |_| {});
    h.cloud.providers[0].reported_keys = vec![KEY.replace(" host", " from-the-console")];
    settle(&mut h);
    let r = h.submit(&[("a", 1)], 0);
    assert!(h.run_until(secs(5), |h| h.fulfilled(r)));
}

#[test]
fn a_label_ready_when_running_is_never_probed() {
    let mut h = one(|c| a_mut(c).min_ready = 2);
    settle(&mut h);
    let r = h.submit(&[("a", 3)], 0);
    settle(&mut h);
    assert!(h.fulfilled(r));
    assert_eq!(probes(&h), 0);
}

#[test]
fn slot_nodes_are_ready_when_their_probed_backing_is_and_share_its_host_keys() {
    let mut c = config(
        vec![provider("p0")],
        vec![machine("big", vec![offer(0, "big")]), slots("s", 0, 3)],
    );
    c.labels[0].ready = crate::config::Readiness::SSH;
    let mut h = Harness::new(c);
    h.dt = Duration::from_millis(10);
    h.cloud.providers[0].ready_delay = Some(secs(1));
    h.cloud.providers[0].host_keys = vec![KEY.into()];
    settle(&mut h);
    let r = h.submit(&[("s", 2)], 0);
    assert!(!h.run_until(Duration::from_millis(900), |h| h.fulfilled(r)));
    assert!(h.run_until(secs(3), |h| h.fulfilled(r)));
    for n in &h.pool.request(r).unwrap().nodes {
        let e = h.pool.node(*n).unwrap().endpoint.clone().unwrap();
        assert_eq!(e.connection.host_keys, [KEY]);
    }
    assert!(probes(&h) >= 1);
    ok(&h);
}

// ---- the store's identity, signed tags and quarantine -------------------------

/// The tags `id` carries in the fake cloud.
fn cloud_tags(h: &Harness, p: usize, id: &str) -> Tags {
    h.cloud.providers[p].instances[id].tags.clone()
}

/// A node of label `a` made ready and handed out: its request and node.
fn handed_out(h: &mut Harness) -> (RequestId, NodeId) {
    settle(h);
    h.advance(secs(5));
    let r = h.submit(&[("a", 1)], 0);
    settle(h);
    h.advance(secs(1));
    let n = h.pool.request(r).unwrap().nodes[0];
    (r, n)
}

/// Whether any delete or set-tags call went to `instance`.
fn touched(h: &Harness, instance: &str) -> bool {
    h.log.iter().any(|(_, e)| {
        matches!(e, Effect::Call(DriverCall::Delete { instance: i, .. }) | Effect::Call(DriverCall::SetTags { instance: i, .. }) if i == instance)
    })
}

/// A server made in the cloud project by hand, with the pool's tags: no
/// signature, a signature by another store's key, a signature of other tags.
/// None is adopted, handed out or deleted; each is shown in quarantine with
/// why, and said once.
#[test]
fn instances_the_store_cannot_vouch_for_are_never_handed_out_nor_deleted() {
    let mut h = one(|c| a_mut(c).min_ready = 0);
    let other_store = Identity {
        generation: "1111111111111111".into(),
        key: [9; 32],
        confirmed: true,
    };
    let mut forged_key = signed_tags(&h.config, NodeId(2), "a", "t0");
    forged_key.insert(
        crate::driver::SIG_TAG.into(),
        Identity {
            key: [9; 32],
            ..Identity::default()
        }
        .sign(Signed {
            pool_id: &h.config.pool_id,
            node: NodeId(2),
            label: "a",
            instance_type: "t0",
            slots: None,
        }),
    );
    let mut other_generation = signed_tags(&h.config, NodeId(3), "a", "t0");
    other_generation.insert(
        crate::driver::STORE_TAG.into(),
        other_store.generation.clone(),
    );
    // Another node's signature copied onto this node id.
    let mut copied = signed_tags(&h.config, NodeId(4), "a", "t0");
    copied.insert(NODE_TAG.into(), NodeId(5).to_string());
    let cases = [
        (owned_tags(&h, &NodeId(1).to_string(), "a"), "no signature"),
        (forged_key, "does not match"),
        (
            other_generation,
            "another store (generation 1111111111111111)",
        ),
        (copied, "does not match"),
    ];
    let planted: Vec<String> = cases
        .iter()
        .map(|(tags, _)| h.cloud.plant(0, "t0", tags.clone(), T0))
        .collect();
    settle(&mut h);
    let r = h.submit(&[("a", 1)], 0);
    settle(&mut h);
    h.advance(h.config.timings.leak_grace * 3 + h.config.timings.sync_interval * 3);
    ok(&h);
    assert!(h.fulfilled(r));
    let given = h.pool.request(r).unwrap().nodes[0];
    let given = h.pool.node(given).unwrap().instance.clone().unwrap();
    assert!(!planted.contains(&given), "a new instance was made for it");
    let status = h.pool.provider_status(ProviderIx(0));
    for (id, (_, why)) in planted.iter().zip(&cases) {
        assert!(!touched(&h, id), "{id} was deleted or retagged");
        assert!(h.pool.nodes().all(|n| n.instance.as_deref() != Some(id)));
        let q = &status.quarantined[id];
        assert!(q.why.contains(why), "{id}: {}", q.why);
    }
    assert_eq!(status.quarantined.len(), 4);
    assert_eq!(status.leaks_deleted, 0);
    let said: Vec<&Notice> = (h.notices.iter())
        .filter(|n| matches!(n, Notice::Quarantined { .. }))
        .collect();
    assert!(
        matches!(said.as_slice(), [Notice::Quarantined { count: 4, named, .. }] if named.len() == 4),
        "said once: {said:?}"
    );
    assert!(
        h.pool.provider_status(ProviderIx(0)).mismatch.is_none(),
        "a confirmed store goes on"
    );
}

/// An instance signed by this store that no node accounts for is the
/// store's own: adopted, or deleted as a leak, as before.
#[test]
fn an_unknown_instance_this_store_signed_is_adopted() {
    let mut h = one(|c| a_mut(c).min_ready = 1);
    let tags = signed_tags(&h.config, NodeId(0x77), "a", "t0");
    let id = h.cloud.plant(0, "t0", tags, T0);
    settle(&mut h);
    h.advance(secs(5));
    let n = h.pool.node(NodeId(0x77)).expect("adopted");
    assert_eq!(n.instance.as_deref(), Some(id.as_str()));
    assert_eq!(h.calls(0, Call::Create).len(), 0, "min-ready met by it");
    assert!(h.pool.provider_status(ProviderIx(0)).quarantined.is_empty());
}

/// A store that has not faced the clouds (new, emptied, replaced) and
/// finds instances of the pool it cannot vouch for on a provider neither
/// adopts them as ready nor deletes them, and creates nothing there. Adopted
/// on purpose, they are its own from then on. A store that finds none is
/// confirmed, and the confirmation is stored.
#[test]
fn an_unconfirmed_store_facing_another_stores_instances_stops() {
    let mut h = one(|c| a_mut(c).min_ready = 2);
    settle(&mut h);
    h.advance(secs(5));
    assert_eq!(h.count("a", "ready"), 2);
    let made: Vec<String> = h.cloud.providers[0].live().map(|i| i.id.clone()).collect();
    // The store is lost: a new one, with an identity of its own.
    h.store = Store {
        identity: Identity {
            generation: "2222222222222222".into(),
            key: [3; 32],
            confirmed: false,
        },
        ..Store::default()
    };
    h.crash();
    let before = h.log.len();
    settle(&mut h);
    h.advance(secs(30));
    let why = (h.pool.provider_status(ProviderIx(0)).mismatch).expect("held");
    assert!(why.contains("2 live instances of pool"), "{why}");
    assert!(
        why.contains("another store (generation 0000000000000000)"),
        "{why}"
    );
    assert!(why.contains("has not faced the clouds"), "{why}");
    assert!(
        h.notices
            .iter()
            .any(|n| matches!(n, Notice::StoreMismatch { .. }))
    );
    let calls: Vec<Call> = h.log[before..].iter().map(|(_, e)| Call::of(e)).collect();
    assert!(calls.iter().all(|c| *c == Call::List), "{calls:?}");
    assert_eq!(h.pool.nodes().count(), 0, "nothing adopted");
    for id in &made {
        assert!(!touched(&h, id));
    }
    assert!(!h.store.identity.confirmed);

    // Adopted on purpose: taken as they are, signed anew, and the store
    // confirmed.
    h.crash();
    h.pool.adopt_instances();
    settle(&mut h);
    h.advance(secs(5));
    assert!(h.pool.provider_status(ProviderIx(0)).mismatch.is_none());
    assert_eq!(h.count("a", "ready"), 2);
    assert!(h.store.identity.confirmed, "the store records it");
    for id in &made {
        let tags = cloud_tags(&h, 0, id);
        assert_eq!(
            tags.get(crate::driver::STORE_TAG).map(String::as_str),
            Some("2222222222222222"),
            "signed anew"
        );
    }
    // From now on the store vouches for them, adopting on purpose or not.
    h.crash();
    settle(&mut h);
    h.advance(secs(5));
    assert!(h.pool.provider_status(ProviderIx(0)).mismatch.is_none());
    assert_eq!(h.count("a", "ready"), 2);
    assert!(h.pool.provider_status(ProviderIx(0)).quarantined.is_empty());
}

#[test]
fn an_unconfirmed_store_that_finds_nothing_is_confirmed() {
    let mut h = one(|c| a_mut(c).min_ready = 1);
    h.store.identity.confirmed = false;
    h.crash();
    settle(&mut h);
    h.advance(secs(5));
    assert!(h.store.identity.confirmed);
    assert_eq!(h.count("a", "ready"), 1);
    assert!(h.pool.provider_status(ProviderIx(0)).mismatch.is_none());
}

/// A node handed out carries its request in its tags; a reused node
/// returned loses it again.
#[test]
fn a_node_handed_out_is_tagged_with_its_request_until_it_comes_back() {
    let mut h = one(|c| {
        a_mut(c).min_ready = 1;
        a_mut(c).reuse = true;
    });
    let (r, n) = handed_out(&mut h);
    let inst = h.pool.node(n).unwrap().instance.clone().unwrap();
    let tags = cloud_tags(&h, 0, &inst);
    assert_eq!(
        tags.get(crate::driver::REQUEST_TAG),
        Some(&r.to_string()),
        "{tags:?}"
    );
    assert!(tags.contains_key(crate::driver::SIG_TAG));
    h.release(n);
    settle(&mut h);
    h.advance(secs(1));
    assert_eq!(h.pool.node(n).unwrap().state.name(), "ready");
    assert!(!cloud_tags(&h, 0, &inst).contains_key(crate::driver::REQUEST_TAG));
    // Nothing more is set while the tags stay right.
    let set = h.calls(0, Call::SetTags).len();
    h.advance(h.config.timings.sync_interval * 3);
    assert_eq!(h.calls(0, Call::SetTags).len(), set);
}

/// The store lost a hand-out (a damaged log): its node is ready there, but
/// its instance is tagged as handed out to a request the store does not
/// have. It is put on hold, not handed to anyone else, and not deleted.
#[test]
fn a_free_node_whose_instance_is_tagged_as_handed_out_is_put_on_hold() {
    let mut h = one(|c| a_mut(c).min_ready = 1);
    let (r, n) = handed_out(&mut h);
    h.advance(secs(5));
    // The store as it was before the hand-out's commit.
    h.store.requests.remove(&r);
    let stored = h.store.nodes.get_mut(&n).unwrap();
    stored.state = NodeState::Ready { since: h.now };
    h.crash();
    settle(&mut h);
    h.advance(secs(2));
    let node = h.pool.node(n).unwrap();
    assert_eq!(node.idle, Idle::Hold, "{node:?}");
    assert!(h.notices.iter().any(|x| matches!(x, Notice::HeldByTags { node, why, .. } if *node == n && why.contains(&r.to_string()))));
    let r2 = h.submit(&[("a", 1)], 0);
    settle(&mut h);
    h.advance(secs(5));
    assert!(h.fulfilled(r2));
    assert_ne!(
        h.pool.request(r2).unwrap().nodes[0],
        n,
        "not handed out again"
    );
    h.advance(h.config.timings.leak_grace * 2);
    let inst = h.pool.node(n).unwrap().instance.clone().unwrap();
    assert!(h.cloud.providers[0].instances[&inst].terminated.is_none());
}

/// The store lost the node of a handed-out instance altogether: the
/// instance is adopted, on hold.
#[test]
fn an_unknown_instance_tagged_as_handed_out_is_adopted_on_hold() {
    let mut h = one(|c| a_mut(c).min_ready = 0);
    let mut tags = signed_tags(&h.config, NodeId(0x99), "a", "t0");
    tags.insert(
        crate::driver::REQUEST_TAG.into(),
        RequestId(0x42).to_string(),
    );
    let id = h.cloud.plant(0, "t0", tags, T0);
    settle(&mut h);
    h.advance(secs(2));
    let n = h.pool.node(NodeId(0x99)).expect("adopted");
    assert_eq!(n.idle, Idle::Hold);
    assert_eq!(n.instance.as_deref(), Some(id.as_str()));
    let r = h.submit(&[("a", 1)], 0);
    settle(&mut h);
    h.advance(secs(5));
    assert_ne!(h.pool.request(r).unwrap().nodes[0], NodeId(0x99));
}

/// Instances made before signed tags: the store knows their nodes, so it
/// vouches for them, and the first start signs them (once).
#[test]
fn the_nodes_a_store_knows_are_signed_at_the_first_start() {
    let mut h = one(|c| a_mut(c).min_ready = 1);
    settle(&mut h);
    h.advance(secs(5));
    let inst = h.cloud.providers[0].live().next().unwrap().id.clone();
    for key in [
        crate::driver::SIG_TAG,
        crate::driver::STORE_TAG,
        crate::driver::IDLE_TAG,
    ] {
        h.cloud.providers[0]
            .instances
            .get_mut(&inst)
            .unwrap()
            .tags
            .remove(key);
    }
    h.crash();
    settle(&mut h);
    h.advance(secs(2));
    assert!(cloud_tags(&h, 0, &inst).contains_key(crate::driver::SIG_TAG));
    assert!(h.pool.provider_status(ProviderIx(0)).quarantined.is_empty());
    let set = h.calls(0, Call::SetTags).len();
    assert_eq!(set, 1);
    h.advance(h.config.timings.sync_interval * 3);
    assert_eq!(h.calls(0, Call::SetTags).len(), set);
}

/// A stored lease deadline is never believed further than its TTL from
/// the restart: it may have been written by a clock that was ahead.
#[test]
fn a_lease_stored_far_ahead_lasts_only_its_ttl_after_a_restart() {
    let mut h = one(|c| c.requestor_lease_ttl = secs(45));
    h.renew("ci", secs(45));
    let r = h.submit_as("ci", &[("a", 1)], 0);
    settle(&mut h);
    h.advance(secs(2));
    assert!(h.fulfilled(r));
    // Written by a clock an hour ahead.
    let stored = h.store.leases.get_mut("ci").unwrap();
    stored.expires = h.now + secs(3600 + 45);
    h.crash();
    settle(&mut h);
    assert_eq!(h.pool.lease("ci"), Some(h.now + secs(45)));
    h.advance(secs(46));
    ok(&h);
    let n = h.pool.request(r).unwrap().nodes[0];
    assert!(h.pool.node(n).unwrap().state.is_final(), "taken back");
}

/// The instances a new store could not vouch for are deleted in the cloud
/// by a person: the provider goes on, and the store is confirmed.
#[test]
fn a_provider_held_for_another_stores_instances_goes_on_once_they_are_gone() {
    let mut h = one(|c| a_mut(c).min_ready = 1);
    h.store.identity.confirmed = false;
    h.cloud
        .plant(0, "t0", owned_tags(&h, &NodeId(8).to_string(), "a"), T0);
    h.crash();
    settle(&mut h);
    h.advance(secs(5));
    assert!(h.pool.provider_status(ProviderIx(0)).mismatch.is_some());
    assert_eq!(h.calls(0, Call::Create).len(), 0);
    for i in h.cloud.providers[0].instances.values_mut() {
        i.terminated = Some(T0);
    }
    h.advance(h.config.timings.sync_interval * 2);
    ok(&h);
    assert!(h.pool.provider_status(ProviderIx(0)).mismatch.is_none());
    assert!(
        h.notices
            .iter()
            .any(|n| matches!(n, Notice::StoreMismatchEnded { .. }))
    );
    assert_eq!(h.count("a", "ready"), 1);
    assert!(h.store.identity.confirmed);
}

/// Creates and deletes due together go to a driver that declared
/// `create-many` and `delete-many` in one call each; to one that did not,
/// one call per instance.
#[test]
fn calls_due_together_go_in_one_batch_to_a_driver_that_takes_them() {
    for batches in [false, true] {
        let mut h = one(|_| {});
        if batches {
            h.declare(
                0,
                Batches {
                    create: true,
                    delete: true,
                },
            );
        }
        let r = h.submit(&[("a", 5)], 0);
        assert!(h.run_until(secs(30), |h| h.fulfilled(r)));
        for n in h.pool.request(r).unwrap().nodes.clone() {
            h.release(n);
        }
        assert!(h.run_until(secs(30), |h| h.live(0) == 0
            && h.pool.nodes().all(|n| n.state.is_final())));
        ok(&h);
        let count = |call| h.calls(0, call).len();
        let made = (
            count(Call::Create),
            count(Call::CreateMany),
            count(Call::Delete),
            count(Call::DeleteMany),
        );
        if batches {
            assert_eq!(made, (0, 1, 0, 1), "one batch each way");
            let sizes: Vec<usize> = (h.log.iter())
                .filter_map(|(_, e)| match e {
                    Effect::Call(DriverCall::CreateMany { creates, .. }) => Some(creates.len()),
                    Effect::Call(DriverCall::DeleteMany { deletes, .. }) => Some(deletes.len()),
                    _ => None,
                })
                .collect();
            assert_eq!(sizes, [5, 5]);
        } else {
            assert_eq!(made, (5, 0, 5, 0), "one call per instance");
        }
    }
}

/// Each answer in a batch counts on its own: with room for three in the
/// account, a batch of five creates makes three nodes' instances, and the
/// other two are given up on a quota pause, as five single creates would.
#[test]
fn each_answer_of_a_batch_counts_on_its_own() {
    let mut h = one(|_| {});
    h.declare(
        0,
        Batches {
            create: true,
            delete: true,
        },
    );
    h.cloud.providers[0].quota = Some(3);
    let r = h.submit(&[("a", 5)], 0);
    assert!(h.run_until(secs(5), |h| h.count("a", "ready") == 3));
    ok(&h);
    assert_eq!(h.calls(0, Call::CreateMany).len(), 1);
    assert_eq!(h.live(0), 3);
    assert!(
        (h.notices.iter()).any(|n| matches!(n, Notice::QuotaPaused { .. })),
        "{:?}",
        h.notices
    );
    assert!(!h.fulfilled(r));
    // Room again: the request is served with what is missing.
    h.cloud.providers[0].quota = None;
    assert!(h.run_until(secs(600), |h| h.fulfilled(r)));
    assert_eq!(h.live(0), 5);
    ok(&h);
}

/// A batch of creates whose answer was lost after it reached the cloud is
/// not sent again blind: the next list finds its instances, and no node
/// gets a second one.
#[test]
fn a_batch_of_creates_whose_answer_was_lost_makes_no_second_instances() {
    let mut h = one(|_| {});
    h.declare(
        0,
        Batches {
            create: true,
            delete: true,
        },
    );
    h.cloud.providers[0].faults.push(Fault {
        call: Call::CreateMany,
        failure: Failure::Unknown("the answer was lost".into()),
        times: 1,
        reached: true,
    });
    let r = h.submit(&[("a", 4)], 0);
    assert!(h.run_until(secs(60), |h| h.fulfilled(r)));
    ok(&h);
    assert_eq!(h.calls(0, Call::CreateMany).len(), 1, "never sent again");
    assert_eq!(h.calls(0, Call::Create).len(), 0);
    assert_eq!(h.live(0), 4);
}

/// A create whose answer berth refused (a batch answered with another
/// number of results than items, an instance that fails the checks) may
/// have made its instances: they are found by the next list, never made a
/// second time.
#[test]
fn creates_whose_answer_was_refused_wait_for_a_list_and_make_no_second_instances() {
    for batches in [true, false] {
        let mut h = one(|_| {});
        h.declare(
            0,
            Batches {
                create: batches,
                delete: batches,
            },
        );
        let call = if batches {
            Call::CreateMany
        } else {
            Call::Create
        };
        h.cloud.providers[0].faults.push(Fault {
            call,
            failure: Failure::host(
                HostFailureKind::BadAnswer,
                "the batch answered 3 results to 4 items",
            ),
            times: if batches { 1 } else { 4 },
            reached: true,
        });
        let r = h.submit(&[("a", 4)], 0);
        assert!(
            h.run_until(secs(60), |h| h.fulfilled(r)),
            "batches: {batches}"
        );
        ok(&h);
        let sent = h.calls(0, Call::CreateMany).len() + h.calls(0, Call::Create).len();
        assert_eq!(sent, if batches { 1 } else { 4 }, "never sent again");
        assert_eq!(h.live(0), 4);
    }
}

/// A node launched for a request carries `berth-request` from its create:
/// handing it out costs no `set-tags`. A ready node handed out costs one,
/// and its instance shows the request either way.
#[test]
fn a_node_launched_for_a_request_is_handed_out_without_a_tag_call() {
    let mut h = one(|_| {});
    let r = h.submit(&[("a", 3)], 0);
    assert!(h.run_until(secs(30), |h| h.fulfilled(r)));
    assert_eq!(h.calls(0, Call::SetTags).len(), 0);
    assert_eq!(shown_of(&h, r), 3);
    ok(&h);

    let mut h = one(|c| a_mut(c).min_ready = 1);
    assert!(h.run_until(secs(30), |h| h.count("a", "ready") == 1));
    let r = h.submit(&[("a", 1)], 0);
    assert!(h.run_until(secs(30), |h| h.fulfilled(r)
        && h.calls(0, Call::SetTags).len() == 1));
    assert_eq!(shown_of(&h, r), 1);
    ok(&h);
}

/// How many of the cloud's live instances are tagged with request `r`.
fn shown_of(h: &Harness, r: RequestId) -> usize {
    (h.cloud.providers[0].live())
        .filter(|i| i.tags.get(REQUEST_TAG) == Some(&r.to_string()))
        .count()
}

/// The list calls (their cursors) in the harness's log, in order.
fn list_cursors(h: &Harness) -> Vec<Option<String>> {
    (h.log.iter())
        .filter_map(|(_, e)| match e {
            Effect::Call(DriverCall::List { cursor, .. }) => Some(cursor.clone()),
            _ => None,
        })
        .collect()
}

/// The core follows a list's pages one call at a time, each within the
/// provider's rate, and believes the list once its last page is in.
#[test]
fn a_list_follows_its_pages_one_call_at_a_time_within_the_rate() {
    let mut h = one(|c| {
        a_mut(c).min_ready = 5;
        c.providers[0].rate = Some(1.0);
        c.providers[0].burst = 1;
    });
    h.cloud.providers[0].page_size = Some(2);
    assert!(h.run_until(secs(120), |h| h.count("a", "ready") == 5));
    let from = h.log.len();
    let _ = h.run_until(secs(90), |_| false);
    // A list of the five: pages of 2, 2 and 1, each after the one before.
    let pages: Vec<(Time, Option<String>)> = (h.log[from..].iter())
        .filter_map(|(t, e)| match e {
            Effect::Call(DriverCall::List { cursor, .. }) => Some((*t, cursor.clone())),
            _ => None,
        })
        .collect();
    let first = pages
        .iter()
        .position(|(_, c)| c.is_none())
        .expect("a first page");
    let list: Vec<&(Time, Option<String>)> = pages[first..].iter().take(3).collect();
    assert_eq!(list.len(), 3, "{pages:?}");
    assert!(list[1].1.is_some() && list[2].1.is_some(), "{pages:?}");
    assert_ne!(list[1].1, list[2].1);
    // One call a second: the rate holds each page.
    assert!(
        list[1].0.since(list[0].0) >= Duration::from_millis(900),
        "{pages:?}"
    );
    assert!(
        list[2].0.since(list[1].0) >= Duration::from_millis(900),
        "{pages:?}"
    );
    assert_eq!(h.count("a", "ready"), 5);
    ok(&h);
}

/// A list whose second page keeps failing, for far longer than
/// `missing-confirm`, changes nothing: the first page alone is never taken
/// for the whole list, and no node is given up, replaced or deleted.
#[test]
fn a_list_whose_page_fails_midway_leaves_every_node_in_place() {
    let mut h = one(|c| a_mut(c).min_ready = 6);
    h.cloud.providers[0].page_size = Some(2);
    assert!(h.run_until(secs(120), |h| h.count("a", "ready") == 6));
    let ready: Vec<NodeId> = h.nodes("a", "ready").iter().map(|n| n.id).collect();
    let (creates, deletes) = (
        h.calls(0, Call::Create).len(),
        h.calls(0, Call::Delete).len(),
    );
    let lists = list_cursors(&h).len();
    h.cloud.providers[0].failing_pages = Some(1);
    let confirm = h.config.timings.missing_confirm;
    let _ = h.run_until(confirm * 4 + secs(60), |_| false);
    ok(&h);
    assert!(list_cursors(&h).len() > lists + 4, "lists were tried");
    assert!(matches!(
        h.pool.provider_status(ProviderIx(0)).list,
        ListHealth::Failing { .. }
    ));
    let still: Vec<NodeId> = h.nodes("a", "ready").iter().map(|n| n.id).collect();
    assert_eq!(still, ready);
    assert_eq!(h.pool.provider_status(ProviderIx(0)).missing, 0);
    assert_eq!(h.calls(0, Call::Create).len(), creates);
    assert_eq!(h.calls(0, Call::Delete).len(), deletes);
    // The pages come back: the list is believed again.
    h.cloud.providers[0].failing_pages = None;
    assert!(h.run_until(secs(120), |h| matches!(
        h.pool.provider_status(ProviderIx(0)).list,
        ListHealth::Ok
    )));
    assert_eq!(h.count("a", "ready"), 6);
    ok(&h);
}

/// The first list's pages, answered by hand until the pool stops asking.
/// Each answer is `page(i)` for the i-th page; returns how many pages were
/// asked.
fn answer_pages(pool: &mut Pool, mut page: impl FnMut(u32) -> Page) -> u32 {
    let now = Time::ZERO;
    let mut out = Vec::new();
    pool.tick(now, &mut out);
    let mut asked = 0;
    loop {
        let cursors: Vec<Option<String>> = (out.drain(..))
            .filter_map(|e| match e {
                Effect::Call(DriverCall::List { cursor, .. }) => Some(cursor),
                _ => None,
            })
            .collect();
        match cursors.len() {
            0 => return asked,
            1 => {}
            n => panic!("{n} pages asked at once"),
        }
        let answer = page(asked);
        asked += 1;
        pool.listed(now, ProviderIx(0), Ok(answer));
        pool.tick(now, &mut out);
    }
}

/// A driver whose list never ends, or that hands back a cursor too long to
/// keep, gets its list failed, not believed; an instance named on two
/// pages is refused on both.
#[test]
fn a_list_that_never_ends_or_names_an_instance_twice_is_not_taken_at_its_word() {
    let config = || {
        Arc::new(config(
            vec![provider("p0")],
            vec![machine("a", vec![offer(0, "t0")])],
        ))
    };
    let failing = |pool: &Pool| match &pool.provider_status(ProviderIx(0)).list {
        ListHealth::Failing { error, .. } => Some(error.clone()),
        _ => None,
    };

    let mut pool = Pool::new(config(), 7);
    let asked = answer_pages(&mut pool, |i| Page {
        instances: Vec::new(),
        next: Some(format!("c{i}")),
    });
    assert_eq!(asked, MAX_PAGES);
    let error = failing(&pool).expect("the list failed");
    assert!(error.contains("did not end after 1000 pages"), "{error}");

    let mut pool = Pool::new(config(), 7);
    let asked = answer_pages(&mut pool, |_| Page {
        instances: Vec::new(),
        next: Some("x".repeat(MAX_CURSOR + 1)),
    });
    assert_eq!(asked, 1);
    let error = failing(&pool).expect("the list failed");
    assert!(error.contains("cursor of 4097 bytes"), "{error}");

    // An instance of the pool berth does not know, on both pages: refused
    // on both, so never taken for a leak.
    let mut pool = Pool::new(config(), 7);
    let stray = Instance {
        id: "i-twice".into(),
        state: InstanceState::Running,
        instance_type: "t0".into(),
        tags: [(POOL_TAG.to_string(), "pool-1".to_string())].into(),
        addresses: Default::default(),
        created_at_ms: None,
        connection: Default::default(),
        failure: None,
    };
    let asked = answer_pages(&mut pool, |i| Page {
        instances: vec![stray.clone()],
        next: (i == 0).then(|| "c0".to_string()),
    });
    assert_eq!(asked, 2);
    assert!(failing(&pool).is_none());
    let notices = pool.take_notices();
    assert!(
        notices
            .iter()
            .any(|n| matches!(n, Notice::ListRefused { refused, .. } if refused.len() == 2)),
        "{notices:?}"
    );
    assert_eq!(pool.provider_status(ProviderIx(0)).leaks_pending, 0);
}

// ---- why a request waits ---------------------------------------------------

/// The reasons of `h.pool.waiting(r)`, by name, with their node counts.
fn waits(h: &Harness, r: RequestId) -> Vec<(&'static str, u32)> {
    (h.pool.waiting(r).iter())
        .map(|w| (w.reason.name(), w.nodes))
        .collect()
}

/// A pending request says what each of its nodes waits for: a create
/// under way, a boot, the provider's own limit, the cloud's quota with
/// when the pause ends; and nothing once it is served.
#[test]
fn a_pending_request_says_what_each_of_its_nodes_waits_for() {
    let mut h = one(|c| c.providers[0].limits.max_instances = Some(2));
    h.cloud.providers[0].boot_delay = secs(10);
    let r = h.submit(&[("a", 2)], 0);
    assert_eq!(waits(&h, r), [("not-listed", 2)], "before the first list");
    h.pool.cancel(h.now, r).unwrap();
    settle(&mut h);
    h.latency = secs(1);
    let r = h.submit(&[("a", 2)], 0);
    assert_eq!(waits(&h, r), [("next", 2)], "not planned yet");
    settle(&mut h);
    let w = h.pool.waiting(r);
    assert_eq!(waits(&h, r), [("creating", 1), ("creating", 1)]);
    assert!(
        w.iter()
            .all(|w| w.node.is_some() && w.provider == Some(ProviderIx(0)))
    );
    h.advance(secs(2));
    assert_eq!(waits(&h, r), [("booting", 1), ("booting", 1)]);
    h.advance(secs(60));
    assert!(h.fulfilled(r));
    assert!(h.pool.waiting(r).is_empty(), "served: waits for nothing");

    // Both instances in use: a third node waits for the provider's limit.
    let third = h.submit(&[("a", 1)], 0);
    settle(&mut h);
    assert_eq!(
        h.pool.waiting(third),
        [Wait {
            label: LabelIx(0),
            nodes: 1,
            node: None,
            provider: Some(ProviderIx(0)),
            reason: WaitReason::Blocked(Blocked::Limit {
                what: Limit::MaxInstances,
                used: 2,
                max: 2
            }),
        }]
    );
    ok(&h);
}

/// Two labels on one provider, each with room on its own and not
/// together: the request says so, rather than naming a limit either alone
/// would not reach.
#[test]
fn a_request_that_fits_label_by_label_but_not_whole_says_together() {
    let mut h = a_and("b", 3, 0);
    let held = h.submit(&[("a", 1)], 0);
    settle(&mut h);
    assert!(h.fulfilled(held));
    let r = h.submit(&[("a", 1), ("b", 2)], 0);
    settle(&mut h);
    assert_eq!(h.state(r), RequestState::Pending);
    assert_eq!(waits(&h, r), [("together", 3)]);
    ok(&h);
}

/// A request with idempotency key `key` asking for `n` nodes of `l`.
fn keyed(l: LabelIx, key: &str, n: u32) -> NewRequest {
    NewRequest {
        key: Some(key.into()),
        ..asking(vec![(l, n)])
    }
}

#[test]
fn a_key_given_again_answers_the_request_it_made_and_refuses_another_ask() {
    let mut h = one(|_| {});
    let l = h.label("a");
    let first = h.pool.ask(h.now, keyed(l, "k1", 1)).unwrap();
    assert!(first.fresh);
    assert_eq!(first.id, keyed_id("t", "k1"));
    h.persist();
    let again = h.pool.ask(h.now, keyed(l, "k1", 1)).unwrap();
    assert_eq!(
        again,
        Submitted {
            id: first.id,
            fresh: false
        }
    );
    // Under the same key: another count, another priority, other
    // metadata are each refused, naming the request the key made.
    let mut other_meta = keyed(l, "k1", 1);
    other_meta.metadata.insert("build".into(), "7".into());
    let other_priority = NewRequest {
        priority: 3,
        ..keyed(l, "k1", 1)
    };
    for differs in [keyed(l, "k1", 2), other_meta, other_priority] {
        assert_eq!(
            h.pool.ask(h.now, differs),
            Err(Refused::KeyReused {
                key: "k1".into(),
                request: first.id
            })
        );
    }
    // Another requestor's key is its own, and so is another key.
    let theirs = NewRequest {
        requestor: "u".into(),
        ..keyed(l, "k1", 1)
    };
    let theirs = h.pool.ask(h.now, theirs).unwrap();
    let second = h.pool.ask(h.now, keyed(l, "k2", 1)).unwrap();
    assert!(theirs.fresh && second.fresh);
    assert_eq!(
        [first.id, theirs.id, second.id]
            .into_iter()
            .collect::<HashSet<_>>()
            .len(),
        3
    );
    h.persist();
    // A restart keeps what a key made: the store holds the key.
    h.crash();
    let after = h.pool.ask(h.now, keyed(l, "k1", 1)).unwrap();
    assert!(!after.fresh);
    assert_eq!(h.pool.requests().count(), 3);
    assert!(h.run_until(secs(60), |h| h.fulfilled(first.id)));
    ok(&h);
}

#[test]
fn a_keyed_request_is_kept_until_its_key_expires_and_the_key_then_makes_a_new_one() {
    let mut h = one(|c| {
        c.timings.history = secs(60);
        c.timings.idempotency_ttl = secs(300);
    });
    let l = h.label("a");
    let with_key = h.pool.ask(h.now, keyed(l, "k", 1)).unwrap().id;
    let without = h.pool.submit(h.now, asking(vec![(l, 1)])).unwrap();
    h.persist();
    assert!(h.run_until(secs(60), |h| h.fulfilled(with_key) && h.fulfilled(without)));
    let made = h.now;
    for r in [with_key, without] {
        for n in h.pool.request(r).unwrap().nodes.clone() {
            h.release(n);
        }
    }
    // Past `history`: the request without a key is forgotten, the one
    // with a key is not.
    h.advance(secs(90));
    assert!(h.pool.request(without).is_none());
    assert!(h.pool.request(with_key).is_some());
    assert!(!h.pool.ask(h.now, keyed(l, "k", 1)).unwrap().fresh);
    // Past `idempotency-ttl` from when it was made: forgotten too, and
    // the key makes a new request, whatever it asks.
    h.advance(secs(300) - h.now.since(made) + secs(2));
    assert!(h.pool.request(with_key).is_none());
    let anew = h.pool.ask(h.now, keyed(l, "k", 2)).unwrap();
    assert_eq!(
        anew,
        Submitted {
            id: with_key,
            fresh: true
        }
    );
    h.persist();
    ok(&h);
}

#[test]
fn a_raised_history_keeps_an_ended_request_past_its_first_timer() {
    let mut h = one(|c| c.timings.history = secs(60));
    let l = h.label("a");
    let r = h.pool.submit(h.now, asking(vec![(l, 1)])).unwrap();
    h.persist();
    h.pool.cancel(h.now, r).unwrap();
    h.persist();
    // A reload raises `history` before the request's timer fires: the
    // timer finds it kept longer and is set again for then.
    let mut c = (*h.config).clone();
    c.timings.history = secs(600);
    let c = Arc::new(c);
    h.pool.reconfigure(c.clone(), h.now).expect("a live change");
    h.config = c;
    h.advance(secs(120));
    assert!(h.pool.request(r).is_some());
    h.advance(secs(500));
    assert!(h.pool.request(r).is_none());
}

/// A stream of one-node requests, each held `HOLD` once served and one
/// more asked every second, keeps a pool of ten full; a ten-node request
/// comes in among them. Answers when it was served (seconds after it was
/// asked), if within two minutes, and whether a one-node request of a
/// higher priority asked while it waited was served first.
fn big_among_small(reserve_after: Duration) -> (Option<u64>, bool) {
    const HOLD: u64 = 3;
    let mut h = one(|c| {
        c.providers[0].limits.max_instances = Some(10);
        c.timings.reserve_after = reserve_after;
    });
    let mut small: Vec<(RequestId, Option<Time>)> = Vec::new();
    let ask = |h: &mut Harness, priority: i32| {
        let id = h.submit_as("stream", &[("a", 1)], priority);
        (id, None)
    };
    for _ in 0..10 {
        small.push(ask(&mut h, 0));
    }
    assert!(h.run_until(secs(30), |h| small.iter().all(|(r, _)| h.fulfilled(*r))));
    let big = h.submit_as("big", &[("a", 10)], 0);
    let asked = h.now;
    let mut urgent = None;
    let mut urgent_first = false;
    for second in 0..120 {
        h.advance(secs(1));
        if h.fulfilled(big) {
            return (Some(h.now.since(asked).as_secs()), urgent_first);
        }
        if let Some(u) = urgent
            && h.fulfilled(u)
        {
            urgent_first = true;
        }
        // Those held long enough are given back; one more is asked.
        for (r, served) in &mut small {
            if served.is_none() && h.fulfilled(*r) {
                *served = Some(h.now);
            }
            if served.is_some_and(|t| h.now.since(t) >= secs(HOLD)) {
                h.release_held(*r);
            }
        }
        small.push(ask(&mut h, 0));
        if second == 31 {
            let u = h.submit_as("urgent", &[("a", 1)], -1);
            urgent = Some(u);
            small.push((u, None));
        }
    }
    (None, urgent_first)
}

#[test]
fn a_request_past_reserve_after_keeps_what_frees_up_and_is_served_whole() {
    // With no reserving, the one-node requests take every machine as it
    // frees: the ten-node request starves.
    let (served, _) = big_among_small(secs(3600));
    assert_eq!(served, None, "served without keeping room");
    // Past reserve-after (30 s) it keeps what frees up: served within
    // reserve-after and the holds of the machines it waits for (its own,
    // and the one a request of a higher priority takes first: priority
    // still orders requests, and the room kept does not hold that one
    // back).
    let (served, urgent_first) = big_among_small(secs(30));
    let served = served.expect("the ten-node request starved");
    println!("the ten-node request was served {served} s after it was asked");
    assert!(urgent_first, "the request of a higher priority waited");
    assert!(
        (30..=30 + 2 * 3 + 5).contains(&served),
        "served after {served} s"
    );
}

#[test]
fn a_request_over_a_cap_waits_with_the_reason_cap_and_is_served_once_enough_is_given_back() {
    let mut h = one(|c| {
        c.requestor_caps.insert("ci".into(), 3);
        c.labels[0].max_nodes = Some(4);
    });
    // Alone over a cap: refused when asked.
    let l = h.label("a");
    let over = NewRequest {
        requestor: "ci".into(),
        ..asking(vec![(l, 4)])
    };
    assert!(matches!(
        h.pool.submit(h.now, over),
        Err(Refused::OverCap(_))
    ));
    assert!(matches!(
        h.pool.submit(h.now, asking(vec![(l, 5)])),
        Err(Refused::OverCap(_))
    ));

    let first = h.submit_as("ci", &[("a", 2)], 0);
    assert!(h.run_until(secs(30), |h| h.fulfilled(first)));
    // Two held, a cap of three: a request for two waits, with the reason.
    let second = h.submit_as("ci", &[("a", 2)], 0);
    h.advance(secs(10));
    assert_eq!(h.state(second), RequestState::Pending);
    let waits = h.pool.waiting(second);
    assert_eq!(
        waits.iter().map(|w| &w.reason).collect::<Vec<_>>(),
        [&WaitReason::Cap(Cap::Requestor {
            name: "ci".into(),
            held: 2,
            max: 3
        })]
    );
    // Another requestor is held only by the label's cap: two fit, the
    // third would take the label over four.
    let theirs = h.submit_as("u", &[("a", 2)], 0);
    assert!(h.run_until(secs(30), |h| h.fulfilled(theirs)));
    let third = h.submit_as("u", &[("a", 1)], 0);
    h.advance(secs(10));
    assert_eq!(
        h.pool
            .waiting(third)
            .iter()
            .map(|w| &w.reason)
            .collect::<Vec<_>>(),
        [&WaitReason::Cap(Cap::Label {
            label: l,
            held: 4,
            max: 4
        })]
    );
    // Never failed for it, however long it waits; served once enough is
    // given back.
    h.advance(secs(3600));
    assert_eq!(h.state(second), RequestState::Pending);
    for n in h.pool.request(first).unwrap().nodes.clone() {
        h.release(n);
    }
    assert!(h.run_until(secs(30), |h| h.fulfilled(second)));
    for n in h.pool.request(theirs).unwrap().nodes.clone() {
        h.release(n);
    }
    assert!(h.run_until(secs(30), |h| h.fulfilled(third)));
    ok(&h);
}

/// 2026-11-30 was a Monday; this is 00:00 UTC that day, in ms.
const MONDAY: u64 = 1_795_996_800_000;

#[test]
fn a_windows_days_and_hours_are_utc_and_one_past_midnight_belongs_to_the_day_it_opens() {
    use crate::config::Window;
    let h = |hours: u64, mins: u64| (hours * 3600 + mins * 60) * 1000;
    let day = 86_400_000;
    // Weekday mornings, 08:00 to 12:00.
    let mornings = Window {
        days: 0b001_1111,
        from: 8 * 3600,
        to: 12 * 3600,
        min_ready: 5,
    };
    assert!(!mornings.contains(MONDAY + h(7, 59)));
    assert!(mornings.contains(MONDAY + h(8, 0)));
    assert!(mornings.contains(MONDAY + 4 * day + h(11, 59)));
    assert!(!mornings.contains(MONDAY + h(12, 0)));
    assert!(!mornings.contains(MONDAY + 5 * day + h(9, 0)), "Saturday");
    // Friday night 22:00 to 02:00: still open early on Saturday, not on
    // Friday before 02:00 (Thursday night is not in it).
    let friday_night = Window {
        days: 1 << 4,
        from: 22 * 3600,
        to: 2 * 3600,
        min_ready: 2,
    };
    assert!(friday_night.contains(MONDAY + 4 * day + h(23, 0)));
    assert!(friday_night.contains(MONDAY + 5 * day + h(1, 59)));
    assert!(!friday_night.contains(MONDAY + 4 * day + h(1, 0)));
    assert!(!friday_night.contains(MONDAY + 5 * day + h(2, 0)));
    let mut label = Label::new("a", LabelKind::Machine { offers: vec![] });
    label.min_ready = 1;
    label.schedule = vec![mornings, friday_night];
    assert_eq!(label.min_ready_at(MONDAY + h(9, 0)), 5);
    assert_eq!(label.min_ready_at(MONDAY + h(13, 0)), 1);
    assert_eq!(
        label.next_window_edge(MONDAY + h(9, 0)),
        Some(MONDAY + h(12, 0))
    );
    assert_eq!(
        label.next_window_edge(MONDAY + h(23, 0)),
        Some(MONDAY + day + h(2, 0))
    );
}

#[test]
fn a_schedule_window_raises_min_ready_while_it_is_open_and_idle_nodes_go_after_it() {
    let mut h = one(|c| {
        c.labels[0].min_ready = 1;
        c.labels[0].idle_timeout = Some(secs(60));
        c.labels[0].schedule = vec![crate::config::Window {
            days: 0b111_1111,
            from: 9 * 3600,
            to: 10 * 3600,
            min_ready: 4,
        }];
    });
    h.now = Time(MONDAY + 8 * 3_600_000 + 3_590_000); // 08:59:50
    h.advance(secs(5));
    assert_eq!(h.count("a", "ready"), 1);
    // Open at 09:00: four kept ready, with no request.
    h.advance(secs(20));
    assert_eq!(h.count("a", "ready"), 4);
    // Still open at 09:59:50; closed at 10:00: the three beyond min-ready
    // idle out within an idle-timeout (60 s).
    h.advance(secs(3600 - 25 - 10));
    assert_eq!(h.count("a", "ready"), 4);
    h.advance(secs(10 + 65));
    assert_eq!(h.count("a", "ready"), 1);
    ok(&h);
}

#[test]
fn burst_extra_launches_more_when_a_request_takes_the_last_ready_node() {
    let mut h = one(|c| {
        c.labels[0].min_ready = 2;
        c.labels[0].burst_extra = 3;
    });
    assert!(h.run_until(secs(30), |h| h.count("a", "ready") == 2));
    // A request for one leaves one ready: nothing more than min-ready.
    let one_of_two = h.submit(&[("a", 1)], 0);
    assert!(h.run_until(secs(30), |h| h.fulfilled(one_of_two)));
    h.advance(secs(10));
    assert_eq!(h.count("a", "ready"), 2);
    // One for both takes the last: min-ready and three more.
    let both = h.submit(&[("a", 2)], 0);
    assert!(h.run_until(secs(30), |h| h.fulfilled(both)));
    h.advance(secs(10));
    assert_eq!(h.count("a", "ready"), 2 + 3);
    // Owed once: with one taken again, the pool refills to min-ready and
    // the burst's ready nodes, not beyond.
    h.advance(secs(60));
    assert_eq!(h.count("a", "ready"), 5);
    ok(&h);
}
