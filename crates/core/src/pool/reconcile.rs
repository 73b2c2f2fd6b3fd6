//! The reconciler: what a provider's list of instances carrying the pool id
//! means for the nodes. The cloud's own tags are the truth after a restart.
//!
//! A list is a claim, not a fact. An instance missing from one list is only
//! *suspected* missing: nothing changes for its node. It is confirmed gone
//! once complete lists have not shown it for `missing-confirm`, two of them
//! at least; then a free node is given up and replaced, and a node in use is
//! kept for its holder (never deleted for it) until it is released. An
//! instance listed again while suspected is simply there again, and one
//! listed again after its node was given up brings the node back. A list
//! that shows none of several instances berth knows is not believed at all
//! until that, too, has lasted `missing-confirm` over two lists. Until a
//! node is confirmed gone it counts against its provider's limits, so no
//! answer of a list can make room for creates. docs/missing-instances.md
//! says the same for operators.
//!
//! Tags are claims too: what the store vouches for, and what it puts in
//! quarantine, is `vouch.rs`; what it takes back, `adopt.rs`.

use std::collections::{BTreeMap, HashSet};

use super::vouch::shown;
use super::*;
use crate::driver::{Instance, InstanceState, Page};

impl Pool {
    /// The outcome of a [`DriverCall::List`]: one page. The next page is
    /// owed while the page names one; a list is believed (or not) once its
    /// last page is in. A page that failed fails the list, which starts
    /// again later from its first page; one answered `rate-limited` is
    /// asked again once the provider's hold is over.
    pub fn listed(&mut self, now: Time, p: ProviderIx, result: Result<Page, Failure>) {
        let pix = p.0 as usize;
        let rate_limited = self.call_done(p, result.as_ref().err(), now);
        let rt = &mut self.ix.providers[pix];
        // A page of a list given up meanwhile changes nothing.
        let Some(listing) = rt.listing.as_mut() else {
            return;
        };
        listing.asking = false;
        let started = listing.started;
        let result = match result {
            Err(_) if rate_limited => return,
            Err(e) => Err(e),
            Ok(page) => {
                listing.instances.extend(page.instances);
                listing.pages += 1;
                match page.next {
                    Some(c) if c.len() > MAX_CURSOR => Err(Failure::host(
                        HostFailureKind::BadAnswer,
                        format!(
                            "a page's cursor of {} bytes (at most {MAX_CURSOR})",
                            c.len()
                        ),
                    )),
                    Some(_) if listing.pages >= MAX_PAGES => Err(Failure::host(
                        HostFailureKind::BadAnswer,
                        format!("the list did not end after {MAX_PAGES} pages"),
                    )),
                    Some(c) => {
                        listing.cursor = Some(c);
                        return;
                    }
                    None => Ok(std::mem::take(&mut listing.instances)),
                }
            }
        };
        rt.listing = None;
        rt.list_busy = false;
        // Pages checked one by one cannot see an instance named on two.
        let result = result.map(|all| {
            let (kept, refused) = crate::driver::check::listing(all);
            if !refused.is_empty() {
                self.notices.push(Notice::ListRefused {
                    provider: p,
                    refused,
                });
            }
            kept
        });
        self.list_done(now, p, started, result);
    }

