//! Connecting to PostgreSQL, for the store and for what runs beside it on
//! connections of their own (the driver records, the providers' leases,
//! the inbox): what a connection is made with ([`Login`]: the url's
//! settings, a password file read again at each connect, TLS through rustls,
//! always verified), making one ([`connect`], [`connect_listening`], which
//! passes the server's notifications on), one made when first needed and
//! again when lost ([`LazyClient`]), and what they all share: the shortest
//! deadline of a call, the `NOTIFY` channel and its payloads, and the
//! SQLSTATE of a refused fence.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Client;
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::error::{StoreError, describe, pg};

/// The SQLSTATE `berth_fence` raises when the lease is not held.
pub(super) const FENCED: &str = "BE001";

/// The shortest deadline of a call to the database; a claimant's is twice
/// its lease TTL when that is longer (past it, the lease is lost anyway).
pub(crate) const DEADLINE_MIN: Duration = Duration::from_secs(5);

/// How long a connection attempt may take, unless the url's
/// `connect_timeout` says otherwise.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Keepalive on the store's connection: the first probe after this long
/// idle, then one every [`KEEPALIVE_INTERVAL`], and the connection is dead
/// after [`KEEPALIVE_RETRIES`] unanswered (about 16 s in all).
const KEEPALIVE_IDLE: std::time::Duration = std::time::Duration::from_secs(10);
const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);
const KEEPALIVE_RETRIES: u32 = 3;
/// How long data sent to the server may go unacknowledged before the
/// connection counts as dead (TCP_USER_TIMEOUT).
const UNACKNOWLEDGED_LIMIT: std::time::Duration = std::time::Duration::from_secs(15);

/// What a connection is made with.
#[derive(Clone)]
pub(super) struct Login {
    pub(super) settings: tokio_postgres::Config,
    /// Read again at each connect, so a rotated password is used.
    pub(super) password_file: Option<std::path::PathBuf>,
    /// TLS, used when the url asks for it (`sslmode=require`, `verify-ca`
    /// or `verify-full`); never without verifying the server.
    tls: MakeRustlsConnect,
}

impl Login {
    /// The settings of `url` (with `password`). With an `sslmode` that asks
    /// for TLS, the server's certificate must chain to a certificate of
    /// `ca_file` (PEM), or to the system's roots without one, and name the
    /// host connected to. libpq's `verify-ca` and `verify-full` are read as
    /// tokio-postgres's `require`, which berth always verifies in full;
    /// `prefer` (the default) connects without TLS, as berth never uses TLS
    /// it does not verify.
    pub(super) fn new(
        url: &str,
        password: Option<&str>,
        ca_file: Option<&std::path::Path>,
    ) -> Result<Login, StoreError> {
        let url = url
            .replace("sslmode=verify-full", "sslmode=require")
            .replace("sslmode=verify-ca", "sslmode=require");
        let mut settings: tokio_postgres::Config =
            url.parse().map_err(pg("reading the store's url"))?;
        let tls = if settings.get_ssl_mode() == SslMode::Require {
            tls_config(verifying_roots(ca_file)?)?
        } else {
            settings.ssl_mode(SslMode::Disable);
            tls_config(rustls::RootCertStore::empty())?
        };
        if let Some(p) = password {
            settings.password(p);
        }
        settings.application_name("berth");
        if settings.get_connect_timeout().is_none() {
            settings.connect_timeout(CONNECT_TIMEOUT);
        }
        // A server that vanishes without closing the socket (a broken
        // network, a dead host) is noticed in seconds, not hours: keepalive
        // probes on an idle connection, and a limit on how long written data
        // may go unacknowledged. The url's own settings win.
        if settings.get_keepalives_idle() == std::time::Duration::from_secs(2 * 60 * 60) {
            settings
                .keepalives_idle(KEEPALIVE_IDLE)
                .keepalives_interval(KEEPALIVE_INTERVAL)
                .keepalives_retries(KEEPALIVE_RETRIES);
        }
        if settings.get_tcp_user_timeout().is_none() {
            settings.tcp_user_timeout(UNACKNOWLEDGED_LIMIT);
        }
        Ok(Login {
            settings,
            password_file: None,
            tls,
        })
    }
}

/// The roots a server's certificate must chain to: those of `ca_file`, or
/// else the system's.
fn verifying_roots(ca_file: Option<&std::path::Path>) -> Result<rustls::RootCertStore, StoreError> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    let Some(path) = ca_file else {
        let found = rustls_native_certs::load_native_certs();
        roots.add_parsable_certificates(found.certs);
        if roots.is_empty() {
            let why = found
                .errors
                .first()
                .map(|e| format!(" ({e})"))
                .unwrap_or_default();
            return Err(StoreError::Tls(format!(
                "the system has no root certificates to verify the server with{why}; give the \
                 server's CA as `ca-file`"
            )));
        }
        return Ok(roots);
    };
    let shown = path.display();
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| StoreError::Tls(format!("reading the CA file {shown}: {e}")))?;
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(StoreError::Tls(format!(
            "the CA file {shown} holds no certificate berth can use"
        )));
    }
    Ok(roots)
}

