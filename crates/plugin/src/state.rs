//! The `state` and `net` imports of the driver world: durable key/value
//! records per provider, and a TCP probe under the provider's allow-list.
//!
//! Records are kept by the [`Records`] the caller gives
//! ([`DriverState::on`]): the service's is the store's `SqliteRecords`, a
//! SQLite file of their own (`driver-state.sqlite` in the state directory),
//! apart from the pool's store, as drivers write to it from their own calls,
//! concurrently with the pool's commits, and a driver can never reach the
//! pool's tables. With the pool on PostgreSQL the records are kept there
//! instead (the store's `PgRecords`), shared by every process.
//! [`DriverState::in_memory`] keeps them in memory, for `berth driver test`
//! and tests. Every provider has its own key space.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use berth_core::driver::records::{
    MAX_KEY, MAX_KEYS, MAX_VALUE, Records, RecordsError, RecordsFuture,
};

use super::bindings;
use super::sandbox::HttpPolicy;

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
    /// Records that live as long as the value: `berth driver test`, tests.
    pub fn in_memory() -> DriverState {
        Self::on(Arc::new(MemoryRecords::default()))
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
    ) -> Result<usize, CopyError> {
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
                    return Err(CopyError::Held {
                        provider: provider.to_owned(),
                        key,
                    });
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

/// Why [`DriverState::copy_into`] stopped.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum CopyError {
    #[error(transparent)]
    Records(#[from] RecordsError),
    /// The target already holds one of the keys.
    #[error("provider {provider} already holds a record {key:?} there")]
    Held { provider: String, key: String },
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
    pub async fn get(&self, key: String) -> Result<Option<String>, RecordsError> {
        check_key(&key)?;
        self.records.get(self.provider.clone(), key).await
    }

    /// Every key starting with `prefix`, in key order; an error instead if
    /// the keys and values would come to more than `max_bytes`.
    pub async fn scan(
        &self,
        prefix: String,
        max_bytes: u64,
    ) -> Result<Vec<(String, String)>, RecordsError> {
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
    ) -> Result<bool, RecordsError> {
        check_key(&key)?;
        if let Some(v) = &value {
            check_len("value", v, MAX_VALUE)?;
        }
        self.records
            .compare_and_swap(self.provider.clone(), key, expected, value)
            .await
    }
}

/// Each provider's records, by key in byte order.
type Spaces = BTreeMap<Arc<str>, BTreeMap<String, String>>;

/// Records in this process's memory, as long as the value lives. They
/// answer as the store's `SqliteRecords` does: the same compare-and-swap,
/// keys in byte order, the same scan budget and the same key limit.
#[derive(Default)]
struct MemoryRecords {
    spaces: Mutex<Spaces>,
}

impl MemoryRecords {
    fn with<'a, T>(
        &'a self,
        f: impl FnOnce(&mut Spaces) -> Result<T, RecordsError> + Send + 'a,
    ) -> RecordsFuture<'a, T> {
        Box::pin(async move {
            let mut spaces = self.spaces.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut spaces)
        })
    }
}

impl Records for MemoryRecords {
    fn get(&self, provider: Arc<str>, key: String) -> RecordsFuture<'_, Option<String>> {
        self.with(move |spaces| Ok(spaces.get(&provider).and_then(|s| s.get(&key)).cloned()))
    }

    fn scan(
        &self,
        provider: Arc<str>,
        prefix: String,
        max_bytes: u64,
    ) -> RecordsFuture<'_, Vec<(String, String)>> {
        self.with(move |spaces| {
            let mut out = Vec::new();
            // A prefix holding NUL finds nothing, as in the file: there,
            // SQLite's `length` counts the characters before the first NUL.
            if prefix.contains('\0') {
                return Ok(out);
            }
            let mut bytes = 0u64;
            let held = spaces
                .get(&provider)
                .into_iter()
                .flat_map(|s| s.range(prefix.clone()..));
            for (key, value) in held.take_while(|(key, _)| key.starts_with(&prefix)) {
                bytes += (key.len() + value.len()) as u64;
                if bytes > max_bytes {
                    return Err(RecordsError::OverBudget { max_bytes });
                }
                out.push((key.clone(), value.clone()));
            }
            Ok(out)
        })
    }

    fn compare_and_swap(
        &self,
        provider: Arc<str>,
        key: String,
        expected: Option<String>,
        value: Option<String>,
    ) -> RecordsFuture<'_, bool> {
        self.with(move |spaces| {
            let space = spaces.entry(provider).or_default();
            let current = space.get(&key);
            if current != expected.as_ref() {
                return Ok(false);
            }
            match value {
                None => {
                    space.remove(&key);
                }
                Some(v) => {
                    if current.is_none() {
                        let n = space.len() as u64;
                        if n >= MAX_KEYS {
                            return Err(RecordsError::TooManyKeys { held: n });
                        }
                    }
                    space.insert(key, v);
                }
            }
            Ok(true)
        })
    }
}

