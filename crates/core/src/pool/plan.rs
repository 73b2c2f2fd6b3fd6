//! Serving requests: each pending one in priority order, whole or not at
//! all (ready nodes oldest first, then launching ones, then new launches),
//! room made by evicting unused ready nodes, and nodes handed out once all
//! are ready.

use std::collections::HashSet;

use super::choice::Tally;
use super::*;
use crate::config::Offer;

/// One step of serving a request, worked out before anything is changed so
/// that a request is either served whole or left as it was.
pub(super) enum Step {
    /// Set aside a free node (ready or launching).
    Take(NodeId),
    /// Launch a plain node from the label's offer at this index.
    Launch(LabelIx, usize),
    /// Put a new slot node in a free slot of a backing node.
    Slot { backing: NodeId, index: u16 },
    /// Launch a backing node for `slot_label` and fill `fill` of its slots.
    Backing {
        slot_label: LabelIx,
        offer: usize,
        fill: u16,
    },
}

/// How many blocked requests one plan checks for room eviction could make.
const EVICTION_CHECKS: u32 = 4;

/// Room a plan keeps for a request that waited past `reserve-after` and
/// could not be served: what its launches still to come would take, per
/// provider. Requests behind it in the serving order count it as taken.
/// Nothing is set aside for it: what is kept is worked out again at each
/// plan, so two requests that keep room never hold what the other waits
/// for, and the first of them in the serving order is served first.
#[derive(Clone, Debug)]
pub(super) struct Kept {
    /// The request's place in the serving order (priority, created, id).
    pub(super) place: (i32, Time, RequestId),
    pub(super) room: Vec<Usage>,
    /// The free nodes and slots of its labels it would take.
    pub(super) nodes: Vec<NodeId>,
    pub(super) slots: Vec<(NodeId, u16)>,
}

impl Pool {
    pub(super) fn plan(&mut self, now: Time) {
        let order: Vec<(i32, Time, RequestId)> = self.pending.iter().copied().collect();
        // Providers a request waits for room on: closed to prewarming.
        let mut wanted = self.tally();
        // Each eviction check scans the free ready nodes: only the first few
        // blocked requests (in serving order) get one per plan.
        let mut evictions = EVICTION_CHECKS;
        self.kept.clear();
        let mut held = self.held(None);
        for place in order {
            self.serve(place, &mut wanted, &mut evictions, &mut held, now);
        }
        for i in 0..self.config.labels.len() {
            self.prewarm(LabelIx(i as u16), &wanted, now);
        }
    }

    /// Serves one pending request as far as it can be served now: all of its
    /// missing nodes are set aside or launched, or none is. A request held
    /// back only by limits that unused ready nodes of other labels take up
    /// has those nodes deleted to make room (see [`Pool::evict_for`]).
    ///
    /// The room kept for requests ahead that waited past `reserve-after`
    /// counts as taken ([`Pool::kept_ahead`]); one that has waited so long
    /// itself and cannot be served keeps what it needs
    /// ([`Pool::keep_for`]).
    ///
    /// A request its nodes would take over a cap ([`Pool::over_cap`])
    /// waits, and holds nothing back: no eviction, no room kept, no
    /// provider closed to prewarming.
    fn serve(
        &mut self,
        place: (i32, Time, RequestId),
        wanted: &mut Tally,
        evictions: &mut u32,
        held: &mut Option<caps::Held>,
        now: Time,
    ) {
        let id = place.2;
        let Some(req) = self.requests.get(&id) else {
            return;
        };
        let capped = (held.as_ref()).is_some_and(|held| self.over_cap(req, held).is_some());
        if !capped {
            let mut tally = self.kept_ahead(place);
            match self.steps(req, &mut tally, now) {
                Ok(steps) => {
                    let took_ready = self.ready_labels_taken(&steps);
                    for step in steps {
                        self.apply(id, step, now);
                    }
                    self.burst_after(&took_ready);
                    self.fulfil_if_ready(id, now);
                }
                Err(_) => {
                    // Prewarming stays off every provider the request could
                    // use, or min-ready nodes would take the room each time
                    // it frees (or an eviction makes it) and the request
                    // would wait for ever.
                    for &(label, _) in &req.wants {
                        wanted.close(self.offers_of(label));
                    }
                    if *evictions > 0 {
                        *evictions -= 1;
                        self.evict_for(place, now);
                    }
                    if now.since(place.1) >= self.config.timings.reserve_after {
                        self.keep_for(place, now);
                    }
                }
            }
        }
        // What it has set aside now counts against the caps of the
        // requests behind it.
        if let (Some(held), Some(req)) = (held.as_mut(), self.requests.get(&id)) {
            self.count_set_aside(req, held);
        }
    }

