//! Why a pending request waits, in one place: for each of its nodes not
//! handed out yet, what it waits for (a create, a boot, a readiness probe,
//! a backing instance), and for the nodes it has none for yet, what keeps
//! each provider offering them from launching one (a limit, a quota or
//! capacity pause, a rate limit, a provider not listed yet) — worked out
//! by the same checks the plan makes ([`Pool::blocked`]), so what is shown
//! is what holds it back.

use super::choice::Tally;
use super::*;
use crate::config::Offer;

/// What keeps an offer from launching a node now.
#[derive(Clone, Debug, PartialEq)]
pub enum Blocked {
    /// The provider has not been listed since berth started (its driver is
    /// starting, or cannot start, or its lists fail).
    NotListed,
    /// The store cannot vouch for the provider's instances: it creates
    /// nothing until an operator adopts them.
    StoreMismatch,
    /// The cloud said its quota is exhausted: no create until then.
    QuotaPaused(Time),
    /// The cloud's rate limit: no call until then.
    RateLimited(Time),
    /// The cloud had no capacity for the instance type: none until then.
    Capacity(Time),
    /// One of the provider's own limits (`[providers.X.limits]`) is
    /// reached: `used` of `max` (instances, cores, or MiB of RAM).
    Limit { what: Limit, used: u64, max: u64 },
}

/// Which of a provider's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
pub enum Limit {
    MaxInstances,
    MaxCores,
    MaxRam,
}

/// One thing a pending request waits for.
#[derive(Clone, Debug, PartialEq)]
pub struct Wait {
    /// The label of the nodes that wait.
    pub label: LabelIx,
    /// How many of its nodes wait for it.
    pub nodes: u32,
    /// The node set aside for the request that waits, if one is.
    pub node: Option<NodeId>,
    /// The provider concerned, if one is.
    pub provider: Option<ProviderIx>,
    pub reason: WaitReason,
}

/// What a pending request's node, or its nodes to come, wait for.
#[derive(Clone, Debug, PartialEq)]
pub enum WaitReason {
    /// Its create is stored; the call waits or is under way.
    Creating { since: Time },
    /// A slot node: its backing instance is not running yet.
    Backing { backing: NodeId },
    /// Its instance exists and is not running yet.
    Booting { since: Time },
    /// Its instance runs; its readiness probe has not passed yet.
    Probing {
        since: Time,
        attempts: u32,
        last_error: Option<String>,
    },
    /// Ready, waiting for the request's other nodes.
    Others,
    /// Nodes not launched yet: what keeps this provider from launching one.
    Blocked(Blocked),
    /// No provider still offers the label (each was removed from the
    /// config).
    NoProvider,
    /// Each label of the request would fit on its own, but not all of them
    /// together, within the providers' limits.
    Together,
    /// There is room, but it is kept for `request`, ahead in the serving
    /// order, which has waited past `reserve-after`.
    Kept { request: RequestId },
    /// Its nodes would take its requestor, or one of its labels, over a
    /// cap (`max-nodes`): it waits until enough is given back.
    Cap(Cap),
    /// Nothing holds it back: the next step serves it.
    Next,
}

impl WaitReason {
    /// A short, stable name: `creating`, `backing`, `booting`, `probing`,
    /// `others`, `not-listed`, `store-mismatch`, `quota`, `rate-limit`,
    /// `capacity`, `limit`, `no-provider`, `together`, `kept`, `cap`,
    /// `next`.
    pub fn name(&self) -> &'static str {
        match self {
            WaitReason::Creating { .. } => "creating",
            WaitReason::Backing { .. } => "backing",
            WaitReason::Booting { .. } => "booting",
            WaitReason::Probing { .. } => "probing",
            WaitReason::Others => "others",
            WaitReason::Blocked(b) => match b {
                Blocked::NotListed => "not-listed",
                Blocked::StoreMismatch => "store-mismatch",
                Blocked::QuotaPaused(_) => "quota",
                Blocked::RateLimited(_) => "rate-limit",
                Blocked::Capacity(_) => "capacity",
                Blocked::Limit { .. } => "limit",
            },
            WaitReason::NoProvider => "no-provider",
            WaitReason::Together => "together",
            WaitReason::Kept { .. } => "kept",
            WaitReason::Cap(_) => "cap",
            WaitReason::Next => "next",
        }
    }

    /// Until when it waits, if that is known.
    pub fn until(&self) -> Option<Time> {
        match self {
            WaitReason::Blocked(
                Blocked::QuotaPaused(t) | Blocked::RateLimited(t) | Blocked::Capacity(t),
            ) => Some(*t),
            _ => None,
        }
    }
}

