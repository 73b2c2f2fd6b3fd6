//! What the service measures: Prometheus metrics for `/metrics`, and each
//! provider's recent driver calls for `/v1/providers`. Counters and
//! histograms are fed as things happen (it is the runtime's [`Observer`]);
//! gauges of the pool's state are computed from the pool at each scrape.
//!
//! The metrics are `prometheus-client`'s, registered here by the names and
//! help texts that [`crate::metrics`] says how to write: a counter's name
//! without `_total`, a help text without its final full stop.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::metrics::{self, Gauge, Histograms, register};
use crate::runtime::{Health, Observer, Providers, outcome_name};
use berth_config::{Config, LabelIx, ProviderIx};
use berth_core::driver::Call;
use berth_core::pool::{NodeState, Notice, Packing, Pool, Request, RequestState};
use berth_plugin::CallError;
use berth_types::{self as types, rfc3339};

/// How many recent calls per provider `/v1/providers` summarises.
const RECENT: usize = 200;
/// How many of the latest errors it lists.
const LAST_ERRORS: usize = 5;

// Label sets: each field is a label, its name the label's name, written out
// in this order.

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallOutcome {
    provider: String,
    call: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderCall {
    provider: String,
    call: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProbeOutcome {
    provider: String,
    check: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderCheck {
    provider: String,
    check: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TrapKind {
    provider: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByProvider {
    provider: String,
}

/// What became of something asked for as a whole.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByOutcome {
    outcome: &'static str,
}

/// One credential of a provider, and the outcome of its exchanges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByCredential {
    provider: String,
    host: String,
    outcome: &'static str,
}

/// A provider's driver reloads by outcome (`switched`, `failed`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByReload {
    provider: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Rule {
    provider: String,
    rule: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeKey {
    label: String,
    provider: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Held {
    provider: String,
    in_use: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Reason {
    reason: &'static str,
}

impl ByProvider {
    fn new(name: &str) -> ByProvider {
        ByProvider {
            provider: name.to_owned(),
        }
    }
}

pub struct Telemetry {
    calls: Family<CallOutcome, Counter>,
    call_seconds: Histograms<ProviderCall>,
    calls_in_flight: Family<ByProvider, Gauge>,
    traps: Family<TrapKind, Counter>,
    probes: Family<ProbeOutcome, Counter>,
    probe_seconds: Histograms<ProviderCheck>,
    fulfilment: Histogram,
    commit_seconds: Histogram,
    heartbeat_seconds: Histogram,
    quota_pauses: Family<ByProvider, Counter>,
    rate_limit_holds: Family<ByProvider, Counter>,
    capacity_pauses: Family<ByProvider, Counter>,
    leaks_deleted: Family<ByProvider, Counter>,
    not_adopted: Family<ByProvider, Counter>,
    refused: Family<Rule, Counter>,
    leases_expired: Counter,
    requests_failed: Counter,
    requests_inboxed: Counter,
    requests_taken_in: Counter,
    nodes: Family<NodeKey, Gauge>,
    pending: Gauge,
    oldest_pending: Gauge,
    instances: Family<Held, Gauge>,
    vcpus: Family<Held, Gauge>,
    ram: Family<Held, Gauge>,
    price: Family<Held, Gauge>,
    provider_started: Family<ByProvider, Gauge>,
    lists_believed: Family<ByProvider, Gauge>,
    last_list_age: Family<ByProvider, Gauge>,
    nodes_missing: Family<ByProvider, Gauge>,
    quarantined: Family<ByProvider, Gauge>,
    pool_held: Gauge,
    log_dropped: Family<ByProvider, Counter>,
    log_dropped_bytes: Family<ByProvider, Counter>,
    http_open: Gauge,
    http_closed: Family<Reason, Counter>,
    outbound_denied: Family<ByProvider, Counter>,
    credential_exchanges: Family<ByCredential, Counter>,
    driver_reloads: Family<ByReload, Counter>,
    driver_reload_failing: Family<ByProvider, Gauge>,
    config_reloads: Family<ByOutcome, Counter>,
    /// Holds the metrics above, written out in this order.
    registry: Registry,
    /// Each provider's latest calls, by name: the providers of the config
    /// (a reload may add some). Plain mutex: held only to record or read.
    recent: Mutex<HashMap<String, Recent>>,
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
        let mut registry = Registry::default();
        let r = &mut registry;
        let recent = Mutex::new(
            (config.providers.iter())
                .map(|p| (p.name.clone(), Recent::default()))
                .collect(),
        );
        let telemetry = Telemetry {
            calls: register(
                r,
                "berth_driver_calls",
                "Driver calls by provider, call and outcome",
                Family::default(),
            ),
            call_seconds: register(
                r,
                "berth_driver_call_seconds",
                "Driver call duration by provider and call",
                Family::new_with_constructor(metrics::latency),
            ),
            calls_in_flight: register(
                r,
                "berth_driver_calls_in_flight",
                "Driver calls begun and not yet ended, by provider: those this process decided, counted from their commit, and those it carries out for the pool's holder",
                Family::default(),
            ),
            traps: register(
                r,
                "berth_sandbox_traps",
                "Driver instances discarded after a trap, by provider and kind",
                Family::default(),
            ),
            probes: register(
                r,
                "berth_probes",
                "Readiness probes of running instances by provider, check (tcp, ssh) and outcome (ready, not_ready)",
                Family::default(),
            ),
            probe_seconds: register(
                r,
                "berth_probe_seconds",
                "Readiness probe duration by provider and check",
                Family::new_with_constructor(metrics::latency),
            ),
            fulfilment: register(
                r,
                "berth_request_fulfilment_seconds",
                "Time from a request's creation to its nodes being handed out",
                metrics::latency(),
            ),
            commit_seconds: register(
                r,
                "berth_store_commit_seconds",
                "Time the pool's store took to commit one batch of changes",
                Histogram::new([
                    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                    1.0,
                ]),
            ),
            heartbeat_seconds: register(
                r,
                "berth_lease_heartbeat_seconds",
                "Time one heartbeat of the providers' leases took (PostgreSQL store)",
                Histogram::new([
                    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                    1.0,
                ]),
            ),
            quota_pauses: register(
                r,
                "berth_quota_pauses",
                "Times creates were paused on a provider after quota-exceeded",
                Family::default(),
            ),
            rate_limit_holds: register(
                r,
                "berth_rate_limit_holds",
                "Times every call to a provider was held after rate-limited",
                Family::default(),
            ),
            capacity_pauses: register(
                r,
                "berth_capacity_pauses",
                "Times an instance type was paused on a provider for lack of capacity",
                Family::default(),
            ),
            leaks_deleted: register(
                r,
                "berth_leaked_instances_deleted",
                "Instances with this pool's id that no node accounted for, deleted",
                Family::default(),
            ),
            not_adopted: register(
                r,
                "berth_adoptions_refused",
                "Instances with this pool's tags not adopted because the provider's limits were full",
                Family::default(),
            ),
            refused: register(
                r,
                "berth_driver_answers_refused",
                "Instances a driver answered that failed berth's checks, by provider and rule (id, duplicate, type, tags, address, connection)",
                Family::default(),
            ),
            leases_expired: register(
                r,
                "berth_leases_expired",
                "Requestors whose lease expired with requests or nodes to take back",
                Counter::default(),
            ),
            requests_failed: register(
                r,
                "berth_requests_failed",
                "Requests that failed",
                Counter::default(),
            ),
            requests_inboxed: register(
                r,
                "berth_requests_inboxed",
                "New requests this process accepted into the store's request inbox while standing by, because the pool's holder did not take them in time",
                Counter::default(),
            ),
            requests_taken_in: register(
                r,
                "berth_requests_taken_in",
                "Requests this process took in from the store's request inbox while holding the pool",
                Counter::default(),
            ),
            nodes: register(
                r,
                "berth_nodes",
                "Nodes by label, provider and state",
                Family::default(),
            ),
            pending: register(
                r,
                "berth_requests_pending",
                "Requests waiting for nodes",
                Gauge::default(),
            ),
            oldest_pending: register(
                r,
                "berth_requests_pending_oldest_seconds",
                "Age of the oldest pending request",
                Gauge::default(),
            ),
            instances: register(
                r,
                "berth_instances",
                "Cloud instances held (creating to deleting), by provider, in use or not",
                Family::default(),
            ),
            vcpus: register(
                r,
                "berth_vcpus",
                "vCPUs of the instances held, by provider, in use or not",
                Family::default(),
            ),
            ram: register(
                r,
                "berth_memory_bytes",
                "Memory of the instances held, by provider, in use or not",
                Family::default(),
            ),
            price: register(
                r,
                "berth_hourly_price",
                "Hourly price of the instances held, by provider, in use or not",
                Family::default(),
            ),
            provider_started: register(
                r,
                "berth_provider_started",
                "1 once a provider's driver has loaded and started, 0 while it starts or after its start failed",
                Family::default(),
            ),
            lists_believed: register(
                r,
                "berth_provider_lists_believed",
                "1 while a provider's last list was believed, 0 while its lists fail or show none of the instances berth holds there",
                Family::default(),
            ),
            last_list_age: register(
                r,
                "berth_provider_last_list_age_seconds",
                "Time since the start of a provider's last believed list (absent before the first)",
                Family::default(),
            ),
            nodes_missing: register(
                r,
                "berth_nodes_missing",
                "Nodes whose instance the provider's lists stopped showing (suspected, or confirmed while in use)",
                Family::default(),
            ),
            pool_held: register(
                r,
                "berth_pool_held",
                "1 while this process holds the pool (decides and commits; the pool's gauges are its), 0 while it stands by or its store is out of reach (its own counters only)",
                Gauge::default(),
            ),
            quarantined: register(
                r,
                "berth_instances_quarantined",
                "Instances with this pool's tags that berth neither hands out nor deletes (the store cannot vouch for them, or their tags say they are in use), by provider: for a person to look at",
                Family::default(),
            ),
            log_dropped: register(
                r,
                "berth_driver_log_dropped",
                "Driver log records (log import and stdio lines) dropped over the provider's log-rate or log-bytes",
                Family::default(),
            ),
            log_dropped_bytes: register(
                r,
                "berth_driver_log_dropped_bytes",
                "Bytes of the driver log records dropped (message and fields, and 128 bytes a record for its line)",
                Family::default(),
            ),
            http_open: register(
                r,
                "berth_http_connections",
                "Connections to the API open now",
                Gauge::default(),
            ),
            http_closed: register(
                r,
                "berth_http_connections_closed",
                "API connections berth closed itself, by reason (header_timeout, body_timeout, evicted: idle, closed to make room at max-connections; refused: new at the cap, without a request or with every connection busy)",
                Family::default(),
            ),
            outbound_denied: register(
                r,
                "berth_sandbox_denied",
                "Outbound requests and probes of a driver that the sandbox refused",
                Family::default(),
            ),
            credential_exchanges: register(
                r,
                "berth_credential_exchanges",
                "Reads and token exchanges of a provider's credentials, by host and outcome \
                 (ok, failed, after_401: made early because a host answered 401, replayed: requests \
                 sent again with the new token)",
                Family::default(),
            ),
            driver_reloads: register(
                r,
                "berth_driver_reloads",
                "Driver reloads of a provider, by outcome (switched: it runs the new file's driver; \
                 failed: the file was refused and it goes on with the driver it ran)",
                Family::default(),
            ),
            driver_reload_failing: register(
                r,
                "berth_driver_reload_failing",
                "1 while a provider's last driver reload failed (see reload_error in /v1/drivers), 0 otherwise",
                Family::default(),
            ),
            config_reloads: register(
                r,
                "berth_config_reloads",
                "Reloads of the config file (SIGHUP, POST /v1/config/reload), by outcome (applied: \
                 berth runs what the file says; refused: nothing changed, and the log says why)",
                Family::default(),
            ),
            registry,
            recent,
        };
        // Each provider's count is there from the start, at 0.
        for p in &config.providers {
            let _ = telemetry
                .calls_in_flight
                .get_or_create(&ByProvider::new(&p.name));
        }
        for outcome in ["applied", "refused"] {
            let _ = telemetry
                .config_reloads
                .get_or_create(&ByOutcome { outcome });
        }
        telemetry
    }

    /// A reload of the config file was applied, or refused.
    pub fn config_reloaded(&self, applied: bool) {
        let outcome = if applied { "applied" } else { "refused" };
        self.config_reloads
            .get_or_create(&ByOutcome { outcome })
            .inc();
    }

    /// How many API connections are open.
    pub fn http_connections_open(&self, n: usize) {
        self.http_open.set(n as f64);
    }

    /// An API connection berth closed, and why.
    /// This process, standing by, accepted a new request into the store's
    /// request inbox.
    pub fn request_inboxed(&self) {
        self.requests_inboxed.inc();
    }

    pub fn http_connection_closed(&self, reason: &'static str) {
        self.http_closed.get_or_create(&Reason { reason }).inc();
    }

    /// The metrics text, with the pool's gauges as of now. Runs on the
    /// pool's task, so that two scrapes do not interleave.
    pub fn render(&self, pool: &Pool, providers: &Providers) -> String {
        let config = pool.config();
        self.process_counters(config, providers);
        for (i, p) in config.providers.iter().enumerate() {
            let ix = ProviderIx(i as u16);
            let labels = ByProvider::new(&p.name);
            let s = pool.provider_status(ix);
            let believed = s.list == berth_core::pool::ListHealth::Ok;
            self.lists_believed
                .get_or_create(&labels)
                .set(if believed { 1.0 } else { 0.0 });
            if let Some(t) = s.last_listed {
                self.last_list_age
                    .get_or_create(&labels)
                    .set(pool.last_tick().since(t).as_secs_f64());
            }
            self.nodes_missing
                .get_or_create(&labels)
                .set(s.missing as f64);
            self.quarantined
                .get_or_create(&labels)
                .set(s.quarantined.len() as f64);
        }
        self.pool_held.set(1.0);
        self.pool_gauges(pool);
        metrics::encode(&self.registry)
    }

    /// The metrics of a process that does not hold the pool (it stands by,
    /// or its store is out of reach): its own counters, histograms and
    /// drivers, and none of the pool's gauges, which are the holder's to
    /// give (a scrape of every process counts the pool once).
    pub fn render_alone(&self, config: &Config, providers: &Providers) -> String {
        self.process_counters(config, providers);
        self.pool_held.set(0.0);
        for family in [
            &self.lists_believed,
            &self.last_list_age,
            &self.nodes_missing,
            &self.quarantined,
        ] {
            family.clear();
        }
        self.nodes.clear();
        for family in [&self.instances, &self.vcpus, &self.ram, &self.price] {
            family.clear();
        }
        self.pending.set(0.0);
        self.oldest_pending.set(0.0);
        metrics::encode(&self.registry)
    }

    /// This process's own drivers: whether each started, and what they
    /// counted since the last scrape.
    fn process_counters(&self, config: &Config, providers: &Providers) {
        for (i, p) in config.providers.iter().enumerate() {
            let up = providers.health(ProviderIx(i as u16)) == Health::Up;
            (self.provider_started)
                .get_or_create(&ByProvider::new(&p.name))
                .set(if up { 1.0 } else { 0.0 });
        }
        for (name, counts) in providers.reload_counts() {
            for (outcome, total) in [("switched", counts.swaps), ("failed", counts.failures)] {
                let labels = ByReload {
                    provider: name.clone(),
                    outcome,
                };
                let child = self.driver_reloads.get_or_create(&labels);
                child.inc_by(total.saturating_sub(child.get()));
            }
            (self.driver_reload_failing)
                .get_or_create(&ByProvider { provider: name })
                .set(if counts.failing { 1.0 } else { 0.0 });
        }
        for (name, started) in providers.started() {
            let labels = ByProvider { provider: name };
            catch_up(&self.log_dropped, &labels, started.log_dropped());
            catch_up(
                &self.log_dropped_bytes,
                &labels,
                started.log_dropped_bytes(),
            );
            catch_up(&self.outbound_denied, &labels, started.denied_requests());
            for c in started.credentials() {
                for (outcome, total) in [
                    ("ok", c.exchanges),
                    ("failed", c.failures),
                    ("after_401", c.refreshed_on_401),
                    ("replayed", c.replays),
                ] {
                    let labels = ByCredential {
                        provider: labels.provider.clone(),
                        host: c.host.clone(),
                        outcome,
                    };
                    let child = self.credential_exchanges.get_or_create(&labels);
                    child.inc_by(total.saturating_sub(child.get()));
                }
            }
        }
    }

    /// Sets the gauges computed from the pool alone.
    fn pool_gauges(&self, pool: &Pool) {
        let config = pool.config();
        // Set afresh, so that no stale label set is left behind.
        self.nodes.clear();
        for ((label, provider, state), n) in node_counts(pool) {
            let labels = NodeKey {
                label: config[label].name.clone(),
                provider: config[provider].name.clone(),
                state,
            };
            self.nodes.get_or_create(&labels).set(n as f64);
        }
        let now = pool.last_tick();
        let pending: Vec<&Request> = pool
            .requests()
            .filter(|r| r.state == RequestState::Pending)
            .collect();
        self.pending.set(pending.len() as f64);
        let oldest = pending.iter().map(|r| r.created).min();
        self.oldest_pending
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
                let labels = Held {
                    provider: p.name.clone(),
                    in_use,
                };
                self.instances.get_or_create(&labels).set(count);
                self.vcpus.get_or_create(&labels).set(cpus);
                self.ram.get_or_create(&labels).set(bytes);
                self.price.get_or_create(&labels).set(price);
            }
        }
    }

    /// A summary of `provider`'s recent calls.
    pub fn recent_calls(&self, provider: &str) -> types::CallStats {
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let Some(r) = recent.get(provider) else {
            return types::CallStats::default();
        };
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

/// Raises a counter that follows a running total kept elsewhere to that
/// total; a total that went down (a restarted driver) leaves it alone.
fn catch_up(family: &Family<ByProvider, Counter>, labels: &ByProvider, total: u64) {
    let child = family.get_or_create(labels);
    child.inc_by(total.saturating_sub(child.get()));
}

impl Observer for Telemetry {
    fn in_flight(&self, provider: &str, change: i8) {
        let gauge = self
            .calls_in_flight
            .get_or_create(&ByProvider::new(provider));
        gauge.inc_by(f64::from(change));
    }

    fn call(&self, provider: &str, call: Call, result: Result<(), &CallError>, took: Duration) {
        let outcome = outcome_name(result);
        let call_name = call.as_str();
        self.calls
            .get_or_create(&CallOutcome {
                provider: provider.to_owned(),
                call: call_name,
                outcome,
            })
            .inc();
        self.call_seconds
            .get_or_create(&ProviderCall {
                provider: provider.to_owned(),
                call: call_name,
            })
            .observe(took.as_secs_f64());
        if let Err(e) = result
            && let Some(t) = e.kind.trap()
        {
            self.traps
                .get_or_create(&TrapKind {
                    provider: provider.to_owned(),
                    kind: t.name(),
                })
                .inc();
        }
        {
            let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            let r = recent.entry(provider.to_owned()).or_default();
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
        let count = |family: &Family<ByProvider, Counter>, p: ProviderIx| {
            family
                .get_or_create(&ByProvider::new(&config[p].name))
                .inc();
        };
        match notice {
            Notice::QuotaPaused { provider, .. } => count(&self.quota_pauses, *provider),
            Notice::RateLimited { provider, .. } => count(&self.rate_limit_holds, *provider),
            Notice::CapacityPaused { provider, .. } => count(&self.capacity_pauses, *provider),
            Notice::LeakDeleted { provider, .. } => count(&self.leaks_deleted, *provider),
            Notice::NotAdopted { provider, .. } => count(&self.not_adopted, *provider),
            Notice::LeaseExpired { .. } => {
                self.leases_expired.inc();
            }
            Notice::RequestFailed { .. } => {
                self.requests_failed.inc();
            }
            Notice::ListRefused { provider, refused } => {
                self.refused(&config[*provider].name, refused)
            }
            Notice::Foreign { .. }
            | Notice::Adopted { .. }
            | Notice::Vanished { .. }
            | Notice::Missing { .. }
            | Notice::Reappeared { .. }
            | Notice::LostInUse { .. }
            | Notice::Revived { .. }
            | Notice::ListFailing { .. }
            | Notice::ListSuspect { .. }
            | Notice::ListRecovered { .. }
            | Notice::Quarantined { .. }
            | Notice::StoreMismatch { .. }
            | Notice::StoreMismatchEnded { .. }
            | Notice::HeldByTags { .. } => {}
        }
    }

    fn refused(&self, provider: &str, refused: &[berth_core::driver::check::BadAnswer]) {
        for r in refused {
            self.refused
                .get_or_create(&Rule {
                    provider: provider.to_owned(),
                    rule: r.rule,
                })
                .inc();
        }
    }

    fn probed(
        &self,
        provider: &str,
        check: berth_config::Check,
        result: Result<(), &str>,
        took: Duration,
    ) {
        self.probes
            .get_or_create(&ProbeOutcome {
                provider: provider.to_owned(),
                check: check.as_str(),
                outcome: if result.is_ok() { "ready" } else { "not_ready" },
            })
            .inc();
        self.probe_seconds
            .get_or_create(&ProviderCheck {
                provider: provider.to_owned(),
                check: check.as_str(),
            })
            .observe(took.as_secs_f64());
    }

    fn fulfilled(&self, _request: &Request, latency: Duration) {
        self.fulfilment.observe(latency.as_secs_f64());
    }

    fn committed(&self, took: Duration) {
        self.commit_seconds.observe(took.as_secs_f64());
    }

    fn heartbeat(&self, took: Duration) {
        self.heartbeat_seconds.observe(took.as_secs_f64());
    }

    fn taken_in(&self, count: usize) {
        self.requests_taken_in.inc_by(count as u64);
    }
}

/// Live nodes counted by (label, provider, state), for metrics.
fn node_counts(pool: &Pool) -> HashMap<(LabelIx, ProviderIx, &'static str), u64> {
    let mut counts = HashMap::new();
    for n in pool.nodes() {
        *counts
            .entry((n.label, n.provider, n.state.name()))
            .or_default() += 1;
    }
    counts
}

#[cfg(test)]
mod tests;