    /// The labels whose ready nodes (or slots on ready backing nodes)
    /// `steps` take: `burst-extra` may be owed for them.
    fn ready_labels_taken(&self, steps: &[Step]) -> Vec<LabelIx> {
        let mut labels: Vec<LabelIx> = Vec::new();
        for step in steps {
            let node = match step {
                Step::Take(n) | Step::Slot { backing: n, .. } => self.nodes.get(n),
                _ => None,
            };
            let Some(n) = node.filter(|n| matches!(n.state, NodeState::Ready { .. })) else {
                continue;
            };
            let label = match (step, &n.packing) {
                (Step::Slot { .. }, Packing::Backing { slot_label, .. }) => *slot_label,
                _ => n.label,
            };
            if !labels.contains(&label) {
                labels.push(label);
            }
        }
        labels
    }

    /// A tally with the room kept for the requests ahead of `place` in the
    /// serving order counted as taken.
    pub(super) fn kept_ahead(&self, place: (i32, Time, RequestId)) -> Tally {
        let mut tally = self.tally();
        for kept in self.kept.iter().filter(|k| k.place < place) {
            for (extra, room) in tally.extra.iter_mut().zip(&kept.room) {
                extra.instances += room.instances;
                extra.vcpus += room.vcpus;
                extra.ram_mib += room.ram_mib;
            }
            tally.kept.extend(&kept.nodes);
            tally.kept_slots.extend(&kept.slots);
        }
        tally
    }

    /// The request at `place` has waited past `reserve-after` and cannot be
    /// served whole: for the rest of this plan, the free nodes of its
    /// labels it would take (ready or launching, and free slots) and the
    /// room its launches would take, on the offer each would prefer, are
    /// kept from the requests behind it. Smaller requests behind it then
    /// cannot take what frees up, and it is served once enough has.
    ///
    /// Only if what will free up can serve it: the nodes in use, given
    /// back or being deleted, and those set aside for requests planned
    /// whole (they are handed out, then given back). A request planned in
    /// part (a launch try of it failed) keeps its nodes until it is served;
    /// one that waits for those never keeps room, or the two would wait
    /// for each other for ever.
    fn keep_for(&mut self, place: (i32, Time, RequestId), now: Time) {
        let Some(req) = self.requests.get(&place.2) else {
            return;
        };
        // The other pending requests planned whole: theirs are handed out.
        let whole: HashSet<RequestId> = (self.pending.iter())
            .map(|&(_, _, r)| r)
            .filter(|&r| r != place.2)
            .filter(|r| (self.requests.get(r)).is_some_and(|r| self.still_to_launch(r) == 0))
            .collect();
        let mut freeing = self.kept_ahead(place);
        for n in self.nodes.values() {
            let frees = match n.state {
                NodeState::InUse { .. } | NodeState::Used { .. } | NodeState::Deleting { .. } => {
                    true
                }
                _ => n.assigned.is_some_and(|r| whole.contains(&r)),
            };
            if frees && !n.state.is_final() {
                freeing.credit[usize::from(n.provider.0)].add(n.resources);
            }
        }
        if self.steps(req, &mut freeing, now).is_err() {
            return;
        }
        // What requests ahead keep (`steps` adds to a tally's room, never
        // to what it keeps).
        let ahead = freeing;
        let mut kept = Kept {
            place,
            room: vec![Usage::default(); self.config.providers.len()],
            nodes: Vec::new(),
            slots: Vec::new(),
        };
        for &(label, _) in &req.wants {
            let mut need = self.still_missing(req, label);
            let (machine, per_instance) = match &self.config[label].kind {
                LabelKind::Machine { .. } => {
                    let rt = &self.ix.labels[label.0 as usize];
                    let free = rt.free_ready.iter().map(|&(_, n)| n);
                    for n in free.chain(rt.free_launching.iter().copied()) {
                        if need == 0 {
                            break;
                        }
                        if !ahead.kept.contains(&n) {
                            kept.nodes.push(n);
                            need -= 1;
                        }
                    }
                    (label, 1)
                }
                &LabelKind::Slots { slots, backing, .. } => {
                    for slot in self.free_slot_list(label) {
                        if need == 0 {
                            break;
                        }
                        if !ahead.kept_slots.contains(&slot) {
                            kept.slots.push(slot);
                            need -= 1;
                        }
                    }
                    (backing, u32::from(slots.max(1)))
                }
            };
            if let Some(offer) = self.preferred_offer(machine) {
                for _ in 0..need.div_ceil(per_instance) {
                    kept.room[offer.provider.0 as usize].add(Resources::from(offer));
                }
            }
        }
        self.kept.push(kept);
    }

