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

// Time here is tokio's clock, which tests on paused time move.
#![deny(clippy::disallowed_methods)]

mod lease;
mod migrations;
mod pipeline;

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::types::{IsNull, ToSql, Type, to_sql_checked};
use tokio_postgres::{Client, IsolationLevel, Statement};

use self::lease::{CLAIM, HOLDER, fence_args, fence_error, ttl_ms};
use self::migrations::version;
pub(super) use self::migrations::{MIGRATIONS, migrate};
use self::pipeline::{pg_text, pipeline};
use super::connect::{DEADLINE_MIN, LEASES_CHANNEL, Login, NOTIFY_POOL, connect};
use super::error::{StoreError, pg};
use super::inbox::InboxEntry;
use super::store::{Claimant, Holding, Loaded, Store, StoreFuture, Tenure};
use super::value::{Cells, Val};
use super::{inbox, load, write};
use berth_core::config::Config;
use berth_core::pool::Changes;
use strum::IntoEnumIterator;

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
        let sent = tokio::time::Instant::now();
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
        let sent = tokio::time::Instant::now();
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
        sent: tokio::time::Instant,
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
        let sent = tokio::time::Instant::now();
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
    fn reconfigure(&mut self, config: Arc<Config>) {
        self.config = config;
    }

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

    fn confirm(&mut self) -> StoreFuture<'_, ()> {
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
