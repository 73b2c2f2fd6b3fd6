//! The CLI's client commands (`berth nodes`, `berth request`, …): a small
//! HTTP/1.1 client for a running `berth serve`, printing aligned tables or
//! the API's own JSON.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::bail;
use serde::Serialize;

use berth_client::types::{self, Node, Request};
use berth_client::{Client, Error, Idle, MAX_WAIT};
use berth_core::duration::parse_rfc3339;

/// Where the service is and how to talk to it; every client command takes these.
#[derive(Clone, clap::Args)]
#[command(next_help_heading = "Server")]
pub struct ClientOptions {
    /// The service's URL (http:// or https://).
    #[arg(long, env = "BERTH_SERVER", default_value = "http://127.0.0.1:8080")]
    pub server: String,
    /// The API token, sent as a bearer token.
    #[arg(long, env = "BERTH_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// CA certificates (PEM) to trust for an https:// server, besides the
    /// system's: a server whose certificate a private CA signed.
    #[arg(long, env = "BERTH_CA", value_name = "FILE")]
    pub ca: Option<std::path::PathBuf>,
    /// Print the API's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// A command on one node or request.
#[derive(Clone, clap::Args)]
pub struct IdArgs {
    /// Its id.
    pub id: String,
    #[command(flatten)]
    pub client: ClientOptions,
}

/// The commands that talk to a running `berth serve`.
#[derive(Clone, clap::Subcommand)]
pub enum ClientCommand {
    /// List nodes.
    Nodes(NodeFilter),
    /// List node-set requests.
    Requests(RequestFilter),
    /// Ask for nodes, handed out together: e.g. `berth request small=2 gpu --wait`.
    Request(RequestArgs),
    /// Withdraw a request that is still pending.
    Cancel(IdArgs),
    /// Give back a node you hold.
    Release(IdArgs),
    /// Keep an idle node as it is: never handed out or recycled (admin).
    Hold(IdArgs),
    /// Delete a node as soon as it is idle (admin).
    Drain(IdArgs),
    /// Undo hold or drain: the node is handed out again (admin).
    Run(IdArgs),
    /// Delete a node now (admin).
    Delete(IdArgs),
    /// List providers and their health.
    Providers(ClientOptions),
    /// List loaded drivers.
    Drivers(ClientOptions),
    /// List labels and what the pool has of each.
    Labels(ClientOptions),
    /// Renew your lease, once or every DURATION until interrupted.
    Heartbeat(HeartbeatArgs),
    /// `berth driver reload`.
    #[command(skip)]
    ReloadDrivers(ClientOptions),
    /// `berth driver rollback PROVIDER`.
    #[command(skip)]
    RollbackDriver(ProviderArgs),
    /// `berth config reload`.
    #[command(skip)]
    ReloadConfig(ClientOptions),
}

/// A command on one provider.
#[derive(Clone, clap::Args)]
pub struct ProviderArgs {
    /// The provider's name.
    pub provider: String,
    #[command(flatten)]
    pub client: ClientOptions,
}

#[derive(Clone, clap::Args)]
pub struct NodeFilter {
    /// Only this label's nodes.
    #[arg(long)]
    pub label: Option<String>,
    /// Only this provider's nodes.
    #[arg(long)]
    pub provider: Option<String>,
    /// Only nodes in this state (ready, in-use, …).
    #[arg(long)]
    pub state: Option<String>,
    /// Only nodes held by or set aside for this requestor.
    #[arg(long)]
    pub requestor: Option<String>,
    /// Only nodes of a request made with this metadata (repeatable; each
    /// must match).
    #[arg(long = "meta", value_name = "KEY=VALUE", value_parser = parse_meta)]
    pub meta: Vec<(String, String)>,
    #[command(flatten)]
    pub client: ClientOptions,
}

#[derive(Clone, clap::Args)]
pub struct RequestFilter {
    /// Only requests in this state (pending, fulfilled, failed, cancelled).
    #[arg(long)]
    pub state: Option<String>,
    /// Only this requestor's requests.
    #[arg(long)]
    pub requestor: Option<String>,
    /// Only requests made with this metadata (repeatable; each must match).
    #[arg(long = "meta", value_name = "KEY=VALUE", value_parser = parse_meta)]
    pub meta: Vec<(String, String)>,
    #[command(flatten)]
    pub client: ClientOptions,
}

#[derive(Clone, clap::Args)]
pub struct RequestArgs {
    /// Label names, each with how many nodes of it (default 1).
    #[arg(required = true, value_name = "LABEL[=COUNT]", value_parser = parse_label)]
    pub labels: Vec<(String, u32)>,
    /// Lower is served first.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub priority: i32,
    /// Who the nodes are for (default: the token's name).
    #[arg(long)]
    pub requestor: Option<String>,
    /// Metadata to keep on the request and show on its nodes (repeatable).
    #[arg(long = "meta", value_name = "KEY=VALUE", value_parser = parse_meta)]
    pub meta: Vec<(String, String)>,
    /// An idempotency key: run again with the same key and arguments, the
    /// command finds the request the first run made instead of making
    /// another (for 24 h by default, `idempotency-ttl`).
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
    /// Wait until it is fulfilled or fails, at most DURATION if given;
    /// exits 1 unless it was fulfilled.
    #[arg(long, value_name = "DURATION", num_args = 0..=1, value_parser = parse_duration)]
    pub wait: Option<Option<Duration>>,
    #[command(flatten)]
    pub client: ClientOptions,
}

#[derive(Clone, clap::Args)]
pub struct HeartbeatArgs {
    /// Renew this often instead of once.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub every: Option<Duration>,
    /// Whose lease (default: the token's name).
    #[arg(long)]
    pub requestor: Option<String>,
    #[command(flatten)]
    pub client: ClientOptions,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    berth_core::duration::parse(text).map_err(|e| e.to_string())
}

/// `LABEL` or `LABEL=COUNT`, COUNT at least 1.
fn parse_meta(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("`{text}`: give KEY=VALUE")),
    }
}

