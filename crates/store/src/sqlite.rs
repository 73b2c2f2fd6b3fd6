//! The embedded store: one SQLite file in WAL mode ([`SqliteStore`]),
//! checked with SQLite's own integrity check at every open, its file and
//! directory watched while it is open ([`Store::confirm`]), and its WAL
//! copied back into the file from a thread of its own.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rusqlite::Connection;

use berth_config::StoreSync;
use berth_core::config::Config;
use berth_core::pool::Changes;

use crate::error::StoreError;
use crate::store::{Loaded, Store, StoreFuture};
use crate::{identity, load, schema, value, write};

fn sql(doing: &'static str) -> impl Fn(rusqlite::Error) -> StoreError {
    move |source| StoreError::Sql { doing, source }
}

/// The SQLite store. It keeps the config it was opened with to name labels
/// and providers in the rows it writes.
pub struct SqliteStore {
    /// The connection (the tests look under the store through it).
    pub(super) conn: Connection,
    config: Arc<Config>,
    /// Checkpoints the WAL from a thread of its own (file stores only).
    checkpointer: Option<Checkpointer>,
    /// The rows' versions as last read or written: what commits expect.
    versions: write::Versions,
    /// The file and directory as opened (file stores only): each commit
    /// and [`Store::confirm`] make sure they are still there and the same.
    watched: Option<Watched>,
}

/// A store file and its directory as they were opened: by device and
/// inode, so that one removed, or replaced by another file of the same
/// name, is told apart.
struct Watched {
    path: std::path::PathBuf,
    file: (u64, u64),
    dir: Option<(std::path::PathBuf, (u64, u64))>,
}

/// The first bytes of every SQLite database file.
const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

impl Watched {
    fn of(path: &Path) -> Result<Watched, StoreError> {
        let id = |p: &Path| {
            std::fs::metadata(p)
                .map(|m| file_id(&m))
                .map_err(|source| StoreError::Unwritable {
                    path: p.display().to_string(),
                    source,
                })
        };
        let dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
            Some(d) => Some((d.to_path_buf(), id(d)?)),
            None => None,
        };
        Ok(Watched {
            path: path.to_path_buf(),
            file: id(path)?,
            dir,
        })
    }

    /// Whether the path still names the file opened, with something in
    /// it: one `stat`, cheap enough for every commit.
    fn check_file(&self) -> Result<(), StoreError> {
        let gone = |what: String| StoreError::Vanished {
            path: self.path.display().to_string(),
            what,
        };
        match std::fs::metadata(&self.path) {
            Ok(m) if file_id(&m) != self.file => Err(gone("was replaced by another file".into())),
            Ok(m) if m.len() == 0 => Err(gone("was emptied or cut short".into())),
            Ok(_) => Ok(()),
            Err(e) => Err(gone(format!("is gone ({e})"))),
        }
    }

    /// Whether the directory and the file are the ones opened, and the file
    /// still starts as a SQLite database does.
    fn check(&self) -> Result<(), StoreError> {
        let gone = |what: String| StoreError::Vanished {
            path: self.path.display().to_string(),
            what,
        };
        if let Some((dir, was)) = &self.dir {
            match std::fs::metadata(dir) {
                Ok(m) if file_id(&m) == *was => {}
                Ok(_) => {
                    return Err(gone(format!(
                        "is in a directory {} that was replaced",
                        dir.display()
                    )));
                }
                Err(e) => {
                    return Err(gone(format!(
                        "is in a directory {} that is gone ({e})",
                        dir.display()
                    )));
                }
            }
        }
        self.check_file()?;
        let mut header = [0u8; 16];
        let read = std::fs::File::open(&self.path)
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut header));
        match read {
            Ok(()) if header == *SQLITE_HEADER => Ok(()),
            Ok(()) => Err(gone("no longer starts as a SQLite database".into())),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                Err(gone("was emptied or cut short".into()))
            }
            Err(e) => Err(gone(format!("cannot be read ({e})"))),
        }
    }
}

#[cfg(unix)]
fn file_id(m: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (m.dev(), m.ino())
}

#[cfg(not(unix))]
fn file_id(_: &std::fs::Metadata) -> (u64, u64) {
    (0, 0)
}

/// Copies the WAL back into the database file every [`CHECKPOINT_EVERY`] on
/// its own connection and thread. A checkpoint syncs the file system, which
/// can take milliseconds; SQLite's automatic checkpoint would do that inside
/// whichever commit crosses the threshold, so inside the pool's loop, in
/// front of a waiting client. The automatic one stays on as a backstop at a
/// far higher threshold, should this thread fall behind.
struct Checkpointer {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How often the checkpointer runs.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);
/// WAL pages past which a commit checkpoints by itself (SQLite's default is
/// 1,000).
const BACKSTOP_PAGES: u32 = 20_000;

