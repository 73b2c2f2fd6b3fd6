//! The HTTP API under `/v1` (JSON), with `/healthz`, `/readyz`, `/metrics`
//! and `/openapi.json`: a thin face on a running pool's [`Handle`].
//!
//! Every handler authenticates the caller (bearer token → client or admin),
//! checks its body by hand so that a bad field is named, and asks the pool's
//! task for what it needs; views are built on that task in one go, so a
//! response shows the pool at one moment. Errors are [`types::ErrorBody`]
//! with a stable code. While another berth process holds a shared pool,
//! `/v1` calls are relayed to it as they are (`forward.rs`).

mod auth;
mod doc;
mod forward;
mod peer;
mod telemetry;
pub use berth_client::types;
mod views;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

pub use auth::Caller;
pub use telemetry::Telemetry;

use crate::runtime::{Handle, Health, Mode, ServiceError, change};
use berth_client::types::ErrorCode;
use berth_core::pool::{Conflict, Idle, ListHealth, NewRequest, NodeId, Refused, RequestId};

pub use berth_client::MAX_WAIT;

/// What every handler shares.
#[derive(Clone)]
pub struct Api {
    inner: Arc<Inner>,
}

struct Inner {
    handle: Handle,
    telemetry: Arc<Telemetry>,
    /// `[api]`: tokens and limits.
    settings: berth_config::Api,
    stopping: AtomicBool,
    /// Passes calls to the pool's holder while this process stands by.
    relay: forward::Relay,
    /// Long-polls that may wait at once: fewer than the connections the
    /// server takes, so that clients waiting on their requests never hold
    /// every connection and health checks and admin calls always find
    /// room ([`Api::limit_waits`]). Without a limit, unbounded.
    waits: std::sync::OnceLock<Arc<tokio::sync::Semaphore>>,
}

impl Api {
    pub fn new(handle: Handle, telemetry: Arc<Telemetry>, settings: berth_config::Api) -> Api {
        Api {
            inner: Arc::new(Inner {
                handle,
                telemetry,
                settings,
                stopping: AtomicBool::new(false),
                relay: forward::Relay::new(),
                waits: std::sync::OnceLock::new(),
            }),
        }
    }

    /// At most `n` long-polls wait at once; one more is answered at once
    /// with the request's state (and `Retry-After: 1`), as a wait that has
    /// ended. Set once, by the server that knows its connection cap.
    pub fn limit_waits(&self, n: usize) {
        let _ = (self.inner.waits).set(Arc::new(tokio::sync::Semaphore::new(n)));
    }

    /// `[api]`: tokens and limits.
    pub fn settings(&self) -> &berth_config::Api {
        &self.inner.settings
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
        let (routes, _) = doc::routes().split_for_parts();
        routes
            .route_layer(axum::middleware::from_fn(no_query_where_none_is_taken))
            .route(
                crate::runtime::shards::CALLS_PATH,
                axum::routing::post(peer::calls),
            )
            .fallback(not_found)
            .method_not_allowed_fallback(method_not_allowed)
            .layer(axum::middleware::from_fn_with_state(
                self.clone(),
                forward::relay,
            ))
            .layer(axum::middleware::from_fn_with_state(
                self.clone(),
                bounded_body,
            ))
            .layer(axum::middleware::from_fn(errors_as_json))
            .with_state(self.clone())
    }
}

/// The operations that take no query parameters, read from the generated
/// OpenAPI document: a parameter sent to one of them is a mistake worth a
/// 400, not something to ignore. Operations that take parameters check them
/// themselves.
fn takes_no_query(method: &axum::http::Method, path: &str) -> bool {
    use utoipa::openapi::path::ParameterIn;
    static NONE: std::sync::LazyLock<std::collections::HashSet<(&str, &str)>> =
        std::sync::LazyLock::new(|| {
            let mut none = std::collections::HashSet::new();
            for (path, item) in &doc::document().paths.paths {
                for (method, op) in doc::operations(item) {
                    let query = op
                        .parameters
                        .iter()
                        .flatten()
                        .any(|p| matches!(p.parameter_in, ParameterIn::Query));
                    if !query {
                        none.insert((method, path.as_str()));
                    }
                }
            }
            none
        });
    NONE.contains(&(method.as_str(), path))
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
        ErrorCode::MethodNotAllowed,
        format!(
            "{method} is not allowed on {}; see /openapi.json",
            uri.path()
        ),
    )
}

/// The most a request body may hold: every body of this API is a small
/// JSON object.
pub const MAX_BODY: usize = 1 << 20;

