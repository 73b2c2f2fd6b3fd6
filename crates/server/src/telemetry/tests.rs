//! The telemetry's metrics as Prometheus reads them.

use super::*;
use std::path::Path;
use std::sync::Arc;

use berth_config::Check;
use berth_core::driver::Call;
use berth_core::driver::check::BadAnswer;
use berth_core::pool::Time;
use berth_plugin::{CallErrorKind, Trap};

const CONFIG: &str = r#"
pool-id = "t"
ready = "running"

[providers.p0]
driver = "p0.wasm"
[providers.p1]
driver = "p1.wasm"

[labels.small]
min-ready = 1
[labels.small.providers.p0]
instance-type = "s"
image = "debian-12"
vcpus = 2
ram = "4GiB"
"#;

fn config() -> Arc<Config> {
    let settings =
        berth_config::parse(CONFIG, Path::new("/"), &|_| None).unwrap_or_else(|e| panic!("{e}"));
    Arc::new(settings.pool)
}

/// Every family's `# HELP` and `# TYPE` lines, in order: the names, help
/// texts and types that berth wrote out before prometheus-client, but for
/// a counter's family named without the `_total` its samples carry.
const DESCRIBED: &str = "\
# HELP berth_driver_calls Driver calls by provider, call and outcome.
# TYPE berth_driver_calls counter
# HELP berth_driver_call_seconds Driver call duration by provider and call.
# TYPE berth_driver_call_seconds histogram
# HELP berth_driver_calls_in_flight Driver calls begun and not yet ended, by provider: those this process decided, counted from their commit, and those it carries out for the pool's holder.
# TYPE berth_driver_calls_in_flight gauge
# HELP berth_sandbox_traps Driver instances discarded after a trap, by provider and kind.
# TYPE berth_sandbox_traps counter
# HELP berth_probes Readiness probes of running instances by provider, check (tcp, ssh) and outcome (ready, not_ready).
# TYPE berth_probes counter
# HELP berth_probe_seconds Readiness probe duration by provider and check.
# TYPE berth_probe_seconds histogram
# HELP berth_request_fulfilment_seconds Time from a request's creation to its nodes being handed out.
# TYPE berth_request_fulfilment_seconds histogram
# HELP berth_store_commit_seconds Time the pool's store took to commit one batch of changes.
# TYPE berth_store_commit_seconds histogram
# HELP berth_lease_heartbeat_seconds Time one heartbeat of the providers' leases took (PostgreSQL store).
# TYPE berth_lease_heartbeat_seconds histogram
# HELP berth_quota_pauses Times creates were paused on a provider after quota-exceeded.
# TYPE berth_quota_pauses counter
# HELP berth_rate_limit_holds Times every call to a provider was held after rate-limited.
# TYPE berth_rate_limit_holds counter
# HELP berth_capacity_pauses Times an instance type was paused on a provider for lack of capacity.
# TYPE berth_capacity_pauses counter
# HELP berth_leaked_instances_deleted Instances with this pool's id that no node accounted for, deleted.
# TYPE berth_leaked_instances_deleted counter
# HELP berth_adoptions_refused Instances with this pool's tags not adopted because the provider's limits were full.
# TYPE berth_adoptions_refused counter
# HELP berth_driver_answers_refused Instances a driver answered that failed berth's checks, by provider and rule (id, duplicate, type, tags, address, connection).
# TYPE berth_driver_answers_refused counter
# HELP berth_leases_expired Requestors whose lease expired with requests or nodes to take back.
# TYPE berth_leases_expired counter
# HELP berth_requests_failed Requests that failed.
# TYPE berth_requests_failed counter
# HELP berth_requests_inboxed New requests this process accepted into the store's request inbox while standing by, because the pool's holder did not take them in time.
# TYPE berth_requests_inboxed counter
# HELP berth_requests_taken_in Requests this process took in from the store's request inbox while holding the pool.
# TYPE berth_requests_taken_in counter
# HELP berth_nodes Nodes by label, provider and state.
# TYPE berth_nodes gauge
# HELP berth_requests_pending Requests waiting for nodes.
# TYPE berth_requests_pending gauge
# HELP berth_requests_pending_oldest_seconds Age of the oldest pending request.
# TYPE berth_requests_pending_oldest_seconds gauge
# HELP berth_instances Cloud instances held (creating to deleting), by provider, in use or not.
# TYPE berth_instances gauge
# HELP berth_vcpus vCPUs of the instances held, by provider, in use or not.
# TYPE berth_vcpus gauge
# HELP berth_memory_bytes Memory of the instances held, by provider, in use or not.
# TYPE berth_memory_bytes gauge
# HELP berth_hourly_price Hourly price of the instances held, by provider, in use or not.
# TYPE berth_hourly_price gauge
# HELP berth_provider_started 1 once a provider's driver has loaded and started, 0 while it starts or after its start failed.
# TYPE berth_provider_started gauge
# HELP berth_provider_lists_believed 1 while a provider's last list was believed, 0 while its lists fail or show none of the instances berth holds there.
# TYPE berth_provider_lists_believed gauge
# HELP berth_provider_last_list_age_seconds Time since the start of a provider's last believed list (absent before the first).
# TYPE berth_provider_last_list_age_seconds gauge
# HELP berth_nodes_missing Nodes whose instance the provider's lists stopped showing (suspected, or confirmed while in use).
# TYPE berth_nodes_missing gauge
# HELP berth_pool_held 1 while this process holds the pool (decides and commits; the pool's gauges are its), 0 while it stands by or its store is out of reach (its own counters only).
# TYPE berth_pool_held gauge
# HELP berth_instances_quarantined Instances with this pool's tags that berth neither hands out nor deletes (the store cannot vouch for them, or their tags say they are in use), by provider: for a person to look at.
# TYPE berth_instances_quarantined gauge
# HELP berth_driver_log_dropped Driver log records (log import and stdio lines) dropped over the provider's log-rate or log-bytes.
# TYPE berth_driver_log_dropped counter
# HELP berth_driver_log_dropped_bytes Bytes of the driver log records dropped (message and fields, and 128 bytes a record for its line).
# TYPE berth_driver_log_dropped_bytes counter
# HELP berth_http_connections Connections to the API open now.
# TYPE berth_http_connections gauge
# HELP berth_http_connections_closed API connections berth closed itself, by reason (header_timeout, body_timeout, evicted: idle, closed to make room at max-connections; refused: new at the cap, without a request or with every connection busy).
# TYPE berth_http_connections_closed counter
# HELP berth_sandbox_denied Outbound requests and probes of a driver that the sandbox refused.
# TYPE berth_sandbox_denied counter
# HELP berth_credential_exchanges Reads and token exchanges of a provider's credentials, by host and outcome (ok, failed, after_401: made early because a host answered 401, replayed: requests sent again with the new token).
# TYPE berth_credential_exchanges counter
# HELP berth_driver_reloads Driver reloads of a provider, by outcome (switched: it runs the new file's driver; failed: the file was refused and it goes on with the driver it ran).
# TYPE berth_driver_reloads counter
# HELP berth_driver_reload_failing 1 while a provider's last driver reload failed (see reload_error in /v1/drivers), 0 otherwise.
# TYPE berth_driver_reload_failing gauge
# HELP berth_config_reloads Reloads of the config file (SIGHUP, POST /v1/config/reload), by outcome (applied: berth runs what the file says; refused: nothing changed, and the log says why).
# TYPE berth_config_reloads counter
# EOF
";

