//! A process standing by serves the API by passing each `/v1` call to the
//! process that holds the pool, and its answer back, as they are: the
//! holder authenticates, checks and answers; this process only relays.
//! Calls about the process's own config file and drivers (`/v1/config/…`,
//! `/v1/drivers…`) are answered by the process called.
//! The other exception is `POST /v1/requests` ([`offer`]): a process standing by
//! draws the request's id, offers the request to the holder under it, and
//! accepts it itself into the store's inbox under the same id if the
//! holder does not take it in time, so a new request is taken whether or
//! not the holder answers, and never twice.
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

use super::error::ApiError;
use super::state::Api;
use crate::runtime::{Holder, Mode, ServiceError};
use berth_types::ErrorCode;

/// Marks a call relayed from a process standing by.
pub(super) const RELAYED: HeaderName = HeaderName::from_static("x-berth-relayed");

/// The id a process standing by drew for a new request it offers to the
/// pool's holder; taken only with the pool's peer secret.
pub(super) const REQUEST_ID: HeaderName = HeaderName::from_static("x-berth-request-id");

/// How long a process standing by waits for the pool's holder to answer a
/// new request it offers, before it accepts the request into the store's
/// inbox instead. A hand-out takes milliseconds; a holder this late is
/// stalled, stopped or gone.
const PATIENCE: Duration = Duration::from_millis(250);

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

/// Calls about this process's own config file and drivers, answered by the
/// process called and never relayed: each process of a fleet reloads its
/// own file and drivers, and shows its own.
fn about_this_process(path: &str) -> bool {
    path.starts_with("/v1/config/") || path == "/v1/drivers" || path.starts_with("/v1/drivers/")
}

/// The middleware: relays `/v1` calls while another process holds the pool.
pub(super) async fn relay(State(api): State<Api>, request: Request, next: Next) -> Response {
    if !request.uri().path().starts_with("/v1/") {
        return next.run(request).await;
    }
    let Mode::Standby(holder) = api.handle().mode() else {
        return next.run(request).await;
    };
    if about_this_process(request.uri().path()) {
        return next.run(request).await;
    }
    // A new request is offered to the holder by the handler, and taken
    // here if the holder does not answer in time (`offer`).
    if request.method() == axum::http::Method::POST
        && request.uri().path() == "/v1/requests"
        && api.handle().shared()
    {
        return next.run(request).await;
    }
    let standby = || ServiceError::Standby(holder.clone());
    let Some(Holder {
        name: holder,
        address,
    }) = holder
        .clone()
        .filter(|h| !h.address.is_empty() && !request.headers().contains_key(&RELAYED))
    else {
        return ApiError::from(standby()).into_response();
    };
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
                ErrorCode::Standby,
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
        Ok(answer) => passed_back(answer),
        Err(e) => {
            let e = berth_core::text::causes(&e);
            tracing::warn!(%holder, %address, error = %e, "could not relay a call to the pool's holder");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::Standby,
                format!(
                    "this berth process stands by, and the pool's holder {holder} ({address}) \
                     did not answer ({e}); nothing was changed here; try again shortly"
                ),
            )
            .into_response()
        }
    }
}

/// Offers a new request (the client's `headers` and `body`) to the pool's
/// `holder` at `address` under `id`, with the pool's peer secret: the
/// holder's answer if it gives one within [`PATIENCE`] that is not a 5xx,
/// passed back as it is. `None` when the request is this process's to
/// accept into the store's inbox, under the same id: no holder is known,
/// it cannot be reached, it is too slow, or it could not take the request
/// (a holder that took it anyway has it under `id`, and the inbox entry is
/// then only removed).
pub(super) async fn offer(
    api: &Api,
    holder: Option<&Holder>,
    headers: &axum::http::HeaderMap,
    body: axum::body::Bytes,
    id: berth_core::pool::RequestId,
) -> Option<Response> {
    let secret = api.handle().shards()?.peer_secret();
    let Holder {
        name: holder,
        address,
    } = holder?;
    if address.is_empty() {
        return None;
    }
    let uri: Uri = format!("{}/v1/requests", address.trim_end_matches('/'))
        .parse()
        .ok()?;
    let mut request = Request::new(Body::from(body));
    *request.method_mut() = axum::http::Method::POST;
    *request.uri_mut() = uri;
    *request.headers_mut() = headers.clone();
    strip(request.headers_mut());
    let added = request.headers_mut();
    added.insert(RELAYED, HeaderValue::from_static("1"));
    added.insert(REQUEST_ID, HeaderValue::from_str(&id.to_string()).ok()?);
    added.insert(
        HeaderName::from_static(crate::runtime::shards::PEER_HEADER),
        HeaderValue::from_str(secret).ok()?,
    );
    let sent = api.inner.relay.client.request(request);
    let answer = match tokio::time::timeout(PATIENCE, sent).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => {
            let e = berth_core::text::causes(&e);
            tracing::warn!(%holder, %address, error = %e, request = %id, "could not offer a new request to the pool's holder: accepted here, into the store's inbox");
            return None;
        }
        Err(_) => {
            tracing::warn!(%holder, %address, request = %id, "the pool's holder did not answer a new request within 250 ms: accepted here, into the store's inbox");
            return None;
        }
    };
    if answer.status().is_server_error() {
        tracing::info!(%holder, status = %answer.status(), request = %id, "the pool's holder could not take a new request: accepted here, into the store's inbox");
        return None;
    }
    Some(passed_back(answer))
}

/// The holder's answer as this process gives it to the client: as it is,
/// without the headers of the holder's connection.
fn passed_back(answer: axum::http::Response<hyper::body::Incoming>) -> Response {
    let (mut parts, body) = answer.into_parts();
    strip(&mut parts.headers);
    Response::from_parts(parts, Body::new(body))
}
