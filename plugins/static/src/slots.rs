//! Allocating the hosts' slots to berth's nodes. Everything lives in the
//! host's records (see `records`); nothing is kept in memory between calls,
//! since the host runs several instances of the driver side by side and any
//! of them may serve the next call.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use berth_sdk::error;
use berth_sdk::tags::{self, POOL_TAG};
use berth_sdk::types::{
    AccountLimits, Addresses, Connection, CreateSpec, Error, Instance, InstanceState, Tags,
};

use crate::config::{Config, Host};
use crate::env::Env;
use crate::records::{HostSnapshot, Record, SLOT_PREFIX, SlotId, Stored, node_key};

/// How often a call tries again after losing a compare-and-swap. Each loss
/// means another call changed the same records, so the retries are bounded
/// by other calls' progress; this only stops a pathological storm.
const MAX_TRIES: usize = 64;

/// The configured driver: its pool and its hosts.
pub(crate) struct Slots {
    pub pool_id: String,
    pub config: Config,
}

/// Who holds a node's index after a create's claim.
enum Claim {
    /// This create: its slot serves the node.
    Ours,
    /// Another create for the same node id got there first, with this slot.
    Theirs {
        slot: SlotId,
        text: String,
        // Boxed: a create holds this only in the rare race it decides.
        record: Box<Record>,
    },
}

impl Slots {
    /// Takes a free slot on a host serving `spec.instance_type`, or returns
    /// the slot a previous create for the same node id took.
    ///
    /// The slot is claimed with compare-and-swap from absent, so no two
    /// creates ever share one. Two creates for the same node id at once
    /// (berth never sends them, but a driver must not double-book if it
    /// did) may each claim a slot; the node's index key then decides: the
    /// create that sets it keeps its slot, the other frees its own and
    /// returns the winner's.
    pub fn create(&self, env: &impl Env, spec: &CreateSpec) -> Result<Instance, Error> {
        check_label_options(&spec.options)?;
        let node_key = node_key(&self.pool_id, &spec.node_id)?;
        let ty = &spec.instance_type;
        for _ in 0..MAX_TRIES {
            let taken = self.scan(env)?;
            let first = taken.iter().find_map(|s| {
                s.of_pool(&self.pool_id)
                    .filter(|r| r.node == spec.node_id)
                    .map(|r| (s, r))
            });
            if let Some((first, record)) = first {
                // A retried create. A first attempt stopped between its two
                // writes has no index yet; set it, or leave whatever another
                // call set meanwhile.
                env.compare_and_swap(&node_key, None, Some(&first.slot.to_string()))?;
                return Ok(self.instance(
                    env,
                    &first.slot,
                    &first.text,
                    record,
                    &mut Probes::new(),
                ));
            }
            if !self.config.hosts.iter().any(|h| h.serves(ty)) {
                return Err(error::invalid_config(format!(
                    "instance type {ty:?}: no host lists it in its `labels`"
                )));
            }
            let Some((slot, host)) = choose(&self.config, &taken, ty) else {
                return Err(error::capacity_for_type(
                    ty.clone(),
                    format!("every slot of the hosts serving {ty:?} is taken"),
                ));
            };
            let now = env.now_ms();
            let record = Record {
                pool: self.pool_id.clone(),
                node: spec.node_id.clone(),
                instance_type: ty.clone(),
                tags: self.pool_tags(&spec.tags),
                created_at_ms: now,
                // Without a ready check, a host is ready as configured.
                ready_at_ms: host.ready_check.is_none().then_some(now),
                host: snapshot(host),
            };
            let text = record.encode()?;
            if !env.compare_and_swap(&slot.key(), None, Some(&text))? {
                // Another call took that slot first: choose again.
                continue;
            }
            return match self.claim_node(env, &node_key, &slot, &spec.node_id)? {
                Claim::Ours => {
                    env.debug(
                        "slot allocated",
                        &[("instance", &slot.to_string()), ("node", &spec.node_id)],
                    );
                    Ok(self.instance(env, &slot, &text, &record, &mut Probes::new()))
                }
                Claim::Theirs {
                    slot: their_slot,
                    text: their_text,
                    record: their_record,
                } => {
                    env.compare_and_swap(&slot.key(), Some(&text), None)?;
                    Ok(self.instance(
                        env,
                        &their_slot,
                        &their_text,
                        &their_record,
                        &mut Probes::new(),
                    ))
                }
            };
        }
        Err(contended("create"))
    }

