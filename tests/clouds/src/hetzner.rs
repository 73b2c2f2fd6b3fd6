//! Hetzner Cloud's API for servers (`https://api.hetzner.cloud/v1`), as its
//! reference describes it (tests/clouds/hetzner.md names the pages): bearer
//! tokens, the error body and codes, labels and label selectors, pagination
//! by `page`/`per_page` with `meta.pagination`, the `RateLimit-*` headers
//! and `429`, the project's server limit, unique server names, servers that
//! boot and are deleted asynchronously through actions.
//!
//! Operations counted in [`Knobs`]: `servers.list`, `servers.create`,
//! `servers.get`, `servers.update`, `servers.delete`, `actions.get`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

use crate::common::{Answer, Knobs, Machine, Served, TokenCheck, bearer, lock};

/// Server types the project may create, with cores, memory (GB) and disk (GB).
const SERVER_TYPES: [(&str, u32, f64, u32); 4] = [
    ("cx22", 2, 4.0, 40),
    ("cx32", 4, 8.0, 80),
    ("cpx11", 2, 2.0, 40),
    ("cax11", 2, 4.0, 40),
];
/// Images by name.
const IMAGES: [&str; 3] = ["ubuntu-24.04", "debian-12", "fedora-41"];
/// Locations.
const LOCATIONS: [&str; 4] = ["fsn1", "nbg1", "hel1", "ash"];
/// The largest `user_data` the API takes: 32 KiB.
const MAX_USER_DATA: usize = 32 * 1024;

/// How the cloud starts.
#[derive(Clone, Debug)]
pub struct Options {
    /// The project's API tokens.
    pub tokens: Vec<String>,
    /// The project's server limit.
    pub server_limit: usize,
    /// Requests per hour (`RateLimit-Limit`); the bucket refills one request
    /// per `3600 / limit` seconds.
    pub rate_limit: u32,
    /// From create to `running`.
    pub boot: Duration,
    /// From delete to gone.
    pub deletion: Duration,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            tokens: vec!["hcloud-test-token".into()],
            server_limit: 100,
            rate_limit: 3600,
            boot: Duration::from_millis(300),
            deletion: Duration::from_millis(300),
        }
    }
}

/// One server in the cloud's record.
#[derive(Clone, Debug)]
struct Server {
    id: u64,
    name: String,
    server_type: String,
    image: String,
    location: String,
    labels: BTreeMap<String, String>,
    user_data: Option<String>,
    made: Instant,
    created: String,
    /// When the create's action fails and the cloud removes the server.
    fails: Option<(Instant, String)>,
    deleted_at: Option<Instant>,
    gone: bool,
}

struct Action {
    id: u64,
    command: &'static str,
    server: u64,
    started: String,
    done_at: Instant,
    error: Option<String>,
}

struct Project {
    options: Options,
    servers: BTreeMap<u64, Server>,
    actions: BTreeMap<u64, Action>,
    next_id: u64,
    /// Requests left in the bucket, and when it was last filled.
    remaining: f64,
    filled: Instant,
    /// Creates that will fail, with the action's error message.
    failing: Vec<String>,
}

impl Project {
    /// Applies the passing of time: boots, deletions, failed creates.
    fn settle(&mut self) {
        let now = Instant::now();
        for s in self.servers.values_mut().filter(|s| !s.gone) {
            if s.deleted_at
                .is_some_and(|at| now >= at + self.options.deletion)
                || s.fails.as_ref().is_some_and(|(at, _)| now >= *at)
            {
                s.gone = true;
            }
        }
    }

