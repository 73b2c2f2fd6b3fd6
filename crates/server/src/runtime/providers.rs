//! The configured providers as the pool's task runs them. Each provider's
//! driver is loaded and its first instance started in the background, on
//! its own: a driver that traps in `describe` or `configure`, will not load
//! at all, or is slow to compile, fails or holds up only its own provider
//! (and those on the same file), which is shown failed (with the reason)
//! and started again with backoff, while the others serve.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use berth_config::{ProviderIx, Settings};
use berth_core::driver::{CreateSpec, DriverError, Instance, Page, Tags};
use berth_core::pool::Batches;
use berth_plugin::{
    CallError, CallErrorKind, Deletion, Driver, DriverState, Engine, Gate, LoadLimits, Sandbox,
    SandboxConfig,
};

mod reconfigure;
mod reload;
pub use reconfigure::Prepared;
pub use reload::{ReloadCounts, ReloadError, Reloaded, RollbackError, Trigger};

/// A boxed future that can move between threads.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the pool's task asks of one started provider: the contract's calls.
/// A driver in its sandbox ([`Sandbox`]) is one; tests run the loop on
/// fakes of their own, under paused time.
pub trait Cloud: Send + Sync {
    fn create(&self, spec: CreateSpec) -> BoxFuture<'_, Result<Instance, CallError>>;
    /// One page of the list: the first (`cursor` `None`) or the one after
    /// the page that gave `cursor`.
    fn list_page(
        &self,
        filter: Tags,
        cursor: Option<String>,
    ) -> BoxFuture<'_, Result<Page, CallError>>;
    fn get(&self, ids: Vec<String>) -> BoxFuture<'_, Result<Vec<Instance>, CallError>>;
    fn delete<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Deletion, CallError>>;
    fn set_tags<'a>(&'a self, id: &'a str, tags: Tags) -> BoxFuture<'a, Result<(), CallError>>;

    /// What the driver takes many of in one call. The pool sends batches
    /// only to a provider that declares them.
    fn batches(&self) -> Batches {
        Batches::default()
    }

    /// Creates each of `specs`: one answer each, in order. Without a
    /// `create-many` of its own, one create after another.
    fn create_many(&self, specs: Vec<CreateSpec>) -> BoxFuture<'_, Many<Instance>> {
        Box::pin(async move {
            let mut answers = Vec::with_capacity(specs.len());
            for spec in specs {
                answers.push(one_of_many(self.create(spec).await)?);
            }
            Ok(answers)
        })
    }

    /// Deletes each of `ids`: one answer each, in order. Without a
    /// `delete-many` of its own, one delete after another.
    fn delete_many(&self, ids: Vec<String>) -> BoxFuture<'_, Many<Deletion>> {
        Box::pin(async move {
            let mut answers = Vec::with_capacity(ids.len());
            for id in &ids {
                answers.push(one_of_many(self.delete(id).await)?);
            }
            Ok(answers)
        })
    }
}

/// A batch's answers, one per item, or the error that failed the call as a
/// whole.
pub type Many<T> = Result<Vec<Result<T, DriverError>>, CallError>;

/// One item's answer in a batch made a call at a time: a driver's error is
/// the item's; any other (a trap, a peer lost) fails the batch.
fn one_of_many<T>(answer: Result<T, CallError>) -> Result<Result<T, DriverError>, CallError> {
    match answer {
        Ok(t) => Ok(Ok(t)),
        Err(CallError {
            kind: CallErrorKind::Driver(e),
            ..
        }) => Ok(Err(e)),
        Err(e) => Err(e),
    }
}