    /// The offer of `label` a launch would prefer with room everywhere:
    /// the lowest provider priority, then the lowest price, among
    /// providers not retired.
    fn preferred_offer(&self, label: LabelIx) -> Option<&Offer> {
        (self.machine_offers(label).iter())
            .filter(|o| !self.config[o.provider].retired)
            .min_by(|a, b| {
                let pa = self.config[a.provider].priority;
                let pb = self.config[b.provider].priority;
                pa.cmp(&pb).then(a.price.total_cmp(&b.price))
            })
    }

    /// The steps that would serve `req` whole within `tally`, or the label
    /// that has no room. Changes nothing but `tally`.
    pub(super) fn steps(
        &self,
        req: &Request,
        tally: &mut Tally,
        now: Time,
    ) -> Result<Vec<Step>, LabelIx> {
        let mut steps = Vec::new();
        let mut taken_slots: HashSet<(NodeId, u16)> = HashSet::new();
        // Labels with the fewest providers first, so that a label that can
        // go elsewhere does not take the room of one that cannot.
        let mut wants = req.wants.clone();
        wants.sort_by_key(|&(label, _)| self.offers_of(label).len());
        for (label, _) in wants {
            let mut need = self.still_missing(req, label);
            if need == 0 {
                continue;
            }
            match &self.config[label].kind {
                LabelKind::Machine { .. } => {
                    let rt = &self.ix.labels[label.0 as usize];
                    let free = rt.free_ready.iter().map(|&(_, n)| n);
                    let free = free.chain(rt.free_launching.iter().copied());
                    for n in free.filter(|n| !tally.kept.contains(n)) {
                        if need == 0 {
                            break;
                        }
                        steps.push(Step::Take(n));
                        need -= 1;
                    }
                    while need > 0 {
                        let offer = self.pick_offer(label, None, tally, now).ok_or(label)?;
                        tally.add(self.machine_offers(label)[offer].clone());
                        steps.push(Step::Launch(label, offer));
                        need -= 1;
                    }
                }
                &LabelKind::Slots { slots, backing, .. } => {
                    for (b, index) in self.free_slot_list(label) {
                        if need == 0 {
                            break;
                        }
                        if !tally.kept_slots.contains(&(b, index)) && taken_slots.insert((b, index))
                        {
                            steps.push(Step::Slot { backing: b, index });
                            need -= 1;
                        }
                    }
                    while need > 0 {
                        let offer = self.pick_offer(backing, None, tally, now).ok_or(label)?;
                        tally.add(self.machine_offers(backing)[offer].clone());
                        let fill = need.min(u32::from(slots)) as u16;
                        steps.push(Step::Backing {
                            slot_label: label,
                            offer,
                            fill,
                        });
                        need -= u32::from(fill);
                    }
                }
            }
        }
        Ok(steps)
    }

