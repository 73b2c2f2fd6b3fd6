//! Prewarming: the launches that keep `min-ready` free nodes (or free slots)
//! per label, never on a provider a waiting request needs room on, and held
//! off while the label's prewarm launches keep failing.

use super::choice::Tally;
use super::*;

impl Pool {
    /// Keeps `min-ready` nodes (or free slots) per label: the one in force
    /// now ([`crate::config::Label::min_ready_at`]), and the `burst-extra`
    /// launches owed beyond it since a request took the last ready node.
    pub(super) fn prewarm(&mut self, label: LabelIx, wanted: &Tally, now: Time) {
        let cfg = &self.config[label];
        let min_ready = cfg.min_ready_at(now.as_millis());
        let rt = &self.ix.labels[label.0 as usize];
        let owed = rt.burst_owed;
        let target = min_ready.saturating_add(owed);
        if target == 0 || cfg.retired {
            return;
        }
        if rt.backoff_until > now {
            return;
        }
        let tally = Tally {
            closed: wanted.closed.clone(),
            ..self.tally()
        };
        // Each launch beyond `min-ready` pays a burst launch owed.
        let mut paid = 0;
        match &cfg.kind {
            LabelKind::Machine { .. } => {
                let have = (rt.free_ready.len() + rt.free_launching.len()) as u32;
                for n in have..target {
                    let Some(offer) = self.pick_offer(label, None, &tally, now) else {
                        break;
                    };
                    let offer = self.machine_offers(label)[offer].clone();
                    self.launch(label, &offer, Packing::Plain, None, now);
                    paid += u32::from(n >= min_ready);
                }
            }
            &LabelKind::Slots { slots, backing, .. } => {
                let mut have = self.free_slots(label, false) as u32;
                while have < target {
                    let Some(offer) = self.pick_offer(backing, None, &tally, now) else {
                        break;
                    };
                    let offer = self.machine_offers(backing)[offer].clone();
                    let packing = Packing::Backing {
                        slot_label: label,
                        slots: vec![None; usize::from(slots)],
                        free_since: Some(now),
                    };
                    self.launch(backing, &offer, packing, None, now);
                    let beyond = (have + u32::from(slots)).saturating_sub(min_ready.max(have));
                    paid += beyond.min(u32::from(slots));
                    have += u32::from(slots);
                }
            }
        }
        let rt = &mut self.ix.labels[label.0 as usize];
        rt.burst_owed = rt.burst_owed.saturating_sub(paid);
    }

    /// A request was just served, taking ready nodes (or slots on ready
    /// backing nodes) of `took_ready`: for each of them with `burst-extra`
    /// left with none ready, that many launches beyond `min-ready` are
    /// owed.
    pub(super) fn burst_after(&mut self, took_ready: &[LabelIx]) {
        for &label in took_ready {
            let extra = self.config[label].burst_extra;
            let none_left = match self.config[label].kind {
                LabelKind::Machine { .. } => self.ix.labels[label.0 as usize].free_ready.is_empty(),
                LabelKind::Slots { .. } => self.free_slots(label, true) == 0,
            };
            if extra > 0 && none_left {
                let rt = &mut self.ix.labels[label.0 as usize];
                rt.burst_owed = rt.burst_owed.max(extra);
            }
        }
    }
}

/// The label whose prewarming a node's launch serves: a backing node's slot
/// label, a plain node's own; none for a slot node, which launches nothing.
pub(super) fn prewarm_label(node: &Node) -> Option<LabelIx> {
    match node.packing {
        Packing::Plain => Some(node.label),
        Packing::Backing { slot_label, .. } => Some(slot_label),
        Packing::Slot { .. } => None,
    }
}