impl Cloud for Sandbox {
    fn create(&self, spec: CreateSpec) -> BoxFuture<'_, Result<Instance, CallError>> {
        Box::pin(Sandbox::create(self, spec))
    }
    fn list_page(
        &self,
        filter: Tags,
        cursor: Option<String>,
    ) -> BoxFuture<'_, Result<Page, CallError>> {
        Box::pin(Sandbox::list_page(self, filter, cursor))
    }
    fn get(&self, ids: Vec<String>) -> BoxFuture<'_, Result<Vec<Instance>, CallError>> {
        Box::pin(Sandbox::get(self, ids))
    }
    fn delete<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Deletion, CallError>> {
        Box::pin(Sandbox::delete(self, id))
    }
    fn set_tags<'a>(&'a self, id: &'a str, tags: Tags) -> BoxFuture<'a, Result<(), CallError>> {
        Box::pin(Sandbox::set_tags(self, id, tags))
    }
    fn batches(&self) -> Batches {
        Batches::from(&self.driver().info().capabilities)
    }
    fn create_many(&self, specs: Vec<CreateSpec>) -> BoxFuture<'_, Many<Instance>> {
        Box::pin(Sandbox::create_many(self, specs))
    }
    fn delete_many(&self, ids: Vec<String>) -> BoxFuture<'_, Many<Deletion>> {
        Box::pin(Sandbox::delete_many(self, ids))
    }
}

/// How a provider's start is going, as operators see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    /// Its driver is loading, or its first instance starting.
    Starting,
    /// Started: calls go to its driver.
    Up,
    /// Its last start failed; it is tried again after `retry_in`.
    Failed {
        error: Arc<str>,
        tries: u32,
        retry_in: Duration,
    },
}

#[derive(Clone)]
enum State {
    Starting,
    /// Started: its calls, and the driver behind them (for stats) unless
    /// it is a [`Providers::fixed`] one.
    Up(Arc<dyn Cloud>, Option<Arc<Sandbox>>),
    Failed {
        error: Arc<str>,
        tries: u32,
        retry_in: Duration,
    },
    /// The service is stopping: no call waits for a start any more.
    Closed,
}

/// A provider's driver as it stands ([`Providers::driver_states`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DriverStanding {
    pub provider: String,
    /// `starting`, `up`, `failed` or `stopping`.
    pub state: &'static str,
    /// The running driver's sha256 and contract version, once up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub contract: Option<&'static str>,
    /// Why its last start failed, while it is `failed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The last reload that failed while it went on: the refused file's
    /// sha256 and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reload_error: Option<(String, String)>,
}

/// A driver the pool runs, the providers that run it, and how their
/// reloads went.
#[derive(Clone, Debug)]
pub struct LoadedDriver {
    pub driver: Driver,
    pub providers: Vec<String>,
    /// The last reload of one of these providers that failed, while this
    /// driver goes on: the newest if several did.
    pub reload_error: Option<reload::ReloadError>,
    /// The driver these providers ran before, which a rollback returns to.
    pub previous: Option<Driver>,
}

/// Every configured provider, in the config's order.
pub struct Providers {
    /// In the config's order; a config reload adds providers at the end
    /// (plain lock: held only to read or grow the list).
    slots: std::sync::RwLock<Vec<Arc<Slot>>>,
    /// The readiness probes of their instances.
    prober: super::probe::Prober,
    /// `None` for [`Providers::fixed`]: nothing is loaded.
    loader: Option<Arc<Loader>>,
    /// The tasks that start the providers (plain mutex: held only to add
    /// or abort them).
    starters: Mutex<Vec<tokio::task::AbortHandle>>,
    /// One reload, rollback or change of settings at a time.
    reloading: tokio::sync::Mutex<()>,
    /// The watch on the driver files ([`Providers::watch_files`]), started
    /// again when a config reload names other files.
    watching: Mutex<Option<tokio::task::AbortHandle>>,
    /// The gate every provider shares ([`Gates::One`]), a provider a
    /// config reload adds too; `None` where each has its own.
    one_gate: Option<Arc<Gate>>,
}

/// The providers' gates, each shut while this process may not act on the
/// provider's cloud.
pub enum Gates {
    /// One for every provider, the ones a config reload adds too: a pool
    /// on a store of its own, whose gate is its lease's.
    One(Arc<Gate>),
    /// One per provider, in the config's order: its lease's, with a store
    /// shared by several processes ([`super::shards::Shards::gate`]). A
    /// provider a config reload adds gets one of its own, shut until the
    /// lease is taken ([`super::shards::Shards::add`]).
    Each(Vec<Arc<Gate>>),
}

struct Slot {
    name: String,
    tx: watch::Sender<State>,
    /// What a start of its driver needs: the file and the sandbox's
    /// config (`None` for [`Providers::fixed`]). Shared with the task that
    /// starts it (and starts it again after a failure), which reads it
    /// afresh each time; a config reload replaces it. Plain mutex: held
    /// only to read or replace it.
    start: Option<Arc<Mutex<Start>>>,
    /// Its reloads so far. Plain mutex: never held across an await.
    reloads: Mutex<reload::Reloads>,
}

