//! The HTTP API under `/v1` (JSON), with `/healthz`, `/readyz`, `/metrics`
//! and `/openapi.json`: a thin face on a running pool's [`Handle`].
//!
//! Every handler authenticates the caller (bearer token → client or admin),
//! checks its body by hand so that a bad field is named, and asks the pool's
//! task for what it needs; views are built on that task in one go, so a
//! response shows the pool at one moment. Errors are [`types::ErrorBody`]
//! with a stable code.

mod auth;
#[cfg(test)]
mod openapi_tests;
mod telemetry;
pub mod types;
mod views;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use serde_json::Value;

pub use auth::Caller;
pub use telemetry::Telemetry;

use crate::pool::{Conflict, Idle, ListHealth, NewRequest, NodeId, Refused, RequestId};
use crate::runtime::{Change, Done, Handle, Health, ServiceError};

/// The longest a `wait` long-poll is held.
pub const MAX_WAIT: Duration = Duration::from_secs(300);

/// What every handler shares.
#[derive(Clone)]
pub struct Api {
    inner: Arc<Inner>,
}

struct Inner {
    handle: Handle,
    telemetry: Arc<Telemetry>,
    stopping: AtomicBool,
}

impl Api {
    pub fn new(handle: Handle, telemetry: Arc<Telemetry>) -> Api {
        Api {
            inner: Arc::new(Inner {
                handle,
                telemetry,
                stopping: AtomicBool::new(false),
            }),
        }
    }

    /// From now on, `/readyz` says 503 and changes are refused: the service
    /// is shutting down.
    pub fn stopping(&self) {
        self.inner.stopping.store(true, Ordering::SeqCst);
    }

    fn handle(&self) -> &Handle {
        &self.inner.handle
    }

    /// The routes.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics))
            .route("/openapi.json", get(openapi))
            .route("/v1/requests", post(create_request).get(list_requests))
            .route("/v1/requests/{id}", get(get_request).delete(cancel_request))
            .route("/v1/nodes", get(list_nodes))
            .route("/v1/nodes/{id}", get(get_node).delete(delete_node))
            .route("/v1/nodes/{id}/release", post(release_node))
            .route("/v1/nodes/{id}/idle", put(set_idle))
            .route("/v1/labels", get(labels))
            .route("/v1/providers", get(providers))
            .route("/v1/drivers", get(drivers))
            .route("/v1/lease", post(renew_lease))
            .route_layer(axum::middleware::from_fn(no_query_where_none_is_taken))
            .fallback(not_found)
            .method_not_allowed_fallback(method_not_allowed)
            .layer(axum::middleware::from_fn_with_state(
                self.clone(),
                bounded_body,
            ))
            .layer(axum::middleware::from_fn(errors_as_json))
            .with_state(self.clone())
    }
}

/// The operations that take no query parameters, read from the OpenAPI
/// document (whose tests hold it to the handlers): a parameter sent to one
/// of them is a mistake worth a 400, not something to ignore. Operations
/// that take parameters check them themselves.
fn takes_no_query(method: &axum::http::Method, path: &str) -> bool {
    static NONE: std::sync::LazyLock<std::collections::HashSet<(String, String)>> =
        std::sync::LazyLock::new(|| {
            let doc: Value =
                serde_json::from_str(include_str!("api/openapi.json")).expect("openapi.json");
            let mut none = std::collections::HashSet::new();
            for (path, item) in doc["paths"].as_object().into_iter().flatten() {
                for (method, op) in item.as_object().into_iter().flatten() {
                    let query = op["parameters"]
                        .as_array()
                        .is_some_and(|ps| ps.iter().any(|p| p["in"] == "query"));
                    if !query {
                        none.insert((method.to_ascii_uppercase(), path.clone()));
                    }
                }
            }
            none
        });
    NONE.contains(&(method.as_str().to_owned(), path.to_owned()))
}

