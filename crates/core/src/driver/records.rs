//! Where the records of the driver `state` import are kept: a SQLite file of
//! one process's own, or the PostgreSQL database that several processes
//! share. The sandbox checks keys and values against the limits here before
//! it asks a [`Records`]; a backend keeps [`MAX_KEYS`] itself, as only it
//! can count.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

#[cfg(feature = "records-kit")]
pub mod kit;

/// Longest key, in bytes.
pub const MAX_KEY: usize = 256;
/// Longest value, in bytes.
pub const MAX_VALUE: usize = 64 * 1024;
/// Most keys one provider may hold.
pub const MAX_KEYS: u64 = 10_000;

/// What a [`Records`] call comes to.
pub type RecordsFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, RecordsError>> + Send + 'a>>;

/// Why a [`Records`] call stored or answered nothing. The driver reads its
/// text (the `state` import's error), so each names what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordsError {
    /// A key, prefix or value longer than the contract allows; the sandbox
    /// refuses it before any backend is asked.
    #[error("{what} is {len} bytes, longer than the {max} allowed")]
    TooLong {
        /// `key`, `prefix` or `value`.
        what: &'static str,
        len: usize,
        max: usize,
    },
    /// A new key past [`MAX_KEYS`].
    #[error("the provider already holds {held} keys, the most allowed")]
    TooManyKeys { held: u64 },
    /// A scan whose answer would pass its budget.
    #[error(
        "the records under this prefix come to more than the {max_bytes} bytes one answer \
         may hold; scan a longer prefix"
    )]
    OverBudget { max_bytes: u64 },
    /// A write from a process that does not hold the provider's lease (the
    /// records several processes share): it stores nothing.
    #[error(
        "driver records in {backend}: this berth process does not hold the provider's lease, so it stores nothing"
    )]
    NotHolder { backend: &'static str },
    /// The backend failed; the text names it and what it said.
    #[error("driver records in {backend}: {message}")]
    Backend {
        /// `SQLite`, `PostgreSQL`.
        backend: &'static str,
        message: String,
    },
}

/// Durable key/value records, one key space per provider.
pub trait Records: Send + Sync + 'static {
    /// The value under `key`.
    fn get(&self, provider: Arc<str>, key: String) -> RecordsFuture<'_, Option<String>>;

    /// Every key starting with `prefix`, with its value, in byte order of
    /// the keys; an error instead if the keys and values would come to more
    /// than `max_bytes`.
    fn scan(
        &self,
        provider: Arc<str>,
        prefix: String,
        max_bytes: u64,
    ) -> RecordsFuture<'_, Vec<(String, String)>>;

    /// Stores `value` (`None` removes the key) if the key's current value is
    /// `expected` (`None`: absent), and says whether it stored. A new key
    /// beyond [`MAX_KEYS`] is an error. Atomic against every other call on
    /// the same records, in this process or another.
    fn compare_and_swap(
        &self,
        provider: Arc<str>,
        key: String,
        expected: Option<String>,
        value: Option<String>,
    ) -> RecordsFuture<'_, bool>;
}