/// How long `/readyz` waits for the pool's task to answer.
const READYZ_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

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
                ErrorCode::TooLarge,
                format!("body: larger than the {MAX_BODY} bytes any request of this API needs"),
            )
        })
    };
    let within = api.inner.settings.body_timeout;
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
        let sent = parts.headers.get(header::CONTENT_TYPE).map(|v| {
            berth_core::text::printable(&String::from_utf8_lossy(v.as_bytes())).into_owned()
        });
        let _ = tokio::time::timeout(within, read_body(body, 0)).await;
        return closing(ApiError {
            field: Some("Content-Type".into()),
            ..ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                ErrorCode::UnsupportedMediaType,
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
                    ErrorCode::BodyTimeout,
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
            ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::TooLarge, message)
        }
        s if s.is_server_error() => ApiError {
            status,
            ..ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::Internal,
                message,
            )
        },
        _ => ApiError {
            status,
            ..ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, message)
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
    code: ErrorCode,
    message: String,
    field: Option<String>,
}

impl ApiError {
    fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> ApiError {
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
            ..ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, message)
        }
    }

    fn not_found(what: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, what)
    }

    fn forbidden(what: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, ErrorCode::Forbidden, what)
    }

    fn stopping() -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Stopping,
            "berth is shutting down; try again once it is back",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = types::ErrorBody {
            error: types::ErrorDetail {
                code: self.code.as_str().to_owned(),
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
        if self.code.try_again_soon() {
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
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Busy, message)
            }
            ServiceError::StoreFailed(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::StoreUnwritable,
                message,
            ),
            ServiceError::StoreUnavailable(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::StoreUnavailable,
                message,
            ),
            ServiceError::Standby(_) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Standby, message)
            }
            ServiceError::Refused(Refused::Empty) => ApiError::bad("labels", message),
            ServiceError::Refused(Refused::DuplicateLabel(_)) => ApiError::bad("labels", message),
            ServiceError::Refused(Refused::TooMany { .. }) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                ErrorCode::Unsatisfiable,
                message,
            ),
            ServiceError::Conflict(Conflict::NoSuchNode | Conflict::NoSuchRequest) => {
                ApiError::not_found(message)
            }
            ServiceError::Conflict(_) => {
                ApiError::new(StatusCode::CONFLICT, ErrorCode::Conflict, message)
            }
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
        let message = berth_core::text::printable(&inner.to_string()).into_owned();
        // serde's own word for a field given twice, in the API's words.
        let message = match message
            .strip_prefix("duplicate field `")
            .and_then(|rest| rest.split_once('`'))
        {
            Some((name, rest)) => format!("the key `{name}` is given twice{rest}"),
            None => message,
        };
        let field = match path.as_str() {
            "." => "body".to_owned(),
            _ => berth_core::text::printable(&path).into_owned(),
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
        auth::authenticate(&self.inner.settings.tokens, headers)
    }
}

// ---- health, metrics, the description -----------------------------------

/// 200 while the pool runs, saying what keeps it from deciding if anything
/// does; 503 once its store could not be written (the process is about to
/// exit so that a supervisor restarts it).
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    tag = "health",
    summary = "Liveness",
    description = "Answers 200 while the process runs: `ok`, or what keeps it from deciding for now (its database does not answer, its lease is not certain), which a restart would not mend. Once its store could not be written the pool stops deciding and berth exits (code 3) so that a supervisor restarts it; until it has, this answers 503.",
    security(()),
    extensions(("x-berth-roles" = json!([]))),
    responses(
        (status = 200, description = "Alive.", body = String, content_type = "text/plain"),
        (status = 400, response = doc::TakesNoQuery),
        (status = 503, description = "The store could not be written (code `store_unwritable`).", body = types::ErrorBody)
    )
)]
async fn healthz(State(api): State<Api>) -> Response {
    let handle = api.handle();
    if let Some(e) = handle.failure() {
        return ApiError::from(e).into_response();
    }
    // Alive either way: waiting out a database is what the process does
    // best, and a restart would wait the same. Said, so that whoever looks
    // knows.
    if let Some(late) = handle.lease_uncertain() {
        return format!(
            "alive; the pool's lease has not been renewed for {:.1}s past the time it was certain: \
             the database does not answer, and this process calls no cloud\n",
            late.as_secs_f64()
        )
        .into_response();
    }
    match handle.down() {
        Some(ServiceError::StoreUnavailable(why)) => {
            format!("alive; the store is out of reach, so this process decides nothing: {why}\n")
                .into_response()
        }
        _ => "ok\n".into_response(),
    }
}

