//! Node bookkeeping: the one way a stored node changes (`update`, `insert`,
//! `purge_node`, and `set_busy` for a call in flight), each keeping the
//! indexes true (`Indexes::touch`) and owing a node's instance its tags
//! when what they show changes.

use super::*;

impl Pool {
    /// Changes a node through `f`, keeping every index true and marking it
    /// for the store. The one way a stored node changes.
    ///
    /// What the node's tags say (its idle behaviour, whether it is handed
    /// out) is owed to its instance once it changes: a set-tags follows
    /// the commit, for the node or, for a slot node, its backing node.
    pub(super) fn update<R>(&mut self, id: NodeId, f: impl FnOnce(&mut Node) -> R) -> Option<R> {
        let node = self.nodes.get_mut(&id)?;
        let busy = self.busy.contains(&id);
        let tagged = tag_view(node);
        self.ix.remove(node, busy);
        let r = f(node);
        self.ix.add(node, busy);
        self.dirty_nodes.insert(id);
        let now_tagged = tag_view(node);
        match node.packing {
            // A slot node's backing instance shows how many of its slots
            // are handed out.
            Packing::Slot { backing, .. } if now_tagged.1.is_some() != tagged.1.is_some() => {
                self.owe_tags(backing)
            }
            Packing::Slot { .. } => {}
            _ if now_tagged != tagged => self.owe_tags(id),
            _ => {}
        }
        Some(r)
    }

    /// Owes node `id`'s instance its tags as they now are: sent once no
    /// other call is in flight for it. A node whose instance is not known
    /// yet gets them with its create (and `created` owes them again if
    /// they changed meanwhile); one being deleted needs none.
    pub(super) fn owe_tags(&mut self, id: NodeId) {
        let Some(n) = self.nodes.get(&id) else {
            return;
        };
        let deleting = matches!(n.state, NodeState::Deleting { .. });
        if n.instance.is_none() || n.state.is_final() || deleting {
            return;
        }
        if matches!(n.packing, Packing::Slot { .. }) {
            return;
        }
        let p = n.provider.0 as usize;
        self.ix.providers[p].want_tags.insert(id);
    }

    /// Marks a node's call in flight (or done), which changes what it owes.
    pub(super) fn set_busy(&mut self, id: NodeId, busy: bool) {
        let Some(node) = self.nodes.get(&id) else {
            return;
        };
        let was = self.busy.contains(&id);
        if was == busy {
            return;
        }
        self.ix.remove(node, was);
        if busy {
            self.busy.insert(id);
        } else {
            self.busy.remove(&id);
        }
        self.ix.add(node, busy);
    }

    pub(super) fn insert(&mut self, node: Node) {
        let busy = self.busy.contains(&node.id);
        self.ix.add(&node, busy);
        self.dirty_nodes.insert(node.id);
        self.nodes.insert(node.id, node);
    }

    pub(super) fn fresh_node_id(&mut self) -> NodeId {
        loop {
            let id = NodeId(self.ids.next());
            if !self.nodes.contains_key(&id) {
                return id;
            }
        }
    }

    pub(super) fn purge_node(&mut self, id: NodeId) {
        if let Some(node) = self.nodes.remove(&id) {
            let busy = self.busy.remove(&id);
            self.ix.remove(&node, busy);
            self.attached_at.remove(&id);
            self.tries.remove(&id);
            self.create_waits.remove(&id);
            self.unsure.remove(&id);
            self.probes.remove(&id);
            self.tagged_at.remove(&id);
            self.tags_checked.remove(&id);
            self.dirty_nodes.remove(&id);
            self.purged_nodes.push(id);
        }
    }
}

/// What of a node its tags show beyond what never changes: its idle
/// behaviour and the request it is handed out to or set aside for.
fn tag_view(n: &Node) -> (Idle, Option<RequestId>) {
    (n.idle, n.request())
}

impl Indexes {
    fn remove(&mut self, n: &Node, busy: bool) {
        self.touch(n, busy, false);
    }

    fn add(&mut self, n: &Node, busy: bool) {
        self.touch(n, busy, true);
    }

    /// Adds `n` to (or removes it from) every index it belongs in. One
    /// function for both directions so the two can never disagree.
    fn touch(&mut self, n: &Node, busy: bool, add: bool) {
        fn set<T: Ord>(s: &mut BTreeSet<T>, v: T, add: bool) {
            if add {
                s.insert(v);
            } else {
                s.remove(&v);
            }
        }
        let label = &mut self.labels[n.label.0 as usize];
        let plain = n.packing == Packing::Plain;
        let free = plain && n.assigned.is_none() && n.idle == Idle::Run;
        match n.state {
            NodeState::Ready { since } if free => set(&mut label.free_ready, (since, n.id), add),
            NodeState::Creating { .. } | NodeState::Booting { .. } if free => {
                set(&mut label.free_launching, n.id, add)
            }
            _ => {}
        }
        if let Packing::Backing { slot_label, .. } = &n.packing
            && n.state.holds_instance()
            && !matches!(n.state, NodeState::Deleting { .. })
        {
            set(&mut self.labels[slot_label.0 as usize].backings, n.id, add);
        }
        let p = &mut self.providers[n.provider.0 as usize];
        if matches!(n.packing, Packing::Slot { .. }) {
            return;
        }
        if n.state.holds_instance() {
            let deleting = matches!(n.state, NodeState::Deleting { .. });
            if add {
                p.usage.add(n.resources);
                if deleting {
                    p.deleting.add(n.resources);
                }
            } else {
                p.usage.sub(n.resources);
                if deleting {
                    p.deleting.sub(n.resources);
                }
            }
            if let Some(instance) = &n.instance {
                if add {
                    p.with_instance.insert(n.id);
                    p.holders.insert(instance.clone(), n.id);
                } else {
                    p.with_instance.remove(&n.id);
                    if p.holders.get(instance) == Some(&n.id) {
                        p.holders.remove(instance);
                    }
                }
            }
        }
        if !busy {
            match n.state {
                NodeState::Creating { .. } => set(&mut p.want_create, n.id, add),
                NodeState::Deleting { .. } if n.instance.is_some() => {
                    set(&mut p.want_delete, n.id, add)
                }
                _ => {}
            }
        }
    }
}
