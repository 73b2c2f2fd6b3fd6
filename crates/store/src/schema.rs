//! The store's schema as an ordered list of migrations, and the code that
//! brings a database up to date with them.

use rusqlite::Connection;

use super::error::StoreError;

/// Schema steps, in order; step `i` takes the database to version `i + 1`,
/// kept in `PRAGMA user_version`. A step that has shipped is never edited: a
/// change is a new step, so every database ends up with the same schema
/// whatever version it started from.
///
/// Rows name labels and providers (never config indexes) so that a config
/// change between runs cannot silently remap a record. `version` on nodes,
/// requests and leases counts the writes to a row; every commit is
/// conditional on it (`write.rs`).
pub(super) const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE nodes (
    id TEXT PRIMARY KEY,
    label TEXT NOT NULL,
    provider TEXT NOT NULL,
    instance_type TEXT NOT NULL,
    vcpus INTEGER NOT NULL,
    ram_mib INTEGER NOT NULL,
    price REAL NOT NULL,
    instance TEXT,
    state TEXT NOT NULL,
    since INTEGER NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 0,
    request TEXT,
    reason TEXT,
    idle TEXT NOT NULL,
    role TEXT NOT NULL,
    slot_label TEXT,
    slot_count INTEGER,
    free_since INTEGER,
    slot_backing TEXT,
    slot_index INTEGER,
    assigned TEXT,
    created INTEGER NOT NULL,
    endpoint TEXT,
    version INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE slots (
    backing TEXT NOT NULL,
    idx INTEGER NOT NULL,
    node TEXT NOT NULL UNIQUE,
    PRIMARY KEY (backing, idx)
);
CREATE TABLE requests (
    id TEXT PRIMARY KEY,
    requestor TEXT NOT NULL,
    priority INTEGER NOT NULL,
    created INTEGER NOT NULL,
    state TEXT NOT NULL,
    at INTEGER,
    reason TEXT,
    failures INTEGER NOT NULL DEFAULT 0,
    version INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE request_wants (
    request TEXT NOT NULL,
    position INTEGER NOT NULL,
    label TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (request, position),
    UNIQUE (request, label)
);
CREATE TABLE request_nodes (
    request TEXT NOT NULL,
    position INTEGER NOT NULL,
    node TEXT NOT NULL,
    PRIMARY KEY (request, position)
);
"#,
    r#"
CREATE TABLE leases (
    requestor TEXT PRIMARY KEY,
    expires INTEGER NOT NULL,
    version INTEGER NOT NULL DEFAULT 0
);
"#,
    // How long a lease's last renewal made it last, in milliseconds; NULL
    // for a lease stored before this step (read as `api.lease-ttl`).
    r#"
ALTER TABLE leases ADD COLUMN ttl INTEGER;
"#,
    // The store's identity (`berth_core::pool::Identity`): one row, put in
    // by the store right after migrating (`identity::ensure`), with a
    // generation and a key drawn from the operating system's random source.
    r#"
CREATE TABLE pool_identity (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    generation TEXT NOT NULL,
    key TEXT NOT NULL,
    confirmed INTEGER NOT NULL
);
"#,
    // A node's packing (plain, backing, slot) under the core's own word.
    r#"
ALTER TABLE nodes RENAME COLUMN role TO packing;
"#,
    // Why a node's last launch try failed, and a request's last failed try
    // (`Node::failure`, `Request::last_failure`): text for people, NULL in
    // rows stored before this step.
    r#"
ALTER TABLE nodes ADD COLUMN failure TEXT;
ALTER TABLE requests ADD COLUMN last_failure TEXT;
"#,
    // A request's idempotency key (`Request::key`) and its metadata
    // (`Request::metadata`, a JSON object of strings); NULL for none, and
    // in rows stored before this step.
    r#"
ALTER TABLE requests ADD COLUMN idempotency_key TEXT;
ALTER TABLE requests ADD COLUMN metadata TEXT;
"#,
];

/// The database's schema version.
pub(super) fn version(conn: &Connection) -> Result<u32, StoreError> {
    conn.pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(|source| StoreError::Sql {
            doing: "reading the schema version",
            source,
        })
}

/// Applies the steps of `steps` the database does not have yet, each in its
/// own transaction together with its version bump, so a failed step leaves
/// the database at the previous version. A database newer than `steps` is
/// refused: this build cannot know what the newer steps changed.
pub(super) fn migrate(conn: &mut Connection, steps: &[&str]) -> Result<(), StoreError> {
    let found = version(conn)?;
    let known = u32::try_from(steps.len()).unwrap_or(u32::MAX);
    if found > known {
        return Err(StoreError::TooNew { found, known });
    }
    for (version, step) in (1..).zip(steps).skip(found as usize) {
        let err = |source| StoreError::Migrate {
            from: version - 1,
            to: version,
            source,
        };
        let tx = conn.transaction().map_err(err)?;
        tx.execute_batch(step).map_err(err)?;
        tx.pragma_update(None, "user_version", version)
            .map_err(err)?;
        tx.commit().map_err(err)?;
    }
    Ok(())
}
