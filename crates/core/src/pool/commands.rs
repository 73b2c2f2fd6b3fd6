//! Client and operator commands: what a request must be to be taken
//! ([`servable`]), and submitting, taking in from the store's inbox,
//! cancelling, releasing, setting a node's idle behaviour and deleting it.

use super::*;

/// Whether `new` can ever be served under `config`: what [`Pool::submit`]
/// checks before it takes a request. A process standing by checks with it
/// before it accepts a request into the store's inbox.
pub fn servable(config: &Config, new: &NewRequest) -> Result<(), Refused> {
    if new.wants.is_empty() || new.wants.iter().all(|(_, n)| *n == 0) {
        return Err(Refused::Empty);
    }
    let mut seen = HashSet::new();
    for (label, count) in &new.wants {
        if !seen.insert(*label) {
            return Err(Refused::DuplicateLabel(config[*label].name.clone()));
        }
        if config[*label].retired {
            return Err(Refused::Removed(config[*label].name.clone()));
        }
        let possible = max_possible(config, *label);
        if u64::from(*count) > possible {
            return Err(Refused::TooMany {
                label: config[*label].name.clone(),
                wanted: *count,
                possible,
            });
        }
    }
    if let Some(refused) = super::caps::over_cap_alone(config, new) {
        return Err(refused);
    }
    Ok(())
}

/// How many nodes of `label` the configured limits allow at once at most.
fn max_possible(config: &Config, label: LabelIx) -> u64 {
    match &config[label].kind {
        LabelKind::Machine { offers } => offers
            .iter()
            .map(|o| {
                let l = &config[o.provider].limits;
                let by_instances = l.max_instances.map_or(u64::MAX, u64::from);
                let by_cores = l
                    .max_cores
                    .map_or(u64::MAX, |m| u64::from(m) / u64::from(o.vcpus.max(1)));
                let by_ram = l.max_ram_mib.map_or(u64::MAX, |m| m / o.ram_mib.max(1));
                by_instances.min(by_cores).min(by_ram)
            })
            .fold(0u64, u64::saturating_add),
        &LabelKind::Slots { slots, backing, .. } => {
            max_possible(config, backing).saturating_mul(u64::from(slots))
        }
    }
}

impl Pool {
    /// Takes a request. It is served on the next [`Pool::tick`]. Answers
    /// its id ([`Pool::ask`] says whether it was new).
    pub fn submit(&mut self, now: Time, new: NewRequest) -> Result<RequestId, Refused> {
        self.ask(now, new).map(|s| s.id)
    }

    /// Takes a request, as [`Pool::submit`] does. A request with an
    /// idempotency key is taken under the id its key names ([`keyed_id`]),
    /// as [`Pool::submit_under`] takes one: the request the key made
    /// before, if the pool has it, is the answer (not `fresh`).
    pub fn ask(&mut self, now: Time, new: NewRequest) -> Result<Submitted, Refused> {
        if let Some(key) = &new.key {
            let id = keyed_id(&new.requestor, key);
            let fresh = self.submit_under(now, id, new)?;
            return Ok(Submitted { id, fresh });
        }
        servable(&self.config, &new)?;
        let id = loop {
            let id = RequestId(self.ids.next());
            if !self.requests.contains_key(&id) {
                break id;
            }
        };
        self.insert_request(id, now, new);
        Ok(Submitted { id, fresh: true })
    }

    /// Takes a request under `id`, which another process drew for it (or
    /// its idempotency key names): a process standing by relays a request
    /// to the pool's holder with an id, and puts it into the store's inbox
    /// under the same id if the holder does not answer in time. Checked as
    /// [`Pool::submit`] checks. An id the pool already has is that request,
    /// taken already by the other way or by an earlier try: nothing is
    /// taken again, and `Ok(false)` says so (whose it is, is for the
    /// caller to check). A request with a key whose ask differs from the
    /// one its key made is refused ([`Refused::KeyReused`]).
    pub fn submit_under(
        &mut self,
        now: Time,
        id: RequestId,
        new: NewRequest,
    ) -> Result<bool, Refused> {
        if let Some(known) = self.requests.get(&id) {
            if let Some(key) = &new.key
                && !known.asked_as(&new)
            {
                return Err(Refused::KeyReused {
                    key: crate::text::printable(key).into_owned(),
                    request: id,
                });
            }
            return Ok(false);
        }
        servable(&self.config, &new)?;
        self.insert_request(id, now, new);
        Ok(true)
    }

