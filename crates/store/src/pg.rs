//! The PostgreSQL store: the same rows, the same commit and the same load as
//! the embedded SQLite store (`write::plan`, `load::assemble`), over one
//! `tokio-postgres` connection.
//!
//! Several berth processes can open one database. One of them holds the
//! pool at a time, under a lease row with an epoch ([`PgStore::claim`]):
//! its every commit first renews that lease in the same transaction, and
//! fails as [`StoreError::Fenced`] once another process has taken the pool
//! over, so a process that lost the pool (it was paused, or cut off) cannot
//! write anything, and so cannot start a cloud call on a stale decision.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::types::{IsNull, ToSql, Type, to_sql_checked};
use tokio_postgres::{Client, IsolationLevel, Statement};

use super::connect::{DEADLINE_MIN, FENCED, LEASES_CHANNEL, Login, NOTIFY_POOL, connect};
use super::error::{StoreError, pg};
use super::value::{Cells, Val};
use super::{
    Claimant, Holding, InboxEntry, Loaded, Store, StoreFuture, Tenure, inbox, load, write,
};
use berth_core::config::Config;
use berth_core::pool::Changes;
use strum::IntoEnumIterator;

/// Schema steps, in order; step `i` takes the database to version `i + 1`,
/// kept in `berth_schema`. A step that has shipped is never edited. The
/// tables are SQLite's (see `schema::MIGRATIONS`) in PostgreSQL's types:
/// integers are `BIGINT`, as [`Val::Int`] is.
pub(super) const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE nodes (
    id TEXT PRIMARY KEY,
    label TEXT NOT NULL,
    provider TEXT NOT NULL,
    instance_type TEXT NOT NULL,
    vcpus BIGINT NOT NULL,
    ram_mib BIGINT NOT NULL,
    price DOUBLE PRECISION NOT NULL,
    instance TEXT,
    state TEXT NOT NULL,
    since BIGINT NOT NULL,
    attempt BIGINT NOT NULL DEFAULT 0,
    request TEXT,
    reason TEXT,
    idle TEXT NOT NULL,
    role TEXT NOT NULL,
    slot_label TEXT,
    slot_count BIGINT,
    free_since BIGINT,
    slot_backing TEXT,
    slot_index BIGINT,
    assigned TEXT,
    created BIGINT NOT NULL,
    endpoint TEXT,
    version BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE slots (
    backing TEXT NOT NULL,
    idx BIGINT NOT NULL,
    node TEXT NOT NULL UNIQUE,
    PRIMARY KEY (backing, idx)
);
CREATE TABLE requests (
    id TEXT PRIMARY KEY,
    requestor TEXT NOT NULL,
    priority BIGINT NOT NULL,
    created BIGINT NOT NULL,
    state TEXT NOT NULL,
    at BIGINT,
    reason TEXT,
    failures BIGINT NOT NULL DEFAULT 0,
    version BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE request_wants (
    request TEXT NOT NULL,
    position BIGINT NOT NULL,
    label TEXT NOT NULL,
    count BIGINT NOT NULL,
    PRIMARY KEY (request, position),
    UNIQUE (request, label)
);
CREATE TABLE request_nodes (
    request TEXT NOT NULL,
    position BIGINT NOT NULL,
    node TEXT NOT NULL,
    PRIMARY KEY (request, position)
);
CREATE TABLE leases (
    requestor TEXT PRIMARY KEY,
    expires BIGINT NOT NULL,
    version BIGINT NOT NULL DEFAULT 0
);
"#,
    r#"
CREATE TABLE pool_lease (
    scope TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    address TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    expires TIMESTAMPTZ NOT NULL
);
CREATE FUNCTION berth_fence(who TEXT, held BIGINT, ttl_ms BIGINT) RETURNS TIMESTAMPTZ
LANGUAGE plpgsql AS $$
DECLARE
    until TIMESTAMPTZ;
BEGIN
    UPDATE pool_lease SET expires = clock_timestamp() + ttl_ms * INTERVAL '1 millisecond'
     WHERE scope = 'pool' AND holder = who AND epoch = held
     RETURNING expires INTO until;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the pool lease of epoch % is no longer held by %', held, who
            USING ERRCODE = 'BE001';
    END IF;
    RETURN until;
END $$;
"#,
    r#"
CREATE TABLE driver_records (
    provider TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (provider, key)
);
CREATE FUNCTION berth_record_cas(who TEXT, prov TEXT, k TEXT, expected TEXT, v TEXT, max_keys BIGINT)
RETURNS BIGINT LANGUAGE plpgsql AS $$
DECLARE
    current TEXT;
    present BOOLEAN;
    held BIGINT;
BEGIN
    IF who IS NOT NULL THEN
        PERFORM 1 FROM pool_lease
         WHERE scope = 'pool' AND holder = who AND expires > clock_timestamp()
           FOR SHARE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'the pool lease is no longer held by %', who
                USING ERRCODE = 'BE001';
        END IF;
    END IF;
    SELECT value INTO current FROM driver_records
     WHERE provider = prov AND key = k FOR UPDATE;
    present := FOUND;
    IF present IS DISTINCT FROM (expected IS NOT NULL)
       OR (present AND current IS DISTINCT FROM expected) THEN
        RETURN 0;
    END IF;
    IF v IS NULL THEN
        DELETE FROM driver_records WHERE provider = prov AND key = k;
        RETURN 1;
    END IF;
    IF present THEN
        UPDATE driver_records SET value = v WHERE provider = prov AND key = k;
        RETURN 1;
    END IF;
    SELECT count(*) INTO held FROM driver_records WHERE provider = prov;
    IF held >= max_keys THEN
        RETURN -held;
    END IF;
    INSERT INTO driver_records (provider, key, value) VALUES (prov, k, v)
        ON CONFLICT (provider, key) DO NOTHING;
    IF FOUND THEN
        RETURN 1;
    END IF;
    RETURN 0;
END $$;
"#,
    r#"
CREATE TABLE provider_lease (
    provider TEXT PRIMARY KEY,
    holder TEXT NOT NULL DEFAULT '',
    address TEXT NOT NULL DEFAULT '',
    epoch BIGINT NOT NULL DEFAULT 0,
    expires TIMESTAMPTZ NOT NULL DEFAULT '-infinity'
);
CREATE TABLE members (
    holder TEXT PRIMARY KEY,
    address TEXT NOT NULL,
    expires TIMESTAMPTZ NOT NULL
);
CREATE TABLE peer_secret (
    id INT PRIMARY KEY CHECK (id = 1),
    secret TEXT NOT NULL
);
INSERT INTO peer_secret
    SELECT 1, encode(sha256(convert_to(gen_random_uuid()::TEXT || gen_random_uuid()::TEXT, 'UTF8')), 'hex');
CREATE FUNCTION berth_shards(who TEXT, addr TEXT, ttl_ms BIGINT, provs TEXT[], keep TEXT[])
RETURNS TABLE (provider TEXT, holder TEXT, address TEXT, epoch BIGINT, expires TIMESTAMPTZ,
               remaining_ms BIGINT, members BIGINT)
LANGUAGE plpgsql AS $$
DECLARE
    now_ TIMESTAMPTZ := clock_timestamp();
    until TIMESTAMPTZ := now_ + ttl_ms * INTERVAL '1 millisecond';
    live BIGINT;
    share BIGINT;
    mine BIGINT;
BEGIN
    INSERT INTO members AS m (holder, address, expires) VALUES (who, addr, until)
        ON CONFLICT ON CONSTRAINT members_pkey
        DO UPDATE SET address = EXCLUDED.address, expires = EXCLUDED.expires;
    DELETE FROM members AS m WHERE m.expires < now_ - INTERVAL '1 hour';
    INSERT INTO provider_lease (provider) SELECT unnest(provs)
        ON CONFLICT ON CONSTRAINT provider_lease_pkey DO NOTHING;
    UPDATE provider_lease AS l SET expires = until
     WHERE l.holder = who AND l.provider = ANY(keep) AND l.provider = ANY(provs);
    SELECT count(*) INTO live FROM members AS m WHERE m.expires > now_;
    share := (cardinality(provs) + live - 1) / live;
    SELECT count(*) INTO mine FROM provider_lease AS l
     WHERE l.holder = who AND l.expires > now_ AND l.provider = ANY(provs);
    IF mine < share THEN
        UPDATE provider_lease AS l
           SET holder = who, address = addr, epoch = l.epoch + 1, expires = until
         WHERE l.provider IN (
             SELECT f.provider FROM provider_lease AS f
              WHERE f.provider = ANY(provs) AND f.expires <= now_
              ORDER BY f.provider LIMIT share - mine
                FOR UPDATE SKIP LOCKED);
    END IF;
    RETURN QUERY
        SELECT l.provider, l.holder, l.address, l.epoch,
               CASE WHEN l.expires > now_ THEN l.expires END,
               GREATEST(EXTRACT(EPOCH FROM l.expires - now_) * 1000, 0)::BIGINT, live
          FROM provider_lease AS l WHERE l.provider = ANY(provs)
        UNION ALL
        SELECT NULL, p.holder, p.address, p.epoch,
               CASE WHEN p.expires > now_ THEN p.expires END,
               GREATEST(EXTRACT(EPOCH FROM p.expires - now_) * 1000, 0)::BIGINT, live
          FROM pool_lease AS p WHERE p.scope = 'pool';
END $$;
CREATE OR REPLACE FUNCTION berth_record_cas(who TEXT, prov TEXT, k TEXT, expected TEXT, v TEXT, max_keys BIGINT)
RETURNS BIGINT LANGUAGE plpgsql AS $$
DECLARE
    current TEXT;
    present BOOLEAN;
    held BIGINT;
BEGIN
    IF who IS NOT NULL THEN
        PERFORM 1 FROM provider_lease
         WHERE provider = prov AND holder = who AND expires > clock_timestamp()
           FOR SHARE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'the lease of provider % is no longer held by %', prov, who
                USING ERRCODE = 'BE001';
        END IF;
    END IF;
    SELECT value INTO current FROM driver_records
     WHERE provider = prov AND key = k FOR UPDATE;
    present := FOUND;
    IF present IS DISTINCT FROM (expected IS NOT NULL)
       OR (present AND current IS DISTINCT FROM expected) THEN
        RETURN 0;
    END IF;
    IF v IS NULL THEN
        DELETE FROM driver_records WHERE provider = prov AND key = k;
        RETURN 1;
    END IF;
    IF present THEN
        UPDATE driver_records SET value = v WHERE provider = prov AND key = k;
        RETURN 1;
    END IF;
    SELECT count(*) INTO held FROM driver_records WHERE provider = prov;
    IF held >= max_keys THEN
        RETURN -held;
    END IF;
    INSERT INTO driver_records (provider, key, value) VALUES (prov, k, v)
        ON CONFLICT (provider, key) DO NOTHING;
    IF FOUND THEN
        RETURN 1;
    END IF;
    RETURN 0;
END $$;
"#,
    // As SQLite's step 3: how long a lease's last renewal made it last.
    r#"
ALTER TABLE leases ADD COLUMN ttl BIGINT;
"#,
    // A commit's check that a statement changed the rows it had to, made
    // in the server so that a commit is one round trip (see `pipeline`).
    r#"
CREATE FUNCTION berth_expect(changed BIGINT, expected BIGINT) RETURNS BIGINT
LANGUAGE plpgsql AS $$
BEGIN
    IF changed <> expected THEN
        RAISE EXCEPTION 'a row changed % rows where % were expected', changed, expected
            USING ERRCODE = 'BE002';
    END IF;
    RETURN changed;
END $$;
"#,
    // The requests inbox (`inbox.rs`); its checks keep each row readable.
    r#"
CREATE TABLE request_inbox (
    id TEXT PRIMARY KEY CHECK (id ~ '^r-[0-9a-f]{16}$'),
    seq BIGSERIAL NOT NULL,
    requestor TEXT NOT NULL,
    priority BIGINT NOT NULL CHECK (priority BETWEEN -2147483648 AND 2147483647),
    created BIGINT NOT NULL CHECK (created >= 0),
    labels TEXT[] NOT NULL,
    counts BIGINT[] NOT NULL
        CHECK (cardinality(counts) = cardinality(labels)
               AND 0 <= ALL(counts) AND 4294967295 >= ALL(counts)),
    accepted_by TEXT NOT NULL
);
CREATE INDEX request_inbox_seq ON request_inbox (seq);
"#,
    // The store's identity (`identity.rs`), put in by the first process to
    // open the store after this step; its checks keep the row readable.
    r#"
CREATE TABLE pool_identity (
    id BIGINT PRIMARY KEY CHECK (id = 1),
    generation TEXT NOT NULL CHECK (generation ~ '^[0-9a-f]{16}$'),
    key TEXT NOT NULL CHECK (key ~ '^[0-9a-f]{64}$'),
    confirmed BIGINT NOT NULL CHECK (confirmed IN (0, 1))
);
"#,
];

/// The SQLSTATE `berth_expect` raises when a statement changed other rows
/// than it had to.
const CONFLICT: &str = "BE002";

/// `stmt`'s text for PostgreSQL: a statement whose changed rows are
/// checked ([`write::Stmt::is_checked`]) becomes a query that raises
/// [`CONFLICT`] unless it changed as many rows as its one more parameter
/// says.
fn pg_text(stmt: write::Stmt) -> String {
    let text = stmt.dollar_sql();
    if !stmt.is_checked() {
        return text.to_owned();
    }
    // The parameters are $1 to $n; the expected count is $n+1.
    let n = text
        .split('$')
        .skip(1)
        .filter_map(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<usize>().ok()
        })
        .max()
        .unwrap_or(0);
    format!(
        "WITH w AS ({text} RETURNING 1) SELECT berth_expect(count(*), ${}::BIGINT) FROM w",
        n + 1
    )
}

