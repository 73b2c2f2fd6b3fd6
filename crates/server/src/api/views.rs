//! Core records turned into the API's JSON shapes, on the pool's task. A
//! node's addresses and connection details are shown only to an admin or to
//! the requestor holding it.

use std::collections::BTreeMap;

use super::auth::Caller;
use super::edge::no_other_params;
use super::error::ApiError;
use crate::runtime::{Health, LoadedDriver, Providers, Reloaded};
use crate::telemetry::Telemetry;
use axum::http::StatusCode;
use berth_config::{Config, LabelIx, LabelKind, ProviderIx};
use berth_core::pool::{
    Blocked, Cap, ListHealth, MAX_METADATA_KEY, Metadata, Node, NodeId, NodeState, Packing, Pool,
    Request, RequestId, RequestState, Time, Wait, WaitReason, is_metadata_key,
};
use berth_types::ErrorCode;
use berth_types::{self as types, rfc3339};

/// Node `id` as `caller` sees it; 404 if the pool does not have it.
pub(super) fn node_by_id(
    pool: &Pool,
    id: NodeId,
    caller: &Caller,
) -> Result<types::Node, ApiError> {
    pool.node(id)
        .map(|n| node(pool, n, caller))
        .ok_or_else(|| ApiError::not_found(format!("no node {id}")))
}

pub(super) fn node(pool: &Pool, n: &Node, caller: &Caller) -> types::Node {
    let config = pool.config();
    let request = n.request();
    let requestor = pool.requestor_of(n.id).map(str::to_owned);
    let shown = caller.is_admin() || requestor.as_deref().is_some_and(|r| caller.may_act_for(r));
    let reason = match &n.state {
        NodeState::Deleting { reason, .. } => Some(reason.as_str().to_owned()),
        NodeState::Gone { reason, .. } => Some(reason.as_str().to_owned()),
        NodeState::Failed { reason, .. } => Some(reason.clone()),
        _ => None,
    };
    let (addresses, connection) = match (&n.endpoint, shown) {
        (Some(e), true) => (
            Some(types::Addresses {
                public_ipv4: e.addresses.public_ipv4.clone(),
                private_ipv4: e.addresses.private_ipv4.clone(),
                ipv6: e.addresses.ipv6.clone(),
                hostname: e.addresses.hostname.clone(),
            }),
            Some(types::Connection {
                username: e.connection.username.clone(),
                port: e.connection.port,
                host_keys: e.connection.host_keys.clone(),
            }),
        ),
        _ => (None, None),
    };
    let missing = pool.missing(n.id).map(|m| types::MissingInstance {
        since: rfc3339(m.since.as_millis()),
        state: if m.confirmed {
            "confirmed"
        } else {
            "suspected"
        }
        .to_owned(),
    });
    let metadata = match shown {
        true => node_metadata(pool, n).cloned().unwrap_or_default(),
        false => BTreeMap::new(),
    };
    let probe = pool.probing(n.id).map(|p| types::Probe {
        check: config[n.label].ready.check.as_str().to_owned(),
        since: rfc3339(p.since.as_millis()),
        failed: p.attempts,
        last_error: p.last_error.clone(),
    });
    types::Node {
        missing,
        probe,
        id: n.id.to_string(),
        label: config[n.label].name.clone(),
        provider: config[n.provider].name.clone(),
        state: n.state.name().to_owned(),
        reason,
        failure: n.failure.clone(),
        idle: n.idle.as_str().to_owned(),
        instance_type: n.instance_type.clone(),
        instance: n.instance.clone(),
        request: request.map(|r| r.to_string()),
        requestor,
        metadata,
        since: rfc3339(n.state.since().as_millis()),
        created: rfc3339(n.created.as_millis()),
        slot: match n.packing {
            Packing::Slot { backing, index } => Some(types::Slot {
                backing: backing.to_string(),
                index,
            }),
            _ => None,
        },
        hosting: match &n.packing {
            Packing::Backing {
                slot_label, slots, ..
            } => Some(types::Hosting {
                label: config[*slot_label].name.clone(),
                used: slots.iter().filter(|s| s.is_some()).count() as u16,
                slots: slots.len() as u16,
            }),
            _ => None,
        },
        addresses,
        connection,
    }
}

