//! The calls each provider owes, made within its rate limit, its concurrency
//! and any hold a driver asked for; and what their outcomes change.

use std::time::Duration;

use super::*;
use crate::driver::{CapacityScope, DriverError, Instance, InstanceState};

/// Backoff before a failed call is made again after `tries` failures:
/// 1 s doubling to 5 min.
pub(super) fn backoff(tries: u32) -> Duration {
    Duration::from_secs((1u64 << tries.saturating_sub(1).min(9)).min(300))
}

impl Pool {
    /// Appends every call now due, provider by provider: lists first (they
    /// resolve what a restart left open), then deletes, leak deletes,
    /// creates and tag updates.
    pub(super) fn emit(&mut self, now: Time, out: &mut Vec<Effect>) {
        for p in 0..self.ix.providers.len() {
            let pix = ProviderIx(p as u16);
            loop {
                let rt = &self.ix.providers[p];
                if rt.held_until.is_some_and(|t| t > now) || rt.in_flight >= rt.max_in_flight {
                    break;
                }
                let Some(effect) = self.next_call(pix, now) else {
                    break;
                };
                let rt = &mut self.ix.providers[p];
                if let Some(bucket) = &mut rt.bucket
                    && !bucket.try_take(now)
                {
                    // Put it back: the call is owed, just not yet.
                    self.unclaim(&effect);
                    break;
                }
                self.ix.providers[p].in_flight += 1;
                self.ix.providers[p].list_waits = false;
                out.push(Effect::Call(effect));
            }
        }
    }

    /// Claims the next call a provider owes (marking it in flight).
    fn next_call(&mut self, p: ProviderIx, now: Time) -> Option<DriverCall> {
        let rt = &mut self.ix.providers[p.0 as usize];
        // The next page of the list under way, then a new list.
        if let Some(l) = rt.listing.as_mut().filter(|l| !l.asking) {
            l.asking = true;
            return Some(DriverCall::List {
                provider: p,
                cursor: l.cursor.clone(),
            });
        }
        let list_due = !rt.list_busy && rt.next_list <= now;
        if list_due && !rt.list_waits {
            return Some(self.start_list(p, now));
        }
        // Booting instances are looked at by id, and so are instances
        // suspected missing long enough, before their nodes are given up
        // (see `reconcile`).
        let confirm_due = rt.next_get <= now && !rt.to_confirm.is_empty();
        let poll_due = rt.next_boot_poll.is_some_and(|t| t <= now);
        if !rt.get_busy && (confirm_due || poll_due) {
            let rt = &self.ix.providers[p.0 as usize];
            let mut instances: Vec<String> = Vec::new();
            if confirm_due {
                instances.extend(
                    (rt.to_confirm.iter()).filter_map(|id| self.nodes.get(id)?.instance.clone()),
                );
            }
            if poll_due {
                instances.extend(self.booting(p).map(|(_, i)| i.to_owned()));
            }
            instances.sort();
            instances.dedup();
            let rt = &mut self.ix.providers[p.0 as usize];
            if poll_due {
                rt.next_boot_poll = None;
            }
            if confirm_due && instances.is_empty() {
                rt.to_confirm.clear();
            }
            if instances.len() > GET_MAX && poll_due && !rt.list_busy {
                // More than one look by id takes: a list sees them all.
                return Some(self.start_list(p, now));
            }
            if !instances.is_empty() {
                instances.truncate(GET_MAX);
                rt.get_busy = true;
                return Some(DriverCall::Get {
                    provider: p,
                    instances,
                });
            }
        }
        if let Some(call) = self.next_deletes(p, now) {
            return Some(call);
        }
        let rt = &self.ix.providers[p.0 as usize];
        let creates_paused =
            !rt.listed || rt.mismatch.is_some() || rt.quota_paused_until.is_some_and(|t| t > now);
        if !creates_paused && let Some(call) = self.next_creates(p, now) {
            return Some(call);
        }
        // A node with another call in flight (or waiting out a backoff)
        // keeps its place: its tags are owed once that call is done.
        let mut later = Vec::new();
        let mut call = None;
        while let Some(id) = self.ix.providers[p.0 as usize].want_tags.pop_first() {
            let Some(node) = self.nodes.get(&id) else {
                continue;
            };
            // Nothing to tag on an instance that is going away.
            if node.state.is_final() || matches!(node.state, NodeState::Deleting { .. }) {
                continue;
            }
            let Some(instance) = node.instance.clone() else {
                later.push(id);
                continue;
            };
            if self.busy.contains(&id) {
                later.push(id);
                continue;
            }
            let tags = self.node_tags(node);
            self.set_busy(id, true);
            call = Some(DriverCall::SetTags {
                provider: p,
                node: id,
                instance,
                tags,
            });
            break;
        }
        self.ix.providers[p.0 as usize].want_tags.extend(later);
        // Nothing else owed: the list that waited for it goes now.
        if call.is_none() && list_due {
            return Some(self.start_list(p, now));
        }
        call
    }