fn parse_label(text: &str) -> Result<(String, u32), String> {
    let (name, count) = match text.split_once('=') {
        None => (text, 1),
        Some((name, count)) => {
            let count: u32 = count
                .parse()
                .map_err(|_| format!("`{text}`: the count must be a whole number"))?;
            (name, count)
        }
    };
    if name.is_empty() {
        return Err(format!("`{text}`: no label name"));
    }
    if count == 0 {
        return Err(format!("`{text}`: the count must be at least 1"));
    }
    Ok((name.to_owned(), count))
}

/// The labels of a request; a label given twice is refused.
fn label_map(labels: &[(String, u32)]) -> anyhow::Result<BTreeMap<String, u32>> {
    let mut map = BTreeMap::new();
    for (name, count) in labels {
        if map.insert(name.clone(), *count).is_some() {
            bail!("label `{name}` is given twice; give it once with its count, e.g. `{name}=2`");
        }
    }
    Ok(map)
}

/// Runs a client command, printing to stdout. API errors print
/// `error: <message> (<code>)` and exit 1; an unreachable server exits 2.
pub async fn run(cmd: ClientCommand) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout();
    match execute(cmd, &mut out).await {
        Err(e) => match e.downcast::<Error>() {
            Ok(e) => match exit_code(&e) {
                Some(code) => {
                    eprintln!("error: {e}");
                    Ok(ExitCode::from(code))
                }
                None => Err(e.into()),
            },
            Err(e) => Err(e),
        },
        ok => ok,
    }
}

/// The exit code of a failed call: 1 when berth refused it, 2 when berth
/// could not be reached; others are plain errors.
fn exit_code(e: &Error) -> Option<u8> {
    match e {
        Error::Api { .. } => Some(1),
        Error::Unreachable { .. } => Some(2),
        Error::Answer { .. } | Error::Setup(_) => None,
    }
}

fn client(o: &ClientOptions) -> Result<Client, Error> {
    match &o.ca {
        Some(ca) => Client::with_ca(&o.server, o.token.clone(), ca),
        None => Client::new(&o.server, o.token.clone()),
    }
}