    /// Sets the node's index to `slot` unless a live claim for the same
    /// node holds it.
    fn claim_node(
        &self,
        env: &impl Env,
        key: &str,
        slot: &SlotId,
        node: &str,
    ) -> Result<Claim, Error> {
        let ours = slot.to_string();
        for _ in 0..MAX_TRIES {
            if env.compare_and_swap(key, None, Some(&ours))? {
                return Ok(Claim::Ours);
            }
            let Some(current) = env.get(key)? else {
                continue; // removed meanwhile: claim again
            };
            if current == ours {
                return Ok(Claim::Ours);
            }
            if let Some(other) = SlotId::parse(&current)
                && let Some(text) = env.get(&other.key())?
                && let Ok(record) = Record::decode(&text)
                && record.pool == self.pool_id
                && record.node == node
            {
                return Ok(Claim::Theirs {
                    slot: other,
                    text,
                    record: Box::new(record),
                });
            }
            // An index whose slot no longer serves the node, left by a call
            // that stopped half-way: take it over.
            if env.compare_and_swap(key, Some(&current), Some(&ours))? {
                return Ok(Claim::Ours);
            }
        }
        Err(contended("create"))
    }

    /// The pool's slots whose tags carry every `filter` pair.
    pub fn list(
        &self,
        env: &impl Env,
        filter: &[(String, String)],
    ) -> Result<Vec<Instance>, Error> {
        // A filter naming another pool matches nothing this driver may see.
        if filter
            .iter()
            .any(|(k, v)| k == POOL_TAG && *v != self.pool_id)
        {
            return Ok(vec![]);
        }
        let mut probes = Probes::new();
        let mut out = Vec::new();
        for stored in self.scan(env)? {
            let Some(record) = stored.of_pool(&self.pool_id) else {
                continue;
            };
            if tags::has_all(&record.tags, filter) {
                out.push(self.instance(env, &stored.slot, &stored.text, record, &mut probes));
            }
        }
        Ok(out)
    }

    /// The pool's slots among `ids`, each read by its key.
    pub fn get(&self, env: &impl Env, ids: &[String]) -> Result<Vec<Instance>, Error> {
        let mut probes = Probes::new();
        let mut out = Vec::new();
        for id in ids {
            let Some(slot) = SlotId::parse(id) else {
                continue;
            };
            let Some(text) = env.get(&slot.key())? else {
                continue;
            };
            let stored = Stored {
                record: Record::decode(&text),
                slot,
                text,
            };
            if let Some(record) = stored.of_pool(&self.pool_id) {
                out.push(self.instance(env, &stored.slot, &stored.text, record, &mut probes));
            }
        }
        Ok(out)
    }

    /// Frees a slot of this pool; `not-found` when none is allocated under
    /// `id`. The node's index goes first: a call stopped between the two
    /// writes then leaves a slot record without an index (which a retried
    /// delete or create handles), never an index naming a free slot.
    pub fn delete(&self, env: &impl Env, id: &str) -> Result<(), Error> {
        let slot = SlotId::parse(id).ok_or_else(|| self.not_found(id))?;
        let canonical = slot.to_string();
        for _ in 0..MAX_TRIES {
            let Some(text) = env.get(&slot.key())? else {
                return Err(self.not_found(id));
            };
            let record = Record::decode(&text).map_err(|e| unreadable(&slot, &e))?;
            if record.pool != self.pool_id {
                return Err(self.not_found(id));
            }
            let index = node_key(&self.pool_id, &record.node)?;
            if env.get(&index)?.as_deref() == Some(canonical.as_str()) {
                env.compare_and_swap(&index, Some(&canonical), None)?;
            }
            if env.compare_and_swap(&slot.key(), Some(&text), None)? {
                env.debug(
                    "slot freed",
                    &[("instance", &canonical), ("node", &record.node)],
                );
                return Ok(());
            }
            // The record changed meanwhile (tags, readiness): read it again.
        }
        Err(contended("delete"))
    }

