//! What a commit writes, as a list of statements with their values, the same
//! for every backend: a backend runs them in order inside one transaction.
//!
//! Every commit is conditional on the rows it changes. Node, request and
//! requestor-lease rows carry a `version`, bumped by each update; a store
//! remembers the version of each such row as it last read or wrote it
//! ([`Versions`]), and each write or removal of one names that version.
//! A row that someone else changed, removed or added meanwhile makes its
//! statement change no row, and the commit is refused whole
//! ([`StoreError::Conflict`]): the caller reloads and decides again.

use std::collections::HashMap;
use std::sync::LazyLock;

use strum::IntoEnumIterator;

use super::error::StoreError;
use super::rows::{NodeRow, RequestRow, label_name};
use super::value::Val;
use berth_core::config::Config;
use berth_core::pool::{Changes, Packing};

/// The statements a commit is made of, written once for every backend
/// ([`Stmt::sql`], [`Stmt::dollar_sql`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, strum::EnumIter)]
pub(super) enum Stmt {
    InsertNode,
    UpdateNode,
    ClearSlots,
    PutSlot,
    PurgeNode,
    PurgeSlots,
    InsertRequest,
    UpdateRequest,
    ClearWants,
    PutWant,
    ClearMembers,
    PutMember,
    InsertLease,
    UpdateLease,
    PurgeLease,
    PurgeRequest,
    PutIdentity,
}

/// A new row of `table` with every column of `columns` (the first being
/// the key), at version 0. A row already there is left alone, and the
/// statement changes no row.
fn insert_sql(table: &str, columns: &str) -> String {
    let names: Vec<&str> = columns.split(',').map(str::trim).collect();
    let values: Vec<String> = (1..=names.len()).map(|i| format!("?{i}")).collect();
    format!(
        "INSERT INTO {table} ({}) VALUES ({}) ON CONFLICT DO NOTHING",
        names.join(", "),
        values.join(", "),
    )
}

/// Every column of `columns` but the key (the first) written over the row
/// of `table` with that key, bumping `version`, if the row is at the
/// version given as the last parameter. A row at another version, or gone,
/// is left alone, and the statement changes no row.
fn update_sql(table: &str, columns: &str) -> String {
    let names: Vec<&str> = columns.split(',').map(str::trim).collect();
    let sets: Vec<String> = (2..)
        .zip(&names[1..])
        .map(|(i, c)| format!("{c} = ?{i}"))
        .collect();
    format!(
        "UPDATE {table} SET {}, version = version + 1 WHERE {} = ?1 AND version = ?{}",
        sets.join(", "),
        names[0],
        names.len() + 1
    )
}

/// The columns of a requestor lease's row, key first.
const LEASE_COLUMNS: &str = "requestor, expires, ttl";

/// What a purge of a row the store never saw names as its version: no row
/// has it (versions start at 0), so nothing is removed.
const ABSENT: i64 = -1;

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
            Stmt::InsertNode => insert_sql("nodes", NodeRow::COLUMNS),
            Stmt::UpdateNode => update_sql("nodes", NodeRow::COLUMNS),
            Stmt::ClearSlots => "DELETE FROM slots WHERE backing = ?1".into(),
            Stmt::PutSlot => "INSERT INTO slots (backing, idx, node) VALUES (?1, ?2, ?3)".into(),
            Stmt::PurgeNode => "DELETE FROM nodes WHERE id = ?1 AND version = ?2".into(),
            Stmt::PurgeSlots => "DELETE FROM slots WHERE backing = ?1 OR node = ?1".into(),
            Stmt::InsertRequest => insert_sql("requests", RequestRow::COLUMNS),
            Stmt::UpdateRequest => update_sql("requests", RequestRow::COLUMNS),
            Stmt::ClearWants => "DELETE FROM request_wants WHERE request = ?1".into(),
            Stmt::PutWant => "INSERT INTO request_wants (request, position, label, count) \
                              VALUES (?1, ?2, ?3, ?4)"
                .into(),
            Stmt::ClearMembers => "DELETE FROM request_nodes WHERE request = ?1".into(),
            Stmt::PutMember => {
                "INSERT INTO request_nodes (request, position, node) VALUES (?1, ?2, ?3)".into()
            }
            Stmt::InsertLease => insert_sql("leases", LEASE_COLUMNS),
            Stmt::UpdateLease => update_sql("leases", LEASE_COLUMNS),
            Stmt::PurgeLease => "DELETE FROM leases WHERE requestor = ?1 AND version = ?2".into(),
            Stmt::PurgeRequest => "DELETE FROM requests WHERE id = ?1 AND version = ?2".into(),
            Stmt::PutIdentity => super::identity::REPLACE.into(),
        }
    }

    /// Whether the statement writes a versioned row, and so how many rows
    /// it changes is checked ([`Op::checked`]).
    pub fn is_checked(self) -> bool {
        matches!(
            self,
            Stmt::InsertNode
                | Stmt::UpdateNode
                | Stmt::PurgeNode
                | Stmt::InsertRequest
                | Stmt::UpdateRequest
                | Stmt::PurgeRequest
                | Stmt::InsertLease
                | Stmt::UpdateLease
                | Stmt::PurgeLease
        )
    }

    /// What a failure of this statement was doing, for its error.
    pub fn doing(self) -> &'static str {
        match self {
            Stmt::InsertNode | Stmt::UpdateNode => "writing a node",
            Stmt::ClearSlots => "clearing slot assignments",
            Stmt::PutSlot => "writing a slot assignment",
            Stmt::PurgeNode => "purging a node",
            Stmt::PurgeSlots => "purging a node's slot assignments",
            Stmt::InsertRequest | Stmt::UpdateRequest => "writing a request",
            Stmt::ClearWants | Stmt::PutWant => "writing a request's wants",
            Stmt::ClearMembers | Stmt::PutMember => "writing a request's nodes",
            Stmt::InsertLease | Stmt::UpdateLease => "writing a lease",
            Stmt::PurgeLease => "removing a lease",
            Stmt::PurgeRequest => "purging a request",
            Stmt::PutIdentity => "writing the store's identity",
        }
    }
}

