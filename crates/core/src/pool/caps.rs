//! Caps: the most nodes a requestor may hold or have set aside at once
//! (`api.tokens.NAME.max-nodes`, [`Config::requestor_caps`]) and the most
//! of a label handed out or set aside at once (`max-nodes`,
//! [`crate::config::Label::max_nodes`]). A request its nodes would take
//! over a cap waits, with the reason `cap`, and is served once enough is
//! given back; it is never failed for it. One that alone asks for more
//! than a cap is refused when it is asked ([`super::servable`]).

use super::*;

/// What counts against the caps of a request being planned: the nodes
/// handed out, and those set aside for the requests ahead of it in the
/// serving order, per requestor and per label. Nodes set aside for the
/// requests behind it do not count: two requests each holding part of what
/// they asked for (after a failed launch try) cannot keep each other under
/// a cap for ever, and the first of them is served first. So nodes handed
/// out never go over a cap.
pub(super) struct Held {
    by_requestor: HashMap<String, u32>,
    by_label: Vec<u32>,
}

/// Which cap holds a request back, how much of it is taken, and its size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cap {
    Requestor { name: String, held: u32, max: u32 },
    Label { label: LabelIx, held: u32, max: u32 },
}

impl Pool {
    /// What counts against the caps of the request at `place` in the
    /// serving order (the first: `None`); `None` when no cap is set, so a
    /// pool without caps counts nothing.
    pub(super) fn held(&self, before: Option<(i32, Time, RequestId)>) -> Option<Held> {
        let labels = &self.config.labels;
        if self.config.requestor_caps.is_empty() && labels.iter().all(|l| l.max_nodes.is_none()) {
            return None;
        }
        let mut held = Held {
            by_requestor: HashMap::new(),
            by_label: vec![0; labels.len()],
        };
        for n in self.nodes.values() {
            let Some(r) = n.request().and_then(|r| self.requests.get(&r)) else {
                continue;
            };
            let counts = match n.state {
                NodeState::InUse { .. } => true,
                NodeState::Creating { .. }
                | NodeState::Booting { .. }
                | NodeState::Ready { .. } => {
                    before.is_some_and(|place| (r.priority, r.created, r.id) < place)
                }
                _ => false,
            };
            if counts {
                held.count(&r.requestor, n.label);
            }
        }
        Some(held)
    }

    /// The cap `req` would go over if its nodes still missing were set
    /// aside now, with those it has set aside, if one.
    pub(super) fn over_cap(&self, req: &Request, held: &Held) -> Option<Cap> {
        let own = |label: Option<LabelIx>| -> u32 {
            (req.nodes.iter())
                .filter_map(|n| self.nodes.get(n))
                .filter(|n| !matches!(n.state, NodeState::InUse { .. }))
                .filter(|n| label.is_none_or(|l| n.label == l))
                .count() as u32
        };
        if let Some(&max) = self.config.requestor_caps.get(&req.requestor) {
            let missing = self.still_to_launch(req);
            let taken = held.by_requestor.get(&req.requestor).copied().unwrap_or(0) + own(None);
            if missing > 0 && taken + missing > max {
                return Some(Cap::Requestor {
                    name: req.requestor.clone(),
                    held: taken,
                    max,
                });
            }
        }
        for &(label, _) in &req.wants {
            let Some(max) = self.config[label].max_nodes else {
                continue;
            };
            let missing = self.still_missing(req, label);
            let taken = held.by_label[usize::from(label.0)] + own(Some(label));
            if missing > 0 && taken + missing > max {
                return Some(Cap::Label {
                    label,
                    held: taken,
                    max,
                });
            }
        }
        None
    }

    /// `req`'s nodes set aside, counted for the requests behind it.
    pub(super) fn count_set_aside(&self, req: &Request, held: &mut Held) {
        for n in req.nodes.iter().filter_map(|n| self.nodes.get(n)) {
            if !matches!(n.state, NodeState::InUse { .. }) {
                held.count(&req.requestor, n.label);
            }
        }
    }
}

impl Held {
    /// One more node of `requestor` and `label`.
    fn count(&mut self, requestor: &str, label: LabelIx) {
        match self.by_requestor.get_mut(requestor) {
            Some(c) => *c += 1,
            None => {
                self.by_requestor.insert(requestor.to_owned(), 1);
            }
        }
        self.by_label[usize::from(label.0)] += 1;
    }
}

/// Whether `new` alone asks for more than a cap allows: then it could
/// never be served.
pub(super) fn over_cap_alone(config: &Config, new: &NewRequest) -> Option<Refused> {
    let total: u32 = new.wants.iter().map(|&(_, n)| n).sum();
    if let Some(&max) = config.requestor_caps.get(&new.requestor)
        && total > max
    {
        return Some(Refused::OverCap(format!(
            "asks for {total} nodes, over requestor `{}`'s max-nodes {max}",
            new.requestor
        )));
    }
    for &(label, n) in &new.wants {
        if let Some(max) = config[label].max_nodes
            && n > max
        {
            return Some(Refused::OverCap(format!(
                "asks for {n} nodes of label `{}`, over its max-nodes {max}",
                config[label].name
            )));
        }
    }
    None
}
