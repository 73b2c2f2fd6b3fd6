//! What every handler shares: the pool's handle, the telemetry, the
//! `[api]` settings, whether the service is stopping, the relay.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::body::Body;
use axum::http::HeaderMap;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::auth;
use super::auth::Caller;
use super::error::{ApiError, Result};
use crate::runtime::{Handle, peers};
use crate::telemetry::Telemetry;

/// What every handler shares.
#[derive(Clone)]
pub struct Api {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) handle: Handle,
    pub(super) telemetry: Arc<Telemetry>,
    /// `[api]`: its limits, as read at start. Its tokens are kept apart,
    /// in `tokens`, where a reload swaps them.
    pub(super) settings: berth_config::ApiSettings,
    pub(super) stopping: AtomicBool,
    /// Passes calls to the pool's holder while this process stands by.
    pub(super) relay: Relay,
    /// Long-polls that may wait at once: fewer than the connections the
    /// server takes, so that clients waiting on their requests never hold
    /// every connection and health checks and admin calls always find
    /// room ([`Api::limit_waits`]). Without a limit, unbounded.
    pub(super) waits: std::sync::OnceLock<Arc<tokio::sync::Semaphore>>,
    /// The config file berth runs and its settings as last applied; unset
    /// for the embedded default and for embedders that give none.
    pub(super) config: std::sync::OnceLock<super::config::RunningConfig>,
    /// The API tokens: `[api.tokens]` as last applied (a config reload
    /// swaps them). Plain lock: held only to read or swap the `Arc`.
    pub(super) tokens: std::sync::RwLock<Arc<Vec<berth_config::Token>>>,
}

impl Api {
    pub fn new(
        handle: Handle,
        telemetry: Arc<Telemetry>,
        mut settings: berth_config::ApiSettings,
    ) -> Api {
        let tokens = std::mem::take(&mut settings.tokens);
        let relay = Relay::new(&handle);
        Api {
            inner: Arc::new(Inner {
                handle,
                telemetry,
                settings,
                stopping: AtomicBool::new(false),
                relay,
                waits: std::sync::OnceLock::new(),
                config: std::sync::OnceLock::new(),
                tokens: std::sync::RwLock::new(Arc::new(tokens)),
            }),
        }
    }

    /// At most `n` long-polls wait at once; one more is answered at once
    /// with the request's state (and `Retry-After: 1`), as a wait that has
    /// ended. Set once, by the server that knows its connection cap.
    pub fn limit_waits(&self, n: usize) {
        let _ = (self.inner.waits).set(Arc::new(tokio::sync::Semaphore::new(n)));
    }

    /// The config file berth runs, and its settings as read at start:
    /// what `POST /v1/config/check` compares a file with, and what
    /// `POST /v1/config/reload` reads again. Set once.
    pub fn config_file(&self, file: std::path::PathBuf, settings: Arc<berth_config::Settings>) {
        let running = super::config::RunningConfig::new(file, settings);
        let _ = self.inner.config.set(running);
    }

    /// `[api]` as read at start: its limits. Its `tokens` are empty here:
    /// the ones in force are kept apart, where a config reload swaps them.
    pub fn settings(&self) -> &berth_config::ApiSettings {
        &self.inner.settings
    }

    /// From now on, `/readyz` says 503 and changes are refused: the service
    /// is shutting down.
    pub fn stopping(&self) {
        self.inner.stopping.store(true, Ordering::SeqCst);
    }

    pub(super) fn handle(&self) -> &Handle {
        &self.inner.handle
    }
}

impl Api {
    pub(super) fn refuse_if_stopping(&self) -> Result<()> {
        if self.inner.stopping.load(Ordering::SeqCst) {
            Err(ApiError::stopping())
        } else {
            Ok(())
        }
    }

    /// Whether any API token is configured (else every caller is an admin).
    pub(super) fn tokens_configured(&self) -> bool {
        !self.tokens().is_empty()
    }

    pub(super) fn caller(&self, headers: &HeaderMap) -> Result<Caller> {
        auth::authenticate(&self.tokens(), headers)
    }

    /// The caller a token's secret names (the page's sign-in).
    pub(super) fn caller_of(&self, token: &str) -> Result<Caller> {
        auth::caller_of(&self.tokens(), token)
    }

    fn tokens(&self) -> Arc<Vec<berth_config::Token>> {
        (self.inner.tokens.read().unwrap_or_else(|e| e.into_inner())).clone()
    }
}

/// The HTTP client that relays calls; one per API, keeping connections to
/// the holder open. It goes through the connector of the providers' leases
/// ([`crate::runtime::peers`]: TLS to an `https://` holder), built once at
/// start; a process on a store of its own never stands by, and relays
/// nothing.
pub(super) struct Relay {
    pub(super) client: Client<peers::Connector, Body>,
}

impl Relay {
    pub(super) fn new(handle: &Handle) -> Relay {
        let connector = match handle.shards() {
            Some(shards) => shards.connector().clone(),
            None => peers::connector_with(rustls::RootCertStore::empty()),
        };
        Relay {
            client: Client::builder(TokioExecutor::new()).build(connector),
        }
    }
}
