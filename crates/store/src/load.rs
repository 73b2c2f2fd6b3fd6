//! Reading everything stored into a [`Loaded`] snapshot, checked against the
//! config and against itself: each slot assignment must join a live slot
//! node to a backing node that has that slot. A backend reads its tables
//! into [`Tables`]; everything after that is here, once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use super::error::StoreError;
use super::rows::{NodeRow, RawNodeRow, RequestRow, read_metadata_text};
use super::store::Loaded;
use super::value::{Cells, Reader};
use super::write::{Versioned, Versions};
use berth_core::config::Config;
use berth_core::pool::{
    GoneReason, Identity, Metadata, Node, NodeId, NodeState, Packing, Request, RequestId,
    RequestState, RequestorLease, Snapshot, Time,
};

/// The queries a load runs, in one read transaction, in this order;
/// [`Tables::read`] takes the rows of each by its position here. Three
/// read the rows' versions, which a commit is conditional on; the last the
/// store's identity.
pub(super) fn queries() -> [String; 10] {
    [
        format!("SELECT {} FROM nodes", NodeRow::COLUMNS),
        "SELECT backing, idx, node FROM slots ORDER BY backing, idx".into(),
        format!("SELECT {} FROM requests", RequestRow::COLUMNS),
        "SELECT request, label, count FROM request_wants ORDER BY request, position".into(),
        "SELECT request, node FROM request_nodes ORDER BY request, position".into(),
        "SELECT requestor, expires, ttl FROM leases ORDER BY requestor".into(),
        VERSIONED[0].query().into(),
        VERSIONED[1].query().into(),
        VERSIONED[2].query().into(),
        "SELECT 'identity', generation, key, confirmed FROM pool_identity".into(),
    ]
}

/// The versioned tables, in the order [`queries`] reads their versions.
const VERSIONED: [Versioned; 3] = [
    Versioned::Nodes,
    Versioned::Requests,
    Versioned::RequestorLeases,
];

/// Every stored row, as read, before any of it is checked.
#[derive(Default)]
pub(super) struct Tables {
    /// Every versioned row's version, whether or not the row loads.
    pub versions: Versions,
    nodes: Vec<RawNodeRow>,
    /// (backing, index, node)
    slots: Vec<(String, i64, String)>,
    requests: Vec<RequestRow>,
    /// request → (label, count), in position order.
    wants: HashMap<String, Vec<(String, u32)>>,
    /// request → node ids, in position order.
    members: HashMap<String, Vec<String>>,
    /// (requestor, expires, how long its last renewal was for in ms: none
    /// if stored before that was kept)
    leases: Vec<(String, Time, Option<u64>)>,
    /// The store's identity row, read back.
    identity: Option<Identity>,
}

impl Tables {
    /// Takes one row of query `q` of [`queries`].
    pub fn read<C: Cells + ?Sized>(&mut self, q: usize, row: &C) -> Result<(), StoreError> {
        let text = |i| row.text(i).map(Option::unwrap_or_default);
        match q {
            0 => self.nodes.push(NodeRow::read(row)?),
            1 => {
                let r = Reader::new(row, "slots")?;
                self.slots.push((r.id.clone(), r.num(1, "idx")?, text(2)?));
            }
            2 => self.requests.push(RequestRow::read(row)?),
            3 => {
                let r = Reader::new(row, "request_wants")?;
                let want = (text(1)?, r.num(2, "count")?);
                self.wants.entry(r.id).or_default().push(want);
            }
            4 => self.members.entry(text(0)?).or_default().push(text(1)?),
            6..=8 => {
                let table = VERSIONED[q - 6];
                let r = Reader::new(row, table.table())?;
                let version = r.num(1, "version")?;
                self.versions.read(table, r.id, version);
            }
            9 => self.identity = Some(super::identity::read(row)?),
            _ => {
                let r = Reader::new(row, "leases")?;
                let expires = Time(r.num(1, "expires")?);
                let ttl = r.opt_num(2, "ttl")?;
                self.leases.push((r.id, expires, ttl));
            }
        }
        Ok(())
    }
}

