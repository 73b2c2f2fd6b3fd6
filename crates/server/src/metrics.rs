//! A small Prometheus registry: counters, gauges and histograms, written out
//! in the text exposition format (version 0.0.4) for `/metrics`.
//!
//! Families are registered once at start, each with a name, help text and
//! fixed label names; a family's children are found by label values. Handles
//! are cheap clones of an `Arc`, and the hot paths (a counter's `inc`, a
//! histogram's `observe` on a child that exists) take a read lock and touch
//! atomics without allocating. Names are compile-time constants in berth, so
//! a bad name or a wrong number of label values is a programming error and
//! panics.
//!
//! Gauges computed at scrape time (nodes by state, say) call [`Gauge::reset`]
//! and set fresh values before [`Registry::render`]. Do both on one task or
//! under one lock, so that two scrapes do not interleave.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

/// Latency bucket upper bounds in seconds, from half a millisecond to a
/// minute: wide enough for both local calls and slow cloud APIs.
pub const DEFAULT_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// The `Content-Type` of what [`Registry::render`] writes.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The families of one service, written out in registration order.
#[derive(Default)]
pub struct Registry {
    families: Mutex<Vec<Arc<dyn Render>>>,
}

impl Registry {
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Registers a counter family. Panics on a bad or taken name.
    pub fn counter(&self, name: &str, help: &str, labels: &[&str]) -> Counter {
        let counter = Counter(self.add(Family::new(name, help, labels, &[])));
        if labels.is_empty() {
            counter.with(&[]);
        }
        counter
    }

    /// Registers a gauge family. Panics on a bad or taken name.
    pub fn gauge(&self, name: &str, help: &str, labels: &[&str]) -> Gauge {
        let gauge = Gauge(self.add(Family::new(name, help, labels, &[])));
        if labels.is_empty() {
            gauge.with(&[]);
        }
        gauge
    }

    /// Registers a histogram family with the given bucket upper bounds in
    /// seconds (finite, strictly increasing; `+Inf` is implied). Panics on a
    /// bad or taken name, on the label name `le`, or on bad bounds.
    pub fn histogram(&self, name: &str, help: &str, labels: &[&str], buckets: &[f64]) -> Histogram {
        assert!(
            buckets.iter().all(|b| b.is_finite()) && buckets.is_sorted_by(|a, b| a < b),
            "metric `{name}`: bucket bounds {buckets:?} must be finite and strictly increasing \
             (`+Inf` is implied)"
        );
        let histogram = Histogram {
            family: self.add(Family::new(name, help, labels, &["le"])),
            bounds: buckets.into(),
        };
        if labels.is_empty() {
            histogram.with(&[]);
        }
        histogram
    }

    fn add<C: Cell>(&self, family: Family<C>) -> Arc<Family<C>> {
        let family = Arc::new(family);
        let mut families = self.families.lock().unwrap_or_else(PoisonError::into_inner);
        assert!(
            families.iter().all(|f| f.name() != family.name),
            "metric `{}` is registered twice",
            family.name
        );
        families.push(family.clone());
        family
    }

    /// Writes every family in registration order, each with `# HELP` and
    /// `# TYPE` lines (even with no children yet) and its samples sorted by
    /// label values, so that equal state gives equal text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let families = self.families.lock().unwrap_or_else(PoisonError::into_inner);
        for family in families.iter() {
            family.render(&mut out);
        }
        out
    }
}

/// A family of `u64` counters that only go up.
#[derive(Clone)]
pub struct Counter(Arc<Family<AtomicU64>>);

/// One counter of a [`Counter`] family.
#[derive(Clone)]
pub struct CounterChild(Arc<AtomicU64>);

impl Counter {
    /// The child with these label values, made at zero if new.
    pub fn with(&self, values: &[&str]) -> CounterChild {
        CounterChild(self.0.child(values, || AtomicU64::new(0)))
    }

    pub fn inc(&self, values: &[&str]) {
        self.with(values).inc();
    }

    pub fn inc_by(&self, values: &[&str], n: u64) {
        self.with(values).inc_by(n);
    }
}

impl CounterChild {
    pub fn inc(&self) {
        self.inc_by(1);
    }