    /// What a whole list that started at `started` changes (or, failed,
    /// does not).
    fn list_done(
        &mut self,
        now: Time,
        p: ProviderIx,
        started: Time,
        result: Result<Vec<Instance>, Failure>,
    ) {
        let pix = p.0 as usize;
        let instances = match result {
            Ok(instances) => instances,
            Err(e) => {
                let error = e.to_string();
                if !matches!(
                    &self.ix.providers[pix].list_health,
                    ListHealth::Failing { .. }
                ) {
                    self.ix.providers[pix].list_health = ListHealth::Failing {
                        since: now,
                        error: error.clone(),
                    };
                } else if let ListHealth::Failing { error: e, .. } =
                    &mut self.ix.providers[pix].list_health
                {
                    *e = error.clone();
                }
                // (A page answered `rate-limited` never fails its list.)
                self.list_not_believed(p, now, false, |failures| Notice::ListFailing {
                    provider: p,
                    failures,
                    error,
                });
                return;
            }
        };
        if self.suspect_list(p, &instances, started, now) {
            return;
        }
        self.list_believed(p, started, now);
        // Creates whose outcome was not known before this list started: it
        // shows their instance if they made one.
        let this_list = self.ix.providers[pix].lists_started;
        let resolved: Vec<(NodeId, String)> = (self.unsure.iter())
            .filter(|(id, (after, _))| {
                *after <= this_list && self.nodes.get(id).is_some_and(|n| n.provider == p)
            })
            .map(|(id, (_, why))| (*id, why.clone()))
            .collect();
        for (id, _) in &resolved {
            self.unsure.remove(id);
        }
        let first = !self.ix.providers[pix].listed;
        self.ix.providers[pix].listed = true;
        // `--adopt-instances` holds for each provider's first list.
        let adopting = self.adopting && first;
        let mut quarantine: BTreeMap<String, Quarantined> = BTreeMap::new();
        let mut seen: HashSet<NodeId> = HashSet::with_capacity(instances.len());
        // Of those, the ones listed alive: only that ends a suspicion.
        let mut seen_live: HashSet<NodeId> = HashSet::with_capacity(instances.len());
        let mut ids: HashSet<&str> = HashSet::with_capacity(instances.len());
        let mut leak_seen: HashSet<&str> = HashSet::new();
        let mut foreign = 0usize;
        for inst in &instances {
            if inst.tags.get(POOL_TAG) != Some(&self.config.pool_id) {
                foreign += 1;
                continue;
            }
            // The runtime refuses a list that names an instance twice; the
            // core does not rely on it.
            if !ids.insert(inst.id.as_str()) {
                continue;
            }
            let live = !matches!(
                inst.state,
                InstanceState::Terminated | InstanceState::Stopping
            );
            let node_id = inst.tags.get(NODE_TAG).and_then(|t| t.parse().ok());
            // The live node that holds this instance already, if any, is its
            // owner whatever its tags say: no other node may take it, and a
            // list that shows it under another node id has still shown it.
            let holder = self.holder(p, &inst.id);
            let ours = node_id.and_then(|id| self.nodes.get(&id)).is_some_and(|n| {
                n.provider == p
                    && !matches!(n.packing, Packing::Slot { .. })
                    && n.instance.as_deref().is_none_or(|i| i == inst.id)
            });
            let owner = holder.or(if ours { node_id } else { None });
            if let Some(id) = owner {
                seen.insert(id);
                if live {
                    seen_live.insert(id);
                }
                if self.observe(id, inst, live, now) {
                    if live {
                        self.check_tags(p, id, inst, started);
                    }
                    continue;
                }
            }
            if !live || holder.is_some() {
                // Held by a node: accounted for, not a leak.
                continue;
            }
            // Owned, live, and no live node accounts for it: adopted or
            // deleted only if the store vouches for it (or an operator
            // adopts on purpose), and never deleted while its tags say it
            // may be in use.
            if adopting {
                self.ix.providers[pix]
                    .taken_on_purpose
                    .insert(inst.id.clone());
            }
            let vouched = self.vouched(p, inst, node_id);
            let held = self.held_by_tags(inst, node_id);
            if owner.is_none()
                && vouched.is_ok()
                && let Some(adopt) = self.adoptable(p, inst)
                && !self.nodes.contains_key(&adopt.id)
            {
                if self.fits(p, inst, &adopt) {
                    self.adopt(p, inst, adopt, held, now);
                    continue;
                }
                // Adopting it would take the provider past its limits: it
                // is deleted as a leak, unless it goes away first (or its
                // tags say it is in use: then it waits in quarantine).
                if held.is_none() && !self.ix.providers[pix].leaks.contains_key(&inst.id) {
                    self.notices.push(Notice::NotAdopted {
                        provider: p,
                        instance: inst.id.clone(),
                    });
                }
            }
            if let Some(why) = vouched.err().or(held) {
                let node = inst.tags.get(NODE_TAG).map(|t| shown(t));
                quarantine.insert(inst.id.clone(), Quarantined { node, why });
                continue;
            }
            leak_seen.insert(inst.id.as_str());
            // A node given up as vanished whose instance is listed again is
            // back (its instance never went), if the provider's limits have
            // room for it; if not, it is a leak like any other.
            if let Some(id) = node_id
                && let Some(n) = self.nodes.get(&id)
                && matches!(
                    n.state,
                    NodeState::Gone {
                        reason: GoneReason::Vanished,
                        ..
                    }
                )
                && n.provider == p
                && n.instance.as_deref() == Some(inst.id.as_str())
            {
                if self.room_for(p, n.resources) {
                    self.revive(id, inst, now);
                    continue;
                }
                if !self.ix.providers[pix].leaks.contains_key(&inst.id) {
                    self.notices.push(Notice::NotAdopted {
                        provider: p,
                        instance: inst.id.clone(),
                    });
                }
            }
            let stale = node_id
                .and_then(|id| self.nodes.get(&id))
                .and_then(|n| match n.state {
                    NodeState::Gone { since, .. } | NodeState::Failed { since, .. }
                        if n.instance.as_deref() == Some(inst.id.as_str()) =>
                    {
                        Some((n.id, since + self.config.timings.delete_retry))
                    }
                    _ => None,
                });
            let leak_grace = self.config.timings.leak_grace;
            let rt = &mut self.ix.providers[pix];
            rt.leaks
                .entry(inst.id.clone())
                .or_insert_with(|| match stale {
                    Some((node, due)) => Leak {
                        node: Some(node),
                        due,
                        busy: false,
                    },
                    None => Leak {
                        node: None,
                        due: now + leak_grace,
                        busy: false,
                    },
                });
        }
        // Leaks that went away on their own are forgotten.
        self.ix.providers[pix]
            .leaks
            .retain(|id, l| l.busy || leak_seen.contains(id.as_str()));
        // Nodes whose instance is missing from a list that started after
        // berth learned of it are suspected missing; lists that keep not
        // showing it confirm it.
        let missing: Vec<NodeId> = self.ix.providers[pix]
            .with_instance
            .iter()
            .copied()
            .filter(|id| !seen.contains(id))
            .filter(|id| self.attached_at.get(id).is_none_or(|t| *t < started))
            .filter(|id| !self.busy.contains(id))
            .collect();
        self.suspect_missing(p, &missing, &seen_live, now);
        // A node being deleted whose create may have been sent before a
        // restart, and which the list does not show: nothing to delete.
        if first {
            let unresolved: Vec<NodeId> = self
                .nodes
                .values()
                .filter(|n| n.provider == p && n.instance.is_none())
                .filter(|n| matches!(n.state, NodeState::Deleting { .. }))
                .filter(|n| !self.busy.contains(&n.id))
                .map(|n| n.id)
                .collect();
            for id in unresolved {
                self.gone(id, GoneReason::Aborted, now);
            }
        }
        // Not shown: it was not created, and is tried again as after any
        // failed create.
        for (id, why) in resolved {
            let still = self.nodes.get(&id).is_some_and(|n| {
                matches!(n.state, NodeState::Creating { .. }) && n.instance.is_none()
            });
            if still && !self.busy.contains(&id) {
                let why = format!("create: {why}; no instance of it was listed afterwards");
                self.failed_try(id, why, DeleteReason::LaunchFailed, now);
            }
        }
        self.settle_quarantine(p, quarantine, adopting);
        if foreign > 0 && !self.ix.providers[pix].foreign_said {
            self.ix.providers[pix].foreign_said = true;
            self.notices.push(Notice::Foreign {
                provider: p,
                count: foreign,
            });
        }
        // Only instances that exist and are not running yet need the quick
        // poll; creates still owed do not (a poll would only spend the
        // provider's rate limit that the creates need). They are looked at
        // by id (`get`) when the first of them is next worth a look; the
        // next list comes after `sync-interval`.
        let boot_poll = self.next_boot_poll(p, now);
        let synced = now + self.config.timings.sync_interval;
        // A create whose outcome is not known waits for the next list: at
        // once.
        let waiting =
            (self.unsure.keys()).any(|id| self.nodes.get(id).is_some_and(|n| n.provider == p));
        let rt = &mut self.ix.providers[pix];
        rt.next_list = if waiting { now } else { synced };
        rt.next_boot_poll = boot_poll;
    }

