//! berth's choices on top of the `prometheus-client` crate, which keeps the
//! metrics and writes them out for `/metrics` in the OpenMetrics text format:
//! the latency buckets, an `f64` gauge, registration and the content type.
//!
//! The crate's conventions, which [`crate::telemetry::Telemetry`] follows: a
//! counter is registered without the `_total` its samples carry, a help text
//! without its final full stop (both are added when written out), and a
//! family with no children yet is left out. Children of a family come out in
//! no particular order.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Metric, Registry};

/// Latency bucket upper bounds in seconds, from half a millisecond to a
/// minute: wide enough for both local calls and slow cloud APIs.
pub const DEFAULT_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// The `Content-Type` of what [`encode`] writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A gauge of `f64` values: counts, seconds, bytes, prices.
pub type Gauge = prometheus_client::metrics::gauge::Gauge<f64, AtomicU64>;

/// A family of histograms labelled by `S`, each over the same buckets.
pub type Histograms<S> = Family<S, Histogram, fn() -> Histogram>;

/// A histogram over [`DEFAULT_BUCKETS`].
pub fn latency() -> Histogram {
    Histogram::new(DEFAULT_BUCKETS.iter().copied())
}

/// Registers `metric` and hands it back, to keep as the handle that feeds it.
pub fn register<M: Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    metric: M,
) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// Every registered metric in registration order, then `# EOF`.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    text::encode(&mut out, registry).expect("berth's metrics encode into a String");
    out
}