    fn status(&self, s: &Server) -> &'static str {
        if s.deleted_at.is_some() {
            "deleting"
        } else if s.made.elapsed() >= self.options.boot && s.fails.is_none() {
            "running"
        } else {
            "initializing"
        }
    }

    fn view(&self, s: &Server) -> Value {
        let (cores, memory, disk) = SERVER_TYPES
            .iter()
            .find(|t| t.0 == s.server_type)
            .map_or((1, 1.0, 10), |t| (t.1, t.2, t.3));
        let octet = s.id % 250 + 1;
        json!({
            "id": s.id,
            "name": s.name,
            "status": self.status(s),
            "created": s.created,
            "public_net": {
                "ipv4": {"id": s.id, "ip": format!("203.0.113.{octet}"), "blocked": false,
                         "dns_ptr": format!("static.{octet}.113.0.203.clients.your-server.de")},
                "ipv6": {"id": s.id, "ip": format!("2001:db8:{:x}::/64", s.id), "blocked": false, "dns_ptr": []},
                "floating_ips": [],
                "firewalls": [],
            },
            "private_net": [],
            "server_type": {"name": s.server_type, "cores": cores, "memory": memory, "disk": disk,
                            "architecture": if s.server_type.starts_with("cax") { "arm" } else { "x86" }},
            "datacenter": {"name": format!("{}-dc1", s.location), "location": {"name": s.location}},
            "image": {"name": s.image, "type": "system", "status": "available"},
            "labels": s.labels,
            "locked": false,
            "protection": {"delete": false, "rebuild": false},
            "rescue_enabled": false,
            "backup_window": null,
            "outgoing_traffic": null,
            "ingoing_traffic": null,
            "included_traffic": 21_990_232_555_520_u64,
            "primary_disk_size": disk,
            "volumes": [],
            "load_balancers": [],
            "placement_group": null,
        })
    }

    fn action(&mut self, command: &'static str, server: u64, takes: Duration) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.actions.insert(
            id,
            Action {
                id,
                command,
                server,
                started: now_rfc3339(),
                done_at: Instant::now() + takes,
                error: None,
            },
        );
        id
    }

    fn action_view(&self, id: u64) -> Value {
        let Some(a) = self.actions.get(&id) else {
            return Value::Null;
        };
        let done = Instant::now() >= a.done_at;
        let (status, progress) = match (&a.error, done) {
            (_, false) => ("running", 0),
            (None, true) => ("success", 100),
            (Some(_), true) => ("error", 100),
        };
        json!({
            "id": a.id,
            "command": a.command,
            "status": status,
            "progress": progress,
            "started": a.started,
            "finished": if done { json!(now_rfc3339()) } else { Value::Null },
            "resources": [{"id": a.server, "type": "server"}],
            "error": match (&a.error, done) {
                (Some(m), true) => json!({"code": "action_failed", "message": m}),
                _ => Value::Null,
            },
        })
    }

    /// Takes one request from the bucket, after refilling it for the time
    /// passed; `Err` with the seconds until one is there.
    fn take_request(&mut self) -> Result<(), u64> {
        let limit = f64::from(self.options.rate_limit.max(1));
        let per_sec = limit / 3600.0;
        let elapsed = self.filled.elapsed().as_secs_f64();
        self.remaining = (self.remaining + elapsed * per_sec).min(limit);
        self.filled = Instant::now();
        if self.remaining >= 1.0 {
            self.remaining -= 1.0;
            Ok(())
        } else {
            Err(((1.0 - self.remaining) / per_sec).ceil() as u64)
        }
    }

    /// The `RateLimit-*` headers of an answer.
    fn rate_headers(&self, answer: Answer) -> Answer {
        let limit = self.options.rate_limit.max(1);
        let per_sec = f64::from(limit) / 3600.0;
        let missing = f64::from(limit) - self.remaining;
        let reset = unix_now() + (missing / per_sec).ceil() as u64;
        answer
            .with_header("ratelimit-limit", limit.to_string())
            .with_header(
                "ratelimit-remaining",
                (self.remaining.floor() as u64).to_string(),
            )
            .with_header("ratelimit-reset", reset.to_string())
    }
}

/// The fake Hetzner Cloud, serving `/v1` until dropped.
pub struct Cloud {
    served: Served,
    state: Arc<Mutex<Project>>,
    knobs: Arc<Knobs>,
    tokens: Arc<Mutex<Vec<String>>>,
}

#[derive(Clone)]
struct Shared {
    state: Arc<Mutex<Project>>,
    knobs: Arc<Knobs>,
    check: TokenCheck,
}

impl Cloud {
    pub async fn start(options: Options) -> Cloud {
        let tokens = Arc::new(Mutex::new(options.tokens.clone()));
        let state = Arc::new(Mutex::new(Project {
            remaining: f64::from(options.rate_limit),
            options,
            servers: BTreeMap::new(),
            actions: BTreeMap::new(),
            next_id: 4_000_000,
            filled: Instant::now(),
            failing: Vec::new(),
        }));
        let knobs = Arc::new(Knobs::default());
        let shared = Shared {
            state: state.clone(),
            knobs: knobs.clone(),
            check: crate::common::fixed_tokens(tokens.clone()),
        };
        let app = Router::new()
            .route("/v1/servers", get(list).post(create))
            .route(
                "/v1/servers/{id}",
                get(get_server).put(update).delete(delete),
            )
            .route("/v1/actions/{id}", get(get_action))
            .fallback(not_found_route)
            .with_state(shared);
        Cloud {
            served: Served::start(app).await,
            state,
            knobs,
            tokens,
        }
    }

