//! `/v1/labels`, `/v1/providers`, `/v1/drivers`, and the requestor's
//! lease (`/v1/lease`).

use std::collections::BTreeMap;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::edge::{json, no_other_params};
use super::error::{ApiError, Result};
use super::state::Api;
use super::{responses, views};
use crate::runtime::{RollbackError, Trigger, change};
use berth_types::{self as types, ErrorCode};

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
        (status = 400, response = responses::TakesNoQuery),
        (status = 401, response = responses::Unauthorized),
        (status = 503, response = responses::Unavailable)
    )
)]
pub(super) async fn labels(State(api): State<Api>, headers: HeaderMap) -> Result<Response> {
    api.caller(&headers)?;
    let mut list = api.handle().inspect(views::labels).await?;
    let times = api.handle().events().time_to_ready();
    for label in &mut list {
        label.time_to_ready = times.get(&label.name).map(|q| types::TimeToReady {
            p50_s: q.p50.as_secs_f64(),
            p95_s: q.p95.as_secs_f64(),
            nodes: q.nodes,
        });
    }
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
        (status = 400, response = responses::TakesNoQuery),
        (status = 401, response = responses::Unauthorized),
        (status = 503, response = responses::Unavailable)
    )
)]
pub(super) async fn providers(State(api): State<Api>, headers: HeaderMap) -> Result<Response> {
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
        (status = 400, response = responses::TakesNoQuery),
        (status = 401, response = responses::Unauthorized)
    )
)]
pub(super) async fn drivers(State(api): State<Api>, headers: HeaderMap) -> Result<Response> {
    api.caller(&headers)?;
    Ok(json(
        StatusCode::OK,
        views::drivers(&api.handle().drivers()),
    ))
}

#[utoipa::path(
    post,
    path = "/v1/drivers/reload",
    operation_id = "reload_drivers",
    tag = "config",
    summary = "Reload the driver files (admin)",
    description = "Reads every started provider's driver file again. A provider whose file changed switches to the new driver once it has loaded and configured on a fresh instance; calls under way finish in the driver they started in. A file that fails any check leaves its provider on the driver it runs, with the reason (`failed`). A file that failed before, or was rolled back from, is loaded again too. This process's drivers only: on a pool shared by several processes, ask each. Answers once every provider is done. No body. Admin only.",
    security(("bearerAuth" = ["admin"])),
    extensions(("x-berth-roles" = json!(["admin"]))),
    responses(
        (status = 200, description = "What the reload did, per provider, in configuration order.", body = [types::DriverReload]),
        (status = 400, response = responses::TakesNoQuery),
        (status = 401, response = responses::Unauthorized),
        (status = 403, description = "Not an admin token (code `forbidden`).", body = types::ErrorBody),
        (status = 503, response = responses::Unavailable)
    )
)]
pub(super) async fn reload_drivers(State(api): State<Api>, headers: HeaderMap) -> Result<Response> {
    admin(&api, &headers)?;
    let providers = api.handle().providers().clone();
    let outcomes = providers.reload(Trigger::Asked).await;
    let list: Vec<types::DriverReload> = (outcomes.into_iter())
        .map(|(p, o)| views::driver_reload(p, o))
        .collect();
    Ok(json(StatusCode::OK, list))
}

#[utoipa::path(
    post,
    path = "/v1/drivers/{provider}/rollback",
    operation_id = "rollback_driver",
    tag = "config",
    summary = "Return a provider to its previous driver (admin)",
    description = "Switches the provider back to the driver it ran before its last switch (`previous_sha256` in `/v1/drivers`), once that has configured on a fresh instance, and keeps the one it leaves as the previous. A change of the file does not load the driver left again; a reload an operator asks for, or a file with other bytes, does. Lasts until berth restarts, which loads the file: put the previous file back to keep it. No body. Admin only.",
    security(("bearerAuth" = ["admin"])),
    extensions(("x-berth-roles" = json!(["admin"]))),
    params(
        ("provider" = String, Path, description = "A configured provider's name.")
    ),
    responses(
        (status = 200, description = "The provider, switched.", body = types::DriverReload),
        (status = 400, response = responses::TakesNoQuery),
        (status = 401, response = responses::Unauthorized),
        (status = 403, description = "Not an admin token (code `forbidden`).", body = types::ErrorBody),
        (status = 404, description = "No such provider (code `not_found`).", body = types::ErrorBody),
        (status = 409, description = "The provider has not started, has run no other driver, or its previous driver failed to start again (code `conflict`).", body = types::ErrorBody),
        (status = 503, response = responses::Unavailable)
    )
)]
pub(super) async fn rollback_driver(
    State(api): State<Api>,
    headers: HeaderMap,
    Path(provider): Path<String>,
) -> Result<Response> {
    admin(&api, &headers)?;
    let providers = api.handle().providers().clone();
    match providers.rollback(&provider).await {
        Ok(outcome) => Ok(json(
            StatusCode::OK,
            views::driver_reload(provider, outcome),
        )),
        Err(e @ RollbackError::Unknown(_)) => Err(ApiError::not_found(e.to_string())),
        Err(e) => Err(ApiError::new(
            StatusCode::CONFLICT,
            ErrorCode::Conflict,
            e.to_string(),
        )),
    }
}

/// Refuses a caller that is not an admin, and any change while stopping.
pub(super) fn admin(api: &Api, headers: &HeaderMap) -> Result<()> {
    if !api.caller(headers)?.is_admin() {
        return Err(ApiError::forbidden("only an admin token may do this"));
    }
    api.refuse_if_stopping()
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
        (status = 401, response = responses::Unauthorized),
        (status = 403, description = "A client token named a requestor other than itself (code `forbidden`).", body = types::ErrorBody),
        (status = 503, response = responses::Unavailable)
    )
)]
pub(super) async fn renew_lease(
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
    let ttl = api.handle().config().requestor_lease_ttl;
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