/// The tables whose rows carry a `version`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Versioned {
    Nodes,
    Requests,
    RequestorLeases,
}

impl Versioned {
    pub fn table(self) -> &'static str {
        match self {
            Versioned::Nodes => "nodes",
            Versioned::Requests => "requests",
            Versioned::RequestorLeases => "leases",
        }
    }

    fn insert(self) -> Stmt {
        match self {
            Versioned::Nodes => Stmt::InsertNode,
            Versioned::Requests => Stmt::InsertRequest,
            Versioned::RequestorLeases => Stmt::InsertLease,
        }
    }

    fn update(self) -> Stmt {
        match self {
            Versioned::Nodes => Stmt::UpdateNode,
            Versioned::Requests => Stmt::UpdateRequest,
            Versioned::RequestorLeases => Stmt::UpdateLease,
        }
    }

    /// The query a load reads this table's versions with, in the same read
    /// transaction as the rows.
    pub fn query(self) -> &'static str {
        match self {
            Versioned::Nodes => "SELECT id, version FROM nodes",
            Versioned::Requests => "SELECT id, version FROM requests",
            Versioned::RequestorLeases => "SELECT requestor, version FROM leases",
        }
    }
}

/// The version of each versioned row as this store last read or wrote it;
/// a row not here is one the store has not seen, and is expected absent.
#[derive(Default)]
pub(super) struct Versions(HashMap<(Versioned, String), i64>);

impl Versions {
    /// Takes a row's version as read by a load.
    pub fn read(&mut self, table: Versioned, id: String, version: i64) {
        self.0.insert((table, id), version);
    }

    /// Takes what a commit of `plan` wrote, once it is committed.
    pub fn apply(&mut self, plan: Plan) {
        for (key, version) in plan.after {
            match version {
                Some(v) => self.0.insert(key, v),
                None => self.0.remove(&key),
            };
        }
    }
}

/// One statement of a commit, its values, and how many rows it must change
/// for the commit to stand (`None`: any number).
pub(super) struct Op {
    pub stmt: Stmt,
    pub vals: Vec<Val>,
    check: Option<(Versioned, String, u64)>,
}

impl Op {
    fn new(stmt: Stmt, vals: Vec<Val>) -> Op {
        Op {
            stmt,
            vals,
            check: None,
        }
    }

    /// Whether `changed` rows is what this statement had to change;
    /// otherwise the conflict that refuses the commit.
    pub fn checked(&self, changed: u64) -> Result<(), StoreError> {
        match &self.check {
            Some((_, _, rows)) if changed != *rows => Err(self.conflict()),
            _ => Ok(()),
        }
    }

    /// How many rows the statement must change, where that is checked
    /// (always for a [`Stmt::is_checked`] one).
    pub fn expected_rows(&self) -> Option<i64> {
        self.check.as_ref().map(|(_, _, rows)| *rows as i64)
    }

    /// The refusal of the commit when this statement changed other rows
    /// than it had to.
    pub fn conflict(&self) -> StoreError {
        match &self.check {
            Some((table, id, _)) => StoreError::Conflict {
                table: table.table(),
                id: id.clone(),
            },
            None => StoreError::Conflict {
                table: "unknown",
                id: String::new(),
            },
        }
    }
}

/// A commit's statements in order, and the versions its rows are at once
/// it is committed (`None`: removed).
pub(super) struct Plan {
    pub ops: Vec<Op>,
    after: HashMap<(Versioned, String), Option<i64>>,
}

impl Plan {
    /// Writes the row `id` of `table` with `vals` (its columns in order):
    /// over the row at the version `seen` holds for it, or as a new row if
    /// `seen` holds none. Either must change exactly one row.
    /// Writes the row `id` of `table`: an update at the version `seen`
    /// holds for it, or an insert of a row that must not be there yet.
    /// Returns whether it is an insert.
    fn write(&mut self, seen: &Versions, table: Versioned, id: String, mut vals: Vec<Val>) -> bool {
        let key = (table, id);
        let expected = self.expected(seen, &key);
        let (stmt, now) = match expected {
            Some(v) => {
                vals.push(v.into());
                (table.update(), v + 1)
            }
            None => (table.insert(), 0),
        };
        self.after.insert(key.clone(), Some(now));
        self.ops.push(Op {
            stmt,
            vals,
            check: Some((key.0, key.1, 1)),
        });
        expected.is_none()
    }