    /// A list that failed or was not believed: the next comes after a backoff
    /// (unless the driver said when), and the problem is said at the first
    /// in a row, then at most once a minute.
    fn list_not_believed(
        &mut self,
        p: ProviderIx,
        now: Time,
        rate_limited: bool,
        notice: impl FnOnce(u32) -> Notice,
    ) {
        let t = &self.config.timings;
        let (boot, sync) = (t.boot_poll_interval, t.sync_interval);
        let rt = &mut self.ix.providers[p.0 as usize];
        rt.list_failures += 1;
        if !rate_limited {
            // Listing is what everything else rests on: try again soon, but
            // back off while it keeps failing.
            let doubling = boot.saturating_mul(1 << (rt.list_failures - 1).min(16));
            rt.next_list = now + doubling.min(sync.max(boot));
        }
        let due = rt
            .list_said
            .is_none_or(|t| now.since(t) >= std::time::Duration::from_secs(60));
        if rt.list_failures == 1 || due {
            rt.list_said = Some(now);
            let n = notice(rt.list_failures);
            self.notices.push(n);
        }
    }

    /// A list berth believes: the provider's lists are fine again.
    fn list_believed(&mut self, p: ProviderIx, started: Time, now: Time) {
        let rt = &mut self.ix.providers[p.0 as usize];
        let was = std::mem::replace(&mut rt.list_health, ListHealth::Ok);
        rt.list_failures = 0;
        rt.list_said = None;
        rt.last_listed = Some(started);
        match was {
            ListHealth::Failing { since, .. } | ListHealth::Suspect { since, .. } => {
                self.notices
                    .push(Notice::ListRecovered { provider: p, since });
                let _ = now;
            }
            ListHealth::Ok => {}
        }
    }