    /// Starts a list of `p`: its first page.
    fn start_list(&mut self, p: ProviderIx, now: Time) -> DriverCall {
        let rt = &mut self.ix.providers[p.0 as usize];
        rt.list_busy = true;
        rt.lists_started += 1;
        rt.listing = Some(Listing {
            started: now,
            cursor: None,
            asking: true,
            pages: 0,
            instances: Vec::new(),
        });
        DriverCall::List {
            provider: p,
            cursor: None,
        }
    }

    /// The deletes now due on `p`: the nodes' own, then leaks within
    /// their own rate. One call each, or, for a driver that declared
    /// `delete-many`, all of them (up to [`BATCH_MAX`]) in one.
    fn next_deletes(&mut self, p: ProviderIx, now: Time) -> Option<DriverCall> {
        let rt = &self.ix.providers[p.0 as usize];
        let most = if rt.batches.delete { BATCH_MAX } else { 1 };
        let nodes: Vec<NodeId> = rt.want_delete.iter().take(most).copied().collect();
        let mut deletes = Vec::new();
        for id in nodes {
            // Every node owed a delete has an instance (see the index).
            let Some(instance) = self.nodes.get(&id).and_then(|n| n.instance.clone()) else {
                continue;
            };
            self.set_busy(id, true);
            deletes.push(ToDelete {
                node: Some(id),
                instance,
            });
        }
        let rt = &mut self.ix.providers[p.0 as usize];
        while deletes.len() < most {
            let due = |l: &Leak| !l.busy && l.due <= now;
            if !rt.leaks.values().any(due) || !rt.leak_bucket.try_take(now) {
                break;
            }
            let Some((instance, leak)) = rt.leaks.iter_mut().find(|(_, l)| due(l)) else {
                break;
            };
            leak.busy = true;
            deletes.push(ToDelete {
                node: leak.node,
                instance: instance.clone(),
            });
        }
        if deletes.len() > 1 {
            return Some(DriverCall::DeleteMany {
                provider: p,
                deletes,
            });
        }
        let ToDelete { node, instance } = deletes.pop()?;
        Some(DriverCall::Delete {
            provider: p,
            node,
            instance,
        })
    }

