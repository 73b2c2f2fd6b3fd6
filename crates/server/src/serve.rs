//! `berth serve`: the pool and its HTTP API as one long-running service.
//!
//! With a config file it runs what the file says. Without one it runs the
//! embedded default: a simulated cloud inside the process, the sim driver
//! carried in the binary, three example labels that keep nodes ready, and
//! the store under `./berth-data`, so a new user sees a working pool at once.
//!
//! Stopping (SIGTERM or SIGINT): the API refuses new changes and `/readyz`
//! turns 503, driver calls in flight are finished and stored, then the
//! listener closes. Nodes stay in the cloud and are adopted on the next start.
//! A store that cannot be written stops the pool at once and ends `serve`
//! with an error (docs/api.md, "Stopping", has the exit statuses).

mod http;
mod sys;
mod systemd;
mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::api::{Api, Telemetry};
use crate::runtime::{self, Service, StartOptions};
use berth_config::{self as config, Config};
use berth_sim::{Knobs, SimCloud};

/// What `berth serve` was asked to do.
#[derive(Clone, Debug, Default)]
pub struct ServeOptions {
    /// The config file; `None` runs the embedded default.
    pub config: Option<PathBuf>,
    /// Overrides the config's `api.listen`.
    pub listen: Option<SocketAddr>,
    /// Where the embedded default keeps its state (default `./berth-data`).
    pub state_dir: Option<PathBuf>,
    /// How long a stop waits for driver calls in flight.
    pub stop_grace: Option<Duration>,
    /// Where compiled drivers are cached; `None` uses
    /// [`berth_plugin::default_cache_dir`], else `cache` in the state
    /// directory.
    pub cache_dir: Option<PathBuf>,
    /// Adopt the pool's instances the store cannot vouch for
    /// ([`StartOptions::adopt_instances`]).
    pub adopt_instances: bool,
}

/// The embedded default's config, for a sim cloud at `sim` and state in
/// `state_dir`. Printed by `berth serve --print-default-config` as a start for
/// a config of one's own.
pub fn default_config_text(sim: SocketAddr, state_dir: &Path) -> String {
    let quote = |s: &str| toml::Value::String(s.to_owned()).to_string();
    let state = state_dir.display().to_string();
    let drivers = state_dir.join("drivers").display().to_string();
    format!(
        r#"# berth's embedded default: a simulated cloud inside the process.
pool-id = "berth-default"
state-dir = {state}
plugins-dir = {drivers}
sync-interval = "10s"
# The simulated machines have no SSH server to wait for: a node is ready as
# soon as the cloud says it runs. Real machines want the default, "ssh".
ready = "running"

[providers.sim]
driver = "sim.wasm"
allow-hosts = [{host}]
config = {{ endpoint = {endpoint} }}
[providers.sim.limits]
max-instances = 20

# Two nodes of `small` are kept ready, and one `large`.
[labels.small]
min-ready = 2
[labels.small.providers.sim]
instance-type = "small"
image = "debian-12"
vcpus = 2
ram = "4GiB"
price = 0.05

[labels.large]
min-ready = 1
[labels.large.providers.sim]
instance-type = "large"
image = "debian-12"
vcpus = 8
ram = "32GiB"
price = 0.4

# Four `shared` nodes fit on one `large` instance; two free slots are kept.
[labels.shared]
slots = 4
backing-label = "large"
min-ready = 2
"#,
        state = quote(&state),
        drivers = quote(&drivers),
        host = quote(&sim.to_string()),
        endpoint = quote(&format!("http://{sim}")),
    )
}