/// The metadata of the request `n` is handed out to or set aside for.
fn node_metadata<'p>(pool: &'p Pool, n: &Node) -> Option<&'p Metadata> {
    n.request()
        .and_then(|r| pool.request(r))
        .map(|r| &r.metadata)
}

fn request_view(pool: &Pool, r: &Request, caller: &Caller) -> types::Request {
    let nodes = (r.nodes.iter())
        .filter_map(|id| pool.node(*id))
        .map(|n| node(pool, n, caller))
        .collect();
    let waiting = (pool.waiting(r.id).iter())
        .map(|w| waiting(pool.config(), w))
        .collect();
    request_with(pool.config(), r, nodes, waiting)
}

/// A request accepted into the store's inbox, not yet taken in by the
/// pool's holder: pending, with no nodes, waiting for the holder.
pub(super) fn pending(config: &Config, r: &Request) -> types::Request {
    let inbox = types::Waiting {
        label: (r.wants.first()).map_or_else(String::new, |(l, _)| config[*l].name.clone()),
        nodes: r.wants.iter().map(|(_, n)| n).sum(),
        node: None,
        provider: None,
        reason: "inbox".into(),
        until: None,
        detail: "accepted into the store's inbox by a process standing by; the pool's holder \
                 takes it in next"
            .into(),
    };
    request_with(config, r, Vec::new(), vec![inbox])
}

/// One thing a pending request waits for, with its words.
fn waiting(config: &Config, w: &Wait) -> types::Waiting {
    let provider = w.provider.map(|p| config[p].name.clone());
    let on = provider
        .as_deref()
        .map_or(String::new(), |p| format!(" on `{p}`"));
    let at = |t: Time| rfc3339(t.as_millis());
    let detail = match &w.reason {
        WaitReason::Creating { since } => {
            format!("its create{on} is under way (since {})", at(*since))
        }
        WaitReason::Backing { backing } => {
            format!("its backing node {backing} is not running yet")
        }
        WaitReason::Booting { since } => {
            format!("its instance{on} is booting (since {})", at(*since))
        }
        WaitReason::Probing {
            attempts,
            last_error,
            ..
        } => {
            let last = last_error
                .as_deref()
                .map_or(String::new(), |e| format!("; the last: {e}"));
            format!(
                "its instance{on} runs; its readiness probe has not passed yet ({attempts} tried{last})"
            )
        }
        WaitReason::Others => "ready; the request's other nodes are not yet".into(),
        WaitReason::Blocked(b) => {
            let p = provider.as_deref().unwrap_or_default();
            match b {
                Blocked::NotListed => format!(
                    "provider `{p}` has not been listed since berth started (its driver is \
                     starting, or failing: see GET /v1/providers)"
                ),
                Blocked::StoreMismatch => format!(
                    "provider `{p}` creates nothing: the store cannot vouch for its instances \
                     (see GET /v1/providers)"
                ),
                Blocked::QuotaPaused(t) => format!(
                    "provider `{p}`'s cloud said its quota is exhausted: no create there until {}",
                    at(*t)
                ),
                Blocked::RateLimited(t) => format!(
                    "provider `{p}`'s cloud limits the rate of calls: none there until {}",
                    at(*t)
                ),
                Blocked::Capacity(t) => format!(
                    "provider `{p}`'s cloud has no capacity for the label's instance type: \
                     none there until {}",
                    at(*t)
                ),
                Blocked::Limit { what, used, max } => {
                    let what: &str = what.into();
                    format!("provider `{p}` is at its {what} ({used} in use of {max})")
                }
            }
        }
        WaitReason::NoProvider => format!(
            "no provider offers label `{}` any more",
            config[w.label].name
        ),
        WaitReason::Together => "each label has room on its own, but not all of the request's \
                                 nodes together, within the providers' limits"
            .into(),
        WaitReason::Cap(Cap::Requestor { name, held, max }) => format!(
            "requestor `{name}` holds or has set aside {held} nodes of its max-nodes {max}; \
             this request waits until enough are given back"
        ),
        WaitReason::Cap(Cap::Label { label, held, max }) => format!(
            "label `{}` has {held} nodes handed out or set aside of its max-nodes {max}; this \
             request waits until enough are given back",
            config[*label].name
        ),
        WaitReason::Kept { request } => format!(
            "there is room, but it is kept for request {request}, ahead of this one, which has \
             waited longer than reserve-after"
        ),
        WaitReason::Next => "nothing holds it back: the next step serves it".into(),
    };
    types::Waiting {
        label: config[w.label].name.clone(),
        nodes: w.nodes,
        node: w.node.map(|n| n.to_string()),
        provider,
        reason: w.reason.name().into(),
        until: w.reason.until().map(at),
        detail,
    }
}

