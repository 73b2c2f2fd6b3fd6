//! The driver records of the `state` import in PostgreSQL (table
//! `driver_records`), for a pool that several processes share: whichever
//! process holds a provider sees what the previous holder's driver stored,
//! such as which static host a node was given.
//!
//! The records have a connection of their own, apart from the store's, as
//! drivers write from their own calls while the pool commits. A write runs
//! `berth_record_cas` in one statement: it checks the value, the provider's
//! key count and, for a claimant, that this process holds the provider's
//! lease at that moment (the lease row is share-locked until the write
//! commits, so a takeover waits for it). A process paused past its lease and
//! resumed inside a driver call therefore stores nothing.

use std::sync::Arc;

use berth_core::driver::records::{MAX_KEYS, Records, RecordsError, RecordsFuture};
use tokio_postgres::Client;

use crate::connect::{FENCED, LazyClient, Login};
use crate::error::{StoreError, describe};

/// Driver records in the pool's PostgreSQL database ([`crate::PgStore::records`]).
pub struct PgRecords {
    client: LazyClient,
    /// The lease holder a write must be, if any.
    holder: Option<String>,
}

/// Keys starting with `$2`, each with the bytes of the keys and values up
/// to and including it (`running`) and its own (`own`), in byte order: rows
/// are read only while the answer stays within the budget `$3`, and one
/// more, which tells the budget was passed.
const SCAN: &str = "SELECT key, value, running FROM ( \
       SELECT key, value, octet_length(key) + octet_length(value) AS own, \
              sum(octet_length(key) + octet_length(value)) OVER (ORDER BY key COLLATE \"C\") AS running \
         FROM driver_records WHERE provider = $1 AND left(key, char_length($2)) = $2) r \
     WHERE running - own <= $3 ORDER BY key COLLATE \"C\"";

impl PgRecords {
    pub(crate) fn new(login: Login, holder: Option<String>) -> PgRecords {
        PgRecords {
            client: LazyClient::new(login),
            holder,
        }
    }

    /// The connection, made again if it was lost. Calls share it, and it
    /// pipelines them.
    async fn client(&self) -> Result<Arc<Client>, RecordsError> {
        self.client.get().await.map_err(|e| failed(&e))
    }
}

const BACKEND: &str = "PostgreSQL";

fn failed(e: &StoreError) -> RecordsError {
    RecordsError::Backend {
        backend: BACKEND,
        message: e.to_string(),
    }
}

fn refused(doing: &str, e: &tokio_postgres::Error) -> RecordsError {
    if e.code().is_some_and(|c| c.code() == FENCED) {
        return RecordsError::NotHolder { backend: BACKEND };
    }
    RecordsError::Backend {
        backend: BACKEND,
        message: format!("{doing}: {}", describe(e)),
    }
}

impl Records for PgRecords {
    fn get(&self, provider: Arc<str>, key: String) -> RecordsFuture<'_, Option<String>> {
        Box::pin(async move {
            let client = self.client().await?;
            let row = client
                .query_opt(
                    "SELECT value FROM driver_records WHERE provider = $1 AND key = $2",
                    &[&&*provider, &key],
                )
                .await
                .map_err(|e| refused("reading a record", &e))?;
            Ok(row.map(|r| r.get(0)))
        })
    }

    fn scan(
        &self,
        provider: Arc<str>,
        prefix: String,
        max_bytes: u64,
    ) -> RecordsFuture<'_, Vec<(String, String)>> {
        Box::pin(async move {
            let client = self.client().await?;
            let budget = i64::try_from(max_bytes).unwrap_or(i64::MAX);
            let rows = client
                .query(SCAN, &[&&*provider, &prefix, &budget])
                .await
                .map_err(|e| refused("reading records", &e))?;
            let mut out = Vec::with_capacity(rows.len());
            for row in rows {
                let running: i64 = row.get(2);
                if running > budget {
                    return Err(RecordsError::OverBudget { max_bytes });
                }
                out.push((row.get(0), row.get(1)));
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
        Box::pin(async move {
            let client = self.client().await?;
            let max = i64::try_from(MAX_KEYS).unwrap_or(i64::MAX);
            let row = client
                .query_one(
                    "SELECT berth_record_cas($1, $2, $3, $4, $5, $6)",
                    &[&self.holder, &&*provider, &key, &expected, &value, &max],
                )
                .await
                .map_err(|e| refused("storing a record", &e))?;
            match row.get::<_, i64>(0) {
                1 => Ok(true),
                0 => Ok(false),
                held => Err(RecordsError::TooManyKeys {
                    held: held.unsigned_abs(),
                }),
            }
        })
    }
}
