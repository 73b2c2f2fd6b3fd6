//! Answers many operations share, described once in the OpenAPI document
//! (`#/components/responses`). Only their schemas are read, so the types
//! are never built.

use berth_types::ErrorBody;
use utoipa::ToResponse;

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
