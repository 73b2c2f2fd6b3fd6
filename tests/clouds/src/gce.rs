//! A fake Google Compute Engine, written from the public Compute Engine API
//! reference (v1): `instances` (insert, bulkInsert, get, list,
//! aggregatedList, delete, setLabels) and `zoneOperations` (get, wait),
//! with Google's error model, behind a bearer token a [`TokenCheck`]
//! vouches for. tests/clouds/gce.md lists the pages followed, the
//! operation names [`Knobs`] counts, and what is left out.
//!
//! Time drives it: an instance is `PROVISIONING`, then `STAGING`, then
//! `RUNNING` over [`GceConfig::boot`]; an operation is `PENDING`, `RUNNING`,
//! then `DONE` after [`GceConfig::operation`]; a deleted instance is
//! `STOPPING` for [`GceConfig::stop`], then gone.

mod filter;
mod model;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::common::{Answer, Knobs, Machine, Served, TokenCheck, bearer, lock};
use model::{Inst, Op, OpError, Refusal, World};

/// The base of every link the cloud writes (`selfLink`, `zone`, …).
pub const LINK_BASE: &str = "https://www.googleapis.com/compute/v1";

/// The operation names [`Knobs`] counts, injects and holds answers of.
pub const OPERATIONS: [&str; 9] = [
    "instances.insert",
    "instances.bulkInsert",
    "instances.get",
    "instances.list",
    "instances.aggregatedList",
    "instances.delete",
    "instances.setLabels",
    "zoneOperations.get",
    "zoneOperations.wait",
];

/// How the fake cloud behaves.
#[derive(Clone, Debug)]
pub struct GceConfig {
    /// The one project it serves; any other is not found.
    pub project: String,
    /// The zones it has.
    pub zones: Vec<String>,
    /// From insert to `RUNNING` (`PROVISIONING` the first half, `STAGING`
    /// the second).
    pub boot: Duration,
    /// How long an operation takes to be `DONE`.
    pub operation: Duration,
    /// How long a deleted instance shows `STOPPING` before it is gone.
    pub stop: Duration,
    /// The longest `zoneOperations.wait` holds a request (2 minutes at
    /// Google).
    pub wait_max: Duration,
    /// The regional `INSTANCES` quota.
    pub quota_instances: u64,
    /// The regional `CPUS` quota.
    pub quota_cpus: u64,
    /// Calls a second before `403 rateLimitExceeded`; `None`: no limit.
    pub rate_limit: Option<u32>,
    /// The `user` operations name.
    pub user: String,
}

impl Default for GceConfig {
    fn default() -> GceConfig {
        GceConfig {
            project: "berth-test-project".into(),
            zones: vec!["us-central1-a".into(), "us-central1-b".into()],
            boot: Duration::from_millis(300),
            operation: Duration::from_millis(100),
            stop: Duration::from_millis(300),
            wait_max: Duration::from_secs(5),
            quota_instances: 1000,
            quota_cpus: 4000,
            rate_limit: None,
            user: "berth@berth-test-project.iam.gserviceaccount.com".into(),
        }
    }
}

struct Shared {
    cfg: GceConfig,
    knobs: Knobs,
    tokens: TokenCheck,
    world: Mutex<World>,
    seen: Mutex<Vec<Seen>>,
}

/// A call the cloud answered with success, as a test reads it back.
#[derive(Clone, Debug)]
pub struct Seen {
    /// The operation's name ([`OPERATIONS`]).
    pub op: &'static str,
    /// Its query parameters (`requestId`, `filter`, `maxResults`,
    /// `pageToken`, …).
    pub query: BTreeMap<String, String>,
    /// The instance its path names, if any.
    pub instance: Option<String>,
    /// A list's `nextPageToken`.
    pub next_page_token: Option<String>,
    /// An operation's name, as answered.
    pub operation: Option<String>,
    /// The `status` answered (an operation's, an instance's).
    pub status: Option<String>,
}

/// Notes a call answered with `answer`.
fn record(
    s: &Shared,
    op: &'static str,
    q: &HashMap<String, String>,
    instance: Option<&str>,
    answer: &Value,
) {
    let text = |k: &str| answer[k].as_str().map(str::to_owned);
    lock(&s.seen).push(Seen {
        op,
        query: q.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        instance: instance.map(str::to_owned),
        next_page_token: text("nextPageToken"),
        operation: (answer["kind"] == "compute#operation")
            .then(|| text("name"))
            .flatten(),
        status: text("status"),
    });
}

/// The fake Compute Engine, serving on 127.0.0.1:0 until dropped.
pub struct Gce {
    served: Served,
    shared: Arc<Shared>,
}

