//! What every handler shares: the pool's handle, the telemetry, the
//! `[api]` settings, whether the service is stopping, the relay.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use std::time::Duration;

use axum::body::Body;
use axum::http::HeaderMap;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::auth;
use super::auth::Caller;
use super::error::{ApiError, Result};
use crate::runtime::Handle;
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
        let relay = Relay::new(&settings);
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
        !(self.inner.tokens.read().unwrap_or_else(|e| e.into_inner())).is_empty()
    }

    pub(super) fn caller(&self, headers: &HeaderMap) -> Result<Caller> {
        let tokens = self
            .inner
            .tokens
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        auth::authenticate(&tokens, headers)
    }
}

/// How long connecting to the holder may take before the call is answered
/// 503: the holder's host is down, and a new holder is coming.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The HTTP client that relays calls; one per API, keeping connections to
/// the holder open. It speaks TLS to an `https://` holder, trusting the
/// system's roots and `api.tls-peer-ca`.
pub(super) struct Relay {
    pub(super) client: Client<HttpsConnector<HttpConnector>, Body>,
}

impl Relay {
    pub(super) fn new(settings: &berth_config::ApiSettings) -> Relay {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        connector.set_nodelay(true);
        connector.enforce_http(false);
        let roots = relay_roots(settings).unwrap_or_else(|problem| {
            tracing::error!(%problem, "calls relayed to the pool's holder trust the system's roots only");
            native_roots()
        });
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        Relay {
            client: Client::builder(TokioExecutor::new()).build(connector),
        }
    }
}

/// The roots a call relayed to another process of the fleet trusts: with
/// TLS on this API (a fleet serves TLS on every process), the system's and
/// `api.tls-peer-ca`'s; without, none. An error names the file.
pub fn relay_roots(
    settings: &berth_config::ApiSettings,
) -> std::result::Result<rustls::RootCertStore, berth_config::Problem> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let Some(tls) = &settings.tls else {
        return Ok(rustls::RootCertStore::empty());
    };
    let mut roots = native_roots();
    let Some(file) = &tls.peer_ca else {
        return Ok(roots);
    };
    let shown = file.display();
    let problem = |message| berth_config::Problem::at("api.tls-peer-ca", message);
    let certs = CertificateDer::pem_file_iter(file)
        .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|e| problem(format!("{shown}: cannot read its certificates: {e}")))?;
    if certs.is_empty() {
        return Err(problem(format!(
            "{shown}: no certificate (a PEM `BEGIN CERTIFICATE` block) in it"
        )));
    }
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| problem(format!("{shown}: a certificate rustls cannot use: {e}")))?;
    }
    Ok(roots)
}

/// The system's trusted roots, those that can be read.
fn native_roots() -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(found.certs);
    roots
}
