//! The embedded store: SQLite in WAL mode, holding nodes, requests and slot
//! assignments. The runtime commits the core's [`Changes`] in one
//! transaction before it makes any cloud call (intent before act) and loads a
//! [`Snapshot`] at start. Rows live only here: the rest of berth sees core
//! types.
//!
//! Rows name labels and providers, not indexes, so that a config change
//! between runs never silently remaps a node. A record that no longer fits
//! the config is dropped with a note (a node's instance still carries the
//! pool id, so the reconciler deletes it as a leak after the grace period) or,
//! for a pending request, failed with a reason.
//!
//! A PostgreSQL store for several berth processes implements the same trait;
//! ARCHITECTURE.md says how those processes avoid deciding the same thing
//! twice (provider leases, conditional commits).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use rusqlite::{Connection, Transaction, params};

use crate::config::{Config, LabelIx, ProviderIx};
use crate::driver::{Addresses, Connection as Login};
use crate::pool::{
    Changes, DeleteReason, Endpoint, GoneReason, Idle, Node, NodeId, NodeState, Request, RequestId,
    RequestState, Resources, Role, Snapshot, Time,
};

/// Where the pool's records are kept.
pub trait Store: Send {
    /// Everything stored, as core types, checked against the config.
    fn load(&mut self, config: &Config) -> Result<Loaded, StoreError>;
    /// Writes `changes` atomically.
    fn commit(&mut self, changes: &Changes) -> Result<(), StoreError>;
}

/// What [`Store::load`] found.
#[derive(Clone, Debug, Default)]
pub struct Loaded {
    pub snapshot: Snapshot,
    /// Records that no longer fit the config, said in words.
    pub dropped: Vec<String>,
}

/// Why the store could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("opening {path}: {source}")]
    Open {
        path: String,
        source: rusqlite::Error,
    },
    #[error(
        "the store's schema version {found} is newer than this berth knows ({known}); use a newer berth"
    )]
    TooNew { found: u32, known: u32 },
    #[error("migrating the store to version {version}: {source}")]
    Migrate {
        version: u32,
        source: rusqlite::Error,
    },
    #[error("{doing}: {source}")]
    Sql {
        doing: &'static str,
        source: rusqlite::Error,
    },
    #[error("corrupt row in {table} ({id}): {what}")]
    Corrupt {
        table: &'static str,
        id: String,
        what: String,
    },
}

fn sql(doing: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
    move |source| StoreError::Sql { doing, source }
}

/// Schema steps, in order; the version is `PRAGMA user_version`. A released
/// step is never edited: a change is a new step.
const MIGRATIONS: &[&str] = &[r#"
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
    label TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (request, label)
);
CREATE TABLE request_nodes (
    request TEXT NOT NULL,
    position INTEGER NOT NULL,
    node TEXT NOT NULL,
    PRIMARY KEY (request, position)
);
"#];

/// The SQLite store.
pub struct SqliteStore {
    conn: Connection,
    config: Arc<Config>,
}

impl SqliteStore {
    /// Opens (creating if missing) the store at `path` and brings its schema
    /// up to date.
    pub fn open(path: &Path, config: Arc<Config>) -> Result<SqliteStore, StoreError> {
        let conn = Connection::open(path).map_err(|source| StoreError::Open {
            path: path.display().to_string(),
            source,
        })?;
        Self::setup(conn, config)
    }

    pub fn open_in_memory(config: Arc<Config>) -> Result<SqliteStore, StoreError> {
        let conn = Connection::open_in_memory().map_err(|source| StoreError::Open {
            path: ":memory:".into(),
            source,
        })?;
        Self::setup(conn, config)
    }

    fn setup(conn: Connection, config: Arc<Config>) -> Result<SqliteStore, StoreError> {
        // WAL with synchronous=NORMAL: a commit survives the process being
        // killed (SIGKILL included); only a power loss may lose the last few.
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(sql("setting WAL mode"))?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(sql("setting synchronous"))?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(sql("setting the busy timeout"))?;
        let mut store = SqliteStore { conn, config };
        store.migrate(MIGRATIONS)?;
        Ok(store)
    }

    pub fn schema_version(&self) -> Result<u32, StoreError> {
        self.conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(sql("reading the schema version"))
    }