    pub fn inc_by(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// A family of `f64` gauges that are set or moved either way.
#[derive(Clone)]
pub struct Gauge(Arc<Family<GaugeCell>>);

/// One gauge of a [`Gauge`] family.
#[derive(Clone)]
pub struct GaugeChild(Arc<GaugeCell>);

/// An `f64` kept as its bits in an atomic.
#[derive(Default)]
struct GaugeCell(AtomicU64);

impl Gauge {
    /// The child with these label values, made at zero if new.
    pub fn with(&self, values: &[&str]) -> GaugeChild {
        GaugeChild(self.0.child(values, GaugeCell::default))
    }

    pub fn set(&self, values: &[&str], v: f64) {
        self.with(values).set(v);
    }

    /// Sets a whole number, such as a count of nodes.
    pub fn set_u64(&self, values: &[&str], v: u64) {
        self.with(values).set_u64(v);
    }

    /// Removes every child, so that values set afresh at scrape time leave no
    /// stale label sets behind. Handles to removed children still work but
    /// are no longer written out.
    pub fn reset(&self) {
        self.0
            .children
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

impl GaugeChild {
    pub fn set(&self, v: f64) {
        self.0.0.store(v.to_bits(), Relaxed);
    }

    /// Sets a whole number, such as a count of nodes.
    pub fn set_u64(&self, v: u64) {
        self.set(v as f64);
    }

    pub fn add(&self, v: f64) {
        add_f64(&self.0.0, v);
    }

    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.0.load(Relaxed))
    }
}

/// A family of histograms over fixed bucket bounds in seconds.
#[derive(Clone)]
pub struct Histogram {
    family: Arc<Family<HistogramCell>>,
    bounds: Arc<[f64]>,
}

/// One histogram of a [`Histogram`] family.
#[derive(Clone)]
pub struct HistogramChild(Arc<HistogramCell>);

struct HistogramCell {
    bounds: Arc<[f64]>,
    /// Observations per bucket, not cumulated; the last is `+Inf`.
    counts: Box<[AtomicU64]>,
    /// The `f64` sum as bits.
    sum: AtomicU64,
}

impl Histogram {
    /// The child with these label values, made empty if new.
    pub fn with(&self, values: &[&str]) -> HistogramChild {
        let make = || HistogramCell {
            bounds: self.bounds.clone(),
            counts: (0..=self.bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
        };
        HistogramChild(self.family.child(values, make))
    }

    /// Observes a value in seconds.
    pub fn observe(&self, values: &[&str], v: f64) {
        self.with(values).observe(v);
    }
}

impl HistogramChild {
    /// Observes a value in seconds.
    pub fn observe(&self, v: f64) {
        // The first bound with `v <= bound`; NaN lands only in `+Inf`.
        let i = self.0.bounds.partition_point(|&b| b < v || v.is_nan());
        self.0.counts[i].fetch_add(1, Relaxed);
        add_f64(&self.0.sum, v);
    }

    pub fn observe_duration(&self, d: Duration) {
        self.observe(d.as_secs_f64());
    }

    /// How many values were observed.
    pub fn count(&self) -> u64 {
        self.0.counts.iter().map(|c| c.load(Relaxed)).sum()
    }

    /// The sum of the values observed.
    pub fn sum(&self) -> f64 {
        f64::from_bits(self.0.sum.load(Relaxed))
    }
}

/// The value kept for one child, and how its samples are written.
trait Cell: Send + Sync + 'static {
    const KIND: &str;
    fn write(&self, out: &mut String, name: &str, labels: Labels);
}

impl Cell for AtomicU64 {
    const KIND: &str = "counter";
    fn write(&self, out: &mut String, name: &str, labels: Labels) {
        sample(out, name, "", labels, None);
        let _ = writeln!(out, " {}", self.load(Relaxed));
    }
}

impl Cell for GaugeCell {
    const KIND: &str = "gauge";
    fn write(&self, out: &mut String, name: &str, labels: Labels) {
        sample(out, name, "", labels, None);
        let _ = writeln!(out, " {}", Float(f64::from_bits(self.0.load(Relaxed))));
    }
}

impl Cell for HistogramCell {
    const KIND: &str = "histogram";
    fn write(&self, out: &mut String, name: &str, labels: Labels) {
        let mut total = 0;
        let mut le = String::new();
        for (i, count) in self.counts.iter().enumerate() {
            total += count.load(Relaxed);
            le.clear();
            let _ = write!(
                le,
                "{}",
                Float(self.bounds.get(i).copied().unwrap_or(f64::INFINITY))
            );
            sample(out, name, "_bucket", labels, Some(&le));
            let _ = writeln!(out, " {total}");
        }
        sample(out, name, "_sum", labels, None);
        let _ = writeln!(out, " {}", Float(f64::from_bits(self.sum.load(Relaxed))));
        // The count is the `+Inf` bucket, so the two always agree.
        sample(out, name, "_count", labels, None);
        let _ = writeln!(out, " {total}");
    }
}

/// A family as the registry sees it: something with a name that writes itself.
trait Render: Send + Sync {
    fn name(&self) -> &str;
    fn render(&self, out: &mut String);
}

/// Children kept sorted by label values, so that lookups need no allocation
/// and output comes out ordered.
type Children<C> = Vec<(Box<[String]>, Arc<C>)>;

/// What every kind of family shares: its names and its children.
struct Family<C> {
    name: String,
    help: String,
    labels: Vec<String>,
    children: RwLock<Children<C>>,
}

impl<C> Family<C> {
    fn new(name: &str, help: &str, labels: &[&str], reserved: &[&str]) -> Family<C> {
        assert!(
            valid_name(name, true),
            "metric name `{name}` is not valid: it must match [a-zA-Z_:][a-zA-Z0-9_:]*"
        );
        for (i, &label) in labels.iter().enumerate() {
            assert!(
                valid_name(label, false),
                "metric `{name}`: label name `{label}` is not valid: it must match [a-zA-Z_][a-zA-Z0-9_]*"
            );
            assert!(
                !label.starts_with("__"),
                "metric `{name}`: label name `{label}` is reserved (it starts with `__`)"
            );
            assert!(
                !reserved.contains(&label),
                "metric `{name}`: label name `{label}` is reserved for this type"
            );
            assert!(
                !labels[..i].contains(&label),
                "metric `{name}`: label name `{label}` is given twice"
            );
        }
        Family {
            name: name.to_owned(),
            help: help.to_owned(),
            labels: labels.iter().map(|&l| l.to_owned()).collect(),
            children: RwLock::new(Vec::new()),
        }
    }

    /// The child with these label values, made by `make` if new. One that
    /// exists costs a read lock and a binary search.
    fn child(&self, values: &[&str], make: impl FnOnce() -> C) -> Arc<C> {
        assert!(
            values.len() == self.labels.len(),
            "metric `{}` has labels {:?} but was given values {values:?}",
            self.name,
            self.labels
        );
        let find = |children: &Children<C>| {
            children.binary_search_by(|(key, _)| {
                key.iter().map(String::as_str).cmp(values.iter().copied())
            })
        };
        {
            let children = self.children.read().unwrap_or_else(PoisonError::into_inner);
            if let Ok(i) = find(&children) {
                return children[i].1.clone();
            }
        }
        let mut children = self
            .children
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        match find(&children) {
            Ok(i) => children[i].1.clone(),
            Err(i) => {
                let child = Arc::new(make());
                let key = values.iter().map(|&v| v.to_owned()).collect();
                children.insert(i, (key, child.clone()));
                child
            }
        }
    }
}

impl<C: Cell> Render for Family<C> {
    fn name(&self) -> &str {
        &self.name
    }

    fn render(&self, out: &mut String) {
        let _ = write!(out, "# HELP {} ", self.name);
        escape(out, &self.help, false);
        let _ = writeln!(out, "\n# TYPE {} {}", self.name, C::KIND);
        let children = self.children.read().unwrap_or_else(PoisonError::into_inner);
        for (values, child) in children.iter() {
            child.write(out, &self.name, (&self.labels, values));
        }
    }
}

/// Label names and values of one child.
type Labels<'a> = (&'a [String], &'a [String]);

/// Writes `name{labels}` up to the value; `le` comes last if given.
fn sample(out: &mut String, name: &str, suffix: &str, (names, values): Labels, le: Option<&str>) {
    out.push_str(name);
    out.push_str(suffix);
    let pairs = names
        .iter()
        .zip(values)
        .map(|(n, v)| (n.as_str(), v.as_str()));
    for (i, (n, v)) in pairs.chain(le.map(|v| ("le", v))).enumerate() {
        out.push(if i == 0 { '{' } else { ',' });
        out.push_str(n);
        out.push_str("=\"");
        escape(out, v, true);
        out.push('"');
    }
    if !names.is_empty() || le.is_some() {
        out.push('}');
    }
}

/// Escapes a backslash and a newline, and a double quote in a label value.
fn escape(out: &mut String, text: &str, quote: bool) {
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quote => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

/// A float as Prometheus reads it: `+Inf`, `-Inf`, `NaN`, whole numbers
/// without `.0`, and an exponent only for the very large or small.
struct Float(f64);

impl std::fmt::Display for Float {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let v = self.0;
        if v.is_nan() {
            f.write_str("NaN")
        } else if v.is_infinite() {
            f.write_str(if v > 0.0 { "+Inf" } else { "-Inf" })
        } else if v != 0.0 && (v.abs() >= 1e21 || v.abs() < 1e-6) {
            write!(f, "{v:e}")
        } else {
            write!(f, "{v}")
        }
    }
}

fn add_f64(cell: &AtomicU64, v: f64) {
    let _ = cell.fetch_update(Relaxed, Relaxed, |bits| {
        Some((f64::from_bits(bits) + v).to_bits())
    });
}

/// Whether `name` matches `[a-zA-Z_:][a-zA-Z0-9_:]*`, or without the colons.
fn valid_name(name: &str, colons: bool) -> bool {
    let ok = |c: char, first: bool| {
        c.is_ascii_alphabetic()
            || c == '_'
            || (colons && c == ':')
            || (!first && c.is_ascii_digit())
    };
    let mut chars = name.chars();
    chars.next().is_some_and(|c| ok(c, true)) && chars.all(|c| ok(c, false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    #[test]
    fn handles_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Registry>();
        check::<(Counter, CounterChild, Gauge, GaugeChild)>();
        check::<(Histogram, HistogramChild)>();
    }

    #[test]
    fn counters_render_sorted_by_label_values() {
        let r = Registry::new();
        let calls = r.counter(
            "berth_driver_calls_total",
            "Driver calls.",
            &["provider", "call", "outcome"],
        );
        let starts = r.counter("berth_starts_total", "Starts.", &[]);
        calls.inc(&["p1", "create", "ok"]);
        calls.inc_by(&["p0", "delete", "error"], 2);
        let child = calls.with(&["p0", "create", "ok"]);
        child.inc();
        child.inc();
        calls.inc(&["p0", "create", "ok"]);
        assert_eq!(child.get(), 3);
        assert_eq!(
            r.render(),
            "# HELP berth_driver_calls_total Driver calls.\n\
             # TYPE berth_driver_calls_total counter\n\
             berth_driver_calls_total{provider=\"p0\",call=\"create\",outcome=\"ok\"} 3\n\
             berth_driver_calls_total{provider=\"p0\",call=\"delete\",outcome=\"error\"} 2\n\
             berth_driver_calls_total{provider=\"p1\",call=\"create\",outcome=\"ok\"} 1\n\
             # HELP berth_starts_total Starts.\n\
             # TYPE berth_starts_total counter\n\
             berth_starts_total 0\n"
        );
        starts.inc(&[]);
        assert!(r.render().ends_with("berth_starts_total 1\n"));
    }

    #[test]
    fn gauges_render_floats_the_prometheus_way() {
        let r = Registry::new();
        let g = r.gauge("g", "A gauge.", &["k"]);
        g.set(&["a"], 1.5);
        g.set_u64(&["b"], 42);
        g.set(&["c"], f64::INFINITY);
        g.set(&["d"], f64::NEG_INFINITY);
        g.set(&["e"], f64::NAN);
        g.set(&["f"], -0.25);
        g.with(&["g"]).add(2.0);
        g.with(&["g"]).add(0.5);
        let h = g.with(&["h"]);
        h.add(2.0);
        h.add(-1.0);
        g.set(&["i"], 1e21);
        g.set(&["j"], 1.5e-7);
        g.set(&["k"], 0.0005);
        assert_eq!(h.get(), 1.0);
        assert_eq!(
            r.render(),
            "# HELP g A gauge.\n\
             # TYPE g gauge\n\
             g{k=\"a\"} 1.5\n\
             g{k=\"b\"} 42\n\
             g{k=\"c\"} +Inf\n\
             g{k=\"d\"} -Inf\n\
             g{k=\"e\"} NaN\n\
             g{k=\"f\"} -0.25\n\
             g{k=\"g\"} 2.5\n\
             g{k=\"h\"} 1\n\
             g{k=\"i\"} 1e21\n\
             g{k=\"j\"} 1.5e-7\n\
             g{k=\"k\"} 0.0005\n"
        );
    }

    #[test]
    fn histograms_cumulate_buckets_up_to_inf() {
        let r = Registry::new();
        let h = r.histogram("lat_seconds", "Latency.", &["call"], &[0.1, 0.5, 1.0]);
        for v in [0.25, 0.5, 0.75, 3.0] {
            h.observe(&["create"], v);
        }
        let child = h.with(&["delete"]);
        child.observe_duration(Duration::from_millis(50));
        child.observe(f64::NAN);
        assert_eq!(child.count(), 2);
        assert!(child.sum().is_nan());
        assert_eq!(
            r.render(),
            "# HELP lat_seconds Latency.\n\
             # TYPE lat_seconds histogram\n\
             lat_seconds_bucket{call=\"create\",le=\"0.1\"} 0\n\
             lat_seconds_bucket{call=\"create\",le=\"0.5\"} 2\n\
             lat_seconds_bucket{call=\"create\",le=\"1\"} 3\n\
             lat_seconds_bucket{call=\"create\",le=\"+Inf\"} 4\n\
             lat_seconds_sum{call=\"create\"} 4.5\n\
             lat_seconds_count{call=\"create\"} 4\n\
             lat_seconds_bucket{call=\"delete\",le=\"0.1\"} 1\n\
             lat_seconds_bucket{call=\"delete\",le=\"0.5\"} 1\n\
             lat_seconds_bucket{call=\"delete\",le=\"1\"} 1\n\
             lat_seconds_bucket{call=\"delete\",le=\"+Inf\"} 2\n\
             lat_seconds_sum{call=\"delete\"} NaN\n\
             lat_seconds_count{call=\"delete\"} 2\n"
        );
    }

    #[test]
    fn unlabelled_histogram_and_families_in_registration_order() {
        let r = Registry::new();
        let h = r.histogram("h", "H.", &[], &[1.0]);
        let _empty = r.counter("c_total", "No children yet.", &["x"]);
        let g = r.gauge("g", "G.", &[]);
        h.observe(&[], 2.0);
        g.set(&[], 7.0);
        assert_eq!(
            r.render(),
            "# HELP h H.\n\
             # TYPE h histogram\n\
             h_bucket{le=\"1\"} 0\n\
             h_bucket{le=\"+Inf\"} 1\n\
             h_sum 2\n\
             h_count 1\n\
             # HELP c_total No children yet.\n\
             # TYPE c_total counter\n\
             # HELP g G.\n\
             # TYPE g gauge\n\
             g 7\n"
        );
    }

    #[test]
    fn default_buckets_register_and_render() {
        let r = Registry::new();
        let h = r.histogram("d", "D.", &[], DEFAULT_BUCKETS);
        h.observe(&[], 0.0005);
        let text = r.render();
        assert!(text.contains("d_bucket{le=\"0.0005\"} 1\n"), "{text}");
        assert!(text.contains("d_bucket{le=\"60\"} 1\n"), "{text}");
    }

    #[test]
    fn label_values_and_help_are_escaped() {
        let r = Registry::new();
        let c = r.counter("e_total", "Back\\slash \"quoted\"\nnext line.", &["v"]);
        c.inc(&["a\\b\"c\nd"]);
        assert_eq!(
            r.render(),
            "# HELP e_total Back\\\\slash \"quoted\"\\nnext line.\n\
             # TYPE e_total counter\n\
             e_total{v=\"a\\\\b\\\"c\\nd\"} 1\n"
        );
    }

    #[test]
    fn concurrent_increments_are_all_counted() {
        let r = Registry::new();
        let c = r.counter("n_total", "N.", &["k"]);
        let h = r.histogram("t", "T.", &["k"], &[0.5]);
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let (c, h) = (c.clone(), h.clone());
                thread::spawn(move || {
                    let child = c.with(&["same"]);
                    for _ in 0..10_000 {
                        child.inc();
                        c.inc(&["same"]);
                        c.inc(&[if i % 2 == 0 { "even" } else { "odd" }]);
                        h.observe(&["same"], 1.0);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(c.with(&["same"]).get(), 160_000);
        assert_eq!(c.with(&["even"]).get(), 40_000);
        assert_eq!(c.with(&["odd"]).get(), 40_000);
        assert_eq!(h.with(&["same"]).count(), 80_000);
        assert_eq!(h.with(&["same"]).sum(), 80_000.0);
    }

    #[test]
    fn reset_removes_stale_children() {
        let r = Registry::new();
        let g = r.gauge("nodes", "Nodes.", &["state"]);
        g.set_u64(&["ready"], 3);
        g.set_u64(&["booting"], 1);
        let stale = g.with(&["booting"]);
        g.reset();
        g.set_u64(&["ready"], 4);
        stale.set(9.0);
        assert_eq!(
            r.render(),
            "# HELP nodes Nodes.\n# TYPE nodes gauge\nnodes{state=\"ready\"} 4\n"
        );
        assert_eq!(g.with(&["booting"]).get(), 0.0);
    }

    #[test]
    fn names_are_checked() {
        for good in ["a", "_a", "a:b_c9", ":x"] {
            assert!(valid_name(good, true), "{good}");
        }
        for bad in ["", "9a", "a-b", "a b", "é"] {
            assert!(!valid_name(bad, true), "{bad}");
        }
        assert!(!valid_name("a:b", false));
    }

    #[test]
    #[should_panic(expected = "metric name `1bad` is not valid")]
    fn bad_metric_name_panics() {
        Registry::new().counter("1bad", "", &[]);
    }

    #[test]
    #[should_panic(expected = "label name `a-b` is not valid")]
    fn bad_label_name_panics() {
        Registry::new().counter("ok", "", &["a-b"]);
    }

    #[test]
    #[should_panic(expected = "label name `__name` is reserved")]
    fn double_underscore_label_panics() {
        Registry::new().gauge("ok", "", &["__name"]);
    }

    #[test]
    #[should_panic(expected = "label name `le` is reserved for this type")]
    fn le_label_on_histogram_panics() {
        Registry::new().histogram("ok", "", &["le"], &[1.0]);
    }

    #[test]
    #[should_panic(expected = "label name `a` is given twice")]
    fn repeated_label_panics() {
        Registry::new().counter("ok", "", &["a", "a"]);
    }

    #[test]
    #[should_panic(expected = "metric `dup` is registered twice")]
    fn duplicate_family_panics() {
        let r = Registry::new();
        r.counter("dup", "", &[]);
        r.gauge("dup", "", &[]);
    }

    #[test]
    #[should_panic(expected = "bucket bounds [1.0, 1.0] must be finite and strictly increasing")]
    fn unsorted_buckets_panic() {
        Registry::new().histogram("h", "", &[], &[1.0, 1.0]);
    }

    #[test]
    #[should_panic(expected = "bucket bounds [1.0, inf] must be finite")]
    fn infinite_bucket_panics() {
        Registry::new().histogram("h", "", &[], &[1.0, f64::INFINITY]);
    }

    #[test]
    #[should_panic(expected = "has labels [\"a\", \"b\"] but was given values [\"x\"]")]
    fn wrong_label_count_panics() {
        Registry::new().counter("c", "", &["a", "b"]).inc(&["x"]);
    }
}
