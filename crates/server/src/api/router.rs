//! The routes: every documented handler ([`doc::routes`]), the calls
//! between processes, and the layers every call passes.

use axum::Router;

use super::doc::no_query_where_none_is_taken;
use super::edge::{bounded_body, errors_as_json, method_not_allowed};
use super::health::not_found;
use super::state::Api;
use super::{doc, forward, peer, ui};

impl Api {
    /// The routes.
    pub fn router(&self) -> Router {
        let (routes, _) = doc::routes().split_for_parts();
        routes
            .route_layer(axum::middleware::from_fn(no_query_where_none_is_taken))
            .route(
                crate::runtime::shards::CALLS_PATH,
                axum::routing::post(peer::calls),
            )
            .merge(ui::routes())
            .fallback(not_found)
            .method_not_allowed_fallback(method_not_allowed)
            .layer(axum::middleware::from_fn_with_state(
                self.clone(),
                forward::relay,
            ))
            // Outside the relay: a call the page signed in with its cookie
            // is relayed with the cookie's token as its bearer token.
            .layer(axum::middleware::from_fn_with_state(
                self.clone(),
                ui::cookie_auth,
            ))
            .layer(axum::middleware::from_fn_with_state(
                self.clone(),
                bounded_body,
            ))
            .layer(axum::middleware::from_fn(errors_as_json))
            .with_state(self.clone())
    }
}