    /// Whether a list is not to be believed as a whole: it shows none of
    /// the instances (two or more) berth knows on the provider. Once such
    /// answers have lasted `missing-confirm` over two lists, they are
    /// believed (their instances are then suspected one by one).
    fn suspect_list(
        &mut self,
        p: ProviderIx,
        instances: &[Instance],
        started: Time,
        now: Time,
    ) -> bool {
        let pix = p.0 as usize;
        let known: Vec<&str> = self.ix.providers[pix]
            .with_instance
            .iter()
            .filter(|id| self.attached_at.get(id).is_none_or(|t| *t < started))
            .filter_map(|id| self.nodes.get(id).and_then(|n| n.instance.as_deref()))
            .collect();
        if known.len() < 2 {
            return false;
        }
        let listed: HashSet<&str> = instances.iter().map(|i| i.id.as_str()).collect();
        if known.iter().any(|i| listed.contains(i)) {
            return false;
        }
        let known = known.len();
        let confirm = self.config.timings.missing_confirm;
        let rt = &mut self.ix.providers[pix];
        let since = match rt.list_health {
            ListHealth::Suspect { since, .. } => since,
            _ => {
                rt.list_health = ListHealth::Suspect { since: now, known };
                rt.list_failures = 0;
                now
            }
        };
        // Two suspect answers at least (the counter counts them), over the
        // confirmation time: the cloud may really have lost everything.
        if rt.list_failures >= 1 && now.since(since) >= confirm {
            return false;
        }
        self.list_not_believed(p, now, false, |_| Notice::ListSuspect {
            provider: p,
            known,
        });
        true
    }

