//! Node events: what happens to a node when it is returned, becomes ready,
//! is deleted, gone or lost, or a launch try fails (tried again, elsewhere,
//! or given up with its requests); slots freed, a backing node's grace time.

use super::prewarm::prewarm_label;
use super::*;

impl Pool {
    /// A returned node: reused, deleted, freed or held, by its label and
    /// idle behaviour.
    pub(super) fn settle_used(&mut self, id: NodeId, now: Time) {
        let Some(node) = self.nodes.get(&id) else {
            return;
        };
        if !matches!(node.state, NodeState::Used { .. }) {
            return;
        }
        if matches!(node.packing, Packing::Slot { .. }) {
            self.free_slot_node(id, GoneReason::SlotFreed, now);
            return;
        }
        let lost = self.ix.providers[node.provider.0 as usize]
            .missing
            .get(&id)
            .is_some_and(|m| m.confirmed);
        match node.idle {
            // Its instance is gone: nothing to keep or reuse.
            _ if lost => self.begin_delete(id, DeleteReason::Released, now),
            Idle::Hold => {}
            Idle::Drain => self.begin_delete(id, DeleteReason::Drained, now),
            Idle::Run if self.config[node.label].reuse => self.set_ready(id, now),
            Idle::Run => self.begin_delete(id, DeleteReason::Released, now),
        }
    }

    /// A node is running and free (or set aside): ready.
    pub(super) fn set_ready(&mut self, id: NodeId, now: Time) {
        self.update(id, |n| n.state = NodeState::Ready { since: now });
        let Some(node) = self.nodes.get(&id) else {
            return;
        };
        // A launch came through: prewarming this label backs off no more.
        if let Some(label) = prewarm_label(node) {
            self.ix.labels[label.0 as usize].failures = 0;
        }
        if let Packing::Backing { slots, .. } = &node.packing {
            let waiting: Vec<NodeId> = slots.iter().flatten().copied().collect();
            let (instance, endpoint) = (node.instance.clone(), node.endpoint.clone());
            for s in waiting {
                if matches!(
                    self.nodes.get(&s).map(|n| &n.state),
                    Some(NodeState::Creating { .. })
                ) {
                    // Slots filled while the backing instance was launching
                    // learn its address now.
                    self.update(s, |n| {
                        n.state = NodeState::Ready { since: now };
                        n.instance = instance.clone();
                        n.endpoint = endpoint.clone();
                    });
                }
            }
            self.check_backing_idle(id, now);
            let reqs: Vec<RequestId> = self
                .slot_nodes(id)
                .filter_map(|s| self.nodes.get(&s).and_then(|n| n.assigned))
                .collect();
            for r in reqs {
                self.fulfil_if_ready(r, now);
            }
        } else if let Some(r) = node.assigned {
            self.fulfil_if_ready(r, now);
        } else {
            self.ready_and_free(id, now, now);
        }
    }

    /// A plain node ready and set aside for nobody: deleted if it is to be
    /// drained, else its ready timers run.
    pub(super) fn ready_and_free(&mut self, id: NodeId, since: Time, now: Time) {
        let drain = self
            .nodes
            .get(&id)
            .is_some_and(|n| n.idle == Idle::Drain && n.packing == Packing::Plain);
        if drain {
            self.begin_delete(id, DeleteReason::Drained, now);
        } else {
            self.ready_timers(id, since);
        }
    }