    /// The API's base URL, `http://127.0.0.1:PORT/v1`.
    pub fn url(&self) -> String {
        format!("{}/v1", self.served.url())
    }

    pub fn addr(&self) -> SocketAddr {
        self.served.addr
    }

    pub fn knobs(&self) -> &Knobs {
        &self.knobs
    }

    /// The project's API tokens from now on.
    pub fn set_tokens(&self, tokens: &[&str]) {
        *lock(&self.tokens) = tokens.iter().map(|t| (*t).to_owned()).collect();
    }

    /// The project's server limit from now on.
    pub fn set_server_limit(&self, limit: usize) {
        lock(&self.state).options.server_limit = limit;
    }

    /// The requests per hour from now on; the bucket is full again.
    pub fn set_rate_limit(&self, per_hour: u32) {
        let mut s = lock(&self.state);
        s.options.rate_limit = per_hour;
        s.remaining = f64::from(per_hour);
        s.filled = Instant::now();
    }

    /// The next create's `create_server` action fails with `message`, and
    /// the cloud removes the server it made, as a create that fails does.
    pub fn fail_next_create(&self, message: &str) {
        lock(&self.state).failing.push(message.to_owned());
    }

    /// Makes a server directly in the project (as another tool would).
    pub fn add_server(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let mut s = lock(&self.state);
        s.next_id += 1;
        let id = s.next_id;
        let server = Server {
            id,
            name: name.to_owned(),
            server_type: "cx22".into(),
            image: "ubuntu-24.04".into(),
            location: "fsn1".into(),
            labels: (labels.iter())
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            user_data: None,
            made: Instant::now() - Duration::from_secs(3600),
            created: now_rfc3339(),
            fails: None,
            deleted_at: None,
            gone: false,
        };
        s.servers.insert(id, server);
        id
    }

    /// Every server the project ever had, deleted ones marked.
    pub fn machines(&self) -> Vec<Machine> {
        let mut s = lock(&self.state);
        s.settle();
        (s.servers.values())
            .map(|server| Machine {
                id: server.id.to_string(),
                name: server.name.clone(),
                tags: server.labels.clone(),
                status: if server.gone {
                    "deleted".into()
                } else {
                    s.status(server).into()
                },
                deleted: server.gone,
            })
            .collect()
    }