impl Gce {
    /// Serves `cfg`, taking the bearer tokens `tokens` vouches for.
    pub async fn start(cfg: GceConfig, tokens: TokenCheck) -> Gce {
        let shared = Arc::new(Shared {
            world: Mutex::new(World::new(&cfg)),
            seen: Mutex::new(Vec::new()),
            cfg,
            knobs: Knobs::default(),
            tokens,
        });
        let zone = "/compute/v1/projects/{project}/zones/{zone}";
        let app = Router::new()
            .route(&format!("{zone}/instances"), post(insert).get(list))
            .route(&format!("{zone}/instances/bulkInsert"), post(bulk_insert))
            .route(
                &format!("{zone}/instances/{{instance}}"),
                get(get_instance).delete(delete),
            )
            .route(
                &format!("{zone}/instances/{{instance}}/setLabels"),
                post(set_labels),
            )
            .route(&format!("{zone}/operations/{{operation}}"), get(operation))
            .route(&format!("{zone}/operations/{{operation}}/wait"), post(wait))
            .route(
                "/compute/v1/projects/{project}/aggregated/instances",
                get(aggregated_list),
            )
            .fallback(|| async {
                refuse(&Refusal::new(
                    404,
                    "notFound",
                    "The requested URL was not found on this server.",
                ))
            })
            .with_state(shared.clone());
        Gce {
            served: Served::start(app).await,
            shared,
        }
    }

    /// `http://127.0.0.1:PORT`; the API is under `/compute/v1`.
    pub fn url(&self) -> String {
        self.served.url()
    }

    pub fn addr(&self) -> SocketAddr {
        self.served.addr
    }

    pub fn config(&self) -> &GceConfig {
        &self.shared.cfg
    }

    /// Calls counted by operation ([`OPERATIONS`]), injected and held
    /// answers, the list lag.
    pub fn knobs(&self) -> &Knobs {
        &self.shared.knobs
    }

    fn world(&self) -> std::sync::MutexGuard<'_, World> {
        let mut w = lock(&self.shared.world);
        w.settle(&self.shared.cfg, Instant::now());
        w
    }

    /// Every call answered with success so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        lock(&self.shared.seen).clone()
    }

    /// The request ids the cloud took, each with the operation it started:
    /// its kind and the instance it made or acted on (none for a bulk
    /// insert, or an insert that made nothing).
    pub fn request_ids(&self) -> Vec<(String, &'static str, Option<String>)> {
        let w = self.world();
        let mut all: Vec<(String, &'static str, Option<String>)> = (w.requests.iter())
            .filter_map(|(id, name)| {
                let op = w.ops.get(name)?;
                let made = op.target_id.map(|_| op.target.clone());
                Some((id.clone(), op.kind, made))
            })
            .collect();
        all.sort();
        all
    }

    /// The cloud's own record: every instance it ever made, deleted ones
    /// marked, labels as stored.
    pub fn machines(&self) -> Vec<Machine> {
        let now = Instant::now();
        let w = self.world();
        (w.instances.iter())
            .map(|i| Machine {
                id: i.id.to_string(),
                name: i.name.clone(),
                tags: i.labels.clone(),
                status: if i.deleted {
                    "DELETED".into()
                } else {
                    i.status(&self.shared.cfg, now).into()
                },
                deleted: i.deleted,
            })
            .collect()
    }

    /// The regional `INSTANCES` and `CPUS` quotas from now on.
    pub fn set_quota(&self, instances: u64, cpus: u64) {
        let mut w = self.world();
        w.quota_instances = instances;
        w.quota_cpus = cpus;
    }

    /// Whether the zones have run out of `machine_type`: inserts of it end
    /// in `ZONE_RESOURCE_POOL_EXHAUSTED`, bulk inserts are refused `503`.
    pub fn exhaust(&self, machine_type: &str, exhausted: bool) {
        let mut w = self.world();
        if exhausted {
            w.exhausted.insert(machine_type.to_owned());
        } else {
            w.exhausted.remove(machine_type);
        }
    }

    /// The next `times` inserts' operations end `DONE` with the error
    /// `code` (`QUOTA_EXCEEDED`, `ZONE_RESOURCE_POOL_EXHAUSTED`, …) and
    /// `message`, making nothing.
    pub fn fail_inserts(&self, times: usize, code: &str, message: &str) {
        let mut w = self.world();
        for _ in 0..times {
            w.fail_inserts.push_back(OpError {
                code: code.to_owned(),
                message: message.to_owned(),
                details: None,
                http: (400, "BAD REQUEST"),
            });
        }
    }

    /// The next `times` instances made fail to start: their boot ends
    /// `TERMINATED` with `message` as `statusMessage`.
    pub fn fail_boots(&self, times: usize, message: &str) {
        let mut w = self.world();
        w.fail_boots
            .extend(std::iter::repeat_n(message.to_owned(), times));
    }

    /// Stops instance `name` as a guest shutdown or a preemption does:
    /// `TERMINATED` with `message` as `statusMessage`. Whether it existed.
    pub fn stop(&self, name: &str, message: &str) -> bool {
        let mut w = self.world();
        match (w.instances.iter_mut()).find(|i| !i.deleted && i.name == name) {
            Some(i) => {
                i.stopped = Some(message.to_owned());
                true
            }
            None => false,
        }
    }

    /// Calls a second before `403 rateLimitExceeded`; `None` lifts it.
    pub fn set_rate_limit(&self, per_second: Option<u32>) {
        self.world().rate_limit = per_second;
    }
}