/// Takes the pool's lease when it is free, expired, or already this
/// process's under the epoch it holds ($4); a takeover bumps the epoch.
const CLAIM: &str = "INSERT INTO pool_lease AS l (scope, holder, address, epoch, expires) \
     VALUES ('pool', $1, $2, 1, clock_timestamp() + $3::BIGINT * INTERVAL '1 millisecond') \
     ON CONFLICT (scope) DO UPDATE SET holder = EXCLUDED.holder, address = EXCLUDED.address, \
       epoch = CASE WHEN l.holder = EXCLUDED.holder AND l.epoch = $4 THEN l.epoch \
               ELSE l.epoch + 1 END, \
       expires = EXCLUDED.expires \
     WHERE (l.holder = EXCLUDED.holder AND l.epoch = $4::BIGINT) OR l.expires <= clock_timestamp() \
     RETURNING epoch, expires";

/// Who holds the pool's lease and for how much longer, in milliseconds.
const HOLDER: &str = "SELECT holder, address, \
     GREATEST(EXTRACT(EPOCH FROM expires - clock_timestamp()) * 1000, 0)::BIGINT \
     FROM pool_lease WHERE scope = 'pool'";

/// The advisory lock key that migrations hold, so that processes starting
/// together migrate one after the other ("berth" in ASCII).
const MIGRATION_LOCK: i64 = 0x0062_6572_7468;