    /// The user data a server was created with.
    pub fn user_data(&self, id: &str) -> Option<String> {
        let id: u64 = id.parse().ok()?;
        lock(&self.state).servers.get(&id)?.user_data.clone()
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Now as the API writes times: `2016-01-30T23:55:00+00:00`.
fn now_rfc3339() -> String {
    let secs = unix_now();
    let (y, m, d) = crate::common::civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}+00:00",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The API's error body.
pub fn error(status: u16, code: &str, message: &str, details: Value) -> Answer {
    Answer::json(
        status,
        &json!({"error": {"code": code, "message": message, "details": details}}),
    )
}

fn invalid_input(field: &str, message: &str) -> Answer {
    error(
        400,
        "invalid_input",
        &format!("invalid input in field '{field}': {message}"),
        json!({"fields": [{"name": field, "messages": [message]}]}),
    )
}

/// What every request goes through: the bucket, the token, an injected
/// answer. `Err` is the answer to give instead of doing anything.
fn admit(shared: &Shared, headers: &HeaderMap, op: &str) -> Result<(), Answer> {
    let injected = shared.knobs.enter(op);
    let mut s = lock(&shared.state);
    if let Err(wait) = s.take_request() {
        let limit = s.options.rate_limit;
        let answer = error(
            429,
            "rate_limit_exceeded",
            &format!("limit of {limit} requests per hour reached"),
            Value::Null,
        )
        .with_header("retry-after", wait.to_string());
        return Err(s.rate_headers(answer));
    }
    let verdict = match bearer(headers) {
        None => Err("no token given".to_owned()),
        Some(token) => (shared.check)(token),
    };
    if verdict.is_err() {
        return Err(s.rate_headers(error(
            401,
            "unauthorized",
            "unable to authenticate",
            Value::Null,
        )));
    }
    match injected {
        Some(answer) => Err(s.rate_headers(answer)),
        None => {
            s.settle();
            Ok(())
        }
    }
}

/// An answer with the rate headers of now.
fn answer(shared: &Shared, answer: Answer) -> Response {
    lock(&shared.state).rate_headers(answer).into_response()
}

/// `body` with `status`, or the error answer.
fn reply(shared: &Shared, status: u16, result: Result<Value, Answer>) -> Response {
    answer(
        shared,
        result.map_or_else(|a| a, |body| Answer::json(status, &body)),
    )
}

fn query_pairs(raw: Option<&str>) -> Vec<(String, String)> {
    url::form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// One term of a label selector.
#[derive(Debug, PartialEq)]
enum Term {
    Eq(String, String),
    Ne(String, String),
    Has(String),
    HasNot(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// Parses a label selector (`k==v`, `k=v`, `k!=v`, `k`, `!k`,
/// `k in (a,b)`, `k notin (a,b)`, joined by `,`).
fn parse_selector(text: &str) -> Result<Vec<Term>, String> {
    let mut terms = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        // A term ends at the first `,` outside parentheses.
        let mut depth = 0;
        let mut end = rest.len();
        for (i, c) in rest.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    end = i;
                    break;
                }
                _ => {}
            }
        }
        let term = rest[..end].trim();
        rest = rest.get(end + 1..).unwrap_or("").trim();
        terms.push(parse_term(term)?);
    }
    Ok(terms)
}

fn parse_term(term: &str) -> Result<Term, String> {
    let bad = || format!("invalid label selector term {term:?}");
    let set = |values: &str| -> Result<Vec<String>, String> {
        let inner = values
            .trim()
            .strip_prefix('(')
            .and_then(|v| v.strip_suffix(')'))
            .ok_or_else(bad)?;
        Ok(inner.split(',').map(|v| v.trim().to_owned()).collect())
    };
    if let Some((k, v)) = term.split_once("!=") {
        return Ok(Term::Ne(k.trim().into(), v.trim().into()));
    }
    if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return Ok(Term::Eq(k.trim().into(), v.trim().into()));
    }
    if let Some((k, v)) = term.split_once(" notin ") {
        return Ok(Term::NotIn(k.trim().into(), set(v)?));
    }
    if let Some((k, v)) = term.split_once(" in ") {
        return Ok(Term::In(k.trim().into(), set(v)?));
    }
    if let Some(k) = term.strip_prefix('!') {
        return valid_key(k.trim())
            .then(|| Term::HasNot(k.trim().into()))
            .ok_or_else(bad);
    }
    valid_key(term)
        .then(|| Term::Has(term.into()))
        .ok_or_else(bad)
}

fn matches(labels: &BTreeMap<String, String>, terms: &[Term]) -> bool {
    terms.iter().all(|t| match t {
        Term::Eq(k, v) => labels.get(k) == Some(v),
        Term::Ne(k, v) => labels.get(k) != Some(v),
        Term::Has(k) => labels.contains_key(k),
        Term::HasNot(k) => !labels.contains_key(k),
        Term::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
        Term::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
    })
}