/// The name of each family's samples (a histogram's `_bucket` ones), and
/// the name the docs give it.
fn sample_names() -> Vec<(String, String)> {
    DESCRIBED
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| match l.split_once(' ') {
            Some((name, "counter")) => (format!("{name}_total"), format!("{name}_total")),
            Some((name, "histogram")) => (format!("{name}_bucket"), name.to_owned()),
            Some((name, _)) => (name.to_owned(), name.to_owned()),
            None => panic!("`{l}`"),
        })
        .collect()
}

fn trap(t: Trap) -> CallError {
    CallError {
        provider: "p0".into(),
        call: Call::Create,
        kind: CallErrorKind::Trap(t),
    }
}

/// A child in every family, through the paths berth feeds them by.
fn fed() -> Telemetry {
    let config = config();
    let t = Telemetry::new(&config);
    // Powers of two, so that the sum is exact.
    let secs = Duration::from_secs_f64;
    t.call("p0", Call::Create, Ok(()), secs(0.001953125));
    t.call("p0", Call::Create, Ok(()), secs(0.03125));
    let deadline = trap(Trap::Deadline(Duration::from_secs(10)));
    t.call("p0", Call::Create, Err(&deadline), secs(0.5));
    t.call("p1", Call::List, Ok(()), secs(0.001));
    // Two calls begun on p0, one of them ended; none on p1.
    t.in_flight("p0", 1);
    t.in_flight("p0", 1);
    t.in_flight("p0", -1);
    let at = Time::from_millis(0);
    for notice in [
        Notice::QuotaPaused {
            provider: ProviderIx(0),
            until: at,
        },
        Notice::RateLimited {
            provider: ProviderIx(1),
            until: at,
        },
        Notice::CapacityPaused {
            provider: ProviderIx(0),
            instance_type: None,
            until: at,
        },
        Notice::LeaseExpired {
            requestor: "ci".into(),
            failed: 1,
            reclaimed: 0,
        },
    ] {
        t.notice(&config, &notice);
    }
    for (family, p) in [(&t.leaks_deleted, "p0"), (&t.not_adopted, "p1")] {
        family.get_or_create(&ByProvider::new(p)).inc();
    }
    t.requests_failed.inc();
    t.request_inboxed();
    t.taken_in(3);
    t.refused(
        "p1",
        &[BadAnswer {
            instance: "i-1".into(),
            rule: "tags",
            why: String::new(),
        }],
    );
    t.committed(Duration::from_micros(300));
    t.probed(
        "p0",
        Check::Ssh,
        Err("connection refused"),
        secs(0.0009765625),
    );
    t.probed("p0", Check::Ssh, Ok(()), secs(0.03125));
    t.http_connections_open(3);
    t.http_connection_closed("evicted");
    t.pool_gauges(&Pool::new(config.clone(), 1));
    let key = NodeKey {
        label: "small".into(),
        provider: "p0".into(),
        state: "ready",
    };
    t.nodes.get_or_create(&key).set(2.0);
    for family in [
        &t.provider_started,
        &t.lists_believed,
        &t.last_list_age,
        &t.nodes_missing,
        &t.quarantined,
    ] {
        family.get_or_create(&ByProvider::new("p0")).set(1.0);
    }
    for family in [&t.log_dropped, &t.log_dropped_bytes, &t.outbound_denied] {
        family.get_or_create(&ByProvider::new("p0")).inc_by(4);
    }
    let exchanged = ByCredential {
        provider: "p0".into(),
        host: "keystone.example.com".into(),
        outcome: "ok",
    };
    t.credential_exchanges.get_or_create(&exchanged).inc_by(2);
    let switched = ByReload {
        provider: "p0".into(),
        outcome: "switched",
    };
    t.driver_reloads.get_or_create(&switched).inc();
    (t.driver_reload_failing)
        .get_or_create(&ByProvider::new("p0"))
        .set(0.0);
    t
}