    /// The creates now due on `p` (creates not paused): one call each, or,
    /// for a driver that declared `create-many`, all of them (up to
    /// [`BATCH_MAX`]) in one. A create whose outcome is unsure waits for
    /// the list that tells.
    fn next_creates(&mut self, p: ProviderIx, now: Time) -> Option<DriverCall> {
        let rt = &self.ix.providers[p.0 as usize];
        let most = if rt.batches.create { BATCH_MAX } else { 1 };
        let due: Vec<NodeId> = (rt.want_create.iter())
            .filter(|id| !self.unsure.contains_key(id))
            .take(most)
            .copied()
            .collect();
        if due.is_empty() {
            return None;
        }
        let mut creates = Vec::new();
        for id in due {
            match self.nodes.get(&id).and_then(|n| self.create_spec(n)) {
                Some(spec) => {
                    self.set_busy(id, true);
                    creates.push((id, spec));
                }
                // The label no longer has an offer here; nothing to create.
                None => self.failed_try(
                    id,
                    "the label has no offer on this provider".into(),
                    DeleteReason::LaunchFailed,
                    now,
                ),
            }
        }
        if creates.len() > 1 {
            return Some(DriverCall::CreateMany {
                provider: p,
                creates,
            });
        }
        match creates.pop() {
            Some((node, spec)) => Some(DriverCall::Create {
                provider: p,
                node,
                spec,
            }),
            // Those given up may have made room for other calls.
            None => self.next_call(p, now),
        }
    }

    /// What provider `p`'s driver declared it takes many of in one call:
    /// from now on, calls due together go to it in batches.
    pub fn declared(&mut self, p: ProviderIx, batches: Batches) {
        if let Some(rt) = self.ix.providers.get_mut(p.0 as usize) {
            rt.batches = batches;
        }
    }

    /// Returns a claimed call to the owed set.
    fn unclaim(&mut self, call: &DriverCall) {
        match call {
            DriverCall::List { provider, cursor } => {
                let rt = &mut self.ix.providers[provider.0 as usize];
                match (cursor, rt.listing.as_mut()) {
                    // A later page is owed again.
                    (Some(_), Some(l)) => l.asking = false,
                    _ => {
                        rt.list_busy = false;
                        rt.listing = None;
                    }
                }
            }
            DriverCall::Get { provider, .. } => {
                self.ix.providers[provider.0 as usize].get_busy = false
            }
            DriverCall::Delete {
                provider,
                node,
                instance,
            } => match node {
                Some(id) if self.busy.contains(id) => self.set_busy(*id, false),
                _ => {
                    if let Some(leak) = self.ix.providers[provider.0 as usize]
                        .leaks
                        .get_mut(instance)
                    {
                        leak.busy = false;
                    }
                }
            },
            DriverCall::DeleteMany { provider, deletes } => {
                for ToDelete { node, instance } in deletes {
                    self.unclaim(&DriverCall::Delete {
                        provider: *provider,
                        node: *node,
                        instance: instance.clone(),
                    });
                }
            }
            DriverCall::Create { node, .. } => self.set_busy(*node, false),
            DriverCall::CreateMany { creates, .. } => {
                for (node, _) in creates {
                    self.set_busy(*node, false);
                }
            }
            DriverCall::SetTags { provider, node, .. } => {
                self.set_busy(*node, false);
                self.ix.providers[provider.0 as usize]
                    .want_tags
                    .insert(*node);
            }
        }
    }

    /// A call to `p` finished; `Some(retry_after)` if the driver said
    /// rate-limited, which holds every call to `p` until then.
    pub(super) fn call_done(
        &mut self,
        p: ProviderIx,
        failure: Option<&Failure>,
        now: Time,
    ) -> bool {
        let rt = &mut self.ix.providers[p.0 as usize];
        rt.in_flight = rt.in_flight.saturating_sub(1);
        if let Some(Failure::Driver(DriverError::RateLimited { retry_after, .. })) = failure {
            let until = now + (*retry_after).max(Duration::from_millis(1));
            if rt.held_until.is_none_or(|t| t < until) {
                rt.held_until = Some(until);
                // Lists go first (`next_call`): a list due when the hold
                // lifts would take a cloud's last call again, and the call
                // refused here could be refused every time. So another call
                // goes first, then a new list (a list under way goes on at
                // once: its pages are owed).
                if rt.listing.is_none() {
                    rt.list_waits = true;
                }
                self.notices
                    .push(Notice::RateLimited { provider: p, until });
            }
            return true;
        }
        false
    }

