//! The simulated cloud's HTTP face: `/v1/*` is the cloud API (rate limited,
//! token checked, logged), `/sim/*` the control endpoints (none of that).

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use http::{HeaderValue, StatusCode, header};
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::{Instrument, debug, instrument, warn};

use super::machines::Port;
use super::state::{
    ApiError, Call, CallItem, CreateRequest, Created, DEFAULT_PAGE_SIZE, Endpoint, ListQuery,
    MAX_PAGE_SIZE, parse_id,
};
use super::{Instance, Knobs, SimCloud};

/// An instance's id from the path. By name, so that the same handlers
/// serve under `/c/{caller}` too, where the path has two parameters.
#[derive(serde::Deserialize)]
struct InstanceId {
    id: String,
}

pub(super) fn router(cloud: SimCloud) -> Router {
    let api = Router::new()
        .route("/v1/instances", post(create).get(list))
        .route("/v1/instances/{id}", get(get_instance).delete(delete))
        .route("/v1/instances/{id}/tags", put(set_tags))
        .route("/v1/limits", get(limits))
        .route("/v1/batch/create", post(batch_create))
        .route("/v1/batch/delete", post(batch_delete))
        // Added after the routes so it wraps exactly the cloud API.
        .layer(middleware::from_fn_with_state(cloud.clone(), gate));
    // The same API under `/c/NAME`: callers that share one cloud name
    // themselves in their endpoint, and the call record says who called.
    let api = Router::new().nest("/c/{caller}", api.clone()).merge(api);
    let control = Router::new()
        .route("/sim/knobs", get(get_knobs).put(put_knobs))
        .route("/sim/calls", get(calls))
        .route("/sim/instances", get(sim_instances))
        .route("/sim/instances/{id}/endpoint", put(set_endpoint))
        .route("/sim/reset", post(reset));
    api.merge(control)
        .fallback(|| async { error_response(ApiError::NotFound("no such route".to_owned())) })
        .with_state(cloud)
}