#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = "health",
    summary = "Readiness",
    description = "Ready once every provider has been listed at least once since start; nothing is created on a provider until then. With a store shared by several berth processes, only the process holding the pool is ready; every process says which providers it holds (whose cloud calls it carries out).",
    security(()),
    extensions(("x-berth-roles" = json!([]))),
    responses(
        (status = 200, description = "Ready.", body = String, content_type = "text/plain"),
        (status = 400, response = doc::TakesNoQuery),
        (status = 503, description = "Not ready: code `not_ready` (the message names the providers not listed yet), `stopping` (shutting down), `store_unavailable` (the store is out of reach, or the pool's lease could not be renewed in time), `busy` (the pool's task did not answer within 2 s), or `standby` (another berth process holds the pool; this one relays `/v1` calls to it).", body = types::ErrorBody)
    )
)]
async fn readyz(State(api): State<Api>) -> Response {
    if api.inner.stopping.load(Ordering::SeqCst) {
        return ApiError::stopping().into_response();
    }
    // Asked before the pool's task, which may be waiting on that database.
    if let Some(late) = api.handle().lease_uncertain() {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::StoreUnavailable,
            format!(
                "the pool's lease has not been renewed for {:.1}s past the time it was certain: \
                 the database does not answer, and this process calls no cloud until it does",
                late.as_secs_f64()
            ),
        )
        .into_response();
    }
    let providers = api.handle().providers().clone();
    let waiting = api.handle().inspect(move |pool| {
        let config = pool.config();
        let now = pool.last_tick();
        let sync = config.timings.sync_interval;
        (0..config.providers.len())
            .map(|i| berth_config::ProviderIx(i as u16))
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
                if let Some(why) = &s.mismatch {
                    return Some(format!("{name} (creates nothing: {why})"));
                }
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
    });
    // Bounded, so that a health check gets an answer while the pool's task
    // waits on something (its database) instead of hanging with it.
    let Ok(waiting) = tokio::time::timeout(READYZ_WAIT, waiting).await else {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Busy,
            format!(
                "the pool's task has not answered for {}s: it is waiting on its store or overloaded",
                READYZ_WAIT.as_secs()
            ),
        )
        .into_response();
    };
    // Which providers' calls this process carries out (a shared store).
    let held = api.handle().shards().map(|s| match s.held() {
        h if h.is_empty() => "; it holds no provider".to_owned(),
        h => format!(
            "; it holds provider(s) {} and carries out their cloud calls",
            h.join(", ")
        ),
    });
    match waiting {
        Err(e @ ServiceError::Standby(_)) => {
            let mut e = ApiError::from(e);
            e.message.push_str(held.as_deref().unwrap_or_default());
            e.into_response()
        }
        Err(e) => ApiError::from(e).into_response(),
        Ok(w) if w.is_empty() => match held {
            Some(held) => (
                StatusCode::OK,
                format!("ready: this process holds the pool{held}\n"),
            )
                .into_response(),
            None => (StatusCode::OK, "ready\n").into_response(),
        },
        Ok(w) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::NotReady,
            format!(
                "providers not ready: {}; nothing is created on a provider until it has been listed",
                w.join("; ")
            ),
        )
        .into_response(),
    }
}

#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    tag = "health",
    summary = "Prometheus metrics",
    description = "Any valid token.",
    security(("bearerAuth" = [])),
    extensions(("x-berth-roles" = json!(["client", "admin"]))),
    responses(
        (status = 200, description = "Metrics in the OpenMetrics text format 1.0.0, which Prometheus reads.", body = String, content_type = crate::metrics::CONTENT_TYPE),
        (status = 400, response = doc::TakesNoQuery),
        (status = 401, response = doc::Unauthorized),
        (status = 503, response = doc::Unavailable)
    )
)]
async fn metrics(State(api): State<Api>, headers: HeaderMap) -> Result<Response> {
    api.caller(&headers)?;
    let telemetry = api.inner.telemetry.clone();
    let providers = api.handle().providers().clone();
    let (t, p) = (telemetry.clone(), providers.clone());
    let text = match api.handle().inspect(move |pool| t.render(pool, &p)).await {
        Ok(text) => text,
        // Every process serves its own metrics: one standing by, or whose
        // store is out of reach, without the pool's gauges.
        Err(ServiceError::Standby(_) | ServiceError::StoreUnavailable(_)) => {
            telemetry.render_alone(api.handle().config(), &providers)
        }
        Err(e) => return Err(e.into()),
    };
    Ok(([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response())
}

#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "openapi",
    tag = "health",
    summary = "This document",
    security(()),
    extensions(("x-berth-roles" = json!([]))),
    responses(
        (status = 200, description = "This OpenAPI document.", body = Object),
        (status = 400, response = doc::TakesNoQuery)
    )
)]
async fn openapi() -> Response {
    axum::Json(doc::document()).into_response()
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such route; see /openapi.json")
}