impl Checkpointer {
    fn start(path: &Path) -> Result<Checkpointer, StoreError> {
        let conn = Connection::open(path).map_err(sql("opening the checkpoint connection"))?;
        conn.busy_timeout(Duration::from_secs(5))
            .map_err(sql("setting the busy timeout"))?;
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("berth-checkpoint".into())
            .spawn(move || {
                // A failing checkpoint (a full disk) is said at once at ERROR,
                // then once a minute while it goes on, and when it recovers.
                let mut failing: Option<std::time::Instant> = None;
                let mut checkpoint = |mode: &str| {
                    match conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |_| Ok(())) {
                        Ok(()) => {
                            if failing.take().is_some() {
                                tracing::info!("checkpointing the store's WAL works again");
                            }
                        }
                        Err(e) => {
                            let due = failing.is_none_or(|t| t.elapsed() >= Duration::from_secs(60));
                            if due {
                                failing = Some(std::time::Instant::now());
                                tracing::error!(
                                    error = %e,
                                    "the store's WAL cannot be checkpointed into the database file (is the disk full?); commits go on in the WAL until it cannot grow"
                                );
                            }
                        }
                    }
                };
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(CHECKPOINT_EVERY)
                {
                    checkpoint("PASSIVE");
                }
                // Closing: leave an empty WAL behind.
                checkpoint("TRUNCATE");
            })
            .map_err(|e| StoreError::Checkpointer(e.to_string()))?;
        Ok(Checkpointer {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Writes, syncs and removes a file in `dir`, so that a read-only or full
/// file system is found at start with a clear message, not at the first
/// commit.
fn check_writable(dir: &Path) -> Result<(), StoreError> {
    use std::io::Write;
    let probe = dir.join(".berth-write-check");
    let result = std::fs::File::create(&probe)
        .and_then(|mut f| f.write_all(b"berth").and_then(|()| f.sync_all()));
    let _ = std::fs::remove_file(&probe);
    result.map_err(|source| StoreError::Unwritable {
        path: dir.display().to_string(),
        source,
    })
}

impl SqliteStore {
    /// Opens the store at `path`, creating the file if it is missing (not its
    /// directory), and brings its schema up to date.
    pub fn open(
        path: &Path,
        config: Arc<Config>,
        sync: StoreSync,
    ) -> Result<SqliteStore, StoreError> {
        if let Some(dir) = path.parent() {
            check_writable(dir)?;
        }
        let open_err = |source| StoreError::Open {
            path: path.display().to_string(),
            source,
        };
        let conn = Connection::open(path).map_err(open_err)?;
        integrity_check(&conn, path)?;
        let mut store = Self::setup(conn, config, Some(sync)).map_err(|e| match e {
            StoreError::Sql { source, .. } => open_err(source),
            e => e,
        })?;
        store
            .conn
            .pragma_update(None, "wal_autocheckpoint", BACKSTOP_PAGES)
            .map_err(sql("setting the checkpoint backstop"))?;
        // What was just set up reaches the file itself, so that its header
        // is there for the watch from the first moment.
        store
            .conn
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
            .map_err(sql("checkpointing the new store"))?;
        store.watched = Some(Watched::of(path)?);
        store.checkpointer = Some(Checkpointer::start(path)?);
        Ok(store)
    }

    /// A store that lives as long as the value, for tests and trial runs.
    pub fn open_in_memory(config: Arc<Config>) -> Result<SqliteStore, StoreError> {
        let conn = Connection::open_in_memory().map_err(|source| StoreError::Open {
            path: ":memory:".into(),
            source,
        })?;
        Self::setup(conn, config, None)
    }

    fn setup(
        mut conn: Connection,
        config: Arc<Config>,
        file: Option<StoreSync>,
    ) -> Result<SqliteStore, StoreError> {
        let mode: String = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
            .map_err(sql("setting WAL mode"))?;
        if file.is_some() && !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(
                journal_mode = %mode,
                "the store's file system does not support WAL; commits will be slower"
            );
        }
        // FULL syncs the log at every commit, so what berth acts on or tells
        // a client survives power loss too: a hand-out once answered is
        // never handed out again after the machine comes back. NORMAL syncs
        // it only at checkpoints: a commit survives the process dying, not
        // the machine. docs/BENCHMARKS.md has the cost of each.
        let level = match file.unwrap_or_default() {
            StoreSync::Full => "FULL",
            StoreSync::Normal => "NORMAL",
        };
        conn.pragma_update(None, "synchronous", level)
            .map_err(sql("setting synchronous"))?;
        // No foreign keys: the load checks every reference itself and drops
        // what does not join with a note, where a foreign key could only
        // turn the same inconsistency into a refused commit that stops the
        // pool.
        conn.pragma_update(None, "foreign_keys", false)
            .map_err(sql("turning foreign keys off"))?;
        conn.busy_timeout(Duration::from_secs(5))
            .map_err(sql("setting the busy timeout"))?;
        conn.set_prepared_statement_cache_capacity(32);
        schema::migrate(&mut conn, schema::MIGRATIONS)?;
        conn.execute(
            identity::ENSURE,
            rusqlite::params_from_iter(identity::fresh().iter()),
        )
        .map_err(sql("making the store's identity"))?;
        Ok(SqliteStore {
            conn,
            config,
            checkpointer: None,
            versions: write::Versions::default(),
            watched: None,
        })
    }

    /// The schema version of the open database (`PRAGMA user_version`).
    pub fn schema_version(&self) -> Result<u32, StoreError> {
        schema::version(&self.conn)
    }
}

impl SqliteStore {
    fn load_now(&mut self, config: &Config) -> Result<Loaded, StoreError> {
        // One read transaction, so the tables are seen at one moment.
        let tx = self.conn.transaction().map_err(sql("starting a load"))?;
        let mut tables = load::Tables::default();
        for (q, query) in load::queries().iter().enumerate() {
            let doing = "reading the store";
            let mut stmt = tx.prepare_cached(query).map_err(sql(doing))?;
            let mut rows = stmt.query([]).map_err(sql(doing))?;
            while let Some(row) = rows.next().map_err(sql(doing))? {
                tables.read(q, row)?;
            }
        }
        tx.commit().map_err(sql("ending a load"))?;
        let versions = std::mem::take(&mut tables.versions);
        let loaded = load::assemble(tables, config)?;
        self.versions = versions;
        Ok(loaded)
    }

    fn commit_now(&mut self, changes: &Changes) -> Result<(), StoreError> {
        // No inbox here: nothing is taken in from one.
        debug_assert!(changes.taken_in.is_empty());
        let plan = write::plan(&self.config, changes, &self.versions)?;
        // Dropping the transaction on an error rolls it back.
        let tx = self.conn.transaction().map_err(sql("starting a commit"))?;
        for op in &plan.ops {
            let changed = tx
                .prepare_cached(op.stmt.sql())
                .and_then(|mut s| s.execute(rusqlite::params_from_iter(&op.vals)))
                .map_err(sql(op.stmt.doing()))?;
            op.checked(changed as u64)?;
        }
        tx.commit().map_err(sql("committing"))?;
        self.versions.apply(plan);
        // Committed, but to the file the next start will read? Nothing is
        // acted on unless so. (The directory and the header are looked at
        // by the periodic `check`.)
        self.watched.as_ref().map_or(Ok(()), Watched::check_file)
    }

    /// Whether the store's file and directory are still the ones opened.
    fn watch(&self) -> Result<(), StoreError> {
        self.watched.as_ref().map_or(Ok(()), Watched::check)
    }
}

/// SQLite's own check of a database file (`PRAGMA quick_check`: every page
/// and record well formed, indexes whole), said in the log either way.
fn integrity_check(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let found: Vec<String> = conn
        .prepare("PRAGMA quick_check")
        .and_then(|mut stmt| {
            stmt.query_map([], |row| row.get::<_, String>(0))?
                .collect::<Result<Vec<String>, _>>()
        })
        .map_err(|source| StoreError::Damaged {
            path: path.display().to_string(),
            found: vec![source.to_string()],
        })?;
    if found.iter().all(|f| f == "ok") {
        tracing::info!(store = %path.display(), "the store passed SQLite's integrity check");
        return Ok(());
    }
    Err(StoreError::Damaged {
        path: path.display().to_string(),
        found,
    })
}

impl value::Cells for rusqlite::Row<'_> {
    fn int(&self, i: usize) -> Result<Option<i64>, StoreError> {
        self.get(i).map_err(sql("reading a row"))
    }

    fn real(&self, i: usize) -> Result<Option<f64>, StoreError> {
        self.get(i).map_err(sql("reading a row"))
    }

    fn text(&self, i: usize) -> Result<Option<String>, StoreError> {
        self.get(i).map_err(sql("reading a row"))
    }
}

impl rusqlite::ToSql for value::Val {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, Value, ValueRef};
        Ok(match self {
            value::Val::Null => ToSqlOutput::Owned(Value::Null),
            value::Val::Int(i) => ToSqlOutput::Owned(Value::Integer(*i)),
            value::Val::Real(f) => ToSqlOutput::Owned(Value::Real(*f)),
            value::Val::Text(s) => ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes())),
        })
    }
}

/// SQLite answers in the calling thread, before the future is returned.
impl Store for SqliteStore {
    fn reconfigure(&mut self, config: Arc<Config>) {
        self.config = config;
    }

    fn load<'a>(&'a mut self, config: &'a Config) -> StoreFuture<'a, Loaded> {
        Box::pin(std::future::ready(self.load_now(config)))
    }

    fn commit<'a>(&'a mut self, changes: &'a Changes) -> StoreFuture<'a, ()> {
        Box::pin(std::future::ready(self.commit_now(changes)))
    }

    /// The file and its directory are still the ones opened.
    fn confirm(&mut self) -> StoreFuture<'_, ()> {
        Box::pin(std::future::ready(self.watch()))
    }

    fn watch_every(&self) -> Option<Duration> {
        self.watched.as_ref().map(|_| WATCH_EVERY)
    }
}

/// How often an idle pool makes sure its store file is still there.
const WATCH_EVERY: Duration = Duration::from_secs(1);
