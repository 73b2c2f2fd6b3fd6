//! Loading and running sandboxed driver components.
//!
//! An [`Engine`] owns wasmtime's engine (pooling allocator, epoch ticker),
//! the linker with everything a driver may import, and the compiled-artifact
//! cache. [`Engine::load_file`] turns a `.wasm` into a [`Driver`]: checked
//! against the contract, compiled (or loaded from the cache) and
//! pre-instantiated. [`Sandbox::start`] runs one configured provider's driver
//! in its sandbox: a bounded set of instances, each owned by one task. (The
//! provider as the pool decides for it is `berth_core::config::Provider`.)

// Only `cache.rs` allows `unsafe` (ARCHITECTURE.md, "Lints and unsafe
// code").
#![deny(unsafe_code)]

mod addresses;
mod bindings;
mod cache;
pub mod conformance;
pub mod contract;
mod credentials;
mod exchange;
mod gate;
mod guest_log;
mod guests;
mod inspect;
mod limits;
mod mtls;
mod provider;
mod sandbox;
pub mod scaffold;
mod scrub;
mod state;
mod store_data;
mod tokens;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;
use wasmtime::component::{Component, Linker};
use wasmtime::{InstanceAllocationStrategy, PoolingAllocationConfig};

use berth_core::driver::DriverInfo;
use bindings::PluginPre;
use guests::Guests;
use store_data::StoreState;

pub use addresses::is_forbidden_ip;
pub use berth_config::{AllowedHost, Auth, Credential, SandboxLimits, Secret};
pub use bindings::Contract;
pub use cache::LoadSource;
pub use gate::Gate;
pub use inspect::{Import, Inspection, Provision, Rejection, inspect};
pub use mtls::ca_roots;
pub use provider::{
    CallError, CallErrorKind, CallStats, Deletion, DriverInstance, Sandbox, SandboxConfig, Trap,
};
pub use sandbox::HttpPolicy;
pub use state::{DriverState, Records, StateSpace};
pub use tokens::CredentialStatus;

/// The settings of an [`Engine`], for every driver it loads.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Where compiled drivers are cached; `None` compiles on every load.
    pub cache_dir: Option<PathBuf>,
    /// How often the epoch advances; the granularity of call deadlines.
    pub epoch_tick: Duration,
    /// Driver instances that may exist at once across all providers.
    pub max_instances: u32,
    /// The largest memory cap any provider may set, in bytes.
    pub max_memory_bytes: u64,
    /// Threads that run guest code (apart from berth's own, and at a lower
    /// priority); by default one per core.
    pub guest_threads: usize,
}

/// The compiled-driver cache `berth serve`, `berth driver check` and
/// `berth driver test` share by default: `$BERTH_CACHE_DIR`, else
/// `berth/compiled` in `$XDG_CACHE_HOME`, else in `~/.cache`; `None` when
/// none of these is set.
pub fn default_cache_dir() -> Option<PathBuf> {
    let env = |name| std::env::var_os(name).filter(|v| !v.is_empty());
    env("BERTH_CACHE_DIR").map(PathBuf::from).or_else(|| {
        env("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|d| d.join("berth").join("compiled"))
    })
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            cache_dir: None,
            epoch_tick: Duration::from_millis(10),
            max_instances: 64,
            max_memory_bytes: 1 << 30,
            guest_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        }
    }
}

/// What loads and runs drivers: wasmtime's engine, the linker and the
/// compiled-artifact cache. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<EngineInner>,
}

struct EngineInner {
    engine: wasmtime::Engine,
    linker: Linker<StoreState>,
    cache: Option<cache::ArtifactCache>,
    config: EngineConfig,
    /// Where guest code runs, and the epoch ticker; every driver loaded
    /// here holds it too, so it outlives this value as long as they do.
    guests: Arc<Guests>,
    /// Compiles under way, by the sha256 of their `.wasm`: a load of the
    /// same bytes waits for the one there is rather than starting another.
    /// Plain mutex: held only to look up or add an entry.
    compiling: std::sync::Mutex<HashMap<String, Compiling>>,
}

/// A compile's outcome, once there is one.
type Compiling = tokio::sync::watch::Receiver<Option<Result<(Component, LoadSource), String>>>;

/// What loading one driver file may cost, checked before it is read and
/// while it compiles (`max-driver-size` and `compile-deadline` in
/// `[providers.NAME.sandbox]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadLimits {
    /// The largest file read; a larger one is refused before it is read.
    /// Compiling takes memory in step with the code's size, so this bounds
    /// that too.
    pub max_file_bytes: u64,
    /// How long a load waits for the compile. Past it the load fails; the
    /// compile cannot be stopped and ends on its own thread, and a later
    /// load of the same bytes waits for it rather than starting another.
    pub compile_deadline: Duration,
}

