//! The `state` and `net` imports of the driver world: durable key/value
//! records per provider, and a TCP probe under the provider's allow-list.
//!
//! Records are kept by a [`Records`]: by default a SQLite file of their own
//! (`driver-state.sqlite` in the state directory), apart from the pool's
//! store, as drivers write to it from their own calls, concurrently with the
//! pool's commits, and a driver can never reach the pool's tables. With the
//! pool on PostgreSQL the records are kept there instead (the store's
//! `PgRecords`), shared by every process. Every provider has its own key
//! space.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use berth_core::driver::records::{MAX_KEY, MAX_KEYS, MAX_VALUE, Records, RecordsFuture};
use berth_core::driver::records::{over_budget, too_many_keys};
use rusqlite::{Connection, OptionalExtension, params};

use super::bindings;
use super::sandbox::StoreState;

/// Longest wait a probe may ask for.
const MAX_PROBE: Duration = Duration::from_secs(30);

/// Where driver records are kept. Cheap to clone; one per process.
#[derive(Clone)]
pub struct DriverState {
    records: Arc<dyn Records>,
}

impl std::fmt::Debug for DriverState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DriverState")
    }
}

impl DriverState {
    /// Opens (creating if needed) the records file at `path`.
    pub fn open(path: &Path) -> anyhow::Result<DriverState> {
        Ok(Self::on(Arc::new(SqliteRecords::open(path)?)))
    }

    /// Records that live as long as the value: `berth driver test`, tests.
    pub fn in_memory() -> DriverState {
        Self::on(Arc::new(
            SqliteRecords::setup(Connection::open_in_memory().expect("in-memory SQLite"))
                .expect("in-memory driver state"),
        ))
    }

    /// Records kept by `records`.
    pub fn on(records: Arc<dyn Records>) -> DriverState {
        DriverState { records }
    }

    /// Copies every record of `providers` into `target`, which must hold
    /// none of their keys yet (`berth store migrate`); returns how many.
    pub async fn copy_into<'a>(
        &self,
        target: &DriverState,
        providers: impl IntoIterator<Item = &'a str>,
    ) -> Result<usize, String> {
        let mut copied = 0;
        for provider in providers {
            let from = Arc::<str>::from(provider);
            let held = self
                .records
                .scan(from.clone(), String::new(), u64::MAX)
                .await?;
            for (key, value) in held {
                let stored = target
                    .records
                    .compare_and_swap(from.clone(), key.clone(), None, Some(value))
                    .await?;
                if !stored {
                    return Err(format!(
                        "provider {provider} already holds a record {key:?} there"
                    ));
                }
                copied += 1;
            }
        }
        Ok(copied)
    }

    /// The records of one provider.
    pub fn space(&self, provider: &str) -> StateSpace {
        StateSpace {
            records: self.records.clone(),
            provider: provider.into(),
        }
    }
}

/// One provider's records, with the limits on keys and values checked
/// before any backend is asked.
#[derive(Clone)]
pub struct StateSpace {
    records: Arc<dyn Records>,
    provider: Arc<str>,
}

impl std::fmt::Debug for StateSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StateSpace({})", self.provider)
    }
}

impl StateSpace {
    /// The value under `key`.
    pub async fn get(&self, key: String) -> Result<Option<String>, String> {
        check_key(&key)?;
        self.records.get(self.provider.clone(), key).await
    }

    /// Every key starting with `prefix`, in key order; an error instead if
    /// the keys and values would come to more than `max_bytes`.
    pub async fn scan(
        &self,
        prefix: String,
        max_bytes: u64,
    ) -> Result<Vec<(String, String)>, String> {
        check_len("prefix", &prefix, MAX_KEY)?;
        self.records
            .scan(self.provider.clone(), prefix, max_bytes)
            .await
    }

    /// Stores `value` (`None` removes) if the current value is `expected`.
    pub async fn compare_and_swap(
        &self,
        key: String,
        expected: Option<String>,
        value: Option<String>,
    ) -> Result<bool, String> {
        check_key(&key)?;
        if let Some(v) = &value {
            check_len("value", v, MAX_VALUE)?;
        }
        self.records
            .compare_and_swap(self.provider.clone(), key, expected, value)
            .await
    }
}