async fn no_query_where_none_is_taken(
    path: axum::extract::MatchedPath,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if let Some(q) = req.uri().query()
        && let Some(name) = q
            .split('&')
            .map(|kv| kv.split('=').next().unwrap_or(""))
            .find(|k| !k.is_empty())
        && takes_no_query(req.method(), path.as_str())
    {
        return ApiError::bad(name, "unknown parameter; this takes none").into_response();
    }
    next.run(req).await
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!(
            "{method} is not allowed on {}; see /openapi.json",
            uri.path()
        ),
    )
}

/// The most a request body may hold: every body of this API is a small
/// JSON object.
pub const MAX_BODY: usize = 1 << 20;

/// The most of a refused body that is read and thrown away before the
/// answer, so that the client, still sending, is not reset before it can
/// read the answer. A body declared larger is refused without reading it.
const DRAIN_MAX: u64 = 16 << 20;

/// Reads a request's body before any handler runs, so that no handler
/// waits on a client: a body must be JSON (`Content-Type:
/// application/json`), at most [`MAX_BODY`], and arrive whole within
/// `body-timeout`. A refused body is read and dropped up to [`DRAIN_MAX`]
/// (within `body-timeout`) before the answer; one declared larger than that
/// is refused at once. The refusals close the connection.
async fn bounded_body(
    State(api): State<Api>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let (parts, body) = req.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let has_body =
        parts.headers.contains_key(header::TRANSFER_ENCODING) || declared.is_some_and(|n| n > 0);
    if !has_body {
        let req = axum::extract::Request::from_parts(parts, axum::body::Body::empty());
        return next.run(req).await;
    }
    let closing = |e: ApiError| {
        let mut r = e.into_response();
        r.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
        r
    };
    let too_large = || {
        closing(ApiError {
            field: Some("body".into()),
            ..ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("body: larger than the {MAX_BODY} bytes any request of this API needs"),
            )
        })
    };
    let within = api.handle().config().api.body_timeout;
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        if declared.is_some_and(|n| n <= DRAIN_MAX) {
            let _ = tokio::time::timeout(within, read_body(body, 0)).await;
        }
        return too_large();
    }
    let json = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        let sent = parts
            .headers
            .get(header::CONTENT_TYPE)
            .map(|v| crate::text::printable(&String::from_utf8_lossy(v.as_bytes())).into_owned());
        let _ = tokio::time::timeout(within, read_body(body, 0)).await;
        return closing(ApiError {
            field: Some("Content-Type".into()),
            ..ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                match sent {
                    Some(t) => format!("Content-Type: `{t}`; bodies are application/json"),
                    None => "Content-Type: missing; bodies are application/json".to_owned(),
                },
            )
        });
    }
    match tokio::time::timeout(within, read_body(body, MAX_BODY)).await {
        Err(_) => {
            api.inner.telemetry.http_connection_closed("body_timeout");
            closing(ApiError {
                field: Some("body".into()),
                ..ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "body_timeout",
                    format!("body: not received whole within {within:?} (body-timeout)"),
                )
            })
        }
        Ok(BodyRead::TooLarge) => too_large(),
        Ok(BodyRead::Failed(e)) => {
            closing(ApiError::bad("body", format!("could not be read: {e}")))
        }
        Ok(BodyRead::Whole(bytes)) => {
            let body = axum::body::Body::from(bytes);
            next.run(axum::extract::Request::from_parts(parts, body))
                .await
        }
    }
}

enum BodyRead {
    Whole(Bytes),
    /// Over what was kept; read (and dropped) up to [`DRAIN_MAX`].
    TooLarge,
    Failed(String),
}

/// Reads `body` to its end, keeping it if it is at most `keep` bytes, and
/// reading no more than [`DRAIN_MAX`].
async fn read_body(mut body: axum::body::Body, keep: usize) -> BodyRead {
    use http_body_util::BodyExt;
    let mut kept = bytes::BytesMut::new();
    let mut seen = 0u64;
    while let Some(frame) = body.frame().await {
        let data = match frame {
            Ok(frame) => match frame.into_data() {
                Ok(data) => data,
                Err(_) => continue,
            },
            Err(e) => return BodyRead::Failed(e.to_string()),
        };
        seen += data.len() as u64;
        if seen > DRAIN_MAX {
            return BodyRead::TooLarge;
        }
        if seen <= keep as u64 {
            kept.extend_from_slice(&data);
        }
    }
    if seen > keep as u64 {
        BodyRead::TooLarge
    } else {
        BodyRead::Whole(kept.freeze())
    }
}

