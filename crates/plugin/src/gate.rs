//! Whether this process may send anything to a cloud right now.
//!
//! A berth process that shares its pool with others (a PostgreSQL store)
//! acts on the cloud only while it holds the pool's lease. The runtime opens
//! the gate until shortly before the lease could lapse, each time the store
//! confirms it, and shuts it when the lease is lost. Every outbound request
//! of every driver checks it the moment it is sent, so a process that was
//! paused (SIGSTOP, a stalled VM) past its lease sends nothing when it
//! resumes, whatever it was doing when it stopped: the check reads the
//! monotonic clock, which runs on while the process is stopped.
//!
//! The clock is tokio's: the monotonic clock itself in a running berth, and
//! one that tests on paused time move, like the lease it follows.

// Time here is tokio's clock, which tests on paused time move.
#![deny(clippy::disallowed_methods)]

use std::sync::Mutex;

use tokio::time::Instant;

/// The gate; share it behind an `Arc`.
#[derive(Debug)]
pub struct Gate {
    state: Mutex<State>,
}

#[derive(Clone, Copy, Debug)]
enum State {
    /// No lease is involved (a store of this process's own): always open.
    Always,
    /// Open before this instant, shut from it on.
    Until(Instant),
    Shut,
}

impl Gate {
    /// A gate that is always open, for a process that owns its store.
    pub fn always() -> Gate {
        Gate {
            state: Mutex::new(State::Always),
        }
    }

    /// A gate that is shut until [`Gate::open_until`] opens it.
    pub fn shut() -> Gate {
        Gate {
            state: Mutex::new(State::Shut),
        }
    }

    /// Opens the gate until `deadline`. An always-open gate stays so.
    pub fn open_until(&self, deadline: Instant) {
        let mut state = self.lock();
        if !matches!(*state, State::Always) {
            *state = State::Until(deadline);
        }
    }

    /// Shuts the gate until it is opened again. An always-open gate stays
    /// so.
    pub fn shut_now(&self) {
        let mut state = self.lock();
        if !matches!(*state, State::Always) {
            *state = State::Shut;
        }
    }

    /// Whether a request may be sent now. Read on any thread: outside a
    /// runtime with paused time, tokio's clock is the monotonic clock.
    pub fn is_open(&self) -> bool {
        self.is_open_at(Instant::now())
    }

    /// Whether a request could be sent at `at`.
    pub fn is_open_at(&self, at: Instant) -> bool {
        match *self.lock() {
            State::Always => true,
            State::Until(deadline) => at < deadline,
            State::Shut => false,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is a plain value: a panic while holding the lock cannot
        // leave it half-written.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_gate_is_open_only_before_its_deadline_and_shuts_on_demand() {
        let gate = Gate::shut();
        assert!(!gate.is_open());
        let now = Instant::now();
        gate.open_until(now + Duration::from_secs(5));
        assert!(gate.is_open_at(now));
        assert!(!gate.is_open_at(now + Duration::from_secs(5)));
        gate.shut_now();
        assert!(!gate.is_open_at(now));
        let always = Gate::always();
        always.shut_now();
        assert!(always.is_open());
    }
}