    fn migrate(&mut self, steps: &[&str]) -> Result<(), StoreError> {
        let found = self.schema_version()?;
        let known = steps.len() as u32;
        if found > known {
            return Err(StoreError::TooNew { found, known });
        }
        for (i, step) in steps.iter().enumerate().skip(found as usize) {
            let version = i as u32 + 1;
            let err = |source| StoreError::Migrate { version, source };
            let tx = self.conn.transaction().map_err(err)?;
            tx.execute_batch(step).map_err(err)?;
            tx.pragma_update(None, "user_version", version)
                .map_err(err)?;
            tx.commit().map_err(err)?;
        }
        Ok(())
    }
}

// ---- rows -----------------------------------------------------------------

/// Endpoint as stored (JSON); core types stay free of serde.
#[derive(serde::Serialize, serde::Deserialize)]
struct EndpointRow {
    public_ipv4: Option<String>,
    private_ipv4: Option<String>,
    ipv6: Option<String>,
    hostname: Option<String>,
    username: Option<String>,
    port: Option<u16>,
    #[serde(default)]
    host_keys: Vec<String>,
}

impl From<&Endpoint> for EndpointRow {
    fn from(e: &Endpoint) -> Self {
        EndpointRow {
            public_ipv4: e.addresses.public_ipv4.clone(),
            private_ipv4: e.addresses.private_ipv4.clone(),
            ipv6: e.addresses.ipv6.clone(),
            hostname: e.addresses.hostname.clone(),
            username: e.connection.username.clone(),
            port: e.connection.port,
            host_keys: e.connection.host_keys.clone(),
        }
    }
}

impl From<EndpointRow> for Endpoint {
    fn from(r: EndpointRow) -> Self {
        Endpoint {
            addresses: Addresses {
                public_ipv4: r.public_ipv4,
                private_ipv4: r.private_ipv4,
                ipv6: r.ipv6,
                hostname: r.hostname,
            },
            connection: Login {
                username: r.username,
                port: r.port,
                host_keys: r.host_keys,
            },
        }
    }
}

/// The state columns of a node: name, since, attempt, request, reason.
fn state_columns(s: &NodeState) -> (&'static str, u64, u32, Option<String>, Option<String>) {
    match s {
        NodeState::Creating { since, attempt } => ("creating", since.0, *attempt, None, None),
        NodeState::Booting { since } => ("booting", since.0, 0, None, None),
        NodeState::Ready { since } => ("ready", since.0, 0, None, None),
        NodeState::InUse { request, since } => {
            ("in-use", since.0, 0, Some(request.to_string()), None)
        }
        NodeState::Used { since } => ("used", since.0, 0, None, None),
        NodeState::Deleting { since, reason } => {
            ("deleting", since.0, 0, None, Some(reason.as_str().into()))
        }
        NodeState::Gone { since, reason } => {
            ("gone", since.0, 0, None, Some(reason.as_str().into()))
        }
        NodeState::Failed { since, reason } => ("failed", since.0, 0, None, Some(reason.clone())),
    }
}

struct NodeRow {
    id: String,
    label: String,
    provider: String,
    instance_type: String,
    vcpus: u32,
    ram_mib: u64,
    price: f64,
    instance: Option<String>,
    state: String,
    since: u64,
    attempt: u32,
    request: Option<String>,
    reason: Option<String>,
    idle: String,
    role: String,
    slot_label: Option<String>,
    slot_count: Option<u16>,
    free_since: Option<u64>,
    assigned: Option<String>,
    created: u64,
    endpoint: Option<String>,
}

