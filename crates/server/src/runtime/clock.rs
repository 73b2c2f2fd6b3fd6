//! The pool's clock: wall-clock time as the core sees it, advanced by
//! tokio's clock, so that tests on paused time control it.

use std::time::{SystemTime, UNIX_EPOCH};

use berth_core::pool::Time;

/// Wall-clock time as the core sees it, advanced by tokio's clock so that
/// tests with paused time control it.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    base: Time,
    start: tokio::time::Instant,
}

impl Clock {
    /// A clock reading the system's wall-clock time now.
    pub fn system() -> Clock {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Clock::starting_at(Time(ms))
    }

    /// A clock reading `base` now.
    pub fn starting_at(base: Time) -> Clock {
        Clock {
            base,
            start: tokio::time::Instant::now(),
        }
    }

    pub fn now(&self) -> Time {
        self.base + self.start.elapsed()
    }

    pub(super) fn instant(&self, t: Time) -> tokio::time::Instant {
        self.start + t.since(self.base)
    }
}