fn request_with(
    config: &Config,
    r: &Request,
    nodes: Vec<types::Node>,
    waiting: Vec<types::Waiting>,
) -> types::Request {
    let (state, reason, finished) = match &r.state {
        RequestState::Pending => ("pending", None, None),
        RequestState::Fulfilled { at } => ("fulfilled", None, Some(*at)),
        RequestState::Failed { at, reason } => ("failed", Some(reason.clone()), Some(*at)),
        RequestState::Cancelled { at } => ("cancelled", None, Some(*at)),
    };
    types::Request {
        id: r.id.to_string(),
        requestor: r.requestor.clone(),
        priority: r.priority,
        state: state.to_owned(),
        reason,
        last_failure: r.last_failure.clone(),
        labels: r
            .wants
            .iter()
            .map(|(l, n)| (config[*l].name.clone(), *n))
            .collect(),
        created: rfc3339(r.created.as_millis()),
        finished: finished.map(|t| rfc3339(t.as_millis())),
        nodes,
        waiting,
        idempotency_key: r.key.clone(),
        metadata: r.metadata.clone(),
    }
}

/// One request, if the pool still has it.
pub(super) fn request(pool: &Pool, id: RequestId, caller: &Caller) -> Option<types::Request> {
    pool.request(id).map(|r| request_view(pool, r, caller))
}

/// Request `id` as its requestor or an admin sees it: 404 if the pool does
/// not have it, 403 if it is another requestor's.
pub(super) fn owned_request(
    pool: &Pool,
    id: RequestId,
    caller: &Caller,
) -> Result<types::Request, ApiError> {
    match pool.request(id) {
        None => Err(ApiError::not_found(format!("no request {id}"))),
        Some(r) if !caller.may_act_for(&r.requestor) => Err(ApiError::forbidden(format!(
            "request {id} belongs to another requestor"
        ))),
        Some(r) => Ok(request_view(pool, r, caller)),
    }
}

/// `?meta.KEY=VALUE` filters, on requests and nodes: each must match.
#[derive(Default)]
pub(super) struct MetaFilter(Vec<(String, String)>);

impl MetaFilter {
    /// The `meta.` parameters of `q`, and the others.
    fn parse(
        q: &BTreeMap<String, String>,
    ) -> Result<(MetaFilter, BTreeMap<String, String>), ApiError> {
        let mut wanted = Vec::new();
        let mut rest = BTreeMap::new();
        for (name, value) in q {
            match name.strip_prefix("meta.") {
                Some(key) if is_metadata_key(key) => wanted.push((key.to_owned(), value.clone())),
                Some(_) => {
                    return Err(ApiError::bad(
                        name.clone(),
                        format!(
                            "not a metadata key: 1 to {MAX_METADATA_KEY} of A-Z a-z 0-9 . _ - / \
                             after `meta.`"
                        ),
                    ));
                }
                None => {
                    rest.insert(name.clone(), value.clone());
                }
            }
        }
        Ok((MetaFilter(wanted), rest))
    }

    /// Whether `metadata` holds every key asked for, with its value.
    fn matches(&self, metadata: Option<&Metadata>) -> bool {
        (self.0.iter()).all(|(k, v)| metadata.and_then(|m| m.get(k)) == Some(v))
    }
}

/// `GET /v1/requests` filters.
pub(super) struct RequestFilter {
    state: Option<String>,
    requestor: Option<String>,
    meta: MetaFilter,
}

