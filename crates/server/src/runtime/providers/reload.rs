//! Drivers replaced while the pool runs. A reload reads each provider's
//! driver file again; a file whose bytes changed is loaded (checked,
//! compiled, described) and started on a fresh instance (`configure`)
//! beside the running driver, and only then does the provider switch to
//! it. A call already running goes on in the driver it started in, which is
//! dropped once its last call ends; a new call goes to the new one, so no
//! call is lost or made twice. A file that fails anything leaves the
//! provider on the driver it runs, and the reason is kept for `/v1/drivers`,
//! the log and the metrics. The driver replaced is kept, and a rollback
//! returns to it.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use berth_plugin::{Driver, LoadLimits, Sandbox};

use super::{Providers, Slot, Start, State};

/// One provider's reloads so far.
#[derive(Default)]
pub(in crate::runtime) struct Reloads {
    /// The driver it ran before its last switch, which a rollback returns to.
    pub(super) previous: Option<Driver>,
    /// Why its last reload failed, until one succeeds or the file is back
    /// to the driver it runs.
    pub(super) error: Option<ReloadError>,
    /// A file's sha256 that a change of the file does not load again, only
    /// an operator's reload: the last that failed, or the one rolled back
    /// from.
    passed_over: Option<String>,
    swaps: u64,
    failures: u64,
}

/// A reload that failed, while the provider goes on with its driver.
#[derive(Clone, Debug)]
pub struct ReloadError {
    pub provider: String,
    /// The sha256 of the file refused (empty if it could not be read).
    pub sha256: String,
    pub error: Arc<str>,
    pub at: SystemTime,
}

/// Why a reload runs: a driver file changed, or an operator asked
/// (`SIGHUP`, `POST /v1/drivers/reload`). Only an operator's loads again a
/// file that already failed or was rolled back from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    Changed,
    Asked,
}

/// What a reload did with one provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reloaded {
    /// The file holds the driver it runs.
    Unchanged { sha256: String },
    /// It switched to the file's driver.
    Swapped { from: String, to: String },
    /// The file was refused; the provider goes on with `running`.
    Failed {
        sha256: String,
        running: String,
        error: Arc<str>,
    },
    /// The file failed before, or was rolled back from, and only an
    /// operator's reload loads it again.
    PassedOver { sha256: String, running: String },
    /// It has not started: its start (and the retries of a failed one)
    /// reads the file anyway.
    NotStarted,
}

/// A provider's reload counts, for the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReloadCounts {
    pub swaps: u64,
    pub failures: u64,
    /// Whether its last reload failed.
    pub failing: bool,
}

/// Why a rollback was refused.
#[derive(Debug, thiserror::Error)]
pub enum RollbackError {
    #[error("no provider is named {0:?}")]
    Unknown(String),
    #[error("provider {0:?} has not started")]
    NotStarted(String),
    #[error("provider {0:?} has run no other driver since berth started")]
    NoPrevious(String),
    #[error("provider {provider:?} could not start its previous driver ({sha256}): {error}")]
    Failed {
        provider: String,
        sha256: String,
        error: String,
    },
}

