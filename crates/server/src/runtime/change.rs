//! What callers ask the pool to change, and who may ask it.
//!
//! A change reaches the pool's task as one message carrying its caller, and
//! [`apply`] checks "may this caller do this to this node or request" and
//! makes the change in the same step, with nothing in between: a node
//! cannot change hands between "is it yours?" and "release it".

use std::time::Duration;

use super::ServiceError;
use berth_core::pool::{Idle, NewRequest, NodeId, Pool, RequestId, Time};

/// Who asks: a client, acting only as the requestor of its name, or an
/// admin, who may do everything for anyone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    Client { name: String },
    Admin { name: String },
}

impl Caller {
    /// The caller of a program that embeds berth: trusted, like an admin.
    pub fn embedder() -> Caller {
        Caller::Admin {
            name: "embedder".into(),
        }
    }

    /// The token's name: a client's requestor, an admin's default one.
    pub fn name(&self) -> &str {
        match self {
            Caller::Client { name } | Caller::Admin { name } => name,
        }
    }

    pub fn is_admin(&self) -> bool {
        matches!(self, Caller::Admin { .. })
    }

    /// Whether the caller may make or see requests of `requestor`.
    pub fn may_act_for(&self, requestor: &str) -> bool {
        match self {
            Caller::Admin { .. } => true,
            Caller::Client { name } => name == requestor,
        }
    }

    /// Refuses a client: `what` is for admins only.
    pub fn must_be_admin(&self, what: &str) -> Result<(), ServiceError> {
        if self.is_admin() {
            return Ok(());
        }
        Err(ServiceError::Forbidden(format!(
            "{what} needs an admin token; `{}` is a client token",
            self.name()
        )))
    }
}

/// A change to the pool.
#[derive(Clone, Debug)]
pub enum Change {
    /// A new request; with `lease`, its requestor's lease is renewed for
    /// that long in the same step (a refused request renews nothing). With
    /// `id`, it is taken under that id, drawn by a process standing by
    /// that relayed it ([`Pool::submit_under`]); a request the pool has
    /// under that id already is the same one.
    Submit {
        new: NewRequest,
        lease: Option<Duration>,
        id: Option<RequestId>,
    },
    /// Withdraws a pending request (its requestor or an admin).
    Cancel(RequestId),
    /// Gives a node back (its holder or an admin).
    Release(NodeId),
    /// Sets a node's idle behaviour (admins).
    SetIdle(NodeId, Idle),
    /// Deletes a node whatever it is doing (admins).
    Delete(NodeId),
    /// Renews `requestor`'s lease for `ttl` (that requestor or an admin).
    Renew { requestor: String, ttl: Duration },
}

/// What a change did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Done {
    Submitted(RequestId),
    /// The lease now expires at this time.
    Renewed(Time),
    Changed,
}

/// Whether `caller` may ask for `new`: a client token only as its own
/// requestor.
pub(super) fn may_submit(caller: &Caller, new: &NewRequest) -> Result<(), ServiceError> {
    if caller.may_act_for(&new.requestor) {
        return Ok(());
    }
    Err(ServiceError::Forbidden(format!(
        "a client token acts only as its own requestor `{}`",
        caller.name()
    )))
}

/// Checks that `caller` may make `change`, and makes it.
pub(super) fn apply(
    pool: &mut Pool,
    now: Time,
    caller: &Caller,
    change: Change,
) -> Result<Done, ServiceError> {
    match change {
        Change::Submit { new, lease, id } => {
            may_submit(caller, &new)?;
            let requestor = new.requestor.clone();
            let id = match id {
                None => pool.submit(now, new)?,
                Some(id) => {
                    if pool.request(id).is_some_and(|r| r.requestor != requestor) {
                        return Err(ServiceError::Forbidden(format!(
                            "request {id} belongs to another requestor"
                        )));
                    }
                    pool.submit_under(now, id, new)?;
                    id
                }
            };
            if let Some(ttl) = lease {
                pool.renew(now, &requestor, ttl);
            }
            Ok(Done::Submitted(id))
        }
        Change::Cancel(id) => {
            let owner = pool.request(id).map(|r| caller.may_act_for(&r.requestor));
            if owner == Some(false) {
                return Err(ServiceError::Forbidden(format!(
                    "request {id} belongs to another requestor"
                )));
            }
            pool.cancel(now, id)?;
            Ok(Done::Changed)
        }
        Change::Release(id) => {
            // A node nobody holds is not the caller's to release either,
            // but the pool says why (409): it is not in use.
            if let Some(holder) = pool.requestor_of(id)
                && !caller.may_act_for(holder)
            {
                return Err(ServiceError::Forbidden(format!(
                    "node {id} is not held by requestor `{}`",
                    caller.name()
                )));
            }
            pool.release(now, id)?;
            Ok(Done::Changed)
        }
        Change::SetIdle(id, idle) => {
            caller.must_be_admin("setting a node's idle behaviour")?;
            pool.set_idle(now, id, idle)?;
            Ok(Done::Changed)
        }
        Change::Delete(id) => {
            caller.must_be_admin("deleting a node")?;
            pool.delete(now, id)?;
            Ok(Done::Changed)
        }
        Change::Renew { requestor, ttl } => {
            if !caller.may_act_for(&requestor) {
                return Err(ServiceError::Forbidden(format!(
                    "a client token renews only its own lease (`{}`)",
                    caller.name()
                )));
            }
            Ok(Done::Renewed(pool.renew(now, &requestor, ttl)))
        }
    }
}