/// Google's error body (`{"error": {"code", "message", "errors": [{message,
/// domain, reason}], "status"}}`) as an answer, for tests to inject.
pub fn google_error(status: u16, reason: &str, message: &str) -> Answer {
    let domain = match reason {
        "rateLimitExceeded" | "userRateLimitExceeded" | "quotaExceeded" => "usageLimits",
        _ => "global",
    };
    let grpc = match status {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        409 => "ALREADY_EXISTS",
        412 => "FAILED_PRECONDITION",
        429 => "RESOURCE_EXHAUSTED",
        503 => "UNAVAILABLE",
        500..=599 => "INTERNAL",
        _ => "UNKNOWN",
    };
    Answer::json(
        status,
        &json!({
            "error": {
                "code": status,
                "message": message,
                "errors": [{"message": message, "domain": domain, "reason": reason}],
                "status": grpc,
            }
        }),
    )
}

fn refusal(r: &Refusal) -> Answer {
    google_error(r.status, r.reason, &r.message)
}

fn refuse(r: &Refusal) -> Response {
    refusal(r).into_response()
}

fn ok(v: &Value) -> Response {
    Answer::json(200, v).into_response()
}

/// What every call does first: counts it (an injected answer stands in for
/// it), checks the caller's token, the rate limit, the project and zone.
fn enter(
    s: &Shared,
    op: &str,
    headers: &HeaderMap,
    project: &str,
    zone: Option<&str>,
) -> Result<(), Answer> {
    if let Some(answer) = s.knobs.enter(op) {
        return Err(answer);
    }
    let checked = match bearer(headers) {
        Some(token) => (s.tokens)(token),
        None => Err("no bearer token".into()),
    };
    if checked.is_err() {
        let message = "Request had invalid authentication credentials. Expected OAuth 2 access \
                       token, login cookie or other valid authentication credential. See \
                       https://developers.google.com/identity/sign-in/web/devconsole-project.";
        let body = json!({
            "error": {
                "code": 401,
                "message": message,
                "errors": [{
                    "message": "Invalid Credentials",
                    "domain": "global",
                    "reason": "authError",
                    "location": "Authorization",
                    "locationType": "header",
                }],
                "status": "UNAUTHENTICATED",
            }
        });
        let answer = Answer::json(401, &body).with_header(
            "www-authenticate",
            "Bearer realm=\"https://accounts.google.com/\", error=\"invalid_token\"",
        );
        return Err(answer);
    }
    if lock(&s.world).over_rate(Instant::now()) {
        return Err(google_error(
            403,
            "rateLimitExceeded",
            "Rate Limit Exceeded",
        ));
    }
    if project != s.cfg.project {
        return Err(refusal(&Refusal::not_found(&format!("projects/{project}"))));
    }
    if let Some(zone) = zone
        && !s.cfg.zones.iter().any(|z| z == zone)
    {
        return Err(refusal(&Refusal::not_found(&format!(
            "projects/{project}/zones/{zone}"
        ))));
    }
    Ok(())
}

/// The world, its finished deletes settled.
fn world(s: &Shared) -> std::sync::MutexGuard<'_, World> {
    let mut w = lock(&s.world);
    w.settle(&s.cfg, Instant::now());
    w
}

fn body_json(body: &Bytes) -> Result<Value, Answer> {
    match serde_json::from_slice::<Value>(body) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) | Err(_) => Err(refusal(&Refusal::new(
            400,
            "parseError",
            "Invalid JSON payload received.",
        ))),
    }
}

/// The `requestId` of a mutating call, checked; an operation it started
/// already, if any.
fn request_id(
    s: &Shared,
    q: &HashMap<String, String>,
) -> Result<(Option<String>, Option<Value>), Answer> {
    let Some(id) = q.get("requestId").filter(|id| !id.is_empty()) else {
        return Ok((None, None));
    };
    model::check_request_id(id).map_err(|r| refusal(&r))?;
    let w = world(s);
    let before = (w.requests.get(id))
        .and_then(|name| w.ops.get(name))
        .map(|op| op.json(&s.cfg, Instant::now()));
    Ok((Some(id.clone()), before))
}

/// Records a new operation, and the request id that started it.
fn new_op(
    s: &Shared,
    w: &mut World,
    zone: &str,
    kind: &'static str,
    target: (&str, Option<u64>),
    errors: Vec<OpError>,
    request_id: Option<String>,
) -> Value {
    let started_at = SystemTime::now();
    let op = Op {
        id: w.id(),
        name: model::operation_name(started_at),
        zone: zone.to_owned(),
        kind,
        target: target.0.to_owned(),
        target_id: target.1,
        started: Instant::now(),
        started_at,
        errors,
        request_id: request_id.clone(),
        bulk: None,
    };
    let shown = op.json(&s.cfg, Instant::now());
    if let Some(id) = request_id {
        w.requests.insert(id, op.name.clone());
    }
    w.ops.insert(op.name.clone(), op);
    shown
}

