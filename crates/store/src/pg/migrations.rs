//! The PostgreSQL store's schema: its steps in order (the version kept in
//! `berth_schema`), and the code that brings a database up to date with
//! them, each step in a transaction of its own under an advisory lock.

use tokio_postgres::Client;

use crate::error::{StoreError, pg};

/// Schema steps, in order; step `i` takes the database to version `i + 1`,
/// kept in `berth_schema`. A step that has shipped is never edited. The
/// tables are SQLite's (see `schema::MIGRATIONS`) in PostgreSQL's types:
/// integers are `BIGINT`, as [`crate::value::Val::Int`] is.
pub(crate) const MIGRATIONS: &[&str] = &[
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
    // As SQLite's step 5: a node's packing under the core's own word.
    r#"
ALTER TABLE nodes RENAME COLUMN role TO packing;
"#,
    // As SQLite's step 6: why a node's last launch try failed, and a
    // request's last failed try.
    r#"
ALTER TABLE nodes ADD COLUMN failure TEXT;
ALTER TABLE requests ADD COLUMN last_failure TEXT;
"#,
    // The digest of the config each process runs (`berth_config::
    // fleet_digest`), written at each heartbeat, and a heartbeat that
    // answers every live member with its digest too (rows with `config`
    // set) after step 4's rows.
    r#"
ALTER TABLE members ADD COLUMN config TEXT NOT NULL DEFAULT '';
CREATE FUNCTION berth_beat(who TEXT, addr TEXT, ttl_ms BIGINT, provs TEXT[], keep TEXT[],
                           conf TEXT)
RETURNS TABLE (provider TEXT, holder TEXT, address TEXT, epoch BIGINT, expires TIMESTAMPTZ,
               remaining_ms BIGINT, members BIGINT, config TEXT)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
        SELECT s.provider, s.holder, s.address, s.epoch, s.expires, s.remaining_ms, s.members,
               NULL::TEXT
          FROM berth_shards(who, addr, ttl_ms, provs, keep) AS s;
    UPDATE members AS m SET config = conf WHERE m.holder = who;
    RETURN QUERY
        SELECT NULL::TEXT, m.holder, m.address, NULL::BIGINT, m.expires, NULL::BIGINT,
               NULL::BIGINT, m.config
          FROM members AS m WHERE m.expires > clock_timestamp();
END $$;
"#,
    // As SQLite's step 7: a request's idempotency key and metadata (a JSON
    // object of strings), in the requests and in the inbox; NULL for none.
    // The inbox's checks keep its rows within what the API takes.
    r#"
ALTER TABLE requests ADD COLUMN idempotency_key TEXT;
ALTER TABLE requests ADD COLUMN metadata TEXT;
ALTER TABLE request_inbox ADD COLUMN idempotency_key TEXT
    CHECK (idempotency_key ~ '^[!-~]{1,255}$');
ALTER TABLE request_inbox ADD COLUMN metadata TEXT
    CHECK (octet_length(metadata) <= 65536);
"#,
];

/// The advisory lock key that migrations hold, so that processes starting
/// together migrate one after the other ("berth" in ASCII).
const MIGRATION_LOCK: i64 = 0x0062_6572_7468;

pub(super) async fn version(client: &Client) -> Result<u32, StoreError> {
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
pub(crate) async fn migrate(client: &mut Client, steps: &[&str]) -> Result<(), StoreError> {
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
