//! The store's vouching: whether an owned instance no live node holds may
//! be adopted or deleted, or waits in quarantine; what a believed list's
//! quarantine means for creates (`mismatch`) and for the store's
//! confirmation; a listed node's tags checked against berth's.
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

use std::collections::BTreeMap;

use super::*;
use crate::driver::Instance;
use crate::text::{printable, truncated};

/// Most instances a quarantine notice names; the rest are counted.
const QUARANTINE_NAMED: usize = 5;

impl Pool {
    /// Whether the store vouches for an owned instance no live node
    /// holds: it recorded that very instance for the node its tags name,
    /// or the tags carry this store's signature. If not, why not.
    pub(super) fn vouched(
        &self,
        p: ProviderIx,
        inst: &Instance,
        node: Option<NodeId>,
    ) -> Result<(), String> {
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
    pub(super) fn held_by_tags(&self, inst: &Instance, node: Option<NodeId>) -> Option<String> {
        let known = node.and_then(|id| self.nodes.get(&id));
        if let Some(n) = known
            && self.in_use(n)
        {
            return Some(format!(
                "its tags name node {}, which is in use on another instance",
                n.id
            ));
        }
        // A node the store knows that never held this instance, or whose
        // launch was given up (gone, aborted: never handed out): the try
        // that made it ended before anything could be handed out on it (a
        // node launched for a request carries `berth-request` from its
        // create), so the tag claims nothing.
        let never_held = known.is_some_and(|n| {
            n.instance.as_deref() != Some(inst.id.as_str())
                || matches!(
                    n.state,
                    NodeState::Gone {
                        reason: GoneReason::Aborted,
                        ..
                    }
                )
        });
        if !never_held && let Some(r) = self.handed_out_unknown(inst, node) {
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
    pub(super) fn check_tags(&mut self, p: ProviderIx, id: NodeId, inst: &Instance, started: Time) {
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
    pub(super) fn settle_quarantine(
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
pub(super) fn shown(text: &str) -> String {
    printable(&truncated(text, 80)).into_owned()
}