/// What a create asks for, checked as the cloud checks it.
struct Asked {
    machine_type: String,
    cpus: u32,
    labels: BTreeMap<String, String>,
    metadata: Vec<(String, String)>,
    asked: Value,
}

/// Checks the properties of an instance to make (`instances.insert`'s
/// body, or `bulkInsert`'s `instanceProperties`).
fn check_properties(s: &Shared, zone: &str, props: &Value, prefix: &str) -> Result<Asked, Refusal> {
    let mt = props["machineType"].as_str().ok_or_else(|| {
        Refusal::new(
            400,
            "required",
            format!("Required field '{prefix}machineType' not specified"),
        )
    })?;
    let (machine_type, cpus) = model::machine_type(mt, zone)?;
    let disks = props["disks"].as_array().cloned().unwrap_or_default();
    let boot: Vec<&Value> = disks
        .iter()
        .filter(|d| d["boot"].as_bool().unwrap_or(false))
        .collect();
    let [boot] = boot.as_slice() else {
        return Err(Refusal::invalid(format!(
            "Invalid value for field '{prefix}disks': ''. Exactly one boot disk must be specified."
        )));
    };
    match boot["initializeParams"]["sourceImage"].as_str() {
        Some(image) => model::check_image(&s.cfg.project, image)?,
        None => {
            return Err(Refusal::invalid(format!(
                "Invalid value for field '{prefix}disks[0].initializeParams.sourceImage': ''. \
                 A source image must be specified for a new boot disk."
            )));
        }
    }
    if (props["networkInterfaces"].as_array()).is_none_or(Vec::is_empty) {
        return Err(Refusal::invalid(format!(
            "Invalid value for field '{prefix}networkInterfaces': ''. At least one network \
             interface is required."
        )));
    }
    let labels = model::read_labels(&props["labels"], &format!("{prefix}labels"))?;
    model::check_labels(&labels)?;
    let metadata = model::read_metadata(&props["metadata"])?;
    let mut asked = props.clone();
    if let Some(m) = asked.as_object_mut() {
        for k in ["name", "labels", "metadata", "machineType"] {
            m.remove(k);
        }
    }
    Ok(Asked {
        machine_type,
        cpus,
        labels,
        metadata,
        asked,
    })
}

/// A new instance from `asked`, `PROVISIONING` from now.
fn make(w: &mut World, zone: &str, name: &str, asked: &Asked) -> u64 {
    let id = w.id();
    let boot_failure = w.fail_boots.pop_front();
    w.instances.push(Inst {
        id,
        name: name.to_owned(),
        zone: zone.to_owned(),
        machine_type: asked.machine_type.clone(),
        cpus: asked.cpus,
        label_fingerprint: model::labels_fingerprint(&asked.labels),
        labels: asked.labels.clone(),
        metadata: asked.metadata.clone(),
        created: Instant::now(),
        created_at: SystemTime::now(),
        boot_failure,
        stopped: None,
        deleting: None,
        deleted: false,
        asked: asked.asked.clone(),
    });
    id
}

fn already_exists(project: &str, zone: &str, name: &str) -> Refusal {
    Refusal::new(
        409,
        "alreadyExists",
        format!("The resource 'projects/{project}/zones/{zone}/instances/{name}' already exists"),
    )
}

