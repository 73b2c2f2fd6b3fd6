//! Provider choice: the offers a label launches from, the one a launch
//! takes (priority, then price, skipping paused or full providers) within
//! a plan's [`Tally`], and a slot label's free slots in packing order.

use super::*;
use crate::config::Offer;

/// Resources a plan would add per provider, on top of what is counted; what
/// it may count as freed (nodes it would evict); and the providers it may
/// not launch on.
pub(super) struct Tally {
    pub(super) extra: Vec<Usage>,
    pub(super) credit: Vec<Usage>,
    pub(super) closed: Vec<bool>,
    /// Free nodes, and free slots (backing, index), kept for a request
    /// ahead ([`super::plan::Kept`]): not to be taken.
    pub(super) kept: HashSet<NodeId>,
    pub(super) kept_slots: HashSet<(NodeId, u16)>,
}

impl Pool {
    /// A tally with nothing added and every provider open.
    pub(super) fn tally(&self) -> Tally {
        let n = self.config.providers.len();
        Tally {
            extra: vec![Usage::default(); n],
            credit: vec![Usage::default(); n],
            closed: vec![false; n],
            kept: HashSet::new(),
            kept_slots: HashSet::new(),
        }
    }

    /// The machine offers a label's nodes launch from: its own, or for a
    /// slot label its backing label's.
    pub(super) fn offers_of(&self, label: LabelIx) -> &[Offer] {
        match self.config[label].kind {
            LabelKind::Machine { .. } => self.machine_offers(label),
            LabelKind::Slots { backing, .. } => self.machine_offers(backing),
        }
    }

    pub(super) fn machine_offers(&self, label: LabelIx) -> &[Offer] {
        match &self.config[label].kind {
            LabelKind::Machine { offers } => offers,
            LabelKind::Slots { .. } => &[],
        }
    }

    pub(super) fn offer_for(
        &self,
        label: LabelIx,
        provider: ProviderIx,
    ) -> Option<&crate::config::Offer> {
        match &self.config[label].kind {
            LabelKind::Machine { offers } => offers.iter().find(|o| o.provider == provider),
            LabelKind::Slots { .. } => None,
        }
    }

    /// The offer to launch `label` from: the preferred provider (lowest
    /// priority value, then lowest price) among those not paused and with
    /// room under their limits. `avoid` is tried last.
    pub(super) fn pick_offer(
        &self,
        label: LabelIx,
        avoid: Option<ProviderIx>,
        tally: &Tally,
        now: Time,
    ) -> Option<usize> {
        let offers = self.machine_offers(label);
        let mut best: Option<(bool, i32, f64, usize)> = None;
        for (i, o) in offers.iter().enumerate() {
            if !self.can_launch(o, tally, now) {
                continue;
            }
            let key = (
                Some(o.provider) == avoid,
                self.config[o.provider].priority,
                o.price,
                i,
            );
            let better = match &best {
                None => true,
                Some(b) => {
                    (key.0, key.1) < (b.0, b.1)
                        || ((key.0, key.1) == (b.0, b.1) && key.2.total_cmp(&b.2).is_lt())
                }
            };
            if better {
                best = Some(key);
            }
        }
        best.map(|b| b.3)
    }

    /// Whether offer `o` may launch one more node within `tally` now:
    /// nothing blocks it ([`Pool::blocked`]) and the plan does not keep its
    /// provider for requests ahead.
    fn can_launch(&self, o: &Offer, tally: &Tally, now: Time) -> bool {
        !tally.closed[o.provider.0 as usize] && self.blocked(o, tally, now).is_none()
    }

    /// Free slots of a slot label, packing order: the fullest live backing
    /// node first, ready ones before launching ones.
    pub(super) fn free_slot_list(&self, label: LabelIx) -> Vec<(NodeId, u16)> {
        let mut backings: Vec<(bool, usize, NodeId, Vec<u16>)> = Vec::new();
        for &b in &self.ix.labels[label.0 as usize].backings {
            let Some(node) = self.nodes.get(&b) else {
                continue;
            };
            if node.idle != Idle::Run {
                continue;
            }
            let Packing::Backing { slots, .. } = &node.packing else {
                continue;
            };
            let free: Vec<u16> = (0..slots.len() as u16)
                .filter(|i| slots[usize::from(*i)].is_none())
                .collect();
            if free.is_empty() {
                continue;
            }
            let ready = matches!(node.state, NodeState::Ready { .. });
            backings.push((!ready, slots.len() - free.len(), b, free));
        }
        backings.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
        backings
            .into_iter()
            .flat_map(|(_, _, b, free)| free.into_iter().map(move |i| (b, i)))
            .collect()
    }

    /// Free slots of a slot label, on ready backing nodes only or on all
    /// live ones.
    pub(super) fn free_slots(&self, label: LabelIx, ready_only: bool) -> usize {
        self.ix.labels[label.0 as usize]
            .backings
            .iter()
            .filter_map(|b| self.nodes.get(b))
            .filter(|n| n.idle == Idle::Run)
            .filter(|n| !ready_only || matches!(n.state, NodeState::Ready { .. }))
            .map(|n| match &n.packing {
                Packing::Backing { slots, .. } => slots.iter().filter(|s| s.is_none()).count(),
                _ => 0,
            })
            .sum()
    }
}

impl Tally {
    pub(super) fn add(&mut self, o: Offer) {
        self.extra[o.provider.0 as usize].add(Resources::from(&o));
    }

    /// Closes the providers of these offers.
    pub(super) fn close(&mut self, offers: &[Offer]) {
        for o in offers {
            self.closed[o.provider.0 as usize] = true;
        }
    }
}
