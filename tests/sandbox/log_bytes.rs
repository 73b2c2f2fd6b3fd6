//! What a driver writes to berth's log is bounded in bytes as well as in
//! records.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{Hostile, start};
use crate::support::metric;
use crate::support::server::until;

/// `log-bytes` in the test's config, in bytes a second.
const LOG_BYTES: u64 = 16 << 10;
/// Five seconds' worth may be written at once.
const BURST: u64 = 5 * LOG_BYTES;
/// The largest record the driver writes, as berth writes it: 32 fields of
/// 1 KiB with their keys, a 4 KiB message, and its line.
const RECORD: u64 = 32 * (1024 + 16) + 4096 + 256;

/// Regression: the driver log's limit counted records, not bytes. One
/// provider's records of 32 fields of 1 KiB each, within the record rate,
/// wrote 188 MB in 45 s. Now each provider also has a byte budget
/// (`log-bytes`), and berth's log grows by at most that budget while a
/// driver writes as fast as it can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_long_log_records_is_held_to_the_byte_budget() {
    let (_sim, _dir, server) = start(
        &[Hostile {
            // The record rate alone would let 1,000 records of 37 KiB a
            // second through.
            sandbox: "call-deadline = \"60s\"\nlog-rate = 1000\nlog-bytes = \"16KiB\"",
            calls: 1,
            ..Hostile::new("loud", json!({"mode": "logbytes"}))
        }],
        &[],
    )
    .await;
    let dropped = "berth_driver_log_dropped_total{provider=\"loud\"}";
    let dropped_now = || async { metric(&server.metrics(None).await, dropped).unwrap_or(0.0) };
    // Once the driver's records reach the log, it is writing as fast as it
    // can, for up to a minute (its call deadline).
    until(60, "the driver's flood in the log", || async {
        (server.log_text()).contains("driver: mmmm").then_some(())
    })
    .await;
    let size = || std::fs::metadata(&server.log).map_or(0, |m| m.len());
    let (from, before, dropped_before) = (Instant::now(), size(), dropped_now().await);
    // A rate is measured over a span of time: six seconds of the flood.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let span = from.elapsed();
    let grown = size() - before;
    // The budget over the span, the burst, one record that may overdraw
    // it, and a margin of a quarter and 32 KiB for berth's own lines
    // (the sim provider, the summaries of what was dropped).
    let budget = LOG_BYTES as f64 * span.as_secs_f64() + (BURST + RECORD) as f64;
    let most = budget * 1.25 + f64::from(32u32 << 10);
    eprintln!(
        "log: grew {grown} bytes in {span:?} while the driver flooded it; the budget is {budget:.0}, at most {most:.0} allowed"
    );
    assert!(
        (grown as f64) <= most,
        "the log grew {grown} bytes in {span:?}, at most {most:.0} allowed"
    );
    // The driver went on writing throughout: records went on being dropped.
    let dropped_after = dropped_now().await;
    assert!(
        dropped_after > dropped_before,
        "no record dropped in the span: {dropped_before} then {dropped_after}"
    );
    // What was dropped is summed up in the log, in records and bytes.
    until(15, "a summary of what was dropped", || async {
        server.log_text().contains("dropped_bytes=").then_some(())
    })
    .await;
    let bytes = metric(
        &server.metrics(None).await,
        "berth_driver_log_dropped_bytes_total{provider=\"loud\"}",
    )
    .unwrap_or(0.0);
    assert!(bytes > 1e6, "{bytes} bytes dropped");
    server.terminate().await.assert_success();
}
