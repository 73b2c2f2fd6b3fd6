//! Prewarming: the launches that keep `min-ready` free nodes (or free slots)
//! per label, never on a provider a waiting request needs room on, and held
//! off while the label's prewarm launches keep failing.

use super::choice::Tally;
use super::*;

impl Pool {
    /// Keeps `min-ready` nodes (or free slots) per label.
    pub(super) fn prewarm(&mut self, label: LabelIx, wanted: &Tally, now: Time) {
        let cfg = &self.config[label];
        let min_ready = cfg.min_ready;
        if min_ready == 0 || cfg.retired {
            return;
        }
        let rt = &self.ix.labels[label.0 as usize];
        if rt.backoff_until > now {
            return;
        }
        let tally = Tally {
            closed: wanted.closed.clone(),
            ..self.tally()
        };
        match &cfg.kind {
            LabelKind::Machine { .. } => {
                let have = (rt.free_ready.len() + rt.free_launching.len()) as u32;
                for _ in have..min_ready {
                    let Some(offer) = self.pick_offer(label, None, &tally, now) else {
                        return;
                    };
                    let offer = self.machine_offers(label)[offer].clone();
                    self.launch(label, &offer, Packing::Plain, None, now);
                }
            }
            &LabelKind::Slots { slots, backing, .. } => {
                let mut have = self.free_slots(label, false) as u32;
                while have < min_ready {
                    let Some(offer) = self.pick_offer(backing, None, &tally, now) else {
                        return;
                    };
                    let offer = self.machine_offers(backing)[offer].clone();
                    let packing = Packing::Backing {
                        slot_label: label,
                        slots: vec![None; usize::from(slots)],
                        free_since: Some(now),
                    };
                    self.launch(backing, &offer, packing, None, now);
                    have += u32::from(slots);
                }
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