    /// Replaces the slot's berth tags with `new` (the SDK's rule), keeping
    /// the pool tag. Retries when another call changed the record meanwhile.
    pub fn set_tags(
        &self,
        env: &impl Env,
        id: &str,
        new: &[(String, String)],
    ) -> Result<(), Error> {
        if new.iter().any(|(k, v)| k == POOL_TAG && *v != self.pool_id) {
            return Err(error::permanent(
                "set-tags cannot move an instance to another pool",
            ));
        }
        let mut wanted = new.to_vec();
        if !wanted.iter().any(|(k, _)| k == POOL_TAG) {
            wanted.push((POOL_TAG.to_owned(), self.pool_id.clone()));
        }
        let slot = SlotId::parse(id).ok_or_else(|| self.not_found(id))?;
        for _ in 0..MAX_TRIES {
            let Some(text) = env.get(&slot.key())? else {
                return Err(self.not_found(id));
            };
            let mut record = Record::decode(&text).map_err(|e| unreadable(&slot, &e))?;
            if record.pool != self.pool_id {
                return Err(self.not_found(id));
            }
            let tags = tags::replace_berth_tags(&record.tags, &wanted);
            if tags == record.tags {
                return Ok(());
            }
            record.tags = tags;
            if env.compare_and_swap(&slot.key(), Some(&text), Some(&record.encode()?))? {
                return Ok(());
            }
        }
        Err(contended("set-tags"))
    }

    /// Every configured slot, and every taken one (of any pool sharing this
    /// provider's records, and on hosts since removed from the config: they
    /// all hold a share of a machine until freed).
    pub fn limits(&self, env: &impl Env) -> Result<AccountLimits, Error> {
        let used = self.scan(env)?.len();
        Ok(AccountLimits {
            max_instances: Some(self.config.slots()),
            used_instances: Some(u32::try_from(used).unwrap_or(u32::MAX)),
            max_cores: None,
            used_cores: None,
            max_ram_mib: None,
            used_ram_mib: None,
        })
    }

    /// Every slot record, of every pool. An unreadable one is kept: its slot
    /// stays taken, but it is nobody's instance.
    fn scan(&self, env: &impl Env) -> Result<Vec<Stored>, Error> {
        let mut out = Vec::new();
        for (key, text) in env.scan(SLOT_PREFIX)? {
            let Some(slot) = SlotId::from_key(&key) else {
                env.warn("ignoring a record with an unexpected key", &[("key", &key)]);
                continue;
            };
            let record = Record::decode(&text);
            if let Err(e) = &record {
                env.warn(
                    "slot record unreadable; the slot stays taken",
                    &[("instance", &slot.to_string()), ("error", e)],
                );
            }
            out.push(Stored { slot, text, record });
        }
        Ok(out)
    }

    /// The create's tags with this pool's tag, whatever the spec said.
    fn pool_tags(&self, spec: &[(String, String)]) -> Tags {
        let mut tags: Tags = spec
            .iter()
            .filter(|(k, v)| k != POOL_TAG || *v == self.pool_id)
            .cloned()
            .collect();
        if !tags.iter().any(|(k, _)| k == POOL_TAG) {
            tags.push((POOL_TAG.to_owned(), self.pool_id.clone()));
        }
        tags
    }

    /// A slot as berth sees it. Connection details come from the config
    /// while the host is in it (an operator's fix shows at once), from the
    /// record's snapshot once it has left.
    fn instance(
        &self,
        env: &impl Env,
        slot: &SlotId,
        text: &str,
        record: &Record,
        probes: &mut Probes,
    ) -> Instance {
        let state = self.state(env, slot, text, record, probes);
        let (address, connection) = match self.config.host(&slot.host) {
            Some(h) => (
                h.address.to_string(),
                Connection {
                    username: h.username.clone(),
                    port: Some(h.port),
                    host_keys: h.host_keys.clone(),
                },
            ),
            None => (
                record.host.address.clone(),
                Connection {
                    username: record.host.username.clone(),
                    port: record.host.port,
                    host_keys: record.host.host_keys.clone(),
                },
            ),
        };
        Instance {
            id: slot.to_string(),
            state,
            instance_type: record.instance_type.clone(),
            tags: record.tags.clone(),
            addresses: addresses(&address),
            created_at_ms: Some(record.created_at_ms),
            connection,
        }
    }