/// [`pg`] for a statement that runs `berth_fence`: its own refusal is
/// [`StoreError::Fenced`] (the epoch is filled in by the store).
fn fence_error(doing: &'static str) -> impl Fn(tokio_postgres::Error) -> StoreError {
    move |error| {
        if error.code().is_some_and(|c| c.code() == FENCED) {
            StoreError::Fenced { epoch: None }
        } else {
            StoreError::Postgres { doing, error }
        }
    }
}

/// The PostgreSQL store. It keeps the config it was opened with to name
/// labels and providers in the rows it writes.
pub struct PgStore {
    client: Client,
    config: Arc<Config>,
    /// [`write::Stmt`]'s statements, prepared once per connection, by
    /// `Stmt as usize`.
    statements: Vec<Statement>,
    /// `berth_fence`, prepared on the same connection.
    fence: Statement,
    /// The inbox's claim (`inbox::CLAIM`), prepared on the same connection.
    claim: Statement,
    connection: tokio::task::JoinHandle<()>,
    /// How to connect again ([`Store::reconnect`]).
    login: Login,
    /// Who this process is, if it shares the pool ([`PgStore::open`]); a
    /// store without one writes whatever it is asked to.
    claimant: Option<Claimant>,
    /// The lease as last confirmed, while this process holds it.
    holding: Option<Holding>,
    /// The rows' versions as last read or written: what commits expect.
    versions: write::Versions,
}

