//! `/v1/requests`: create (offered to the pool's holder, or into the
//! store's inbox, while this process stands by), list, read, cancel.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;

use super::edge::{body, json, no_other_params, request_id};
use super::error::{ApiError, Result};
use super::state::Api;
use super::{forward, responses, views};
use crate::runtime::{Mode, ServiceError, change};
use berth_core::pool::{RequestId, Submitted};
use berth_types::MAX_WAIT;
use berth_types::{self as types, ErrorCode};

// ---- requests -------------------------------------------------------------

#[utoipa::path(
    post,
    path = "/v1/requests",
    operation_id = "create_request",
    tag = "requests",
    summary = "Ask for nodes",
    description = "Asks for a set of nodes, handed out together once all are ready. Creating a request renews the requestor's lease (`api.lease-ttl`). A client token acts only as its own requestor; an admin may name any. Answers 201 with the new request and a `Location` header; follow it with `GET /v1/requests/{id}?wait=…`. On a berth process standing by (several processes on one PostgreSQL store), the request is passed to the process holding the pool; if that one does not answer within 250 ms, it is accepted into the store's request inbox, durably, and answered `pending`, and the holder takes it in once it can. With an `Idempotency-Key`, a call sent again (after a timeout, a restart of berth, or through another process of the fleet) answers 200 with the request the first call made, as it is now, instead of making another; the same key with another body is refused with 422. The key is the requestor's: two requestors' keys never meet. It is kept with its request for `idempotency-ttl` (default 24 h) after the request was made.",
    security(("bearerAuth" = [])),
    extensions(("x-berth-roles" = json!(["client", "admin"]))),
    params(
        ("Idempotency-Key" = Option<String>, Header, description = "1 to 255 visible ASCII characters (a UUID, say), chosen by the client for this request. Sent again with the same body, the call answers the request the key made (200) instead of making another.")
    ),
    request_body(content = types::NewRequest),
    responses(
        (status = 201, description = "Created; the request as it is now (normally `pending`).", body = types::Request, headers(("Location" = String, description = "`/v1/requests/{id}` of the new request."))),
        (status = 200, description = "The `Idempotency-Key` made this request before (with the same body): the request as it is now, which may have been fulfilled since.", body = types::Request, headers(("Location" = String, description = "`/v1/requests/{id}` of the request."))),
        (status = 400, description = "Malformed body or header (code `bad_request`); `field` names what is wrong: `body`, `labels`, `labels.NAME`, `priority`, `requestor`, `metadata`, `metadata.KEY`, `Idempotency-Key` or an unknown field's name.", body = types::ErrorBody),
        (status = 401, response = responses::Unauthorized),
        (status = 403, description = "A client token named a requestor other than itself, or the call carries `x-berth-request-id` (for berth processes offering a request to the pool's holder) without the pool's peer secret (code `forbidden`).", body = types::ErrorBody),
        (status = 404, description = "The request was forgotten at once (code `not_found`); should not happen.", body = types::ErrorBody),
        (status = 422, description = "Code `unknown_label` (no such label; `field` is `labels.NAME`), `unsatisfiable` (a count the providers' configured limits can never allow), `metadata_too_large` (more than 32 keys or 4096 bytes, `field` `metadata`; a value over 512 bytes, `field` `metadata.KEY`) or `idempotency_key_reused` (the key made a request with another body; `field` `Idempotency-Key`).", body = types::ErrorBody),
        (status = 503, response = responses::Unavailable)
    )
)]
pub(super) async fn create_request(
    State(api): State<Api>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    let caller = api.caller(&headers)?;
    api.refuse_if_stopping()?;
    let asked: types::NewRequest = self::body(&body)?;
    let config = api.handle().config();
    let mut new = berth_core::pool::read_request(
        &config,
        asked.requestor,
        caller.name(),
        asked.priority,
        asked.labels.iter().map(|(name, n)| (name.as_str(), *n)),
    )?;
    new.metadata = berth_core::pool::read_metadata(asked.metadata)?;
    new.key = match headers.get(IDEMPOTENCY_KEY) {
        Some(key) => Some(berth_core::pool::read_key(key.as_bytes())?),
        None => None,
    };
    // A request taken is a sign of life: its requestor's lease is renewed
    // with it (a refused one renews nothing).
    let standby = match api.handle().mode() {
        Mode::Standby(holder) if api.handle().shared() => Some(holder),
        _ => None,
    };
    let (id, fresh, view) = if let Some(holder) = standby {
        // Another process holds the pool. Offered to it under an id drawn
        // here (or the one its key names); taken here, into the store's
        // inbox under the same id, if it does not answer in time.
        if headers.contains_key(&forward::RELAYED) {
            // Two processes that each think the other holds the pool.
            return Err(ServiceError::Standby(holder).into());
        }
        api.handle().may_take(&caller, &new)?;
        let id = match &new.key {
            Some(key) => berth_core::pool::keyed_id(&new.requestor, key),
            None => RequestId(rand::random()),
        };
        if let Some(answer) = forward::offer(&api, holder.as_ref(), &headers, body, id).await {
            return Ok(answer);
        }
        let (request, fresh) = api.handle().send_to_inbox(id, new).await?;
        api.inner.telemetry.request_inboxed();
        (id, fresh, views::pending(&config, &request))
    } else {
        let change = change::Submit {
            new,
            lease: Some(config.requestor_lease_ttl),
            id: given_id(&api, &headers)?,
        };
        let c = caller.clone();
        let (submitted, view) = api
            .handle()
            .act(caller, change, move |pool, s: Submitted| {
                (s, views::request(pool, s.id, &c))
            })
            .await?;
        let view = view.ok_or_else(|| ApiError::not_found("the request was forgotten at once"))?;
        (submitted.id, submitted.fresh, view)
    };
    // A key given again answers the request it made, as it is now.
    let status = if fresh {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let mut r = json(status, view);
    if let Ok(v) = header::HeaderValue::from_str(&format!("/v1/requests/{id}")) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    Ok(r)
}

/// The header a client names a request's idempotency key with.
pub(super) const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// The header as an error's `field` names it.
pub(super) const IDEMPOTENCY_KEY_FIELD: &str = "Idempotency-Key";

/// The id a process standing by drew for a request it offers here
/// (`forward::offer`): taken only from a call that carries the pool's peer
/// secret.
pub(super) fn given_id(api: &Api, headers: &HeaderMap) -> Result<Option<RequestId>> {
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
        ("requestor" = Option<String>, Query, description = "Only this requestor's requests."),
        ("meta.KEY" = Option<String>, Query, description = "Only requests whose metadata holds KEY with this value; several `meta.` parameters must all match.")
    ),
    responses(
        (status = 200, description = "The requests.", body = [types::Request]),
        (status = 400, description = "An unknown parameter, a bad `state` or a `meta.` parameter whose key is not a metadata key (code `bad_request`, `field` set).", body = types::ErrorBody),
        (status = 401, response = responses::Unauthorized),
        (status = 503, response = responses::Unavailable)
    )
)]
pub(super) async fn list_requests(
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
        (status = 401, response = responses::Unauthorized),
        (status = 403, description = "The request belongs to another requestor (code `forbidden`).", body = types::ErrorBody),
        (status = 404, description = "No such request (code `not_found`).", body = types::ErrorBody),
        (status = 503, response = responses::Unavailable)
    )
)]
pub(super) async fn get_request(
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
        (status = 401, response = responses::Unauthorized),
        (status = 403, description = "The request belongs to another requestor (code `forbidden`).", body = types::ErrorBody),
        (status = 404, description = "No such request (code `not_found`).", body = types::ErrorBody),
        (status = 409, description = "The request is not pending any more (code `conflict`).", body = types::ErrorBody),
        (status = 503, response = responses::Unavailable)
    )
)]
pub(super) async fn cancel_request(
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
pub(super) async fn or_taken_in<T, F>(api: &Api, look: impl Fn() -> F) -> Result<T>
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