impl Default for LoadLimits {
    fn default() -> Self {
        LoadLimits::from(&SandboxLimits::default())
    }
}

impl From<&SandboxLimits> for LoadLimits {
    fn from(l: &SandboxLimits) -> Self {
        LoadLimits {
            max_file_bytes: l.max_driver_bytes,
            compile_deadline: l.compile_deadline,
        }
    }
}

/// A driver file that could not be loaded, and why.
#[derive(Debug, thiserror::Error)]
#[error("driver {}: {kind}", path.display())]
pub struct LoadError {
    pub path: PathBuf,
    pub kind: LoadErrorKind,
}

/// Why a driver could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadErrorKind {
    #[error("cannot read file: {0}")]
    Io(#[from] std::io::Error),
    #[error(
        "the file is {size} bytes, more than the {max} bytes a driver may be (max-driver-size); it was not read"
    )]
    TooLarge { size: u64, max: u64 },
    #[error(
        "compiling took longer than {0:?} (compile-deadline) and was given up; it ends in the background, and the next try waits for it"
    )]
    CompileDeadline(Duration),
    #[error("{0}")]
    Rejected(#[from] Rejection),
    #[error("does not compile: {0}")]
    Compile(String),
    #[error("does not match the contract: {0}")]
    Link(String),
    #[error("describe failed: {0}")]
    Describe(CallError),
    #[error(
        "its sha256 is {got}, not the {pinned} driver-sha256 pins; refused before any of it was compiled or run"
    )]
    NotPinned { got: String, pinned: String },
}

/// A loaded driver: compiled, checked and ready to instantiate. Cheap to clone.
#[derive(Clone)]
pub struct Driver {
    inner: Arc<DriverInner>,
}

struct DriverInner {
    file_name: String,
    path: PathBuf,
    sha256: String,
    info: DriverInfo,
    pre: PluginPre,
    source: LoadSource,
    load_time: Duration,
    max_memory_bytes: u64,
    guests: Arc<Guests>,
}

impl Driver {
    /// The driver's file name without `.wasm`.
    pub fn file_name(&self) -> &str {
        &self.inner.file_name
    }
    /// Where it was loaded from.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }
    /// Hex sha256 of the `.wasm` file.
    pub fn sha256(&self) -> &str {
        &self.inner.sha256
    }
    /// What the driver said about itself.
    pub fn info(&self) -> &DriverInfo {
        &self.inner.info
    }
    /// The contract version it was built against, read from its export.
    pub fn contract(&self) -> Contract {
        self.inner.pre.contract()
    }
    /// Whether it was compiled now or loaded from the cache.
    pub fn source(&self) -> LoadSource {
        self.inner.source
    }
    /// How long loading took (read, check, compile or cache load, describe).
    pub fn load_time(&self) -> Duration {
        self.inner.load_time
    }
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("path", &self.inner.path)
            .field("name", &self.inner.info.name)
            .field("version", &self.inner.info.version)
            .finish()
    }
}

impl Engine {
    /// Builds the engine and linker and starts the guests' threads and the
    /// epoch ticker.
    pub fn new(config: EngineConfig) -> anyhow::Result<Self> {
        let mut pool = PoolingAllocationConfig::new();
        let n = config.max_instances.max(1);
        pool.total_component_instances(n)
            .total_stacks(n)
            // Language runtimes (componentize-py, componentize-js) build
            // components of many core instances, memories and tables.
            .total_core_instances(n * 16)
            .total_memories(n * 2)
            .total_tables(n * 8)
            .max_core_instances_per_component(64)
            .max_memories_per_component(4)
            .max_tables_per_component(16)
            .max_tables_per_module(16)
            .max_memories_per_module(2)
            .table_elements(200_000)
            .max_core_instance_size(8 << 20)
            .max_component_instance_size(8 << 20)
            .max_memory_size(usize::try_from(config.max_memory_bytes)?);
        let mut cfg = wasmtime::Config::new();
        cfg.wasm_component_model(true)
            .epoch_interruption(true)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = wasmtime::Engine::new(&cfg).map_err(anyhow::Error::from)?;

        let mut linker = Linker::<StoreState>::new(&engine);
        // The whole of WASI 0.2 is linked so that toolchains which import
        // stdio, environment or filesystem by habit still load; the WasiCtx
        // built in `sandbox` makes those inert (see `inspect::Provision`).
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(anyhow::Error::from)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)
            .map_err(anyhow::Error::from)?;
        bindings::add_to_linker(&mut linker).map_err(anyhow::Error::from)?;