/// The snapshot `tables` hold, checked against `config` and itself.
pub(super) fn assemble(tables: Tables, config: &Config) -> Result<Loaded, StoreError> {
    let Tables {
        versions: _,
        nodes: rows,
        slots,
        requests,
        wants,
        members,
        leases,
        identity,
    } = tables;
    let identity = identity.ok_or_else(|| StoreError::Corrupt {
        table: "pool_identity",
        id: "1".into(),
        column: "id",
        what: "the store's identity is missing".into(),
    })?;
    let mut notes = Vec::new();
    let mut nodes = BTreeMap::new();
    for raw in rows {
        if let Some(node) = raw.decode(config, &mut notes)? {
            nodes.insert(node.id, node);
        }
    }
    let ended = place_slots(slots, &mut nodes, &mut notes)?;
    let (mut requests, failed) = read_requests(requests, wants, members, config, &mut notes)?;
    untangle(&mut nodes, &mut requests, &ended, &failed);
    let leases = leases
        .into_iter()
        .map(|(requestor, expires, ttl)| RequestorLease {
            requestor,
            expires,
            ttl: ttl.map_or(config.requestor_lease_ttl, Duration::from_millis),
        })
        .collect();
    Ok(Loaded {
        snapshot: Snapshot {
            nodes: nodes.into_values().collect(),
            requests: requests.into_values().collect(),
            leases,
            identity,
        },
        dropped: notes,
    })
}

/// Fills each backing node's slots and places each live slot node from the
/// `slots` table. A row that does not join a live slot node to a slot its
/// backing has is ignored with a note (the slot stays free); a live slot
/// node no row places has lost its slot and is ended. Returns the nodes
/// ended here.
fn place_slots(
    rows: Vec<(String, i64, String)>,
    nodes: &mut BTreeMap<NodeId, Node>,
    notes: &mut Vec<String>,
) -> Result<HashSet<NodeId>, StoreError> {
    let mut placed = HashSet::new();
    for (backing, index, node) in rows {
        let corrupt = |column, what| StoreError::Corrupt {
            table: "slots",
            id: format!("{backing} slot {index}"),
            column,
            what,
        };
        let b: NodeId = backing
            .parse()
            .map_err(|()| corrupt("backing", "not a node id".into()))?;
        let n: NodeId = node
            .parse()
            .map_err(|()| corrupt("node", format!("not a node id: `{node}`")))?;
        let index = u16::try_from(index).map_err(|_| corrupt("idx", "not a slot index".into()))?;
        let held = match nodes.get(&n) {
            None => Err("that node is not stored or was dropped".to_owned()),
            Some(node) if !matches!(node.packing, Packing::Slot { .. }) => {
                Err("that node is not a slot node".to_owned())
            }
            Some(node) if node.state.is_final() => {
                Err(format!("that node is {}", node.state.name()))
            }
            Some(_) => Ok(()),
        };
        let has_slot = match nodes.get(&b).map(|b| &b.packing) {
            None => Err("the backing node is not stored or was dropped".to_owned()),
            Some(Packing::Backing { slots, .. }) if usize::from(index) < slots.len() => Ok(()),
            Some(Packing::Backing { slots, .. }) => {
                Err(format!("the backing node has only {} slots", slots.len()))
            }
            Some(_) => Err("that is not a backing node".to_owned()),
        };
        if let Err(why) = held.and(has_slot) {
            notes.push(format!("slot {index} of {b}, held by {n}: ignored, {why}"));
            continue;
        }
        if let Some(Packing::Backing { slots, .. }) = nodes.get_mut(&b).map(|b| &mut b.packing) {
            slots[usize::from(index)] = Some(n);
        }
        if let Some(node) = nodes.get_mut(&n) {
            node.packing = Packing::Slot { backing: b, index };
        }
        placed.insert(n);
    }
    let mut ended = HashSet::new();
    for node in nodes.values_mut() {
        if matches!(node.packing, Packing::Slot { .. })
            && !node.state.is_final()
            && !placed.contains(&node.id)
        {
            notes.push(format!(
                "slot node {} ({}) holds no slot: ended as backing-lost",
                node.id,
                node.state.name()
            ));
            node.state = NodeState::Gone {
                since: node.state.since(),
                reason: GoneReason::BackingLost,
            };
            ended.insert(node.id);
        }
    }
    Ok(ended)
}

