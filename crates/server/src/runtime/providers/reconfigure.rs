//! A config reload that changes providers' driver settings (`driver`,
//! `driver-sha256`, `config`, `allow-hosts`, `credentials`, `sandbox`), in
//! two phases so that a reload is taken whole or not at all:
//! [`Providers::prepare`] starts each started provider's driver with its new
//! settings on a fresh instance next to the running one (as a driver reload
//! does), and [`Providers::commit`] switches them all once the rest of the
//! reload was taken. Dropping the [`Prepared`] instead changes nothing.
//!
//! A provider that has not started yet takes its new settings at its next
//! try to start. Providers the settings add (after the running ones) start
//! at once, in the background, as at berth's start; the pool knows of them
//! only once it takes the config, and a dropped [`Prepared`] takes them
//! back.

use std::sync::Arc;

use berth_config::Settings;
use berth_plugin::{Driver, Gate, LoadLimits, Sandbox, SandboxConfig};

use super::{Providers, Slot, Start, start_from};
use crate::runtime::shards::Added;

/// Providers' new settings, each started provider's on a fresh instance
/// that has configured, not yet switched to. Holds the providers' reload
/// turn: no driver reload or rollback runs until it is committed or
/// dropped.
pub struct Prepared<'a> {
    providers: &'a Providers,
    _turn: tokio::sync::MutexGuard<'a, ()>,
    changes: Vec<Change>,
    /// The providers added: from this index on, the tasks starting them,
    /// and their gates. Taken back unless committed.
    added: Option<Adding>,
}

/// Providers being added: the first one's index, the tasks starting them,
/// and each one's gate and deadline.
type Adding = (usize, Vec<tokio::task::AbortHandle>, Vec<Added>);

struct Change {
    slot: usize,
    start: Start,
    /// The instance on the new settings, and the driver it replaces; none
    /// for a provider that has not started.
    switch: Option<(Arc<Sandbox>, Driver)>,
}

