//! Writing the core's [`Changes`] inside the commit's one transaction, with
//! cached prepared statements: a commit is one pass over the changed records.

use std::sync::LazyLock;

use rusqlite::{Transaction, params};

use super::rows::{NodeRow, RequestRow, label_name};
use super::{StoreError, sql};
use berth_core::config::Config;
use berth_core::pool::{Changes, Packing};

/// `INSERT … ON CONFLICT DO UPDATE` over every column of `row`'s table,
/// bumping `version` on update.
fn upsert_sql(table: &str, columns: &str) -> String {
    let names: Vec<&str> = columns.split(',').map(str::trim).collect();
    let values: Vec<String> = (1..=names.len()).map(|i| format!("?{i}")).collect();
    let sets: Vec<String> = names[1..]
        .iter()
        .map(|c| format!("{c} = excluded.{c}"))
        .collect();
    format!(
        "INSERT INTO {table} ({}) VALUES ({}) ON CONFLICT (id) DO UPDATE SET {}, \
         version = version + 1",
        names.join(", "),
        values.join(", "),
        sets.join(", ")
    )
}

static UPSERT_NODE: LazyLock<String> = LazyLock::new(|| upsert_sql("nodes", NodeRow::COLUMNS));
static UPSERT_REQUEST: LazyLock<String> =
    LazyLock::new(|| upsert_sql("requests", RequestRow::COLUMNS));

pub(super) fn write(
    tx: &Transaction<'_>,
    config: &Config,
    changes: &Changes,
) -> Result<(), StoreError> {
    let prepare = |q: &str| tx.prepare_cached(q).map_err(sql("preparing a commit"));

    let mut upsert = prepare(&UPSERT_NODE)?;
    let mut clear_slots = prepare("DELETE FROM slots WHERE backing = ?1")?;
    // Every changed backing node's slots are cleared before any is written
    // back: a commit that frees a slot on one backing node and fills one on
    // another must not collide with itself on `UNIQUE (node)`.
    let mut backings = Vec::new();
    for n in &changes.nodes {
        let row = NodeRow::encode(n, config)?;
        upsert
            .execute(row.params())
            .map_err(sql("writing a node"))?;
        if let Packing::Backing { slots, .. } = &n.packing {
            clear_slots
                .execute([&row.id])
                .map_err(sql("clearing slot assignments"))?;
            backings.push((row.id, slots));
        }
    }
    // The primary key and `UNIQUE (node)` refuse a slot held twice here, and
    // the error rolls the whole commit back.
    let mut put_slot = prepare("INSERT INTO slots (backing, idx, node) VALUES (?1, ?2, ?3)")?;
    for (backing, slots) in backings {
        for (index, node) in slots.iter().enumerate() {
            if let Some(node) = node {
                put_slot
                    .execute(params![backing, index, node.to_string()])
                    .map_err(sql("writing a slot assignment"))?;
            }
        }
    }
    let mut purge_node = prepare("DELETE FROM nodes WHERE id = ?1")?;
    let mut purge_slots = prepare("DELETE FROM slots WHERE backing = ?1 OR node = ?1")?;
    for id in &changes.purged_nodes {
        let id = id.to_string();
        purge_node.execute([&id]).map_err(sql("purging a node"))?;
        purge_slots
            .execute([&id])
            .map_err(sql("purging a node's slot assignments"))?;
    }

    let mut upsert = prepare(&UPSERT_REQUEST)?;
    let mut clear_wants = prepare("DELETE FROM request_wants WHERE request = ?1")?;
    let mut put_want = prepare(
        "INSERT INTO request_wants (request, position, label, count) VALUES (?1, ?2, ?3, ?4)",
    )?;
    let mut clear_nodes = prepare("DELETE FROM request_nodes WHERE request = ?1")?;
    let mut put_node =
        prepare("INSERT INTO request_nodes (request, position, node) VALUES (?1, ?2, ?3)")?;
    for r in &changes.requests {
        let row = RequestRow::encode(r);
        upsert
            .execute(row.params())
            .map_err(sql("writing a request"))?;
        clear_wants
            .execute([&row.id])
            .map_err(sql("writing a request's wants"))?;
        for (position, (label, count)) in r.wants.iter().enumerate() {
            put_want
                .execute(params![
                    row.id,
                    position,
                    label_name(config, *label)?,
                    count
                ])
                .map_err(sql("writing a request's wants"))?;
        }
        clear_nodes
            .execute([&row.id])
            .map_err(sql("writing a request's nodes"))?;
        for (position, node) in r.nodes.iter().enumerate() {
            put_node
                .execute(params![row.id, position, node.to_string()])
                .map_err(sql("writing a request's nodes"))?;
        }
    }
    let mut put_lease = prepare(
        "INSERT INTO leases (requestor, expires) VALUES (?1, ?2) \
         ON CONFLICT (requestor) DO UPDATE SET expires = excluded.expires, version = version + 1",
    )?;
    for l in &changes.leases {
        put_lease
            .execute(params![l.requestor, l.expires.0])
            .map_err(sql("writing a lease"))?;
    }
    let mut purge_lease = prepare("DELETE FROM leases WHERE requestor = ?1")?;
    for r in &changes.purged_leases {
        purge_lease.execute([r]).map_err(sql("removing a lease"))?;
    }
    let mut purge_request = prepare("DELETE FROM requests WHERE id = ?1")?;
    for id in &changes.purged_requests {
        let id = id.to_string();
        purge_request
            .execute([&id])
            .map_err(sql("purging a request"))?;
        clear_wants
            .execute([&id])
            .map_err(sql("purging a request"))?;
        clear_nodes
            .execute([&id])
            .map_err(sql("purging a request"))?;
    }
    Ok(())
}
