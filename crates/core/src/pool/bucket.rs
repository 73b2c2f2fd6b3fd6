//! The token bucket that paces each provider's calls, its leak deletes, and
//! the simulated cloud's API.

use std::time::Duration;

use super::Time;

/// A token bucket: `rate` calls per second, up to `burst` at once. Time comes
/// in; nothing here reads a clock.
#[derive(Clone, Debug)]
pub struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Time,
}

impl Bucket {
    pub fn new(rate: f64, burst: u32) -> Bucket {
        let burst = f64::from(burst.max(1));
        Bucket {
            rate,
            burst,
            tokens: burst,
            last: Time::ZERO,
        }
    }

    fn refill(&mut self, now: Time) {
        if now > self.last {
            let secs = now.since(self.last).as_secs_f64();
            self.tokens = (self.tokens + secs * self.rate).min(self.burst);
            self.last = now;
        }
    }

    /// Takes a token if one is there.
    pub fn try_take(&mut self, now: Time) -> bool {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Tokens there at `now`; below zero, owed (see [`Bucket::charge`]).
    pub fn available(&mut self, now: Time) -> f64 {
        self.refill(now);
        self.tokens
    }

    /// Spends `cost` tokens whether or not they are there, going into debt:
    /// for a cost known only once something was let through (a log
    /// record's bytes), paid back by the refill before anything else gets
    /// through.
    pub fn charge(&mut self, cost: f64) {
        self.tokens -= cost;
    }

    /// When the next token will be there (as of the last refill).
    pub fn next_token(&self) -> Time {
        if self.tokens >= 1.0 {
            return self.last;
        }
        let wait = (1.0 - self.tokens) / self.rate;
        self.last + Duration::from_secs_f64(wait.max(0.001))
    }
}