/// A label name segment or value body: alphanumerics at both ends,
/// `-_.` and alphanumerics between, at most 63 characters.
fn valid_segment(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name.
fn valid_key(key: &str) -> bool {
    match key.split_once('/') {
        None => valid_segment(key),
        Some((prefix, name)) => {
            prefix.len() <= 253
                && !prefix.starts_with("hetzner.cloud")
                && prefix.split('.').all(|l| {
                    !l.is_empty()
                        && l.len() <= 63
                        && l.bytes()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
                })
                && valid_segment(name)
        }
    }
}

fn valid_value(value: &str) -> bool {
    value.is_empty() || valid_segment(value)
}

fn check_labels(labels: &Value) -> Result<BTreeMap<String, String>, Answer> {
    let Some(map) = labels.as_object() else {
        return Err(invalid_input("labels", "must be an object"));
    };
    let mut out = BTreeMap::new();
    for (k, v) in map {
        let Some(v) = v.as_str() else {
            return Err(invalid_input(
                "labels",
                &format!("value of {k:?} is not a string"),
            ));
        };
        if !valid_key(k) {
            return Err(invalid_input(
                "labels",
                &format!("label key {k:?} is invalid"),
            ));
        }
        if !valid_value(v) {
            return Err(invalid_input(
                "labels",
                &format!("label value {v:?} is invalid"),
            ));
        }
        out.insert(k.clone(), v.to_owned());
    }
    Ok(out)
}

/// A server name: a valid hostname (RFC 1123), at most 63 characters.
fn valid_name(name: &str) -> bool {
    name.split('.').all(|label| {
        let b = label.as_bytes();
        !b.is_empty()
            && b.len() <= 63
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
    }) && name.len() <= 63
}

async fn list(
    State(shared): State<Shared>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    if let Err(a) = admit(&shared, &headers, "servers.list") {
        return a.into_response();
    }
    let pairs = query_pairs(raw.as_deref());
    let param = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let page: usize = match param("page").map(str::parse) {
        None => 1,
        Some(Ok(p)) if p >= 1 => p,
        Some(_) => return answer(&shared, invalid_input("page", "must be a positive integer")),
    };
    let per_page: usize = match param("per_page").map(str::parse) {
        None => 25,
        Some(Ok(p)) if (1..=50).contains(&p) => p,
        Some(_) => return answer(&shared, invalid_input("per_page", "must be 1 to 50")),
    };
    let terms = match param("label_selector").map(parse_selector).transpose() {
        Ok(t) => t.unwrap_or_default(),
        Err(m) => return answer(&shared, invalid_input("label_selector", &m)),
    };
    let name = param("name");
    let statuses: Vec<&str> = (pairs.iter())
        .filter(|(k, _)| k == "status")
        .map(|(_, v)| v.as_str())
        .collect();
    let s = lock(&shared.state);
    let matching: Vec<&Server> = (s.servers.values())
        .filter(|v| !v.gone && shared.knobs.listed(v.made))
        .filter(|v| name.is_none_or(|n| n == v.name))
        .filter(|v| matches(&v.labels, &terms))
        .filter(|v| statuses.is_empty() || statuses.contains(&s.status(v)))
        .collect();
    let total = matching.len();
    let last = total.div_ceil(per_page).max(1);
    let servers: Vec<Value> = (matching.iter())
        .skip((page - 1) * per_page)
        .take(per_page)
        .map(|v| s.view(v))
        .collect();
    let body = json!({
        "servers": servers,
        "meta": {"pagination": {
            "page": page,
            "per_page": per_page,
            "previous_page": if page > 1 { json!(page - 1) } else { Value::Null },
            "next_page": if page < last { json!(page + 1) } else { Value::Null },
            "last_page": last,
            "total_entries": total,
        }},
    });
    s.rate_headers(Answer::json(200, &body)).into_response()
}

async fn create(State(shared): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(a) = admit(&shared, &headers, "servers.create") {
        return a.into_response();
    }
    let made = make_server(&shared, &body);
    if made.is_ok() {
        shared.knobs.held("servers.create").await;
    }
    reply(&shared, 201, made)
}

fn make_server(shared: &Shared, body: &[u8]) -> Result<Value, Answer> {
    let request: Value = serde_json::from_slice(body).map_err(|e| {
        error(
            400,
            "json_error",
            &format!("invalid JSON: {e}"),
            Value::Null,
        )
    })?;
    let text = |field: &str| -> Result<String, Answer> {
        match request.get(field) {
            Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            None | Some(Value::Null) => Err(invalid_input(field, "is required")),
            Some(_) => Err(invalid_input(field, "must be a non-empty string")),
        }
    };
    let name = text("name")?;
    if !valid_name(&name) {
        return Err(invalid_input("name", "must be a valid hostname"));
    }
    let server_type = text("server_type")?;
    if !SERVER_TYPES.iter().any(|t| t.0 == server_type) {
        return Err(invalid_input("server_type", "server type not found"));
    }
    let image = text("image")?;
    if !IMAGES.contains(&image.as_str()) {
        return Err(invalid_input("image", "image not found"));
    }
    let location = match request.get("location") {
        None | Some(Value::Null) => "fsn1".to_owned(),
        Some(Value::String(l)) if LOCATIONS.contains(&l.as_str()) => l.clone(),
        Some(_) => return Err(invalid_input("location", "location not found")),
    };
    let labels = match request.get("labels") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(l) => check_labels(l)?,
    };
    let user_data = match request.get("user_data") {
        None | Some(Value::Null) => None,
        Some(Value::String(u)) if u.len() <= MAX_USER_DATA => Some(u.clone()),
        Some(_) => return Err(invalid_input("user_data", "is too long")),
    };
    let mut s = lock(&shared.state);
    if (s.servers.values()).any(|v| !v.gone && v.name == name) {
        return Err(error(
            409,
            "uniqueness_error",
            "server name is already used",
            json!({"fields": [{"name": "name"}]}),
        ));
    }
    let live = s.servers.values().filter(|v| !v.gone).count();
    if live >= s.options.server_limit {
        return Err(error(
            403,
            "resource_limit_exceeded",
            "server limit exceeded",
            json!({"limits": [{"name": "server_limit"}]}),
        ));
    }
    s.next_id += 1;
    let id = s.next_id;
    let boot = s.options.boot;
    let fails = (!s.failing.is_empty()).then(|| (Instant::now() + boot, s.failing.remove(0)));
    let server = Server {
        id,
        name,
        server_type,
        image,
        location,
        labels,
        user_data,
        made: Instant::now(),
        created: now_rfc3339(),
        fails: fails.clone(),
        deleted_at: None,
        gone: false,
    };
    s.servers.insert(id, server);
    let action = s.action("create_server", id, boot);
    if let Some((_, message)) = fails
        && let Some(a) = s.actions.get_mut(&action)
    {
        a.error = Some(message);
    }
    let start = s.action("start_server", id, boot);
    let view = s.view(&s.servers[&id]);
    Ok(json!({
        "server": view,
        "action": s.action_view(action),
        "next_actions": [s.action_view(start)],
        "root_password": null,
    }))
}