        let guests = Guests::start(&engine, config.epoch_tick, config.guest_threads)?;
        let cache = config
            .cache_dir
            .clone()
            .map(|dir| cache::ArtifactCache::new(dir, &engine));
        Ok(Engine {
            inner: Arc::new(EngineInner {
                engine,
                linker,
                cache,
                config,
                guests,
                compiling: std::sync::Mutex::new(HashMap::new()),
            }),
        })
    }

    /// The engine's settings.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// Loads one driver file: checks it against the contract, compiles it (or
    /// loads it from the cache), links it and asks it to describe itself.
    pub async fn load_file(&self, path: impl AsRef<Path>) -> Result<Driver, LoadError> {
        self.load_file_within(path, LoadLimits::default()).await
    }

    /// [`Engine::load_file`] within `limits`.
    pub async fn load_file_within(
        &self,
        path: impl AsRef<Path>,
        limits: LoadLimits,
    ) -> Result<Driver, LoadError> {
        self.load_file_pinned(path, limits, None).await
    }

    /// [`Engine::load_file_within`], refusing a file whose sha256 is not
    /// `pinned` (lowercase hex) before any of it is compiled or run: the
    /// digest is of the very bytes that would be compiled.
    #[tracing::instrument(skip(self, limits), fields(path = %path.as_ref().display()))]
    pub async fn load_file_pinned(
        &self,
        path: impl AsRef<Path>,
        limits: LoadLimits,
        pinned: Option<&str>,
    ) -> Result<Driver, LoadError> {
        let path = path.as_ref().to_path_buf();
        let bytes =
            (read_at_most(&path, limits.max_file_bytes).await).map_err(|kind| LoadError {
                path: path.clone(),
                kind,
            })?;
        self.load_bytes(path, bytes, limits, pinned).await
    }

    /// Loads a driver from `bytes` already read (at most
    /// `limits.max_file_bytes` of them) from the file at `path`, which
    /// names it; refused as [`Engine::load_file_pinned`] refuses.
    pub async fn load_bytes(
        &self,
        path: PathBuf,
        bytes: Vec<u8>,
        limits: LoadLimits,
        pinned: Option<&str>,
    ) -> Result<Driver, LoadError> {
        let started = Instant::now();
        let (pre, sha256, source) = self.compile_and_link(&path, bytes, limits, pinned).await?;
        let file_name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let info = provider::describe(
            &self.inner.guests,
            &pre,
            &file_name,
            self.inner.config.max_memory_bytes,
        )
        .await
        .map_err(|e| LoadError {
            path: path.clone(),
            kind: LoadErrorKind::Describe(e),
        })?;
        let load_time = started.elapsed();
        tracing::info!(driver = %info.name, version = %info.version, contract = pre.contract().version(), ?source, load_ms = load_time.as_secs_f64() * 1e3, "driver loaded");
        Ok(Driver {
            inner: Arc::new(DriverInner {
                file_name,
                path,
                sha256,
                info,
                pre,
                source,
                load_time,
                max_memory_bytes: self.inner.config.max_memory_bytes,
                guests: self.inner.guests.clone(),
            }),
        })
    }

    /// Compiles and links driver bytes that already passed [`inspect`],
    /// without running any of their code (the last part of `berth driver
    /// check`).
    pub async fn link_only(&self, bytes: Vec<u8>, contract: Contract) -> Result<(), String> {
        self.link(bytes, contract, LoadLimits::default())
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    async fn compile_and_link(
        &self,
        path: &Path,
        bytes: Vec<u8>,
        limits: LoadLimits,
        pinned: Option<&str>,
    ) -> Result<(PluginPre, String, LoadSource), LoadError> {
        let err = |kind: LoadErrorKind| LoadError {
            path: path.to_path_buf(),
            kind,
        };
        let size = bytes.len() as u64;
        if size > limits.max_file_bytes {
            return Err(err(LoadErrorKind::TooLarge {
                size,
                max: limits.max_file_bytes,
            }));
        }
        if let Some(pinned) = pinned {
            let got = hex::encode(Sha256::digest(&bytes));
            if got != pinned {
                return Err(err(LoadErrorKind::NotPinned {
                    got,
                    pinned: pinned.to_owned(),
                }));
            }
        }
        let contract = inspect(&bytes).map_err(|e| err(e.into()))?.contract;
        self.link(bytes, contract, limits).await.map_err(err)
    }

    /// Compiles (or loads from the cache) and links checked driver bytes
    /// that export `contract`'s driver interface, waiting for the compile
    /// at most `limits.compile_deadline`.
    async fn link(
        &self,
        bytes: Vec<u8>,
        contract: Contract,
        limits: LoadLimits,
    ) -> Result<(PluginPre, String, LoadSource), LoadErrorKind> {
        let sha256 = hex::encode(Sha256::digest(&bytes));
        let mut compiled = self.compile(&sha256, bytes);
        let done =
            tokio::time::timeout(limits.compile_deadline, compiled.wait_for(Option::is_some))
                .await
                .map_err(|_| LoadErrorKind::CompileDeadline(limits.compile_deadline))?
                .map_err(|_| {
                    LoadErrorKind::Compile("the compile's thread ended without an outcome".into())
                })?
                .clone();
        let (component, source) = done
            .unwrap_or_else(|| Err("no outcome".into()))
            .map_err(LoadErrorKind::Compile)?;
        let instance_pre = self
            .inner
            .linker
            .instantiate_pre(&component)
            .map_err(|e| LoadErrorKind::Link(format!("{e:#}")))?;
        let pre = PluginPre::new(contract, instance_pre)
            .map_err(|e| LoadErrorKind::Link(format!("{e:#}")))?;
        Ok((pre, sha256, source))
    }

    /// The compile of `bytes` (or the cache load), under way on a thread
    /// of its own: wasmtime cannot stop a compile, so a load that gives up
    /// waiting leaves it to end there, and a load of the same bytes
    /// meanwhile waits for this one instead of starting a second.
    fn compile(&self, sha256: &str, bytes: Vec<u8>) -> Compiling {
        let mut compiling = (self.inner.compiling.lock()).unwrap_or_else(|p| p.into_inner());
        // One whose thread died without an outcome (it panicked) is
        // started again.
        if let Some(under_way) = compiling.get(sha256)
            && under_way.has_changed().is_ok()
        {
            return under_way.clone();
        }
        let (tx, rx) = tokio::sync::watch::channel(None);
        compiling.insert(sha256.to_owned(), rx.clone());
        // The thread holds wasmtime's engine and the cache, not this one:
        // a compile left running keeps no guest machinery alive.
        let engine = self.inner.engine.clone();
        let cache = self.inner.cache.clone();
        let this = Arc::downgrade(&self.inner);
        let sha = sha256.to_owned();
        let spawned = std::thread::Builder::new()
            .name("berth-compile".into())
            .spawn(move || {
                let outcome = match &cache {
                    Some(cache) => cache.load(&engine, &sha, &bytes),
                    None => Component::new(&engine, &bytes).map(|c| (c, LoadSource::Compiled)),
                };
                // Forgotten before the outcome is sent: a load that sees
                // this one fail starts afresh next time.
                if let Some(this) = this.upgrade() {
                    (this.compiling.lock().unwrap_or_else(|p| p.into_inner())).remove(&sha);
                }
                tx.send_replace(Some(outcome.map_err(|e| format!("{e:#}"))));
            });
        if let Err(e) = spawned {
            compiling.remove(sha256);
            let (tx, rx) = tokio::sync::watch::channel(None);
            tx.send_replace(Some(Err(format!("starting a thread to compile on: {e}"))));
            return rx;
        }
        rx
    }

    /// Loads every `*.wasm` in `dir`. A file that fails to load is reported
    /// and skipped; the others still load. Files are loaded in name order.
    pub async fn load_dir(
        &self,
        dir: impl AsRef<Path>,
    ) -> std::io::Result<(Vec<Driver>, Vec<LoadError>)> {
        let mut paths = Vec::new();
        let mut entries = tokio::fs::read_dir(dir.as_ref()).await?;
        while let Some(entry) = entries.next_entry().await? {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "wasm") {
                paths.push(path);
            }
        }
        paths.sort();
        let mut loaded = Vec::new();
        let mut failed = Vec::new();
        for path in paths {
            match self.load_file(&path).await {
                Ok(d) => loaded.push(d),
                Err(e) => {
                    tracing::error!(error = %e, "driver not loaded");
                    failed.push(e);
                }
            }
        }
        Ok((loaded, failed))
    }
}

