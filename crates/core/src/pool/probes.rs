//! Readiness: a node whose instance runs is handed out only once its label's
//! check (`ready`) passes. For `tcp` and `ssh` the host probes the instance
//! ([`Effect::Probe`]); the node stays `booting` until a probe succeeds, and a
//! failed probe is tried again at growing gaps until the label's
//! `boot-timeout` gives the launch up as a failed try.
//!
//! Nothing here is stored: a node still probing when berth stops is booting
//! in the store, and the first list after the start finds its instance
//! running and probes it again.

use std::time::Duration;

use super::*;
use crate::config::{Check, Readiness};
use crate::driver::Instance;

/// The first gap after a failed probe; each next one doubles, up to
/// [`PROBE_RETRY_MAX`].
pub const PROBE_RETRY_FIRST: Duration = Duration::from_millis(100);
/// The longest gap between a failed probe and the next.
pub const PROBE_RETRY_MAX: Duration = Duration::from_secs(1);

/// A node whose instance runs and whose readiness is being probed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probing {
    /// When its instance was first seen running.
    pub since: Time,
    /// Probes that ended, failed or not.
    pub attempts: u32,
    /// Why the last probe failed.
    pub last_error: Option<String>,
    /// When the next probe may start.
    next: Time,
    /// Whether a probe is under way.
    in_flight: bool,
}

/// What a probe is to reach and check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeTarget {
    /// `Tcp` or `Ssh`, never `Running`.
    pub check: Check,
    /// The instance's addresses as its cloud reported them; the host
    /// probes only these, and refuses those no probe may reach.
    pub addresses: crate::driver::Addresses,
    pub port: u16,
    /// How long the probe may take.
    pub timeout: Duration,
}

/// Why an SSH probe's host keys are not believed, if they are not: the cloud
/// reported keys for the instance and the server showed none of them.
pub fn host_keys_mismatch(known: &[String], shown: &[String]) -> Option<String> {
    let key = |k: &String| -> String {
        // `TYPE BASE64 [COMMENT]`: the comment is not part of the key.
        k.split_whitespace().take(2).collect::<Vec<_>>().join(" ")
    };
    if known.is_empty() || shown.iter().any(|s| known.iter().any(|k| key(k) == key(s))) {
        return None;
    }
    Some(format!(
        "the server showed host keys ({}) that are not the ones the cloud reported for the instance",
        shown.iter().map(key).collect::<Vec<_>>().join(", ")
    ))
}

impl Pool {
    /// The readiness of node `id`'s label.
    fn readiness(&self, id: NodeId) -> Option<Readiness> {
        let node = self.nodes.get(&id)?;
        Some(self.config[node.label].ready)
    }

    /// Node `id`'s instance runs: it is ready now, or once a probe passes.
    pub(super) fn running(&mut self, id: NodeId, now: Time) {
        match self.readiness(id).map(|r| r.check) {
            None => {}
            Some(Check::Running) => self.set_ready(id, now),
            Some(Check::Tcp | Check::Ssh) => {
                let Some(node) = self.nodes.get(&id) else {
                    return;
                };
                if let NodeState::Creating { since, .. } = node.state {
                    // Its boot timeout runs from its create, as for any boot.
                    self.set_booting(id, since, now);
                }
                self.probes.entry(id).or_insert(Probing {
                    since: now,
                    attempts: 0,
                    last_error: None,
                    next: now,
                    in_flight: false,
                });
            }
        }
    }

    /// How node `id`'s readiness probes stand, while it is probed.
    pub fn probing(&self, id: NodeId) -> Option<&Probing> {
        self.probes.get(&id)
    }

    /// Whether node `id`'s instance runs and is being probed.
    pub(super) fn is_probed(&self, id: NodeId) -> bool {
        self.probes.contains_key(&id)
    }