/// The live server `id`, or the API's `404`.
fn server_id(raw: &str) -> Result<u64, Answer> {
    raw.parse::<u64>()
        .map_err(|_| invalid_input("id", "must be an integer"))
}

fn not_found(id: u64) -> Answer {
    error(
        404,
        "not_found",
        &format!("server with ID '{id}' not found"),
        Value::Null,
    )
}

async fn get_server(
    State(shared): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Err(a) = admit(&shared, &headers, "servers.get") {
        return a.into_response();
    }
    let id = match server_id(&id) {
        Ok(id) => id,
        Err(a) => return answer(&shared, a),
    };
    let s = lock(&shared.state);
    let answer = match s.servers.get(&id).filter(|v| !v.gone) {
        Some(v) => Answer::json(200, &json!({"server": s.view(v)})),
        None => not_found(id),
    };
    s.rate_headers(answer).into_response()
}

async fn update(
    State(shared): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    if let Err(a) = admit(&shared, &headers, "servers.update") {
        return a.into_response();
    }
    let result = (|| {
        let id = server_id(&id)?;
        let request: Value = serde_json::from_slice(&body).map_err(|e| {
            error(
                400,
                "json_error",
                &format!("invalid JSON: {e}"),
                Value::Null,
            )
        })?;
        let labels = match request.get("labels") {
            None | Some(Value::Null) => None,
            Some(l) => Some(check_labels(l)?),
        };
        let name = match request.get("name") {
            None | Some(Value::Null) => None,
            Some(Value::String(n)) if valid_name(n) => Some(n.clone()),
            Some(_) => return Err(invalid_input("name", "must be a valid hostname")),
        };
        let mut s = lock(&shared.state);
        if s.servers.get(&id).is_none_or(|v| v.gone) {
            return Err(not_found(id));
        }
        if let Some(n) = &name
            && (s.servers.values()).any(|v| !v.gone && v.id != id && &v.name == n)
        {
            return Err(error(
                409,
                "uniqueness_error",
                "server name is already used",
                json!({"fields": [{"name": "name"}]}),
            ));
        }
        let server = s.servers.get_mut(&id).ok_or_else(|| not_found(id))?;
        if let Some(labels) = labels {
            server.labels = labels;
        }
        if let Some(n) = name {
            server.name = n;
        }
        let view = s.view(&s.servers[&id]);
        Ok(json!({"server": view}))
    })();
    reply(&shared, 200, result)
}