    /// A call for a node failed in a way worth another try later.
    fn retry_later(&mut self, id: NodeId, now: Time) {
        let tries = self.tries.entry(id).or_insert(0);
        *tries += 1;
        let wait = backoff(*tries);
        self.set_busy(id, true);
        self.timer(now + wait, Timer::Retry(id));
    }

    /// The outcome of an [`DriverCall::Create`].
    pub fn created(&mut self, now: Time, id: NodeId, result: Result<Instance, Failure>) {
        let Some(node) = self.nodes.get(&id) else {
            return;
        };
        let rate_limited = self.call_done(node.provider, result.as_ref().err(), now);
        self.create_done(now, id, result, rate_limited);
    }

    /// The outcome of a [`DriverCall::CreateMany`] to provider `p`: one
    /// answer per node. A call that failed as a whole gives each node its
    /// failure.
    pub fn created_many(
        &mut self,
        now: Time,
        p: ProviderIx,
        results: Vec<(NodeId, Result<Instance, Failure>)>,
    ) {
        let limited = results.iter().find_map(|(_, r)| rate_limit(r));
        let rate_limited = self.call_done(p, limited, now);
        for (id, result) in results {
            self.create_done(now, id, result, rate_limited);
        }
    }

    /// What a create's answer changes, once its call is counted done.
    fn create_done(
        &mut self,
        now: Time,
        id: NodeId,
        result: Result<Instance, Failure>,
        rate_limited: bool,
    ) {
        let Some(node) = self.nodes.get(&id) else {
            return;
        };
        let p = node.provider;
        self.set_busy(id, false);
        let Some(node) = self.nodes.get(&id) else {
            return;
        };
        let state = node.state.clone();
        // A create cannot have made an instance another node holds, nor one
        // a list showed under other tags (a leak, or one in quarantine): the
        // answer is wrong, and believing it would put one machine under two
        // owners, or hand out one nobody vouches for.
        let wrong = result.as_ref().ok().and_then(|inst| {
            if let Some(other) = self.holder(p, &inst.id).filter(|&other| other != id) {
                Some(format!("instance {}, which node {other} holds", inst.id))
            } else if self.ix.providers[p.0 as usize].leaks.contains_key(&inst.id) {
                Some(format!(
                    "instance {}, which a list showed under other tags",
                    inst.id
                ))
            } else if let Some(other) = inst.tags.get(NODE_TAG)
                && *other != id.to_string()
            {
                Some(format!(
                    "instance {}, which is tagged as node {}",
                    inst.id,
                    crate::text::printable(&crate::text::truncated(other, 40))
                ))
            } else if (self.ix.providers[p.0 as usize].quarantined).contains_key(&inst.id) {
                Some(format!(
                    "instance {}, which a list showed in quarantine",
                    inst.id
                ))
            } else {
                None
            }
        });
        let result = match (result, wrong) {
            (Ok(_), Some(what)) => Err(Failure::host(
                HostFailureKind::BadAnswer,
                format!("the driver answered this create with {what}"),
            )),
            (result, _) => result,
        };
        match result {
            Ok(inst) => {
                // Tags changed while the create was in flight (an idle
                // behaviour set) are owed to the instance.
                if !state.is_final() && self.tags_differ(node, &inst) {
                    self.ix.providers[p.0 as usize].want_tags.insert(id);
                }
                self.tagged_at.insert(id, now);
                self.attach(id, &inst, now);
                if let NodeState::Creating { since, .. } = state {
                    match inst.state {
                        InstanceState::Running => self.running(id, now),
                        InstanceState::Pending | InstanceState::Unknown => {
                            self.set_booting(id, since, now)
                        }
                        InstanceState::Stopping | InstanceState::Terminated => self.failed_try(
                            id,
                            "the instance stopped right after its create".into(),
                            DeleteReason::LaunchFailed,
                            now,
                        ),
                        InstanceState::Failed => self.instance_failed(id, &inst, now),
                    }
                }
                // A node deleted while its create was in flight now has an
                // instance to delete: it is owed a delete by the index.
            }
            Err(_) if matches!(state, NodeState::Deleting { .. }) => {
                // Nobody wants it any more and it was not created (or, after
                // a trap, a list finds it as a leak).
                self.gone(id, GoneReason::Aborted, now);
            }
            Err(_) if rate_limited => {}
            Err(
                Failure::Unknown(why)
                | Failure::Host(HostFailure {
                    kind: HostFailureKind::BadAnswer,
                    message: why,
                }),
            ) if matches!(state, NodeState::Creating { .. }) => {
                // It may exist (its answer was lost, or refused: a driver
                // whose answer cannot be believed may still have made it):
                // a list that starts from now on tells, and decides whether
                // it is tried again (`Pool::listed`).
                let rt = &mut self.ix.providers[p.0 as usize];
                self.unsure.insert(id, (rt.lists_started + 1, why));
                rt.next_list = rt.next_list.min(now);
            }
            Err(failure) => {
                let NodeState::Creating { .. } = state else {
                    return;
                };
                match &failure {
                    Failure::Driver(DriverError::QuotaExceeded(_)) => {
                        let until = now + self.config.timings.quota_pause;
                        self.ix.providers[p.0 as usize].quota_paused_until = Some(until);
                        self.notices
                            .push(Notice::QuotaPaused { provider: p, until });
                        self.abort_waiting_creates(p, None, now);
                        self.abort(id, now);
                    }
                    Failure::Driver(DriverError::Capacity { scope, .. }) => {
                        let until = now + self.config.timings.capacity_pause;
                        let ty = match scope {
                            CapacityScope::InstanceType(t) => Some(t.clone()),
                            CapacityScope::General => None,
                        };
                        let rt = &mut self.ix.providers[p.0 as usize];
                        rt.capacity_paused.push((ty.clone(), until));
                        self.notices.push(Notice::CapacityPaused {
                            provider: p,
                            instance_type: ty.clone(),
                            until,
                        });
                        self.abort_waiting_creates(p, Some(ty), now);
                        self.abort(id, now);
                    }
                    other => {
                        let why = format!("create: {other}");
                        self.failed_try(id, why, DeleteReason::LaunchFailed, now);
                    }
                }
            }
        }
    }

