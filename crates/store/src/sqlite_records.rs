//! The drivers' records of the `state` import in a SQLite file of this
//! process's own (`driver-state.sqlite` in the state directory), apart from
//! the pool's store: drivers write to it from their own calls, concurrently
//! with the pool's commits, and a driver can never reach the pool's tables.
//! With the pool on PostgreSQL the records are kept there instead
//! ([`crate::PgRecords`]).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_core::driver::records::{MAX_KEYS, Records, RecordsFuture, over_budget, too_many_keys};
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
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<Result<T, String>> + Send + 'static,
    ) -> RecordsFuture<'static, T> {
        let conn = self.conn.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
                f(&mut conn)
            })
            .await
            .map_err(|e| format!("driver state: {e}"))?
            .map_err(|e| format!("driver state: {e}"))?
        })
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
                    return Ok(Err(over_budget(max_bytes)));
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
                            return Ok(Err(too_many_keys(n)));
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
    use super::*;

    /// Records that live as long as the value.
    fn in_memory() -> SqliteRecords {
        SqliteRecords::setup(Connection::open_in_memory().expect("in-memory SQLite"))
            .expect("in-memory driver state")
    }

    /// One provider's records, called as the plugin's `StateSpace` calls
    /// them (which checks the keys and values first).
    struct Space<'a>(&'a SqliteRecords, Arc<str>);

    impl Space<'_> {
        async fn get(&self, key: String) -> Result<Option<String>, String> {
            self.0.get(self.1.clone(), key).await
        }

        async fn scan(
            &self,
            prefix: String,
            max_bytes: u64,
        ) -> Result<Vec<(String, String)>, String> {
            self.0.scan(self.1.clone(), prefix, max_bytes).await
        }

        async fn compare_and_swap(
            &self,
            key: String,
            expected: Option<String>,
            value: Option<String>,
        ) -> Result<bool, String> {
            (self.0)
                .compare_and_swap(self.1.clone(), key, expected, value)
                .await
        }
    }

    #[tokio::test]
    async fn compare_and_swap_decides_and_spaces_are_apart() {
        let records = in_memory();
        let a = Space(&records, "a".into());
        let b = Space(&records, "b".into());
        assert_eq!(
            a.compare_and_swap("k".into(), None, Some("1".into())).await,
            Ok(true)
        );
        // A second claim of the same key fails; another provider's does not.
        assert_eq!(
            a.compare_and_swap("k".into(), None, Some("2".into())).await,
            Ok(false)
        );
        assert_eq!(
            b.compare_and_swap("k".into(), None, Some("x".into())).await,
            Ok(true)
        );
        assert_eq!(
            a.compare_and_swap("k".into(), Some("1".into()), Some("3".into()))
                .await,
            Ok(true)
        );
        assert_eq!(a.get("k".into()).await, Ok(Some("3".into())));
        a.compare_and_swap("k%2".into(), None, Some("y".into()))
            .await
            .unwrap();
        a.compare_and_swap("j".into(), None, Some("z".into()))
            .await
            .unwrap();
        assert_eq!(
            a.scan("k".into(), 1 << 20).await,
            Ok(vec![("k".into(), "3".into()), ("k%2".into(), "y".into())])
        );
        // Over the answer's budget: an error, not a part.
        let e = a.scan("k".into(), 4).await.unwrap_err();
        assert!(e.contains("more than the 4 bytes"), "{e}");
        assert_eq!(
            a.compare_and_swap("k".into(), Some("3".into()), None).await,
            Ok(true)
        );
        assert_eq!(a.get("k".into()).await, Ok(None));
        assert_eq!(b.get("k".into()).await, Ok(Some("x".into())));
    }

    #[tokio::test]
    async fn a_new_key_past_the_most_allowed_is_refused_and_held_keys_still_change() {
        let records = in_memory();
        records
            .conn
            .lock()
            .unwrap()
            .execute(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1) \
                 INSERT INTO records SELECT 'a', 'h/' || i, 'v' FROM n",
                [MAX_KEYS],
            )
            .unwrap();
        let a = Space(&records, "a".into());
        assert_eq!(
            a.compare_and_swap("new".into(), None, Some("v".into()))
                .await,
            Err(too_many_keys(MAX_KEYS))
        );
        assert_eq!(
            a.compare_and_swap("h/1".into(), Some("v".into()), Some("w".into()))
                .await,
            Ok(true)
        );
        assert_eq!(
            a.compare_and_swap("h/1".into(), Some("w".into()), None)
                .await,
            Ok(true)
        );
        assert_eq!(
            a.compare_and_swap("new".into(), None, Some("v".into()))
                .await,
            Ok(true)
        );
        let b = Space(&records, "b".into());
        assert_eq!(
            b.compare_and_swap("new".into(), None, Some("v".into()))
                .await,
            Ok(true)
        );
    }

    #[tokio::test]
    async fn records_survive_reopening_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("driver-state.sqlite");
        {
            let records = SqliteRecords::open(&path).unwrap();
            let s = Space(&records, "p".into());
            s.compare_and_swap("host/a".into(), None, Some("node-1".into()))
                .await
                .unwrap();
        }
        let records = SqliteRecords::open(&path).unwrap();
        let s = Space(&records, "p".into());
        assert_eq!(s.get("host/a".into()).await, Ok(Some("node-1".into())));
    }
}