async fn insert(
    State(s): State<Arc<Shared>>,
    Path((project, zone)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    const OP: &str = "instances.insert";
    if let Err(r) = enter(&s, OP, &headers, &project, Some(&zone)) {
        return r.into_response();
    }
    let (request, before) = match request_id(&s, &q) {
        Ok(r) => r,
        Err(r) => return r.into_response(),
    };
    if let Some(op) = before {
        // The same request again: its operation, nothing more made.
        record(&s, OP, &q, None, &op);
        s.knobs.held(OP).await;
        return ok(&op);
    }
    let body = match body_json(&body) {
        Ok(b) => b,
        Err(r) => return r.into_response(),
    };
    let Some(name) = body["name"].as_str().map(str::to_owned) else {
        return refuse(&Refusal::new(
            400,
            "required",
            "Required field 'resource.name' not specified",
        ));
    };
    let op = {
        let checked = model::check_name("resource.name", &name)
            .and_then(|()| check_properties(&s, &zone, &body, "resource."));
        let asked = match checked {
            Ok(a) => a,
            Err(r) => return refuse(&r),
        };
        let now = Instant::now();
        let mut w = world(&s);
        if w.live(&zone, &name).is_some() {
            return refuse(&already_exists(&project, &zone, &name));
        }
        let failure = match w.fail_inserts.pop_front() {
            Some(e) => Some(e),
            None if w.exhausted.contains(&asked.machine_type) => {
                Some(model::capacity_error(&project, &zone))
            }
            None => w.quota_error(&s.cfg, &zone, 1, asked.cpus, now),
        };
        match failure {
            Some(e) => new_op(&s, &mut w, &zone, "insert", (&name, None), vec![e], request),
            None => {
                let id = make(&mut w, &zone, &name, &asked);
                new_op(
                    &s,
                    &mut w,
                    &zone,
                    "insert",
                    (&name, Some(id)),
                    vec![],
                    request,
                )
            }
        }
    };
    record(&s, OP, &q, Some(&name), &op);
    s.knobs.held(OP).await;
    ok(&op)
}

async fn bulk_insert(
    State(s): State<Arc<Shared>>,
    Path((project, zone)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    const OP: &str = "instances.bulkInsert";
    if let Err(r) = enter(&s, OP, &headers, &project, Some(&zone)) {
        return r.into_response();
    }
    let (request, before) = match request_id(&s, &q) {
        Ok(r) => r,
        Err(r) => return r.into_response(),
    };
    if let Some(op) = before {
        record(&s, OP, &q, None, &op);
        s.knobs.held(OP).await;
        return ok(&op);
    }
    let body = match body_json(&body) {
        Ok(b) => b,
        Err(r) => return r.into_response(),
    };
    let op = match bulk_make(&s, &project, &zone, &body, request) {
        Ok(op) => op,
        Err(r) => return refuse(&r),
    };
    record(&s, OP, &q, None, &op);
    s.knobs.held(OP).await;
    ok(&op)
}

/// Reads a count given as a string (int64 format) or a number.
fn count_of(v: &Value, field: &str) -> Result<Option<u64>, Refusal> {
    match v {
        Value::Null => Ok(None),
        Value::String(t) => t
            .parse()
            .map(Some)
            .map_err(|_| Refusal::invalid(format!("Invalid value for field '{field}': '{t}'."))),
        Value::Number(n) => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| Refusal::invalid(format!("Invalid value for field '{field}': '{n}'."))),
        _ => Err(Refusal::invalid(format!(
            "Invalid value for field '{field}'."
        ))),
    }
}

fn bulk_make(
    s: &Shared,
    project: &str,
    zone: &str,
    body: &Value,
    request: Option<String>,
) -> Result<Value, Refusal> {
    if body.get("sourceInstanceTemplate").is_some() {
        return Err(Refusal::invalid(
            "Invalid value for field 'bulkInsertInstanceResource.sourceInstanceTemplate': \
             instance templates are not supported by this server.",
        ));
    }
    let count = count_of(&body["count"], "bulkInsertInstanceResource.count")?.ok_or_else(|| {
        Refusal::new(
            400,
            "required",
            "Required field 'bulkInsertInstanceResource.count' not specified",
        )
    })?;
    let min = count_of(&body["minCount"], "bulkInsertInstanceResource.minCount")?.unwrap_or(count);
    if count == 0 || count > 1000 || min > count {
        return Err(Refusal::invalid(format!(
            "Invalid value for field 'bulkInsertInstanceResource': count {count} and minCount \
             {min}: count must be 1 to 1000 and minCount at most count."
        )));
    }
    let props = &body["instanceProperties"];
    if !props.is_object() {
        return Err(Refusal::new(
            400,
            "required",
            "Required field 'bulkInsertInstanceResource.instanceProperties' not specified",
        ));
    }
    let asked = check_properties(
        s,
        zone,
        props,
        "bulkInsertInstanceResource.instanceProperties.",
    )?;
    let now = Instant::now();
    let mut w = world(s);
    let names: Vec<String> = match (
        body["namePattern"].as_str(),
        body["perInstanceProperties"].as_object(),
    ) {
        (Some(_), Some(_)) | (None, None) => {
            return Err(Refusal::invalid(
                "Invalid value for field 'bulkInsertInstanceResource': either namePattern or \
                 perInstanceProperties must be set, not both.",
            ));
        }
        (None, Some(per)) => {
            if per.len() as u64 != count {
                return Err(Refusal::invalid(format!(
                    "Invalid value for field 'bulkInsertInstanceResource.perInstanceProperties': \
                     {} names for a count of {count}.",
                    per.len()
                )));
            }
            for (key, p) in per {
                if p["name"].as_str().is_some_and(|n| n != key) {
                    return Err(Refusal::invalid(format!(
                        "Invalid value for field 'bulkInsertInstanceResource.perInstanceProperties': \
                         the name of '{key}' differs from its key."
                    )));
                }
            }
            per.keys().cloned().collect()
        }
        (Some(pattern), None) => pattern_names(&w, zone, pattern, count)?,
    };
    for name in &names {
        model::check_name("bulkInsertInstanceResource.perInstanceProperties", name)?;
        if w.live(zone, name).is_some() {
            return Err(already_exists(project, zone, name));
        }
    }
    if w.exhausted.contains(&asked.machine_type) {
        return Err(Refusal::new(
            503,
            "insufficientCapacity",
            format!(
                "The zone 'projects/{project}/zones/{zone}' does not have enough resources \
                 available to fulfill the request.  Try a different zone, or try again later."
            ),
        ));
    }
    let fit = w.fitting(&s.cfg, zone, count, asked.cpus, now);
    if fit < min {
        let e = w
            .quota_error(&s.cfg, zone, min, asked.cpus, now)
            .map_or_else(|| "Quota exceeded.".to_owned(), |e| e.message);
        return Err(Refusal::new(403, "quotaExceeded", e));
    }
    let made = fit.min(count);
    for name in names.iter().take(made as usize) {
        make(&mut w, zone, name, &asked);
    }
    let mut shown = new_op(s, &mut w, zone, "bulkInsert", ("", None), vec![], request);
    let metadata = json!({
        "perLocationStatus": {
            format!("zones/{zone}"): {
                "status": if made == count { "FULFILLED" } else { "PARTIALLY_FULFILLED" },
                "targetVmCount": count,
                "createdVmCount": made,
                "failedToCreateVmCount": count - made,
                "deletedVmCount": 0,
            }
        }
    });
    if let Some(name) = shown["name"].as_str()
        && let Some(op) = w.ops.get_mut(name)
    {
        op.bulk = Some(metadata.clone());
    }
    shown["instancesBulkInsertOperationMetadata"] = metadata;
    Ok(shown)
}

/// Names for `namePattern` (`inst-####`): numbered after the biggest
/// existing match.
fn pattern_names(w: &World, zone: &str, pattern: &str, count: u64) -> Result<Vec<String>, Refusal> {
    let start = pattern.find('#');
    let (Some(start), hashes) = (start, pattern.matches('#').count()) else {
        return Err(Refusal::invalid(format!(
            "Invalid value for field 'bulkInsertInstanceResource.namePattern': '{pattern}'. It \
             must contain one sequence of #."
        )));
    };
    let (prefix, suffix) = (&pattern[..start], &pattern[start + hashes..]);
    if !pattern[start..start + hashes].bytes().all(|b| b == b'#') || hashes > 18 {
        return Err(Refusal::invalid(format!(
            "Invalid value for field 'bulkInsertInstanceResource.namePattern': '{pattern}'. The \
             # must be one continuous sequence of at most 18."
        )));
    }
    let biggest = (w.instances.iter())
        .filter(|i| !i.deleted && i.zone == zone)
        .filter_map(|i| {
            let digits = i.name.strip_prefix(prefix)?.strip_suffix(suffix)?;
            (digits.len() == hashes).then(|| digits.parse::<u64>().ok())?
        })
        .max()
        .unwrap_or(0);
    Ok((1..=count)
        .map(|n| format!("{prefix}{:0width$}{suffix}", biggest + n, width = hashes))
        .collect())
}

async fn get_instance(
    State(s): State<Arc<Shared>>,
    Path((project, zone, name)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    const OP: &str = "instances.get";
    if let Err(r) = enter(&s, OP, &headers, &project, Some(&zone)) {
        return r.into_response();
    }
    let shown = {
        let w = world(&s);
        w.live(&zone, &name).map(|i| i.json(&s.cfg, Instant::now()))
    };
    if let Some(v) = &shown {
        record(&s, OP, &HashMap::new(), Some(&name), v);
    }
    s.knobs.held(OP).await;
    match shown {
        Some(v) => ok(&v),
        None => refuse(&Refusal::not_found(&format!(
            "projects/{project}/zones/{zone}/instances/{name}"
        ))),
    }
}

/// A page of `items` (sorted by zone, then name) after the page token in
/// `q`, as `maxResults` asks; and the next page's token.
fn page<'a>(
    items: Vec<&'a Inst>,
    q: &HashMap<String, String>,
) -> Result<(Vec<&'a Inst>, Option<String>), Refusal> {
    let max = match q.get("maxResults") {
        None => 500,
        Some(n) => match n.parse::<u32>() {
            Ok(0) => 500,
            Ok(n) if n <= 500 => n as usize,
            _ => {
                return Err(Refusal::invalid(format!(
                    "Invalid value for field 'maxResults': '{n}'. Must be less than or equal to 500"
                )));
            }
        },
    };
    let after = match q.get("pageToken").filter(|t| !t.is_empty()) {
        None => None,
        Some(token) => Some(decode_token(token).ok_or_else(|| {
            Refusal::invalid(format!("Invalid value for field 'pageToken': '{token}'"))
        })?),
    };
    let mut rest: Vec<&Inst> = items
        .into_iter()
        .filter(|i| {
            after
                .as_ref()
                .is_none_or(|(z, n)| (i.zone.as_str(), i.name.as_str()) > (z.as_str(), n.as_str()))
        })
        .collect();
    let more = rest.len() > max;
    rest.truncate(max);
    let next = match rest.last() {
        Some(last) if more => Some(encode_token(&last.zone, &last.name)),
        _ => None,
    };
    Ok((rest, next))
}

/// Page tokens are opaque to callers: the last zone and name shown, in
/// hex behind a marker.
fn encode_token(zone: &str, name: &str) -> String {
    let text = format!("{zone}/{name}");
    let hex: String = text.bytes().map(|b| format!("{b:02x}")).collect();
    format!("Cg{hex}")
}

fn decode_token(token: &str) -> Option<(String, String)> {
    let hex = token.strip_prefix("Cg")?;
    if hex.len() % 2 != 0 {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    let text = String::from_utf8(bytes?).ok()?;
    let (zone, name) = text.split_once('/')?;
    Some((zone.to_owned(), name.to_owned()))
}

/// The live instances of `zones` a list shows (the list lag applied) that
/// match the `filter` of `q`, sorted by zone and name.
fn listed<'a>(
    s: &Shared,
    w: &'a World,
    zones: &[&str],
    q: &HashMap<String, String>,
) -> Result<Vec<&'a Inst>, Refusal> {
    let f = filter::parse(q.get("filter").map_or("", String::as_str))
        .map_err(|e| Refusal::invalid(format!("Invalid list filter expression: {e}")))?;
    let now = Instant::now();
    let mut out: Vec<&Inst> = (w.instances.iter())
        .filter(|i| !i.deleted && zones.contains(&i.zone.as_str()))
        .filter(|i| s.knobs.listed(i.created))
        .filter(|i| {
            let id = i.id.to_string();
            f.matches(&filter::Fields {
                name: &i.name,
                id: &id,
                status: i.status(&s.cfg, now),
                machine_type: &i.machine_type,
                zone: &i.zone,
                labels: &i.labels,
            })
        })
        .collect();
    out.sort_by(|a, b| (&a.zone, &a.name).cmp(&(&b.zone, &b.name)));
    Ok(out)
}