    /// A node's instance exists and is not running yet: the provider is
    /// listed soon, then at growing gaps ([`boot_poll_after`]) until it runs.
    pub(super) fn set_booting(&mut self, id: NodeId, since: Time, now: Time) {
        self.update(id, |n| n.state = NodeState::Booting { since });
        if let Some(node) = self.nodes.get(&id) {
            let t = since + self.config[node.label].boot_timeout;
            let cap = self.config.timings.boot_poll_interval;
            let at = boot_poll_after(self.boot_seen(id, now), now, cap);
            let rt = &mut self.ix.providers[node.provider.0 as usize];
            rt.next_boot_poll = Some(rt.next_boot_poll.map_or(at, |t| t.min(at)));
            self.timer(t, Timer::BootTimeout(id));
        }
    }

    /// When this process learned that node `id`'s instance exists (its
    /// create's answer, or the list that found it), else `now`: what its
    /// boot polls are timed from. A cloud's boot starts before its create
    /// answers, so the first list 100 ms after the answer finds a boot of
    /// 100 ms done.
    /// The provider's nodes whose instance exists and does not run yet
    /// (and that no readiness probe watches), with their instance ids.
    pub(super) fn booting(&self, p: ProviderIx) -> impl Iterator<Item = (NodeId, &str)> {
        (self.ix.providers[p.0 as usize].with_instance.iter())
            .filter(|id| !self.is_probed(**id))
            .filter_map(|id| {
                let n = self.nodes.get(id)?;
                match n.state {
                    NodeState::Booting { .. } | NodeState::Creating { .. } => {
                        Some((*id, n.instance.as_deref()?))
                    }
                    _ => None,
                }
            })
    }