// ---- requests -------------------------------------------------------------

#[utoipa::path(
    post,
    path = "/v1/requests",
    operation_id = "create_request",
    tag = "requests",
    summary = "Ask for nodes",
    description = "Asks for a set of nodes, handed out together once all are ready. Creating a request renews the requestor's lease (`api.lease-ttl`). A client token acts only as its own requestor; an admin may name any. Answers 201 with the new request and a `Location` header; follow it with `GET /v1/requests/{id}?wait=…`. On a berth process standing by (several processes on one PostgreSQL store), the request is passed to the process holding the pool; if that one does not answer within 250 ms, it is accepted into the store's request inbox, durably, and answered `pending`, and the holder takes it in once it can.",
    security(("bearerAuth" = [])),
    extensions(("x-berth-roles" = json!(["client", "admin"]))),
    request_body(content = types::NewRequest),
    responses(
        (status = 201, description = "Created; the request as it is now (normally `pending`).", body = types::Request, headers(("Location" = String, description = "`/v1/requests/{id}` of the new request."))),
        (status = 400, description = "Malformed body (code `bad_request`); `field` names what is wrong: `body`, `labels`, `labels.NAME`, `priority`, `requestor` or an unknown field's name.", body = types::ErrorBody),
        (status = 401, response = doc::Unauthorized),
        (status = 403, description = "A client token named a requestor other than itself, or the call carries `x-berth-request-id` (for berth processes offering a request to the pool's holder) without the pool's peer secret (code `forbidden`).", body = types::ErrorBody),
        (status = 404, description = "The request was forgotten at once (code `not_found`); should not happen.", body = types::ErrorBody),
        (status = 422, description = "Code `unknown_label` (no such label; `field` is `labels.NAME`) or `unsatisfiable` (a count the providers' configured limits can never allow).", body = types::ErrorBody),
        (status = 503, response = doc::Unavailable)
    )
)]
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
        if name.is_empty() || name.chars().any(berth_core::text::is_unsafe) {
            return Err(ApiError::bad(
                "labels",
                format!(
                    "`{}` is not a label name: names hold no control, invisible or direction-changing characters",
                    berth_core::text::printable(name)
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
                    ErrorCode::UnknownLabel,
                    format!("no label `{name}`; labels are {}", known.join(", ")),
                )
            });
        };
        wants.push((ix, count));
    }
    let priority = asked.priority;
    let requestor = match asked.requestor {
        None => caller.name().to_owned(),
        Some(r) if berth_core::text::is_requestor(&r) => r,
        Some(_) => {
            return Err(ApiError::bad(
                "requestor",
                "must be 1 to 128 printable characters, with no control, invisible or direction-changing ones",
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
    let standby = match api.handle().mode() {
        Mode::Standby(holder) if api.handle().shared() => Some(holder),
        _ => None,
    };
    let (id, view) = if let Some(holder) = standby {
        // Another process holds the pool. Offered to it under an id drawn
        // here; taken here, into the store's inbox under the same id, if
        // it does not answer in time.
        if headers.contains_key(&forward::RELAYED) {
            // Two processes that each think the other holds the pool.
            return Err(ServiceError::Standby(holder).into());
        }
        api.handle().check(&caller, &new)?;
        let id = RequestId(rand::random());
        if let Some(answer) = forward::offer(&api, holder.as_ref(), &headers, body, id).await {
            return Ok(answer);
        }
        let request = api.handle().send_to_inbox(id, new).await?;
        api.inner.telemetry.request_inboxed();
        (id, views::pending(&config, &request))
    } else {
        let change = change::Submit {
            new,
            lease: Some(config.lease_ttl),
            id: given_id(&api, &headers)?,
        };
        let c = caller.clone();
        let (id, view) = api
            .handle()
            .act(caller, change, move |pool, id| {
                (id, views::request(pool, id, &c))
            })
            .await?;
        let view = view.ok_or_else(|| ApiError::not_found("the request was forgotten at once"))?;
        (id, view)
    };
    let mut r = json(StatusCode::CREATED, view);
    if let Ok(v) = header::HeaderValue::from_str(&format!("/v1/requests/{id}")) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    Ok(r)
}

/// The id a process standing by drew for a request it offers here
/// (`forward::offer`): taken only from a call that carries the pool's peer
/// secret.
fn given_id(api: &Api, headers: &HeaderMap) -> Result<Option<RequestId>> {
    let Some(given) = headers.get(&forward::REQUEST_ID) else {
        return Ok(None);
    };
    let secret = headers
        .get(crate::runtime::shards::PEER_HEADER)
        .map_or(&[][..], |v| v.as_bytes());
    if !api.handle().shards().is_some_and(|s| s.admits(secret)) {
        return Err(ApiError::forbidden(format!(
            "`{}` is for berth processes offering a request to the pool's holder, with the \
             pool's peer secret",
            forward::REQUEST_ID
        )));
    }
    let text = given.to_str().unwrap_or_default();
    request_id(text).map(Some).map_err(|_| {
        ApiError::bad(
            forward::REQUEST_ID.as_str(),
            format!(
                "`{}` is not a request id (r-…)",
                berth_core::text::printable(text)
            ),
        )
    })
}

#[utoipa::path(
    get,
    path = "/v1/requests",
    operation_id = "list_requests",
    tag = "requests",
    summary = "List requests",
    description = "Requests the caller may see, oldest first: a client sees only its own, an admin all.",
    security(("bearerAuth" = [])),
    extensions(("x-berth-roles" = json!(["client", "admin"]))),
    params(
        ("state" = inline(Option<types::RequestStateName>), Query, description = "Only requests in this state."),
        ("requestor" = Option<String>, Query, description = "Only this requestor's requests.")
    ),
    responses(
        (status = 200, description = "The requests.", body = [types::Request]),
        (status = 400, description = "An unknown parameter or a bad `state` (code `bad_request`, `field` set).", body = types::ErrorBody),
        (status = 401, response = doc::Unauthorized),
        (status = 503, response = doc::Unavailable)
    )
)]
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

#[utoipa::path(
    get,
    path = "/v1/requests/{id}",
    operation_id = "get_request",
    tag = "requests",
    summary = "Get a request, optionally waiting",
    description = "With `wait`, a long poll: answers with the request's state as soon as it stops being pending, or when the wait ends, whichever is first (so a 200 may still say `pending`). When as many long polls wait as the server lets wait at once (all its connections but a reserve kept for everything else), it answers at once with `Retry-After: 1`. A client may read only its own requests.",
    security(("bearerAuth" = [])),
    extensions(("x-berth-roles" = json!(["client", "admin"]))),
    params(
        ("id" = String, Path, description = "A request id, as berth gives it (`r-` and 16 hex digits). Anything else is a 400 with `field` `id`.", pattern = "^r-[0-9a-f]{16}$", example = "r-000000000000002c"),
        ("wait" = Option<String>, Query, description = "How long to wait for the request to stop pending: a whole number with `ms`, `s`, `m` or `h` (e.g. `30s`), or `0`. Capped at 300 s.", pattern = "^(0|[0-9]+(ms|s|m|h))$", example = "30s")
    ),
    responses(
        (status = 200, description = "The request.", body = types::Request),
        (status = 400, description = "A malformed `id`, a bad `wait` or an unknown parameter (code `bad_request`, `field` set).", body = types::ErrorBody),
        (status = 401, response = doc::Unauthorized),
        (status = 403, description = "The request belongs to another requestor (code `forbidden`).", body = types::ErrorBody),
        (status = 404, description = "No such request (code `not_found`).", body = types::ErrorBody),
        (status = 503, response = doc::Unavailable)
    )
)]
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
            berth_core::duration::parse(w)
                .map_err(|e| ApiError::bad("wait", format!("{e}; e.g. 30s")))?
                .min(MAX_WAIT),
        ),
    };
    // Whose it is never changes: checked before the wait, so a caller
    // cannot wait on (or learn when) another requestor's request ends.
    let c = caller.clone();
    or_taken_in(&api, || {
        let (api, c) = (api.clone(), c.clone());
        async move {
            api.handle()
                .inspect(move |pool| views::owned_request(pool, id, &c).map(drop))
                .await?
        }
    })
    .await?;
    // A wait past the long-poll budget is not held: answered at once, as
    // a wait that ended, with a hint to come back in a second.
    let mut cut = false;
    if let Some(wait) = wait {
        // No budget set: every wait is held.
        let slot = (api.inner.waits.get()).map(|waits| waits.clone().try_acquire_owned());
        if let Some(Err(_)) = slot {
            cut = !wait.is_zero();
        } else {
            // The answer is the request's state when it stops pending or
            // the wait ends, whichever is first; the slot is held until
            // then.
            let _ = tokio::time::timeout(wait, api.handle().wait(id)).await;
            drop(slot);
        }
    }
    let view = api
        .handle()
        .inspect(move |pool| views::owned_request(pool, id, &caller))
        .await??;
    let mut answer = json(StatusCode::OK, view);
    if cut {
        answer
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    Ok(answer)
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

#[utoipa::path(
    delete,
    path = "/v1/requests/{id}",
    operation_id = "cancel_request",
    tag = "requests",
    summary = "Cancel a pending request",
    description = "Withdraws a pending request; nodes set aside for it go back to the pool. A client may cancel only its own requests.",
    security(("bearerAuth" = [])),
    extensions(("x-berth-roles" = json!(["client", "admin"]))),
    params(
        ("id" = String, Path, description = "A request id, as berth gives it (`r-` and 16 hex digits). Anything else is a 400 with `field` `id`.", pattern = "^r-[0-9a-f]{16}$", example = "r-000000000000002c")
    ),
    responses(
        (status = 200, description = "The request, now `cancelled`.", body = types::Request),
        (status = 400, description = "A malformed `id` (code `bad_request`, `field` `id`).", body = types::ErrorBody),
        (status = 401, response = doc::Unauthorized),
        (status = 403, description = "The request belongs to another requestor (code `forbidden`).", body = types::ErrorBody),
        (status = 404, description = "No such request (code `not_found`).", body = types::ErrorBody),
        (status = 409, description = "The request is not pending any more (code `conflict`).", body = types::ErrorBody),
        (status = 503, response = doc::Unavailable)
    )
)]
async fn cancel_request(
    State(api): State<Api>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response> {
    let caller = api.caller(&headers)?;
    api.refuse_if_stopping()?;
    let id = request_id(&id)?;
    let view = or_taken_in(&api, || {
        let (api, caller, c) = (api.clone(), caller.clone(), caller.clone());
        async move {
            api.handle()
                .act(caller, change::Cancel(id), move |pool, _| {
                    views::owned_request(pool, id, &c)
                })
                .await?
        }
    })
    .await?;
    Ok(json(StatusCode::OK, view))
}

/// Runs `look`, which names a request; if the pool does not know it, it
/// may be one that a process standing by accepted into the store's inbox
/// a moment ago: then the inbox is taken in and `look` runs again.
async fn or_taken_in<T, F>(api: &Api, look: impl Fn() -> F) -> Result<T>
where
    F: std::future::Future<Output = Result<T>>,
{
    match look().await {
        Err(e) if e.code == ErrorCode::NotFound && api.handle().shared() => {
            api.handle().take_in().await?;
            look().await
        }
        found => found,
    }
}

// ---- nodes ----------------------------------------------------------------

#[utoipa::path(
    get,
    path = "/v1/nodes",
    operation_id = "list_nodes",
    tag = "nodes",
    summary = "List nodes",
    description = "Every node matching the filters, oldest first. Every caller sees every node; `addresses` and `connection` are shown only to an admin or to the requestor holding the node.",
    security(("bearerAuth" = [])),
    extensions(("x-berth-roles" = json!(["client", "admin"]))),
    params(
        ("label" = Option<String>, Query, description = "Only nodes of this configured label."),
        ("provider" = Option<String>, Query, description = "Only nodes of this configured provider."),
        ("state" = inline(Option<types::NodeStateName>), Query, description = "Only nodes in this state."),
        ("requestor" = Option<String>, Query, description = "Only nodes handed out or set aside to this requestor.")
    ),
    responses(
        (status = 200, description = "The nodes.", body = [types::Node]),
        (status = 400, description = "An unknown parameter or state (code `bad_request`, `field` set).", body = types::ErrorBody),
        (status = 401, response = doc::Unauthorized),
        (status = 422, description = "Code `unknown_label` or `unknown_provider`: the `label` or `provider` filter names nothing configured (`field` set).", body = types::ErrorBody),
        (status = 503, response = doc::Unavailable)
    )
)]
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