/// The file at `path`, if it is at most `max` bytes: its size is checked
/// before anything is read, and no more than `max` bytes are read should
/// it grow meanwhile.
async fn read_at_most(path: &Path, max: u64) -> Result<Vec<u8>, LoadErrorKind> {
    let file = tokio::fs::File::open(path).await?;
    let size = file.metadata().await?.len();
    if size > max {
        return Err(LoadErrorKind::TooLarge { size, max });
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .await?;
    let read = bytes.len() as u64;
    if read > max {
        return Err(LoadErrorKind::TooLarge { size: read, max });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_file_over_the_limit_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.wasm");
        // Holes only: nothing to read quickly if it were read.
        std::fs::File::create(&path)
            .unwrap()
            .set_len(1 << 34)
            .unwrap();
        let refused = read_at_most(&path, 1 << 20).await.unwrap_err();
        assert!(
            matches!(refused, LoadErrorKind::TooLarge { size, max } if size == 1 << 34 && max == 1 << 20),
            "{refused}"
        );
        assert!(refused.to_string().contains("max-driver-size"), "{refused}");
        std::fs::write(&path, b"\0asm").unwrap();
        assert_eq!(read_at_most(&path, 4).await.unwrap(), b"\0asm");
        assert!(read_at_most(&path, 3).await.is_err());
    }
}