/// Records in a SQLite file of this process's own.
struct SqliteRecords {
    conn: Arc<Mutex<Connection>>,
}

impl SqliteRecords {
    fn open(path: &Path) -> anyhow::Result<SqliteRecords> {
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

fn check_key(key: &str) -> Result<(), String> {
    check_len("key", key, MAX_KEY)
}

fn check_len(what: &str, s: &str, max: usize) -> Result<(), String> {
    if s.len() > max {
        Err(format!(
            "{what} is {} bytes, longer than the {max} allowed",
            s.len()
        ))
    } else {
        Ok(())
    }
}

impl bindings::berth::driver::state::Host for StoreState {
    async fn get(&mut self, key: String) -> wasmtime::Result<Result<Option<String>, String>> {
        Ok(self.state.get(key).await)
    }

    async fn scan(
        &mut self,
        prefix: String,
    ) -> wasmtime::Result<Result<Vec<(String, String)>, String>> {
        Ok(self.state.scan(prefix, self.host_memory_bytes).await)
    }

    async fn compare_and_swap(
        &mut self,
        key: String,
        expected: Option<String>,
        value: Option<String>,
    ) -> wasmtime::Result<Result<bool, String>> {
        Ok(self.state.compare_and_swap(key, expected, value).await)
    }
}

impl bindings::berth::driver::net::Host for StoreState {
    async fn tcp_probe(
        &mut self,
        host: String,
        port: u16,
        timeout_ms: u32,
    ) -> wasmtime::Result<Result<(), String>> {
        let addr = match self.policy().authorize_host(&host, port).await {
            Ok(addr) => addr,
            Err(denial) => {
                self.policy()
                    .note_denied(&format!("tcp://{host}:{port}"), &denial);
                return Ok(Err(format!("{host}:{port}: {denial}")));
            }
        };
        let wait = Duration::from_millis(timeout_ms.into()).min(MAX_PROBE);
        Ok(
            match tokio::time::timeout(wait, tokio::net::TcpStream::connect(addr)).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(format!("{host}:{port}: {e}")),
                Err(_) => Err(format!("{host}:{port}: no answer within {wait:?}")),
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn compare_and_swap_decides_and_spaces_are_apart() {
        let state = DriverState::in_memory();
        let a = state.space("a");
        let b = state.space("b");
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
    async fn copying_takes_the_named_providers_and_refuses_a_key_already_there() {
        let (from, to) = (DriverState::in_memory(), DriverState::in_memory());
        for (p, k) in [("a", "h/1"), ("a", "h/2"), ("gone", "h/1")] {
            let space = from.space(p);
            let stored = space.compare_and_swap(k.into(), None, Some(p.into())).await;
            assert_eq!(stored, Ok(true));
        }
        assert_eq!(from.copy_into(&to, ["a", "b"]).await, Ok(2));
        assert_eq!(to.space("a").get("h/2".into()).await, Ok(Some("a".into())));
        assert_eq!(to.space("gone").get("h/1".into()).await, Ok(None));
        let again = from.copy_into(&to, ["a"]).await.unwrap_err();
        assert!(
            again.contains("provider a already holds a record \"h/1\""),
            "{again}"
        );
    }

    #[tokio::test]
    async fn limits_are_errors_that_say_which() {
        let a = DriverState::in_memory().space("a");
        let long = "x".repeat(MAX_KEY + 1);
        let e = a.get(long).await.unwrap_err();
        assert!(e.contains("key is 257 bytes"), "{e}");
        let big = "x".repeat(MAX_VALUE + 1);
        let e = a
            .compare_and_swap("k".into(), None, Some(big))
            .await
            .unwrap_err();
        assert!(e.contains("value is"), "{e}");
    }

    #[tokio::test]
    async fn records_survive_reopening_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("driver-state.sqlite");
        {
            let s = DriverState::open(&path).unwrap().space("p");
            s.compare_and_swap("host/a".into(), None, Some("node-1".into()))
                .await
                .unwrap();
        }
        let s = DriverState::open(&path).unwrap().space("p");
        assert_eq!(s.get("host/a".into()).await, Ok(Some("node-1".into())));
    }
}