/// Gives every error the JSON body of the API, also those that axum itself
/// answers before a handler runs (a body over the size limit, say).
async fn errors_as_json(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let res = next.run(req).await;
    let status = res.status();
    let is_json = res
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return res;
    }
    let allow = res.headers().get(header::ALLOW).cloned();
    let text = axum::body::to_bytes(res.into_body(), 64 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_owned()
    } else {
        text
    };
    let e = match status {
        StatusCode::PAYLOAD_TOO_LARGE => {
            ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message)
        }
        s if s.is_server_error() => ApiError {
            status,
            ..ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
        },
        _ => ApiError {
            status,
            ..ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
        },
    };
    let mut r = e.into_response();
    if let Some(allow) = allow {
        r.headers_mut().insert(header::ALLOW, allow);
    }
    r
}

// ---- errors -------------------------------------------------------------

/// An error response: status, stable code, message, and the field at fault.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    field: Option<String>,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            field: None,
        }
    }

    fn bad(field: impl Into<String>, message: impl Into<String>) -> ApiError {
        let field = field.into();
        let message = format!("{field}: {}", message.into());
        ApiError {
            field: Some(field),
            ..ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
        }
    }

    fn not_found(what: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", what)
    }

    fn forbidden(what: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "forbidden", what)
    }

    fn stopping() -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "stopping",
            "berth is shutting down; try again once it is back",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = types::ErrorBody {
            error: types::ErrorDetail {
                code: self.code.to_owned(),
                message: self.message,
                field: self.field,
            },
        };
        let mut r = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"berth\""),
            );
        }
        if self.code == "busy" {
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        r
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> ApiError {
        let message = e.to_string();
        match e {
            ServiceError::Stopped => ApiError::stopping(),
            ServiceError::Forbidden(m) => ApiError::forbidden(m),
            ServiceError::Busy(_) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "busy", message)
            }
            ServiceError::StoreFailed(_) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "store_unwritable", message)
            }
            ServiceError::Refused(Refused::Empty) => ApiError::bad("labels", message),
            ServiceError::Refused(Refused::DuplicateLabel(_)) => ApiError::bad("labels", message),
            ServiceError::Refused(Refused::TooMany { .. }) => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "unsatisfiable", message)
            }
            ServiceError::Conflict(Conflict::NoSuchNode | Conflict::NoSuchRequest) => {
                ApiError::not_found(message)
            }
            ServiceError::Conflict(_) => ApiError::new(StatusCode::CONFLICT, "conflict", message),
        }
    }
}

type Result<T> = std::result::Result<T, ApiError>;

fn json<T: serde::Serialize>(status: StatusCode, body: T) -> Response {
    (status, axum::Json(body)).into_response()
}

/// Reads a body as `T`, naming the field at fault (`labels.small`): an
/// unknown field, a wrong type and a key given twice are all refused.
fn body<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T> {
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        None => return Err(ApiError::bad("body", "missing; send a JSON object")),
        // serde reads a struct from an array too; the API takes objects.
        Some(b'{') => {}
        Some(_) => return Err(ApiError::bad("body", "must be a JSON object")),
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let read = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = crate::text::printable(&inner.to_string()).into_owned();
        // serde's own word for a field given twice, in the API's words.
        let message = match message.strip_prefix("duplicate field `") {
            Some(rest) => format!("the key `{rest}").replacen("` at", "` is given twice at", 1),
            None => message,
        };
        let field = match path.as_str() {
            "." => "body".to_owned(),
            _ => crate::text::printable(&path).into_owned(),
        };
        match inner.classify() {
            serde_json::error::Category::Data => ApiError::bad(field, message),
            _ => ApiError::bad("body", format!("not valid JSON: {message}")),
        }
    })?;
    de.end()
        .map_err(|e| ApiError::bad("body", format!("not valid JSON: {e}")))?;
    Ok(read)
}