impl RequestFilter {
    pub(super) fn parse(q: &BTreeMap<String, String>) -> Result<RequestFilter, ApiError> {
        let (meta, q) = MetaFilter::parse(q)?;
        let q = &q;
        no_other_params(q, &["state", "requestor"])?;
        let state = q.get("state").cloned();
        if let Some(s) = &state
            && !["pending", "fulfilled", "failed", "cancelled"].contains(&s.as_str())
        {
            return Err(ApiError::bad(
                "state",
                format!("`{s}` is not pending, fulfilled, failed or cancelled"),
            ));
        }
        Ok(RequestFilter {
            state,
            requestor: q.get("requestor").cloned(),
            meta,
        })
    }
}

/// Requests the caller may see, oldest first.
pub(super) fn requests(pool: &Pool, f: &RequestFilter, caller: &Caller) -> Vec<types::Request> {
    let mut list: Vec<&Request> = pool
        .requests()
        .filter(|r| caller.may_act_for(&r.requestor))
        .filter(|r| f.requestor.as_deref().is_none_or(|q| r.requestor == q))
        .filter(|r| f.state.as_deref().is_none_or(|s| r.state.name() == s))
        .filter(|r| f.meta.matches(Some(&r.metadata)))
        .collect();
    list.sort_by_key(|r| (r.created, r.id));
    list.into_iter()
        .map(|r| request_view(pool, r, caller))
        .collect()
}

/// `GET /v1/nodes` filters.
pub(super) struct NodeFilter {
    label: Option<LabelIx>,
    provider: Option<ProviderIx>,
    state: Option<String>,
    requestor: Option<String>,
    meta: MetaFilter,
}

const NODE_STATES: [&str; 8] = [
    "creating", "booting", "ready", "in-use", "used", "deleting", "gone", "failed",
];

impl NodeFilter {
    pub(super) fn parse(
        q: &BTreeMap<String, String>,
        config: &Config,
    ) -> Result<NodeFilter, ApiError> {
        let (meta, q) = MetaFilter::parse(q)?;
        let q = &q;
        no_other_params(q, &["label", "provider", "state", "requestor"])?;
        let label = match q.get("label") {
            None => None,
            Some(l) => Some(config.label(l).ok_or_else(|| ApiError {
                field: Some("label".into()),
                ..ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    ErrorCode::UnknownLabel,
                    format!("no label `{l}`"),
                )
            })?),
        };
        let provider = match q.get("provider") {
            None => None,
            Some(p) => Some(config.provider(p).ok_or_else(|| ApiError {
                field: Some("provider".into()),
                ..ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    ErrorCode::UnknownProvider,
                    format!("no provider `{p}`"),
                )
            })?),
        };
        let state = q.get("state").cloned();
        if let Some(s) = &state
            && !NODE_STATES.contains(&s.as_str())
        {
            return Err(ApiError::bad(
                "state",
                format!("`{s}` is not one of {}", NODE_STATES.join(", ")),
            ));
        }
        Ok(NodeFilter {
            label,
            provider,
            state,
            requestor: q.get("requestor").cloned(),
            meta,
        })
    }
}

/// Nodes matching `f`, oldest first. Every caller sees every node; only the
/// connection details are kept from those who do not hold it.
pub(super) fn nodes(pool: &Pool, f: &NodeFilter, caller: &Caller) -> Vec<types::Node> {
    let mut list: Vec<&Node> = pool
        .nodes()
        .filter(|n| f.label.is_none_or(|l| n.label == l))
        .filter(|n| f.provider.is_none_or(|p| n.provider == p))
        .filter(|n| f.state.as_deref().is_none_or(|s| n.state.name() == s))
        .filter(|n| {
            f.requestor
                .as_deref()
                .is_none_or(|r| pool.requestor_of(n.id) == Some(r))
        })
        // Only metadata the caller is shown is matched.
        .filter(|n| {
            f.meta.0.is_empty()
                || (pool.requestor_of(n.id)).is_some_and(|r| caller.may_act_for(r))
                    && f.meta.matches(node_metadata(pool, n))
        })
        .collect();
    list.sort_by_key(|n| (n.created, n.id));
    list.into_iter().map(|n| node(pool, n, caller)).collect()
}

