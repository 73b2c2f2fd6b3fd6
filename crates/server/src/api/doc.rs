//! The OpenAPI document, generated from the code: each handler's
//! `#[utoipa::path]` says what it takes and answers, the types derive their
//! schemas, and the router is built from those same handlers
//! ([`routes`]), so a route cannot be served without being described.
//! `tests/openapi.rs` holds the published document to what the `berth serve`
//! binary answers.

use std::sync::LazyLock;

use super::types::ErrorBody;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{self, OpenApi as Document};
use utoipa::{Modify, OpenApi, ToResponse};

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

// Answers many operations share, described once (`#/components/responses`).
// Only their schemas are read, so the types are never built.

/// No valid bearer token (code `unauthorized`).
#[derive(ToResponse)]
#[response(
    description = "No valid bearer token (code `unauthorized`). Carries `WWW-Authenticate: Bearer realm=\"berth\"`.",
    headers(("WWW-Authenticate" = String, description = "Always `Bearer realm=\"berth\"`."))
)]
#[allow(dead_code)]
pub(super) struct Unauthorized(ErrorBody);

/// A query parameter sent to an operation that takes none.
#[derive(ToResponse)]
#[response(
    description = "A query parameter: this operation takes none (code `bad_request`, `field` the parameter)."
)]
#[allow(dead_code)]
pub(super) struct TakesNoQuery(ErrorBody);

/// The pool cannot take the call now: every operation that reaches it.
#[derive(ToResponse)]
#[response(
    description = "berth is shutting down (code `stopping`), its store could not be written (code `store_unwritable`), its PostgreSQL store is out of reach (code `store_unavailable`, with `Retry-After: 1`), this process stands by and the pool's holder could not be reached or is changing hands (code `standby`, with `Retry-After: 1`), or its command queue is full (code `busy`, with `Retry-After: 1`); try again shortly."
)]
#[allow(dead_code)]
pub(super) struct Unavailable(ErrorBody);

/// Every route with its handler, and what each is documented to take and
/// answer.
pub(super) fn routes() -> utoipa_axum::router::OpenApiRouter<super::Api> {
    use super::*;
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
        .routes(routes!(renew_lease))
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