fn node_id(text: &str) -> Result<NodeId> {
    text.parse()
        .map_err(|()| ApiError::bad("id", format!("`{text}` is not a node id (n-…)")))
}

fn request_id(text: &str) -> Result<RequestId> {
    text.parse()
        .map_err(|()| ApiError::bad("id", format!("`{text}` is not a request id (r-…)")))
}

impl Api {
    fn refuse_if_stopping(&self) -> Result<()> {
        if self.inner.stopping.load(Ordering::SeqCst) {
            Err(ApiError::stopping())
        } else {
            Ok(())
        }
    }

    fn caller(&self, headers: &HeaderMap) -> Result<Caller> {
        auth::authenticate(&self.handle().config().api.tokens, headers)
    }
}

// ---- health, metrics, the description -----------------------------------

/// 200 while the pool runs; 503 once its store could not be written (the
/// process is about to exit so that a supervisor restarts it).
async fn healthz(State(api): State<Api>) -> Response {
    match api.handle().failure() {
        Some(e) => ApiError::from(e).into_response(),
        None => "ok\n".into_response(),
    }
}

async fn readyz(State(api): State<Api>) -> Response {
    if api.inner.stopping.load(Ordering::SeqCst) {
        return ApiError::stopping().into_response();
    }
    let providers = api.handle().providers().clone();
    let waiting = api
        .handle()
        .inspect(move |pool| {
            let config = pool.config();
            let now = pool.last_tick();
            let sync = config.timings.sync_interval;
            (0..config.providers.len())
                .map(|i| crate::config::ProviderIx(i as u16))
                .filter_map(|p| {
                    let s = pool.provider_status(p);
                    let name = &config[p].name;
                    // Lists not believed for a whole sync interval.
                    let stale = match &s.list {
                        ListHealth::Failing { since, .. } | ListHealth::Suspect { since, .. }
                            if now.since(*since) >= sync =>
                        {
                            Some(format!(
                                "{name} (its lists are not believed since {}s)",
                                now.since(*since).as_secs()
                            ))
                        }
                        _ => None,
                    };
                    if s.listed {
                        return stale;
                    }
                    Some(match providers.health(p) {
                        Health::Failed { error, .. } => {
                            format!("{name} (could not start: {error})")
                        }
                        Health::Starting => format!("{name} (starting)"),
                        Health::Up => stale.unwrap_or_else(|| format!("{name} (not listed yet)")),
                    })
                })
                .collect::<Vec<_>>()
        })
        .await;
    match waiting {
        Err(e) => ApiError::from(e).into_response(),
        Ok(w) if w.is_empty() => (StatusCode::OK, "ready\n").into_response(),
        Ok(w) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            format!(
                "providers not ready: {}; nothing is created on a provider until it has been listed",
                w.join("; ")
            ),
        )
        .into_response(),
    }
}

async fn metrics(State(api): State<Api>, headers: HeaderMap) -> Result<Response> {
    api.caller(&headers)?;
    let telemetry = api.inner.telemetry.clone();
    let providers = api.handle().providers().clone();
    let text = api
        .handle()
        .inspect(move |pool| telemetry.render(pool, &providers))
        .await?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        include_str!("api/openapi.json"),
    )
        .into_response()
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such route; see /openapi.json")
}

// ---- requests -------------------------------------------------------------

