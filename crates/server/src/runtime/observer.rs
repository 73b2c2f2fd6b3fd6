//! What the running pool tells whoever listens (metrics, health): driver
//! calls, notices, fulfilments, commits.

use std::sync::Arc;
use std::time::Duration;

use berth_config::Config;
use berth_core::driver::check::BadAnswer;
use berth_core::pool::{Notice, Request};
use berth_plugin::CallError;

/// How a driver call ended, in a word: `ok` or
/// [`CallErrorKind::outcome`](berth_plugin::CallErrorKind::outcome)'s.
pub fn outcome_name(result: Result<(), &CallError>) -> &'static str {
    result.err().map_or("ok", |e| e.kind.outcome())
}

/// Hears what the running pool does, for metrics and health. Called on the
/// pool's task or a driver call's task: it must be quick and must not block.
pub trait Observer: Send + Sync {
    /// A driver call on `provider` began (`change` 1) or ended (-1): one
    /// this process decided, from the moment it was committed, or one it
    /// carries out for another process. Said by [`InFlight`].
    fn in_flight(&self, _provider: &str, _change: i8) {}
    /// A driver call ended after `took`.
    fn call(
        &self,
        _provider: &str,
        _call: berth_core::driver::Call,
        _result: Result<(), &CallError>,
        _took: Duration,
    ) {
    }
    /// Something worth an operator's attention happened.
    fn notice(&self, _config: &Config, _notice: &Notice) {}
    /// A request was handed its nodes `latency` after it was made.
    fn fulfilled(&self, _request: &Request, _latency: Duration) {}
    /// The store took `took` to commit one batch of changes.
    fn committed(&self, _took: Duration) {}
    /// One heartbeat of the providers' leases (a PostgreSQL store) took
    /// `took`, whether or not it reached the database.
    fn heartbeat(&self, _took: Duration) {}
    /// The pool's holder took `count` requests in from the store's inbox.
    fn taken_in(&self, _count: usize) {}
    /// Instances a driver answered that failed berth's checks (see
    /// [`berth_core::driver::check`]); the pool never saw them.
    fn refused(&self, _provider: &str, _refused: &[BadAnswer]) {}
    /// A readiness probe of one of `provider`'s instances ended after `took`.
    fn probed(
        &self,
        _provider: &str,
        _check: berth_config::Check,
        _result: Result<(), &str>,
        _took: Duration,
    ) {
    }
}

/// A driver call counted in flight, from when it is made until this is
/// dropped, however the call ends.
pub struct InFlight {
    observer: Arc<dyn Observer>,
    provider: Arc<str>,
}

impl InFlight {
    pub fn new(observer: Arc<dyn Observer>, provider: Arc<str>) -> InFlight {
        observer.in_flight(&provider, 1);
        InFlight { observer, provider }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.observer.in_flight(&self.provider, -1);
    }
}

/// An observer that hears nothing.
pub(super) struct Deaf;
impl Observer for Deaf {}