    /// How many nodes of `label` `req` still misses: those it wants less
    /// those it has.
    pub(super) fn still_missing(&self, req: &Request, label: LabelIx) -> u32 {
        let count: u32 = (req.wants.iter())
            .filter(|&&(l, _)| l == label)
            .map(|&(_, n)| n)
            .sum();
        let have = (req.nodes.iter())
            .filter(|n| self.nodes.get(n).is_some_and(|n| n.label == label))
            .count() as u32;
        count.saturating_sub(have)
    }

    /// Makes room for a request that limits hold back, by deleting unused
    /// ready nodes (free, idle `run`, plain) of labels the request does not
    /// want, and ready backing nodes whose slots are all free, of slot labels
    /// it does not want, oldest first; `min-ready` does not protect them, since a ready
    /// node nobody asks for must not keep out a request that waits (prewarm
    /// refills elsewhere, or once the request is served).
    ///
    /// Only if the whole request would then fit: nodes are never deleted for
    /// a request that would still wait. Only as many as the room still
    /// missing once the deletes already under way finish, so a later plan
    /// evicts nothing more for the same request.
    fn evict_for(&mut self, place: (i32, Time, RequestId), now: Time) {
        let Some(req) = self.requests.get(&place.2) else {
            return;
        };
        // Only the labels it wants are spared, and of a machine label only
        // the free ready nodes the request takes (the oldest, as `steps`
        // takes them): the others are room, as another label's are; of a
        // slot label, only the backing nodes whose slots it takes. Not a
        // wanted slot label's backing label either: a slot is never placed
        // on a plain node of it, so its free plain nodes are room the
        // request cannot use otherwise.
        let spared: HashSet<LabelIx> = req.wants.iter().map(|&(label, _)| label).collect();
        // Room kept for requests ahead is not this one's to make, nor
        // are the nodes kept for them to be deleted for it.
        let mut tally = self.kept_ahead(place);
        // Candidates per provider, oldest ready first: the free ready nodes
        // of the other labels, and the ready backing nodes with every slot
        // free of the other slot labels (kept only for those labels'
        // min-ready, and never handed out themselves, not even to a request
        // for their own machine label).
        let mut candidates: Vec<Vec<(Time, NodeId)>> = vec![Vec::new(); self.ix.providers.len()];
        for (i, rt) in self.ix.labels.iter().enumerate() {
            let label = LabelIx(i as u16);
            // A wanted slot label's backing nodes whose free slots the
            // request takes (in packing order, as `steps` takes them) are
            // spared; its backing nodes with every slot free beyond those
            // are room, as another label's are.
            let mut takes_slots_on: HashSet<NodeId> = HashSet::new();
            let kept = match &self.config[label].kind {
                _ if !spared.contains(&label) => 0,
                LabelKind::Machine { .. } => self.still_missing(req, label) as usize,
                LabelKind::Slots { .. } => {
                    let need = self.still_missing(req, label) as usize;
                    takes_slots_on = (self.free_slot_list(label).into_iter())
                        .filter(|slot| !tally.kept_slots.contains(slot))
                        .take(need)
                        .map(|(b, _)| b)
                        .collect();
                    0
                }
            };
            let idle_backings = rt.backings.iter().filter_map(|&b| {
                if takes_slots_on.contains(&b) {
                    return None;
                }
                let node = self.nodes.get(&b)?;
                let NodeState::Ready { since } = node.state else {
                    return None;
                };
                let Packing::Backing { slots, .. } = &node.packing else {
                    return None;
                };
                let kept_slot = (0..slots.len() as u16).any(|i| tally.kept_slots.contains(&(b, i)));
                (node.idle == Idle::Run && slots.iter().all(Option::is_none) && !kept_slot)
                    .then_some((since, b))
            });
            let free = rt.free_ready.iter().copied();
            let free = free.filter(|(_, n)| !tally.kept.contains(n)).skip(kept);
            for (since, n) in free.chain(idle_backings) {
                if let Some(node) = self.nodes.get(&n) {
                    candidates[node.provider.0 as usize].push((since, n));
                }
            }
        }
        if candidates.iter().all(Vec::is_empty) {
            return;
        }
        // Room on its way counts too: nodes being deleted, and the
        // candidates if they were deleted.
        for (p, c) in candidates.iter_mut().enumerate() {
            c.sort();
            tally.credit[p] = self.ix.providers[p].deleting;
            for &(_, n) in c.iter() {
                tally.credit[p].add(self.nodes[&n].resources);
            }
        }
        if self.steps(req, &mut tally, now).is_err() {
            return;
        }
        let mut evict = Vec::new();
        for (p, c) in candidates.iter().enumerate() {
            let limits = &self.config.providers[p].limits;
            let rt = &self.ix.providers[p];
            let extra = tally.extra[p];
            // What the plan needs beyond the limit, less what deletes under
            // way give back.
            let over = |used: u64, add: u64, freeing: u64, limit: Option<u64>| {
                limit.map_or(0, |l| {
                    (used + add).saturating_sub(l).saturating_sub(freeing)
                })
            };
            let mut instances = over(
                rt.usage.instances.into(),
                extra.instances.into(),
                rt.deleting.instances.into(),
                limits.max_instances.map(u64::from),
            );
            let mut vcpus = over(
                rt.usage.vcpus.into(),
                extra.vcpus.into(),
                rt.deleting.vcpus.into(),
                limits.max_cores.map(u64::from),
            );
            let mut ram = over(
                rt.usage.ram_mib,
                extra.ram_mib,
                rt.deleting.ram_mib,
                limits.max_ram_mib,
            );
            for &(_, n) in c {
                if instances == 0 && vcpus == 0 && ram == 0 {
                    break;
                }
                let r = self.nodes[&n].resources;
                instances = instances.saturating_sub(1);
                vcpus = vcpus.saturating_sub(r.vcpus.into());
                ram = ram.saturating_sub(r.ram_mib);
                evict.push(n);
            }
        }
        for n in evict {
            self.begin_delete(n, DeleteReason::Evicted, now);
        }
    }

