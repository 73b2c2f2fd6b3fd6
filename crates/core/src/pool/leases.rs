//! Client leases: a requestor renews its lease with each heartbeat; when it
//! stops, its pending requests fail and its nodes in use are taken back, as
//! if it had released them.

use std::time::Duration;

use super::*;

impl Pool {
    /// Renews `requestor`'s lease (or takes one out) until `now + ttl`, and
    /// returns that time.
    pub fn renew(&mut self, now: Time, requestor: &str, ttl: Duration) -> Time {
        let expires = now + ttl;
        match self.leases.get_mut(requestor) {
            Some(old) if *old == expires => return expires,
            Some(old) => {
                self.lease_expiry.remove(&(*old, requestor.to_owned()));
                *old = expires;
            }
            None => {
                self.leases.insert(requestor.to_owned(), expires);
            }
        }
        self.lease_expiry.insert((expires, requestor.to_owned()));
        self.dirty_leases.insert(requestor.to_owned());
        expires
    }

    /// When `requestor`'s lease expires, if it holds one.
    pub fn lease(&self, requestor: &str) -> Option<Time> {
        self.leases.get(requestor).copied()
    }

    /// Every lease held.
    pub fn leases(&self) -> impl Iterator<Item = Lease> + '_ {
        self.leases.iter().map(|(r, t)| Lease {
            requestor: r.clone(),
            expires: *t,
        })
    }

    pub(super) fn restore_lease(&mut self, lease: Lease) {
        self.lease_expiry
            .insert((lease.expires, lease.requestor.clone()));
        self.leases.insert(lease.requestor, lease.expires);
    }

    /// Ends every lease that expired by `now`.
    pub(super) fn expire_leases(&mut self, now: Time) {
        while let Some((at, _)) = self.lease_expiry.first()
            && *at <= now
        {
            let Some((_, requestor)) = self.lease_expiry.pop_first() else {
                break;
            };
            self.leases.remove(&requestor);
            self.dirty_leases.remove(&requestor);
            self.purged_leases.push(requestor.clone());
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