async fn execute(cmd: ClientCommand, out: &mut (dyn Write + Send)) -> anyhow::Result<ExitCode> {
    use ClientCommand as C;
    let node = |n: Node| render_nodes(vec![n]);
    match cmd {
        C::Nodes(f) => {
            let filter = berth_client::NodeFilter {
                label: f.label,
                provider: f.provider,
                state: f.state,
                requestor: f.requestor,
                meta: f.meta,
            };
            let nodes = client(&f.client)?.nodes(&filter).await?;
            show(out, f.client.json, nodes, render_nodes)
        }
        C::Requests(f) => {
            let filter = berth_client::RequestFilter {
                state: f.state,
                requestor: f.requestor,
                meta: f.meta,
            };
            let requests = client(&f.client)?.requests(&filter).await?;
            show(out, f.client.json, requests, render_requests)
        }
        C::Request(r) => request(r, out).await,
        C::Cancel(a) => {
            let r = client(&a.client)?.cancel(&a.id).await?;
            show(out, a.client.json, r, render_request)
        }
        C::Release(a) => show(
            out,
            a.client.json,
            client(&a.client)?.release(&a.id).await?,
            node,
        ),
        C::Hold(a) => idle(a, Idle::Hold, out).await,
        C::Drain(a) => idle(a, Idle::Drain, out).await,
        C::Run(a) => idle(a, Idle::Run, out).await,
        C::Delete(a) => {
            let n = client(&a.client)?.delete_node(&a.id).await?;
            show(out, a.client.json, n, node)
        }
        C::Providers(o) => show(
            out,
            o.json,
            client(&o)?.providers().await?,
            render_providers,
        ),
        C::Drivers(o) => show(out, o.json, client(&o)?.drivers().await?, render_drivers),
        C::Labels(o) => show(out, o.json, client(&o)?.labels().await?, render_labels),
        C::Heartbeat(h) => heartbeat(h, out).await,
        C::ReloadDrivers(o) => {
            let outcomes = client(&o)?.reload_drivers().await?;
            let failed = outcomes.iter().any(|r| r.outcome == "failed");
            show(out, o.json, outcomes, render_reloads)?;
            Ok(if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
        C::RollbackDriver(a) => {
            let outcome = client(&a.client)?.rollback_driver(&a.provider).await?;
            show(out, a.client.json, vec![outcome], render_reloads)
        }
        C::ReloadConfig(o) => {
            let reload = client(&o)?.reload_config().await?;
            let applied = reload.applied;
            show(out, o.json, reload, render_config_reload)?;
            Ok(if applied {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}

/// Hold, drain or run one node; the answer is the node.
async fn idle(a: IdArgs, idle: Idle, out: &mut (dyn Write + Send)) -> anyhow::Result<ExitCode> {
    let n = client(&a.client)?.set_idle(&a.id, idle).await?;
    show(out, a.client.json, n, |n: Node| render_nodes(vec![n]))
}

/// `berth request`: creates it and, with `--wait`, long-polls until it is
/// no longer pending or the wait is over.
async fn request(r: RequestArgs, out: &mut (dyn Write + Send)) -> anyhow::Result<ExitCode> {
    let new = types::NewRequest {
        labels: label_map(&r.labels)?,
        requestor: r.requestor,
        priority: r.priority,
        metadata: r.meta.into_iter().collect(),
    };
    let c = client(&r.client)?;
    let mut req = match &r.idempotency_key {
        Some(key) => c.create_request_keyed(&new, key).await?,
        None => c.create_request(&new).await?,
    };
    let Some(total) = r.wait else {
        return show(out, r.client.json, req, render_request);
    };
    let deadline = total.map(|d| Instant::now() + d);
    if req.state == "pending" {
        eprintln!("{}: pending; waiting…", req.id);
    }
    while req.state == "pending" {
        let left = deadline.map_or(MAX_WAIT, |d| d.saturating_duration_since(Instant::now()));
        if left.is_zero() {
            break;
        }
        req = c.request(&req.id, Some(left.min(MAX_WAIT))).await?;
    }
    let (id, fulfilled, pending) = (
        req.id.clone(),
        req.state == "fulfilled",
        req.state == "pending",
    );
    show(out, r.client.json, req, render_request)?;
    if pending {
        let waited = total.unwrap_or_default().as_millis() as u64;
        let waited = if waited < 1000 {
            format!("{waited}ms")
        } else {
            human(waited)
        };
        eprintln!("{id}: still pending after {waited}; `berth cancel {id}` withdraws it");
    }
    Ok(ExitCode::from(u8::from(!fulfilled)))
}

/// `berth heartbeat`: renews the lease once, or every `--every` until
/// Ctrl-C; in the loop a server that is away or failing is tried again.
async fn heartbeat(h: HeartbeatArgs, out: &mut (dyn Write + Send)) -> anyhow::Result<ExitCode> {
    let c = client(&h.client)?;
    let requestor = h.requestor.as_deref();
    let render = |l: types::Lease| {
        let left = parse_rfc3339(&l.expires).map_or(0, |t| t.saturating_sub(now_ms()));
        let (who, until, left) = (l.requestor, l.expires, human(left));
        format!("lease of {who} renewed until {until} (in {left})\n")
    };
    let Some(every) = h.every else {
        return show(out, h.client.json, c.renew(requestor).await?, render);
    };
    if every.is_zero() {
        bail!("--every must be longer than 0");
    }
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stop = tokio::signal::ctrl_c();
    tokio::pin!(stop);
    loop {
        let renewed = tokio::select! {
            _ = &mut stop => return Ok(ExitCode::SUCCESS),
            r = async { tick.tick().await; c.renew(requestor).await } => r,
        };
        let e = match renewed {
            Ok(lease) => {
                show(out, h.client.json, lease, render)?;
                out.flush()?;
                continue;
            }
            Err(e) => e,
        };
        match e {
            Error::Unreachable { .. } => {}
            Error::Api { status, .. } if status >= 500 => {}
            e => return Err(e.into()),
        }
        let again = human(every.as_millis() as u64);
        eprintln!("warning: {e}; trying again in {again}");
    }
}

/// Prints `v` as the API's JSON (pretty), or rendered as text.
fn show<T: Serialize>(
    out: &mut (dyn Write + Send),
    json: bool,
    v: T,
    render: impl FnOnce(T) -> String,
) -> anyhow::Result<ExitCode> {
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        write!(out, "{}", render(v))?;
    }
    Ok(ExitCode::SUCCESS)
}

// ---- rendering --------------------------------------------------------------

/// Aligns cells into columns two spaces apart; no trailing spaces.
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        debug_assert_eq!(row.len(), headers.len());
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let headers: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
    let mut out = String::new();
    for row in std::iter::once(&headers).chain(rows) {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(&widths).enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            line.push_str(cell);
            line.extend(std::iter::repeat_n(' ', w - cell.chars().count()));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A column: its header and how to show an item in it.
type Column<'a, T> = (&'a str, fn(&T) -> String);

/// A table of `items`, one column per header and cell function.
fn columns<T>(items: &[T], columns: &[Column<'_, T>]) -> String {
    let headers: Vec<&str> = columns.iter().map(|c| c.0).collect();
    let cells = |i: &T| columns.iter().map(|c| (c.1)(i)).collect();
    table(&headers, &items.iter().map(cells).collect::<Vec<_>>())
}

fn or_dash(s: Option<&str>) -> String {
    s.unwrap_or("-").to_owned()
}

/// Parts joined by `sep`, or `-` for none.
fn list(parts: impl IntoIterator<Item = String>, sep: &str) -> String {
    let parts: Vec<String> = parts.into_iter().collect();
    if parts.is_empty() {
        "-".to_owned()
    } else {
        parts.join(sep)
    }
}

/// Time since an API timestamp, e.g. `3m`; `?` if it cannot be read.
fn age(ts: &str, now: u64) -> String {
    parse_rfc3339(ts).map_or_else(|| "?".to_owned(), |t| human(now.saturating_sub(t)))
}

/// Milliseconds as `5s`, `3m`, `2h` or `4d`, rounded down.
fn human(ms: u64) -> String {
    match ms / 1000 {
        s @ 0..60 => format!("{s}s"),
        s @ 60..3600 => format!("{}m", s / 60),
        s @ 3600..86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// The address to reach a node at: public, then hostname, IPv6, private.
fn address(n: &Node) -> Option<&str> {
    let a = n.addresses.as_ref()?;
    let any = [&a.public_ipv4, &a.hostname, &a.ipv6, &a.private_ipv4];
    any.into_iter().find_map(|a| a.as_deref())
}

/// `username@host:port`, as far as the node's details go.
fn connect_to(n: &Node) -> String {
    let Some(host) = address(n) else {
        return "-".to_owned();
    };
    let c = n.connection.clone().unwrap_or_default();
    let user = c.username.map(|u| format!("{u}@")).unwrap_or_default();
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    let port = c.port.map(|p| format!(":{p}")).unwrap_or_default();
    format!("{user}{host}{port}")
}

fn render_nodes(nodes: Vec<Node>) -> String {
    columns(
        &nodes,
        &[
            ("ID", |n| n.id.clone()),
            ("LABEL", |n| n.label.clone()),
            ("PROVIDER", |n| n.provider.clone()),
            ("STATE", |n| match &n.hosting {
                Some(h) => format!("{} (hosts {}/{} {})", n.state, h.used, h.slots, h.label),
                None => n.state.clone(),
            }),
            ("IDLE", |n| n.idle.clone()),
            ("REQUESTOR", |n| or_dash(n.requestor.as_deref())),
            ("SINCE", |n| age(&n.since, now_ms())),
            ("ADDRESS", |n| or_dash(address(n))),
            ("FAILURE", |n| n.failure.clone().unwrap_or_default()),
        ],
    )
}

fn label_list(labels: &BTreeMap<String, u32>) -> String {
    list(labels.iter().map(|(l, n)| format!("{l}={n}")), ",")
}

fn render_requests(requests: Vec<Request>) -> String {
    columns(
        &requests,
        &[
            ("ID", |r| r.id.clone()),
            ("REQUESTOR", |r| r.requestor.clone()),
            ("PRI", |r| r.priority.to_string()),
            ("STATE", |r| r.state.clone()),
            ("LABELS", |r| label_list(&r.labels)),
            ("NODES", |r| r.nodes.len().to_string()),
            ("AGE", |r| age(&r.created, now_ms())),
            ("REASON", reason_or_last_failure),
        ],
    )
}

/// Why a request failed; for a pending one, what it waits for (the first
/// thing, and how many others); otherwise its last failed launch try, if
/// any.
fn reason_or_last_failure(r: &Request) -> String {
    if let Some(first) = r.waiting.first() {
        let more = match r.waiting.len() - 1 {
            0 => String::new(),
            n => format!(" (+{n} more)"),
        };
        return format!("waits: {}{more}", first.detail);
    }
    match (&r.reason, &r.last_failure) {
        (Some(reason), _) => reason.clone(),
        (None, Some(last)) => format!("last failure: {last}"),
        (None, None) => String::new(),
    }
}

/// What a pending request waits for, one line each: how many of which
/// label (or which node), and why.
fn waiting_lines(r: &Request) -> String {
    let mut s = String::new();
    for w in &r.waiting {
        let what = match &w.node {
            Some(node) => format!("{node} ({})", w.label),
            None => format!("{} × {}", w.nodes, w.label),
        };
        s.push_str(&format!("waits: {what}: {}\n", w.detail));
    }
    s
}

/// One request: its state and, once it has nodes, how to reach each.
fn render_request(r: Request) -> String {
    let (labels, age) = (label_list(&r.labels), age(&r.created, now_ms()));
    let mut s = format!(
        "{}  {}  requestor {}  priority {}",
        r.id, r.state, r.requestor, r.priority
    );
    s.push_str(&format!("  labels {labels}  age {age}\n"));
    if let Some(reason) = &r.reason {
        s.push_str(&format!("reason: {reason}\n"));
    }
    if let Some(last) = &r.last_failure {
        s.push_str(&format!("last failure: {last}\n"));
    }
    s.push_str(&waiting_lines(&r));
    if !r.nodes.is_empty() {
        s.push_str(&columns(
            &r.nodes,
            &[
                ("NODE", |n| n.id.clone()),
                ("LABEL", |n| n.label.clone()),
                ("PROVIDER", |n| n.provider.clone()),
                ("STATE", |n| n.state.clone()),
                ("CONNECT", connect_to),
            ],
        ));
    }
    s
}

/// MiB as `512M`, `16G` or `1.5G`.
fn mib(m: u64) -> String {
    match m {
        0..1024 => format!("{m}M"),
        _ if m.is_multiple_of(1024) => format!("{}G", m / 1024),
        _ => format!("{:.1}G", m as f64 / 1024.0),
    }
}

fn millis(ms: f64) -> String {
    match ms {
        ..10.0 => format!("{ms:.1}ms"),
        ..1000.0 => format!("{ms:.0}ms"),
        _ => format!("{:.1}s", ms / 1000.0),
    }
}

fn limits(l: &types::Limits) -> String {
    let instances = l.max_instances.map(|n| format!("{n} inst"));
    let cores = l.max_cores.map(|n| format!("{n} vcpus"));
    list(
        [instances, cores, l.max_ram_mib.map(mib)]
            .into_iter()
            .flatten(),
        ", ",
    )
}

fn render_providers(providers: Vec<types::Provider>) -> String {
    columns(
        &providers,
        &[
            ("NAME", |p| p.name.clone()),
            ("STATUS", |p| {
                if p.removed {
                    format!("{} (removed)", p.status)
                } else {
                    p.status.clone()
                }
            }),
            ("INSTANCES", |p| p.usage.instances.to_string()),
            ("VCPUS", |p| p.usage.vcpus.to_string()),
            ("RAM", |p| mib(p.usage.ram_mib)),
            ("LIMIT", |p| limits(&p.limits)),
            ("CALLS(p50/p99)", |p| {
                match (p.calls.p50_ms, p.calls.p99_ms) {
                    (Some(a), Some(b)) => format!("{}/{}", millis(a), millis(b)),
                    _ => "-".to_owned(),
                }
            }),
            ("ERRORS", |p| {
                format!("{}/{}", p.calls.errors, p.calls.recent)
            }),
        ],
    )
}

fn render_drivers(drivers: Vec<types::Driver>) -> String {
    columns(
        &drivers,
        &[
            ("FILE", |d| d.file.clone()),
            ("NAME", |d| d.name.clone()),
            ("VERSION", |d| d.version.clone()),
            ("CONTRACT", |d| d.contract.clone()),
            ("SHA256", |d| d.sha256.chars().take(12).collect()),
            ("LOADED", |d| millis(d.load_ms)),
            ("FROM", |d| d.loaded_from.clone()),
            ("PROVIDERS", |d| d.providers.join(",")),
            ("RELOAD", |d| match &d.reload_error {
                Some(e) => format!("{} refused: {}", short(&Some(e.sha256.clone())), e.error),
                None => "-".into(),
            }),
        ],
    )
}

/// A sha256's first 12 digits, or `-`.
fn short(sha256: &Option<String>) -> String {
    sha256.as_deref().unwrap_or("-").chars().take(12).collect()
}

fn render_reloads(outcomes: Vec<types::DriverReload>) -> String {
    columns(
        &outcomes,
        &[
            ("PROVIDER", |r| r.provider.clone()),
            ("OUTCOME", |r| r.outcome.clone()),
            ("FILE", |r| short(&r.sha256)),
            ("RUNNING", |r| short(&r.running)),
            ("ERROR", |r| r.error.clone().unwrap_or_default()),
        ],
    )
}

/// Each difference, each problem and reason, then what became of it.
fn render_config_reload(r: types::ConfigReload) -> String {
    let mut s = String::new();
    for d in &r.differences {
        s += &format!("{}: {}: {}\n", r.file, d.key, d.what);
    }
    for p in &r.problems {
        s += &format!("{}: {p}\n", r.file);
    }
    for why in &r.reasons {
        s += &format!("{}: refused: {why}\n", r.file);
    }
    s += &match (r.applied, r.differences.len()) {
        (false, _) => format!(
            "{}: reload refused; berth goes on with the config it runs\n",
            r.file
        ),
        (true, 0) => format!("{}: read again; nothing changed\n", r.file),
        (true, 1) => format!("{}: read again; 1 change applied\n", r.file),
        (true, n) => format!("{}: read again; {n} changes applied\n", r.file),
    };
    s
}

fn render_labels(labels: Vec<types::Label>) -> String {
    columns(
        &labels,
        &[
            ("NAME", |l| l.name.clone()),
            ("KIND", |l| {
                if l.removed {
                    format!("{} (removed)", l.kind)
                } else {
                    l.kind.clone()
                }
            }),
            ("MIN-READY", |l| l.min_ready.to_string()),
            ("READY", |l| l.ready.to_string()),
            ("NODES", |l| {
                list(l.nodes.iter().map(|(s, n)| format!("{s}={n}")), " ")
            }),
            ("TO READY p50/p95", |l| match &l.time_to_ready {
                Some(t) => format!("{:.1}s/{:.1}s", t.p50_s, t.p95_s),
                None => "-".into(),
            }),
        ],
    )
}

// ---- time -------------------------------------------------------------------

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Json;
    use axum::http::StatusCode as Status;
    use axum::routing::{get, post};
    use clap::{CommandFactory, Parser};
    use serde_json::json;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: ClientCommand,
    }

    fn parse(args: &[&str]) -> Result<ClientCommand, clap::Error> {
        Cli::try_parse_from(std::iter::once("berth").chain(args.iter().copied())).map(|c| c.cmd)
    }

    fn options(server: &str) -> ClientOptions {
        let token = Some("secret".to_owned());
        ClientOptions {
            server: server.to_owned(),
            token,
            ca: None,
            json: false,
        }
    }

    #[test]
    fn the_commands_are_well_formed() {
        let cli = Cli::command();
        cli.clone().debug_assert();
        for clash in ["driver", "config", "sim", "serve"] {
            assert!(cli.find_subcommand(clash).is_none(), "{clash}");
        }
        assert!(cli.find_subcommand("heartbeat").is_some());
    }

    #[test]
    fn tables_align_columns() {
        let rows = vec![
            vec!["n-1".to_owned(), "smäll".to_owned(), "x".to_owned()],
            vec!["n-1234".to_owned(), "s".to_owned(), String::new()],
        ];
        assert_eq!(
            table(&["ID", "LABEL", "LAST"], &rows),
            "ID      LABEL  LAST\nn-1     smäll  x\nn-1234  s\n"
        );
        assert_eq!(table(&["A", "B"], &[]), "A  B\n");
    }

    #[test]
    fn labels_parse_with_counts() {
        assert_eq!(parse_label("a"), Ok(("a".to_owned(), 1)));
        assert_eq!(parse_label("a=3"), Ok(("a".to_owned(), 3)));
        for bad in ["a=0", "a=x", "a=", "=2", "a=-1"] {
            assert!(parse_label(bad).is_err(), "{bad}");
        }
        let labels = [("a".to_owned(), 1), ("b".to_owned(), 2)];
        let map = BTreeMap::from([("a".to_owned(), 1), ("b".to_owned(), 2)]);
        assert_eq!(label_map(&labels).unwrap(), map);
        let twice = [("a".to_owned(), 1), ("a".to_owned(), 2)];
        assert!(label_map(&twice).unwrap_err().to_string().contains("twice"));
        assert!(parse(&["request", "a=0"]).is_err());
        let ClientCommand::Request(r) =
            parse(&["request", "a", "b=2", "--priority", "-1", "--wait"]).unwrap()
        else {
            panic!("not a request");
        };
        assert_eq!(r.labels, labels);
        assert_eq!((r.priority, r.wait), (-1, Some(None)));
        let ClientCommand::Request(r) = parse(&["request", "a", "--wait", "90s"]).unwrap() else {
            panic!("not a request");
        };
        assert_eq!(r.wait, Some(Some(Duration::from_secs(90))));
    }

    #[tokio::test]
    async fn a_label_given_twice_is_refused_before_any_call() {
        // Nothing listens on port 9 here; reaching for it would be an unreachable error.
        let cmd = parse(&["request", "a", "a=2", "--server", "http://127.0.0.1:9"]).unwrap();
        let e = execute(cmd, &mut Vec::new()).await.unwrap_err();
        assert!(e.downcast_ref::<Error>().is_none(), "{e}");
        assert!(e.to_string().contains("`a` is given twice"), "{e}");
    }

    #[test]
    fn ages_are_human() {
        let cases = [(0, "0s"), (5_999, "5s"), (59_999, "59s"), (60_000, "1m")];
        let more = [
            (3_599_999, "59m"),
            (7_200_000, "2h"),
            (3 * 86_400_000 + 5, "3d"),
        ];
        for (ms, text) in cases.into_iter().chain(more) {
            assert_eq!(human(ms), text, "{ms}");
        }
        let now = 1_795_431_845_123;
        assert_eq!(age(&types::rfc3339(now - 180_000), now), "3m");
        assert_eq!(age(&types::rfc3339(now + 5_000), now), "0s");
        assert_eq!(age("yesterday", now), "?");
    }

    /// A stand-in for `berth serve` on a free port; answers its URL.
    async fn fake_server() -> String {
        let t = types::rfc3339(now_ms() - 180_000);
        let node = |id: &str, state: &str| {
            json!({"id": id, "label": "small", "provider": "sim", "state": state, "idle": "run",
                "instance_type": "s1", "since": t, "created": t})
        };
        let mut held = node("n-2", "in-use");
        held["requestor"] = json!("ci");
        held["addresses"] = json!({"public_ipv4": "203.0.113.5", "private_ipv4": "10.0.0.5"});
        held["connection"] = json!({"username": "berth", "port": 22});
        let mut retried = node("n-1", "ready");
        retried["failure"] = json!("create: transient error: try again");
        let nodes = json!([retried, held.clone()]);
        let pending = json!({"id": "r-1", "requestor": "ci", "priority": 0, "state": "pending",
            "labels": {"small": 1}, "created": t, "nodes": []});
        let mut fulfilled = pending.clone();
        fulfilled["state"] = json!("fulfilled");
        fulfilled["nodes"] = json!([held]);
        fulfilled["last_failure"] = json!("node n-3 on provider `sim`: create: no room");
        let forbidden = json!({"error": {"code": "forbidden",
            "message": "node x is not held by requestor `ci`"}});
        let app = axum::Router::new()
            .route(
                "/v1/nodes",
                get(|h: axum::http::HeaderMap| async move {
                    assert_eq!(h["authorization"], "Bearer secret");
                    Json(nodes)
                }),
            )
            .route(
                "/v1/nodes/{id}/release",
                post(|| async { (Status::FORBIDDEN, Json(forbidden)) }),
            )
            .route(
                "/v1/requests",
                post(|Json(new): Json<types::NewRequest>| async move {
                    assert_eq!(new.labels, BTreeMap::from([("small".to_owned(), 1)]));
                    (Status::CREATED, Json(pending))
                }),
            )
            .route(
                "/v1/requests/r-1",
                get(|q: axum::extract::RawQuery| async move {
                    assert_eq!(q.0.as_deref(), Some("wait=300000ms"));
                    Json(fulfilled)
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn talks_to_a_server() {
        let server = fake_server().await;
        let mut out = Vec::new();
        execute(
            parse(&["nodes", "--server", &server, "--token", "secret"]).unwrap(),
            &mut out,
        )
        .await
        .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "ID   LABEL  PROVIDER  STATE   IDLE  REQUESTOR  SINCE  ADDRESS      FAILURE\n\
             n-1  small  sim       ready   run   -          3m     -            \
             create: transient error: try again\n\
             n-2  small  sim       in-use  run   ci         3m     203.0.113.5\n"
        );

        let release = IdArgs {
            id: "x".to_owned(),
            client: options(&server),
        };
        let e = execute(ClientCommand::Release(release), &mut Vec::new())
            .await
            .unwrap_err();
        let e = e.downcast::<Error>().unwrap();
        assert_eq!(
            e.to_string(),
            "node x is not held by requestor `ci` (forbidden)"
        );
        assert!(matches!(e, Error::Api { status: 403, .. }));
        assert_eq!(exit_code(&e), Some(1));

        let request = parse(&["request", "small", "--wait", "--server", &server]).unwrap();
        let mut out = Vec::new();
        assert_eq!(execute(request, &mut out).await.unwrap(), ExitCode::SUCCESS);
        let out = String::from_utf8(out).unwrap();
        assert!(out.starts_with("r-1  fulfilled  requestor ci"), "{out}");
        assert!(
            out.contains("\nlast failure: node n-3 on provider `sim`: create: no room\n"),
            "{out}"
        );
        assert!(
            out.contains("\nn-2   small  sim       in-use  berth@203.0.113.5:22\n"),
            "{out}"
        );
    }

    #[tokio::test]
    async fn an_unreachable_server_is_named_and_exits_2() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let e = execute(ClientCommand::Labels(options(&server)), &mut Vec::new())
            .await
            .unwrap_err()
            .downcast::<Error>()
            .unwrap();
        assert_eq!(exit_code(&e), Some(2));
        assert!(
            e.to_string()
                .contains(&format!("cannot reach berth at {server}:")),
            "{e}"
        );
    }

    #[tokio::test]
    async fn an_https_server_is_spoken_to_in_tls() {
        // A server that reads what the client sends first and hangs up: a
        // TLS client's first record is a handshake (0x16) of TLS 1.x.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = format!("https://{}", listener.local_addr().unwrap());
        let first = tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut head = [0u8; 3];
            conn.read_exact(&mut head).await.unwrap();
            head
        });
        let e = execute(ClientCommand::Labels(options(&server)), &mut Vec::new())
            .await
            .unwrap_err()
            .downcast::<Error>()
            .unwrap();
        assert_eq!(first.await.unwrap(), [0x16, 0x03, 0x01]);
        assert_eq!(exit_code(&e), Some(2), "{e}");
        assert!(e.to_string().contains(&server), "{e}");
    }

    #[test]
    fn a_server_that_is_not_a_web_url_is_refused_plainly() {
        let e = Client::new("ftp://berth.example", None).unwrap_err();
        assert!(
            e.to_string().contains("is not an http:// or https:// URL"),
            "{e}"
        );
        assert_eq!(exit_code(&e), None);
    }

    #[test]
    fn a_ca_file_that_holds_no_certificate_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("absent.pem");
        let e = Client::with_ca("https://berth.example", None, &missing).unwrap_err();
        assert!(e.to_string().starts_with("the CA file "), "{e}");
        assert!(e.to_string().contains("cannot read it"), "{e}");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = Client::with_ca("https://berth.example", None, &empty).unwrap_err();
        assert!(e.to_string().contains("no certificate"), "{e}");
        assert_eq!(exit_code(&e), None);
    }
}