impl PgStore {
    /// Opens the store that `[store]` names for `berth serve`: connects with
    /// the configured password (a `password-file` is read now) and brings
    /// the schema up to date. With a `claimant`, the store commits only
    /// while that process holds the pool ([`PgStore::claim`]).
    pub async fn open(
        settings: &berth_config::Postgres,
        config: Arc<Config>,
        claimant: Option<Claimant>,
    ) -> Result<PgStore, StoreError> {
        let (password, password_file) = match &settings.password {
            None => (None, None),
            Some(berth_config::Password::Value(p)) => (Some(p.expose().to_owned()), None),
            Some(berth_config::Password::File(path)) => (None, Some(path.clone())),
        };
        let mut login = Login::new(
            &settings.url,
            password.as_deref(),
            settings.ca_file.as_deref(),
        )?;
        login.password_file = password_file;
        if let Some(me) = &claimant {
            // A holder stopped in the middle of a commit (SIGSTOP, a stalled
            // VM) would keep the lease row locked for as long as it stays
            // stopped, and no other process could take the pool over: the
            // server ends such a session once it has idled in a transaction
            // for half the lease.
            let idle = format!(
                "-c idle_in_transaction_session_timeout={}",
                (ttl_ms(me) / 2).max(1)
            );
            let options = match login.settings.get_options() {
                Some(given) => format!("{given} {idle}"),
                None => idle,
            };
            login.settings.options(options);
        }
        let mut store = PgStore::with(login, config).await?;
        store.claimant = claimant;
        Ok(store)
    }

    /// Connects to the database at `url` (`postgres://user@host:port/db`),
    /// with `password` if the server asks for one, and brings its schema up
    /// to date.
    pub async fn connect(
        url: &str,
        password: Option<&str>,
        config: Arc<Config>,
    ) -> Result<PgStore, StoreError> {
        PgStore::with(Login::new(url, password, None)?, config).await
    }

    async fn with(login: Login, config: Arc<Config>) -> Result<PgStore, StoreError> {
        let s = session(&login).await?;
        Ok(PgStore {
            client: s.client,
            config,
            statements: s.statements,
            fence: s.fence,
            claim: s.claim,
            connection: s.connection,
            login,
            claimant: None,
            holding: None,
            versions: write::Versions::default(),
        })
    }

    /// A new connection in place of the current one. The lease, if held,
    /// stays as it was: the next commit or renewal says whether it still is.
    async fn reconnect_now(&mut self) -> Result<(), StoreError> {
        let s = session(&self.login).await?;
        self.connection.abort();
        self.client = s.client;
        self.statements = s.statements;
        self.fence = s.fence;
        self.claim = s.claim;
        self.connection = s.connection;
        Ok(())
    }

    /// Takes the pool's lease for this process if it is free, expired, or
    /// already this process's; otherwise says who holds it. A store opened
    /// without a claimant always holds it.
    pub async fn claim(&mut self) -> Result<Tenure, StoreError> {
        let Some(me) = self.claimant.clone() else {
            return Ok(Tenure::Alone);
        };
        let held = self.holding.map_or(-1, |h| h.epoch);
        let sent = std::time::Instant::now();
        let row = self
            .client
            .query_opt(CLAIM, &[&me.holder, &me.address, &ttl_ms(&me), &held])
            .await
            .map_err(pg("claiming the pool's lease"))?;
        if let Some(row) = row {
            let holding = Holding {
                epoch: row.get(0),
                renewed: sent,
                valid_until: me.valid_until(sent),
                expires: row.get(1),
            };
            self.holding = Some(holding);
            return Ok(Tenure::Held(holding));
        }
        self.holding = None;
        let row = self
            .client
            .query_opt(HOLDER, &[])
            .await
            .map_err(pg("reading who holds the pool's lease"))?;
        Ok(match row {
            Some(row) => Tenure::Other {
                holder: row.get(0),
                address: row.get(1),
                expires_in: std::time::Duration::from_millis(
                    u64::try_from(row.get::<_, i64>(2)).unwrap_or(0),
                ),
            },
            // Deleted by hand between the two statements: free next time.
            None => Tenure::Other {
                holder: String::new(),
                address: String::new(),
                expires_in: std::time::Duration::ZERO,
            },
        })
    }

