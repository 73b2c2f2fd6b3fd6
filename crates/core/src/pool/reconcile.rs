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
//! Tags are claims too. An instance berth has no live node for is adopted
//! or deleted only if the store vouches for it: the store recorded that
//! very instance for its node, or its tags carry this store's signature
//! (`identity.rs`). One it cannot vouch for (made by hand, by another
//! store, or by a berth before signed tags) is put in quarantine: never
//! handed out, never deleted, reported for a person. So is one whose tags
//! say it is in use (`berth-request`, `berth-slots-held`) or that names a
//! node in use, unless the store shows that use has ended. A node the store
//! has free whose instance is tagged as handed out to a request the store
//! does not have it handed to is put on hold: the store lost the hand-out.

use std::collections::{BTreeMap, HashSet};

use super::calls::boot_poll_after;
use super::*;
use crate::driver::{Instance, InstanceState};
use crate::text::{printable, truncated};

/// Most instances a quarantine notice names; the rest are counted.
const QUARANTINE_NAMED: usize = 5;

impl Pool {
    /// The outcome of an [`DriverCall::List`] that started at `started`.
    pub fn listed(
        &mut self,
        now: Time,
        p: ProviderIx,
        started: Time,
        result: Result<Vec<Instance>, Failure>,
    ) {
        let pix = p.0 as usize;
        self.ix.providers[pix].list_busy = false;
        let rate_limited = self.call_done(p, result.as_ref().err(), now);
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
                self.list_not_believed(p, now, rate_limited, |failures| Notice::ListFailing {
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
        // provider's rate limit that the creates need). The next list comes
        // when the first of them is next worth a look.
        let cap = self.config.timings.boot_poll_interval;
        let boot_poll = self.ix.providers[pix]
            .with_instance
            .iter()
            .filter(|id| !self.is_probed(**id))
            .filter_map(|id| match self.nodes.get(id).map(|n| &n.state) {
                Some(NodeState::Booting { .. } | NodeState::Creating { .. }) => {
                    Some(boot_poll_after(self.boot_seen(*id, now), now, cap))
                }
                _ => None,
            })
            .min();
        let synced = now + self.config.timings.sync_interval;
        let next = boot_poll.map_or(synced, |at| at.min(synced));
        // A create whose outcome is not known waits for the next list: at
        // once.
        let waiting =
            (self.unsure.keys()).any(|id| self.nodes.get(id).is_some_and(|n| n.provider == p));
        self.ix.providers[pix].next_list = if waiting { now } else { next };
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
                confirmed.push(id);
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
                if !self.busy.contains(&id) {
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
                    if inst.state == InstanceState::Running {
                        self.running(id, now);
                    }
                }
                true
            }
            NodeState::Ready { .. } | NodeState::InUse { .. } | NodeState::Used { .. } => {
                if !live {
                    self.lost(id, now);
                } else {
                    self.attach(id, inst, now);
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

impl Pool {
    /// Whether the store vouches for an owned instance no live node
    /// holds: it recorded that very instance for the node its tags name,
    /// or the tags carry this store's signature. If not, why not.
    fn vouched(&self, p: ProviderIx, inst: &Instance, node: Option<NodeId>) -> Result<(), String> {
        let recorded = node
            .and_then(|id| self.nodes.get(&id))
            .is_some_and(|n| n.provider == p && n.instance.as_deref() == Some(inst.id.as_str()));
        if recorded
            || self.ix.providers[p.0 as usize]
                .taken_on_purpose
                .contains(&inst.id)
        {
            return Ok(());
        }
        let tag = |key: &str| inst.tags.get(key).map(String::as_str);
        match (tag(STORE_TAG), tag(SIG_TAG)) {
            (None, _) | (_, None) => {
                return Err(
                    "its tags carry no signature: made by hand, or by a berth before signed tags"
                        .into(),
                );
            }
            (Some(g), _) if g != self.identity.generation => {
                return Err(format!(
                    "it was made by another store (generation {})",
                    shown(g)
                ));
            }
            _ => {}
        }
        let wrong = || Err("its signature does not match its tags".to_owned());
        let (Some(node), Some(label), Some(sig)) = (node, tag(LABEL_TAG), tag(SIG_TAG)) else {
            return wrong();
        };
        let slots = match (tag(SLOT_LABEL_TAG), tag(SLOTS_TAG)) {
            (None, None) => None,
            (Some(l), Some(n)) => match n.parse::<u16>() {
                Ok(n) => Some((l, n)),
                Err(_) => return wrong(),
            },
            _ => return wrong(),
        };
        // Signed with the type berth asked for; a driver may report it
        // spelled otherwise, so the label's own types here count too.
        let offered = (self.config.label(label))
            .map(|l| self.machine_offers(l))
            .unwrap_or_default()
            .iter()
            .filter(|o| o.provider == p)
            .map(|o| o.instance_type.as_str());
        let signed = std::iter::once(inst.instance_type.as_str())
            .chain(offered)
            .any(|instance_type| {
                let what = Signed {
                    pool_id: &self.config.pool_id,
                    node,
                    label,
                    instance_type,
                    slots,
                };
                self.identity.verify(what, sig)
            });
        if signed { Ok(()) } else { wrong() }
    }

    /// Whether an owned instance no live node holds may be in use, as far
    /// as the store cannot rule out: its tags name a node in use, or say
    /// it is handed out (to a request the store does not have it handed
    /// to). Such an instance is never deleted.
    fn held_by_tags(&self, inst: &Instance, node: Option<NodeId>) -> Option<String> {
        let known = node.and_then(|id| self.nodes.get(&id));
        if let Some(n) = known
            && self.in_use(n)
        {
            return Some(format!(
                "its tags name node {}, which is in use on another instance",
                n.id
            ));
        }
        if let Some(r) = self.handed_out_unknown(inst, node) {
            return Some(format!(
                "it is tagged as handed out to request {}, which the store does not have it handed to",
                shown(r)
            ));
        }
        if let Some(held) = inst.tags.get(SLOTS_HELD_TAG)
            && held != "0"
            && known.is_none()
        {
            return Some(format!(
                "it is tagged as having {} slots handed out, and the store does not know its node",
                shown(held)
            ));
        }
        None
    }

    /// A node's listed instance against what berth last set on it, once no
    /// change of its tags is on its way (none owed or in flight, and the
    /// list started after the last one was confirmed). A node the store
    /// has free whose instance is tagged as handed out is put on hold; tags
    /// that differ otherwise are set again (once per node and start: this
    /// is also how the first start with signed tags signs what the store
    /// knows).
    fn check_tags(&mut self, p: ProviderIx, id: NodeId, inst: &Instance, started: Time) {
        // The common case, cheap: compared once already, and nothing on
        // the instance says it is handed out.
        if self.tags_checked.contains(&id)
            && !inst.tags.contains_key(REQUEST_TAG)
            && !inst.tags.contains_key(SLOTS_HELD_TAG)
        {
            return;
        }
        let Some(n) = self.nodes.get(&id) else {
            return;
        };
        if n.state.is_final()
            || matches!(n.state, NodeState::Deleting { .. })
            || matches!(n.packing, Packing::Slot { .. })
        {
            return;
        }
        let moving = self.busy.contains(&id)
            || self.ix.providers[p.0 as usize].want_tags.contains(&id)
            || self.tagged_at.get(&id).is_some_and(|t| *t >= started);
        if moving {
            return;
        }
        if n.idle != Idle::Hold
            && !self.in_use(n)
            && let Some(why) = self.handed_out_by_tags(n, inst)
        {
            self.unassign(id);
            self.update(id, |n| n.idle = Idle::Hold);
            self.notices.push(Notice::HeldByTags {
                node: id,
                instance: inst.id.clone(),
                why,
            });
            return;
        }
        if self.tags_checked.insert(id) && self.tags_differ(&self.nodes[&id], inst) {
            self.owe_tags(id);
        }
    }

    /// The request `inst`'s `berth-request` tag names, when the store does
    /// not have `node` handed out to it (or the tag names no request).
    fn handed_out_unknown<'i>(&self, inst: &'i Instance, node: Option<NodeId>) -> Option<&'i str> {
        let r = inst.tags.get(REQUEST_TAG)?;
        let known = (r.parse::<RequestId>().ok())
            .and_then(|r| self.requests.get(&r))
            .is_some_and(|req| node.is_some_and(|n| req.nodes.contains(&n)));
        (!known).then_some(r.as_str())
    }

    /// For a node the store has free: whether its instance's tags say it
    /// is handed out, to a request the store does not have it handed to
    /// (its hand-out was lost with a damaged store).
    fn handed_out_by_tags(&self, n: &Node, inst: &Instance) -> Option<String> {
        if let Some(r) = self.handed_out_unknown(inst, Some(n.id)) {
            return Some(format!(
                "its instance is tagged as handed out to request {}, which the store does not have it handed to",
                shown(r)
            ));
        }
        match inst.tags.get(SLOTS_HELD_TAG) {
            Some(held) if matches!(n.packing, Packing::Backing { .. }) && held != "0" => {
                Some(format!(
                    "its instance is tagged as having {} slots handed out, and the store has none",
                    shown(held)
                ))
            }
            _ => None,
        }
    }

    /// What a believed list put in quarantine on provider `p`: kept for
    /// `/v1/providers`, said once when new instances join it, and, for a
    /// store that has not faced the clouds yet, a reason to create nothing
    /// on the provider: a store that is new, emptied or replaced does not
    /// go on there as a new pool beside another store's machines.
    fn settle_quarantine(
        &mut self,
        p: ProviderIx,
        quarantine: BTreeMap<String, Quarantined>,
        adopting: bool,
    ) {
        let rt = &mut self.ix.providers[p.0 as usize];
        let new = quarantine.keys().any(|id| !rt.quarantined.contains_key(id));
        rt.quarantined = quarantine;
        rt.checked |= rt.quarantined.is_empty() || adopting;
        let named: Vec<(String, Quarantined)> = (rt.quarantined.iter())
            .take(QUARANTINE_NAMED)
            .map(|(id, q)| (shown(id), q.clone()))
            .collect();
        let count = rt.quarantined.len();
        if new {
            self.notices.push(Notice::Quarantined {
                provider: p,
                count,
                named: named.clone(),
            });
        }
        let mismatch = !self.identity.confirmed && count > 0 && !adopting;
        let was = self.ix.providers[p.0 as usize].mismatch.is_some();
        if mismatch {
            let listed: Vec<String> = named
                .iter()
                .map(|(id, q)| format!("{id}: {}", q.why))
                .collect();
            let more = count.saturating_sub(named.len());
            let more = if more > 0 {
                format!("; and {more} more")
            } else {
                String::new()
            };
            let why = format!(
                "provider `{}` has {count} live instances of pool `{}` that this store cannot vouch for ({}{more}), and this store has not faced the clouds before: it is new, emptied or replaced, not the store that made them",
                self.config[p].name,
                self.config.pool_id,
                listed.join("; ")
            );
            if !was {
                self.notices.push(Notice::StoreMismatch {
                    provider: p,
                    why: why.clone(),
                });
            }
            self.ix.providers[p.0 as usize].mismatch = Some(why);
        } else if was {
            self.ix.providers[p.0 as usize].mismatch = None;
            self.notices
                .push(Notice::StoreMismatchEnded { provider: p });
        }
        let all_checked = self.ix.providers.iter().all(|rt| rt.checked);
        if all_checked && !self.identity.confirmed {
            self.identity.confirmed = true;
            self.confirm_owed = true;
        }
        if self.ix.providers.iter().all(|rt| rt.listed) {
            self.adopting = false;
        }
    }
}

/// A tag value from a cloud, made safe to show in a line.
fn shown(text: &str) -> String {
    printable(&truncated(text, 80)).into_owned()
}