async fn create_request(
    State(api): State<Api>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    let caller = api.caller(&headers)?;
    api.refuse_if_stopping()?;
    let asked: types::NewRequest = self::body(&body)?;
    let config = api.handle().config().clone();
    if asked.labels.is_empty() {
        return Err(ApiError::bad("labels", "ask for at least one node"));
    }
    let mut wants = Vec::new();
    for (name, &count) in &asked.labels {
        if name.is_empty() || name.chars().any(crate::text::is_unsafe) {
            return Err(ApiError::bad(
                "labels",
                format!(
                    "`{}` is not a label name: names hold no control or direction-changing characters",
                    crate::text::printable(name)
                ),
            ));
        }
        let field = format!("labels.{name}");
        if !(1..=10_000).contains(&count) {
            return Err(ApiError::bad(
                &field,
                "must be a whole number from 1 to 10000",
            ));
        }
        let Some(ix) = config.label(name) else {
            let known: Vec<&str> = config.labels.iter().map(|l| l.name.as_str()).collect();
            return Err(ApiError {
                field: Some(field),
                ..ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "unknown_label",
                    format!("no label `{name}`; labels are {}", known.join(", ")),
                )
            });
        };
        wants.push((ix, count));
    }
    let priority = asked.priority;
    let requestor = match asked.requestor {
        None => caller.name().to_owned(),
        Some(r) if valid_requestor(&r) => r,
        Some(_) => {
            return Err(ApiError::bad(
                "requestor",
                "must be 1 to 128 printable characters, with no control or direction-changing ones",
            ));
        }
    };
    // A request taken is a sign of life: its requestor's lease is renewed
    // with it (a refused one renews nothing).
    let new = NewRequest {
        requestor,
        priority,
        wants,
    };
    let change = Change::Submit {
        new,
        lease: Some(config.api.lease_ttl),
    };
    let c = caller.clone();
    let (id, view) = api
        .handle()
        .act(caller, change, move |pool, done| match done {
            Done::Submitted(id) => (id, views::request(pool, id, &c)),
            other => unreachable!("a request answered {other:?}"),
        })
        .await?;
    let view = view.ok_or_else(|| ApiError::not_found("the request was forgotten at once"))?;
    let mut r = json(StatusCode::CREATED, view);
    if let Ok(v) = header::HeaderValue::from_str(&format!("/v1/requests/{id}")) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    Ok(r)
}

fn valid_requestor(r: &str) -> bool {
    (1..=128).contains(&r.chars().count()) && !r.chars().any(crate::text::is_unsafe)
}

