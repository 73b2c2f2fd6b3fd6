//! Adoption: an owned instance no live node holds, that the store vouches
//! for (`vouch.rs`), taken back as the node its tags name, if its tags name
//! a label the provider serves and the provider's limits have room for it;
//! on hold if its tags say it is in use.

use super::*;
use crate::driver::Instance;

/// What an owned instance's tags say it is, if berth can take it back.
pub(super) struct Adoptable {
    pub(super) id: NodeId,
    label: LabelIx,
    idle: Idle,
    /// For a backing instance: the slot label and slot count.
    slots: Option<(LabelIx, u16)>,
}

impl Pool {
    /// Whether an owned instance unknown to berth can be taken back: its tags
    /// name a node id and a label this provider serves.
    pub(super) fn adoptable(&self, p: ProviderIx, inst: &Instance) -> Option<Adoptable> {
        // One the cloud gave up on is nothing to take back: it is deleted
        // as a leak, if the store vouches for it.
        if inst.state == crate::driver::InstanceState::Failed {
            return None;
        }
        let id: NodeId = inst.tags.get(NODE_TAG)?.parse().ok()?;
        let label = self.config.label(inst.tags.get(LABEL_TAG)?)?;
        self.offer_for(label, p)?;
        let idle = inst
            .tags
            .get(IDLE_TAG)
            .and_then(|t| t.parse::<Idle>().ok())
            .unwrap_or_default();
        let slots = match (inst.tags.get(SLOT_LABEL_TAG), inst.tags.get(SLOTS_TAG)) {
            (None, None) => None,
            (Some(name), Some(count)) => {
                let slot_label = self.config.label(name)?;
                let count: u16 = count.parse().ok().filter(|c| *c > 0)?;
                match self.config[slot_label].kind {
                    LabelKind::Slots { backing, .. } if backing == label => {}
                    _ => return None,
                }
                Some((slot_label, count))
            }
            _ => return None,
        };
        Some(Adoptable {
            id,
            label,
            idle,
            slots,
        })
    }

    /// The offer an adopted instance is counted as.
    fn adopted_offer(
        &self,
        p: ProviderIx,
        inst: &Instance,
        a: &Adoptable,
    ) -> Option<crate::config::Offer> {
        self.machine_offers(a.label)
            .iter()
            .filter(|o| o.provider == p)
            .find(|o| o.instance_type == inst.instance_type)
            .or_else(|| self.offer_for(a.label, p))
            .cloned()
    }

    /// Whether taking `inst` back keeps provider `p` within its limits.
    pub(super) fn fits(&self, p: ProviderIx, inst: &Instance, a: &Adoptable) -> bool {
        let Some(offer) = self.adopted_offer(p, inst, a) else {
            return false;
        };
        self.room_for(p, Resources::from(&offer))
    }

    /// Whether one more instance of `r` keeps provider `p` within its limits.
    pub(super) fn room_for(&self, p: ProviderIx, r: Resources) -> bool {
        let u = self.ix.providers[p.0 as usize].usage;
        let l = &self.config[p].limits;
        l.max_instances.is_none_or(|m| u.instances < m)
            && l.max_cores.is_none_or(|m| u.vcpus + r.vcpus <= m)
            && l.max_ram_mib.is_none_or(|m| u.ram_mib + r.ram_mib <= m)
    }

    /// Takes an instance back as the node its tags name. One whose tags
    /// say it is in use (`held`: the store does not know by whom) is taken
    /// on hold: never handed out nor recycled until an operator says so.
    pub(super) fn adopt(
        &mut self,
        p: ProviderIx,
        inst: &Instance,
        a: Adoptable,
        held: Option<String>,
        now: Time,
    ) {
        let Some(offer) = self.adopted_offer(p, inst, &a) else {
            return;
        };
        let packing = match a.slots {
            None => Packing::Plain,
            Some((slot_label, count)) => Packing::Backing {
                slot_label,
                slots: vec![None; usize::from(count)],
                free_since: None,
            },
        };
        self.insert(Node {
            id: a.id,
            label: a.label,
            provider: p,
            instance_type: inst.instance_type.clone(),
            resources: Resources::from(&offer),
            price: offer.price,
            instance: None,
            state: NodeState::Creating {
                since: now,
                attempt: 0,
            },
            idle: if held.is_some() { Idle::Hold } else { a.idle },
            packing,
            assigned: None,
            created: inst.created_at_ms.map_or(now, Time),
            endpoint: None,
            failure: None,
        });
        self.notices.push(Notice::Adopted {
            node: a.id,
            instance: inst.id.clone(),
        });
        if let Some(why) = held {
            self.notices.push(Notice::HeldByTags {
                node: a.id,
                instance: inst.id.clone(),
                why,
            });
        }
        // Not busy and creating: observe resolves it like a lost create.
        self.observe(a.id, inst, true, now);
        // Its tags become this store's (signed anew, on hold if held).
        if self
            .nodes
            .get(&a.id)
            .is_some_and(|n| self.tags_differ(n, inst))
        {
            self.owe_tags(a.id);
        }
    }
}