    fn slot_nodes(&self, backing: NodeId) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes
            .get(&backing)
            .and_then(|n| match &n.packing {
                Packing::Backing { slots, .. } => Some(slots.iter().flatten().copied()),
                _ => None,
            })
            .into_iter()
            .flatten()
    }

    /// Timers of a node that just became (or is again) ready and free.
    pub(super) fn ready_timers(&mut self, id: NodeId, since: Time) {
        let Some(node) = self.nodes.get(&id) else {
            return;
        };
        if node.packing != Packing::Plain {
            return;
        }
        let label = &self.config[node.label];
        let (age, idle) = (label.max_ready_age, label.idle_timeout);
        if let Some(age) = age {
            self.timer(since + age, Timer::ReadyAge(id));
        }
        if let Some(idle) = idle {
            self.timer(since + idle, Timer::IdleTimeout(id));
        }
    }

    /// A backing node with every slot free starts its grace time.
    pub(super) fn check_backing_idle(&mut self, id: NodeId, now: Time) {
        let Some(node) = self.nodes.get(&id) else {
            return;
        };
        let Packing::Backing {
            slot_label,
            slots,
            free_since,
        } = &node.packing
        else {
            return;
        };
        if slots.iter().any(Option::is_some) || !matches!(node.state, NodeState::Ready { .. }) {
            return;
        }
        let (slot_label, free_since) = (*slot_label, *free_since);
        if node.idle == Idle::Drain {
            self.begin_delete(id, DeleteReason::Drained, now);
            return;
        }
        let since = match free_since {
            Some(t) => t,
            None => {
                self.update(id, |n| {
                    if let Packing::Backing { free_since, .. } = &mut n.packing {
                        *free_since = Some(now);
                    }
                });
                now
            }
        };
        if let LabelKind::Slots { grace_time, .. } = self.config[slot_label].kind {
            self.timer(since + grace_time, Timer::SlotGrace(id));
        }
    }

    /// Ends a slot node and frees its slot.
    pub(super) fn free_slot_node(&mut self, id: NodeId, reason: GoneReason, now: Time) {
        let Some(node) = self.nodes.get(&id) else {
            return;
        };
        let Packing::Slot { backing, index } = node.packing else {
            return;
        };
        self.unassign(id);
        self.update(id, |n| n.state = NodeState::Gone { since: now, reason });
        self.timer(now + self.config.timings.history, Timer::PurgeNode(id));
        let held = self.nodes.get(&backing).is_some_and(|b| match &b.packing {
            Packing::Backing { slots, .. } => slots.get(usize::from(index)) == Some(&Some(id)),
            _ => false,
        });
        if held {
            self.update(backing, |b| {
                if let Packing::Backing { slots, .. } = &mut b.packing {
                    slots[usize::from(index)] = None;
                }
            });
            self.check_backing_idle(backing, now);
        }
    }

    /// Starts deleting a node (and, for a backing node, ends its slots).
    pub(super) fn begin_delete(&mut self, id: NodeId, reason: DeleteReason, now: Time) {
        let Some(node) = self.nodes.get(&id) else {
            return;
        };
        if node.state.is_final() || matches!(node.state, NodeState::Deleting { .. }) {
            return;
        }
        if matches!(node.packing, Packing::Slot { .. }) {
            self.free_slot_node(id, GoneReason::SlotFreed, now);
            return;
        }
        let provider = node.provider;
        let slot_nodes: Vec<NodeId> = self.slot_nodes(id).collect();
        for s in slot_nodes {
            self.free_slot_node(s, GoneReason::BackingLost, now);
        }
        self.unassign(id);
        let listed = self.ix.providers[provider.0 as usize].listed;
        let node = &self.nodes[&id];
        let in_flight = self.busy.contains(&id) && !self.create_waits.contains(&id);
        if node.instance.is_none() && !in_flight && listed {
            // No create was sent, or it failed: nothing exists to delete.
            if self.create_waits.remove(&id) {
                self.set_busy(id, false);
            }
            self.gone(id, GoneReason::Aborted, now);
        } else {
            self.update(id, |n| n.state = NodeState::Deleting { since: now, reason });
        }
    }

    /// A node is final: gone. Its provider has room again.
    pub(super) fn gone(&mut self, id: NodeId, reason: GoneReason, now: Time) {
        let Some(node) = self.nodes.get(&id) else {
            return;
        };
        let p = node.provider;
        let had_instance = node.instance.is_some();
        let slot_nodes: Vec<NodeId> = self.slot_nodes(id).collect();
        for s in slot_nodes {
            self.free_slot_node(s, GoneReason::BackingLost, now);
        }
        self.unassign(id);
        self.update(id, |n| n.state = NodeState::Gone { since: now, reason });
        self.timer(now + self.config.timings.history, Timer::PurgeNode(id));
        if had_instance {
            // Arvados' rule: quota-exceeded holds creates until an instance goes away.
            self.ix.providers[p.0 as usize].quota_paused_until = None;
        }
    }

    /// The cloud reports that a node's instance (attached) failed and will
    /// never run: a failed launch try, with the cloud's reason. The
    /// instance is deleted and, within `launch-retries`, another launched.
    pub(super) fn instance_failed(
        &mut self,
        id: NodeId,
        inst: &crate::driver::Instance,
        now: Time,
    ) {
        let why = format!(
            "the cloud reports instance {} failed: {}",
            inst.id,
            inst.failure.as_deref().unwrap_or("it gave no reason")
        );
        self.failed_try(id, why, DeleteReason::InstanceFailed, now);
    }

    /// A launch try failed. The node tries again (on another provider where
    /// the label has one) until `launch-retries` is used up; then it fails,
    /// and so do the requests it was launched for: its own, or for a backing
    /// node, those of its slots. `delete` is why an instance that exists
    /// but is no good is deleted. `why` is kept as the node's
    /// [failure](Node::failure), and as the [last
    /// failure](Request::last_failure) of each of those requests, with the
    /// node and its provider.
    pub(super) fn failed_try(&mut self, id: NodeId, why: String, delete: DeleteReason, now: Time) {
        let failure = failure_text(&why);
        if self.update(id, |n| n.failure = Some(failure)).is_none() {
            return;
        }
        let node = &self.nodes[&id];
        let label = node.label;
        let provider = node.provider;
        let assigned = node.assigned;
        let has_instance = node.instance.is_some();
        let packing = node.packing.clone();
        let attempt = match node.state {
            NodeState::Creating { attempt, .. } => attempt + 1,
            _ => 1,
        };
        let retries = self.config[label].launch_retries;
        let mut requests: Vec<RequestId> = match &packing {
            Packing::Backing { slots, .. } => slots
                .iter()
                .flatten()
                .filter_map(|s| self.nodes.get(s).and_then(|s| s.assigned))
                .collect(),
            _ => assigned.into_iter().collect(),
        };
        requests.sort();
        requests.dedup();
        let mut spent = Vec::new();
        let mut tries = attempt;
        let last_failure = failure_text(&format!(
            "node {id} on provider `{}`: {why}",
            self.config[provider].name
        ));
        for r in &requests {
            if let Some(req) = self.requests.get_mut(r) {
                req.failures += 1;
                req.last_failure = Some(last_failure.clone());
                tries = tries.max(req.failures);
                if req.failures > retries {
                    spent.push(*r);
                }
                self.dirty_requests.insert(*r);
            }
        }
        // A node no request waits for, of a label removed from the config,
        // is not tried again: nothing would use it.
        let unwanted = requests.is_empty() && self.runs_no_more(&self.nodes[&id]);
        let give_up = attempt > retries
            || (!requests.is_empty() && spent.len() == requests.len())
            || unwanted;
        let pname = &self.config[provider].name;
        let lname = &self.config[label].name;
        let reason = format!(
            "could not launch label `{lname}`: {tries} tries failed; last on provider `{pname}`: {why}"
        );
        let failed: Vec<RequestId> = if give_up { requests.clone() } else { spent };
        for r in failed {
            let state = RequestState::Failed {
                at: now,
                reason: reason.clone(),
            };
            self.finish_request(r, state, now);
        }
        if give_up {
            if requests.is_empty()
                && let Some(l) = prewarm_label(&self.nodes[&id])
            {
                // A prewarm launch: prewarming the label waits a while.
                let rt = &mut self.ix.labels[l.0 as usize];
                rt.failures += 1;
                rt.backoff_until = now + calls::backoff(rt.failures + 1);
            }
            if has_instance {
                self.begin_delete(id, delete, now);
            } else {
                self.unassign(id);
                let slot_nodes: Vec<NodeId> = self.slot_nodes(id).collect();
                for s in slot_nodes {
                    self.free_slot_node(s, GoneReason::BackingLost, now);
                }
                self.update(id, |n| n.state = NodeState::Failed { since: now, reason });
                self.timer(now + self.config.timings.history, Timer::PurgeNode(id));
            }
            return;
        }
        if has_instance {
            // The instance exists but is no good: delete it; a plain node
            // gets a replacement that inherits the try count and the
            // request, a backing node's slots are served again by the next
            // plan.
            self.begin_delete(id, delete, now);
            let tally = self.tally();
            if packing == Packing::Plain
                && let Some(offer) = self.pick_offer(label, Some(provider), &tally, now)
            {
                let offer = self.machine_offers(label)[offer].clone();
                let new = self.launch(label, &offer, Packing::Plain, assigned, now);
                self.update(new, |n| {
                    n.state = NodeState::Creating {
                        since: now,
                        attempt,
                    }
                });
                if let Some(r) = assigned {
                    self.add_to_request(r, new);
                }
                if offer.provider == provider {
                    self.wait_to_create(new, attempt, now);
                }
            }
            return;
        }
        // The same node again, on another provider if one has room (its own
        // usage is already counted where it is, so staying always fits). A
        // backing node keeps its slots, and they follow it.
        let tally = self.tally();
        let target = self
            .pick_offer(label, Some(provider), &tally, now)
            .map(|i| self.machine_offers(label)[i].clone())
            .filter(|o| o.provider != provider);
        self.update(id, |n| {
            n.state = NodeState::Creating {
                since: now,
                attempt,
            };
            if let Some(o) = &target {
                n.provider = o.provider;
                n.instance_type = o.instance_type.clone();
                n.resources = Resources::from(o);
                n.price = o.price;
            }
        });
        if let Some(o) = target {
            let slot_nodes: Vec<NodeId> = self.slot_nodes(id).collect();
            for s in slot_nodes {
                self.update(s, |n| {
                    n.provider = o.provider;
                    n.instance_type = o.instance_type.clone();
                });
            }
        } else {
            self.wait_to_create(id, attempt, now);
        }
    }

    /// Holds a node's next create on the provider that just failed it for
    /// a backoff (1 s after the first failed try, doubling), so that a
    /// provider failing every create is not asked again at once.
    fn wait_to_create(&mut self, id: NodeId, attempt: u32, now: Time) {
        self.set_busy(id, true);
        self.create_waits.insert(id);
        self.timer(now + calls::backoff(attempt), Timer::Retry(id));
    }

    /// Whether someone uses the node: it is in use, or it is a backing node
    /// one of whose slots is.
    pub(super) fn in_use(&self, node: &Node) -> bool {
        match &node.packing {
            Packing::Backing { slots, .. } => slots.iter().flatten().any(|s| {
                self.nodes
                    .get(s)
                    .is_some_and(|n| matches!(n.state, NodeState::InUse { .. }))
            }),
            _ => matches!(node.state, NodeState::InUse { .. }),
        }
    }

    /// A node's instance is no longer there.
    pub(super) fn lost(&mut self, id: NodeId, now: Time) {
        let Some(node) = self.nodes.get(&id) else {
            return;
        };
        // A node someone is using is never taken from them because the cloud
        // says its instance went: it stays in use, marked, and is deleted
        // (not reused) once released.
        if self.in_use(node) {
            let p = node.provider.0 as usize;
            let m = self.ix.providers[p].missing.entry(id).or_insert(Missing {
                since: now,
                lists: 0,
                confirmed: false,
            });
            if !m.confirmed {
                m.confirmed = true;
                self.notices.push(Notice::LostInUse { node: id });
            }
            return;
        }
        match node.state {
            NodeState::Deleting { .. } => self.gone(id, GoneReason::Deleted, now),
            NodeState::Creating { .. } | NodeState::Booting { .. } => {
                self.update(id, |n| n.instance = None);
                self.failed_try(
                    id,
                    "the instance disappeared while booting".into(),
                    DeleteReason::LaunchFailed,
                    now,
                );
            }
            NodeState::Ready { .. } | NodeState::InUse { .. } | NodeState::Used { .. } => {
                self.notices.push(Notice::Vanished { node: id });
                self.gone(id, GoneReason::Vanished, now);
            }
            NodeState::Gone { .. } | NodeState::Failed { .. } => {}
        }
    }
}