#[utoipa::path(
    get,
    path = "/v1/nodes/{id}",
    operation_id = "get_node",
    tag = "nodes",
    summary = "Get a node",
    description = "`addresses` and `connection` are shown only to an admin or to the requestor holding the node.",
    security(("bearerAuth" = [])),
    extensions(("x-berth-roles" = json!(["client", "admin"]))),
    params(
        ("id" = String, Path, description = "A node id, as berth gives it (`n-` and 16 hex digits). Anything else is a 400 with `field` `id`.", pattern = "^n-[0-9a-f]{16}$", example = "n-00000000000000a1")
    ),
    responses(
        (status = 200, description = "The node.", body = types::Node),
        (status = 400, description = "A malformed `id` (code `bad_request`, `field` `id`).", body = types::ErrorBody),
        (status = 401, response = doc::Unauthorized),
        (status = 404, description = "No such node (code `not_found`).", body = types::ErrorBody),
        (status = 503, response = doc::Unavailable)
    )
)]
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

#[utoipa::path(
    post,
    path = "/v1/nodes/{id}/release",
    operation_id = "release_node",
    tag = "nodes",
    summary = "Give a node back",
    description = "Releases a node in use. A client may release only nodes its requestor holds; an admin any. No body.",
    security(("bearerAuth" = [])),
    extensions(("x-berth-roles" = json!(["client", "admin"]))),
    params(
        ("id" = String, Path, description = "A node id, as berth gives it (`n-` and 16 hex digits). Anything else is a 400 with `field` `id`.", pattern = "^n-[0-9a-f]{16}$", example = "n-00000000000000a1")
    ),
    responses(
        (status = 200, description = "The node after release.", body = types::Node),
        (status = 400, description = "A malformed `id` (code `bad_request`, `field` `id`).", body = types::ErrorBody),
        (status = 401, response = doc::Unauthorized),
        (status = 403, description = "The node is not held by the caller's requestor (code `forbidden`).", body = types::ErrorBody),
        (status = 404, description = "No such node (code `not_found`).", body = types::ErrorBody),
        (status = 409, description = "The node is not in use (code `conflict`).", body = types::ErrorBody),
        (status = 503, response = doc::Unavailable)
    )
)]
async fn release_node(
    State(api): State<Api>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response> {
    let caller = api.caller(&headers)?;
    api.refuse_if_stopping()?;
    let id = node_id(&id)?;
    node_change(&api, caller, change::Release(id), id).await
}

/// Makes `change` to node `id` for `caller`; the node as it stands once
/// the change is stored.
async fn node_change(
    api: &Api,
    caller: Caller,
    change: impl change::Change<Output = ()>,
    id: NodeId,
) -> Result<Response> {
    let c = caller.clone();
    let view = api
        .handle()
        .act(caller, change, move |pool, _| {
            views::node_by_id(pool, id, &c)
        })
        .await??;
    Ok(json(StatusCode::OK, view))
}

#[utoipa::path(
    put,
    path = "/v1/nodes/{id}/idle",
    operation_id = "set_idle",
    tag = "nodes",
    summary = "Set a node's idle behaviour (admin)",
    description = "What berth does with the node when nobody uses it: `run` (normal), `hold` (keep it) or `drain` (delete it once idle). Admin only.",
    security(("bearerAuth" = ["admin"])),
    extensions(("x-berth-roles" = json!(["admin"]))),
    params(
        ("id" = String, Path, description = "A node id, as berth gives it (`n-` and 16 hex digits). Anything else is a 400 with `field` `id`.", pattern = "^n-[0-9a-f]{16}$", example = "n-00000000000000a1")
    ),
    request_body(content = types::SetIdle),
    responses(
        (status = 200, description = "The node.", body = types::Node),
        (status = 400, description = "A malformed `id` or body (code `bad_request`); `field` is `id`, `body`, `idle` or an unknown field's name.", body = types::ErrorBody),
        (status = 401, response = doc::Unauthorized),
        (status = 403, description = "Not an admin token (code `forbidden`).", body = types::ErrorBody),
        (status = 404, description = "No such node (code `not_found`).", body = types::ErrorBody),
        (status = 409, description = "The node is gone or failed (code `conflict`).", body = types::ErrorBody),
        (status = 503, response = doc::Unavailable)
    )
)]
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
    let idle = asked.idle.parse::<Idle>().map_err(|_| {
        ApiError::bad(
            "idle",
            format!(
                "`{}` is not run, hold or drain",
                berth_core::text::printable(&asked.idle)
            ),
        )
    })?;
    node_change(&api, caller, change::SetIdle(id, idle), id).await
}