impl Store for SqliteStore {
    fn load(&mut self, config: &Config) -> Result<Loaded, StoreError> {
        let mut dropped = Vec::new();
        let corrupt = |table, id: &str, what: String| StoreError::Corrupt {
            table,
            id: id.to_owned(),
            what,
        };
        // Slot assignments first: both ends of a slot are rebuilt from them.
        let mut slots: Vec<(String, u16, String)> = Vec::new();
        {
            let mut stmt = self
                .conn
                .prepare("SELECT backing, idx, node FROM slots")
                .map_err(sql("reading slots"))?;
            let rows = stmt
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .map_err(sql("reading slots"))?;
            for row in rows {
                slots.push(row.map_err(sql("reading slots"))?);
            }
        }
        let mut rows = Vec::new();
        {
            let mut stmt = self
                .conn
                .prepare(
                    "SELECT id, label, provider, instance_type, vcpus, ram_mib, price, instance,
                            state, since, attempt, request, reason, idle, role, slot_label,
                            slot_count, free_since, assigned, created, endpoint FROM nodes",
                )
                .map_err(sql("reading nodes"))?;
            let it = stmt
                .query_map([], |r| {
                    Ok(NodeRow {
                        id: r.get(0)?,
                        label: r.get(1)?,
                        provider: r.get(2)?,
                        instance_type: r.get(3)?,
                        vcpus: r.get(4)?,
                        ram_mib: r.get(5)?,
                        price: r.get(6)?,
                        instance: r.get(7)?,
                        state: r.get(8)?,
                        since: r.get(9)?,
                        attempt: r.get(10)?,
                        request: r.get(11)?,
                        reason: r.get(12)?,
                        idle: r.get(13)?,
                        role: r.get(14)?,
                        slot_label: r.get(15)?,
                        slot_count: r.get(16)?,
                        free_since: r.get(17)?,
                        assigned: r.get(18)?,
                        created: r.get(19)?,
                        endpoint: r.get(20)?,
                    })
                })
                .map_err(sql("reading nodes"))?;
            for row in it {
                rows.push(row.map_err(sql("reading nodes"))?);
            }
        }
        let mut nodes: HashMap<NodeId, Node> = HashMap::new();
        let mut slot_nodes = Vec::new();
        for row in rows {
            let id: NodeId = row
                .id
                .parse()
                .map_err(|()| corrupt("nodes", &row.id, "bad id".into()))?;
            let (Some(label), Some(provider)) =
                (config.label(&row.label), config.provider(&row.provider))
            else {
                dropped.push(format!(
                    "node {id} (label `{}`, provider `{}`): no longer configured; its instance will be deleted as a leak",
                    row.label, row.provider
                ));
                continue;
            };
            if row.role == "slot" {
                slot_nodes.push(id);
            }
            let node = node_from_row(row, id, label, provider, config).map_err(|(col, what)| {
                corrupt("nodes", &id.to_string(), format!("{col}: {what}"))
            })?;
            nodes.insert(id, node);
        }
        for (backing, idx, node) in slots {
            let (Ok(b), Ok(n)) = (backing.parse::<NodeId>(), node.parse::<NodeId>()) else {
                return Err(corrupt("slots", &backing, "bad id".into()));
            };
            let live = nodes.get(&n).is_some_and(|n| !n.state.is_final())
                && matches!(nodes.get(&b).map(|b| &b.role), Some(Role::Backing { slots, .. }) if usize::from(idx) < slots.len());
            if !live {
                dropped.push(format!("slot {idx} of {b}: held by {n}, which is gone"));
                continue;
            }
            if let Some(Role::Backing { slots, .. }) = nodes.get_mut(&b).map(|b| &mut b.role) {
                slots[usize::from(idx)] = Some(n);
            }
            if let Some(node) = nodes.get_mut(&n) {
                node.role = Role::Slot {
                    backing: b,
                    index: idx,
                };
            }
        }
        // A slot node whose slot row is missing cannot be placed: end it.
        for id in slot_nodes {
            let Some(node) = nodes.get_mut(&id) else {
                continue;
            };
            if node.role == Role::Plain && !node.state.is_final() {
                dropped.push(format!("slot node {} has no slot", node.id));
                node.state = NodeState::Gone {
                    since: node_since(&node.state),
                    reason: GoneReason::BackingLost,
                };
            }
        }
        let requests = self.load_requests(config)?;
        Ok(Loaded {
            snapshot: Snapshot {
                nodes: nodes.into_values().collect(),
                requests,
            },
            dropped,
        })
    }

    fn commit(&mut self, changes: &Changes) -> Result<(), StoreError> {
        let tx = self.conn.transaction().map_err(sql("starting a commit"))?;
        write(&tx, &self.config, changes)?;
        tx.commit().map_err(sql("committing"))
    }
}

fn node_since(s: &NodeState) -> Time {
    Time(state_columns(s).1)
}