    fn apply(&mut self, req: RequestId, step: Step, now: Time) {
        let node = match step {
            Step::Take(n) => {
                self.update(n, |n| n.assigned = Some(req));
                n
            }
            Step::Launch(label, offer) => {
                let offer = self.machine_offers(label)[offer].clone();
                self.launch(label, &offer, Packing::Plain, Some(req), now)
            }
            Step::Slot { backing, index } => self.fill_slot(backing, index, req, now),
            Step::Backing {
                slot_label,
                offer,
                fill,
            } => {
                let &LabelKind::Slots { slots, backing, .. } = &self.config[slot_label].kind else {
                    return;
                };
                let offer = self.machine_offers(backing)[offer].clone();
                let packing = Packing::Backing {
                    slot_label,
                    slots: vec![None; usize::from(slots)],
                    free_since: None,
                };
                let b = self.launch(backing, &offer, packing, None, now);
                for index in 0..fill {
                    let n = self.fill_slot(b, index, req, now);
                    self.add_to_request(req, n);
                }
                return;
            }
        };
        self.add_to_request(req, node);
    }

    pub(super) fn add_to_request(&mut self, req: RequestId, node: NodeId) {
        if let Some(r) = self.requests.get_mut(&req) {
            r.nodes.push(node);
            self.dirty_requests.insert(req);
        }
    }

    /// Creates the record of a node to launch; the create follows from it.
    pub(super) fn launch(
        &mut self,
        label: LabelIx,
        offer: &Offer,
        packing: Packing,
        assigned: Option<RequestId>,
        now: Time,
    ) -> NodeId {
        let id = self.fresh_node_id();
        self.insert(Node {
            id,
            label,
            provider: offer.provider,
            instance_type: offer.instance_type.clone(),
            resources: Resources::from(offer),
            price: offer.price,
            instance: None,
            state: NodeState::Creating {
                since: now,
                attempt: 0,
            },
            idle: Idle::Run,
            packing,
            assigned,
            created: now,
            endpoint: None,
            failure: None,
        });
        id
    }