/// The one place an [`ApiError`] becomes a status, headers and body.
fn error_response(error: ApiError) -> Response {
    let (status, body) = error_body(&error);
    let mut response = (status, Json(body)).into_response();
    let headers = response.headers_mut();
    match &error {
        ApiError::RateLimited { retry_after_ms } => {
            // Whole seconds, rounded up and at least one, as `Retry-After` wants.
            let seconds = retry_after_ms.div_ceil(1000).max(1);
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        ApiError::Unauthorized => {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        _ => {}
    }
    response
}

/// An error's status and JSON body: what a call answers, and what one item
/// of a batch carries.
fn error_body(error: &ApiError) -> (StatusCode, Value) {
    let (status, code) = match error {
        ApiError::InvalidRequest(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
        ApiError::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized"),
        ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
        ApiError::QuotaExceeded { .. } => (StatusCode::FORBIDDEN, "quota_exceeded"),
        ApiError::InsufficientCapacity { .. } => {
            (StatusCode::SERVICE_UNAVAILABLE, "insufficient_capacity")
        }
        ApiError::RateLimited { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
        ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal_error"),
    };
    let mut body = json!({"error": {"code": code, "message": error.to_string()}});
    // The spec says the body "also has" these fields; they go both at the top
    // level and inside `error` so a client reading either place finds them.
    let extra = match error {
        ApiError::InsufficientCapacity { instance_type } => {
            Some(("instance_type", json!(instance_type)))
        }
        ApiError::RateLimited { retry_after_ms } => Some(("retry_after_ms", json!(retry_after_ms))),
        _ => None,
    };
    if let Some((key, value)) = extra {
        body["error"][key] = value.clone();
        body[key] = value;
    }
    (status, body)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        error_response(self)
    }
}

/// Wraps every cloud-API call: rate limit, then token, then the handler; and
/// logs the outcome. The rate limit comes first so that unauthorised calls
/// also spend tokens, as they would against a real cloud's front door.
async fn gate(State(cloud): State<SimCloud>, request: Request, next: Next) -> Response {
    let method = request.method().to_string();
    let path = request.uri().path().to_owned();
    let query = request.uri().query().map(str::to_owned);
    let caller = request
        .extensions()
        .get::<axum::extract::OriginalUri>()
        .and_then(|o| o.path().strip_prefix("/c/"))
        .and_then(|rest| rest.split('/').next())
        .map(str::to_owned);
    let span = tracing::debug_span!("sim_call", %method, %path, status = tracing::field::Empty);
    // Counted until recorded, or until the client goes away and the call
    // is dropped unanswered.
    let _in_flight = InFlight::begin(&cloud, caller.clone());
    let at_ms = cloud.now_ms();
    let admitted = {
        let authorization = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let mut state = cloud.lock();
        state
            .admit(at_ms)
            .and_then(|()| state.authorize(authorization))
    };
    let retry_after_ms = match &admitted {
        Err(ApiError::RateLimited { retry_after_ms }) => Some(*retry_after_ms),
        _ => None,
    };
    let response = match admitted {
        Ok(()) => next.run(request).instrument(span.clone()).await,
        Err(e) => {
            // Read what the client is sending before answering: a refusal
            // sent over an unread body makes the server drop the connection,
            // and a client still writing its body sees a reset instead of
            // the answer.
            let _ = axum::body::to_bytes(request.into_body(), 1 << 20).await;
            e.into_response()
        }
    };
    let status = response.status().as_u16();
    let items =
        (response.extensions().get::<ItemStatuses>()).map_or_else(Vec::new, |i| i.0.clone());
    span.record("status", status);
    span.in_scope(|| debug!(status, "cloud api call"));
    cloud.lock().record_call(Call {
        at_ms,
        method,
        path,
        query,
        status,
        retry_after_ms,
        caller,
        items,
    });
    response
}

/// A batch call's items, for the call record.
#[derive(Clone)]
struct ItemStatuses(Vec<CallItem>);

/// A call counted as come in and not yet recorded until dropped.
struct InFlight {
    cloud: SimCloud,
    caller: Option<String>,
}

impl InFlight {
    fn begin(cloud: &SimCloud, caller: Option<String>) -> InFlight {
        cloud.lock().call_came_in(&caller);
        InFlight {
            cloud: cloud.clone(),
            caller,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.cloud.lock().call_left(&self.caller);
    }
}

/// Parses a JSON body, turning any problem into `400 invalid_request` with our
/// error body (axum's own extractor would answer 422 with plain text).
fn parse_body<T: for<'de> Deserialize<'de>>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::InvalidRequest(format!("malformed body: {e}")))
}

/// Persists a change; a failure is reported as the call's failure so the
/// client does not believe in state that would not survive a restart.
async fn persist(
    cloud: &SimCloud,
    snapshot: Option<super::state_file::Snapshot>,
) -> Result<(), ApiError> {
    cloud.write_async(snapshot).await.map_err(|e| {
        warn!(error = %e, "writing sim state failed");
        ApiError::Internal(format!("writing sim state failed: {e}"))
    })
}

#[instrument(skip_all)]
async fn create(State(cloud): State<SimCloud>, body: Bytes) -> Result<Response, ApiError> {
    let request: CreateRequest = parse_body(&body)?;
    knob_delay(&cloud, |k| k.create_latency_ms).await;
    let created = create_one(&cloud, request)?;
    persist(
        &cloud,
        snapshot_if(&cloud, matches!(created, Created::New(_))),
    )
    .await?;
    knob_delay(&cloud, |k| k.create_answer_delay_ms).await;
    Ok(match created {
        Created::New(instance) => (StatusCode::CREATED, Json(instance)).into_response(),
        Created::Existing(instance) => (StatusCode::OK, Json(instance)).into_response(),
    })
}

/// Creates one instance (or finds the one its client token made), and
/// starts its machine. The caller writes the state file once a new one was
/// made (once for a whole batch).
fn create_one(cloud: &SimCloud, request: CreateRequest) -> Result<Created, ApiError> {
    let rolls: [f64; 2] = [rand::random(), rand::random()];
    let knobs = cloud.knobs();
    // A machine of its own to reach, once it is known to be new.
    let port = match &knobs.ssh_target {
        Some(_) => {
            Some(Port::take().map_err(|e| ApiError::Internal(format!("taking a port: {e}")))?)
        }
        None => None,
    };
    let created = {
        let now = cloud.now_ms();
        let endpoint = port.as_ref().map(|p| p.endpoint.clone());
        cloud.lock().create(request, now, rolls, endpoint)?
    };
    if let (Created::New(instance), Some(port), Some(target)) = (&created, port, knobs.ssh_target)
        && let Some(id) = parse_id(&instance.id)
    {
        let after = Duration::from_millis(knobs.boot_delay_ms + knobs.ssh_accept_delay_ms);
        cloud.shared.machines.start(id, port, after, target);
    }
    match &created {
        Created::New(instance) => {
            debug!(id = %instance.id, instance_type = %instance.instance_type, "created instance");
        }
        Created::Existing(instance) => {
            debug!(id = %instance.id, "create matched an existing client token");
        }
    }
    Ok(created)
}

/// Waits the milliseconds `knob` reads from the knobs, outside the lock,
/// so that other calls carry on meanwhile: a create's latency before it
/// makes anything, and its answer delay once its instances exist and are
/// stored (a caller that stops meanwhile never learns of them).
async fn knob_delay(cloud: &SimCloud, knob: impl Fn(&Knobs) -> u64) {
    let delay = knob(cloud.lock().knobs());
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
}

/// What the state file needs after creates, if one made a new instance.
fn snapshot_if(cloud: &SimCloud, made_new: bool) -> Option<super::state_file::Snapshot> {
    made_new.then(|| cloud.snapshot(&cloud.lock())).flatten()
}

/// Refuses a batch of `count` items that is empty or over [`MAX_BATCH`].
fn batch_size(count: usize, what: &str) -> Result<(), ApiError> {
    match count {
        1..=MAX_BATCH => Ok(()),
        _ => Err(ApiError::InvalidRequest(format!(
            "a batch takes 1 to {MAX_BATCH} {what}, got {count}"
        ))),
    }
}

/// One item's error in a batch: the status and body the call alone would
/// have answered, the status also in the body.
fn item_error(error: &ApiError) -> (StatusCode, Value) {
    let (status, mut body) = error_body(error);
    body["status"] = json!(status.as_u16());
    (status, body)
}

/// A batch call's answer, its items kept for the call record.
fn batch_answer(results: Vec<Value>, statuses: Vec<CallItem>) -> Response {
    let mut response = Json(json!({ "results": results })).into_response();
    response.extensions_mut().insert(ItemStatuses(statuses));
    response
}

/// Most items one batch call takes.
const MAX_BATCH: usize = 100;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchCreate {
    instances: Vec<CreateRequest>,
}

/// `POST /v1/batch/create`: each of `instances` created as `POST
/// /v1/instances` would, in one call (one rate-limit token, one create
/// latency). One result per item, in order: `{"instance": …}`, or the
/// error body the create alone would have answered with its `status`.
#[instrument(skip_all)]
async fn batch_create(State(cloud): State<SimCloud>, body: Bytes) -> Result<Response, ApiError> {
    let BatchCreate { instances } = parse_body(&body)?;
    batch_size(instances.len(), "instances")?;
    knob_delay(&cloud, |k| k.create_latency_ms).await;
    let mut results = Vec::with_capacity(instances.len());
    let mut statuses = Vec::with_capacity(instances.len());
    let mut changed = false;
    for request in instances {
        let (status, result, id) = match create_one(&cloud, request) {
            Ok(Created::New(i)) => {
                changed = true;
                let id = Some(i.id.clone());
                (StatusCode::CREATED, json!({ "instance": i }), id)
            }
            Ok(Created::Existing(i)) => {
                let id = Some(i.id.clone());
                (StatusCode::OK, json!({ "instance": i }), id)
            }
            Err(e) => {
                let (status, body) = item_error(&e);
                (status, body, None)
            }
        };
        let status = status.as_u16();
        statuses.push(CallItem { status, id });
        results.push(result);
    }
    persist(&cloud, snapshot_if(&cloud, changed)).await?;
    knob_delay(&cloud, |k| k.create_answer_delay_ms).await;
    Ok(batch_answer(results, statuses))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchDelete {
    ids: Vec<String>,
}

/// `POST /v1/batch/delete`: each of `ids` terminated as `DELETE
/// /v1/instances/{id}` would, in one call. One result per id, in order:
/// `{}`, or the error body with its `status`.
#[instrument(skip_all)]
async fn batch_delete(State(cloud): State<SimCloud>, body: Bytes) -> Result<Response, ApiError> {
    let BatchDelete { ids } = parse_body(&body)?;
    batch_size(ids.len(), "ids")?;
    let (answers, snapshot) = {
        let now = cloud.now_ms();
        let mut state = cloud.lock();
        let answers: Vec<(StatusCode, Value)> = (ids.iter())
            .map(|id| match state.delete(id, now) {
                Ok(()) => {
                    if let Some(n) = parse_id(id) {
                        cloud.shared.machines.stop(n);
                    }
                    (StatusCode::NO_CONTENT, json!({}))
                }
                Err(e) => item_error(&e),
            })
            .collect();
        (answers, cloud.snapshot(&state))
    };
    persist(&cloud, snapshot).await?;
    let (statuses, results) = (answers.into_iter().zip(ids))
        .map(|((status, result), id)| {
            let status = status.as_u16();
            (
                CallItem {
                    status,
                    id: Some(id),
                },
                result,
            )
        })
        .unzip();
    Ok(batch_answer(results, statuses))
}

/// Most `id=` a list takes.
const MAX_IDS: usize = 100;

fn parse_list_query(raw: Option<&str>) -> Result<ListQuery, ApiError> {
    let mut query = ListQuery {
        page_size: DEFAULT_PAGE_SIZE,
        ..ListQuery::default()
    };
    for (key, value) in url::form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        if let Some(tag) = key.strip_prefix("tag:") {
            query.tags.push((tag.to_owned(), value.into_owned()));
            continue;
        }
        match &*key {
            "page_size" => {
                query.page_size = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_PAGE_SIZE).contains(n))
                    .ok_or_else(|| {
                        ApiError::InvalidRequest(format!(
                            "page_size must be between 1 and {MAX_PAGE_SIZE}, got {value:?}"
                        ))
                    })?;
            }
            "id" => {
                if query.ids.len() == MAX_IDS {
                    return Err(ApiError::InvalidRequest(format!(
                        "at most {MAX_IDS} ids in one list"
                    )));
                }
                let id = parse_id(&value)
                    .ok_or_else(|| ApiError::InvalidRequest(format!("bad id {value:?}")))?;
                query.ids.push(id);
            }
            "page_token" => {
                let after = parse_id(&value)
                    .ok_or_else(|| ApiError::InvalidRequest(format!("bad page_token {value:?}")))?;
                query.after = Some(after);
            }
            other => {
                return Err(ApiError::InvalidRequest(format!(
                    "unknown query parameter {other:?}"
                )));
            }
        }
    }
    Ok(query)
}

