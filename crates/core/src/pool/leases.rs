//! Client leases: a requestor renews its lease with each heartbeat; when it
//! stops, its pending requests fail and its nodes in use are taken back, as
//! if it had released them.
//!
//! [`RequestorLeases`] is the book of who holds a lease until when, and what the store
//! has yet to hear of; it knows nothing of nodes or requests. What an expiry
//! does to them is [`Pool::reclaim`]'s.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

use super::{NodeId, NodeState, Notice, Pool, RequestState, RequestorLease, Time};

/// RequestorLeases by requestor, and the same ordered by expiry.
#[derive(Default)]
pub(super) struct RequestorLeases {
    /// Until when, and how long the last renewal made it last.
    until: HashMap<String, (Time, Duration)>,
    by_expiry: BTreeSet<(Time, String)>,
    /// Renewed since the store last heard.
    dirty: HashSet<String>,
    /// Ended since the store last heard.
    ended: Vec<String>,
}

impl RequestorLeases {
    /// Renews `requestor`'s lease (or takes one out) until `expires`, a
    /// renewal for `ttl`.
    pub(super) fn renew(&mut self, requestor: &str, expires: Time, ttl: Duration) {
        match self.until.get_mut(requestor) {
            Some(old) if *old == (expires, ttl) => return,
            Some(old) => {
                self.by_expiry.remove(&(old.0, requestor.to_owned()));
                *old = (expires, ttl);
            }
            None => {
                self.until.insert(requestor.to_owned(), (expires, ttl));
            }
        }
        self.by_expiry.insert((expires, requestor.to_owned()));
        self.dirty.insert(requestor.to_owned());
    }

    pub(super) fn get(&self, requestor: &str) -> Option<Time> {
        self.until.get(requestor).map(|(t, _)| *t)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = RequestorLease> + '_ {
        self.until.iter().map(|(r, (expires, ttl))| RequestorLease {
            requestor: r.clone(),
            expires: *expires,
            ttl: *ttl,
        })
    }

    /// A lease as stored: held, and nothing for the store to write.
    pub(super) fn restore(&mut self, lease: RequestorLease) {
        self.by_expiry
            .insert((lease.expires, lease.requestor.clone()));
        self.until
            .insert(lease.requestor, (lease.expires, lease.ttl));
    }

    /// The first lease to expire, when.
    pub(super) fn next_expiry(&self) -> Option<Time> {
        self.by_expiry.first().map(|(t, _)| *t)
    }

    /// Ends the lease that expires first if it has by `now`, and names its
    /// requestor.
    pub(super) fn pop_expired(&mut self, now: Time) -> Option<String> {
        if self.next_expiry()? > now {
            return None;
        }
        let (_, requestor) = self.by_expiry.pop_first()?;
        self.until.remove(&requestor);
        self.dirty.remove(&requestor);
        self.ended.push(requestor.clone());
        Some(requestor)
    }

    /// What the store has yet to hear: leases renewed, and leases ended.
    pub(super) fn take_changes(&mut self) -> (Vec<RequestorLease>, Vec<String>) {
        let renewed = self
            .dirty
            .drain()
            .filter_map(|r| {
                let (expires, ttl) = *self.until.get(&r)?;
                Some(RequestorLease {
                    requestor: r,
                    expires,
                    ttl,
                })
            })
            .collect();
        (renewed, std::mem::take(&mut self.ended))
    }
}

impl Pool {
    /// Renews `requestor`'s lease (or takes one out) until `now + ttl`, and
    /// returns that time.
    pub fn renew(&mut self, now: Time, requestor: &str, ttl: Duration) -> Time {
        let expires = now + ttl;
        self.leases.renew(requestor, expires, ttl);
        expires
    }

    /// When `requestor`'s lease expires, if it holds one.
    pub fn lease(&self, requestor: &str) -> Option<Time> {
        self.leases.get(requestor)
    }

    /// Every lease held.
    pub fn leases(&self) -> impl Iterator<Item = RequestorLease> + '_ {
        self.leases.iter()
    }

    /// Ends every lease that expired by `now`, and takes back what its
    /// requestor held.
    pub(super) fn expire_leases(&mut self, now: Time) {
        while let Some(requestor) = self.leases.pop_expired(now) {
            self.reclaim(&requestor, now);
        }
    }

    /// Fails `requestor`'s pending requests and takes back its nodes in use.
    fn reclaim(&mut self, requestor: &str, now: Time) {
        let mut pending = Vec::new();
        let mut fulfilled = HashSet::new();
        for r in self.requests.values() {
            if r.requestor != requestor {
                continue;
            }
            match r.state {
                RequestState::Pending => pending.push(r.id),
                RequestState::Fulfilled { .. } => {
                    fulfilled.insert(r.id);
                }
                _ => {}
            }
        }
        let in_use: Vec<NodeId> = self
            .nodes
            .values()
            .filter(|n| matches!(n.state, NodeState::InUse { request, .. } if fulfilled.contains(&request)))
            .map(|n| n.id)
            .collect();
        let reason =
            format!("requestor `{requestor}` stopped renewing its lease; the request was given up");
        for &id in &pending {
            let state = RequestState::Failed {
                at: now,
                reason: reason.clone(),
            };
            self.finish_request(id, state, now);
        }
        for &id in &in_use {
            self.update(id, |n| n.state = NodeState::Used { since: now });
            self.settle_used(id, now);
        }
        if !pending.is_empty() || !in_use.is_empty() {
            self.notices.push(Notice::LeaseExpired {
                requestor: requestor.to_owned(),
                failed: pending.len(),
                reclaimed: in_use.len(),
            });
        }
    }
}