    /// Puts a new slot node for `req` into a free slot of `backing`.
    fn fill_slot(&mut self, backing: NodeId, index: u16, req: RequestId, now: Time) -> NodeId {
        let id = self.fresh_node_id();
        let Some(b) = self.nodes.get(&backing) else {
            return id;
        };
        let Packing::Backing { slot_label, .. } = b.packing else {
            return id;
        };
        let state = match b.state {
            NodeState::Ready { .. } => NodeState::Ready { since: now },
            _ => NodeState::Creating {
                since: now,
                attempt: 0,
            },
        };
        let node = Node {
            id,
            label: slot_label,
            provider: b.provider,
            instance_type: b.instance_type.clone(),
            resources: Resources::default(),
            price: 0.0,
            instance: b.instance.clone(),
            state,
            idle: Idle::Run,
            packing: Packing::Slot { backing, index },
            assigned: Some(req),
            created: now,
            endpoint: b.endpoint.clone(),
            failure: None,
        };
        self.update(backing, |b| {
            if let Packing::Backing {
                slots, free_since, ..
            } = &mut b.packing
            {
                slots[usize::from(index)] = Some(id);
                *free_since = None;
            }
        });
        self.insert(node);
        id
    }

    /// Hands a request its nodes once every one of them is ready.
    pub(super) fn fulfil_if_ready(&mut self, id: RequestId, now: Time) {
        let Some(req) = self.requests.get(&id) else {
            return;
        };
        if req.state != RequestState::Pending {
            return;
        }
        let total: u32 = req.wants.iter().map(|(_, n)| n).sum();
        if req.nodes.len() as u32 != total {
            return;
        }
        let all_ready = req.nodes.iter().all(|n| {
            self.nodes
                .get(n)
                .is_some_and(|n| matches!(n.state, NodeState::Ready { .. }))
        });
        if !all_ready {
            return;
        }
        let nodes = req.nodes.clone();
        for n in nodes {
            self.update(n, |n| {
                n.assigned = None;
                n.state = NodeState::InUse {
                    request: id,
                    since: now,
                };
            });
        }
        if let Some(req) = self.requests.get_mut(&id) {
            self.pending.remove(&(req.priority, req.created, id));
            req.state = RequestState::Fulfilled { at: now };
            self.dirty_requests.insert(id);
            self.timer(now + self.config.timings.history, Timer::PurgeRequest(id));
        }
    }

    /// Ends a pending request (failed or cancelled): its set-aside nodes go
    /// back to the pool, and slots it held are freed.
    pub(super) fn finish_request(&mut self, id: RequestId, state: RequestState, now: Time) {
        let Some(req) = self.requests.get_mut(&id) else {
            return;
        };
        if req.state != RequestState::Pending {
            return;
        }
        self.pending.remove(&(req.priority, req.created, id));
        if let RequestState::Failed { reason, .. } = &state {
            self.notices.push(Notice::RequestFailed {
                request: id,
                reason: reason.clone(),
            });
        }
        req.state = state;
        let nodes = std::mem::take(&mut req.nodes);
        self.dirty_requests.insert(id);
        self.timer(now + self.config.timings.history, Timer::PurgeRequest(id));
        for n in nodes {
            self.update(n, |n| n.assigned = None);
            if matches!(
                self.nodes.get(&n).map(|n| &n.packing),
                Some(Packing::Slot { .. })
            ) {
                self.free_slot_node(n, GoneReason::SlotFreed, now);
            } else if let Some(NodeState::Ready { since }) = self.nodes.get(&n).map(|n| &n.state) {
                let since = *since;
                self.ready_and_free(n, since, now);
            }
        }
    }

    /// Takes a node out of the request it was set aside for; the request
    /// will be served again on the next plan.
    pub(super) fn unassign(&mut self, id: NodeId) {
        let Some(req) = self.nodes.get(&id).and_then(|n| n.assigned) else {
            return;
        };
        self.update(id, |n| n.assigned = None);
        if let Some(r) = self.requests.get_mut(&req) {
            r.nodes.retain(|n| *n != id);
            self.dirty_requests.insert(req);
        }
    }
}
