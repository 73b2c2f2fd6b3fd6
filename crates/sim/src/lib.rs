//! A simulated cloud: an HTTP server that behaves like a provider's instance
//! API, with knobs to make it slow, flaky, rate limited or out of capacity.
//! `docs/sim-cloud.md` is its specification.
//!
//! - `state`: the bookkeeping, as plain data and functions of `now`.
//! - `api`: the axum routes, and errors turned into statuses.
//! - `state_file`: the optional state file.
//! - `machines`: instances reachable on ports of their own (`ssh_target`).
//! - `cli`: the `berth sim` subcommand.

#![forbid(unsafe_code)]

mod api;
mod cli;
mod machines;
mod state;
mod state_file;
#[cfg(test)]
mod tests;

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

pub use cli::{SimArgs, run};
pub use state::{BOOT_FAULT, Call, CallItem, Instance, InstanceState};

use state::State;
use state_file::StateFile;

/// How unfriendly the simulated cloud is. JSON field names are the knob names
/// of `docs/sim-cloud.md`; a partial object leaves the other knobs alone.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Knobs {
    /// Time a create takes before it answers.
    pub create_latency_ms: u64,
    /// Time a create that made (or found) its instance waits before it
    /// answers: the instance exists, and the caller does not know yet.
    pub create_answer_delay_ms: u64,
    /// How long a new instance is left out of lists and gets, as by a cloud
    /// whose reads are eventually consistent (EC2's `DescribeInstances` may
    /// not show an instance just launched).
    pub list_lag_ms: u64,
    /// Time a new instance stays `pending` before it is `running`.
    pub boot_delay_ms: u64,
    /// Chance, 0.0 to 1.0, that a create fails with `500 internal_error`.
    pub failure_rate: f64,
    /// Chance, 0.0 to 1.0, that a new instance's boot fails: once its boot
    /// delay has passed it is `failed`, with a `fault`, and never runs.
    pub boot_failure_rate: f64,
    /// Most live (not terminated) instances; `None` for no quota.
    pub quota: Option<u32>,
    /// Cloud-API requests per second; `None` for no limit.
    pub rate_limit: Option<f64>,
    /// Instance types whose creates fail with `503 insufficient_capacity`.
    pub out_of_capacity: Vec<String>,
    /// Bearer token the cloud API requires; `None` for none.
    pub token: Option<String>,
    /// How long a terminated instance stays listed.
    pub terminated_retention_ms: u64,
    /// A real SSH server (`IP:PORT`) that new instances lead to: each gets a
    /// port of its own on 127.0.0.1, reported as its address and SSH port,
    /// passed through to this server once it runs and
    /// `ssh_accept_delay_ms` more has passed (refused before). `None`:
    /// instances report addresses nothing answers at.
    pub ssh_target: Option<String>,
    /// How long after its boot an instance's SSH port starts accepting.
    pub ssh_accept_delay_ms: u64,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            create_latency_ms: 0,
            create_answer_delay_ms: 0,
            list_lag_ms: 0,
            boot_delay_ms: 0,
            failure_rate: 0.0,
            boot_failure_rate: 0.0,
            quota: None,
            rate_limit: None,
            out_of_capacity: Vec::new(),
            token: None,
            terminated_retention_ms: 60_000,
            ssh_target: None,
            ssh_accept_delay_ms: 0,
        }
    }
}

// Hand-written so the token never reaches a log line.
impl fmt::Debug for Knobs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Knobs")
            .field("create_latency_ms", &self.create_latency_ms)
            .field("create_answer_delay_ms", &self.create_answer_delay_ms)
            .field("list_lag_ms", &self.list_lag_ms)
            .field("boot_delay_ms", &self.boot_delay_ms)
            .field("failure_rate", &self.failure_rate)
            .field("boot_failure_rate", &self.boot_failure_rate)
            .field("quota", &self.quota)
            .field("rate_limit", &self.rate_limit)
            .field("out_of_capacity", &self.out_of_capacity)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("terminated_retention_ms", &self.terminated_retention_ms)
            .field("ssh_target", &self.ssh_target)
            .field("ssh_accept_delay_ms", &self.ssh_accept_delay_ms)
            .finish()
    }
}

