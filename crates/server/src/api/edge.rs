//! The HTTP edge every call passes: bounded bodies, query parameters
//! where none are taken, methods not allowed, errors answered as JSON; and
//! reading a body, a node id or a request id, naming the field at fault.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::error::{ApiError, Result};
use super::state::Api;
use berth_core::pool::{NodeId, RequestId};
use berth_types::ErrorCode;

pub(super) async fn method_not_allowed(
    method: axum::http::Method,
    uri: axum::http::Uri,
) -> ApiError {
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
pub(super) const READYZ_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The most of a refused body that is read and thrown away before the
/// answer, so that the client, still sending, is not reset before it can
/// read the answer. A body declared larger is refused without reading it.
pub(super) const DRAIN_MAX: u64 = 16 << 20;

/// Reads a request's body before any handler runs, so that no handler
/// waits on a client: a body must be JSON (`Content-Type:
/// application/json`), at most [`MAX_BODY`], and arrive whole within
/// `body-timeout`. A refused body is read and dropped up to [`DRAIN_MAX`]
/// (within `body-timeout`) before the answer; one declared larger than that
/// is refused at once. The refusals close the connection.
pub(super) async fn bounded_body(
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

pub(super) enum BodyRead {
    Whole(Bytes),
    /// Over what was kept; read (and dropped) up to [`DRAIN_MAX`].
    TooLarge,
    Failed(String),
}

/// Reads `body` to its end, keeping it if it is at most `keep` bytes, and
/// reading no more than [`DRAIN_MAX`].
pub(super) async fn read_body(mut body: axum::body::Body, keep: usize) -> BodyRead {
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
pub(super) async fn errors_as_json(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
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

pub(super) fn json<T: serde::Serialize>(status: StatusCode, body: T) -> Response {
    (status, axum::Json(body)).into_response()
}

/// Reads a body as `T`, naming the field at fault (`labels.small`): an
/// unknown field, a wrong type and a key given twice are all refused.
pub(super) fn body<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T> {
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

pub(super) fn node_id(text: &str) -> Result<NodeId> {
    text.parse()
        .map_err(|()| ApiError::bad("id", format!("`{text}` is not a node id (n-…)")))
}

pub(super) fn request_id(text: &str) -> Result<RequestId> {
    text.parse()
        .map_err(|()| ApiError::bad("id", format!("`{text}` is not a request id (r-…)")))
}

pub(super) fn no_other_params(q: &BTreeMap<String, String>, known: &[&str]) -> Result<()> {
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