/// A provider's driver file and its sandbox's config.
type Start = (DriverFile, SandboxConfig);

/// Loads each driver file once, for all the providers on it.
pub(super) struct Loader {
    pub(super) engine: Engine,
    /// Each file's driver, once loaded. A provider waits only for its own
    /// file's load (the first of its providers to start it sets the
    /// limits), never for another file's. Plain mutex: held only to find or
    /// add a file's cell. A reload puts the new driver in its file's cell,
    /// so that a provider started after it starts on the new one.
    pub(super) loaded: Mutex<HashMap<PathBuf, Arc<tokio::sync::OnceCell<Driver>>>>,
}

/// The first retry of a failed start comes after this; it doubles up to
/// [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(300);

impl Providers {
    /// Starts every provider of `config` in the background. `deny`: what
    /// no driver may reach (berth's own API).
    pub fn start(
        engine: Engine,
        settings: &Settings,
        state: DriverState,
        deny: Vec<std::net::SocketAddr>,
        gates: Gates,
    ) -> Arc<Providers> {
        let (one_gate, each) = match gates {
            Gates::One(gate) => {
                let every = vec![gate.clone(); settings.pool.providers.len()];
                (Some(gate), every)
            }
            Gates::Each(each) => (None, each),
        };
        let loader = Arc::new(Loader {
            engine,
            loaded: Mutex::new(HashMap::new()),
        });
        let mut slots = Vec::new();
        let mut starters = Vec::new();
        let prober = super::probe::Prober::new(
            (settings.pool.providers.iter())
                .zip(&settings.drivers)
                .map(|(p, d)| (p.name.clone(), d.allowed_hosts.clone()))
                .collect(),
            deny.clone(),
        );
        for ((p, d), gate) in settings
            .pool
            .providers
            .iter()
            .zip(&settings.drivers)
            .zip(each)
        {
            // Its driver's settings are set by `start_from`.
            let base = SandboxConfig {
                name: p.name.clone(),
                pool_id: settings.pool.pool_id.clone(),
                driver_config: String::new(),
                allowed_hosts: Vec::new(),
                limits: d.sandbox.clone(),
                credentials: Vec::new(),
                state: Some(state.clone()),
                deny: deny.clone(),
                gate: Some(gate),
            };
            let (slot, task) = Slot::starting(&loader, start_from(d, base));
            starters.push(task);
            slots.push(slot);
        }
        Arc::new(Providers {
            slots: std::sync::RwLock::new(slots.into_iter().map(Arc::new).collect()),
            prober,
            loader: Some(loader),
            starters: Mutex::new(starters),
            reloading: tokio::sync::Mutex::new(()),
            watching: Mutex::new(None),
            one_gate,
        })
    }

    /// Providers that are up from the start, each answering through its
    /// own [`Cloud`]: for tests of the pool's task and for embedders that
    /// bring their own calls. Named as the config names them, in order.
    pub fn fixed(clouds: Vec<(String, Arc<dyn Cloud>)>) -> Arc<Providers> {
        let prober = super::probe::Prober::new(
            clouds
                .iter()
                .map(|(n, _)| (n.clone(), Vec::new()))
                .collect(),
            Vec::new(),
        );
        let slots: Vec<Slot> = clouds
            .into_iter()
            .map(|(name, cloud)| {
                let (tx, _) = watch::channel(State::Up(cloud, None));
                Slot {
                    name,
                    tx,
                    start: None,
                    reloads: Mutex::default(),
                }
            })
            .collect();
        Arc::new(Providers {
            slots: std::sync::RwLock::new(slots.into_iter().map(Arc::new).collect()),
            prober,
            loader: None,
            starters: Mutex::new(Vec::new()),
            reloading: tokio::sync::Mutex::new(()),
            watching: Mutex::new(None),
            one_gate: None,
        })
    }

    /// The readiness probes of the providers' instances.
    pub fn prober(&self) -> &super::probe::Prober {
        &self.prober
    }