    /// The probes due by `now`, claimed (one at a time per node). Nodes no
    /// longer booting are forgotten here.
    pub(super) fn emit_probes(&mut self, now: Time, out: &mut Vec<Effect>) {
        let nodes = &self.nodes;
        self.probes.retain(|id, _| {
            nodes
                .get(id)
                .is_some_and(|n| matches!(n.state, NodeState::Booting { .. }))
        });
        let due: Vec<NodeId> = (self.probes.iter())
            .filter(|(_, p)| !p.in_flight && p.next <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let Some(target) = self.probe_target(id) else {
                continue;
            };
            let node = &self.nodes[&id];
            out.push(Effect::Probe(Probe {
                provider: node.provider,
                node: id,
                instance: node.instance.clone().unwrap_or_default(),
                target,
            }));
            if let Some(p) = self.probes.get_mut(&id) {
                p.in_flight = true;
            }
        }
    }

    /// When the next probe is due, if one waits.
    pub(super) fn next_probe(&self) -> Option<Time> {
        (self.probes.values())
            .filter(|p| !p.in_flight)
            .map(|p| p.next)
            .min()
    }

    fn probe_target(&self, id: NodeId) -> Option<ProbeTarget> {
        let node = self.nodes.get(&id)?;
        let ready = self.config[node.label].ready;
        let endpoint = node.endpoint.as_deref();
        let port = ready
            .port
            .or_else(|| endpoint.and_then(|e| e.connection.port))
            .unwrap_or(Readiness::DEFAULT_PORT);
        Some(ProbeTarget {
            check: ready.check,
            addresses: endpoint.map(|e| e.addresses.clone()).unwrap_or_default(),
            port,
            timeout: ready.timeout,
        })
    }

    /// A probe of node `id` ended: with the host keys it was shown (none
    /// for `tcp`), or why it failed. Where the cloud reported host keys for
    /// the instance, an SSH server that shows none of them has failed.
    pub fn probed(&mut self, id: NodeId, result: Result<Vec<String>, String>, now: Time) {
        let node = self.nodes.get(&id);
        let booting = matches!(node.map(|n| &n.state), Some(NodeState::Booting { .. }));
        let known = node
            .and_then(|n| n.endpoint.as_deref())
            .map_or(&[][..], |e| &e.connection.host_keys[..]);
        let result = result.and_then(|keys| match host_keys_mismatch(known, &keys) {
            Some(why) => Err(why),
            None => Ok(keys),
        });
        let Some(p) = self.probes.get_mut(&id).filter(|p| p.in_flight) else {
            return;
        };
        p.in_flight = false;
        p.attempts += 1;
        if !booting {
            self.probes.remove(&id);
            return;
        }
        match result {
            Ok(keys) => {
                self.probes.remove(&id);
                if !keys.is_empty() {
                    self.update(id, |n| {
                        let e = n.endpoint.get_or_insert_with(Default::default);
                        e.connection.host_keys = keys;
                    });
                }
                self.set_ready(id, now);
            }
            Err(why) => {
                let shift = p.attempts.saturating_sub(1).min(16);
                let gap = (PROBE_RETRY_FIRST * (1u32 << shift)).min(PROBE_RETRY_MAX);
                p.next = now + gap;
                p.last_error = Some(why);
            }
        }
    }

    /// The last probe error of node `id`, for the reason its launch failed.
    pub(super) fn probe_error(&self, id: NodeId) -> Option<String> {
        let p = self.probes.get(&id)?;
        Some(match &p.last_error {
            Some(e) => format!("{} probes failed, the last: {e}", p.attempts),
            None => "its first probe had not ended".to_owned(),
        })
    }

    /// Whether an instance's details change what is kept of node `id`'s:
    /// host keys found by a probe stay while the cloud reports none.
    pub(super) fn endpoint_changed(&self, id: NodeId, inst: &Instance) -> bool {
        self.nodes.get(&id).is_some_and(|n| {
            n.instance.as_deref() != Some(inst.id.as_str())
                || n.endpoint.as_deref().is_none_or(|e| {
                    e.addresses != inst.addresses
                        || e.connection.username != inst.connection.username
                        || e.connection.port != inst.connection.port
                        || (!inst.connection.host_keys.is_empty()
                            && e.connection.host_keys != inst.connection.host_keys)
                })
        })
    }
}