    /// Renews the lease this process holds, or fails with
    /// [`StoreError::Fenced`] if another process has taken the pool over.
    async fn renew_now(&mut self) -> Result<(), StoreError> {
        let Some(fence) = fence_args(&self.claimant, self.holding)? else {
            return self.ping().await;
        };
        let sent = std::time::Instant::now();
        let renewed = self
            .client
            .query_one(&self.fence, &[&fence.0, &fence.1, &fence.2])
            .await
            .map(|row| Some(row.get(0)))
            .map_err(fence_error("renewing the pool's lease"));
        self.confirmed(sent, renewed)
    }

    /// Takes in what a fenced statement sent at `sent` came to: the lease's
    /// new expiry renews the holding; a fence that failed means the lease is
    /// another process's now, and this store no longer holds it.
    fn confirmed(
        &mut self,
        sent: std::time::Instant,
        result: Result<Option<std::time::SystemTime>, StoreError>,
    ) -> Result<(), StoreError> {
        match result {
            Ok(expires) => {
                if let (Some(me), Some(held), Some(expires)) =
                    (&self.claimant, self.holding, expires)
                {
                    self.holding = Some(Holding {
                        epoch: held.epoch,
                        renewed: sent,
                        valid_until: me.valid_until(sent),
                        expires,
                    });
                }
                Ok(())
            }
            Err(StoreError::Fenced { .. }) => Err(StoreError::Fenced {
                epoch: self.holding.take().map(|h| h.epoch),
            }),
            Err(e) => Err(e),
        }
    }

    /// Gives the lease up at once, so that another process takes the pool
    /// over without waiting for it to expire (a clean stop).
    async fn release_now(&mut self) -> Result<(), StoreError> {
        let (Some(me), Some(held)) = (&self.claimant, self.holding.take()) else {
            return Ok(());
        };
        // Announced, so that the processes standing by take it at once.
        self.client
            .execute(
                "WITH given AS (UPDATE pool_lease SET expires = clock_timestamp() \
                   WHERE scope = 'pool' AND holder = $1 AND epoch = $2 RETURNING 1) \
                 SELECT pg_notify($3, $4) FROM given",
                &[&me.holder, &held.epoch, &LEASES_CHANNEL, &NOTIFY_POOL],
            )
            .await
            .map(drop)
            .map_err(pg("giving the pool's lease up"))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.client
            .simple_query("")
            .await
            .map(drop)
            .map_err(pg("checking the connection"))
    }

    /// The connection, for tests that look under the store.
    #[cfg(test)]
    pub(super) fn client(&self) -> &Client {
        &self.client
    }

    #[cfg(test)]
    pub(super) fn client_mut(&mut self) -> &mut Client {
        &mut self.client
    }

    /// The driver records in the same database, for the `state` import of
    /// every provider: shared by every process on the pool, and written for
    /// a provider only while this store's claimant holds that provider's
    /// lease ([`PgStore::shards`]).
    pub fn records(&self) -> super::PgRecords {
        super::PgRecords::new(
            self.login.clone(),
            self.claimant.as_ref().map(|me| me.holder.clone()),
        )
    }

    /// The providers' leases in the same database, on a connection of
    /// their own, for this store's claimant; `None` for a store without
    /// one.
    pub fn shards(&self, providers: Vec<String>) -> Option<super::PgShards> {
        let me = self.claimant.clone()?;
        Some(super::PgShards::new(self.login.clone(), me, providers))
    }

    /// The requests inbox in the same database, on a connection of its
    /// own, for a process standing by to accept requests into; `None` for
    /// a store without a claimant.
    pub fn request_inbox(&self) -> Option<super::PgInbox> {
        let me = self.claimant.as_ref()?;
        Some(super::PgInbox::new(self.login.clone(), me.holder.clone()))
    }