/// A simulated cloud serving on 127.0.0.1 until dropped.
struct EmbeddedSim {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl EmbeddedSim {
    async fn start(state_dir: &Path) -> anyhow::Result<EmbeddedSim> {
        let knobs = Knobs {
            create_latency_ms: 200,
            boot_delay_ms: 2_000,
            ..Knobs::default()
        };
        // Its instances are kept next to the pool's store, so that a
        // restart finds the machines it left, as with a real cloud.
        let cloud = SimCloud::new(knobs, Some(state_dir.join("sim-cloud.json")))?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("starting the simulated cloud")?;
        let addr = listener.local_addr()?;
        let (stop, rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(cloud.serve(listener, async move {
            let _ = rx.await;
        }));
        Ok(EmbeddedSim {
            addr,
            stop: Some(stop),
            task,
        })
    }

    async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = (&mut self.task).await;
    }
}

/// Where the API listens, as `ready` hears it.
#[derive(Clone, Copy, Debug)]
pub struct Listening {
    pub addr: SocketAddr,
    /// Whether it serves TLS (`api.tls-cert`).
    pub tls: bool,
}

impl Listening {
    /// `http://ADDR` or `https://ADDR`.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }
}

/// Runs the service until `shutdown` completes, then stops it gracefully.
/// `ready` hears where it listens once it does.
///
/// `shutdown` is watched from the first moment, starting included: a stop
/// asked for while drivers load ends the start and returns `Ok`. Create it
/// with [`shutdown_signals`] before calling this, so that a signal is never
/// met by its default action.
///
/// Returns an error (with [`runtime::PoolError::Store`] in its chain) when the store
/// could not be written, whether while running or in the stop's last
/// commit: the pool stopped deciding at once, and the process should exit
/// non-zero so that a supervisor restarts it once the store is writable.
pub async fn serve(
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
    ready: impl FnOnce(Listening, &Config),
) -> anyhow::Result<()> {
    let mut shutdown = std::pin::pin!(shutdown);
    // Registered before anything starts: SIGHUP's default action would
    // end the process.
    let hangups = hangups()?;
    let started = tokio::select! {
        biased;
        () = &mut shutdown => None,
        started = start(&options) => Some(started?),
    };
    let Some(Started {
        mut service,
        api,
        telemetry,
        listener,
        certificates,
        sim,
    }) = started
    else {
        tracing::info!("stopped while starting; nothing had been started yet");
        return Ok(());
    };
    let listening = Listening {
        addr: listener.local_addr()?,
        tls: certificates.is_some(),
    };
    ready(listening, &service.handle.config());
    systemd::ready(&listening.url());
    let watchdog = systemd::watchdog(service.handle.clone());
    let limits = {
        let config = api.settings();
        let (max_connections, fd_limit) = http::connection_cap(config.max_connections);
        if max_connections < config.max_connections {
            tracing::warn!(
                max_connections,
                open_file_limit = fd_limit,
                "the API takes at most half the open-file limit in connections, fewer than max-connections ({}); raise the limit (LimitNOFILE=, ulimit -n) to allow more",
                config.max_connections
            );
        }
        // Long-polls hold their connection: they may hold all but a
        // reserve, which health checks, admin calls and short requests
        // always find.
        api.limit_waits(http::waits_within(max_connections));
        http::Limits {
            header_timeout: config.header_timeout,
            max_connections,
        }
    };
    let reloads = tokio::spawn(reload_on(
        hangups,
        api.clone(),
        service.handle.providers().clone(),
    ));
    let providers = service.handle.providers().clone();
    providers.watch_files();
    let tls = match &certificates {
        Some(c) => {
            tracing::info!(sha256 = %c.fingerprint(), "the API serves TLS");
            Some(tokio_rustls::TlsAcceptor::from(c.server_config()?))
        }
        None => None,
    };
    let watching = certificates.map(|c| tokio::spawn(c.watch()));
    let (close, closed) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(http::serve(
        listener,
        api.router(),
        tls,
        limits,
        telemetry,
        async move {
            let _ = closed.await;
        },
    ));

    let asked = tokio::select! {
        () = &mut shutdown => true,
        () = service.ended() => false,
    };
    systemd::stopping();
    if asked {
        tracing::info!("stopping: refusing changes, finishing driver calls in flight");
        api.stopping();
    }
    let stopped = service
        .stop_within(options.stop_grace.unwrap_or(runtime::DEFAULT_STOP_GRACE))
        .await;
    reloads.abort();
    for task in [watchdog, watching].into_iter().flatten() {
        task.abort();
    }
    providers.stop_watching();
    let _ = close.send(());
    server.await.context("the HTTP server panicked")?;
    if let Some(sim) = sim {
        sim.stop().await;
    }
    stopped.context("stopping the pool")?;
    tracing::info!("stopped; nodes stay in the cloud and are adopted on the next start");
    Ok(())
}

/// A service that has started and not yet listened.
struct Started {
    service: Service,
    api: Api,
    telemetry: Arc<Telemetry>,
    listener: tokio::net::TcpListener,
    /// The API's TLS certificate, when it serves TLS.
    certificates: Option<Arc<tls::Certificates>>,
    sim: Option<EmbeddedSim>,
}

/// Everything before serving: the config (or the embedded default and its
/// sim cloud), the pool and the listener.
async fn start(options: &ServeOptions) -> anyhow::Result<Started> {
    let (settings, sim) = match &options.config {
        Some(file) => {
            let settings = config::load(file).map_err(|e| anyhow::anyhow!("{e}"))?;
            let missing = config::check_files(&settings);
            if !missing.is_empty() {
                let lines: Vec<String> = missing.iter().map(|p| p.to_string()).collect();
                anyhow::bail!("{}: {}", file.display(), lines.join("; "));
            }
            (settings, None)
        }
        None => {
            let dir = options
                .state_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from("berth-data"));
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("creating the state directory {}", dir.display()))?;
            let dir = dir
                .canonicalize()
                .with_context(|| format!("resolving {}", dir.display()))?;
            write_sim_driver(&dir.join("drivers"))?;
            let sim = EmbeddedSim::start(&dir).await?;
            let text = default_config_text(sim.addr, &dir);
            let settings = config::parse(&text, &dir, &|name| std::env::var(name).ok())
                .map_err(|e| anyhow::anyhow!("the embedded default config: {e}"))?;
            tracing::info!(
                sim = %sim.addr,
                state = %dir.display(),
                "no config file: running the embedded default (a simulated cloud in this process)"
            );
            (settings, Some(sim))
        }
    };
    for w in config::warnings(&settings) {
        tracing::warn!(at = %w.path, "{}", w.message);
    }
    let listen = options.listen.unwrap_or(settings.api.listen);
    if let Some(problem) = config::listen_problem(&settings.api, listen) {
        anyhow::bail!("{problem}");
    }
    let certificates = load_tls(&settings.api).map_err(|e| anyhow::anyhow!("{e}"))?;
    // Listening first, so that the drivers are started knowing the API's
    // address, which none of them may reach.
    let listener = http::listen(listen).with_context(|| format!("listening on {listen}"))?;
    let bound = listener.local_addr()?;
    // Where the other processes sharing the pool relay calls to this one.
    let advertise = match &settings.api.advertise {
        Some(url) => Some(url.clone()),
        None if !bound.ip().is_unspecified() => Some(format!(
            "{}://{bound}",
            if certificates.is_some() {
                "https"
            } else {
                "http"
            }
        )),
        None if settings.store.postgres.is_some() => anyhow::bail!(
            "listening on {bound}, which other berth processes cannot reach as such: set \
             api.advertise to the url they reach this one at"
        ),
        None => None,
    };
    let telemetry = Arc::new(Telemetry::new(&settings.pool));
    let api_settings = settings.api.clone();
    let running = (options.config.clone()).map(|file| (file, Arc::new(settings.clone())));
    let service = runtime::start(
        settings,
        StartOptions {
            observer: Some(telemetry.clone()),
            deny: vec![bound],
            advertise,
            cache_dir: options.cache_dir.clone(),
            adopt_instances: options.adopt_instances,
            ..Default::default()
        },
    )
    .await?;
    let api = Api::new(service.handle.clone(), telemetry.clone(), api_settings);
    if let Some((file, settings)) = running {
        api.config_file(file, settings);
    }
    Ok(Started {
        service,
        api,
        telemetry,
        listener,
        certificates,
        sim,
    })
}