fn node_from_row(
    row: NodeRow,
    id: NodeId,
    label: LabelIx,
    provider: ProviderIx,
    config: &Config,
) -> Result<Node, (&'static str, String)> {
    let since = Time(row.since);
    let request = || -> Result<RequestId, (&'static str, String)> {
        row.request
            .as_deref()
            .and_then(|r| r.parse().ok())
            .ok_or(("request", format!("{:?}", row.request)))
    };
    let reason = row.reason.clone().unwrap_or_default();
    let state = match row.state.as_str() {
        "creating" => NodeState::Creating {
            since,
            attempt: row.attempt,
        },
        "booting" => NodeState::Booting { since },
        "ready" => NodeState::Ready { since },
        "in-use" => NodeState::InUse {
            request: request()?,
            since,
        },
        "used" => NodeState::Used { since },
        "deleting" => NodeState::Deleting {
            since,
            reason: DeleteReason::parse(&reason).ok_or(("reason", reason.clone()))?,
        },
        "gone" => NodeState::Gone {
            since,
            reason: GoneReason::parse(&reason).ok_or(("reason", reason.clone()))?,
        },
        "failed" => NodeState::Failed { since, reason },
        other => return Err(("state", other.to_owned())),
    };
    let role = match row.role.as_str() {
        "plain" | "slot" => Role::Plain,
        "backing" => {
            let slot_label = row
                .slot_label
                .as_deref()
                .and_then(|l| config.label(l))
                .ok_or(("slot_label", format!("{:?}", row.slot_label)))?;
            Role::Backing {
                slot_label,
                slots: vec![None; usize::from(row.slot_count.unwrap_or(0))],
                free_since: row.free_since.map(Time),
            }
        }
        other => return Err(("role", other.to_owned())),
    };
    let endpoint = match row.endpoint {
        None => None,
        Some(text) => Some(Box::new(Endpoint::from(
            serde_json::from_str::<EndpointRow>(&text).map_err(|e| ("endpoint", e.to_string()))?,
        ))),
    };
    Ok(Node {
        id,
        label,
        provider,
        instance_type: row.instance_type,
        resources: Resources {
            vcpus: row.vcpus,
            ram_mib: row.ram_mib,
        },
        price: row.price,
        instance: row.instance,
        state,
        idle: Idle::parse(&row.idle).ok_or(("idle", row.idle.clone()))?,
        role,
        assigned: row.assigned.as_deref().and_then(|r| r.parse().ok()),
        created: Time(row.created),
        endpoint,
    })
}

impl SqliteStore {
    fn load_requests(&mut self, config: &Config) -> Result<Vec<Request>, StoreError> {
        let mut wants: HashMap<String, Vec<(String, u32)>> = HashMap::new();
        let mut members: HashMap<String, Vec<String>> = HashMap::new();
        {
            let mut stmt = self
                .conn
                .prepare("SELECT request, label, count FROM request_wants ORDER BY rowid")
                .map_err(sql("reading request wants"))?;
            let rows = stmt
                .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get(1)?, r.get(2)?)))
                .map_err(sql("reading request wants"))?;
            for row in rows {
                let (req, label, count) = row.map_err(sql("reading request wants"))?;
                wants.entry(req).or_default().push((label, count));
            }
            let mut stmt = self
                .conn
                .prepare("SELECT request, node FROM request_nodes ORDER BY request, position")
                .map_err(sql("reading request nodes"))?;
            let rows = stmt
                .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
                .map_err(sql("reading request nodes"))?;
            for row in rows {
                let (req, node) = row.map_err(sql("reading request nodes"))?;
                members.entry(req).or_default().push(node);
            }
        }
        let mut stmt = self
            .conn
            .prepare("SELECT id, requestor, priority, created, state, at, reason, failures FROM requests")
            .map_err(sql("reading requests"))?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i32>(2)?,
                    r.get::<_, u64>(3)?,
                    r.get::<_, String>(4)?,
                    r.get::<_, Option<u64>>(5)?,
                    r.get::<_, Option<String>>(6)?,
                    r.get::<_, u32>(7)?,
                ))
            })
            .map_err(sql("reading requests"))?;
        let mut out = Vec::new();
        for row in rows {
            let (id, requestor, priority, created, state, at, reason, failures) =
                row.map_err(sql("reading requests"))?;
            let corrupt = |what: String| StoreError::Corrupt {
                table: "requests",
                id: id.clone(),
                what,
            };
            let rid: RequestId = id.parse().map_err(|()| corrupt("bad id".into()))?;
            let at = Time(at.unwrap_or(created));
            let mut state = match state.as_str() {
                "pending" => RequestState::Pending,
                "fulfilled" => RequestState::Fulfilled { at },
                "failed" => RequestState::Failed {
                    at,
                    reason: reason.unwrap_or_default(),
                },
                "cancelled" => RequestState::Cancelled { at },
                other => return Err(corrupt(format!("state: {other}"))),
            };
            let mut labels = Vec::new();
            for (label, count) in wants.remove(&id).unwrap_or_default() {
                match config.label(&label) {
                    Some(l) => labels.push((l, count)),
                    None if state == RequestState::Pending => {
                        state = RequestState::Failed {
                            at,
                            reason: format!("label `{label}` is no longer configured"),
                        };
                    }
                    None => {}
                }
            }
            let mut nodes = Vec::new();
            for n in members.remove(&id).unwrap_or_default() {
                nodes.push(n.parse().map_err(|()| corrupt(format!("node {n}")))?);
            }
            if !matches!(
                state,
                RequestState::Pending | RequestState::Fulfilled { .. }
            ) {
                nodes.clear();
            }
            out.push(Request {
                id: rid,
                requestor,
                priority,
                created: Time(created),
                wants: labels,
                state,
                nodes,
                failures,
            });
        }
        Ok(out)
    }
}

