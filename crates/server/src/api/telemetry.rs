//! What the service measures: Prometheus metrics for `/metrics`, and each
//! provider's recent driver calls for `/v1/providers`. Counters and
//! histograms are fed as things happen (it is the runtime's [`Observer`]);
//! gauges of the pool's state are computed from the pool at each scrape.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use super::types::{self, rfc3339};
use super::views;
use crate::metrics::{Counter, DEFAULT_BUCKETS, Gauge, Histogram, Registry};
use crate::runtime::{CallKind, Health, Observer, Providers, outcome_name, trap_name};
use berth_config::{Config, ProviderIx};
use berth_core::pool::{NodeState, Notice, Packing, Pool, Request, RequestState};
use berth_plugin::CallError;

/// How many recent calls per provider `/v1/providers` summarises.
const RECENT: usize = 200;
/// How many of the latest errors it lists.
const LAST_ERRORS: usize = 5;

pub struct Telemetry {
    registry: Registry,
    calls: Counter,
    call_seconds: Histogram,
    traps: Counter,
    fulfilment: Histogram,
    commit_seconds: Histogram,
    quota_pauses: Counter,
    rate_limit_holds: Counter,
    capacity_pauses: Counter,
    leaks_deleted: Counter,
    not_adopted: Counter,
    refused: Counter,
    leases_expired: Counter,
    requests_failed: Counter,
    nodes: Gauge,
    pending: Gauge,
    oldest_pending: Gauge,
    instances: Gauge,
    vcpus: Gauge,
    ram: Gauge,
    price: Gauge,
    provider_started: Gauge,
    lists_believed: Gauge,
    last_list_age: Gauge,
    nodes_missing: Gauge,
    log_dropped: Counter,
    outbound_denied: Counter,
    http_open: Gauge,
    http_closed: Counter,
    recent: HashMap<String, Mutex<Recent>>,
}

/// One provider's latest calls.
#[derive(Default)]
struct Recent {
    /// Duration in milliseconds, and whether it failed.
    calls: VecDeque<(f64, bool)>,
    errors: VecDeque<types::CallError>,
}

impl Telemetry {
    pub fn new(config: &Config) -> Telemetry {
        let r = Registry::new();
        let calls = r.counter(
            "berth_driver_calls_total",
            "Driver calls by provider, call and outcome.",
            &["provider", "call", "outcome"],
        );
        let call_seconds = r.histogram(
            "berth_driver_call_seconds",
            "Driver call duration by provider and call.",
            &["provider", "call"],
            DEFAULT_BUCKETS,
        );
        let traps = r.counter(
            "berth_sandbox_traps_total",
            "Driver instances discarded after a trap, by provider and kind.",
            &["provider", "kind"],
        );
        let fulfilment = r.histogram(
            "berth_request_fulfilment_seconds",
            "Time from a request's creation to its nodes being handed out.",
            &[],
            DEFAULT_BUCKETS,
        );
        let commit_seconds = r.histogram(
            "berth_store_commit_seconds",
            "Time the pool's store took to commit one batch of changes.",
            &[],
            &[
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
            ],
        );
        let quota_pauses = r.counter(
            "berth_quota_pauses_total",
            "Times creates were paused on a provider after quota-exceeded.",
            &["provider"],
        );
        let rate_limit_holds = r.counter(
            "berth_rate_limit_holds_total",
            "Times every call to a provider was held after rate-limited.",
            &["provider"],
        );
        let capacity_pauses = r.counter(
            "berth_capacity_pauses_total",
            "Times an instance type was paused on a provider for lack of capacity.",
            &["provider"],
        );
        let leaks_deleted = r.counter(
            "berth_leaked_instances_deleted_total",
            "Instances with this pool's id that no node accounted for, deleted.",
            &["provider"],
        );
        let not_adopted = r.counter(
            "berth_adoptions_refused_total",
            "Instances with this pool's tags not adopted because the provider's limits were full.",
            &["provider"],
        );
        let refused = r.counter(
            "berth_driver_answers_refused_total",
            "Instances a driver answered that failed berth's checks, by provider and rule (id, duplicate, type, tags, address, connection).",
            &["provider", "rule"],
        );
        let leases_expired = r.counter(
            "berth_leases_expired_total",
            "Requestors whose lease expired with requests or nodes to take back.",
            &[],
        );
        let requests_failed =
            r.counter("berth_requests_failed_total", "Requests that failed.", &[]);
        let nodes = r.gauge(
            "berth_nodes",
            "Nodes by label, provider and state.",
            &["label", "provider", "state"],
        );
        let pending = r.gauge("berth_requests_pending", "Requests waiting for nodes.", &[]);
        let oldest_pending = r.gauge(
            "berth_requests_pending_oldest_seconds",
            "Age of the oldest pending request.",
            &[],
        );
        let instances = r.gauge(
            "berth_instances",
            "Cloud instances held (creating to deleting), by provider, in use or not.",
            &["provider", "in_use"],
        );
        let vcpus = r.gauge(
            "berth_vcpus",
            "vCPUs of the instances held, by provider, in use or not.",
            &["provider", "in_use"],
        );
        let ram = r.gauge(
            "berth_memory_bytes",
            "Memory of the instances held, by provider, in use or not.",
            &["provider", "in_use"],
        );
        let price = r.gauge(
            "berth_hourly_price",
            "Hourly price of the instances held, by provider, in use or not.",
            &["provider", "in_use"],
        );
        let provider_started = r.gauge(
            "berth_provider_started",
            "1 once a provider's driver has loaded and started, 0 while it starts or after its start failed.",
            &["provider"],
        );
        let lists_believed = r.gauge(
            "berth_provider_lists_believed",
            "1 while a provider's last list was believed, 0 while its lists fail or show none of the instances berth holds there.",
            &["provider"],
        );
        let last_list_age = r.gauge(
            "berth_provider_last_list_age_seconds",
            "Time since the start of a provider's last believed list (absent before the first).",
            &["provider"],
        );
        let nodes_missing = r.gauge(
            "berth_nodes_missing",
            "Nodes whose instance the provider's lists stopped showing (suspected, or confirmed while in use).",
            &["provider"],
        );
        let log_dropped = r.counter(
            "berth_driver_log_dropped_total",
            "Driver log records (log import and stdio lines) dropped over the provider's log-rate.",
            &["provider"],
        );
        let http_open = r.gauge(
            "berth_http_connections",
            "Connections to the API open now.",
            &[],
        );
        let http_closed = r.counter(
            "berth_http_connections_closed_total",
            "API connections berth closed itself, by reason (header_timeout, body_timeout, evicted: idle, closed to make room at max-connections; refused: new at the cap, without a request or with every connection busy).",
            &["reason"],
        );
        let outbound_denied = r.counter(
            "berth_sandbox_denied_total",
            "Outbound requests and probes of a driver that the sandbox refused.",
            &["provider"],
        );
        let recent = config
            .providers
            .iter()
            .map(|p| (p.name.clone(), Mutex::new(Recent::default())))
            .collect();
        Telemetry {
            registry: r,
            calls,
            call_seconds,
            traps,
            fulfilment,
            commit_seconds,
            quota_pauses,
            rate_limit_holds,
            capacity_pauses,
            leaks_deleted,
            not_adopted,
            refused,
            leases_expired,
            requests_failed,
            nodes,
            pending,
            oldest_pending,
            instances,
            vcpus,
            ram,
            price,
            provider_started,
            lists_believed,
            last_list_age,
            nodes_missing,
            log_dropped,
            outbound_denied,
            http_open,
            http_closed,
            recent,
        }
    }