#[instrument(skip_all)]
async fn list(
    State(cloud): State<SimCloud>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let query = parse_list_query(raw.as_deref())?;
    let now = cloud.now_ms();
    let page = cloud.lock().list(&query, now);
    Ok(Json(page).into_response())
}

#[instrument(skip(cloud))]
async fn get_instance(
    State(cloud): State<SimCloud>,
    Path(InstanceId { id }): Path<InstanceId>,
) -> Result<Response, ApiError> {
    let now = cloud.now_ms();
    let instance = cloud.lock().get(&id, now)?;
    Ok(Json(instance).into_response())
}

#[instrument(skip(cloud))]
async fn delete(
    State(cloud): State<SimCloud>,
    Path(InstanceId { id }): Path<InstanceId>,
) -> Result<StatusCode, ApiError> {
    let snapshot = {
        let now = cloud.now_ms();
        let mut state = cloud.lock();
        state.delete(&id, now)?;
        cloud.snapshot(&state)
    };
    if let Some(n) = parse_id(&id) {
        cloud.shared.machines.stop(n);
    }
    persist(&cloud, snapshot).await?;
    debug!("terminated instance");
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SetTags {
    tags: BTreeMap<String, String>,
}

#[instrument(skip(cloud, body))]
async fn set_tags(
    State(cloud): State<SimCloud>,
    Path(InstanceId { id }): Path<InstanceId>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let SetTags { tags } = parse_body(&body)?;
    let snapshot = {
        let now = cloud.now_ms();
        let mut state = cloud.lock();
        state.set_tags(&id, tags, now)?;
        cloud.snapshot(&state)
    };
    persist(&cloud, snapshot).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn limits(State(cloud): State<SimCloud>) -> Json<Value> {
    let now = cloud.now_ms();
    let (max, used) = cloud.lock().limits(now);
    Json(json!({"max_instances": max, "used_instances": used}))
}

async fn get_knobs(State(cloud): State<SimCloud>) -> Json<Knobs> {
    Json(cloud.knobs())
}

/// Merges a partial knobs object into the current knobs. Done on JSON values
/// so `"quota": null` (disarm) and an absent `quota` (leave alone) differ.
#[instrument(skip_all)]
async fn put_knobs(State(cloud): State<SimCloud>, body: Bytes) -> Result<Json<Knobs>, ApiError> {
    let patch: serde_json::Map<String, Value> = parse_body(&body)?;
    let mut state = cloud.lock();
    let mut merged = serde_json::to_value(state.knobs())
        .map_err(|e| ApiError::Internal(format!("encoding knobs: {e}")))?;
    if let Value::Object(fields) = &mut merged {
        fields.extend(patch);
    }
    let knobs: Knobs = serde_json::from_value(merged)
        .map_err(|e| ApiError::InvalidRequest(format!("bad knobs: {e}")))?;
    knobs
        .validate()
        .map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    debug!(?knobs, "knobs changed");
    state.set_knobs(knobs.clone());
    Ok(Json(knobs))
}

async fn calls(State(cloud): State<SimCloud>) -> Json<Vec<Call>> {
    Json(cloud.calls())
}

async fn sim_instances(State(cloud): State<SimCloud>) -> Json<Vec<Instance>> {
    Json(cloud.instances())
}

/// Points one instance at another address and SSH port (a server that
/// never answers, a metadata address): `{"address": "…", "port": N}`.
#[instrument(skip(cloud, body))]
async fn set_endpoint(
    State(cloud): State<SimCloud>,
    Path(InstanceId { id }): Path<InstanceId>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let endpoint: Endpoint = parse_body(&body)?;
    let snapshot = {
        let now = cloud.now_ms();
        let mut state = cloud.lock();
        state.set_endpoint(&id, endpoint, now)?;
        cloud.snapshot(&state)
    };
    if let Some(n) = parse_id(&id) {
        cloud.shared.machines.stop(n);
    }
    persist(&cloud, snapshot).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[instrument(skip_all)]
async fn reset(State(cloud): State<SimCloud>) -> Result<StatusCode, ApiError> {
    let snapshot = {
        let mut state = cloud.lock();
        state.reset();
        cloud.snapshot(&state)
    };
    cloud.shared.machines.stop_all();
    persist(&cloud, snapshot).await?;
    debug!("reset");
    Ok(StatusCode::NO_CONTENT)
}
