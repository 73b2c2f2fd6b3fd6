//! The OpenAPI document, generated from the code: each handler's
//! `#[utoipa::path]` says what it takes and answers, the types derive their
//! schemas, and the router is built from those same handlers
//! ([`routes`]), so a route cannot be served without being described.
//! `tests/openapi.rs` holds the published document to what the `berth serve`
//! binary answers.

use std::sync::LazyLock;

use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::responses::{TakesNoQuery, Unauthorized, Unavailable};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{self, OpenApi as Document};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "berth",
        description = "Keeps pools of cloud machines ready and hands them out.\n\nClients ask for nodes by label (`POST /v1/requests`), wait for the request to be fulfilled, use the nodes and release them. Each requestor holds a lease, renewed by creating a request or by `POST /v1/lease`; if it is not renewed within `api.lease-ttl`, the requestor's pending requests fail and its nodes in use are taken back.\n\nAuth: `Authorization: Bearer <token>`. A client token acts only as the requestor of its name: it creates, reads and cancels its own requests, lists and reads nodes (connection details only for nodes it holds), releases nodes it holds, renews its own lease, and reads labels, providers, drivers and metrics. An admin token may do everything, for anyone. `/healthz`, `/readyz` and `/openapi.json` need no token.\n\nErrors are `ErrorBody` with a stable `code`; a 400 names the `field` at fault."
    ),
    tags((name = "health"), (name = "requests"), (name = "nodes"), (name = "config")),
    components(responses(Unauthorized, TakesNoQuery, Unavailable)),
    modifiers(&BearerAuth)
)]
struct Info;

/// The bearer scheme every authenticated operation names.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, doc: &mut Document) {
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some("A token from `[api.tokens.NAME]` with role `client` or `admin`; admin-only operations list `admin` here. With no tokens configured (allowed only on a loopback address), every caller is an admin named `anonymous`."))
            .build();
        doc.components
            .get_or_insert_with(openapi::Components::default)
            .add_security_scheme("bearerAuth", SecurityScheme::Http(scheme));
    }
}

/// Every route with its handler, and what each is documented to take and
/// answer.
pub(super) fn routes() -> utoipa_axum::router::OpenApiRouter<super::state::Api> {
    use super::config::*;
    use super::health::*;
    use super::nodes::*;
    use super::pool::*;
    use super::requests::*;
    use utoipa_axum::routes;
    utoipa_axum::router::OpenApiRouter::with_openapi(Info::openapi())
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
        .routes(routes!(openapi))
        .routes(routes!(create_request, list_requests))
        .routes(routes!(get_request, cancel_request))
        .routes(routes!(list_nodes))
        .routes(routes!(get_node, delete_node))
        .routes(routes!(release_node))
        .routes(routes!(set_idle))
        .routes(routes!(labels))
        .routes(routes!(providers))
        .routes(routes!(drivers))
        .routes(routes!(reload_drivers))
        .routes(routes!(rollback_driver))
        .routes(routes!(check_config))
        .routes(routes!(reload_config))
        .routes(routes!(renew_lease))
        .routes(routes!(super::events::events))
}

/// The document, built once.
pub fn document() -> &'static Document {
    static DOC: LazyLock<Document> = LazyLock::new(|| routes().split_for_parts().1);
    &DOC
}

/// An operation's methods (upper case) and the operations.
pub(super) fn operations(
    item: &openapi::PathItem,
) -> impl Iterator<Item = (&'static str, &openapi::path::Operation)> {
    [
        ("GET", &item.get),
        ("PUT", &item.put),
        ("POST", &item.post),
        ("DELETE", &item.delete),
        ("PATCH", &item.patch),
        ("HEAD", &item.head),
        ("OPTIONS", &item.options),
        ("TRACE", &item.trace),
    ]
    .into_iter()
    .filter_map(|(m, op)| op.as_ref().map(|op| (m, op)))
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
        (status = 400, response = TakesNoQuery)
    )
)]
pub(super) async fn openapi() -> Response {
    axum::Json(document()).into_response()
}

/// The operations that take no query parameters, read from the generated
/// OpenAPI document: a parameter sent to one of them is a mistake worth a
/// 400, not something to ignore. Operations that take parameters check them
/// themselves.
pub(super) fn takes_no_query(method: &axum::http::Method, path: &str) -> bool {
    use utoipa::openapi::path::ParameterIn;
    static NONE: std::sync::LazyLock<std::collections::HashSet<(&str, &str)>> =
        std::sync::LazyLock::new(|| {
            let mut none = std::collections::HashSet::new();
            for (path, item) in &document().paths.paths {
                for (method, op) in operations(item) {
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

pub(super) async fn no_query_where_none_is_taken(
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
