//! Timers: what is looked at again at a time (boot and idle timeouts, a
//! ready node's age, a backing node's grace, retries, forgetting what ended)
//! and what each does when it fires; pauses lifted when their time is up.

use super::*;

/// Something to look at again at a time. A timer is checked against the
/// current state when it fires, so stale timers are harmless.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Timer {
    BootTimeout(NodeId),
    ReadyAge(NodeId),
    IdleTimeout(NodeId),
    SlotGrace(NodeId),
    /// A node's failed call may be made again.
    Retry(NodeId),
    PurgeNode(NodeId),
    PurgeRequest(RequestId),
}

impl Pool {
    pub(super) fn timer(&mut self, at: Time, timer: Timer) {
        self.timers.insert((at, timer));
    }

    pub(super) fn fire_timers(&mut self, now: Time) {
        while let Some(&(at, kind)) = self.timers.first() {
            if at > now {
                break;
            }
            self.timers.pop_first();
            self.fire(kind, at, now);
        }
    }

    fn fire(&mut self, timer: Timer, at: Time, now: Time) {
        let history = self.config.timings.history;
        let id = match timer {
            Timer::PurgeRequest(rid) => {
                let Some(r) = self.requests.get(&rid) else {
                    return;
                };
                // A fulfilled request is kept while any of its nodes is in
                // use, so a node never names a request that was forgotten.
                let in_use = r.nodes.iter().any(|n| {
                    self.nodes.get(n).is_some_and(
                        |n| matches!(n.state, NodeState::InUse { request, .. } if request == rid),
                    )
                });
                if in_use {
                    self.timer(now + history, Timer::PurgeRequest(rid));
                    return;
                }
                match forget_at(r, &self.config.timings) {
                    Some(t) if t <= at => {
                        self.requests.remove(&rid);
                        self.dirty_requests.remove(&rid);
                        self.purged_requests.push(rid);
                    }
                    // Kept longer since the timer was set (`history` or
                    // `idempotency-ttl` raised by a reload).
                    Some(t) => self.timer(t, Timer::PurgeRequest(rid)),
                    None => {}
                }
                return;
            }
            Timer::PurgeNode(id) => {
                if let Some(n) = self.nodes.get(&id)
                    && let NodeState::Gone { since, .. } | NodeState::Failed { since, .. } = n.state
                    && since + history <= at
                {
                    if self.busy.contains(&id) {
                        // Its call's outcome must find it (and free the slot).
                        self.timer(now + history, Timer::PurgeNode(id));
                    } else {
                        self.purge_node(id);
                    }
                }
                return;
            }
            Timer::Retry(id) => {
                self.create_waits.remove(&id);
                self.set_busy(id, false);
                return;
            }
            Timer::BootTimeout(id)
            | Timer::ReadyAge(id)
            | Timer::IdleTimeout(id)
            | Timer::SlotGrace(id) => id,
        };
        let Some(node) = self.nodes.get(&id) else {
            return;
        };
        let label = &self.config[node.label];
        match (timer, &node.state) {
            (Timer::BootTimeout(_), NodeState::Booting { since })
                if *since + label.boot_timeout <= now =>
            {
                let why = match self.probe_error(id) {
                    Some(probes) => format!(
                        "running but not ready after the boot timeout ({}s): {probes}",
                        label.boot_timeout.as_secs()
                    ),
                    None => format!(
                        "not running after the boot timeout ({}s)",
                        label.boot_timeout.as_secs()
                    ),
                };
                self.failed_try(id, why, DeleteReason::BootTimeout, now);
            }
            (Timer::ReadyAge(_), NodeState::Ready { since })
                if node.assigned.is_none()
                    && node.idle == Idle::Run
                    && node.packing == Packing::Plain
                    && label.max_ready_age.is_some_and(|a| *since + a <= now) =>
            {
                self.begin_delete(id, DeleteReason::Recycled, now);
            }
            (Timer::IdleTimeout(_), NodeState::Ready { since })
                if node.assigned.is_none()
                    && node.idle == Idle::Run
                    && node.packing == Packing::Plain
                    && label.idle_timeout.is_some_and(|a| *since + a <= now) =>
            {
                let free = self.ix.labels[node.label.0 as usize].free_ready.len() as u32;
                if free > label.min_ready_at(now.as_millis()) {
                    self.begin_delete(id, DeleteReason::IdleTimeout, now);
                } else if let Some(idle) = label.idle_timeout {
                    // Kept for `min-ready`: looked at again, since that may
                    // fall (a schedule's window closes, a reload).
                    self.timer(now + idle, Timer::IdleTimeout(id));
                }
            }
            (Timer::SlotGrace(_), NodeState::Ready { .. }) if node.idle == Idle::Run => {
                let Packing::Backing {
                    slot_label,
                    slots,
                    free_since: Some(since),
                } = &node.packing
                else {
                    return;
                };
                let LabelKind::Slots { grace_time, .. } = self.config[*slot_label].kind else {
                    return;
                };
                let n = slots.len();
                let min_ready = self.config[*slot_label].min_ready_at(now.as_millis()) as usize;
                if slots.iter().all(Option::is_none)
                    && *since + grace_time <= now
                    && self.free_slots(*slot_label, false).saturating_sub(n) >= min_ready
                {
                    self.begin_delete(id, DeleteReason::SlotsIdle, now);
                }
            }
            _ => {}
        }
    }

    /// Sets the timers a restored node needs.
    pub(super) fn timers_for_node(&mut self, id: NodeId, now: Time) {
        let Some(node) = self.nodes.get(&id) else {
            return;
        };
        let history = self.config.timings.history;
        match node.state {
            NodeState::Booting { since } => {
                let t = since + self.config[node.label].boot_timeout;
                self.timer(t, Timer::BootTimeout(id));
            }
            NodeState::Ready { since } => {
                self.ready_timers(id, since);
                self.check_backing_idle(id, now);
            }
            NodeState::Gone { since, .. } | NodeState::Failed { since, .. } => {
                self.timer(since + history, Timer::PurgeNode(id))
            }
            _ => {}
        }
    }

    pub(super) fn timers_for_request(&mut self, req: &Request) {
        if let Some(at) = forget_at(req, &self.config.timings) {
            self.timer(at, Timer::PurgeRequest(req.id));
        }
    }

    pub(super) fn lift_pauses(&mut self, now: Time) {
        for rt in &mut self.ix.providers {
            if rt.quota_paused_until.is_some_and(|t| t <= now) {
                rt.quota_paused_until = None;
            }
            if rt.held_until.is_some_and(|t| t <= now) {
                rt.held_until = None;
            }
            rt.capacity_paused.retain(|(_, t)| *t > now);
        }
    }
}

/// When a request stopped being pending.
fn request_end(r: &Request) -> Option<Time> {
    match r.state {
        RequestState::Pending => None,
        RequestState::Fulfilled { at }
        | RequestState::Failed { at, .. }
        | RequestState::Cancelled { at } => Some(at),
    }
}

/// When an ended request may be forgotten: `history` after it ended, and
/// no sooner than `idempotency-ttl` after it was made if it carries an
/// idempotency key (its key is forgotten with it). `None` while it is
/// pending.
fn forget_at(r: &Request, timings: &crate::config::Timings) -> Option<Time> {
    let end = request_end(r)? + timings.history;
    Some(match r.key {
        Some(_) => end.max(r.created + timings.idempotency_ttl),
        None => end,
    })
}