impl Pool {
    /// What keeps offer `o` from launching one more node within `tally`,
    /// now, but the plan keeping its provider for requests ahead
    /// (`Tally::closed`); `None` if nothing does.
    pub(super) fn blocked(&self, o: &Offer, tally: &Tally, now: Time) -> Option<Blocked> {
        let p = o.provider.0 as usize;
        let rt = &self.ix.providers[p];
        if !rt.listed {
            return Some(Blocked::NotListed);
        }
        if rt.mismatch.is_some() {
            return Some(Blocked::StoreMismatch);
        }
        if let Some(paused) = self.paused(o.provider, &o.instance_type, now) {
            return Some(paused);
        }
        let limits = &self.config[o.provider].limits;
        let (u, extra, credit) = (rt.usage, tally.extra[p], tally.credit[p]);
        // What the provider would hold with one more node: what it holds,
        // what the plan adds, the node, less what the plan frees.
        let with = |usage: u64, extra: u64, adds: u64, credit: u64| {
            (usage + extra + adds).saturating_sub(credit)
        };
        let checks = [
            (
                Limit::MaxInstances,
                1,
                with(
                    u.instances.into(),
                    extra.instances.into(),
                    1,
                    credit.instances.into(),
                ),
                limits.max_instances.map(u64::from),
            ),
            (
                Limit::MaxCores,
                u64::from(o.vcpus),
                with(
                    u.vcpus.into(),
                    extra.vcpus.into(),
                    o.vcpus.into(),
                    credit.vcpus.into(),
                ),
                limits.max_cores.map(u64::from),
            ),
            (
                Limit::MaxRam,
                o.ram_mib,
                with(u.ram_mib, extra.ram_mib, o.ram_mib, credit.ram_mib),
                limits.max_ram_mib,
            ),
        ];
        (checks.into_iter()).find_map(|(what, adds, total, max)| {
            let max = max.filter(|&max| total > max)?;
            Some(Blocked::Limit {
                what,
                used: total.saturating_sub(adds),
                max,
            })
        })
    }

    /// Whether provider `p` makes no create of `instance_type` now, the
    /// cloud having said so: its quota, its rate limit, or no capacity.
    fn paused(&self, p: ProviderIx, instance_type: &str, now: Time) -> Option<Blocked> {
        let rt = &self.ix.providers[p.0 as usize];
        if let Some(t) = rt.quota_paused_until.filter(|t| *t > now) {
            return Some(Blocked::QuotaPaused(t));
        }
        if let Some(t) = rt.held_until.filter(|t| *t > now) {
            return Some(Blocked::RateLimited(t));
        }
        (rt.capacity_paused.iter())
            .filter(|(ty, until)| *until > now && ty.as_ref().is_none_or(|ty| ty == instance_type))
            .map(|(_, until)| *until)
            .max()
            .map(Blocked::Capacity)
    }