/// The API's certificate, with TLS on, read and checked; an error names
/// the file. (The fleet's CA, `api.tls-peer-ca`, is read where the
/// connector to the other processes is made, `runtime::peers`.)
fn load_tls(api: &config::ApiSettings) -> Result<Option<Arc<tls::Certificates>>, config::Problem> {
    let Some(files) = &api.tls else {
        return Ok(None);
    };
    Ok(Some(Arc::new(tls::Certificates::load(files)?)))
}

/// What is wrong with the API's TLS files (`api.tls-cert`, `tls-key`,
/// `tls-peer-ca`) as `berth serve` would read them, each naming its file.
pub fn tls_problem(api: &config::ApiSettings) -> Option<config::Problem> {
    load_tls(api)
        .err()
        .or_else(|| crate::runtime::peers::roots(api).err())
}

#[cfg(feature = "embedded-sim")]
fn write_sim_driver(dir: &Path) -> anyhow::Result<()> {
    crate::embedded::write_sim_driver(dir).context("writing the embedded sim driver")?;
    Ok(())
}

#[cfg(not(feature = "embedded-sim"))]
fn write_sim_driver(_: &Path) -> anyhow::Result<()> {
    anyhow::bail!(
        "this berth was built without the embedded sim driver (feature `embedded-sim`); \
         give a config file with --config"
    )
}