/// TLS that trusts `roots`, with rustls' own protocol versions and the
/// `ring` provider.
fn tls_config(roots: rustls::RootCertStore) -> Result<MakeRustlsConnect, StoreError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

fn read_password(path: &std::path::Path) -> Result<String, StoreError> {
    let text = std::fs::read_to_string(path).map_err(|source| StoreError::PasswordFile {
        path: path.display().to_string(),
        source,
    })?;
    Ok(text.lines().next().unwrap_or_default().to_owned())
}

/// A new connection, with the password read now if it is in a file; the
/// connection's half is for the caller to run.
async fn dial(
    login: &Login,
) -> Result<
    (
        Client,
        tokio_postgres::Connection<
            tokio_postgres::Socket,
            <MakeRustlsConnect as tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>>::Stream,
        >,
    ),
    StoreError,
>{
    let mut settings = login.settings.clone();
    if let Some(path) = &login.password_file {
        settings.password(read_password(path)?);
    }
    settings
        .connect(login.tls.clone())
        .await
        .map_err(pg("connecting to PostgreSQL"))
}

/// Connects, with the password read now if it is in a file; the task that
/// runs the connection ends with it.
pub(super) async fn connect(
    login: &Login,
) -> Result<(Client, tokio::task::JoinHandle<()>), StoreError> {
    let (client, connection) = dial(login).await?;
    let connection = tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::error!(error = %describe(&e), "the connection to PostgreSQL ended");
        }
    });
    Ok((client, connection))
}

/// The channel on which a lease given up is announced (`NOTIFY`), with
/// the kind of lease as payload ([`NOTIFY_POOL`], [`NOTIFY_PROVIDERS`]).
pub(super) const LEASES_CHANNEL: &str = "berth_leases";
pub(super) const NOTIFY_POOL: &str = "pool";
pub(super) const NOTIFY_PROVIDERS: &str = "providers";
/// The same channel's payload for a request put into the inbox
/// (`inbox.rs`), for the pool's holder to take in.
pub(super) const NOTIFY_REQUESTS: &str = "requests";

/// A connection made when first needed and made again when lost, shared
/// by the calls of one user (the driver records, the inbox), which it
/// pipelines.
pub(super) struct LazyClient {
    login: Login,
    connected: tokio::sync::Mutex<Option<(Arc<Client>, tokio::task::JoinHandle<()>)>>,
}

impl LazyClient {
    pub(super) fn new(login: Login) -> LazyClient {
        LazyClient {
            login,
            connected: tokio::sync::Mutex::new(None),
        }
    }

    /// The connection, made again if it was lost.
    pub(super) async fn get(&self) -> Result<Arc<Client>, StoreError> {
        let mut connected = self.connected.lock().await;
        if let Some((client, _)) = connected.as_ref().filter(|(c, _)| !c.is_closed()) {
            return Ok(client.clone());
        }
        if let Some((_, task)) = connected.take() {
            task.abort();
        }
        let (client, task) = connect(&self.login).await?;
        let client = Arc::new(client);
        *connected = Some((client.clone(), task));
        Ok(client)
    }

    /// Closes the connection (one that stopped answering): the next
    /// [`LazyClient::get`] makes a new one.
    pub(super) async fn drop_connection(&self) {
        if let Some((_, task)) = self.connected.lock().await.take() {
            task.abort();
        }
    }
}

impl Drop for LazyClient {
    fn drop(&mut self) {
        if let Some((_, task)) = self.connected.get_mut().take() {
            task.abort();
        }
    }
}

/// Connects as [`connect`] does, with the server's notifications (their
/// payloads) passed on to the receiver returned.
pub(super) async fn connect_listening(
    login: &Login,
) -> Result<
    (
        Client,
        tokio::task::JoinHandle<()>,
        tokio::sync::mpsc::UnboundedReceiver<String>,
    ),
    StoreError,
> {
    let (client, mut connection) = dial(login).await?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        // Polling for messages is what drives the connection.
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(tokio_postgres::AsyncMessage::Notification(n))) => {
                    let _ = tx.send(n.payload().to_owned());
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::error!(error = %describe(&e), "the connection to PostgreSQL ended");
                    break;
                }
                None => break,
            }
        }
    });
    Ok((client, task, rx))
}