async fn delete(
    State(shared): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Err(a) = admit(&shared, &headers, "servers.delete") {
        return a.into_response();
    }
    let result = (|| {
        let id = server_id(&id)?;
        let mut s = lock(&shared.state);
        let deletion = s.options.deletion;
        let server = (s.servers.get_mut(&id))
            .filter(|v| !v.gone)
            .ok_or_else(|| not_found(id))?;
        if server.deleted_at.is_none() {
            server.deleted_at = Some(Instant::now());
        }
        let action = s.action("delete_server", id, deletion);
        Ok(json!({"action": s.action_view(action)}))
    })();
    if result.is_ok() {
        shared.knobs.held("servers.delete").await;
    }
    reply(&shared, 200, result)
}

async fn get_action(
    State(shared): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Err(a) = admit(&shared, &headers, "actions.get") {
        return a.into_response();
    }
    let s = lock(&shared.state);
    let answer = match id
        .parse::<u64>()
        .ok()
        .filter(|id| s.actions.contains_key(id))
    {
        Some(id) => Answer::json(200, &json!({"action": s.action_view(id)})),
        None => error(
            404,
            "not_found",
            &format!("action with ID '{id}' not found"),
            Value::Null,
        ),
    };
    s.rate_headers(answer).into_response()
}

async fn not_found_route(State(shared): State<Shared>) -> Response {
    answer(&shared, error(404, "not_found", "not found", Value::Null))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_selectors_parse_as_documented() {
        assert_eq!(
            parse_selector("env=production,type!=database").unwrap(),
            [
                Term::Eq("env".into(), "production".into()),
                Term::Ne("type".into(), "database".into())
            ]
        );
        assert_eq!(
            parse_selector("env in (testing,staging),!type,k").unwrap(),
            [
                Term::In("env".into(), vec!["testing".into(), "staging".into()]),
                Term::HasNot("type".into()),
                Term::Has("k".into())
            ]
        );
        assert_eq!(
            parse_selector("a==b").unwrap(),
            [Term::Eq("a".into(), "b".into())]
        );
        assert!(parse_selector("k in testing").is_err());
        assert!(parse_selector("-bad").is_err());
        let labels: BTreeMap<String, String> = [("env".to_owned(), "staging".to_owned())].into();
        assert!(matches(
            &labels,
            &parse_selector("env in (testing,staging)").unwrap()
        ));
        assert!(!matches(
            &labels,
            &parse_selector("env notin (staging)").unwrap()
        ));
        assert!(matches(&labels, &parse_selector("!type").unwrap()));
    }

    #[test]
    fn labels_follow_the_documented_rules() {
        for key in ["berth-pool", "example.com/my", "a", "A.b_c-1"] {
            assert!(valid_key(key), "{key}");
        }
        for key in ["-a", "a-", "", "hetzner.cloud/x", &"k".repeat(64), "a b"] {
            assert!(!valid_key(key), "{key}");
        }
        for value in ["", "x", "n-00000000000000ab", &"v".repeat(63)] {
            assert!(valid_value(value), "{value}");
        }
        for value in ["-x", "x_", "a/b", &"v".repeat(64), "My Pool"] {
            assert!(!valid_value(value), "{value}");
        }
        assert!(valid_name("n-00000000000000ab"));
        assert!(!valid_name("under_score"));
    }

    #[test]
    fn the_bucket_refills_one_request_per_second_at_3600_an_hour() {
        let mut s = Project {
            options: Options {
                rate_limit: 3600,
                ..Options::default()
            },
            servers: BTreeMap::new(),
            actions: BTreeMap::new(),
            next_id: 0,
            remaining: 2.0,
            filled: Instant::now(),
            failing: Vec::new(),
        };
        assert!(s.take_request().is_ok());
        assert!(s.take_request().is_ok());
        assert_eq!(s.take_request(), Err(1));
        let headers = s.rate_headers(Answer::json(200, &json!({}))).headers;
        let get = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(get("ratelimit-limit").as_deref(), Some("3600"));
        assert_eq!(get("ratelimit-remaining").as_deref(), Some("0"));
        let reset: u64 = get("ratelimit-reset").unwrap().parse().unwrap();
        assert!(reset >= unix_now() + 3599, "{reset}");
    }

    #[test]
    fn times_are_written_as_the_api_writes_them() {
        let t = now_rfc3339();
        assert_eq!(t.len(), 25, "{t}");
        assert!(t.ends_with("+00:00") && t.as_bytes()[10] == b'T', "{t}");
    }
}