fn check_key(key: &str) -> Result<(), RecordsError> {
    check_len("key", key, MAX_KEY)
}

fn check_len(what: &'static str, s: &str, max: usize) -> Result<(), RecordsError> {
    if s.len() > max {
        Err(RecordsError::TooLong {
            what,
            len: s.len(),
            max,
        })
    } else {
        Ok(())
    }
}

/// What the `state` import needs: the provider's records, and the
/// host-side bytes an answer may hold (bounds a `scan`).
pub(crate) struct RecordsCtx {
    pub space: StateSpace,
    pub host_memory_bytes: u64,
}

impl bindings::v0_1::state::Host for RecordsCtx {
    async fn get(&mut self, key: String) -> wasmtime::Result<Result<Option<String>, String>> {
        Ok(self.space.get(key).await.map_err(|e| e.to_string()))
    }

    async fn scan(
        &mut self,
        prefix: String,
    ) -> wasmtime::Result<Result<Vec<(String, String)>, String>> {
        Ok(self
            .space
            .scan(prefix, self.host_memory_bytes)
            .await
            .map_err(|e| e.to_string()))
    }

    async fn compare_and_swap(
        &mut self,
        key: String,
        expected: Option<String>,
        value: Option<String>,
    ) -> wasmtime::Result<Result<bool, String>> {
        Ok(self
            .space
            .compare_and_swap(key, expected, value)
            .await
            .map_err(|e| e.to_string()))
    }
}

/// What the `net` import needs: the provider's outbound policy, which the
/// TCP probe obeys too.
pub(crate) struct NetCtx {
    pub policy: Arc<HttpPolicy>,
}

impl bindings::v0_1::net::Host for NetCtx {
    async fn tcp_probe(
        &mut self,
        host: String,
        port: u16,
        timeout_ms: u32,
    ) -> wasmtime::Result<Result<(), String>> {
        let addr = match self.policy.authorize_host(&host, port).await {
            Ok(addr) => addr,
            Err(denial) => {
                self.policy
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
    use berth_core::driver::records::kit;

    use super::*;

    #[tokio::test]
    async fn memory_records_answer_as_every_backend_must() {
        let records = MemoryRecords::default();
        kit::compare_and_swap_decides_and_spaces_are_apart(&records).await;
        kit::a_scan_answers_in_byte_order_within_its_budget(&records).await;
        let full: Arc<str> = "full".into();
        for i in 1..=MAX_KEYS {
            let key = kit::filler_key(i);
            let stored = records.compare_and_swap(full.clone(), key, None, Some("v".into()));
            assert_eq!(stored.await, Ok(true));
        }
        kit::a_full_provider_takes_no_new_key_but_changes_its_own(&records).await;
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
        let again = from.copy_into(&to, ["a"]).await.unwrap_err().to_string();
        assert!(
            again.contains("provider a already holds a record \"h/1\""),
            "{again}"
        );
    }

    #[tokio::test]
    async fn limits_are_errors_that_say_which() {
        let a = DriverState::in_memory().space("a");
        let long = "x".repeat(MAX_KEY + 1);
        let e = a.get(long.clone()).await.unwrap_err().to_string();
        assert!(e.contains("key is 257 bytes"), "{e}");
        let e = a.scan(long, 1 << 20).await.unwrap_err().to_string();
        assert!(e.contains("prefix is 257 bytes"), "{e}");
        let big = "x".repeat(MAX_VALUE + 1);
        let e = a
            .compare_and_swap("k".into(), None, Some(big))
            .await
            .unwrap_err();
        assert_eq!(
            e,
            RecordsError::TooLong {
                what: "value",
                len: MAX_VALUE + 1,
                max: MAX_VALUE
            }
        );
        // Within the limits, the backend is asked.
        let fits = "x".repeat(MAX_VALUE);
        let stored = a.compare_and_swap("x".repeat(MAX_KEY), None, Some(fits));
        assert_eq!(stored.await, Ok(true));
    }
}