fn write(tx: &Transaction<'_>, config: &Config, changes: &Changes) -> Result<(), StoreError> {
    let mut upsert = tx
        .prepare_cached(
            "INSERT INTO nodes (id, label, provider, instance_type, vcpus, ram_mib, price, instance,
                state, since, attempt, request, reason, idle, role, slot_label, slot_count,
                free_since, assigned, created, endpoint)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17,
                ?18, ?19, ?20, ?21)
             ON CONFLICT (id) DO UPDATE SET label = ?2, provider = ?3, instance_type = ?4,
                vcpus = ?5, ram_mib = ?6, price = ?7, instance = ?8, state = ?9, since = ?10,
                attempt = ?11, request = ?12, reason = ?13, idle = ?14, role = ?15,
                slot_label = ?16, slot_count = ?17, free_since = ?18, assigned = ?19,
                created = ?20, endpoint = ?21, version = version + 1",
        )
        .map_err(sql("preparing the node write"))?;
    let mut clear_slots = tx
        .prepare_cached("DELETE FROM slots WHERE backing = ?1")
        .map_err(sql("preparing the slot write"))?;
    let mut put_slot = tx
        .prepare_cached("INSERT INTO slots (backing, idx, node) VALUES (?1, ?2, ?3)")
        .map_err(sql("preparing the slot write"))?;
    // Slots are rewritten after every node: a commit that frees a slot on one
    // backing node and fills another must not collide with itself.
    let mut backings = Vec::new();
    for n in &changes.nodes {
        let (state, since, attempt, request, reason) = state_columns(&n.state);
        let (role, slot_label, slot_count, free_since) = match &n.role {
            Role::Plain => ("plain", None, None, None),
            Role::Slot { .. } => ("slot", None, None, None),
            Role::Backing {
                slot_label,
                slots,
                free_since,
            } => (
                "backing",
                Some(config[*slot_label].name.as_str()),
                Some(slots.len() as u32),
                free_since.map(|t| t.0),
            ),
        };
        let endpoint = match &n.endpoint {
            Some(e) => Some(
                serde_json::to_string(&EndpointRow::from(e.as_ref())).map_err(|e| {
                    StoreError::Corrupt {
                        table: "nodes",
                        id: n.id.to_string(),
                        what: format!("endpoint: {e}"),
                    }
                })?,
            ),
            None => None,
        };
        upsert
            .execute(params![
                n.id.to_string(),
                config[n.label].name,
                config[n.provider].name,
                n.instance_type,
                n.resources.vcpus,
                n.resources.ram_mib,
                n.price,
                n.instance,
                state,
                since,
                attempt,
                request,
                reason,
                n.idle.as_str(),
                role,
                slot_label,
                slot_count,
                free_since,
                n.assigned.map(|r| r.to_string()),
                n.created.0,
                endpoint,
            ])
            .map_err(sql("writing a node"))?;
        if let Role::Backing { slots, .. } = &n.role {
            clear_slots
                .execute([n.id.to_string()])
                .map_err(sql("writing slots"))?;
            backings.push((n.id, slots));
        }
    }
    for (id, slots) in backings {
        for (i, s) in slots.iter().enumerate() {
            if let Some(node) = s {
                put_slot
                    .execute(params![id.to_string(), i as u32, node.to_string()])
                    .map_err(sql("writing a slot assignment"))?;
            }
        }
    }
    let mut del_node = tx
        .prepare_cached("DELETE FROM nodes WHERE id = ?1")
        .map_err(sql("preparing the purge"))?;
    let mut del_slots = tx
        .prepare_cached("DELETE FROM slots WHERE backing = ?1 OR node = ?1")
        .map_err(sql("preparing the purge"))?;
    for id in &changes.purged_nodes {
        del_node
            .execute([id.to_string()])
            .map_err(sql("purging a node"))?;
        del_slots
            .execute([id.to_string()])
            .map_err(sql("purging slots"))?;
    }
    let mut put_req = tx
        .prepare_cached(
            "INSERT INTO requests (id, requestor, priority, created, state, at, reason, failures)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
             ON CONFLICT (id) DO UPDATE SET state = ?5, at = ?6, reason = ?7, failures = ?8,
                version = version + 1",
        )
        .map_err(sql("preparing the request write"))?;
    let mut del_wants = tx
        .prepare_cached("DELETE FROM request_wants WHERE request = ?1")
        .map_err(sql("preparing the request write"))?;
    let mut put_want = tx
        .prepare_cached("INSERT INTO request_wants (request, label, count) VALUES (?1, ?2, ?3)")
        .map_err(sql("preparing the request write"))?;
    let mut del_members = tx
        .prepare_cached("DELETE FROM request_nodes WHERE request = ?1")
        .map_err(sql("preparing the request write"))?;
    let mut put_member = tx
        .prepare_cached("INSERT INTO request_nodes (request, position, node) VALUES (?1, ?2, ?3)")
        .map_err(sql("preparing the request write"))?;
    for r in &changes.requests {
        let id = r.id.to_string();
        let (state, at, reason) = match &r.state {
            RequestState::Pending => ("pending", None, None),
            RequestState::Fulfilled { at } => ("fulfilled", Some(at.0), None),
            RequestState::Failed { at, reason } => ("failed", Some(at.0), Some(reason.as_str())),
            RequestState::Cancelled { at } => ("cancelled", Some(at.0), None),
        };
        put_req
            .execute(params![
                id,
                r.requestor,
                r.priority,
                r.created.0,
                state,
                at,
                reason,
                r.failures
            ])
            .map_err(sql("writing a request"))?;
        del_wants.execute([&id]).map_err(sql("writing a request"))?;
        for (label, count) in &r.wants {
            put_want
                .execute(params![id, config[*label].name, count])
                .map_err(sql("writing a request"))?;
        }
        del_members
            .execute([&id])
            .map_err(sql("writing a request"))?;
        for (i, n) in r.nodes.iter().enumerate() {
            put_member
                .execute(params![id, i as u32, n.to_string()])
                .map_err(sql("writing a request"))?;
        }
    }
    for id in &changes.purged_requests {
        let id = id.to_string();
        for q in [
            "DELETE FROM requests WHERE id = ?1",
            "DELETE FROM request_wants WHERE request = ?1",
            "DELETE FROM request_nodes WHERE request = ?1",
        ] {
            tx.prepare_cached(q)
                .and_then(|mut s| s.execute([&id]))
                .map_err(sql("purging a request"))?;
        }
    }
    Ok(())
}

/// Whether a stored row exists, for tests.
#[cfg(test)]
fn node_row_exists(store: &SqliteStore, id: NodeId) -> bool {
    use rusqlite::OptionalExtension;
    store
        .conn
        .query_row(
            "SELECT 1 FROM nodes WHERE id = ?1",
            [id.to_string()],
            |_| Ok(()),
        )
        .optional()
        .ok()
        .flatten()
        .is_some()
}

#[cfg(test)]
mod tests;