    /// The provider once it has started: waits while it starts; the reason
    /// if its start failed (or the service is stopping).
    pub async fn get(&self, p: ProviderIx) -> Result<Arc<dyn Cloud>, Arc<str>> {
        let Some(slot) = self.slot(p) else {
            return Err("no such provider".into());
        };
        let mut rx = slot.tx.subscribe();
        let state = rx
            .wait_for(|s| !matches!(s, State::Starting))
            .await
            .map(|s| s.clone())
            .unwrap_or(State::Closed);
        match state {
            State::Up(cloud, _) => Ok(cloud),
            State::Failed { error, .. } => Err(error),
            State::Closed | State::Starting => Err("berth is stopping".into()),
        }
    }

    /// What provider `p`'s driver takes many of in one call, once it has
    /// started.
    pub fn batches(&self, p: ProviderIx) -> Option<Batches> {
        let slot = self.slot(p)?;
        let state = slot.tx.borrow();
        match &*state {
            State::Up(cloud, _) => Some(cloud.batches()),
            _ => None,
        }
    }

    /// The provider's name.
    pub fn name(&self, p: ProviderIx) -> String {
        self.slot(p).map(|s| s.name.clone()).unwrap_or_default()
    }

    /// Provider `p`'s slot, if there is one.
    fn slot(&self, p: ProviderIx) -> Option<Arc<Slot>> {
        let slots = self.slots.read().unwrap_or_else(|e| e.into_inner());
        slots.get(p.0 as usize).cloned()
    }

