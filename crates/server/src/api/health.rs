//! `/healthz`, `/readyz`, `/metrics`, `/openapi.json` and the fallback.

use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::edge::READYZ_WAIT;
use super::error::{ApiError, Result};
use super::responses;
use super::state::Api;
use crate::runtime::{Health, ServiceError};
use berth_core::pool::ListHealth;
use berth_types::{self as types, ErrorCode};

// ---- health, metrics, the description -----------------------------------

/// 200 while the pool runs, saying what keeps it from deciding if anything
/// does; 503 once its store could not be written (the process is about to
/// exit so that a supervisor restarts it).
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    tag = "health",
    summary = "Liveness",
    description = "Answers 200 while the process runs: `ok`, or what keeps it from deciding for now (its database does not answer, its lease is not certain), which a restart would not mend. Once its store could not be written the pool stops deciding and berth exits (code 3) so that a supervisor restarts it; until it has, this answers 503.",
    security(()),
    extensions(("x-berth-roles" = json!([]))),
    responses(
        (status = 200, description = "Alive.", body = String, content_type = "text/plain"),
        (status = 400, response = responses::TakesNoQuery),
        (status = 503, description = "The store could not be written (code `store_unwritable`).", body = types::ErrorBody)
    )
)]
pub(super) async fn healthz(State(api): State<Api>) -> Response {
    let handle = api.handle();
    if let Some(e) = handle.failure() {
        return ApiError::from(e).into_response();
    }
    // Alive either way: waiting out a database is what the process does
    // best, and a restart would wait the same. Said, so that whoever looks
    // knows.
    if let Some(late) = handle.lease_uncertain() {
        return format!(
            "alive; the pool's lease has not been renewed for {:.1}s past the time it was certain: \
             the database does not answer, and this process calls no cloud\n",
            late.as_secs_f64()
        )
        .into_response();
    }
    match handle.down() {
        Some(ServiceError::StoreUnavailable(why)) => {
            format!("alive; the store is out of reach, so this process decides nothing: {why}\n")
                .into_response()
        }
        _ => "ok\n".into_response(),
    }
}