pub(super) fn labels(pool: &Pool) -> Vec<types::Label> {
    let config = pool.config();
    let mut by_label: Vec<BTreeMap<String, usize>> = vec![BTreeMap::new(); config.labels.len()];
    for n in pool.nodes().filter(|n| !n.state.is_final()) {
        *by_label[n.label.0 as usize]
            .entry(n.state.name().to_owned())
            .or_default() += 1;
    }
    config
        .labels
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let ix = LabelIx(i as u16);
            let (slots, backing_label, offers) = match &l.kind {
                LabelKind::Machine { offers } => (
                    None,
                    None,
                    offers
                        .iter()
                        .map(|o| types::Offer {
                            provider: config[o.provider].name.clone(),
                            instance_type: o.instance_type.clone(),
                            vcpus: o.vcpus,
                            ram_mib: o.ram_mib,
                            price: o.price,
                        })
                        .collect(),
                ),
                LabelKind::Slots { slots, backing, .. } => (
                    Some(*slots),
                    Some(config[*backing].name.clone()),
                    Vec::new(),
                ),
            };
            types::Label {
                name: l.name.clone(),
                kind: if slots.is_some() { "slots" } else { "machine" }.to_owned(),
                // A removed label keeps none ready.
                // The one in force now: a schedule's window may set it.
                min_ready: if l.retired {
                    0
                } else {
                    l.min_ready_at(pool.last_tick().as_millis())
                },
                ready: pool.free_ready(ix),
                nodes: std::mem::take(&mut by_label[i]),
                slots,
                backing_label,
                offers,
                removed: l.retired,
                time_to_ready: None,
            }
        })
        .collect()
}

pub(super) fn providers(
    pool: &Pool,
    telemetry: &Telemetry,
    started: &Providers,
) -> Vec<types::Provider> {
    let config = pool.config();
    let now = pool.last_tick();
    let at = |t: berth_core::pool::Time| rfc3339(t.as_millis());
    config
        .providers
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let s = pool.provider_status(ProviderIx(i as u16));
            let health = started.health(ProviderIx(i as u16));
            let quota = s.quota_paused_until.filter(|t| *t > now);
            let held = s.held_until.filter(|t| *t > now);
            let capacity: BTreeMap<String, String> = s
                .capacity_paused
                .iter()
                .filter(|(_, t)| *t > now)
                .map(|(ty, t)| (ty.clone().unwrap_or_else(|| "*".into()), at(*t)))
                .collect();
            let list_error = match &s.list {
                ListHealth::Ok => None,
                ListHealth::Failing { since, error } => {
                    Some(format!("lists fail since {}: {error}", at(*since)))
                }
                ListHealth::Suspect { since, known } => Some(format!(
                    "lists since {} show none of the {known} instances berth holds there; not believed",
                    at(*since)
                )),
            };
            let credentials: Vec<types::CredentialState> = started
                .credentials(ProviderIx(i as u16))
                .into_iter()
                .map(credential_state)
                .collect();
            let status = if matches!(health, Health::Failed { .. }) {
                "failed"
            } else if health == Health::Starting {
                "starting"
            } else if credentials.iter().any(|c| c.error.is_some()) {
                "credential-failing"
            } else if matches!(s.list, ListHealth::Failing { .. }) {
                "list-failing"
            } else if matches!(s.list, ListHealth::Suspect { .. }) {
                "list-suspect"
            } else if s.mismatch.is_some() {
                "store-mismatch"
            } else if held.is_some() {
                "rate-limited"
            } else if quota.is_some() {
                "quota-paused"
            } else if !s.listed {
                "not-listed-yet"
            } else if !capacity.is_empty() {
                "capacity-paused"
            } else {
                "ok"
            };
            types::Provider {
                name: p.name.clone(),
                driver: started.driver_file(ProviderIx(i as u16)),
                priority: p.priority,
                status: status.to_owned(),
                limits: types::Limits {
                    max_instances: p.limits.max_instances,
                    max_cores: p.limits.max_cores,
                    max_ram_mib: p.limits.max_ram_mib,
                },
                usage: types::Usage {
                    instances: s.usage.instances,
                    vcpus: s.usage.vcpus,
                    ram_mib: s.usage.ram_mib,
                },
                listed: s.listed,
                quota_paused_until: quota.map(at),
                rate_limited_until: held.map(at),
                capacity_paused: capacity,
                leaks_pending: s.leaks_pending,
                leaks_deleted: s.leaks_deleted,
                calls: telemetry.recent_calls(&p.name),
                start_error: match health {
                    Health::Failed { error, .. } => Some(error.to_string()),
                    _ => None,
                },
                list_error,
                last_listed: s.last_listed.map(at),
                missing: s.missing,
                store_mismatch: s.mismatch.clone(),
                quarantined: (s.quarantined.iter())
                    .map(|(instance, q)| types::QuarantinedInstance {
                        instance: berth_core::text::printable(instance).into_owned(),
                        node: q.node.clone(),
                        why: q.why.clone(),
                    })
                    .collect(),
                holder: None,
                lease_expires: None,
                credentials,
                removed: p.retired,
            }
        })
        .collect()
}