    /// Why request `id` waits, as of the last step; empty unless it is
    /// pending. Its nodes set aside come first, each with what it waits
    /// for; then, per label, what keeps its nodes to come from being
    /// launched, once per provider offering them.
    pub fn waiting(&self, id: RequestId) -> Vec<Wait> {
        let Some(req) = self.requests.get(&id) else {
            return Vec::new();
        };
        if req.state != RequestState::Pending {
            return Vec::new();
        }
        let now = self.last_tick;
        let mut waits: Vec<Wait> = (req.nodes.iter())
            .filter_map(|n| self.nodes.get(n))
            .map(|n| Wait {
                label: n.label,
                nodes: 1,
                node: Some(n.id),
                provider: Some(n.provider),
                reason: self.node_waits(n),
            })
            .collect();
        // Over a cap, it is not planned at all: that is all it waits for.
        if let Some(held) = self.held(Some((req.priority, req.created, req.id)))
            && let Some(cap) = self.over_cap(req, &held)
        {
            let label = match &cap {
                Cap::Label { label, .. } => Some(*label),
                Cap::Requestor { .. } => req.wants.first().map(|&(l, _)| l),
            };
            if let Some(label) = label {
                waits.push(Wait {
                    label,
                    nodes: self.still_to_launch(req),
                    node: None,
                    provider: None,
                    reason: WaitReason::Cap(cap),
                });
            }
            return waits;
        }
        let mut fits_alone = true;
        for &(label, count) in &req.wants {
            let missing = self.still_missing(req, label);
            if missing == 0 {
                continue;
            }
            // The plan for this label alone: what it takes and launches
            // before it finds no room, if it does.
            let alone = Request {
                wants: vec![(label, count)],
                ..req.clone()
            };
            let mut tally = self.tally();
            if self.steps(&alone, &mut tally, now).is_ok() {
                continue;
            }
            fits_alone = false;
            let launches = missing.saturating_sub(self.free_for(label)).max(1);
            let offers: Vec<&Offer> = (self.offers_of(label).iter())
                .filter(|o| !self.config[o.provider].retired)
                .collect();
            if offers.is_empty() {
                waits.push(Wait {
                    label,
                    nodes: launches,
                    node: None,
                    provider: None,
                    reason: WaitReason::NoProvider,
                });
                continue;
            }
            // Every offer is blocked once the part's own launches are
            // counted: why, per provider.
            waits.extend(offers.iter().filter_map(|o| {
                Some(Wait {
                    label,
                    nodes: launches,
                    node: None,
                    provider: Some(o.provider),
                    reason: WaitReason::Blocked(self.blocked(o, &tally, now)?),
                })
            }));
        }
        let to_launch = self.still_to_launch(req);
        let first = req.wants.first().map(|&(label, _)| label);
        if let (true, true, Some(label)) = (fits_alone, to_launch > 0, first) {
            // Each label alone has room: all of them together do, or not.
            let place = (req.priority, req.created, req.id);
            let kept_for = (self.kept.iter()).find(|k| k.place < place);
            let reason = if self.steps(req, &mut self.tally(), now).is_err() {
                WaitReason::Together
            } else if let Some(kept) = kept_for
                && self.steps(req, &mut self.kept_ahead(place), now).is_err()
            {
                WaitReason::Kept {
                    request: kept.place.2,
                }
            } else {
                WaitReason::Next
            };
            waits.push(Wait {
                label,
                nodes: to_launch,
                node: None,
                provider: None,
                reason,
            });
        }
        waits
    }

    /// What a node set aside for a pending request waits for.
    fn node_waits(&self, n: &Node) -> WaitReason {
        match (&n.state, &n.packing) {
            (NodeState::Creating { .. }, Packing::Slot { backing, .. }) => {
                WaitReason::Backing { backing: *backing }
            }
            // Its create waits for the cloud's pause, if there is one.
            (NodeState::Creating { since, .. }, _) => {
                match self.paused(n.provider, &n.instance_type, self.last_tick) {
                    Some(paused) => WaitReason::Blocked(paused),
                    None => WaitReason::Creating { since: *since },
                }
            }
            (NodeState::Booting { since }, _) => match self.probing(n.id) {
                Some(p) => WaitReason::Probing {
                    since: p.since,
                    attempts: p.attempts,
                    last_error: p.last_error.clone(),
                },
                None => WaitReason::Booting { since: *since },
            },
            _ => WaitReason::Others,
        }
    }

    /// How many free nodes of `label` a request would be given now: ready
    /// or launching, or for a slot label, free slots.
    fn free_for(&self, label: LabelIx) -> u32 {
        let rt = &self.ix.labels[label.0 as usize];
        let free = match &self.config[label].kind {
            LabelKind::Machine { .. } => rt.free_ready.len() + rt.free_launching.len(),
            LabelKind::Slots { .. } => self.free_slot_list(label).len(),
        };
        u32::try_from(free).unwrap_or(u32::MAX)
    }

    /// How many of `req`'s nodes have none set aside yet.
    pub(super) fn still_to_launch(&self, req: &Request) -> u32 {
        (req.wants.iter())
            .map(|&(label, _)| self.still_missing(req, label))
            .sum()
    }
}