    /// Removes the row `id` of `table` if it is at the version `seen` holds
    /// for it; one the store never saw is expected absent and left alone.
    fn purge(&mut self, seen: &Versions, stmt: Stmt, table: Versioned, id: String) {
        let key = (table, id);
        let expected = self.expected(seen, &key);
        let vals = vec![key.1.as_str().into(), expected.unwrap_or(ABSENT).into()];
        self.after.insert(key.clone(), None);
        self.ops.push(Op {
            stmt,
            vals,
            check: Some((key.0, key.1, u64::from(expected.is_some()))),
        });
    }

    /// The version `key` is at before this statement: as written earlier in
    /// this commit, else as `seen`.
    fn expected(&self, seen: &Versions, key: &(Versioned, String)) -> Option<i64> {
        match self.after.get(key) {
            Some(v) => *v,
            None => seen.0.get(key).copied(),
        }
    }

    fn push(&mut self, stmt: Stmt, vals: Vec<Val>) {
        self.ops.push(Op::new(stmt, vals));
    }
}

/// The statements that write `changes`, in the order they must run, each
/// row conditional on its version in `seen`.
pub(super) fn plan(
    config: &Config,
    changes: &Changes,
    seen: &Versions,
) -> Result<Plan, StoreError> {
    let mut plan = Plan {
        ops: Vec::new(),
        after: HashMap::new(),
    };
    // Every changed backing node's slots are cleared before any is written
    // back: a commit that frees a slot on one backing node and fills one on
    // another must not collide with itself on `UNIQUE (node)`.
    let mut backings = Vec::new();
    for n in &changes.nodes {
        let row = NodeRow::encode(n, config)?;
        let id = row.id.clone();
        plan.write(seen, Versioned::Nodes, id.clone(), row.into_vals()?);
        if let Packing::Backing { slots, .. } = &n.packing {
            plan.push(Stmt::ClearSlots, vec![id.as_str().into()]);
            backings.push((id, slots));
        }
    }
    // The primary key and `UNIQUE (node)` refuse a slot held twice here, and
    // the error rolls the whole commit back.
    for (backing, slots) in backings {
        for (index, node) in slots.iter().enumerate() {
            if let Some(node) = node {
                plan.push(
                    Stmt::PutSlot,
                    vec![
                        backing.as_str().into(),
                        index.into(),
                        node.to_string().into(),
                    ],
                );
            }
        }
    }
    for id in &changes.purged_nodes {
        let id = id.to_string();
        plan.purge(seen, Stmt::PurgeNode, Versioned::Nodes, id.clone());
        plan.push(Stmt::PurgeSlots, vec![id.into()]);
    }

    for r in &changes.requests {
        let row = RequestRow::encode(r);
        let id = Val::from(row.id.as_str());
        let key = row.id.clone();
        // A new request has no rows under it yet (its insert is refused if
        // the request is there): only a request that was there before has
        // its wants and nodes cleared first.
        let new = plan.write(seen, Versioned::Requests, key, row.into_vals()?);
        if !new {
            plan.push(Stmt::ClearWants, vec![id.clone()]);
        }
        for (position, (label, count)) in r.wants.iter().enumerate() {
            plan.push(
                Stmt::PutWant,
                vec![
                    id.clone(),
                    position.into(),
                    label_name(config, *label)?.into(),
                    (*count).into(),
                ],
            );
        }
        if !new {
            plan.push(Stmt::ClearMembers, vec![id.clone()]);
        }
        for (position, node) in r.nodes.iter().enumerate() {
            plan.push(
                Stmt::PutMember,
                vec![id.clone(), position.into(), node.to_string().into()],
            );
        }
    }
    for l in &changes.leases {
        let expires = super::value::big(l.expires.0, &l.requestor, "lease expiry")?;
        let ttl_ms = u64::try_from(l.ttl.as_millis()).unwrap_or(u64::MAX);
        let ttl = super::value::big(ttl_ms, &l.requestor, "lease ttl")?;
        let vals = vec![l.requestor.as_str().into(), expires, ttl];
        plan.write(seen, Versioned::RequestorLeases, l.requestor.clone(), vals);
    }
    for r in &changes.purged_leases {
        plan.purge(
            seen,
            Stmt::PurgeLease,
            Versioned::RequestorLeases,
            r.clone(),
        );
    }
    for id in &changes.purged_requests {
        let key = id.to_string();
        let id = Val::from(key.as_str());
        plan.purge(seen, Stmt::PurgeRequest, Versioned::Requests, key);
        plan.push(Stmt::ClearWants, vec![id.clone()]);
        plan.push(Stmt::ClearMembers, vec![id]);
    }
    if let Some(identity) = &changes.identity {
        plan.push(Stmt::PutIdentity, super::identity::values(identity).into());
    }
    Ok(plan)
}