/// A wall-clock time as RFC 3339 (none before 1970).
fn wall(t: std::time::SystemTime) -> Option<String> {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| rfc3339(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
        .ok()
}

fn credential_state(c: berth_plugin::CredentialStatus) -> types::CredentialState {
    let at = wall;
    types::CredentialState {
        state: match (&c.error, c.used) {
            (Some(_), _) => "failing",
            (None, true) => "ok",
            (None, false) => "unused",
        }
        .to_owned(),
        host: c.host,
        kind: c.kind.to_owned(),
        error: c.error,
        failing_since: c.failing_since.and_then(at),
        expires: c.expires.and_then(at),
        exchanges: c.exchanges,
        failures: c.failures,
        refreshed_on_401: c.refreshed_on_401,
        replays: c.replays,
    }
}

pub(super) fn drivers(loaded: &[LoadedDriver]) -> Vec<types::Driver> {
    loaded
        .iter()
        .map(|d| {
            let info = d.driver.info();
            types::Driver {
                file: d.driver.file_name().to_owned(),
                path: d.driver.path().display().to_string(),
                name: info.name.clone(),
                version: info.version.clone(),
                contract: d.driver.contract().version().to_owned(),
                sha256: d.driver.sha256().to_owned(),
                loaded_from: match d.driver.source() {
                    berth_plugin::LoadSource::Compiled => "compiled",
                    berth_plugin::LoadSource::Cache => "cache",
                }
                .to_owned(),
                load_ms: d.driver.load_time().as_secs_f64() * 1e3,
                providers: d.providers.clone(),
                reload_error: d.reload_error.as_ref().map(|e| types::DriverReloadError {
                    provider: e.provider.clone(),
                    sha256: e.sha256.clone(),
                    error: e.error.to_string(),
                    at: wall(e.at).unwrap_or_default(),
                }),
                previous_sha256: d.previous.as_ref().map(|p| p.sha256().to_owned()),
            }
        })
        .collect()
}

/// What a reload or a rollback did with `provider`.
pub(super) fn driver_reload(provider: String, outcome: Reloaded) -> types::DriverReload {
    let view =
        |outcome: &str, sha256: Option<String>, running: Option<String>| types::DriverReload {
            provider: provider.clone(),
            outcome: outcome.to_owned(),
            sha256,
            running,
            error: None,
        };
    match outcome {
        Reloaded::Unchanged { sha256 } => view("unchanged", Some(sha256.clone()), Some(sha256)),
        Reloaded::Swapped { to, .. } => view("switched", Some(to.clone()), Some(to)),
        Reloaded::Failed {
            sha256,
            running,
            error,
        } => types::DriverReload {
            error: Some(error.to_string()),
            ..view(
                "failed",
                Some(sha256).filter(|s| !s.is_empty()),
                Some(running),
            )
        },
        Reloaded::PassedOver { sha256, running } => {
            view("passed_over", Some(sha256), Some(running))
        }
        Reloaded::NotStarted => view("not_started", None, None),
    }
}