    /// When the provider's booting nodes are next worth a look: the first
    /// of them by [`boot_poll_after`]; `None` when none boots.
    pub(super) fn next_boot_poll(&self, p: ProviderIx, now: Time) -> Option<Time> {
        let cap = self.config.timings.boot_poll_interval;
        self.booting(p)
            .map(|(id, _)| boot_poll_after(self.boot_seen(id, now), now, cap))
            .min()
    }

    pub(super) fn boot_seen(&self, id: NodeId, now: Time) -> Time {
        self.attached_at.get(&id).copied().unwrap_or(now)
    }

    /// Records what the cloud says about a node's instance.
    pub(super) fn attach(&mut self, id: NodeId, inst: &Instance, now: Time) {
        // Compared in place: a list of many unchanged instances must not
        // allocate a copy of each one's endpoint.
        if self.endpoint_changed(id, inst) {
            self.update(id, |n| {
                n.instance = Some(inst.id.clone());
                let mut connection = inst.connection.clone();
                // Host keys a probe found stay while the cloud reports none.
                if connection.host_keys.is_empty()
                    && let Some(e) = &n.endpoint
                {
                    connection.host_keys = e.connection.host_keys.clone();
                }
                n.endpoint = Some(Box::new(Endpoint {
                    addresses: inst.addresses.clone(),
                    connection,
                }));
            });
            self.attached_at.entry(id).or_insert(now);
        }
    }

    /// Gives up a launch that has no instance: not a failed try. The request
    /// it was set aside for is served again, elsewhere if possible.
    fn abort(&mut self, id: NodeId, now: Time) {
        let packing = self.nodes.get(&id).map(|n| n.packing.clone());
        if let Some(Packing::Backing { .. }) = packing {
            let slots: Vec<NodeId> = self.slot_nodes_of(id);
            for s in slots {
                self.free_slot_node(s, GoneReason::BackingLost, now);
            }
        }
        self.gone(id, GoneReason::Aborted, now);
    }

    fn slot_nodes_of(&self, backing: NodeId) -> Vec<NodeId> {
        match self.nodes.get(&backing).map(|n| &n.packing) {
            Some(Packing::Backing { slots, .. }) => slots.iter().flatten().copied().collect(),
            _ => Vec::new(),
        }
    }

    /// After quota or capacity errors, creates still waiting on the same
    /// provider (and instance type) would fail the same way: give them up so
    /// their requests can go elsewhere.
    fn abort_waiting_creates(&mut self, p: ProviderIx, ty: Option<Option<String>>, now: Time) {
        let waiting: Vec<NodeId> = self.ix.providers[p.0 as usize]
            .want_create
            .iter()
            .copied()
            .filter(|id| match (&ty, self.nodes.get(id)) {
                (None, _) | (Some(None), _) => true,
                (Some(Some(t)), Some(n)) => n.instance_type == *t,
                (Some(Some(_)), None) => false,
            })
            .collect();
        for id in waiting {
            self.abort(id, now);
        }
    }

    /// The outcome of an [`DriverCall::Delete`]. `Ok` includes "already gone".
    pub fn deleted(
        &mut self,
        now: Time,
        p: ProviderIx,
        node: Option<NodeId>,
        instance: &str,
        result: Result<(), Failure>,
    ) {
        let rate_limited = self.call_done(p, result.as_ref().err(), now);
        self.delete_done(now, p, node, instance, result, rate_limited);
    }

    /// The outcome of a [`DriverCall::DeleteMany`] to provider `p`: one
    /// answer per instance. `Ok` includes "already gone".
    pub fn deleted_many(
        &mut self,
        now: Time,
        p: ProviderIx,
        results: Vec<(ToDelete, Result<(), Failure>)>,
    ) {
        let limited = results.iter().find_map(|(_, r)| rate_limit(r));
        let rate_limited = self.call_done(p, limited, now);
        for (ToDelete { node, instance }, result) in results {
            self.delete_done(now, p, node, &instance, result, rate_limited);
        }
    }

