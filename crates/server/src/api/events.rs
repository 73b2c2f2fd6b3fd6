//! `GET /v1/events`: what the pool stores, as Server-Sent Events, resumed
//! from `Last-Event-ID` within the kept history
//! ([`crate::runtime::events`]).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream};
use tokio::sync::broadcast::error::RecvError;

use berth_types::ErrorCode;

use super::auth::Caller;
use super::edge::no_other_params;
use super::error::{ApiError, Result};
use super::state::Api;
use crate::runtime::events::{Event, Events, Resume};

/// The kinds of event a client may ask for.
const KINDS: [&str; 4] = ["request", "node", "provider", "driver"];

/// Which events a stream carries: of these kinds, and for a client token,
/// only its own.
struct Wanted {
    kinds: Vec<&'static str>,
    caller: Caller,
}

impl Wanted {
    fn takes(&self, e: &Event) -> bool {
        // A provider's state and its driver's are nobody's: every caller
        // sees them, as `GET /v1/providers` and `/v1/drivers` show them.
        self.kinds.contains(&e.kind)
            && (self.caller.is_admin()
                || e.requestor.is_none() && matches!(e.kind, "provider" | "driver")
                || e.requestor
                    .as_deref()
                    .is_some_and(|r| self.caller.may_act_for(r)))
    }
}

#[utoipa::path(
    get,
    path = "/v1/events",
    operation_id = "events",
    tag = "requests",
    summary = "The pool's changes, as they are stored (Server-Sent Events)",
    description = "A `text/event-stream`: an event for each request and node the pool stores, once it is stored (`event: request` or `event: node`; `data` is JSON: a request's `id`, `requestor`, `state`, `reason` and `nodes`, or a node's `id`, `label`, `provider`, `state`, `idle`, and its `request` and `requestor` if it has one), and for each change of a provider's state (`event: provider`: `provider`, `listed`, `list` (`ok`, `failing` with `list_error`, or `suspect`), `quota_paused_until`, `rate_limited_until`, `capacity_paused` as `[instance type, until]` pairs, and `store_mismatch`), and for each change of a provider's driver (`event: driver`: `provider`, `state` (`starting`, `up`, `failed` with `error`, `stopping`), the running `sha256` and `contract`, and `reload_error` as `[sha256, error]`), looked at every 250 ms. A client token gets only the events of its own requests and nodes, and the providers' and drivers'. Each event has an `id`; a client that reconnects with `Last-Event-ID` gets every event it missed, from the last 4096 this process kept. If its id is not among them (too old, from another berth process, or from before a restart), the stream starts with `event: reset`: read what you watch again. A client that falls more than 1024 events behind gets `event: reset` and the stream ends. The stream ends when berth stops. It counts against the long-polls that may wait at once: past them, it is answered `503` with `Retry-After: 1`.",
    security(("bearerAuth" = [])),
    extensions(("x-berth-roles" = json!(["client", "admin"]))),
    params(
        ("kinds" = Option<String>, Query, description = "Only these kinds, comma-separated: `request`, `node`, `provider`, `driver`. All by default."),
        ("Last-Event-ID" = Option<String>, Header, description = "The id of the last event received: the stream resumes after it.")
    ),
    responses(
        (status = 200, description = "The stream.", content_type = "text/event-stream", body = String),
        (status = 400, description = "An unknown parameter or kind (code `bad_request`, `field` set).", body = berth_types::ErrorBody),
        (status = 401, response = super::responses::Unauthorized),
        (status = 503, description = "As many streams and long polls wait as the server lets wait at once (code `busy`, with `Retry-After: 1`), or the service is unavailable.", body = berth_types::ErrorBody)
    )
)]
pub(super) async fn events(
    State(api): State<Api>,
    headers: HeaderMap,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Response> {
    let caller = api.caller(&headers)?;
    no_other_params(&q, &["kinds"])?;
    let kinds = match q.get("kinds") {
        None => KINDS.to_vec(),
        Some(asked) => (asked.split(','))
            .map(|k| {
                KINDS
                    .iter()
                    .copied()
                    .find(|known| *known == k.trim())
                    .ok_or_else(|| {
                        ApiError::bad(
                            "kinds",
                            format!(
                                "unknown kind `{k}`: the kinds are request, node, provider, driver"
                            ),
                        )
                    })
            })
            .collect::<Result<Vec<_>>>()?,
    };
    // Held for as long as the stream runs: streams and long polls share the
    // connections that may wait at once.
    let slot = match api.inner.waits.get() {
        None => None,
        Some(waits) => match waits.clone().try_acquire_owned() {
            Ok(slot) => Some(slot),
            Err(_) => {
                let mut busy = ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    ErrorCode::Busy,
                    "as many streams and long polls wait as berth lets wait at once: try again",
                )
                .into_response();
                (busy.headers_mut()).insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                return Ok(busy);
            }
        },
    };
    let last = (headers.get("last-event-id")).and_then(|v| v.to_str().ok());
    let events = api.handle().events().clone();
    let (resume, rx) = events.subscribe(last);
    let wanted = Wanted { kinds, caller };
    let body = axum::response::sse::Sse::new(stream_of(events, resume, rx, wanted, slot))
        .keep_alive(KeepAlive::default());
    Ok(body.into_response())
}