    /// Every provider's slot, in the config's order.
    fn all(&self) -> Vec<Arc<Slot>> {
        self.slots.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The file name of the driver provider `p` runs on.
    pub fn driver_file(&self, p: ProviderIx) -> String {
        let Some((file, _)) = self.slot(p).and_then(|s| s.start()) else {
            return String::new();
        };
        (file.path.file_name())
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// How the provider's start is going.
    pub fn health(&self, p: ProviderIx) -> Health {
        let Some(slot) = self.slot(p) else {
            return Health::Starting;
        };
        let state = slot.tx.borrow();
        match &*state {
            State::Starting => Health::Starting,
            State::Up(..) => Health::Up,
            State::Failed {
                error,
                tries,
                retry_in,
            } => Health::Failed {
                error: error.clone(),
                tries: *tries,
                retry_in: *retry_in,
            },
            State::Closed => Health::Failed {
                error: "berth is stopping".into(),
                tries: 0,
                retry_in: Duration::ZERO,
            },
        }
    }

    /// The started providers, by name (for stats).
    pub fn started(&self) -> Vec<(String, Arc<Sandbox>)> {
        self.all()
            .iter()
            .filter_map(|s| match &*s.tx.borrow() {
                State::Up(_, p) => Some((s.name.clone(), p.clone()?)),
                _ => None,
            })
            .collect()
    }

    /// How the credentials of provider `p` are doing; none until it has
    /// started.
    pub fn credentials(&self, p: ProviderIx) -> Vec<berth_plugin::CredentialStatus> {
        let Some(slot) = self.slot(p) else {
            return Vec::new();
        };
        let state = slot.tx.borrow();
        match &*state {
            State::Up(_, Some(sandbox)) => sandbox.credentials(),
            _ => Vec::new(),
        }
    }

    /// `SIGHUP`: every started provider reads its credentials' secrets
    /// again (and exchanges them again) at their next use.
    pub fn reload_credentials(&self) {
        for (_, sandbox) in self.started() {
            sandbox.reload_credentials();
        }
    }

    /// Whether these providers run drivers loaded from files (not
    /// [`Providers::fixed`]).
    pub fn loads_drivers(&self) -> bool {
        self.loader.is_some()
    }

    /// Each provider's driver as it stands, in the config's order: what
    /// `GET /v1/events` says when it changes.
    pub fn driver_states(&self) -> Vec<DriverStanding> {
        (self.all().iter())
            .map(|slot| {
                let (state, running, error) = match &*slot.tx.borrow() {
                    State::Starting => ("starting", None, None),
                    State::Up(_, sandbox) => {
                        ("up", sandbox.as_ref().map(|s| s.driver().clone()), None)
                    }
                    State::Failed { error, .. } => ("failed", None, Some(error.to_string())),
                    State::Closed => ("stopping", None, None),
                };
                let reloads = slot.reloads.lock().unwrap_or_else(|p| p.into_inner());
                DriverStanding {
                    provider: slot.name.clone(),
                    state,
                    sha256: running.as_ref().map(|d| d.sha256().to_owned()),
                    contract: running.as_ref().map(|d| d.contract().version()),
                    error,
                    reload_error: (reloads.error.as_ref())
                        .map(|e| (e.sha256.clone(), e.error.to_string())),
                }
            })
            .collect()
    }

    /// The drivers the started providers run, each with those providers,
    /// in the config's order of their first provider.
    pub fn drivers(&self) -> Vec<LoadedDriver> {
        let mut drivers: Vec<LoadedDriver> = Vec::new();
        for slot in &self.all() {
            let State::Up(_, Some(sandbox)) = &*slot.tx.borrow() else {
                continue;
            };
            let driver = sandbox.driver();
            let reloads = slot.reloads.lock().unwrap_or_else(|p| p.into_inner());
            let at = match drivers.iter().position(|d| {
                d.driver.path() == driver.path() && d.driver.sha256() == driver.sha256()
            }) {
                Some(at) => at,
                None => {
                    drivers.push(LoadedDriver {
                        driver: driver.clone(),
                        providers: Vec::new(),
                        reload_error: None,
                        previous: None,
                    });
                    drivers.len() - 1
                }
            };
            let d = &mut drivers[at];
            d.providers.push(slot.name.clone());
            if let Some(e) = &reloads.error
                && d.reload_error.as_ref().is_none_or(|o| o.at < e.at)
            {
                d.reload_error = Some(e.clone());
            }
            if d.previous.is_none() {
                d.previous = reloads.previous.clone();
            }
        }
        drivers
    }

    /// Stopping: starts still under way are abandoned, and calls that wait
    /// for one fail at once. Calls already running in a driver go on.
    pub fn close(&self) {
        self.abort_starters();
        for slot in &self.all() {
            slot.tx.send_if_modified(|s| {
                if matches!(s, State::Up(..)) {
                    false
                } else {
                    *s = State::Closed;
                    true
                }
            });
        }
    }
}

impl Providers {
    fn abort_starters(&self) {
        for s in self
            .starters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            s.abort();
        }
    }
}

impl Drop for Providers {
    fn drop(&mut self) {
        self.abort_starters();
        self.stop_watching();
    }
}

/// A provider's start from its settings: the driver file, and `base` (its
/// name, the pool's id, where its records live, what it may never reach,
/// its gate) with the driver's config, allow-list, limits and credentials.
pub(super) fn start_from(d: &berth_config::DriverSettings, base: SandboxConfig) -> Start {
    let file = DriverFile {
        path: d.driver.clone(),
        plugins_dir: d.plugins_dir.clone(),
        name: d.driver_name.clone(),
        sha256: d.driver_sha256.clone(),
    };
    let config = SandboxConfig {
        driver_config: d.driver_config.clone(),
        allowed_hosts: d.allowed_hosts.clone(),
        limits: d.sandbox.clone(),
        credentials: d.credentials.clone(),
        ..base
    };
    (file, config)
}

impl Slot {
    /// A provider starting on `start` in the background, and the task
    /// that starts it.
    fn starting(loader: &Arc<Loader>, start: Start) -> (Slot, tokio::task::AbortHandle) {
        let (tx, _) = watch::channel(State::Starting);
        let name = start.1.name.clone();
        let start = Arc::new(Mutex::new(start));
        let task = tokio::spawn(keep_starting(loader.clone(), start.clone(), tx.clone()));
        let slot = Slot {
            name,
            tx,
            start: Some(start),
            reloads: Mutex::default(),
        };
        (slot, task.abort_handle())
    }