    /// The metrics text, with the pool's gauges as of now. Runs on the
    /// pool's task.
    /// How many API connections are open.
    pub fn http_connections_open(&self, n: usize) {
        self.http_open.set_u64(&[], n as u64);
    }

    /// An API connection berth closed, and why.
    pub fn http_connection_closed(&self, reason: &str) {
        self.http_closed.inc(&[reason]);
    }

    pub fn render(&self, pool: &Pool, providers: &Providers) -> String {
        let config = pool.config();
        for (i, p) in config.providers.iter().enumerate() {
            let ix = ProviderIx(i as u16);
            let up = providers.health(ix) == Health::Up;
            self.provider_started
                .with(&[&p.name])
                .set(if up { 1.0 } else { 0.0 });
            let s = pool.provider_status(ix);
            let believed = s.list == berth_core::pool::ListHealth::Ok;
            self.lists_believed
                .with(&[&p.name])
                .set(if believed { 1.0 } else { 0.0 });
            if let Some(t) = s.last_listed {
                self.last_list_age
                    .with(&[&p.name])
                    .set(pool.last_tick().since(t).as_secs_f64());
            }
            self.nodes_missing.with(&[&p.name]).set(s.missing as f64);
        }
        for (name, provider) in providers.started() {
            let catch_up = |c: &Counter, total: u64| {
                let child = c.with(&[&name]);
                child.inc_by(total.saturating_sub(child.get()));
            };
            catch_up(&self.log_dropped, provider.log_dropped());
            catch_up(&self.outbound_denied, provider.denied_requests());
        }
        self.nodes.reset();
        for ((label, provider, state), n) in views::node_counts(pool) {
            self.nodes
                .with(&[&config[label].name, &config[provider].name, state])
                .set(n as f64);
        }
        let now = pool.last_tick();
        let pending: Vec<&Request> = pool
            .requests()
            .filter(|r| r.state == RequestState::Pending)
            .collect();
        self.pending.with(&[]).set(pending.len() as f64);
        let oldest = pending.iter().map(|r| r.created).min();
        self.oldest_pending
            .with(&[])
            .set(oldest.map_or(0.0, |t| now.since(t).as_secs_f64()));

        // Instances are the nodes that hold one: slot nodes share their
        // backing node's, so only plain and backing nodes count.
        let mut held: HashMap<(usize, bool), (f64, f64, f64, f64)> = HashMap::new();
        for n in pool.nodes() {
            if !n.state.holds_instance() || matches!(n.packing, Packing::Slot { .. }) {
                continue;
            }
            let in_use = match &n.packing {
                Packing::Backing { slots, .. } => slots.iter().any(|s| {
                    s.and_then(|s| pool.node(s))
                        .is_some_and(|s| matches!(s.state, NodeState::InUse { .. }))
                }),
                _ => matches!(n.state, NodeState::InUse { .. }),
            };
            let e = held.entry((n.provider.0 as usize, in_use)).or_default();
            e.0 += 1.0;
            e.1 += f64::from(n.resources.vcpus);
            e.2 += n.resources.ram_mib as f64 * 1024.0 * 1024.0;
            e.3 += n.price;
        }
        for (i, p) in config.providers.iter().enumerate() {
            for in_use in [false, true] {
                let (count, cpus, bytes, price) =
                    held.get(&(i, in_use)).copied().unwrap_or_default();
                let labels = [p.name.as_str(), if in_use { "true" } else { "false" }];
                self.instances.with(&labels).set(count);
                self.vcpus.with(&labels).set(cpus);
                self.ram.with(&labels).set(bytes);
                self.price.with(&labels).set(price);
            }
        }
        self.registry.render()
    }