    /// What a delete's answer changes, once its call is counted done.
    fn delete_done(
        &mut self,
        now: Time,
        p: ProviderIx,
        node: Option<NodeId>,
        instance: &str,
        result: Result<(), Failure>,
        rate_limited: bool,
    ) {
        // A node's own delete has the node busy; a leak delete (which may
        // name a node long gone) does not. The instance id alone cannot
        // tell them apart.
        let node_delete = node.is_some_and(|id| self.busy.contains(&id));
        let rt = &mut self.ix.providers[p.0 as usize];
        if !node_delete && let Some(leak) = rt.leaks.get_mut(instance) {
            leak.busy = false;
            match &result {
                Ok(()) => {
                    rt.leaks.remove(instance);
                    if node.is_none() {
                        rt.leaks_deleted += 1;
                        self.notices.push(Notice::LeakDeleted {
                            provider: p,
                            instance: instance.to_owned(),
                        });
                    }
                    rt.quota_paused_until = None;
                }
                Err(_) => {
                    // Tried again once a later list still shows it.
                    leak.due = now + self.config.timings.delete_retry;
                }
            }
            return;
        }
        let Some(id) = node else {
            return;
        };
        self.set_busy(id, false);
        let Some(n) = self.nodes.get(&id) else {
            return;
        };
        if !matches!(n.state, NodeState::Deleting { .. }) {
            return;
        }
        match result {
            Ok(()) | Err(Failure::Driver(DriverError::NotFound(_))) => {
                self.tries.remove(&id);
                self.gone(id, GoneReason::Deleted, now)
            }
            Err(_) if rate_limited => {}
            Err(_) => self.retry_later(id, now),
        }
    }

    /// The outcome of an [`DriverCall::SetTags`].
    pub fn tagged(&mut self, now: Time, id: NodeId, result: Result<(), Failure>) {
        let Some(node) = self.nodes.get(&id) else {
            return;
        };
        let p = node.provider;
        let rate_limited = self.call_done(p, result.as_ref().err(), now);
        self.set_busy(id, false);
        match result {
            Ok(()) => {
                self.tries.remove(&id);
                self.tagged_at.insert(id, now);
            }
            Err(Failure::Driver(DriverError::NotFound(_))) => {
                self.tries.remove(&id);
            }
            Err(_) => {
                self.ix.providers[p.0 as usize].want_tags.insert(id);
                if !rate_limited {
                    self.retry_later(id, now);
                }
            }
        }
    }
}

/// The rate limit among a batch's answers, if one said so: it holds the
/// provider's calls as the whole call's would.
fn rate_limit<T>(result: &Result<T, Failure>) -> Option<&Failure> {
    result
        .as_ref()
        .err()
        .filter(|f| matches!(f, Failure::Driver(DriverError::RateLimited { .. })))
}

/// The first gap after which a booting node is looked at.
pub(super) const FIRST_BOOT_POLL: Duration = Duration::from_millis(100);

/// When a node seen booting at `since` is next worth a list, after `now`:
/// [`FIRST_BOOT_POLL`] after `since`, then at gaps that double, up to `cap`
/// (`boot-poll-interval`) and then `cap` apart. A boot of 100 ms is seen at
/// once; one of 40 s costs about a dozen lists, not 400; and one list
/// serves every node of its provider.
pub(super) fn boot_poll_after(since: Time, now: Time, cap: Duration) -> Time {
    let cap = cap.max(Duration::from_millis(1));
    let mut gap = FIRST_BOOT_POLL.min(cap);
    let mut at = since + gap;
    while at <= now && gap < cap {
        gap = (gap * 2).min(cap);
        at = at + gap;
    }
    if at <= now {
        // Every `cap` from `at` on: the first such point after `now`.
        let cap_ms = cap.as_millis().max(1) as u64;
        let steps = now.as_millis().saturating_sub(at.as_millis()) / cap_ms + 1;
        at = Time::from_millis(at.as_millis() + steps * cap_ms);
    }
    at
}
