//! What a node's instance carries: its tags (what a restart needs, signed
//! with the store's key, and whether it is handed out), and the create that
//! sets them first.

use super::*;

impl Pool {
    /// The tags a node's instance carries: what a restart needs, signed
    /// with the store's key (`identity.rs`), and the request it is handed
    /// out to or set aside for.
    pub(super) fn node_tags(&self, node: &Node) -> Tags {
        let mut tags = Tags::new();
        let label = &self.config[node.label].name;
        tags.insert(POOL_TAG.into(), self.config.pool_id.clone());
        tags.insert(NODE_TAG.into(), node.id.to_string());
        tags.insert(LABEL_TAG.into(), label.clone());
        tags.insert(IDLE_TAG.into(), node.idle.as_str().into());
        tags.insert(STORE_TAG.into(), self.identity.generation.clone());
        let mut slot_tags = None;
        if let Packing::Backing {
            slot_label, slots, ..
        } = &node.packing
        {
            let slot_label = &self.config[*slot_label].name;
            let count = u16::try_from(slots.len()).unwrap_or(u16::MAX);
            tags.insert(SLOTS_TAG.into(), count.to_string());
            tags.insert(SLOT_LABEL_TAG.into(), slot_label.clone());
            slot_tags = Some((slot_label.as_str(), count));
            let held = slots
                .iter()
                .flatten()
                .filter_map(|s| self.nodes.get(s))
                .filter(|s| matches!(s.state, NodeState::InUse { .. }))
                .count();
            if held > 0 {
                tags.insert(SLOTS_HELD_TAG.into(), held.to_string());
            }
        }
        // Handed out, or set aside for a request: a node launched for a
        // request carries it from its create, so handing it out costs no
        // call to the cloud.
        if let Some(request) = node.request() {
            tags.insert(REQUEST_TAG.into(), request.to_string());
        }
        let signature = self.identity.sign(Signed {
            pool_id: &self.config.pool_id,
            node: node.id,
            label,
            instance_type: &node.instance_type,
            slots: slot_tags,
        });
        tags.insert(SIG_TAG.into(), signature);
        tags
    }

    /// Whether `inst`'s tags under berth's prefix differ from what
    /// [`Pool::node_tags`] gives `node` now.
    pub(super) fn tags_differ(&self, node: &Node, inst: &crate::driver::Instance) -> bool {
        let berth_tags =
            (inst.tags.iter()).filter(|(k, _)| k.starts_with(crate::driver::BERTH_TAG_PREFIX));
        !berth_tags.eq(self.node_tags(node).iter())
    }

    pub(super) fn create_spec(&self, node: &Node) -> Option<CreateSpec> {
        let offer = self.offer_for(node.label, node.provider)?;
        Some(CreateSpec {
            node_id: node.id.to_string(),
            token: self.create_token(node),
            instance_type: offer.instance_type.clone(),
            image: offer.image.clone(),
            tags: self.node_tags(node),
            user_data: None,
            ssh_public_key: None,
            options: offer.options.clone(),
        })
    }
}

impl Pool {
    /// The idempotency key of a node's create ([`CreateSpec::token`]): a
    /// UUID (version 8, RFC 9562) made from the pool, the node, its
    /// provider and its try. All of these are stored with the node before
    /// its create is sent, so every try of one create, a restart's
    /// included, sends the same token; a try after the driver answered
    /// with an error (`failed_try`) counts up and sends a new one.
    pub(super) fn create_token(&self, node: &Node) -> String {
        use sha2::{Digest, Sha256};
        let attempt = match node.state {
            NodeState::Creating { attempt, .. } => attempt,
            _ => 0,
        };
        let mut hash = Sha256::new();
        for part in [
            "berth create token".as_bytes(),
            self.config.pool_id.as_bytes(),
            self.config[node.provider].name.as_bytes(),
            node.id.to_string().as_bytes(),
            &attempt.to_be_bytes(),
        ] {
            // Each part with its length first, so no two lists of parts
            // hash alike.
            hash.update((part.len() as u64).to_be_bytes());
            hash.update(part);
        }
        let bytes: [u8; 16] = hash.finalize()[..16].try_into().expect("16 of 32 bytes");
        crate::driver::create_token(bytes, 8)
    }
}