async fn list_requests(
    State(api): State<Api>,
    headers: HeaderMap,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Response> {
    let caller = api.caller(&headers)?;
    let filter = views::RequestFilter::parse(&q)?;
    let list = api
        .handle()
        .inspect(move |pool| views::requests(pool, &filter, &caller))
        .await?;
    Ok(json(StatusCode::OK, list))
}

async fn get_request(
    State(api): State<Api>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Response> {
    let caller = api.caller(&headers)?;
    let id = request_id(&id)?;
    no_other_params(&q, &["wait"])?;
    let wait = match q.get("wait") {
        None => None,
        Some(w) => Some(
            crate::duration::parse(w)
                .map_err(|e| ApiError::bad("wait", format!("{e}; e.g. 30s")))?
                .min(MAX_WAIT),
        ),
    };
    // Whose it is never changes: checked before the wait, so a caller
    // cannot wait on (or learn when) another requestor's request ends.
    let c = caller.clone();
    api.handle()
        .inspect(move |pool| views::owned_request(pool, id, &c).map(drop))
        .await??;
    if let Some(wait) = wait {
        // The answer is the request's state when it stops pending or the
        // wait ends, whichever is first.
        let _ = tokio::time::timeout(wait, api.handle().wait(id)).await;
    }
    let view = api
        .handle()
        .inspect(move |pool| views::owned_request(pool, id, &caller))
        .await??;
    Ok(json(StatusCode::OK, view))
}

fn no_other_params(q: &BTreeMap<String, String>, known: &[&str]) -> Result<()> {
    match q.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(ApiError::bad(
            k.clone(),
            if known.is_empty() {
                "unknown parameter; this takes none".to_owned()
            } else {
                format!("unknown parameter; expected {}", known.join(", "))
            },
        )),
        None => Ok(()),
    }
}

async fn cancel_request(
    State(api): State<Api>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response> {
    let caller = api.caller(&headers)?;
    api.refuse_if_stopping()?;
    let id = request_id(&id)?;
    let c = caller.clone();
    let view = api
        .handle()
        .act(caller, Change::Cancel(id), move |pool, _| {
            views::owned_request(pool, id, &c)
        })
        .await??;
    Ok(json(StatusCode::OK, view))
}

// ---- nodes ----------------------------------------------------------------

async fn list_nodes(
    State(api): State<Api>,
    headers: HeaderMap,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Response> {
    let caller = api.caller(&headers)?;
    let filter = views::NodeFilter::parse(&q, api.handle().config())?;
    let list = api
        .handle()
        .inspect(move |pool| views::nodes(pool, &filter, &caller))
        .await?;
    Ok(json(StatusCode::OK, list))
}

async fn get_node(
    State(api): State<Api>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response> {
    let caller = api.caller(&headers)?;
    let id = node_id(&id)?;
    let view = api
        .handle()
        .inspect(move |pool| views::node_by_id(pool, id, &caller))
        .await??;
    Ok(json(StatusCode::OK, view))
}

async fn release_node(
    State(api): State<Api>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response> {
    let caller = api.caller(&headers)?;
    api.refuse_if_stopping()?;
    let id = node_id(&id)?;
    node_change(&api, caller, Change::Release(id), id).await
}

/// Makes `change` to node `id` for `caller`; the node as it stands once
/// the change is stored.
async fn node_change(api: &Api, caller: Caller, change: Change, id: NodeId) -> Result<Response> {
    let c = caller.clone();
    let view = api
        .handle()
        .act(caller, change, move |pool, _| {
            views::node_by_id(pool, id, &c)
        })
        .await??;
    Ok(json(StatusCode::OK, view))
}

async fn set_idle(
    State(api): State<Api>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response> {
    let caller = api.caller(&headers)?;
    api.refuse_if_stopping()?;
    let id = node_id(&id)?;
    let asked: types::SetIdle = self::body(&body)?;
    let idle = Idle::parse(&asked.idle).ok_or_else(|| {
        ApiError::bad(
            "idle",
            format!(
                "`{}` is not run, hold or drain",
                crate::text::printable(&asked.idle)
            ),
        )
    })?;
    node_change(&api, caller, Change::SetIdle(id, idle), id).await
}

async fn delete_node(
    State(api): State<Api>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response> {
    let caller = api.caller(&headers)?;
    api.refuse_if_stopping()?;
    let id = node_id(&id)?;
    node_change(&api, caller, Change::Delete(id), id).await
}

// ---- configuration and health ----------------------------------------------

async fn labels(State(api): State<Api>, headers: HeaderMap) -> Result<Response> {
    api.caller(&headers)?;
    let list = api.handle().inspect(views::labels).await?;
    Ok(json(StatusCode::OK, list))
}

async fn providers(State(api): State<Api>, headers: HeaderMap) -> Result<Response> {
    api.caller(&headers)?;
    let telemetry = api.inner.telemetry.clone();
    let providers = api.handle().providers().clone();
    let list = api
        .handle()
        .inspect(move |pool| views::providers(pool, &telemetry, &providers))
        .await?;
    Ok(json(StatusCode::OK, list))
}

async fn drivers(State(api): State<Api>, headers: HeaderMap) -> Result<Response> {
    api.caller(&headers)?;
    Ok(json(
        StatusCode::OK,
        views::drivers(&api.handle().drivers()),
    ))
}

async fn renew_lease(
    State(api): State<Api>,
    headers: HeaderMap,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Response> {
    let caller = api.caller(&headers)?;
    api.refuse_if_stopping()?;
    no_other_params(&q, &["requestor"])?;
    let requestor = q
        .get("requestor")
        .cloned()
        .unwrap_or_else(|| caller.name().to_owned());
    let ttl = api.handle().config().api.lease_ttl;
    let change = Change::Renew {
        requestor: requestor.clone(),
        ttl,
    };
    let expires = api
        .handle()
        .act(caller, change, |_, done| match done {
            Done::Renewed(at) => at,
            other => unreachable!("a renewal answered {other:?}"),
        })
        .await?;
    Ok(json(
        StatusCode::OK,
        types::Lease {
            requestor,
            expires: types::rfc3339(expires.as_millis()),
            ttl_seconds: ttl.as_secs(),
        },
    ))
}