impl Providers {
    /// Reads every started provider's driver file again and switches each
    /// provider whose file changed to the new driver, once that driver has
    /// loaded and configured on a fresh instance. One reload (or rollback)
    /// runs at a time. Answers per provider, in the config's order.
    pub async fn reload(&self, trigger: Trigger) -> Vec<(String, Reloaded)> {
        let Some(loader) = &self.loader else {
            return Vec::new();
        };
        let _one = self.reloading.lock().await;
        // A file is read once, and its driver loaded once, per reload.
        let mut read: HashMap<PathBuf, Result<(String, Vec<u8>), String>> = HashMap::new();
        let mut loaded: HashMap<(PathBuf, String), Result<Driver, String>> = HashMap::new();
        let mut out = Vec::new();
        for slot in &self.all() {
            let Some((file, config)) = &slot.start() else {
                continue;
            };
            let limits = LoadLimits::from(&config.limits);
            let path = &file.path;
            if !read.contains_key(path) {
                let digested = file.read_digested(limits.max_file_bytes).await;
                read.insert(path.clone(), digested);
            }
            // Its file is read all the same: its next start reads it too
            // (below).
            let Some(running) = slot.running() else {
                out.push((slot.name.clone(), Reloaded::NotStarted));
                continue;
            };
            let (sha256, bytes) = match &read[path] {
                Ok(read) => read,
                Err(e) => {
                    let error =
                        format!("reading its driver file: {e}; it goes on with the driver it runs");
                    out.push((slot.name.clone(), slot.failed(&running, "", error)));
                    continue;
                }
            };
            if *sha256 == running.sha256() {
                slot.lock().error = None;
                let sha256 = sha256.clone();
                out.push((slot.name.clone(), Reloaded::Unchanged { sha256 }));
                continue;
            }
            if trigger == Trigger::Changed && slot.lock().passed_over.as_ref() == Some(sha256) {
                let (sha256, running) = (sha256.clone(), running.sha256().to_owned());
                out.push((slot.name.clone(), Reloaded::PassedOver { sha256, running }));
                continue;
            }
            if let Some(error) = file.refuses(sha256) {
                out.push((slot.name.clone(), slot.failed(&running, sha256, error)));
                continue;
            }
            let key = (path.clone(), sha256.clone());
            if !loaded.contains_key(&key) {
                tracing::info!(provider = %slot.name, driver = %path.display(), %sha256, "loading a changed driver file");
                let driver = (loader.engine)
                    .load_bytes(path.clone(), bytes.clone(), limits, None)
                    .await
                    .map_err(|e| format!("loading it: {e}"));
                loaded.insert(key.clone(), driver);
            }
            let driver = match &loaded[&key] {
                Ok(driver) => driver.clone(),
                Err(e) => {
                    let error = format!("{e}; it goes on with the driver it runs");
                    out.push((slot.name.clone(), slot.failed(&running, sha256, error)));
                    continue;
                }
            };
            let outcome = match slot.switch_to(&driver, config.clone(), &running).await {
                Ok(()) => Reloaded::Swapped {
                    from: running.sha256().to_owned(),
                    to: sha256.clone(),
                },
                Err(e) => {
                    let error =
                        format!("starting the new driver: {e}; it goes on with the driver it runs");
                    slot.failed(&running, sha256, error)
                }
            };
            out.push((slot.name.clone(), outcome));
        }
        // A provider started from now on (or started again after failing)
        // starts on what its file now holds: the new driver where one
        // loaded, and a file read afresh where a file changed but none of
        // its providers was up to switch.
        let mut cells = loader.loaded.lock().unwrap_or_else(|p| p.into_inner());
        for (path, digested) in &read {
            let Ok((sha256, _)) = digested else {
                continue;
            };
            match loaded.get(&(path.clone(), sha256.clone())) {
                Some(Ok(driver)) => {
                    cells.insert(
                        path.clone(),
                        Arc::new(tokio::sync::OnceCell::new_with(Some(driver.clone()))),
                    );
                }
                _ => {
                    let stale = (cells.get(path))
                        .and_then(|c| c.get())
                        .is_some_and(|d| d.sha256() != sha256);
                    if stale {
                        cells.remove(path);
                    }
                }
            }
        }
        out
    }