    /// Nodes a believed list did not show are suspected; those it showed
    /// alive are cleared. A suspicion that has lasted two lists and
    /// `missing-confirm` is confirmed: the node is given up, or kept for its
    /// holder if it is in use.
    fn suspect_missing(
        &mut self,
        p: ProviderIx,
        missing: &[NodeId],
        seen: &HashSet<NodeId>,
        now: Time,
    ) {
        let pix = p.0 as usize;
        let confirm = self.config.timings.missing_confirm;
        // Suspicions of nodes that were listed again, or are gone, end.
        let mut reappeared = Vec::new();
        let rt = &mut self.ix.providers[pix];
        let with_instance = &rt.with_instance;
        rt.missing.retain(|id, m| {
            if seen.contains(id) {
                if !m.confirmed {
                    reappeared.push(*id);
                }
                return false;
            }
            with_instance.contains(id)
        });
        for node in reappeared {
            self.notices.push(Notice::Reappeared { node });
        }
        let mut confirmed = Vec::new();
        let rt = &mut self.ix.providers[pix];
        let missing_now = &rt.missing;
        rt.to_confirm.retain(|id| missing_now.contains_key(id));
        for &id in missing {
            let rt = &mut self.ix.providers[pix];
            // Kept for its holder until now: once nobody uses it, it goes.
            if rt.missing.get(&id).is_some_and(|m| m.confirmed) {
                if self.nodes.get(&id).is_some_and(|n| !self.in_use(n)) {
                    self.ix.providers[pix].missing.remove(&id);
                    confirmed.push(id);
                }
                continue;
            }
            let new = !rt.missing.contains_key(&id);
            let m = rt.missing.entry(id).or_insert(Missing {
                since: now,
                lists: 0,
                confirmed: false,
            });
            m.lists += 1;
            if !m.confirmed && m.lists >= 2 && now.since(m.since) >= confirm {
                // Long enough: a look by id decides (`got`).
                rt.to_confirm.insert(id);
            }
            if new {
                let instance = self.nodes[&id].instance.clone().unwrap_or_default();
                self.notices.push(Notice::Missing { node: id, instance });
            }
        }
        for id in confirmed {
            self.lost(id, now);
        }
    }

    /// The outcome of a [`DriverCall::Get`] of `asked`: instances suspected
    /// missing are confirmed gone if the answer leaves them out, and are
    /// there after all if it shows them; whatever it shows brings its node
    /// in line, as a list would. A failed `get` confirms nothing: it is
    /// asked again after a backoff.
    pub fn got(
        &mut self,
        now: Time,
        p: ProviderIx,
        asked: &[String],
        result: Result<Vec<Instance>, Failure>,
    ) {
        let pix = p.0 as usize;
        self.ix.providers[pix].get_busy = false;
        let rate_limited = self.call_done(p, result.as_ref().err(), now);
        // The booting nodes' next look, whatever this one showed.
        let reschedule = |pool: &mut Pool| {
            let at = pool.next_boot_poll(p, now);
            pool.ix.providers[pix].next_boot_poll = at;
        };
        let found = match result {
            Ok(found) => found,
            Err(_) => {
                let rt = &mut self.ix.providers[pix];
                rt.get_failures += 1;
                if !rate_limited {
                    rt.next_get = now + calls::backoff(rt.get_failures);
                }
                reschedule(self);
                return;
            }
        };
        self.ix.providers[pix].get_failures = 0;
        let mut shown: HashSet<&str> = HashSet::new();
        let mut seen_live = HashSet::new();
        for inst in &found {
            // Only what was asked, of this pool: a driver's answer is a claim.
            if !asked.contains(&inst.id)
                || inst.tags.get(POOL_TAG) != Some(&self.config.pool_id)
                || !shown.insert(inst.id.as_str())
            {
                continue;
            }
            let Some(id) = self.holder(p, &inst.id) else {
                continue;
            };
            let live = !matches!(
                inst.state,
                InstanceState::Terminated | InstanceState::Stopping
            );
            if live {
                seen_live.insert(id);
            }
            self.observe(id, inst, live, now);
        }
        // Suspicions the answer ends: shown alive, there after all.
        let rt = &mut self.ix.providers[pix];
        let mut reappeared = Vec::new();
        rt.missing.retain(|id, m| {
            if seen_live.contains(id) {
                if !m.confirmed {
                    reappeared.push(*id);
                }
                return false;
            }
            true
        });
        for node in reappeared {
            self.notices.push(Notice::Reappeared { node });
        }
        // Those asked and not shown: gone.
        let rt = &mut self.ix.providers[pix];
        let confirmed: Vec<NodeId> = (rt.to_confirm.iter().copied())
            .filter(|id| {
                self.nodes.get(id).is_some_and(|n| {
                    n.instance
                        .as_ref()
                        .is_some_and(|i| asked.contains(i) && !shown.contains(i.as_str()))
                })
            })
            .collect();
        let rt = &mut self.ix.providers[pix];
        rt.to_confirm
            .retain(|id| !seen_live.contains(id) && !confirmed.contains(id));
        for id in confirmed {
            self.lost(id, now);
        }
        reschedule(self);
    }

