//! `POST /internal/v1/calls`: a driver call that the pool's holder sends to
//! this process because this process holds the call's provider
//! (`runtime/shards.rs`). Not part of the public API: it takes the pool's
//! peer secret, not a token, and is answered only by a process on a
//! PostgreSQL store.
//!
//! `421 Misdirected Request` means the call was refused before anything was
//! done (this process does not hold the provider now, or last saw the pool
//! under another epoch), so the sender may send it again elsewhere.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::state::Api;
use crate::runtime::InFlight;
use crate::runtime::shards::{self, PEER_HEADER};

pub(super) async fn calls(State(api): State<Api>, headers: HeaderMap, body: Bytes) -> Response {
    let Some(shards) = api.handle().shards() else {
        return (
            StatusCode::NOT_FOUND,
            "this berth process does not share its pool with others\n",
        )
            .into_response();
    };
    let secret = headers.get(PEER_HEADER).map_or(&[][..], |v| v.as_bytes());
    if !shards.admits(secret) {
        return (
            StatusCode::UNAUTHORIZED,
            "the peer secret is missing or not this pool's\n",
        )
            .into_response();
    }
    let call: crate::runtime::wire::CallBody = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("the call cannot be read: {e}\n"),
            )
                .into_response();
        }
    };
    let (p, _running) = match shards.accept(&call.provider, call.pool_epoch) {
        Ok(taken) => taken,
        Err(why) => return (StatusCode::MISDIRECTED_REQUEST, why.to_string()).into_response(),
    };
    let _in_flight = InFlight::new(api.inner.telemetry.clone(), call.provider.as_str().into());
    let answer = shards::carry_out(api.handle().providers(), p, call.call).await;
    match serde_json::to_vec(&answer) {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the answer could not be written: {e}\n"),
        )
            .into_response(),
    }
}