    /// Switches `provider` back to the driver it ran before its last
    /// switch, and keeps the one it leaves as the one before. A change of
    /// the file does not load the driver left again, only an operator's
    /// reload or a file with other bytes.
    pub async fn rollback(&self, provider: &str) -> Result<Reloaded, RollbackError> {
        let _one = self.reloading.lock().await;
        let slot = (self.all().into_iter())
            .find(|s| s.name == provider)
            .ok_or_else(|| RollbackError::Unknown(provider.to_owned()))?;
        let (Some((_, config)), Some(running)) = (&slot.start(), slot.running()) else {
            return Err(RollbackError::NotStarted(provider.to_owned()));
        };
        let previous = (slot.lock().previous.clone())
            .ok_or_else(|| RollbackError::NoPrevious(provider.to_owned()))?;
        let failed = |error: String| RollbackError::Failed {
            provider: provider.to_owned(),
            sha256: previous.sha256().to_owned(),
            error,
        };
        slot.switch_to(&previous, config.clone(), &running)
            .await
            .map_err(failed)?;
        let mut reloads = slot.lock();
        reloads.passed_over = Some(running.sha256().to_owned());
        reloads.error = None;
        Ok(Reloaded::Swapped {
            from: running.sha256().to_owned(),
            to: previous.sha256().to_owned(),
        })
    }

    /// Watches the directories of the providers' driver files and reloads
    /// when one changes ([`watch`]), until [`Providers::stop_watching`] or
    /// the providers are dropped. Watching again stops the watch before.
    pub fn watch_files(self: &Arc<Self>) {
        let starts: Vec<Start> = self.all().iter().filter_map(|s| s.start()).collect();
        let mut dirs: Vec<PathBuf> = (starts.iter())
            .filter_map(|(file, _)| file.path.parent().map(Path::to_path_buf))
            .map(|d| {
                if d.as_os_str().is_empty() {
                    PathBuf::from(".")
                } else {
                    d
                }
            })
            .collect();
        dirs.sort();
        dirs.dedup();
        let names: HashSet<OsString> = (starts.iter())
            .filter_map(|(file, _)| file.path.file_name().map(OsString::from))
            .collect();
        let task = tokio::spawn(watch(Arc::downgrade(self), dirs, names));
        let mut watching = self.watching.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(before) = watching.replace(task.abort_handle()) {
            before.abort();
        }
    }

    /// Stops watching the driver files.
    pub fn stop_watching(&self) {
        let mut watching = self.watching.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(task) = watching.take() {
            task.abort();
        }
    }

    /// Each provider's reload counts, by name.
    pub fn reload_counts(&self) -> Vec<(String, ReloadCounts)> {
        (self.all().iter())
            .map(|s| {
                let r = s.lock();
                let counts = ReloadCounts {
                    swaps: r.swaps,
                    failures: r.failures,
                    failing: r.error.is_some(),
                };
                (s.name.clone(), counts)
            })
            .collect()
    }
}

impl Slot {
    fn lock(&self) -> std::sync::MutexGuard<'_, Reloads> {
        self.reloads.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The driver it runs, once started.
    pub(super) fn running(&self) -> Option<Driver> {
        match &*self.tx.borrow() {
            State::Up(_, Some(sandbox)) => Some(sandbox.driver().clone()),
            _ => None,
        }
    }

    /// Starts `driver` on a fresh instance of its own and, once that
    /// configured, makes it the provider's: calls from now on go to it, and
    /// the ones running finish in the driver they started in.
    async fn switch_to(
        &self,
        driver: &Driver,
        config: berth_plugin::SandboxConfig,
        running: &Driver,
    ) -> Result<(), String> {
        let sandbox = Sandbox::start(driver, config);
        sandbox.warm().await.map_err(|e| e.to_string())?;
        if !self.swap(Arc::new(sandbox), running) {
            return Err("the provider stopped meanwhile".into());
        }
        tracing::info!(
            provider = %self.name,
            from = running.sha256(),
            to = driver.sha256(),
            contract = driver.contract().version(),
            "the provider switched to another driver; calls under way finish in the one it ran"
        );
        Ok(())
    }