/// SIGTERM and SIGINT (Ctrl-C), registered now: the future completes on
/// the first of them. Call this before anything slow starts, so that a
/// signal arriving at any later moment, while drivers load or before the
/// API listens, asks for a clean stop instead of killing the process.
#[cfg(unix)]
pub fn shutdown_signals() -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = interrupt.recv() => {}
        }
    })
}

/// SIGHUP, registered now.
#[cfg(unix)]
fn hangups() -> std::io::Result<tokio::signal::unix::Signal> {
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
}

#[cfg(not(unix))]
fn hangups() -> std::io::Result<()> {
    Ok(())
}

/// On each SIGHUP: the config file is read again and what changed applied
/// (`Api::reload_config`; the log says what, or why not), every
/// provider's credentials read their secrets (from the files they name)
/// and are exchanged again at their next use, and the driver files are
/// read again (`Providers::reload`).
#[cfg(unix)]
async fn reload_on(
    mut hangups: tokio::signal::unix::Signal,
    api: Api,
    providers: Arc<runtime::Providers>,
) {
    while hangups.recv().await.is_some() {
        tracing::info!(
            "SIGHUP: the config file is read again, credentials are read and exchanged again at their next use, and driver files read again"
        );
        if api.reload_config().await.is_none() {
            tracing::info!("SIGHUP: berth runs its embedded default: no config file to read again");
        }
        providers.reload_credentials();
        let outcomes = providers.reload(runtime::Trigger::Asked).await;
        let count =
            |f: fn(&runtime::Reloaded) -> bool| outcomes.iter().filter(|(_, o)| f(o)).count();
        tracing::info!(
            switched = count(|o| matches!(o, runtime::Reloaded::Swapped { .. })),
            failed = count(|o| matches!(o, runtime::Reloaded::Failed { .. })),
            unchanged = count(|o| matches!(o, runtime::Reloaded::Unchanged { .. })),
            "SIGHUP: driver files read again"
        );
    }
}

#[cfg(not(unix))]
async fn reload_on(_: (), _: Api, _: Arc<runtime::Providers>) {}

/// Ctrl-C, registered now (see the Unix version).
#[cfg(not(unix))]
pub fn shutdown_signals() -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}