impl Providers {
    /// Starts the providers named in `changed` on their settings in
    /// `settings` (arranged to the running order, `berth_config::align`),
    /// each on a fresh instance that must load and configure; or every
    /// reason one could not, changing nothing.
    pub async fn prepare(
        &self,
        settings: &Settings,
        changed: &[String],
    ) -> Result<Prepared<'_>, Vec<String>> {
        let turn = self.reloading.lock().await;
        let mut changes = Vec::new();
        let mut refused = Vec::new();
        for name in changed {
            match self.prepare_one(settings, name).await {
                Ok(change) => changes.push(change),
                Err(e) => refused.push(format!(
                    "providers.{name}: its new settings could not start ({e}); it goes on as it runs"
                )),
            }
        }
        if !refused.is_empty() {
            return Err(refused);
        }
        let added = self.add(settings)?;
        Ok(Prepared {
            providers: self,
            _turn: turn,
            changes,
            added,
        })
    }

    /// Starts the providers `settings` has after the running ones, each
    /// with what the first running provider shares with every other (where
    /// driver records live, what no driver may reach), and the gate every
    /// provider shares or, where each has its own, a new one, shut.
    fn add(&self, settings: &Settings) -> Result<Option<Adding>, Vec<String>> {
        let mut slots = self.slots.write().unwrap_or_else(|e| e.into_inner());
        let from = slots.len();
        let new = settings
            .pool
            .providers
            .iter()
            .zip(&settings.drivers)
            .skip(from);
        if new.len() == 0 {
            return Ok(None);
        }
        let (Some(loader), Some((_, like))) = (&self.loader, slots.first().and_then(|s| s.start()))
        else {
            return Err(vec!["providers cannot be added to these providers".into()]);
        };
        let mut tasks = Vec::new();
        let mut added = Vec::new();
        for (p, d) in new {
            let gate = (self.one_gate.clone()).unwrap_or_else(|| Arc::new(Gate::shut()));
            let base = SandboxConfig {
                name: p.name.clone(),
                gate: Some(gate.clone()),
                ..like.clone()
            };
            let (slot, task) = Slot::starting(loader, start_from(d, base));
            self.prober.add(&p.name, d.allowed_hosts.clone());
            slots.push(Arc::new(slot));
            tasks.push(task);
            added.push(Added {
                name: p.name.clone(),
                gate,
                call_deadline: d.sandbox.call_deadline,
            });
        }
        Ok(Some((from, tasks, added)))
    }

    async fn prepare_one(&self, settings: &Settings, name: &str) -> Result<Change, String> {
        let slots = self.all();
        let at = (slots.iter().position(|s| s.name == name)).ok_or("no such provider")?;
        let slot = &slots[at];
        let (Some((_, running_config)), Some(d)) = (slot.start(), settings.drivers.get(at)) else {
            return Err("its driver is not run from a file".into());
        };
        if settings.pool.providers.get(at).map(|p| p.name.as_str()) != Some(name) {
            return Err("the settings are not in the running order".into());
        }
        let (file, config) = start_from(d, running_config);
        let Some(running) = slot.running() else {
            return Ok(Change {
                slot: at,
                start: (file, config),
                switch: None,
            });
        };
        let limits = LoadLimits::from(&config.limits);
        let (sha256, bytes) = file.read_digested(limits.max_file_bytes).await?;
        if let Some(refused) = file.refuses(&sha256) {
            return Err(refused);
        }
        let driver = if sha256 == running.sha256() && file.path == *running.path() {
            running.clone()
        } else {
            let loader = self.loader.as_ref().ok_or("no driver loader")?;
            (loader.engine)
                .load_bytes(file.path.clone(), bytes, limits, None)
                .await
                .map_err(|e| format!("loading its driver: {e}"))?
        };
        let sandbox = Sandbox::start(&driver, config.clone());
        sandbox.warm().await.map_err(|e| e.to_string())?;
        Ok(Change {
            slot: at,
            start: (file, config),
            switch: Some((Arc::new(sandbox), running)),
        })
    }

    /// Switches every prepared provider to its new settings: calls from now
    /// on go to the new instance, and the ones running finish where they
    /// started. Driver files are watched anew if their names changed.
    /// Answers the providers added, whose leases a process on a shared
    /// store takes part in from now on ([`crate::runtime::Shards::add`]).
    #[must_use]
    pub fn commit(self: &Arc<Self>, mut prepared: Prepared<'_>) -> Vec<Added> {
        let mut files_changed = false;
        let mut added = Vec::new();
        if let Some((_, tasks, gates)) = prepared.added.take() {
            files_changed = true;
            let mut starters = self.starters.lock().unwrap_or_else(|p| p.into_inner());
            starters.extend(tasks);
            added = gates;
        }
        let slots = self.all();
        for change in std::mem::take(&mut prepared.changes) {
            let slot = &slots[change.slot];
            let Some(start) = &slot.start else {
                continue;
            };
            let (file, config) = change.start;
            self.prober
                .allow(change.slot, &slot.name, config.allowed_hosts.clone());
            {
                let mut start = start.lock().unwrap_or_else(|p| p.into_inner());
                files_changed |= start.0.path != file.path;
                *start = (file, config);
            }
            let Some((sandbox, running)) = change.switch else {
                continue;
            };
            let driver = sandbox.driver().clone();
            if slot.swap(sandbox, &running) {
                tracing::info!(
                    provider = %slot.name,
                    driver = %driver.path().display(),
                    sha256 = driver.sha256(),
                    "the provider switched to its settings from the reloaded config; calls under way finish where they started"
                );
            }
        }
        if files_changed
            && self
                .watching
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_some()
        {
            self.watch_files();
        }
        added
    }
}

impl Drop for Prepared<'_> {
    /// Not committed: the providers added are taken back.
    fn drop(&mut self) {
        let Some((from, tasks, _)) = self.added.take() else {
            return;
        };
        for task in tasks {
            task.abort();
        }
        let mut slots = (self.providers.slots.write()).unwrap_or_else(|e| e.into_inner());
        slots.truncate(from);
        self.providers.prober.truncate(from);
    }
}