fn encode(t: &Telemetry) -> String {
    metrics::encode(&t.registry)
}

#[test]
fn names_types_and_help_are_kept() {
    let text = encode(&fed());
    let described: Vec<&str> = text.lines().filter(|l| l.starts_with('#')).collect();
    assert_eq!(described, DESCRIBED.lines().collect::<Vec<_>>(), "{text}");
    for (sample, _) in sample_names() {
        assert!(
            text.lines().any(|l| l
                .strip_prefix(sample.as_str())
                .is_some_and(|rest| rest.starts_with([' ', '{']))),
            "no sample of {sample} in\n{text}"
        );
    }
    assert!(text.ends_with("\n# EOF\n"), "{text}");
}

#[test]
fn documented_metrics_are_exposed() {
    let doc = include_str!("../../../../docs/api.md");
    let section = doc
        .split("## Health and metrics")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("docs/api.md has a section on metrics");
    let mut documented: Vec<&str> = section
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("berth_"))
        .collect();
    documented.sort_unstable();
    documented.dedup();
    let mut exposed: Vec<String> = sample_names().into_iter().map(|(_, doc)| doc).collect();
    exposed.sort_unstable();
    assert_eq!(documented, exposed);
}

#[test]
fn samples_read_as_before() {
    let text = encode(&fed());
    let mut lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    lines.sort_unstable();
    for want in [
        "berth_driver_calls_total{provider=\"p0\",call=\"create\",outcome=\"ok\"} 2",
        "berth_driver_calls_total{provider=\"p0\",call=\"create\",outcome=\"trap\"} 1",
        "berth_driver_calls_total{provider=\"p1\",call=\"list\",outcome=\"ok\"} 1",
        "berth_driver_calls_in_flight{provider=\"p0\"} 1.0",
        "berth_driver_calls_in_flight{provider=\"p1\"} 0.0",
        "berth_sandbox_traps_total{provider=\"p0\",kind=\"deadline\"} 1",
        "berth_driver_answers_refused_total{provider=\"p1\",rule=\"tags\"} 1",
        "berth_quota_pauses_total{provider=\"p0\"} 1",
        "berth_rate_limit_holds_total{provider=\"p1\"} 1",
        "berth_capacity_pauses_total{provider=\"p0\"} 1",
        "berth_leases_expired_total 1",
        "berth_requests_failed_total 1",
        "berth_requests_inboxed_total 1",
        "berth_requests_taken_in_total 3",
        "berth_http_connections 3.0",
        "berth_http_connections_closed_total{reason=\"evicted\"} 1",
        "berth_nodes{label=\"small\",provider=\"p0\",state=\"ready\"} 2.0",
        "berth_requests_pending 0.0",
        "berth_requests_pending_oldest_seconds 0.0",
        "berth_instances{provider=\"p0\",in_use=\"false\"} 0.0",
        "berth_instances{provider=\"p1\",in_use=\"true\"} 0.0",
        "berth_memory_bytes{provider=\"p1\",in_use=\"false\"} 0.0",
        "berth_driver_log_dropped_total{provider=\"p0\"} 4",
        "berth_probes_total{provider=\"p0\",check=\"ssh\",outcome=\"not_ready\"} 1",
        "berth_probes_total{provider=\"p0\",check=\"ssh\",outcome=\"ready\"} 1",
        "berth_probe_seconds_bucket{le=\"0.001\",provider=\"p0\",check=\"ssh\"} 1",
        "berth_probe_seconds_count{provider=\"p0\",check=\"ssh\"} 2",
        // Histograms: cumulative buckets up to `+Inf`, the count is the
        // `+Inf` bucket.
        "berth_driver_call_seconds_bucket{le=\"0.001\",provider=\"p0\",call=\"create\"} 0",
        "berth_driver_call_seconds_bucket{le=\"0.0025\",provider=\"p0\",call=\"create\"} 1",
        "berth_driver_call_seconds_bucket{le=\"0.05\",provider=\"p0\",call=\"create\"} 2",
        "berth_driver_call_seconds_bucket{le=\"0.25\",provider=\"p0\",call=\"create\"} 2",
        "berth_driver_call_seconds_bucket{le=\"0.5\",provider=\"p0\",call=\"create\"} 3",
        "berth_driver_call_seconds_bucket{le=\"60.0\",provider=\"p0\",call=\"create\"} 3",
        "berth_driver_call_seconds_bucket{le=\"+Inf\",provider=\"p0\",call=\"create\"} 3",
        "berth_driver_call_seconds_count{provider=\"p0\",call=\"create\"} 3",
        "berth_driver_call_seconds_sum{provider=\"p0\",call=\"create\"} 0.533203125",
        "berth_driver_call_seconds_bucket{le=\"0.001\",provider=\"p1\",call=\"list\"} 1",
        "berth_store_commit_seconds_bucket{le=\"0.00025\"} 0",
        "berth_store_commit_seconds_bucket{le=\"0.0005\"} 1",
        "berth_store_commit_seconds_bucket{le=\"+Inf\"} 1",
        "berth_store_commit_seconds_count 1",
        "berth_request_fulfilment_seconds_count 0",
        "berth_request_fulfilment_seconds_bucket{le=\"0.0005\"} 0",
    ] {
        assert!(lines.binary_search(&want).is_ok(), "no `{want}` in\n{text}");
    }
    // One `le` per bound and `+Inf`, for each of the two call labels.
    let buckets = lines
        .iter()
        .filter(|l| l.starts_with("berth_driver_call_seconds_bucket{"))
        .count();
    assert_eq!(buckets, 2 * (metrics::DEFAULT_BUCKETS.len() + 1));
}

#[test]
fn recomputed_gauges_leave_no_stale_label_sets() {
    let config = config();
    let t = Telemetry::new(&config);
    let key = |state| NodeKey {
        label: "small".into(),
        provider: "p0".into(),
        state,
    };
    t.nodes.get_or_create(&key("booting")).set(1.0);
    t.pool_gauges(&Pool::new(config.clone(), 1));
    assert!(t.nodes.get(&key("booting")).is_none());
    assert!(!encode(&t).contains("berth_nodes{"));
    // Every provider's held instances, in use or not, even at zero.
    let held: Vec<String> = encode(&t)
        .lines()
        .filter(|l| l.starts_with("berth_instances{"))
        .map(str::to_owned)
        .collect();
    assert_eq!(held.len(), 4, "{held:?}");
}

#[test]
fn counters_fed_from_running_totals_catch_up() {
    let t = Telemetry::new(&config());
    let labels = ByProvider::new("p0");
    for (total, want) in [(0, 0), (5, 5), (5, 5), (9, 9), (2, 9)] {
        catch_up(&t.log_dropped, &labels, total);
        assert_eq!(t.log_dropped.get_or_create(&labels).get(), want);
    }
}
