//! Whether the pool's task decides now ([`Mode`]), why a command was not
//! done ([`ServiceError`]), and why the task ended ([`PoolError`]).

use std::sync::Arc;

use berth_core::pool::{Conflict, Refused};
use berth_store::StoreError;

/// Why the pool could not do what a client asked.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Refused(#[from] Refused),
    #[error(transparent)]
    Conflict(#[from] Conflict),
    /// The caller may not do this (to this node or request).
    #[error("{0}")]
    Forbidden(String),
    /// The command queue is full: the pool is behind; try again shortly.
    #[error("the pool has {0} commands queued; try again shortly")]
    Busy(usize),
    #[error("the pool has stopped")]
    Stopped,
    /// The store could not be written, so the pool stopped deciding: what
    /// was asked is not done.
    #[error("the store could not be written ({0}); nothing was changed")]
    StoreFailed(Arc<str>),
    /// The store is out of reach (its server stopped, the network broke):
    /// the pool decides nothing until it is back; try again shortly.
    #[error("the store is out of reach ({0}); nothing was changed; try again shortly")]
    StoreUnavailable(Arc<str>),
    /// Another berth process holds the pool (`None`: not known yet which);
    /// this one stands by.
    #[error("{}", standby_text(.0.as_ref()))]
    Standby(Option<Holder>),
    /// The pool cannot take this config while it runs
    /// (`Pool::reconfigure`): it keeps its own.
    #[error("the pool keeps its config: {0}")]
    Reconfigure(String),
}

pub(super) fn standby_text(holder: Option<&Holder>) -> String {
    let Some(Holder { name, address }) = holder else {
        return "this berth process does not hold the pool and does not know yet who does; \
                try again shortly"
            .into();
    };
    format!(
        "this berth process stands by: the pool is held by {name} ({address}); nothing was \
         changed here"
    )
}

/// Another berth process that holds the pool: its holder name and the url
/// its API is reached at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub name: Arc<str>,
    pub address: Arc<str>,
}

/// Whether the pool's task decides now, and if not, why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// This process decides: it holds the pool, or the store is its own.
    Holding,
    /// Another process holds the pool (`None`: not known yet which, as just
    /// after this process was fenced out).
    Standby(Option<Holder>),
    /// The store is out of reach (its server stopped, the network broke).
    StoreLost(Arc<str>),
    /// A commit was refused: something else wrote the store's rows under
    /// this process, and the pool is reloaded from the store.
    Reloading(Arc<str>),
}

impl Mode {
    /// What a command sent now is answered with, while the pool decides
    /// nothing.
    pub fn refusal(&self) -> Option<ServiceError> {
        match self {
            Mode::Holding => None,
            Mode::Standby(holder) => Some(ServiceError::Standby(holder.clone())),
            Mode::StoreLost(why) => Some(ServiceError::StoreUnavailable(why.clone())),
            Mode::Reloading(why) => Some(ServiceError::StoreUnavailable(
                format!("the pool is being reloaded: {why}").into(),
            )),
        }
    }

    pub(super) fn stands_by_for(&self, name: &str) -> bool {
        matches!(self, Mode::Standby(Some(h)) if *h.name == *name)
    }
}

/// Why a pool's task ended with an error.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The store could not be written. The pool stopped at once: acting on
    /// the cloud, or telling a client, without a stored intent is how
    /// machines leak and nodes get handed out twice.
    #[error("the store could not be written")]
    Store(#[source] StoreError),
    /// The pool's task panicked.
    #[error("the pool's task panicked: {0}")]
    Panicked(String),
}