#[utoipa::path(
    delete,
    path = "/v1/nodes/{id}",
    operation_id = "delete_node",
    tag = "nodes",
    summary = "Delete a node (admin)",
    description = "Deletes the node whatever it is doing. Admin only.",
    security(("bearerAuth" = ["admin"])),
    extensions(("x-berth-roles" = json!(["admin"]))),
    params(
        ("id" = String, Path, description = "A node id, as berth gives it (`n-` and 16 hex digits). Anything else is a 400 with `field` `id`.", pattern = "^n-[0-9a-f]{16}$", example = "n-00000000000000a1")
    ),
    responses(
        (status = 200, description = "The node, now deleting.", body = types::Node),
        (status = 400, description = "A malformed `id` (code `bad_request`, `field` `id`).", body = types::ErrorBody),
        (status = 401, response = doc::Unauthorized),
        (status = 403, description = "Not an admin token (code `forbidden`).", body = types::ErrorBody),
        (status = 404, description = "No such node (code `not_found`).", body = types::ErrorBody),
        (status = 409, description = "The node is already deleting, gone or failed (code `conflict`).", body = types::ErrorBody),
        (status = 503, response = doc::Unavailable)
    )
)]
async fn delete_node(
    State(api): State<Api>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response> {
    let caller = api.caller(&headers)?;
    api.refuse_if_stopping()?;
    let id = node_id(&id)?;
    node_change(&api, caller, change::Delete(id), id).await
}

// ---- configuration and health ----------------------------------------------

#[utoipa::path(
    get,
    path = "/v1/labels",
    operation_id = "labels",
    tag = "config",
    summary = "Configured labels",
    description = "Every configured label with what the pool has of it now.",
    security(("bearerAuth" = [])),
    extensions(("x-berth-roles" = json!(["client", "admin"]))),
    responses(
        (status = 200, description = "The labels, in configuration order.", body = [types::Label]),
        (status = 400, response = doc::TakesNoQuery),
        (status = 401, response = doc::Unauthorized),
        (status = 503, response = doc::Unavailable)
    )
)]
async fn labels(State(api): State<Api>, headers: HeaderMap) -> Result<Response> {
    api.caller(&headers)?;
    let list = api.handle().inspect(views::labels).await?;
    Ok(json(StatusCode::OK, list))
}

