//! Why a store call failed ([`StoreError`]), and how a PostgreSQL driver
//! error is told: described in the server's own words ([`describe`]), taken
//! for a lost connection or not ([`lost`]), and wrapped with what it was
//! doing ([`pg`]).

use std::time::Duration;

/// Why the store could not be opened, read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database file could not be opened or set up.
    #[error("opening the store {path}: {source}")]
    Open {
        path: String,
        source: rusqlite::Error,
    },
    /// The database was written by a newer berth.
    #[error(
        "the store has schema version {found}, newer than the {known} this berth knows; \
         run a newer berth or move the store away"
    )]
    TooNew { found: u32, known: u32 },
    /// A migration step failed; the database stays at version `from`.
    #[error("migrating the store from schema version {from} to {to}: {source}")]
    Migrate {
        from: u32,
        to: u32,
        source: rusqlite::Error,
    },
    /// A statement failed; `doing` says what for.
    #[error("{doing}: {source}")]
    Sql {
        doing: &'static str,
        source: rusqlite::Error,
    },
    /// A row holds something this berth cannot read back.
    #[error("corrupt row in {table} `{id}`, column {column}: {what}")]
    Corrupt {
        table: &'static str,
        id: String,
        column: &'static str,
        what: String,
    },
    /// A record cannot be put into a row.
    #[error("cannot store node {node}: {what}")]
    Unstorable { node: String, what: String },
    /// The store's directory cannot be written (read-only, full, no
    /// permission): berth would not be able to record anything it does.
    #[error("the state directory {path} cannot be written: {source}")]
    Unwritable {
        path: String,
        source: std::io::Error,
    },
    /// A PostgreSQL statement, or the connection, failed; `doing` says what
    /// for.
    /// (The driver's error is described in the message and not given as a
    /// source: its own chain would repeat the server's words.)
    #[error("{doing}: {}", describe(.error))]
    Postgres {
        doing: &'static str,
        error: tokio_postgres::Error,
    },
    /// A PostgreSQL migration step failed; the database stays at `from`.
    #[error(
        "migrating the PostgreSQL store from schema version {from} to {to}: {}",
        describe(.error)
    )]
    PostgresMigrate {
        from: u32,
        to: u32,
        error: tokio_postgres::Error,
    },
    /// TLS to PostgreSQL cannot be set up as configured.
    #[error("TLS to PostgreSQL: {0}")]
    Tls(String),
    /// The PostgreSQL password file could not be read.
    #[error("reading the PostgreSQL password file {path}: {source}")]
    PasswordFile {
        path: String,
        source: std::io::Error,
    },
    /// This process no longer holds the pool's lease (of `epoch`): another
    /// process took the pool over. Nothing of the commit was written.
    #[error("{}", fenced_text(.epoch))]
    Fenced { epoch: Option<i64> },
    /// A row a commit was to change had been changed, removed or added by
    /// someone else since this store last read or wrote it. Nothing of the
    /// commit was written; what was decided on the old row must be decided
    /// again on what is stored now.
    #[error(
        "the {table} row `{id}` was changed in the store by someone else since this process \
         read it, so nothing of the commit was written"
    )]
    Conflict { table: &'static str, id: String },
    /// A store to copy into already holds records.
    #[error(
        "the target store is not empty ({nodes} nodes, {requests} requests, {leases} requestor \
         leases); records are only copied into an empty one"
    )]
    NotEmpty {
        nodes: usize,
        requests: usize,
        leases: usize,
    },
    /// A copy read back differs from what was copied.
    #[error("the copied records read back differently from the source's")]
    CopyDiffers,
    /// The WAL checkpoint thread could not be started.
    #[error("starting the store's checkpoint thread: {0}")]
    Checkpointer(String),
    /// The core named a label or provider index the store's config does not
    /// have: the two were built from different configs.
    #[error("no {what} with index {index} in the store's config")]
    NoSuchIndex { what: &'static str, index: u16 },
    /// A call to PostgreSQL did not answer within its deadline: the
    /// connection is taken for lost (and closed), so that a server or
    /// network that stops answering is waited out as an outage, not
    /// forever.
    #[error(
        "{doing}: PostgreSQL did not answer within {after:?}; the connection is taken for lost"
    )]
    TimedOut {
        doing: &'static str,
        after: Duration,
    },
    /// SQLite's own integrity check found the database file damaged.
    #[error(
        "the store {path} is damaged: SQLite's integrity check found {}; berth does not run on a \
         damaged store. Restore it from a backup, or move it away to start with a new one (which \
         will not take the pool's instances for its own unless told to: docs/tags.md)",
        .found.join("; ")
    )]
    Damaged { path: String, found: Vec<String> },
    /// The store's directory or file went away, or was replaced or emptied,
    /// under the running process: what it commits would no longer reach
    /// the store the next start reads.
    #[error(
        "the store {path} {what}: it was removed, replaced or emptied under this process, so \
         nothing more can be recorded where the next start will look"
    )]
    Vanished { path: String, what: String },
}

fn fenced_text(epoch: &Option<i64>) -> String {
    let held = match epoch {
        Some(e) => format!(" (epoch {e})"),
        None => String::new(),
    };
    format!(
        "this process no longer holds the pool's lease{held}: another berth process took the \
         pool over, so nothing was written"
    )
}

impl StoreError {
    /// Whether another process took the pool over from this one.
    pub fn is_fenced(&self) -> bool {
        matches!(self, StoreError::Fenced { .. })
    }

    /// Whether a commit was refused because rows it was to change had
    /// changed under it ([`StoreError::Conflict`]).
    pub fn is_conflict(&self) -> bool {
        matches!(self, StoreError::Conflict { .. })
    }

    /// Whether the store is out of reach (its server stopped, the network
    /// broke) rather than refusing what was written: the pool may go on
    /// once [`crate::Store::reconnect`] succeeds. Only a PostgreSQL store's errors
    /// can be.
    pub fn is_lost(&self) -> bool {
        match self {
            StoreError::Postgres { error, .. } => lost(error),
            StoreError::TimedOut { .. } => true,
            _ => false,
        }
    }
}

/// A driver error in one line, with what the server said: its own
/// `Display` is only "db error" for everything the server refused.
pub(super) fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut text = format!("{}: {}", db.severity(), db.message());
        if let Some(detail) = db.detail() {
            text.push_str(&format!(" ({detail})"));
        }
        return text;
    }
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    text
}

pub(super) fn pg(doing: &'static str) -> impl Fn(tokio_postgres::Error) -> StoreError {
    move |error| StoreError::Postgres { doing, error }
}

/// Whether `e` means the connection is gone (closed, refused, reset, timed
/// out, or ended by the server: classes 08 and 57), not that a statement
/// was refused or a value could not be sent.
pub(super) fn lost(e: &tokio_postgres::Error) -> bool {
    match e.as_db_error() {
        None => {
            e.is_closed() || std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
        }
        Some(db) => {
            let code = db.code().code();
            code.starts_with("08") || code.starts_with("57")
        }
    }
}