async fn list(
    State(s): State<Arc<Shared>>,
    Path((project, zone)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    const OP: &str = "instances.list";
    if let Err(r) = enter(&s, OP, &headers, &project, Some(&zone)) {
        return r.into_response();
    }
    let answer = {
        let w = world(&s);
        let now = Instant::now();
        listed(&s, &w, &[zone.as_str()], &q)
            .and_then(|all| page(all, &q))
            .map(|(items, next)| {
                let mut v = json!({
                    "kind": "compute#instanceList",
                    "id": format!("projects/{project}/zones/{zone}/instances"),
                    "selfLink": format!("{LINK_BASE}/projects/{project}/zones/{zone}/instances"),
                });
                if !items.is_empty() {
                    v["items"] = items.iter().map(|i| i.json(&s.cfg, now)).collect();
                }
                if let Some(token) = next {
                    v["nextPageToken"] = token.into();
                }
                v
            })
    };
    if let Ok(v) = &answer {
        record(&s, OP, &q, None, v);
    }
    s.knobs.held(OP).await;
    match answer {
        Ok(v) => ok(&v),
        Err(r) => refuse(&r),
    }
}

async fn aggregated_list(
    State(s): State<Arc<Shared>>,
    Path(project): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    const OP: &str = "instances.aggregatedList";
    if let Err(r) = enter(&s, OP, &headers, &project, None) {
        return r.into_response();
    }
    let answer = {
        let w = world(&s);
        let now = Instant::now();
        let zones: Vec<&str> = s.cfg.zones.iter().map(String::as_str).collect();
        listed(&s, &w, &zones, &q)
            .and_then(|all| page(all, &q))
            .map(|(items, next)| {
                let mut scopes = serde_json::Map::new();
                for zone in &zones {
                    let here: Vec<Value> = (items.iter())
                        .filter(|i| i.zone == *zone)
                        .map(|i| i.json(&s.cfg, now))
                        .collect();
                    let scope = format!("zones/{zone}");
                    let shown = if here.is_empty() {
                        json!({"warning": {
                            "code": "NO_RESULTS_ON_PAGE",
                            "message": format!("There are no results for scope '{scope}' on this page."),
                            "data": [{"key": "scope", "value": scope}],
                        }})
                    } else {
                        json!({ "instances": here })
                    };
                    scopes.insert(scope, shown);
                }
                let mut v = json!({
                    "kind": "compute#instanceAggregatedList",
                    "id": format!("projects/{project}/aggregated/instances"),
                    "items": scopes,
                    "selfLink": format!("{LINK_BASE}/projects/{project}/aggregated/instances"),
                });
                if let Some(token) = next {
                    v["nextPageToken"] = token.into();
                }
                v
            })
    };
    if let Ok(v) = &answer {
        record(&s, OP, &q, None, v);
    }
    s.knobs.held(OP).await;
    match answer {
        Ok(v) => ok(&v),
        Err(r) => refuse(&r),
    }
}

async fn delete(
    State(s): State<Arc<Shared>>,
    Path((project, zone, name)): Path<(String, String, String)>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    const OP: &str = "instances.delete";
    if let Err(r) = enter(&s, OP, &headers, &project, Some(&zone)) {
        return r.into_response();
    }
    let (request, before) = match request_id(&s, &q) {
        Ok(r) => r,
        Err(r) => return r.into_response(),
    };
    let op = match before {
        Some(op) => op,
        None => {
            let mut w = world(&s);
            let Some(i) = w.live_mut(&zone, &name) else {
                return refuse(&Refusal::not_found(&format!(
                    "projects/{project}/zones/{zone}/instances/{name}"
                )));
            };
            // A delete of an instance already being deleted starts nothing
            // new; it answers an operation like the first.
            i.deleting.get_or_insert_with(Instant::now);
            let id = i.id;
            new_op(
                &s,
                &mut w,
                &zone,
                "delete",
                (&name, Some(id)),
                vec![],
                request,
            )
        }
    };
    record(&s, OP, &q, Some(&name), &op);
    s.knobs.held(OP).await;
    ok(&op)
}

async fn set_labels(
    State(s): State<Arc<Shared>>,
    Path((project, zone, name)): Path<(String, String, String)>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    const OP: &str = "instances.setLabels";
    if let Err(r) = enter(&s, OP, &headers, &project, Some(&zone)) {
        return r.into_response();
    }
    let (request, before) = match request_id(&s, &q) {
        Ok(r) => r,
        Err(r) => return r.into_response(),
    };
    let op = match before {
        Some(op) => op,
        None => {
            let body = match body_json(&body) {
                Ok(b) => b,
                Err(r) => return r.into_response(),
            };
            let labels = match model::read_labels(&body["labels"], "labels")
                .and_then(|l| model::check_labels(&l).map(|()| l))
            {
                Ok(l) => l,
                Err(r) => return refuse(&r),
            };
            let mut w = world(&s);
            let resource = format!("projects/{project}/zones/{zone}/instances/{name}");
            let Some(i) = w.live_mut(&zone, &name) else {
                return refuse(&Refusal::not_found(&resource));
            };
            if i.deleting.is_some() {
                return refuse(&Refusal::new(
                    400,
                    "resourceNotReady",
                    format!("The resource '{resource}' is not ready"),
                ));
            }
            match body["labelFingerprint"].as_str() {
                None => {
                    return refuse(&Refusal::new(
                        400,
                        "required",
                        "Required field 'labelFingerprint' not specified",
                    ));
                }
                Some(f) if f != i.label_fingerprint => {
                    return refuse(&Refusal::new(
                        412,
                        "conditionNotMet",
                        "Labels fingerprint either invalid or resource labels have changed",
                    ));
                }
                Some(_) => {}
            }
            i.label_fingerprint = model::labels_fingerprint(&labels);
            i.labels = labels;
            let id = i.id;
            new_op(
                &s,
                &mut w,
                &zone,
                "setLabels",
                (&name, Some(id)),
                vec![],
                request,
            )
        }
    };
    record(&s, OP, &q, Some(&name), &op);
    s.knobs.held(OP).await;
    ok(&op)
}

/// The operation `name` of `zone`, shown as of now.
fn find_op(s: &Shared, project: &str, zone: &str, name: &str) -> Result<(Value, Instant), Refusal> {
    let w = world(s);
    match w.ops.get(name).filter(|op| op.zone == zone) {
        Some(op) => Ok((op.json(&s.cfg, Instant::now()), op.done_at(&s.cfg))),
        None => Err(Refusal::not_found(&format!(
            "projects/{project}/zones/{zone}/operations/{name}"
        ))),
    }
}

async fn operation(
    State(s): State<Arc<Shared>>,
    Path((project, zone, name)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    const OP: &str = "zoneOperations.get";
    if let Err(r) = enter(&s, OP, &headers, &project, Some(&zone)) {
        return r.into_response();
    }
    let found = find_op(&s, &project, &zone, &name);
    if let Ok((v, _)) = &found {
        record(&s, OP, &HashMap::new(), None, v);
    }
    s.knobs.held(OP).await;
    match found {
        Ok((v, _)) => ok(&v),
        Err(r) => refuse(&r),
    }
}

/// `zoneOperations.wait`: answers once the operation is `DONE`, or when
/// [`GceConfig::wait_max`] has passed, whichever is first.
async fn wait(
    State(s): State<Arc<Shared>>,
    Path((project, zone, name)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    const OP: &str = "zoneOperations.wait";
    if let Err(r) = enter(&s, OP, &headers, &project, Some(&zone)) {
        return r.into_response();
    }
    let until = Instant::now() + s.cfg.wait_max;
    let shown = loop {
        match find_op(&s, &project, &zone, &name) {
            Err(r) => return refuse(&r),
            Ok((v, done_at)) => {
                if v["status"] == "DONE" || Instant::now() >= until {
                    break v;
                }
                let next = done_at
                    .min(until)
                    .max(Instant::now() + Duration::from_millis(1));
                tokio::time::sleep_until(next.into()).await;
            }
        }
    };
    record(&s, OP, &HashMap::new(), None, &shown);
    s.knobs.held(OP).await;
    ok(&shown)
}

#[cfg(test)]
mod tests;