#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = "health",
    summary = "Readiness",
    description = "Ready once every provider has been listed at least once since start; nothing is created on a provider until then. With a store shared by several berth processes, only the process holding the pool is ready; every process says which providers it holds (whose cloud calls it carries out).",
    security(()),
    extensions(("x-berth-roles" = json!([]))),
    responses(
        (status = 200, description = "Ready.", body = String, content_type = "text/plain"),
        (status = 400, response = responses::TakesNoQuery),
        (status = 503, description = "Not ready: code `not_ready` (the message names the providers not listed yet, or whose credential fails to be read or exchanged), `stopping` (shutting down), `store_unavailable` (the store is out of reach, or the pool's lease could not be renewed in time), `busy` (the pool's task did not answer within 2 s), or `standby` (another berth process holds the pool; this one relays `/v1` calls to it).", body = types::ErrorBody)
    )
)]
pub(super) async fn readyz(State(api): State<Api>) -> Response {
    if api.inner.stopping.load(Ordering::SeqCst) {
        return ApiError::stopping().into_response();
    }
    // Asked before the pool's task, which may be waiting on that database.
    if let Some(late) = api.handle().lease_uncertain() {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::StoreUnavailable,
            format!(
                "the pool's lease has not been renewed for {:.1}s past the time it was certain: \
                 the database does not answer, and this process calls no cloud until it does",
                late.as_secs_f64()
            ),
        )
        .into_response();
    }
    let providers = api.handle().providers().clone();
    let waiting = api.handle().inspect(move |pool| {
        let config = pool.config();
        let now = pool.last_tick();
        let sync = config.timings.sync_interval;
        (0..config.providers.len())
            .map(|i| berth_config::ProviderIx(i as u16))
            .filter_map(|p| {
                let s = pool.provider_status(p);
                let name = &config[p].name;
                // Lists not believed for a whole sync interval.
                let stale = match &s.list {
                    ListHealth::Failing { since, .. } | ListHealth::Suspect { since, .. }
                        if now.since(*since) >= sync =>
                    {
                        Some(format!(
                            "{name} (its lists are not believed since {}s)",
                            now.since(*since).as_secs()
                        ))
                    }
                    _ => None,
                };
                if let Some(why) = &s.mismatch {
                    return Some(format!("{name} (creates nothing: {why})"));
                }
                if let Some(c) = providers
                    .credentials(p)
                    .into_iter()
                    .find(|c| c.error.is_some())
                {
                    return Some(format!(
                        "{name} (its {} credential for {} fails: {})",
                        c.kind,
                        c.host,
                        c.error.unwrap_or_default()
                    ));
                }
                if s.listed {
                    return stale;
                }
                Some(match providers.health(p) {
                    Health::Failed { error, .. } => {
                        format!("{name} (could not start: {error})")
                    }
                    Health::Starting => format!("{name} (starting)"),
                    Health::Up => stale.unwrap_or_else(|| format!("{name} (not listed yet)")),
                })
            })
            .collect::<Vec<_>>()
    });
    // Bounded, so that a health check gets an answer while the pool's task
    // waits on something (its database) instead of hanging with it.
    let Ok(waiting) = tokio::time::timeout(READYZ_WAIT, waiting).await else {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Busy,
            format!(
                "the pool's task has not answered for {}s: it is waiting on its store or overloaded",
                READYZ_WAIT.as_secs()
            ),
        )
        .into_response();
    };
    // Which providers' calls this process carries out (a shared store).
    let held = api.handle().shards().map(|s| match s.held() {
        h if h.is_empty() => "; it holds no provider".to_owned(),
        h => format!(
            "; it holds provider(s) {} and carries out their cloud calls",
            h.join(", ")
        ),
    });
    match waiting {
        Err(e @ ServiceError::Standby(_)) => {
            let mut e = ApiError::from(e);
            e.message.push_str(held.as_deref().unwrap_or_default());
            e.into_response()
        }
        Err(e) => ApiError::from(e).into_response(),
        Ok(w) if w.is_empty() => match held {
            Some(held) => (
                StatusCode::OK,
                format!("ready: this process holds the pool{held}\n"),
            )
                .into_response(),
            None => (StatusCode::OK, "ready\n").into_response(),
        },
        Ok(w) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::NotReady,
            format!(
                "providers not ready: {}; nothing is created on a provider until it has been listed",
                w.join("; ")
            ),
        )
        .into_response(),
    }
}

#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    tag = "health",
    summary = "Prometheus metrics",
    description = "Any valid token.",
    security(("bearerAuth" = [])),
    extensions(("x-berth-roles" = json!(["client", "admin"]))),
    responses(
        (status = 200, description = "Metrics in the OpenMetrics text format 1.0.0, which Prometheus reads.", body = String, content_type = crate::metrics::CONTENT_TYPE),
        (status = 400, response = responses::TakesNoQuery),
        (status = 401, response = responses::Unauthorized),
        (status = 503, response = responses::Unavailable)
    )
)]
pub(super) async fn metrics(State(api): State<Api>, headers: HeaderMap) -> Result<Response> {
    api.caller(&headers)?;
    let telemetry = api.inner.telemetry.clone();
    let providers = api.handle().providers().clone();
    let (t, p) = (telemetry.clone(), providers.clone());
    let text = match api.handle().inspect(move |pool| t.render(pool, &p)).await {
        Ok(text) => text,
        // Every process serves its own metrics: one standing by, or whose
        // store is out of reach, without the pool's gauges.
        Err(ServiceError::Standby(_) | ServiceError::StoreUnavailable(_)) => {
            telemetry.render_alone(&api.handle().config(), &providers)
        }
        Err(e) => return Err(e.into()),
    };
    Ok(([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response())
}

pub(super) async fn not_found() -> ApiError {
    ApiError::not_found("no such route; see /openapi.json")
}
