//! What callers ask the pool to change, and who may ask it.
//!
//! A change reaches the pool's task as one message carrying its caller, and
//! [`Change::apply`] checks "may this caller do this to this node or request" and
//! makes the change in the same step, with nothing in between: a node
//! cannot change hands between "is it yours?" and "release it".

use std::time::Duration;

use super::mode::ServiceError;
use berth_core::pool::{Idle, NewRequest, NodeId, Pool, RequestId, Submitted, Time};

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

    /// `admin` or `client`, as the API names roles.
    pub fn role(&self) -> &'static str {
        match self {
            Caller::Admin { .. } => "admin",
            Caller::Client { .. } => "client",
        }
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

/// A change a caller asks of the pool: checked against the caller and made
/// in one step of the pool, answered with its `Output` once stored.
pub trait Change: Send + 'static {
    /// What the change answers once it is stored.
    type Output: Send + 'static;
    /// Checks that `caller` may make the change, and makes it.
    fn apply(
        self,
        pool: &mut Pool,
        now: Time,
        caller: &Caller,
    ) -> Result<Self::Output, ServiceError>;
}

/// A new request; with `lease`, its requestor's lease is renewed for that
/// long in the same step (a refused request renews nothing). With `id`, it
/// is taken under that id, drawn by a process standing by that relayed it
/// ([`Pool::submit_under`]); a request the pool has under that id already
/// is the same one. A request with an idempotency key is taken under the
/// id its key names ([`Pool::ask`]). Answers the request's id, and whether
/// it is new.
#[derive(Clone, Debug)]
pub struct Submit {
    pub new: NewRequest,
    pub lease: Option<Duration>,
    pub id: Option<RequestId>,
}

/// Withdraws a pending request (its requestor or an admin).
#[derive(Clone, Copy, Debug)]
pub struct Cancel(pub RequestId);

/// Gives a node back (its holder or an admin).
#[derive(Clone, Copy, Debug)]
pub struct Release(pub NodeId);

/// Sets a node's idle behaviour (admins).
#[derive(Clone, Copy, Debug)]
pub struct SetIdle(pub NodeId, pub Idle);

/// Deletes a node whatever it is doing (admins).
#[derive(Clone, Copy, Debug)]
pub struct Delete(pub NodeId);

/// Renews `requestor`'s lease for `ttl` (that requestor or an admin).
/// Answers when the lease now expires.
#[derive(Clone, Debug)]
pub struct Renew {
    pub requestor: String,
    pub ttl: Duration,
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

impl Change for Submit {
    type Output = Submitted;
    fn apply(self, pool: &mut Pool, now: Time, caller: &Caller) -> Result<Submitted, ServiceError> {
        let Submit { new, lease, id } = self;
        may_submit(caller, &new)?;
        let requestor = new.requestor.clone();
        let submitted = match id {
            None => pool.ask(now, new)?,
            Some(id) => {
                if pool.request(id).is_some_and(|r| r.requestor != requestor) {
                    return Err(ServiceError::Forbidden(format!(
                        "request {id} belongs to another requestor"
                    )));
                }
                let fresh = pool.submit_under(now, id, new)?;
                Submitted { id, fresh }
            }
        };
        if let Some(ttl) = lease {
            pool.renew(now, &requestor, ttl);
        }
        Ok(submitted)
    }
}

impl Change for Cancel {
    type Output = ();
    fn apply(self, pool: &mut Pool, now: Time, caller: &Caller) -> Result<(), ServiceError> {
        let Cancel(id) = self;
        let owner = pool.request(id).map(|r| caller.may_act_for(&r.requestor));
        if owner == Some(false) {
            return Err(ServiceError::Forbidden(format!(
                "request {id} belongs to another requestor"
            )));
        }
        Ok(pool.cancel(now, id)?)
    }
}

impl Change for Release {
    type Output = ();
    fn apply(self, pool: &mut Pool, now: Time, caller: &Caller) -> Result<(), ServiceError> {
        let Release(id) = self;
        // A node nobody holds is not the caller's to release either, but
        // the pool says why (409): it is not in use.
        if let Some(holder) = pool.requestor_of(id)
            && !caller.may_act_for(holder)
        {
            return Err(ServiceError::Forbidden(format!(
                "node {id} is not held by requestor `{}`",
                caller.name()
            )));
        }
        Ok(pool.release(now, id)?)
    }
}

impl Change for SetIdle {
    type Output = ();
    fn apply(self, pool: &mut Pool, now: Time, caller: &Caller) -> Result<(), ServiceError> {
        caller.must_be_admin("setting a node's idle behaviour")?;
        Ok(pool.set_idle(now, self.0, self.1)?)
    }
}

impl Change for Delete {
    type Output = ();
    fn apply(self, pool: &mut Pool, now: Time, caller: &Caller) -> Result<(), ServiceError> {
        caller.must_be_admin("deleting a node")?;
        Ok(pool.delete(now, self.0)?)
    }
}

impl Change for Renew {
    type Output = Time;
    fn apply(self, pool: &mut Pool, now: Time, caller: &Caller) -> Result<Time, ServiceError> {
        if !caller.may_act_for(&self.requestor) {
            return Err(ServiceError::Forbidden(format!(
                "a client token renews only its own lease (`{}`)",
                caller.name()
            )));
        }
        Ok(pool.renew(now, &self.requestor, self.ttl))
    }
}
