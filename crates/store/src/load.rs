//! Reading everything stored into a [`Loaded`] snapshot, checked against the
//! config and against itself: each slot assignment must join a live slot
//! node to a backing node that has that slot.

use std::collections::{BTreeMap, HashMap, HashSet};

use rusqlite::Transaction;

use super::rows::{NodeRow, RequestRow};
use super::{Loaded, StoreError, sql};
use berth_core::config::Config;
use berth_core::pool::{
    GoneReason, Lease, Node, NodeId, NodeState, Packing, Request, RequestId, RequestState,
    Snapshot, Time,
};

pub(super) fn load(tx: &Transaction<'_>, config: &Config) -> Result<Loaded, StoreError> {
    let mut notes = Vec::new();
    let mut nodes = read_nodes(tx, config, &mut notes)?;
    let ended = place_slots(tx, &mut nodes, &mut notes)?;
    let (mut requests, failed) = read_requests(tx, config, &mut notes)?;
    untangle(&mut nodes, &mut requests, &ended, &failed);
    Ok(Loaded {
        snapshot: Snapshot {
            nodes: nodes.into_values().collect(),
            requests: requests.into_values().collect(),
            leases: read_leases(tx)?,
        },
        dropped: notes,
    })
}

fn read_leases(tx: &Transaction<'_>) -> Result<Vec<Lease>, StoreError> {
    let doing = "reading leases";
    let mut stmt = tx
        .prepare("SELECT requestor, expires FROM leases ORDER BY requestor")
        .map_err(sql(doing))?;
    let rows = stmt
        .query_map([], |r| {
            Ok(Lease {
                requestor: r.get(0)?,
                expires: Time(r.get(1)?),
            })
        })
        .map_err(sql(doing))?;
    rows.collect::<Result<_, _>>().map_err(sql(doing))
}

fn read_nodes(
    tx: &Transaction<'_>,
    config: &Config,
    notes: &mut Vec<String>,
) -> Result<BTreeMap<NodeId, Node>, StoreError> {
    let doing = "reading nodes";
    let mut stmt = tx
        .prepare(&format!("SELECT {} FROM nodes", NodeRow::COLUMNS))
        .map_err(sql(doing))?;
    let mut rows = stmt.query([]).map_err(sql(doing))?;
    let mut nodes = BTreeMap::new();
    while let Some(row) = rows.next().map_err(sql(doing))? {
        let raw = NodeRow::read(row).map_err(sql(doing))?;
        if let Some(node) = raw.decode(config, notes)? {
            nodes.insert(node.id, node);
        }
    }
    Ok(nodes)
}

/// Fills each backing node's slots and places each live slot node from the
/// `slots` table. A row that does not join a live slot node to a slot its
/// backing has is ignored with a note (the slot stays free); a live slot
/// node no row places has lost its slot and is ended. Returns the nodes
/// ended here.
fn place_slots(
    tx: &Transaction<'_>,
    nodes: &mut BTreeMap<NodeId, Node>,
    notes: &mut Vec<String>,
) -> Result<HashSet<NodeId>, StoreError> {
    let doing = "reading slot assignments";
    let mut stmt = tx
        .prepare("SELECT backing, idx, node FROM slots ORDER BY backing, idx")
        .map_err(sql(doing))?;
    let mut rows = stmt.query([]).map_err(sql(doing))?;
    let mut placed = HashSet::new();
    while let Some(row) = rows.next().map_err(sql(doing))? {
        let backing: String = row.get(0).map_err(sql(doing))?;
        let index: i64 = row.get(1).map_err(sql(doing))?;
        let node: String = row.get(2).map_err(sql(doing))?;
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
    tx: &Transaction<'_>,
    config: &Config,
    notes: &mut Vec<String>,
) -> Result<(BTreeMap<RequestId, Request>, HashSet<RequestId>), StoreError> {
    let mut wants = grouped(
        tx,
        "SELECT request, label, count FROM request_wants ORDER BY request, position",
        "reading request wants",
        |row| Ok((row.get::<_, String>(1)?, row.get::<_, u32>(2)?)),
    )?;
    let mut members = grouped(
        tx,
        "SELECT request, node FROM request_nodes ORDER BY request, position",
        "reading request nodes",
        |row| row.get::<_, String>(1),
    )?;

    let doing = "reading requests";
    let mut stmt = tx
        .prepare(&format!("SELECT {} FROM requests", RequestRow::COLUMNS))
        .map_err(sql(doing))?;
    let mut rows = stmt.query([]).map_err(sql(doing))?;
    let mut requests = BTreeMap::new();
    let mut failed = HashSet::new();
    while let Some(row) = rows.next().map_err(sql(doing))? {
        let row = RequestRow::read(row).map_err(sql(doing))?;
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
            },
        );
    }
    Ok((requests, failed))
}

/// Rows of `query` (request id first) grouped by request, in row order.
fn grouped<T>(
    tx: &Transaction<'_>,
    query: &str,
    doing: &'static str,
    read: impl Fn(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> Result<HashMap<String, Vec<T>>, StoreError> {
    let mut stmt = tx.prepare(query).map_err(sql(doing))?;
    let mut rows = stmt.query([]).map_err(sql(doing))?;
    let mut out: HashMap<String, Vec<T>> = HashMap::new();
    while let Some(row) = rows.next().map_err(sql(doing))? {
        let request: String = row.get(0).map_err(sql(doing))?;
        out.entry(request)
            .or_default()
            .push(read(row).map_err(sql(doing))?);
    }
    Ok(out)
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