    /// Makes `sandbox` the provider's if it is still up on `running`: not
    /// stopping, and not switched meanwhile (reloads take turns, so nothing
    /// else switches it). Calls from now on go to it; the ones running
    /// finish where they started. If its driver is another, the one it
    /// replaces is kept for a rollback.
    pub(super) fn swap(&self, sandbox: Arc<Sandbox>, running: &Driver) -> bool {
        let other = sandbox.driver().sha256() != running.sha256();
        let switched = self.tx.send_if_modified(|s| match s {
            State::Up(_, Some(old)) if old.driver().sha256() == running.sha256() => {
                *s = State::Up(sandbox.clone(), Some(sandbox));
                true
            }
            _ => false,
        });
        if switched && other {
            let mut reloads = self.lock();
            reloads.previous = Some(running.clone());
            reloads.error = None;
            reloads.passed_over = None;
            reloads.swaps += 1;
        }
        switched
    }

    /// Notes a failed reload and says why, once per file: a file that
    /// failed and fails again the same way is not logged again.
    fn failed(&self, running: &Driver, sha256: &str, error: String) -> Reloaded {
        let error: Arc<str> = error.into();
        let mut reloads = self.lock();
        let again =
            (reloads.error.as_ref()).is_some_and(|e| e.sha256 == sha256 && e.error == error);
        if !again {
            tracing::error!(
                provider = %self.name,
                sha256,
                running = running.sha256(),
                %error,
                "a driver reload failed; the provider goes on with the driver it runs"
            );
        }
        reloads.failures += 1;
        if !sha256.is_empty() {
            reloads.passed_over = Some(sha256.to_owned());
        }
        reloads.error = Some(ReloadError {
            provider: self.name.clone(),
            sha256: sha256.to_owned(),
            error: error.clone(),
            at: SystemTime::now(),
        });
        Reloaded::Failed {
            sha256: sha256.to_owned(),
            running: running.sha256().to_owned(),
            error,
        }
    }
}

/// The first wait before a reload after one failed; it doubles up to
/// [`MAX_BACKOFF`] while reloads fail.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// How long a directory must be quiet after a change before its files are
/// read: a copy under way writes many times.
const QUIET: Duration = Duration::from_millis(250);

/// Watches `dirs`, the directories of the providers' driver files, and
/// reloads once a change to a file named as one of them (`names`: written,
/// renamed onto, removed) has settled ([`QUIET`]); other files there (a
/// store in the same directory) wake nothing. After a reload that failed,
/// the next waits out a backoff (1 s doubling to a minute) and whatever
/// changed meanwhile is read then. Ends when `providers` is dropped or the
/// watch cannot go on.
async fn watch(
    providers: std::sync::Weak<Providers>,
    dirs: Vec<PathBuf>,
    names: HashSet<OsString>,
) {
    use notify::Watcher;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else {
            // The watch lost track (a queue overflow): read them all.
            let _ = tx.send(());
            return;
        };
        let ours = (event.paths.iter()).any(|p| p.file_name().is_some_and(|n| names.contains(n)));
        if ours && !event.kind.is_access() {
            let _ = tx.send(());
        }
    });
    let mut watcher = match watcher {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "driver files are not watched; reload with SIGHUP or POST /v1/drivers/reload");
            return;
        }
    };
    for dir in &dirs {
        if let Err(e) = watcher.watch(dir, notify::RecursiveMode::NonRecursive) {
            tracing::warn!(dir = %dir.display(), error = %e, "a driver directory is not watched; reload with SIGHUP or POST /v1/drivers/reload");
        }
    }
    let mut failures = 0u32;
    while rx.recv().await.is_some() {
        // Settle: until the directory has been quiet for a while.
        loop {
            match tokio::time::timeout(QUIET, rx.recv()).await {
                Ok(Some(())) => continue,
                Ok(None) => return,
                Err(_) => break,
            }
        }
        let Some(providers) = providers.upgrade() else {
            return;
        };
        let outcomes = providers.reload(Trigger::Changed).await;
        drop(providers);
        if outcomes
            .iter()
            .any(|(_, o)| matches!(o, Reloaded::Failed { .. }))
        {
            failures += 1;
            let wait = FIRST_BACKOFF
                .saturating_mul(1 << (failures - 1).min(6))
                .min(MAX_BACKOFF);
            tokio::time::sleep(wait).await;
        } else {
            failures = 0;
        }
    }
}
