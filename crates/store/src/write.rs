//! What a commit writes, as a list of statements with their values, the same
//! for every backend: a backend runs them in order inside one transaction.

use std::sync::LazyLock;

use strum::IntoEnumIterator;

use super::StoreError;
use super::rows::{NodeRow, RequestRow, label_name};
use super::value::Val;
use berth_core::config::Config;
use berth_core::pool::{Changes, Packing};

/// The statements a commit is made of, written once for every backend
/// ([`Stmt::sql`], [`Stmt::dollar_sql`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, strum::EnumIter)]
pub(super) enum Stmt {
    UpsertNode,
    ClearSlots,
    PutSlot,
    PurgeNode,
    PurgeSlots,
    UpsertRequest,
    ClearWants,
    PutWant,
    ClearMembers,
    PutMember,
    PutLease,
    PurgeLease,
    PurgeRequest,
}

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
         version = {table}.version + 1",
        names.join(", "),
        values.join(", "),
        sets.join(", ")
    )
}

impl Stmt {
    /// The statement's text with `?1`-style placeholders (SQLite's).
    pub fn sql(self) -> &'static str {
        static TEXTS: LazyLock<Vec<String>> =
            LazyLock::new(|| Stmt::iter().map(Stmt::text).collect());
        &TEXTS[self as usize]
    }

    /// The same with `$1`-style placeholders (PostgreSQL's). No statement
    /// has a `?` anywhere but in a placeholder.
    pub fn dollar_sql(self) -> &'static str {
        static TEXTS: LazyLock<Vec<String>> =
            LazyLock::new(|| Stmt::iter().map(|s| s.text().replace('?', "$")).collect());
        &TEXTS[self as usize]
    }

    fn text(self) -> String {
        match self {
            Stmt::UpsertNode => upsert_sql("nodes", NodeRow::COLUMNS),
            Stmt::ClearSlots => "DELETE FROM slots WHERE backing = ?1".into(),
            Stmt::PutSlot => "INSERT INTO slots (backing, idx, node) VALUES (?1, ?2, ?3)".into(),
            Stmt::PurgeNode => "DELETE FROM nodes WHERE id = ?1".into(),
            Stmt::PurgeSlots => "DELETE FROM slots WHERE backing = ?1 OR node = ?1".into(),
            Stmt::UpsertRequest => upsert_sql("requests", RequestRow::COLUMNS),
            Stmt::ClearWants => "DELETE FROM request_wants WHERE request = ?1".into(),
            Stmt::PutWant => "INSERT INTO request_wants (request, position, label, count) \
                              VALUES (?1, ?2, ?3, ?4)"
                .into(),
            Stmt::ClearMembers => "DELETE FROM request_nodes WHERE request = ?1".into(),
            Stmt::PutMember => {
                "INSERT INTO request_nodes (request, position, node) VALUES (?1, ?2, ?3)".into()
            }
            Stmt::PutLease => "INSERT INTO leases (requestor, expires) VALUES (?1, ?2) \
                               ON CONFLICT (requestor) DO UPDATE SET expires = excluded.expires, \
                               version = leases.version + 1"
                .into(),
            Stmt::PurgeLease => "DELETE FROM leases WHERE requestor = ?1".into(),
            Stmt::PurgeRequest => "DELETE FROM requests WHERE id = ?1".into(),
        }
    }

    /// What a failure of this statement was doing, for its error.
    pub fn doing(self) -> &'static str {
        match self {
            Stmt::UpsertNode => "writing a node",
            Stmt::ClearSlots => "clearing slot assignments",
            Stmt::PutSlot => "writing a slot assignment",
            Stmt::PurgeNode => "purging a node",
            Stmt::PurgeSlots => "purging a node's slot assignments",
            Stmt::UpsertRequest => "writing a request",
            Stmt::ClearWants | Stmt::PutWant => "writing a request's wants",
            Stmt::ClearMembers | Stmt::PutMember => "writing a request's nodes",
            Stmt::PutLease => "writing a lease",
            Stmt::PurgeLease => "removing a lease",
            Stmt::PurgeRequest => "purging a request",
        }
    }
}

/// One statement of a commit and its values.
pub(super) type Op = (Stmt, Vec<Val>);

/// The statements that write `changes`, in the order they must run.
pub(super) fn plan(config: &Config, changes: &Changes) -> Result<Vec<Op>, StoreError> {
    let mut ops = Vec::new();
    // Every changed backing node's slots are cleared before any is written
    // back: a commit that frees a slot on one backing node and fills one on
    // another must not collide with itself on `UNIQUE (node)`.
    let mut backings = Vec::new();
    for n in &changes.nodes {
        let row = NodeRow::encode(n, config)?;
        let id = row.id.clone();
        ops.push((Stmt::UpsertNode, row.into_vals()?));
        if let Packing::Backing { slots, .. } = &n.packing {
            ops.push((Stmt::ClearSlots, vec![id.as_str().into()]));
            backings.push((id, slots));
        }
    }
    // The primary key and `UNIQUE (node)` refuse a slot held twice here, and
    // the error rolls the whole commit back.
    for (backing, slots) in backings {
        for (index, node) in slots.iter().enumerate() {
            if let Some(node) = node {
                ops.push((
                    Stmt::PutSlot,
                    vec![
                        backing.as_str().into(),
                        index.into(),
                        node.to_string().into(),
                    ],
                ));
            }
        }
    }
    for id in &changes.purged_nodes {
        let id = Val::from(id.to_string());
        ops.push((Stmt::PurgeNode, vec![id.clone()]));
        ops.push((Stmt::PurgeSlots, vec![id]));
    }

    for r in &changes.requests {
        let row = RequestRow::encode(r);
        let id = Val::from(row.id.as_str());
        ops.push((Stmt::UpsertRequest, row.into_vals()?));
        ops.push((Stmt::ClearWants, vec![id.clone()]));
        for (position, (label, count)) in r.wants.iter().enumerate() {
            ops.push((
                Stmt::PutWant,
                vec![
                    id.clone(),
                    position.into(),
                    label_name(config, *label)?.into(),
                    (*count).into(),
                ],
            ));
        }
        ops.push((Stmt::ClearMembers, vec![id.clone()]));
        for (position, node) in r.nodes.iter().enumerate() {
            ops.push((
                Stmt::PutMember,
                vec![id.clone(), position.into(), node.to_string().into()],
            ));
        }
    }
    for l in &changes.leases {
        let expires = super::value::big(l.expires.0, &l.requestor, "lease expiry")?;
        ops.push((Stmt::PutLease, vec![l.requestor.as_str().into(), expires]));
    }
    for r in &changes.purged_leases {
        ops.push((Stmt::PurgeLease, vec![r.as_str().into()]));
    }
    for id in &changes.purged_requests {
        let id = Val::from(id.to_string());
        ops.push((Stmt::PurgeRequest, vec![id.clone()]));
        ops.push((Stmt::ClearWants, vec![id.clone()]));
        ops.push((Stmt::ClearMembers, vec![id]));
    }
    Ok(ops)
}