    /// Its driver file and sandbox config as they stand.
    fn start(&self) -> Option<Start> {
        let start = self.start.as_ref()?;
        Some(start.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }
}

/// A provider's driver file, and the sha256 its config pins, if any.
#[derive(Clone)]
pub(super) struct DriverFile {
    /// `name` joined to `plugins_dir`: what the file is called in messages
    /// and the loaded driver's name, never opened as such.
    pub(super) path: PathBuf,
    pub(super) plugins_dir: PathBuf,
    /// The file's path inside `plugins_dir`, read only from inside it.
    pub(super) name: PathBuf,
    pub(super) sha256: Option<String>,
}

impl DriverFile {
    /// The file's bytes, read from inside its plugins directory only (on a
    /// blocking thread), if it holds at most `max` of them.
    pub(super) async fn read(&self, max: u64) -> Result<Vec<u8>, String> {
        let (dir, name) = (self.plugins_dir.clone(), self.name.clone());
        tokio::task::spawn_blocking(move || berth_config::read_driver(&dir, &name, max))
            .await
            .map_err(|e| format!("reading {}: {e}", self.path.display()))?
            .map_err(|e| e.to_string())
    }

    /// The file's bytes as [`DriverFile::read`] reads them, with their
    /// sha256 (lowercase hex): what a reload compares with the running
    /// driver's and the pin.
    pub(super) async fn read_digested(&self, max: u64) -> Result<(String, Vec<u8>), String> {
        use sha2::{Digest, Sha256};
        let bytes = self.read(max).await?;
        Ok((hex::encode(Sha256::digest(&bytes)), bytes))
    }

    /// Why bytes of sha256 `got` may not run as this provider's driver,
    /// if its `driver-sha256` pins other bytes.
    pub(super) fn refuses(&self, got: &str) -> Option<String> {
        let pin = self.sha256.as_deref().filter(|pin| *pin != got)?;
        Some(format!(
            "its driver file {} has sha256 {got}, not the {pin} driver-sha256 pins; refused, and none of it runs",
            self.path.display()
        ))
    }
}

/// Loads the driver and starts the provider's first instance, again and
/// again with backoff until it works, each time with its file and config
/// as they then stand.
async fn keep_starting(loader: Arc<Loader>, start: Arc<Mutex<Start>>, tx: watch::Sender<State>) {
    let name = (start.lock().unwrap_or_else(|p| p.into_inner()))
        .1
        .name
        .clone();
    let mut tries = 0u32;
    loop {
        let (file, config) = start.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match start_one(&loader, &file, config).await {
            Ok(provider) => {
                if tries > 0 {
                    tracing::info!(provider = %name, tries, "provider started after failing");
                }
                let provider = Arc::new(provider);
                tx.send_replace(State::Up(provider.clone(), Some(provider)));
                return;
            }
            Err(error) => {
                tries += 1;
                let retry_in = FIRST_RETRY
                    .saturating_mul(1 << (tries - 1).min(16))
                    .min(MAX_RETRY);
                tracing::error!(
                    provider = %name,
                    %error,
                    tries,
                    retry_in_s = retry_in.as_secs(),
                    "the provider could not start; the other providers go on, and this one is tried again"
                );
                tx.send_replace(State::Failed {
                    error: error.into(),
                    tries,
                    retry_in,
                });
                tokio::time::sleep(retry_in).await;
                tx.send_replace(State::Starting);
            }
        }
    }
}

async fn start_one(
    loader: &Loader,
    file: &DriverFile,
    config: SandboxConfig,
) -> Result<Sandbox, String> {
    let name = config.name.clone();
    let path = &file.path;
    let cell = (loader.loaded.lock().unwrap_or_else(|p| p.into_inner()))
        .entry(path.clone())
        .or_default()
        .clone();
    let limits = LoadLimits::from(&config.limits);
    let pinned = file.sha256.as_deref();
    let driver = cell
        .get_or_try_init(|| async {
            tracing::info!(provider = %name, driver = %path.display(), "loading a driver");
            // Read from inside the plugins directory only; the loader
            // compares the pin with these bytes before it compiles or runs
            // any of them.
            let bytes = (file.read(limits.max_file_bytes).await)
                .map_err(|e| format!("loading its driver: {e}"))?;
            (loader.engine)
                .load_bytes(path.clone(), bytes, limits, pinned)
                .await
                .map_err(|e| format!("loading its driver: {e}"))
        })
        .await?
        .clone();
    // Loaded before for another provider of the same file, unpinned or
    // pinned to other bytes: this provider's pin is checked on those.
    if let Some(refused) = file.refuses(driver.sha256()) {
        return Err(refused);
    }
    let provider = Sandbox::start(&driver, config);
    provider
        .warm()
        .await
        .map_err(|e| format!("starting its driver: {e}"))?;
    Ok(provider)
}
