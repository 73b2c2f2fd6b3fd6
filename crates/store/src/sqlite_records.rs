//! The drivers' records of the `state` import in a SQLite file of this
//! process's own (`driver-state.sqlite` in the state directory), apart from
//! the pool's store: drivers write to it from their own calls, concurrently
//! with the pool's commits, and a driver can never reach the pool's tables.
//! With the pool on PostgreSQL the records are kept there instead
//! ([`crate::PgRecords`]).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_core::driver::records::{MAX_KEYS, Records, RecordsError, RecordsFuture};
use rusqlite::{Connection, OptionalExtension, params};

/// Records in a SQLite file of this process's own.
pub struct SqliteRecords {
    conn: Arc<Mutex<Connection>>,
}

impl SqliteRecords {
    /// Opens (creating if needed) the records file at `path`.
    pub fn open(path: &Path) -> anyhow::Result<SqliteRecords> {
        let conn = Connection::open(path)
            .map_err(|e| anyhow::anyhow!("opening driver state {}: {e}", path.display()))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // A record a driver has been told it stored (a host it allocated)
        // survives power loss, as the pool's own records do by default.
        conn.pragma_update(None, "synchronous", "FULL")?;
        Self::setup(conn)
    }

    fn setup(conn: Connection) -> anyhow::Result<SqliteRecords> {
        conn.busy_timeout(Duration::from_secs(5))?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS records (
                provider TEXT NOT NULL,
                key TEXT NOT NULL,
                value TEXT NOT NULL,
                PRIMARY KEY (provider, key)
            ) WITHOUT ROWID;",
        )?;
        Ok(SqliteRecords {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<Result<T, RecordsError>> + Send + 'static,
    ) -> RecordsFuture<'static, T> {
        let conn = self.conn.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
                f(&mut conn)
            })
            .await
            .map_err(|e| failed(&e))?
            .map_err(|e| failed(&e))?
        })
    }
}

fn failed(e: &impl std::fmt::Display) -> RecordsError {
    RecordsError::Backend {
        backend: "SQLite",
        message: e.to_string(),
    }
}

impl Records for SqliteRecords {
    fn get(&self, provider: Arc<str>, key: String) -> RecordsFuture<'_, Option<String>> {
        self.with(move |c| {
            c.query_row(
                "SELECT value FROM records WHERE provider = ?1 AND key = ?2",
                params![&*provider, key],
                |r| r.get(0),
            )
            .optional()
            .map(Ok)
        })
    }

    fn scan(
        &self,
        provider: Arc<str>,
        prefix: String,
        max_bytes: u64,
    ) -> RecordsFuture<'_, Vec<(String, String)>> {
        self.with(move |c| {
            // `substr` rather than LIKE: keys may hold `%` and `_`.
            let mut st = c.prepare_cached(
                "SELECT key, value FROM records WHERE provider = ?1
                 AND substr(key, 1, length(?2)) = ?2 ORDER BY key",
            )?;
            let mut rows = st.query(params![&*provider, prefix])?;
            let mut out = Vec::new();
            let mut bytes = 0u64;
            while let Some(row) = rows.next()? {
                let (key, value): (String, String) = (row.get(0)?, row.get(1)?);
                bytes += (key.len() + value.len()) as u64;
                if bytes > max_bytes {
                    return Ok(Err(RecordsError::OverBudget { max_bytes }));
                }
                out.push((key, value));
            }
            Ok(Ok(out))
        })
    }

    fn compare_and_swap(
        &self,
        provider: Arc<str>,
        key: String,
        expected: Option<String>,
        value: Option<String>,
    ) -> RecordsFuture<'_, bool> {
        self.with(move |c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let current: Option<String> = tx
                .query_row(
                    "SELECT value FROM records WHERE provider = ?1 AND key = ?2",
                    params![&*provider, key],
                    |r| r.get(0),
                )
                .optional()?;
            if current != expected {
                return Ok(Ok(false));
            }
            match value {
                None => {
                    tx.execute(
                        "DELETE FROM records WHERE provider = ?1 AND key = ?2",
                        params![&*provider, key],
                    )?;
                }
                Some(v) => {
                    if current.is_none() {
                        let n: u64 = tx.query_row(
                            "SELECT count(*) FROM records WHERE provider = ?1",
                            params![&*provider],
                            |r| r.get(0),
                        )?;
                        if n >= MAX_KEYS {
                            return Ok(Err(RecordsError::TooManyKeys { held: n }));
                        }
                    }
                    tx.execute(
                        "INSERT INTO records (provider, key, value) VALUES (?1, ?2, ?3)
                         ON CONFLICT (provider, key) DO UPDATE SET value = excluded.value",
                        params![&*provider, key, v],
                    )?;
                }
            }
            tx.commit()?;
            Ok(Ok(true))
        })
    }
}

#[cfg(test)]
mod tests {
    use berth_core::driver::records::kit;

    use super::*;

    /// Records that live as long as the value.
    fn in_memory() -> SqliteRecords {
        SqliteRecords::setup(Connection::open_in_memory().expect("in-memory SQLite"))
            .expect("in-memory driver state")
    }

    #[tokio::test]
    async fn the_file_answers_as_every_backend_must() {
        let records = in_memory();
        kit::compare_and_swap_decides_and_spaces_are_apart(&records).await;
        kit::a_scan_answers_in_byte_order_within_its_budget(&records).await;
        records
            .conn
            .lock()
            .unwrap()
            .execute(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1) \
                 INSERT INTO records SELECT 'full', 'h/' || i, 'v' FROM n",
                [MAX_KEYS],
            )
            .unwrap();
        assert_eq!(
            records.get("full".into(), kit::filler_key(MAX_KEYS)).await,
            Ok(Some("v".into()))
        );
        kit::a_full_provider_takes_no_new_key_but_changes_its_own(&records).await;
    }

    #[tokio::test]
    async fn records_survive_reopening_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("driver-state.sqlite");
        let p: Arc<str> = "p".into();
        {
            let records = SqliteRecords::open(&path).unwrap();
            let stored =
                records.compare_and_swap(p.clone(), "host/a".into(), None, Some("node-1".into()));
            assert_eq!(stored.await, Ok(true));
        }
        let records = SqliteRecords::open(&path).unwrap();
        assert_eq!(
            records.get(p, "host/a".into()).await,
            Ok(Some("node-1".into()))
        );
    }
}