    async fn inbox_now(&mut self, limit: usize) -> Result<Vec<InboxEntry>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .client
            .query(inbox::READ, &[&limit])
            .await
            .map_err(pg("reading the inbox"))?;
        let mut entries = Vec::with_capacity(rows.len());
        let mut unreadable: Vec<i64> = Vec::new();
        for row in &rows {
            match inbox::entry(row) {
                Ok(entry) => entries.push(entry),
                Err(why) => {
                    let seq: i64 = row.try_get(0).map_err(pg("reading the inbox"))?;
                    let id = row.try_get::<_, String>(1).unwrap_or_default();
                    tracing::error!(
                        request = %berth_core::text::printable(&id),
                        %why,
                        "an unreadable request in the inbox is removed: no process could take it in"
                    );
                    unreadable.push(seq);
                }
            }
        }
        // Outside the fence: any holder would remove these, and only these.
        if !unreadable.is_empty() {
            self.client
                .execute(inbox::DROP_UNREADABLE, &[&unreadable])
                .await
                .map_err(pg("removing unreadable requests from the inbox"))?;
        }
        Ok(entries)
    }

    /// The schema version of the database.
    pub async fn schema_version(&self) -> Result<u32, StoreError> {
        version(&self.client).await
    }

    async fn load_now(&mut self, config: &Config) -> Result<Loaded, StoreError> {
        // One snapshot for every table, as SQLite's one read transaction.
        let tx = self
            .client
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(pg("starting a load"))?;
        let mut tables = load::Tables::default();
        for (q, query) in load::queries().iter().enumerate() {
            let rows = tx
                .query(query.as_str(), &[])
                .await
                .map_err(pg("reading the store"))?;
            for row in &rows {
                tables.read(q, row)?;
            }
        }
        tx.commit().await.map_err(pg("ending a load"))?;
        let versions = std::mem::take(&mut tables.versions);
        let loaded = load::assemble(tables, config)?;
        self.versions = versions;
        Ok(loaded)
    }

    async fn commit_now(&mut self, changes: &Changes) -> Result<(), StoreError> {
        let plan = write::plan(&self.config, changes, &self.versions)?;
        let fence = fence_args(&self.claimant, self.holding)?;
        let (taken, count) = inbox::claim_args(&changes.taken_in);
        let claim = (!taken.is_empty()).then_some((&self.claim, (taken.as_slice(), count)));
        let sent = std::time::Instant::now();
        let committed = pipeline(
            &mut self.client,
            &self.statements,
            fence.map(|args| (&self.fence, args)),
            claim,
            &plan.ops,
        )
        .await;
        self.confirmed(sent, committed)?;
        self.versions.apply(plan);
        Ok(())
    }
}

/// What `berth_fence` is called with while `claimant` holds the lease:
/// `None` for a store without a claimant, which writes unconditionally;
/// [`StoreError::Fenced`] for one that holds nothing.
fn fence_args(
    claimant: &Option<Claimant>,
    holding: Option<Holding>,
) -> Result<Option<(&str, i64, i64)>, StoreError> {
    match (claimant, holding) {
        (None, _) => Ok(None),
        (Some(me), Some(held)) => Ok(Some((me.holder.as_str(), held.epoch, ttl_ms(me)))),
        (Some(_), None) => Err(StoreError::Fenced { epoch: None }),
    }
}

/// A statement's future, queued but not yet awaited.
type Queued<F> = std::pin::Pin<Box<futures_util::future::MaybeDone<F>>>;

/// Polls `run` once, which makes tokio-postgres send its statement to the
/// server, and leaves its answer to be awaited later.
async fn send<F: std::future::Future>(run: &mut Queued<F>) {
    std::future::poll_fn(|cx| {
        let _ = run.as_mut().poll(cx);
        std::task::Poll::Ready(())
    })
    .await
}

/// One commit's transaction, in one round trip: `BEGIN`, the fence (with
/// its statement and arguments, when the store shares the pool), the claim
/// of the inbox entries taken in (`inbox::CLAIM`, with their ids and how
/// many), `ops`, `COMMIT`. Returns the lease's new expiry when fenced.
///
/// Every statement, the `COMMIT` too, is sent before the first answer is
/// awaited: each is polled once, in order, with no await between, then all
/// are awaited in order. The checks that must hold for the commit to stand
/// are made in the server, so nothing waits on the client: the fence
/// raises when the lease is not this process's, and each write of a
/// versioned row raises when it changed other rows than it had to
/// ([`pg_text`]). The first statement to fail aborts the transaction, the
/// server ends it at the `COMMIT` (as a rollback), and its error is the
/// one returned; the statements after it fail too, as statements of an
/// aborted transaction, and are not looked at. Since the `COMMIT` goes out
/// with the rest, the connection is never left inside a transaction,
/// whenever this future is dropped. While the fence renews the lease in
/// this transaction, its row stays locked, so no takeover can slip in
/// before the commit ends.
async fn pipeline(
    client: &mut Client,
    statements: &[Statement],
    fence: Option<(&Statement, (&str, i64, i64))>,
    claim: Option<(&Statement, (&[String], i64))>,
    ops: &[write::Op],
) -> Result<Option<std::time::SystemTime>, StoreError> {
    let client: &Client = client;
    let expected: Vec<Option<i64>> = ops.iter().map(write::Op::expected_rows).collect();
    let params: Vec<Vec<&(dyn ToSql + Sync)>> = ops
        .iter()
        .zip(&expected)
        .map(|(op, expected)| {
            let mut params: Vec<&(dyn ToSql + Sync)> =
                op.vals.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
            if op.stmt.is_checked() {
                params.push(expected);
            }
            params
        })
        .collect();
    let mut begin = Box::pin(futures_util::future::maybe_done(async move {
        client
            .batch_execute("BEGIN")
            .await
            .map_err(pg("starting a commit"))
    }));
    send(&mut begin).await;
    let mut fenced = Box::pin(futures_util::future::maybe_done(async move {
        match fence {
            Some((statement, (who, epoch, ttl))) => client
                .query_one(statement, &[&who, &epoch, &ttl])
                .await
                .map(|row| Some(row.get::<_, std::time::SystemTime>(0)))
                .map_err(fence_error("renewing the pool's lease in a commit")),
            None => Ok(None),
        }
    }));
    send(&mut fenced).await;
    let mut claimed = Box::pin(futures_util::future::maybe_done(async move {
        let Some((statement, (ids, count))) = claim else {
            return Ok(());
        };
        match client.query_one(statement, &[&ids, &count]).await {
            Ok(_) => Ok(()),
            Err(e) if e.code().is_some_and(|c| c.code() == CONFLICT) => {
                Err(inbox::claim_refused(ids))
            }
            Err(e) => Err(pg("taking requests in from the inbox")(e)),
        }
    }));
    send(&mut claimed).await;
    let mut runs: Vec<_> = ops
        .iter()
        .zip(&params)
        .map(|(op, params)| {
            let statement = &statements[op.stmt as usize];
            Box::pin(futures_util::future::maybe_done(async move {
                if !op.stmt.is_checked() {
                    return client
                        .execute(statement, params)
                        .await
                        .map(drop)
                        .map_err(pg(op.stmt.doing()));
                }
                match client.query_one(statement, params).await {
                    Ok(_) => Ok(()),
                    Err(e) if e.code().is_some_and(|c| c.code() == CONFLICT) => Err(op.conflict()),
                    Err(e) => Err(pg(op.stmt.doing())(e)),
                }
            }))
        })
        .collect();
    for run in &mut runs {
        send(run).await;
    }
    let mut commit = Box::pin(futures_util::future::maybe_done(async move {
        client
            .batch_execute("COMMIT")
            .await
            .map_err(pg("committing"))
    }));
    send(&mut commit).await;
    begin.as_mut().await;
    begin.as_mut().take_output().unwrap_or(Ok(()))?;
    fenced.as_mut().await;
    let expires = fenced.as_mut().take_output().unwrap_or(Ok(None))?;
    claimed.as_mut().await;
    claimed.as_mut().take_output().unwrap_or(Ok(()))?;
    for run in &mut runs {
        run.as_mut().await;
        if let Some(Err(e)) = run.as_mut().take_output() {
            return Err(e);
        }
    }
    commit.as_mut().await;
    commit.as_mut().take_output().unwrap_or(Ok(()))?;
    Ok(expires)
}

