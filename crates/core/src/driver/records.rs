//! Where the records of the driver `state` import are kept: a SQLite file of
//! one process's own, or the PostgreSQL database that several processes
//! share. The sandbox checks keys and values against the limits here before
//! it asks a [`Records`]; a backend keeps [`MAX_KEYS`] itself, as only it
//! can count.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// Longest key, in bytes.
pub const MAX_KEY: usize = 256;
/// Longest value, in bytes.
pub const MAX_VALUE: usize = 64 * 1024;
/// Most keys one provider may hold.
pub const MAX_KEYS: u64 = 10_000;

/// What a [`Records`] call comes to; the error is for the driver to read, and
/// names its source.
pub type RecordsFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, String>> + Send + 'a>>;

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

/// The error for a new key past [`MAX_KEYS`].
pub fn too_many_keys(held: u64) -> String {
    format!("the provider already holds {held} keys, the most allowed")
}

/// The error of a scan whose answer would pass `max_bytes`.
pub fn over_budget(max_bytes: u64) -> String {
    format!(
        "the records under this prefix come to more than the {max_bytes} bytes \
         one answer may hold; scan a longer prefix"
    )
}
