//! How warm capacity is kept, compared on one recorded day: the requests
//! of `bench/traces/bursty-day.csv` (made by `scripts/bursty-trace`)
//! replayed through the pool core and the fake cloud of `testkit`, on
//! paused time, under a fixed `min-ready` and under `burst-extra` and a
//! `min-ready` schedule. For each: how many requests were served from ready
//! nodes (handed out in the step they were asked), the wait's p50 and p95,
//! the node-hours spent ready and idle, and the instances launched.
//!
//! `cargo test --release -p berth-core --lib -- --ignored --nocapture
//! headroom` prints the table docs/BENCHMARKS.md shows. Ignored by default:
//! it replays a whole day five times.

use std::time::Duration;

use super::testkit::*;
use super::*;
use crate::config::{Label, Window};

/// 2026-11-30, a Monday, 00:00 UTC, in ms: the trace's day.
const MONDAY: u64 = 1_795_996_800_000;

/// One request of the trace.
struct Asked {
    at: u64,
    nodes: u32,
    hold: u64,
}

fn trace() -> Vec<Asked> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../bench/traces/bursty-day.csv"
    );
    let text = std::fs::read_to_string(path).expect("the trace");
    text.lines()
        .skip(1)
        .map(|line| {
            let f: Vec<u64> = line
                .split(',')
                .map(|x| x.parse().expect("a number"))
                .collect();
            Asked {
                at: f[0],
                nodes: f[1] as u32,
                hold: f[2],
            }
        })
        .collect()
}

/// What one way of keeping warm capacity gave on the day.
struct Outcome {
    from_ready: usize,
    waits: Vec<u64>,
    idle_node_hours: f64,
}

/// Replays `asked` on a pool whose label `a` is set by `warm`: one
/// provider with room for 300 instances that take 90 s to boot, and ten
/// minutes of `idle-timeout`.
fn replay(asked: &[Asked], warm: impl FnOnce(&mut Label)) -> Outcome {
    let mut c = config(
        vec![provider("p0")],
        vec![machine("a", vec![offer(0, "t0")])],
    );
    c.providers[0].limits.max_instances = Some(300);
    c.labels[0].idle_timeout = Some(Duration::from_secs(600));
    c.labels[0].launch_retries = 10;
    warm(&mut c.labels[0]);
    let mut h = Harness::new(c);
    h.cloud.providers[0].boot_delay = Duration::from_secs(90);
    let a = h.label("a");
    // The pool settles for an hour before the day starts.
    h.now = Time(MONDAY - 3_600_000);
    h.advance(Duration::from_secs(3600));
    let mut next = 0;
    let mut waiting: Vec<(RequestId, u64, u64)> = Vec::new();
    let mut holding: Vec<(u64, RequestId)> = Vec::new();
    let mut out = Outcome {
        from_ready: 0,
        waits: Vec::new(),
        idle_node_hours: 0.0,
    };
    for second in 0..86_400 + 3_600 {
        while next < asked.len() && asked[next].at == second {
            let r = &asked[next];
            let id = h.submit_as("ci", &[("a", r.nodes)], 0);
            waiting.push((id, second, r.hold));
            next += 1;
        }
        h.advance(Duration::from_secs(1));
        waiting.retain(|&(id, since, hold)| {
            if !h.fulfilled(id) {
                return true;
            }
            // Asked and handed out within the same second: from ready.
            let wait = second - since;
            if wait == 0 {
                out.from_ready += 1;
            }
            out.waits.push(wait);
            holding.push((second + hold, id));
            false
        });
        let due: Vec<RequestId> = (holding.iter())
            .filter(|(until, _)| *until <= second)
            .map(|(_, id)| *id)
            .collect();
        holding.retain(|(until, _)| *until > second);
        for id in due {
            h.release_held(id);
        }
        if second < 86_400 {
            out.idle_node_hours += h.pool.free_ready(a) as f64 / 3600.0;
        }
    }
    assert!(
        waiting.is_empty(),
        "{} requests never served",
        waiting.len()
    );
    out
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[test]
#[ignore = "replays a day five times; run with --ignored"]
fn headroom() {
    let asked = trace();
    // (name, min-ready, burst-extra, min-ready of weekdays 07:15 to 17:00)
    let ways: [(&str, u32, u32, Option<u32>); 5] = [
        ("min-ready 5", 5, 0, None),
        ("min-ready 25", 25, 0, None),
        ("min-ready 5, burst-extra 15", 5, 15, None),
        (
            "min-ready 5, 25 from 07:15 to 17:00 on weekdays",
            5,
            0,
            Some(25),
        ),
        ("both", 5, 15, Some(25)),
    ];
    println!("{} requests over one day; boots take 90 s\n", asked.len());
    println!("| warm capacity | served from ready | wait p50 | wait p95 | idle node-hours |");
    println!("| --- | --- | --- | --- | --- |");
    for (name, min_ready, burst_extra, rush) in ways {
        let mut o = replay(&asked, |l| {
            l.min_ready = min_ready;
            l.burst_extra = burst_extra;
            l.schedule = (rush.iter())
                .map(|&min_ready| Window {
                    days: 0b001_1111,
                    from: 7 * 3600 + 15 * 60,
                    to: 17 * 3600,
                    min_ready,
                })
                .collect();
        });
        o.waits.sort_unstable();
        println!(
            "| {name} | {} of {} ({:.0} %) | {} s | {} s | {:.1} |",
            o.from_ready,
            asked.len(),
            100.0 * o.from_ready as f64 / asked.len() as f64,
            percentile(&o.waits, 50.0),
            percentile(&o.waits, 95.0),
            o.idle_node_hours,
        );
    }
}