/// Requests with their wants and nodes. A pending request that wants a label
/// the config no longer has is failed (and returned in the second set); a
/// finished one keeps the wants that still resolve.
fn read_requests(
    rows: Vec<RequestRow>,
    mut wants: HashMap<String, Vec<(String, u32)>>,
    mut members: HashMap<String, Vec<String>>,
    config: &Config,
    notes: &mut Vec<String>,
) -> Result<(BTreeMap<RequestId, Request>, HashSet<RequestId>), StoreError> {
    let mut requests = BTreeMap::new();
    let mut failed = HashSet::new();
    for row in rows {
        let id = row.parse_id()?;
        let mut state = row.decode_state()?;
        let mut resolved = Vec::new();
        for (label, count) in wants.remove(&row.id).unwrap_or_default() {
            if let Some(ix) = config.label(&label) {
                resolved.push((ix, count));
            } else if state == RequestState::Pending {
                notes.push(format!(
                    "request {id}: label `{label}` is no longer configured; the request is failed"
                ));
                state = RequestState::Failed {
                    // The load does not know the time; the request's own
                    // creation is the latest time it certainly existed.
                    at: Time(row.created),
                    reason: format!("label `{label}` is no longer configured"),
                };
                failed.insert(id);
            } else {
                notes.push(format!(
                    "request {id} ({}): label `{label}` is no longer configured; left out of \
                     what it wanted",
                    state.name()
                ));
            }
        }
        let mut nodes = Vec::new();
        for node in members.remove(&row.id).unwrap_or_default() {
            nodes.push(node.parse().map_err(|()| StoreError::Corrupt {
                table: "request_nodes",
                id: row.id.clone(),
                column: "node",
                what: format!("not a node id: `{node}`"),
            })?);
        }
        let metadata = read_metadata_text(row.metadata.as_deref()).unwrap_or_else(|why| {
            notes.push(format!("request {id}: its metadata is left out: {why}"));
            Metadata::new()
        });
        let key = match row.key {
            Some(key) if berth_core::pool::read_key(key.as_bytes()).is_err() => {
                notes.push(format!(
                    "request {id}: its idempotency key `{}` is not one the API takes; left out",
                    berth_core::text::printable(&key)
                ));
                None
            }
            key => key,
        };
        requests.insert(
            id,
            Request {
                id,
                requestor: row.requestor,
                priority: row.priority,
                created: Time(row.created),
                wants: resolved,
                state,
                nodes,
                failures: row.failures,
                last_failure: row.last_failure,
                key,
                metadata,
            },
        );
    }
    Ok((requests, failed))
}

/// Keeps "a node is assigned to a request ⇔ the pending request lists it"
/// true across what this load changed: slot nodes it ended and requests it
/// failed no longer hold or set aside anything. (The core unassigns the same
/// way when it ends a node or fails a request.)
fn untangle(
    nodes: &mut BTreeMap<NodeId, Node>,
    requests: &mut BTreeMap<RequestId, Request>,
    ended: &HashSet<NodeId>,
    failed: &HashSet<RequestId>,
) {
    for id in ended {
        let Some(node) = nodes.get_mut(id) else {
            continue;
        };
        if let Some(r) = node.assigned.take()
            && let Some(req) = requests.get_mut(&r)
            && req.state == RequestState::Pending
        {
            req.nodes.retain(|n| n != id);
        }
    }
    for id in failed {
        let Some(req) = requests.get_mut(id) else {
            continue;
        };
        for n in req.nodes.drain(..) {
            if let Some(node) = nodes.get_mut(&n)
                && node.assigned == Some(*id)
            {
                node.assigned = None;
            }
        }
    }
}