/// A connection: the client, the statements prepared on it, and the task
/// that runs it.
struct Session {
    client: Client,
    statements: Vec<Statement>,
    fence: Statement,
    claim: Statement,
    connection: tokio::task::JoinHandle<()>,
}

/// Connects, and brings the schema up to date first.
async fn session(login: &Login) -> Result<Session, StoreError> {
    let (mut client, connection) = connect(login).await?;
    let ready = async {
        migrate(&mut client, MIGRATIONS).await?;
        let fresh = super::identity::fresh();
        let values: Vec<&(dyn ToSql + Sync)> =
            fresh.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
        client
            .execute(&super::identity::ENSURE.replace('?', "$"), &values)
            .await
            .map_err(pg("making the store's identity"))?;
        let prepare = pg("preparing the store's statements");
        let mut statements = Vec::new();
        for stmt in write::Stmt::iter() {
            statements.push(client.prepare(&pg_text(stmt)).await.map_err(&prepare)?);
        }
        let fence = client
            .prepare("SELECT berth_fence($1, $2, $3)")
            .await
            .map_err(&prepare)?;
        let claim = client.prepare(inbox::CLAIM).await.map_err(&prepare)?;
        Ok((statements, fence, claim))
    };
    match ready.await {
        Ok((statements, fence, claim)) => Ok(Session {
            client,
            statements,
            fence,
            claim,
            connection,
        }),
        Err(e) => {
            connection.abort();
            Err(e)
        }
    }
}

fn ttl_ms(me: &Claimant) -> i64 {
    i64::try_from(me.ttl.as_millis()).unwrap_or(i64::MAX)
}

impl Drop for PgStore {
    fn drop(&mut self) {
        self.connection.abort();
    }
}

/// How many times the deadline of other calls a load may take (it reads
/// every row).
const LOAD_DEADLINE_FACTOR: u32 = 4;

impl PgStore {
    /// How long one call to the database may take before the connection
    /// is taken for lost: a server or network that stops answering (a
    /// partition, a frozen proxy) is a lost store, not a wait without end.
    fn deadline(&self) -> Duration {
        (self.claimant.as_ref()).map_or(DEADLINE_MIN, |c| (c.ttl * 2).max(DEADLINE_MIN))
    }

    /// Runs `call`, or gives the connection up once it has run past
    /// `after`: the connection is closed (a reconnect makes a new one) and
    /// the error is one of a lost store. What the call was doing may or may
    /// not have reached the database; the load after the reconnect says.
    async fn within<T>(
        &mut self,
        doing: &'static str,
        after: Duration,
        call: impl AsyncFnOnce(&mut PgStore) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let answer = tokio::time::timeout(after, call(&mut *self)).await;
        answer.unwrap_or_else(|_| {
            self.connection.abort();
            Err(StoreError::TimedOut { doing, after })
        })
    }
}