impl Knobs {
    /// Reports every knob that is out of range at once.
    pub fn validate(&self) -> Result<(), InvalidKnobs> {
        let mut problems = Vec::new();
        for (name, rate) in [
            ("failure_rate", self.failure_rate),
            ("boot_failure_rate", self.boot_failure_rate),
        ] {
            if !(0.0..=1.0).contains(&rate) {
                problems.push(format!("{name} must be between 0 and 1, got {rate}"));
            }
        }
        if let Some(target) = &self.ssh_target
            && target.parse::<std::net::SocketAddr>().is_err()
        {
            problems.push(format!(
                "ssh_target must be an IP address and port, got {target:?}"
            ));
        }
        if let Some(rate) = self.rate_limit
            && !(rate.is_finite() && rate > 0.0)
        {
            problems.push(format!(
                "rate_limit must be a positive number of requests per second, got {rate}"
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(InvalidKnobs { problems })
        }
    }
}

/// Knobs that were refused, with every problem found.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid knobs: {}", problems.join("; "))]
pub struct InvalidKnobs {
    pub problems: Vec<String>,
}

/// Handle to one simulated cloud; clones share it.
#[derive(Clone)]
pub struct SimCloud {
    shared: Arc<Shared>,
}

struct Shared {
    // A plain std mutex: every critical section is short bookkeeping and no
    // `.await` ever happens while it is held (sleeps and file writes are done
    // after the guard is dropped).
    state: Mutex<State>,
    clock: Clock,
    state_file: Option<StateFile>,
    machines: machines::Machines,
}

/// Milliseconds since the Unix epoch, advanced by tokio's clock.
///
/// Timestamps on the wire are wall-clock milliseconds, but delays (boot,
/// retention, rate refill) must follow tokio time so tests with paused time
/// can step through them. Reading the wall clock once and adding tokio's
/// elapsed time gives one timeline that does both.
struct Clock {
    epoch_ms: u64,
    started: tokio::time::Instant,
}

impl Clock {
    fn new() -> Self {
        // A clock before 1970 is a broken host; counting from zero keeps the
        // simulator running and ordering intact.
        let epoch_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Clock {
            epoch_ms,
            started: tokio::time::Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.epoch_ms.saturating_add(elapsed)
    }
}

impl fmt::Debug for SimCloud {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimCloud")
            .field(
                "state_file",
                &self.shared.state_file.as_ref().map(StateFile::path),
            )
            .finish_non_exhaustive()
    }
}

impl SimCloud {
    /// A simulated cloud with these knobs. With a state file, instances are
    /// loaded from it if it exists and written to it after every change.
    pub fn new(knobs: Knobs, state_file: Option<PathBuf>) -> anyhow::Result<Self> {
        knobs.validate()?;
        let state_file = state_file.map(StateFile::new);
        let saved = match &state_file {
            Some(file) => file.load()?,
            None => Default::default(),
        };
        Ok(SimCloud {
            shared: Arc::new(Shared {
                state: Mutex::new(State::new(knobs, saved)),
                clock: Clock::new(),
                state_file,
                machines: Default::default(),
            }),
        })
    }

    /// The HTTP API and the `/sim/*` control endpoints.
    pub fn router(&self) -> axum::Router {
        api::router(self.clone())
    }

    /// Serves the API on `listener` until `shutdown` completes.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        axum::serve(listener, self.router())
            .with_graceful_shutdown(shutdown)
            .await
    }

    pub fn knobs(&self) -> Knobs {
        self.lock().knobs().clone()
    }

    /// Replaces all knobs; they apply to the next call.
    pub fn set_knobs(&self, knobs: Knobs) -> Result<(), InvalidKnobs> {
        knobs.validate()?;
        self.lock().set_knobs(knobs);
        Ok(())
    }

    /// Every cloud-API call so far, in the order they finished.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls().to_vec()
    }

    /// The cloud-API calls by `caller` (the name in a `/c/NAME` endpoint;
    /// `None`: the calls without one) that came in and are not yet in
    /// [`SimCloud::calls`]: still being answered, or given up by a client
    /// that went away.
    pub fn in_flight(&self, caller: Option<&str>) -> usize {
        self.lock().in_flight(&caller.map(str::to_owned))
    }

    /// Every instance still retained, terminated ones included, ordered by id.
    pub fn instances(&self) -> Vec<Instance> {
        let now = self.now_ms();
        self.lock().all(now)
    }

    /// Forgets all instances and calls (and writes that to the state file).
    pub fn reset(&self) -> std::io::Result<()> {
        let snapshot = {
            let mut state = self.lock();
            state.reset();
            self.snapshot(&state)
        };
        self.shared.machines.stop_all();
        self.write(snapshot)
    }

    fn now_ms(&self) -> u64 {
        self.shared.clock.now_ms()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves bookkeeping that is at worst
        // one call stale; serving on beats taking the whole simulator down.
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// What to persist after a change, taken under the lock so snapshots are
    /// ordered by generation.
    fn snapshot(&self, state: &State) -> Option<state_file::Snapshot> {
        self.shared
            .state_file
            .as_ref()
            .map(|_| state_file::Snapshot::of(state))
    }

    fn write(&self, snapshot: Option<state_file::Snapshot>) -> std::io::Result<()> {
        match (&self.shared.state_file, snapshot) {
            (Some(file), Some(snapshot)) => file.write(snapshot),
            _ => Ok(()),
        }
    }

    /// [`Self::write`] off the async threads: it does blocking file I/O.
    async fn write_async(&self, snapshot: Option<state_file::Snapshot>) -> std::io::Result<()> {
        if snapshot.is_none() {
            return Ok(());
        }
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.write(snapshot))
            .await
            .map_err(std::io::Error::other)?
    }
}