#[utoipa::path(
    get,
    path = "/v1/providers",
    operation_id = "providers",
    tag = "config",
    summary = "Configured providers",
    description = "Every configured provider with its limits, usage and health.",
    security(("bearerAuth" = [])),
    extensions(("x-berth-roles" = json!(["client", "admin"]))),
    responses(
        (status = 200, description = "The providers, in configuration order.", body = [types::Provider]),
        (status = 400, response = doc::TakesNoQuery),
        (status = 401, response = doc::Unauthorized),
        (status = 503, response = doc::Unavailable)
    )
)]
async fn providers(State(api): State<Api>, headers: HeaderMap) -> Result<Response> {
    api.caller(&headers)?;
    let telemetry = api.inner.telemetry.clone();
    let providers = api.handle().providers().clone();
    let mut list = api
        .handle()
        .inspect(move |pool| views::providers(pool, &telemetry, &providers))
        .await?;
    // Each provider's lease, as this process (the pool's holder) last read
    // it: the process that carries out the provider's calls.
    if let Some(shards) = api.handle().shards() {
        let roster = shards.roster();
        for (p, lease) in list.iter_mut().zip(&roster.providers) {
            let Some(lease) = lease else { continue };
            p.holder = Some(lease.holder.clone());
            p.lease_expires = lease
                .expires
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| types::rfc3339(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
                .ok();
        }
    }
    Ok(json(StatusCode::OK, list))
}

#[utoipa::path(
    get,
    path = "/v1/drivers",
    operation_id = "drivers",
    tag = "config",
    summary = "Loaded drivers",
    security(("bearerAuth" = [])),
    extensions(("x-berth-roles" = json!(["client", "admin"]))),
    responses(
        (status = 200, description = "The loaded drivers.", body = [types::Driver]),
        (status = 400, response = doc::TakesNoQuery),
        (status = 401, response = doc::Unauthorized)
    )
)]
async fn drivers(State(api): State<Api>, headers: HeaderMap) -> Result<Response> {
    api.caller(&headers)?;
    Ok(json(
        StatusCode::OK,
        views::drivers(&api.handle().drivers()),
    ))
}

#[utoipa::path(
    post,
    path = "/v1/lease",
    operation_id = "renew_lease",
    tag = "requests",
    summary = "Renew a lease (heartbeat)",
    description = "Renews the requestor's lease until now plus `api.lease-ttl`. A requestor that lets its lease expire has its pending requests failed and its nodes in use taken back. A client renews only its own lease. No body.",
    security(("bearerAuth" = [])),
    extensions(("x-berth-roles" = json!(["client", "admin"]))),
    params(
        ("requestor" = Option<String>, Query, description = "Whose lease; default the token's name. Only an admin may name another.")
    ),
    responses(
        (status = 200, description = "The renewed lease.", body = types::Lease),
        (status = 400, description = "An unknown parameter (code `bad_request`, `field` set).", body = types::ErrorBody),
        (status = 401, response = doc::Unauthorized),
        (status = 403, description = "A client token named a requestor other than itself (code `forbidden`).", body = types::ErrorBody),
        (status = 503, response = doc::Unavailable)
    )
)]
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
    let ttl = api.handle().config().lease_ttl;
    let change = change::Renew {
        requestor: requestor.clone(),
        ttl,
    };
    let expires = api
        .handle()
        .act(caller, change, |_, expires| expires)
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