/// What a stream has left to send.
struct Streaming {
    events: Arc<Events>,
    /// Missed events still to send, oldest first; a reset first if the
    /// client's id was not in the history.
    backlog: std::collections::VecDeque<Sse>,
    rx: tokio::sync::broadcast::Receiver<Arc<Event>>,
    wanted: Wanted,
    ended: bool,
    _slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

fn stream_of(
    events: Arc<Events>,
    resume: Resume,
    rx: tokio::sync::broadcast::Receiver<Arc<Event>>,
    wanted: Wanted,
    slot: Option<tokio::sync::OwnedSemaphorePermit>,
) -> impl Stream<Item = std::result::Result<Sse, Infallible>> {
    let backlog = match resume {
        Resume::Reset => std::iter::once(reset(
            "the last event id is not in this process's history: read what you watch again",
        ))
        .collect(),
        Resume::From(missed) => (missed.iter())
            .filter(|e| wanted.takes(e))
            .map(|e| sse(&events, e))
            .collect(),
    };
    let state = Streaming {
        events,
        backlog,
        rx,
        wanted,
        ended: false,
        _slot: slot,
    };
    stream::unfold(state, |mut s| async move {
        if let Some(e) = s.backlog.pop_front() {
            return Some((Ok(e), s));
        }
        if s.ended {
            return None;
        }
        loop {
            let next = tokio::select! {
                next = s.rx.recv() => next,
                () = s.events.closed() => return None,
            };
            match next {
                Ok(e) if s.wanted.takes(&e) => {
                    let e = sse(&s.events, &e);
                    return Some((Ok(e), s));
                }
                Ok(_) => continue,
                Err(RecvError::Lagged(_)) => {
                    s.ended = true;
                    let e = reset("this stream fell too far behind: read what you watch again");
                    return Some((Ok(e), s));
                }
                Err(RecvError::Closed) => return None,
            }
        }
    })
}

fn sse(events: &Events, e: &Event) -> Sse {
    Sse::default()
        .id(events.id(e))
        .event(e.kind)
        .data(e.data.clone())
}

fn reset(why: &str) -> Sse {
    Sse::default()
        .event("reset")
        .data(serde_json::json!({ "reason": why }).to_string())
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;

    use super::*;

    /// A client that does not read while more events come than the stream
    /// may fall behind gets a reset, and its stream ends: it never goes on
    /// with a gap.
    #[tokio::test]
    async fn a_stream_that_falls_behind_gets_a_reset_and_ends() {
        let events = Arc::new(Events::new());
        let (resume, rx) = events.subscribe(None);
        let wanted = Wanted {
            kinds: KINDS.to_vec(),
            caller: Caller::Admin { name: "ops".into() },
        };
        let stream = stream_of(events.clone(), resume, rx, wanted, None);
        for _ in 0..2000 {
            events.push("node", None, "{}");
        }
        let sent: Vec<Sse> = stream.map(|e| e.unwrap()).collect().await;
        assert_eq!(sent.len(), 1, "the reset, then the end");
        let text = format!("{:?}", sent[0]);
        assert!(text.contains("reset"), "{text}");
    }
}
