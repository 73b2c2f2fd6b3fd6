//! `/v1/nodes`: list, read, release, set idle behaviour, delete.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::auth::Caller;
use super::edge::{body, json, node_id};
use super::error::{ApiError, Result};
use super::state::Api;
use super::{responses, views};
use crate::runtime::change;
use berth_core::pool::{Idle, NodeId};
use berth_types as types;

// ---- nodes ----------------------------------------------------------------

#[utoipa::path(
    get,
    path = "/v1/nodes",
    operation_id = "list_nodes",
    tag = "nodes",
    summary = "List nodes",
    description = "Every node matching the filters, oldest first. Every caller sees every node; `addresses`, `connection` and `metadata` are shown only to an admin or to the requestor holding the node (or for whom it is set aside).",
    security(("bearerAuth" = [])),
    extensions(("x-berth-roles" = json!(["client", "admin"]))),
    params(
        ("label" = Option<String>, Query, description = "Only nodes of this configured label."),
        ("provider" = Option<String>, Query, description = "Only nodes of this configured provider."),
        ("state" = inline(Option<types::NodeStateName>), Query, description = "Only nodes in this state."),
        ("requestor" = Option<String>, Query, description = "Only nodes handed out or set aside to this requestor."),
        ("meta.KEY" = Option<String>, Query, description = "Only nodes handed out or set aside to a request whose metadata holds KEY with this value, among those whose metadata the caller is shown; several `meta.` parameters must all match.")
    ),
    responses(
        (status = 200, description = "The nodes.", body = [types::Node]),
        (status = 400, description = "An unknown parameter or state, or a `meta.` parameter whose key is not a metadata key (code `bad_request`, `field` set).", body = types::ErrorBody),
        (status = 401, response = responses::Unauthorized),
        (status = 422, description = "Code `unknown_label` or `unknown_provider`: the `label` or `provider` filter names nothing configured (`field` set).", body = types::ErrorBody),
        (status = 503, response = responses::Unavailable)
    )
)]
pub(super) async fn list_nodes(
    State(api): State<Api>,
    headers: HeaderMap,
    Query(q): Query<BTreeMap<String, String>>,
) -> Result<Response> {
    let caller = api.caller(&headers)?;
    let filter = views::NodeFilter::parse(&q, &api.handle().config())?;
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
        (status = 401, response = responses::Unauthorized),
        (status = 404, description = "No such node (code `not_found`).", body = types::ErrorBody),
        (status = 503, response = responses::Unavailable)
    )
)]
pub(super) async fn get_node(
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
        (status = 401, response = responses::Unauthorized),
        (status = 403, description = "The node is not held by the caller's requestor (code `forbidden`).", body = types::ErrorBody),
        (status = 404, description = "No such node (code `not_found`).", body = types::ErrorBody),
        (status = 409, description = "The node is not in use (code `conflict`).", body = types::ErrorBody),
        (status = 503, response = responses::Unavailable)
    )
)]
pub(super) async fn release_node(
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
pub(super) async fn node_change(
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
        (status = 401, response = responses::Unauthorized),
        (status = 403, description = "Not an admin token (code `forbidden`).", body = types::ErrorBody),
        (status = 404, description = "No such node (code `not_found`).", body = types::ErrorBody),
        (status = 409, description = "The node is gone or failed (code `conflict`).", body = types::ErrorBody),
        (status = 503, response = responses::Unavailable)
    )
)]
pub(super) async fn set_idle(
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
        (status = 401, response = responses::Unauthorized),
        (status = 403, description = "Not an admin token (code `forbidden`).", body = types::ErrorBody),
        (status = 404, description = "No such node (code `not_found`).", body = types::ErrorBody),
        (status = 409, description = "The node is already deleting, gone or failed (code `conflict`).", body = types::ErrorBody),
        (status = 503, response = responses::Unavailable)
    )
)]
pub(super) async fn delete_node(
    State(api): State<Api>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response> {
    let caller = api.caller(&headers)?;
    api.refuse_if_stopping()?;
    let id = node_id(&id)?;
    node_change(&api, caller, change::Delete(id), id).await
}
