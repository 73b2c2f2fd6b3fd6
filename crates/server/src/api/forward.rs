//! A process standing by serves the API by passing each `/v1` call to the
//! process that holds the pool, and its answer back, as they are: the
//! holder authenticates, checks and answers; this process only relays.
//! The exception is `POST /v1/requests`, which a process standing by
//! accepts itself into the store's inbox (see `create_request`).
//! A call already relayed once is never relayed again (two processes that
//! each think the other holds the pool answer 503 instead of looping), and
//! a call relayed to a holder that is taken over before it answers is
//! answered 503 then, instead of waiting on it.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::{Api, ApiError};
use crate::runtime::ServiceError;

/// Marks a call relayed from a process standing by.
pub(super) const RELAYED: HeaderName = HeaderName::from_static("x-berth-relayed");

/// How long connecting to the holder may take before the call is answered
/// 503: the holder's host is down, and a new holder is coming.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The HTTP client that relays calls; one per API, keeping connections to
/// the holder open.
pub(super) struct Relay {
    client: Client<HttpConnector, Body>,
}

impl Relay {
    pub(super) fn new() -> Relay {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        connector.set_nodelay(true);
        Relay {
            client: Client::builder(TokioExecutor::new()).build(connector),
        }
    }
}

/// Headers that belong to one connection, not to the call (RFC 9110
/// section 7.6.1), and `host`, which is the holder's own.
fn hop_by_hop(name: &HeaderName) -> bool {
    name == header::CONNECTION
        || name == header::HOST
        || name == header::TE
        || name == header::TRAILER
        || name == header::TRANSFER_ENCODING
        || name == header::UPGRADE
        || name == header::PROXY_AUTHORIZATION
        || name == header::PROXY_AUTHENTICATE
        || name.as_str() == "keep-alive"
}

fn strip(headers: &mut axum::http::HeaderMap) {
    let names: Vec<HeaderName> = headers.keys().filter(|n| hop_by_hop(n)).cloned().collect();
    for name in names {
        headers.remove(name);
    }
}

/// The middleware: relays `/v1` calls while another process holds the pool.
pub(super) async fn relay(State(api): State<Api>, request: Request, next: Next) -> Response {
    if !request.uri().path().starts_with("/v1/") {
        return next.run(request).await;
    }
    let Some((holder, address)) = api.handle().standby() else {
        return next.run(request).await;
    };
    // A new request is accepted here, into the store's inbox, so that it
    // is taken whether or not the holder answers now.
    if request.method() == axum::http::Method::POST
        && request.uri().path() == "/v1/requests"
        && api.handle().shared()
    {
        return next.run(request).await;
    }
    let standby = || ServiceError::Standby {
        holder: holder.clone(),
        address: address.clone(),
    };
    if address.is_empty() || request.headers().contains_key(&RELAYED) {
        return ApiError::from(standby()).into_response();
    }
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let uri: Uri = match format!("{}{path}", address.trim_end_matches('/')).parse() {
        Ok(u) => u,
        Err(_) => return ApiError::from(standby()).into_response(),
    };
    let (mut parts, body) = request.into_parts();
    parts.uri = uri;
    strip(&mut parts.headers);
    parts.headers.insert(RELAYED, HeaderValue::from_static("1"));
    let sent = api
        .inner
        .relay
        .client
        .request(Request::from_parts(parts, body));
    // A holder that stopped answering (paused, cut off) is taken over;
    // the call is then not left waiting on it.
    let answered = tokio::select! {
        answered = sent => answered,
        () = api.handle().no_longer_held_by(&holder) => {
            tracing::warn!(%holder, %address, "the pool changed hands while a call was relayed to its old holder");
            return ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "standby",
                format!(
                    "the pool changed hands while this call was relayed to {holder} ({address}), \
                     which did not answer; whether it was carried out is not known: look before \
                     trying again"
                ),
            )
            .into_response();
        }
    };
    match answered {
        Ok(answer) => {
            let (mut parts, body) = answer.into_parts();
            strip(&mut parts.headers);
            Response::from_parts(parts, Body::new(body))
        }
        Err(e) => {
            tracing::warn!(%holder, %address, error = %e, "could not relay a call to the pool's holder");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "standby",
                format!(
                    "this berth process stands by, and the pool's holder {holder} ({address}) \
                     did not answer ({e}); nothing was changed here; try again shortly"
                ),
            )
            .into_response()
        }
    }
}