    /// A summary of `provider`'s recent calls.
    pub fn recent_calls(&self, provider: &str) -> types::CallStats {
        let Some(r) = self.recent.get(provider) else {
            return types::CallStats::default();
        };
        let r = r.lock().unwrap_or_else(|e| e.into_inner());
        let mut took: Vec<f64> = r.calls.iter().map(|c| c.0).collect();
        took.sort_by(f64::total_cmp);
        let at = |q: f64| -> Option<f64> {
            if took.is_empty() {
                return None;
            }
            let i = ((took.len() - 1) as f64 * q).round() as usize;
            Some((took[i] * 1000.0).round() / 1000.0)
        };
        types::CallStats {
            recent: took.len(),
            errors: r.calls.iter().filter(|c| c.1).count(),
            p50_ms: at(0.5),
            p99_ms: at(0.99),
            last_errors: r.errors.iter().rev().cloned().collect(),
        }
    }
}

impl Observer for Telemetry {
    fn call(&self, provider: &str, call: CallKind, result: Result<(), &CallError>, took: Duration) {
        let outcome = outcome_name(result);
        self.calls.with(&[provider, call.as_str(), outcome]).inc();
        self.call_seconds
            .with(&[provider, call.as_str()])
            .observe(took.as_secs_f64());
        if let Err(e) = result
            && let Some(t) = e.kind.trap()
        {
            self.traps.with(&[provider, trap_name(t)]).inc();
        }
        if let Some(r) = self.recent.get(provider) {
            let mut r = r.lock().unwrap_or_else(|e| e.into_inner());
            if r.calls.len() == RECENT {
                r.calls.pop_front();
            }
            r.calls
                .push_back((took.as_secs_f64() * 1e3, result.is_err()));
            if let Err(e) = result {
                if r.errors.len() == LAST_ERRORS {
                    r.errors.pop_front();
                }
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64);
                r.errors.push_back(types::CallError {
                    at: rfc3339(now),
                    call: call.as_str().to_owned(),
                    error: e.kind.to_string(),
                });
            }
        }
    }

    fn notice(&self, config: &Config, notice: &Notice) {
        let name = |p: berth_config::ProviderIx| config[p].name.as_str();
        match notice {
            Notice::QuotaPaused { provider, .. } => {
                self.quota_pauses.with(&[name(*provider)]).inc()
            }
            Notice::RateLimited { provider, .. } => {
                self.rate_limit_holds.with(&[name(*provider)]).inc()
            }
            Notice::CapacityPaused { provider, .. } => {
                self.capacity_pauses.with(&[name(*provider)]).inc()
            }
            Notice::LeakDeleted { provider, .. } => {
                self.leaks_deleted.with(&[name(*provider)]).inc()
            }
            Notice::NotAdopted { provider, .. } => self.not_adopted.with(&[name(*provider)]).inc(),
            Notice::LeaseExpired { .. } => self.leases_expired.with(&[]).inc(),
            Notice::RequestFailed { .. } => self.requests_failed.with(&[]).inc(),
            Notice::Foreign { .. }
            | Notice::Adopted { .. }
            | Notice::Vanished { .. }
            | Notice::Missing { .. }
            | Notice::Reappeared { .. }
            | Notice::LostInUse { .. }
            | Notice::Revived { .. }
            | Notice::ListFailing { .. }
            | Notice::ListSuspect { .. }
            | Notice::ListRecovered { .. } => {}
        }
    }

    fn refused(&self, provider: &str, refused: &[berth_core::driver::check::BadAnswer]) {
        for r in refused {
            self.refused.with(&[provider, r.rule]).inc();
        }
    }

    fn fulfilled(&self, _request: &Request, latency: Duration) {
        self.fulfilment.with(&[]).observe(latency.as_secs_f64());
    }

    fn committed(&self, took: Duration) {
        self.commit_seconds.with(&[]).observe(took.as_secs_f64());
    }
}