    /// Takes a request that another process accepted and gave `id`
    /// (`created` is when): a process standing by puts a request into the
    /// store's inbox, and the pool's holder takes it in. It is checked as
    /// [`Pool::submit`] checks, against this pool's config, and one that
    /// does not pass (the other process read another config) is taken in
    /// as failed, with the reason. Either way the commit that stores it
    /// removes its inbox entry ([`Changes::taken_in`]). An id the pool
    /// already has is not taken in again: its entry is only removed.
    pub fn take_in(
        &mut self,
        now: Time,
        id: RequestId,
        created: Time,
        new: Result<NewRequest, Refusal>,
    ) -> TakenIn {
        self.taken_in.push(id);
        if self.requests.contains_key(&id) {
            return TakenIn::Known;
        }
        let refusal = match new {
            Ok(new) => match servable(&self.config, &new) {
                Ok(()) => {
                    self.insert_request(id, created, new);
                    return TakenIn::Pending;
                }
                Err(why) => Refusal {
                    requestor: new.requestor,
                    priority: new.priority,
                    reason: why.to_string(),
                },
            },
            Err(refusal) => refusal,
        };
        let reason = format!(
            "refused by the process holding the pool: {}",
            refusal.reason
        );
        let new = NewRequest {
            requestor: refusal.requestor,
            priority: refusal.priority,
            ..NewRequest::default()
        };
        self.insert_request(id, created, new);
        self.finish_request(
            id,
            RequestState::Failed {
                at: now,
                reason: reason.clone(),
            },
            now,
        );
        TakenIn::Failed(reason)
    }

    fn insert_request(&mut self, id: RequestId, created: Time, new: NewRequest) {
        let req = Request {
            id,
            requestor: new.requestor,
            priority: new.priority,
            created,
            wants: new.wants.into_iter().filter(|(_, n)| *n > 0).collect(),
            state: RequestState::Pending,
            nodes: Vec::new(),
            failures: 0,
            last_failure: None,
            key: new.key,
            metadata: new.metadata,
        };
        self.pending.insert((req.priority, req.created, id));
        self.requests.insert(id, req);
        self.dirty_requests.insert(id);
    }

    /// Withdraws a pending request; the nodes set aside for it go back to
    /// the pool.
    pub fn cancel(&mut self, now: Time, id: RequestId) -> Result<(), Conflict> {
        let req = self.requests.get(&id).ok_or(Conflict::NoSuchRequest)?;
        if req.state != RequestState::Pending {
            return Err(Conflict::NotPending(req.state.name()));
        }
        self.finish_request(id, RequestState::Cancelled { at: now }, now);
        Ok(())
    }

    /// A client gives a node back.
    pub fn release(&mut self, now: Time, id: NodeId) -> Result<(), Conflict> {
        let node = self.nodes.get(&id).ok_or(Conflict::NoSuchNode)?;
        if !matches!(node.state, NodeState::InUse { .. }) {
            return Err(Conflict::NotInUse(node.state.name()));
        }
        self.update(id, |n| n.state = NodeState::Used { since: now });
        self.settle_used(id, now);
        Ok(())
    }

    /// Sets a node's idle behaviour (and its tag). A node of a label
    /// removed from the config runs no more: `run` drains it.
    pub fn set_idle(&mut self, now: Time, id: NodeId, idle: Idle) -> Result<(), Conflict> {
        let node = self.nodes.get(&id).ok_or(Conflict::NoSuchNode)?;
        if node.state.is_final() {
            return Err(Conflict::AlreadyFinal(node.state.name()));
        }
        let idle = match idle {
            Idle::Run if self.runs_no_more(node) => Idle::Drain,
            idle => idle,
        };
        if node.idle == idle {
            return Ok(());
        }
        // Its tag follows (`update`).
        self.update(id, |n| n.idle = idle);
        let state = self.nodes[&id].state.clone();
        let plain = self.nodes[&id].packing == Packing::Plain;
        match (idle, state) {
            // A backing node goes once its slots are free (below).
            (Idle::Drain, NodeState::Ready { .. })
                if plain && self.nodes[&id].assigned.is_none() =>
            {
                self.begin_delete(id, DeleteReason::Drained, now)
            }
            (Idle::Drain | Idle::Run, NodeState::Used { .. }) => self.settle_used(id, now),
            (Idle::Run, NodeState::Ready { since }) => {
                self.ready_timers(id, since);
                self.check_backing_idle(id, now);
            }
            (Idle::Drain, _) if matches!(self.nodes[&id].packing, Packing::Backing { .. }) => {
                self.check_backing_idle(id, now)
            }
            _ => {}
        }
        Ok(())
    }

    /// Whether `node` is to go once idle, whatever its idle behaviour:
    /// it serves a label removed from the config (a plain node's own
    /// label, a backing node's slot label), or its instance is on a
    /// provider removed from the config.
    pub(super) fn runs_no_more(&self, node: &Node) -> bool {
        let label = match &node.packing {
            Packing::Plain => self.config[node.label].retired,
            Packing::Backing { slot_label, .. } => self.config[*slot_label].retired,
            Packing::Slot { .. } => return false,
        };
        label || self.config[node.provider].retired
    }

    /// An operator deletes a node, whatever it is doing.
    pub fn delete(&mut self, now: Time, id: NodeId) -> Result<(), Conflict> {
        let node = self.nodes.get(&id).ok_or(Conflict::NoSuchNode)?;
        if node.state.is_final() || matches!(node.state, NodeState::Deleting { .. }) {
            return Err(Conflict::AlreadyFinal(node.state.name()));
        }
        self.begin_delete(id, DeleteReason::Admin, now);
        Ok(())
    }
}