    /// A node given up as vanished whose instance is listed again.
    fn revive(&mut self, id: NodeId, inst: &Instance, now: Time) {
        self.update(id, |n| n.state = NodeState::Booting { since: now });
        self.attach(id, inst, now);
        self.notices.push(Notice::Revived {
            node: id,
            instance: inst.id.clone(),
        });
        if inst.state == InstanceState::Running {
            self.running(id, now);
        }
    }

    /// Brings a node in line with its listed instance. Returns whether the
    /// instance is accounted for.
    pub(super) fn observe(&mut self, id: NodeId, inst: &Instance, live: bool, now: Time) -> bool {
        let state = self.nodes[&id].state.clone();
        match state {
            NodeState::Creating { since, .. } => {
                if !live {
                    return true;
                }
                self.attach(id, inst, now);
                if inst.state == InstanceState::Failed {
                    // Whether its create's answer is still to come or was
                    // lost, this instance will never run.
                    self.instance_failed(id, inst, now);
                } else if !self.busy.contains(&id) {
                    // Its create's answer was lost (a restart): the list is it.
                    match inst.state {
                        InstanceState::Running => self.running(id, now),
                        _ => self.set_booting(id, since, now),
                    }
                }
                true
            }
            NodeState::Booting { .. } => {
                if !live {
                    self.lost(id, now);
                } else {
                    self.attach(id, inst, now);
                    match inst.state {
                        InstanceState::Running => self.running(id, now),
                        InstanceState::Failed => self.instance_failed(id, inst, now),
                        _ => {}
                    }
                }
                true
            }
            NodeState::Ready { .. } | NodeState::InUse { .. } | NodeState::Used { .. } => {
                if !live {
                    self.lost(id, now);
                } else {
                    self.attach(id, inst, now);
                    // One that ran and failed since is no good to hand out,
                    // nor to keep once its client is done: it is deleted,
                    // unless a client holds it now.
                    if inst.state == InstanceState::Failed && !self.in_use(&self.nodes[&id]) {
                        self.begin_delete(id, DeleteReason::InstanceFailed, now);
                    }
                }
                true
            }
            NodeState::Deleting { .. } => {
                if !live {
                    self.gone(id, GoneReason::Deleted, now);
                } else if self.nodes[&id].instance.is_none() {
                    // Found the instance of a create the restart lost: now
                    // there is something to delete.
                    self.attach(id, inst, now);
                }
                true
            }
            NodeState::Gone { .. } | NodeState::Failed { .. } => !live,
        }
    }
}