    /// `running` once the host has answered its ready check (remembered in
    /// the record, so a ready node never goes back to `pending`), `pending`
    /// until then. Each host is probed at most once per call.
    fn state(
        &self,
        env: &impl Env,
        slot: &SlotId,
        text: &str,
        record: &Record,
        probes: &mut Probes,
    ) -> InstanceState {
        if record.ready_at_ms.is_some() {
            return InstanceState::Running;
        }
        // A host that left the config before it ever answered has nothing
        // to probe: it stays pending until berth gives up and deletes it.
        let Some(host) = self.config.host(&slot.host) else {
            return InstanceState::Pending;
        };
        let Some(check) = host.ready_check else {
            return InstanceState::Running; // the check was removed from the config
        };
        let answered = *probes.entry(host.name.clone()).or_insert_with(|| {
            match env.probe(&host.address.to_string(), check.port, check.timeout_ms) {
                Ok(()) => true,
                Err(e) => {
                    env.debug(
                        "ready check: no answer yet",
                        &[("host", &host.name), ("error", &e)],
                    );
                    false
                }
            }
        });
        if !answered {
            return InstanceState::Pending;
        }
        // Remember it; if the record changed meanwhile, the next call probes
        // again, which is harmless.
        let ready = Record {
            ready_at_ms: Some(env.now_ms()),
            ..record.clone()
        };
        let remembered = ready
            .encode()
            .and_then(|new| env.compare_and_swap(&slot.key(), Some(text), Some(&new)));
        if let Err(e) = remembered {
            env.warn(
                "could not record that a host is ready",
                &[
                    ("instance", &slot.to_string()),
                    ("error", &format!("{e:?}")),
                ],
            );
        }
        InstanceState::Running
    }

    fn not_found(&self, id: &str) -> Error {
        error::not_found(format!(
            "no slot {id:?} is allocated to pool {:?}",
            self.pool_id
        ))
    }
}

/// Whether each host answered its ready check, within one call.
type Probes = BTreeMap<String, bool>;

/// The slot a create of `instance_type` takes: on the host serving it that
/// runs the fewest jobs (the first in config order among equals), its lowest
/// free index. Every taken slot counts, whatever its pool, including indexes
/// beyond a `max-parallel-jobs` lowered since they were taken.
pub(crate) fn choose<'c>(
    config: &'c Config,
    taken: &[Stored],
    instance_type: &str,
) -> Option<(SlotId, &'c Host)> {
    config
        .hosts
        .iter()
        .filter(|h| h.serves(instance_type))
        .filter_map(|h| {
            let used: BTreeSet<u32> = taken
                .iter()
                .filter(|s| s.slot.host == h.name)
                .map(|s| s.slot.index)
                .collect();
            if used.len() >= h.max_jobs as usize {
                return None;
            }
            let index = (0..h.max_jobs).find(|i| !used.contains(i))?;
            Some((used.len(), index, h))
        })
        // `min_by_key` keeps the first of equals: config order.
        .min_by_key(|(jobs, _, _)| *jobs)
        .map(|(_, index, h)| {
            (
                SlotId {
                    host: h.name.clone(),
                    index,
                },
                h,
            )
        })
}

fn snapshot(host: &Host) -> HostSnapshot {
    HostSnapshot {
        address: host.address.to_string(),
        username: host.username.clone(),
        port: Some(host.port),
        host_keys: host.host_keys.clone(),
    }
}

/// Where the contract wants an address: private or public IPv4, IPv6, or a
/// host name.
fn addresses(address: &str) -> Addresses {
    let mut out = Addresses {
        public_ipv4: None,
        private_ipv4: None,
        ipv6: None,
        hostname: None,
    };
    match address.parse::<IpAddr>() {
        Ok(IpAddr::V4(v4)) => {
            let [a, b, ..] = v4.octets();
            let shared = a == 100 && (64..128).contains(&b); // RFC 6598
            if v4.is_private() || v4.is_loopback() || shared {
                out.private_ipv4 = Some(address.to_owned());
            } else {
                out.public_ipv4 = Some(address.to_owned());
            }
        }
        Ok(IpAddr::V6(_)) => out.ipv6 = Some(address.to_owned()),
        Err(_) => out.hostname = Some(address.to_owned()),
    }
    out
}

/// Static hosts take no label options: `{}` only, and any key is named back.
fn check_label_options(options: &str) -> Result<(), Error> {
    let value: serde_json::Value = serde_json::from_str(options)
        .map_err(|e| error::invalid_config(format!("label options: {e}")))?;
    match value {
        serde_json::Value::Object(map) => match map.keys().next() {
            None => Ok(()),
            Some(key) => Err(error::invalid_config(format!(
                "label options: unknown option {key:?}; static hosts take none"
            ))),
        },
        _ => Err(error::invalid_config(
            "label options: must be a JSON object",
        )),
    }
}

fn unreadable(slot: &SlotId, e: &str) -> Error {
    error::permanent(format!(
        "slot {slot}: its record is unreadable ({e}); it stays taken"
    ))
}

fn contended(call: &str) -> Error {
    error::transient(format!(
        "{call}: the slot records kept changing under this call; try again"
    ))
}

#[cfg(test)]
mod tests;