impl Store for PgStore {
    fn load<'a>(&'a mut self, config: &'a Config) -> StoreFuture<'a, Loaded> {
        let after = self.deadline() * LOAD_DEADLINE_FACTOR;
        Box::pin(self.within("loading the store", after, async |s| {
            s.load_now(config).await
        }))
    }

    fn commit<'a>(&'a mut self, changes: &'a Changes) -> StoreFuture<'a, ()> {
        let after = self.deadline();
        Box::pin(self.within("committing", after, async |s| s.commit_now(changes).await))
    }

    fn check(&mut self) -> StoreFuture<'_, ()> {
        let after = self.deadline();
        Box::pin(self.within("renewing the pool's lease", after, async |s| {
            s.renew_now().await
        }))
    }

    fn reconnect(&mut self) -> StoreFuture<'_, ()> {
        let after = self.deadline();
        Box::pin(self.within("connecting", after, async |s| s.reconnect_now().await))
    }

    fn claim(&mut self) -> StoreFuture<'_, Tenure> {
        let after = self.deadline();
        Box::pin(self.within("claiming the pool's lease", after, async |s| {
            PgStore::claim(s).await
        }))
    }

    fn holding(&self) -> Option<Holding> {
        self.holding
    }

    fn release(&mut self) -> StoreFuture<'_, ()> {
        let after = self.deadline();
        Box::pin(self.within("giving the pool's lease up", after, async |s| {
            s.release_now().await
        }))
    }

    fn inbox(&mut self, limit: usize) -> StoreFuture<'_, Vec<InboxEntry>> {
        let after = self.deadline();
        Box::pin(self.within("reading the inbox", after, async move |s| {
            s.inbox_now(limit).await
        }))
    }
}

async fn version(client: &Client) -> Result<u32, StoreError> {
    let doing = "reading the schema version";
    let row = client
        .query_opt("SELECT version FROM berth_schema", &[])
        .await;
    match row {
        Ok(Some(row)) => {
            let v: i64 = row.try_get(0).map_err(pg(doing))?;
            Ok(u32::try_from(v).unwrap_or(u32::MAX))
        }
        Ok(None) => Ok(0),
        // No `berth_schema` table yet: a new database.
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => Ok(0),
        Err(e) => Err(pg(doing)(e)),
    }
}

/// Applies the steps the database does not have yet, each in its own
/// transaction with its version bump, under an advisory lock so that
/// processes starting together take turns. A database newer than `steps` is
/// refused, as SQLite's is.
pub(super) async fn migrate(client: &mut Client, steps: &[&str]) -> Result<(), StoreError> {
    let known = u32::try_from(steps.len()).unwrap_or(u32::MAX);
    loop {
        let tx = client
            .transaction()
            .await
            .map_err(pg("starting a migration"))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(pg("waiting for the migration lock"))?;
        tx.batch_execute("CREATE TABLE IF NOT EXISTS berth_schema (version BIGINT NOT NULL)")
            .await
            .map_err(pg("creating the schema version table"))?;
        let found: Option<i64> = tx
            .query_opt("SELECT version FROM berth_schema", &[])
            .await
            .map_err(pg("reading the schema version"))?
            .map(|r| r.get(0));
        let found = u32::try_from(found.unwrap_or(0)).unwrap_or(u32::MAX);
        if found > known {
            return Err(StoreError::TooNew { found, known });
        }
        if found == known {
            tx.commit().await.map_err(pg("ending the migration"))?;
            return Ok(());
        }
        let to = found + 1;
        let err = |error| StoreError::PostgresMigrate {
            from: found,
            to,
            error,
        };
        tx.batch_execute(steps[found as usize]).await.map_err(err)?;
        tx.execute("DELETE FROM berth_schema", &[])
            .await
            .map_err(err)?;
        tx.execute(
            "INSERT INTO berth_schema (version) VALUES ($1)",
            &[&i64::from(to)],
        )
        .await
        .map_err(err)?;
        tx.commit().await.map_err(err)?;
    }
}

impl Cells for tokio_postgres::Row {
    fn int(&self, i: usize) -> Result<Option<i64>, StoreError> {
        self.try_get(i).map_err(pg("reading a row"))
    }

    fn real(&self, i: usize) -> Result<Option<f64>, StoreError> {
        self.try_get(i).map_err(pg("reading a row"))
    }

    fn text(&self, i: usize) -> Result<Option<String>, StoreError> {
        self.try_get(i).map_err(pg("reading a row"))
    }
}

impl ToSql for Val {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        // Each value goes only into a column of its own kind: an integer
        // written as text bytes would be read back as something else.
        match self {
            Val::Null => Ok(IsNull::Yes),
            Val::Int(i) if <i64 as ToSql>::accepts(ty) => i.to_sql(ty, out),
            Val::Real(f) if <f64 as ToSql>::accepts(ty) => f.to_sql(ty, out),
            Val::Text(s) if <String as ToSql>::accepts(ty) => s.to_sql(ty, out),
            v => Err(format!("{v:?} does not go into a {ty} column").into()),
        }
    }

    fn accepts(ty: &Type) -> bool {
        <i64 as ToSql>::accepts(ty) || <f64 as ToSql>::accepts(ty) || <String as ToSql>::accepts(ty)
    }

    to_sql_checked!();
}
