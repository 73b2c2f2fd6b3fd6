//! The requests inbox (table `request_inbox`), for a pool that several
//! processes share: a process standing by accepts `POST /v1/requests`
//! itself, durably, by putting the request here under an id of its own
//! making ([`PgInbox::send`]) and announcing it, so a request is taken while
//! the pool's holder is slow, stopped, or gone and not yet replaced. The
//! pool's holder reads the inbox when told ([`crate::Store::inbox`]) and
//! takes each entry in; the commit that stores the request also deletes its
//! entry, under the same fence, claiming the rows with `FOR UPDATE SKIP
//! LOCKED` ([`CLAIM`]): a commit never waits on an entry another
//! transaction is claiming, and one that finds any of its entries claimed
//! or gone is refused whole, so the pool is decided again on what is
//! stored and no request is taken in twice.

use berth_core::pool::{Metadata, RequestId, Time};
use berth_core::text::{is_requestor, printable};

use crate::connect::{DEADLINE_MIN, LEASES_CHANNEL, LazyClient, Login, NOTIFY_REQUESTS};
use crate::error::{StoreError, pg};

/// A request accepted by a process standing by, waiting for the pool's
/// holder to take it in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InboxEntry {
    pub id: RequestId,
    pub requestor: String,
    pub priority: i32,
    /// When the accepting process took it, by its clock.
    pub created: Time,
    /// Each label by name, with its count.
    pub wants: Vec<(String, u32)>,
    /// The client's idempotency key, which made the id.
    pub key: Option<String>,
    pub metadata: Metadata,
}

/// Writes the inbox from a process standing by ([`crate::PgStore::inbox`]).
pub struct PgInbox {
    client: LazyClient,
    /// This process, as the entries name their acceptor.
    by: String,
}

/// Adds an entry unless its id is taken (in the inbox or by a stored
/// request), and announces it in the same statement.
const SEND: &str = "WITH added AS ( \
       INSERT INTO request_inbox (id, requestor, priority, created, labels, counts, accepted_by, \
                                  idempotency_key, metadata) \
       SELECT $1, $2, $3, $4, $5, $6, $7, $10, $11 \
        WHERE NOT EXISTS (SELECT 1 FROM requests WHERE id = $1) \
       ON CONFLICT (id) DO NOTHING RETURNING 1) \
     SELECT pg_notify($8, $9) FROM added";

/// What id `$1` holds, in the inbox or as a stored request, read as an
/// entry is (its place: 0).
const ASKED: &str = "SELECT 0::BIGINT, id, requestor, priority, created, labels, counts, \
            idempotency_key, metadata FROM request_inbox WHERE id = $1 \
     UNION ALL \
     SELECT 0::BIGINT, r.id, r.requestor, r.priority, r.created, \
            ARRAY(SELECT w.label FROM request_wants AS w WHERE w.request = r.id \
                  ORDER BY w.position), \
            ARRAY(SELECT w.count FROM request_wants AS w WHERE w.request = r.id \
                  ORDER BY w.position), \
            r.idempotency_key, r.metadata FROM requests AS r WHERE r.id = $1 \
     LIMIT 1";

/// The oldest entries, at most `$1`, each with its place in the inbox.
pub(crate) const READ: &str = "SELECT seq, id, requestor, priority, created, labels, counts, \
     idempotency_key, metadata FROM request_inbox ORDER BY seq LIMIT $1";

/// Removes entries that cannot be read (by their places), which no process
/// could ever take in.
pub(crate) const DROP_UNREADABLE: &str = "DELETE FROM request_inbox WHERE seq = ANY($1)";

/// A commit's claim of the entries it takes in (`$1`), checked to be all
/// of them (`$2`) by `berth_expect`: an entry locked by another claim is
/// skipped, not waited for, and fails the check as one already gone does.
pub(crate) const CLAIM: &str = "WITH mine AS ( \
       SELECT id FROM request_inbox WHERE id = ANY($1) FOR UPDATE SKIP LOCKED), \
     gone AS (DELETE FROM request_inbox AS r USING mine WHERE r.id = mine.id RETURNING 1) \
     SELECT berth_expect(count(*), $2) FROM gone";

impl PgInbox {
    pub(crate) fn new(login: Login, by: String) -> PgInbox {
        PgInbox {
            client: LazyClient::new(login),
            by,
        }
    }

    /// Puts `entry` into the inbox and announces it to the pool's holder.
    /// `false` if its id is taken already (by an entry or a stored
    /// request): nothing was written, and another id should be tried.
    pub async fn send(&self, entry: &InboxEntry) -> Result<bool, StoreError> {
        let client = self.client.get().await?;
        let labels: Vec<&str> = entry.wants.iter().map(|(l, _)| l.as_str()).collect();
        let counts: Vec<i64> = entry.wants.iter().map(|(_, n)| i64::from(*n)).collect();
        let created = i64::try_from(entry.created.as_millis()).unwrap_or(i64::MAX);
        let id = entry.id.to_string();
        let priority = i64::from(entry.priority);
        let metadata = crate::rows::metadata_text(&entry.metadata);
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 11] = [
            &id,
            &entry.requestor,
            &priority,
            &created,
            &labels,
            &counts,
            &self.by,
            &LEASES_CHANNEL,
            &NOTIFY_REQUESTS,
            &entry.key,
            &metadata,
        ];
        // A database that stops answering fails the send (the client is
        // answered 503) instead of holding it.
        let after = DEADLINE_MIN * 2;
        let doing = "putting a request into the inbox";
        let rows = match tokio::time::timeout(after, client.query(SEND, &params)).await {
            Ok(rows) => rows.map_err(pg(doing))?,
            Err(_) => {
                self.client.drop_connection().await;
                return Err(StoreError::TimedOut { doing, after });
            }
        };
        Ok(!rows.is_empty())
    }

    /// What `id` holds, waiting in the inbox or stored as a request, read
    /// as an entry; `None` if neither has it (taken in and purged since,
    /// or never there).
    pub async fn asked(&self, id: RequestId) -> Result<Option<InboxEntry>, StoreError> {
        let client = self.client.get().await?;
        let after = DEADLINE_MIN * 2;
        let doing = "reading the request an idempotency key made";
        let id = id.to_string();
        let rows = match tokio::time::timeout(after, client.query(ASKED, &[&id])).await {
            Ok(rows) => rows.map_err(pg(doing))?,
            Err(_) => {
                self.client.drop_connection().await;
                return Err(StoreError::TimedOut { doing, after });
            }
        };
        match rows.first().map(entry) {
            None => Ok(None),
            Some(Ok(e)) => Ok(Some(e)),
            Some(Err(why)) => Err(StoreError::Corrupt {
                table: "requests",
                id,
                column: "",
                what: why.to_string(),
            }),
        }
    }
}

/// Why a row of the inbox cannot be taken in. The table's checks keep every
/// column within what is read here, and the requestor is held to the API's
/// rule, but a row written by hand (a check dropped) may be neither.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BadEntry {
    #[error("column {column}: {source}")]
    Column {
        column: String,
        source: tokio_postgres::Error,
    },
    /// The id, made printable.
    #[error("`{0}` is not a request id")]
    Id(String),
    /// The requestor, made printable.
    #[error("requestor `{0}` is not 1 to 128 printable characters")]
    Requestor(String),
    #[error("priority {0} is out of range")]
    Priority(i64),
    #[error("{labels} labels and {counts} counts, not one count per label")]
    Counts { labels: usize, counts: usize },
    #[error("{0} is not a count")]
    Count(i64),
    #[error("its idempotency key is not one the API takes")]
    Key,
    #[error("its metadata: {0}")]
    Metadata(String),
}

/// An entry as [`READ`] answers it, or why it cannot be taken in.
pub(crate) fn entry(row: &tokio_postgres::Row) -> Result<InboxEntry, BadEntry> {
    fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
        row: &'a tokio_postgres::Row,
        i: usize,
    ) -> Result<T, BadEntry> {
        row.try_get(i).map_err(|source| BadEntry::Column {
            column: row.columns()[i].name().to_owned(),
            source,
        })
    }
    let id: String = get(row, 1)?;
    let id = id
        .parse()
        .map_err(|()| BadEntry::Id(printable(&id).into_owned()))?;
    let requestor: String = get(row, 2)?;
    if !is_requestor(&requestor) {
        return Err(BadEntry::Requestor(printable(&requestor).into_owned()));
    }
    let priority: i64 = get(row, 3)?;
    let priority = i32::try_from(priority).map_err(|_| BadEntry::Priority(priority))?;
    let created: i64 = get(row, 4)?;
    let labels: Vec<String> = get(row, 5)?;
    let counts: Vec<i64> = get(row, 6)?;
    if labels.len() != counts.len() {
        return Err(BadEntry::Counts {
            labels: labels.len(),
            counts: counts.len(),
        });
    }
    let wants = labels
        .into_iter()
        .zip(counts)
        .map(|(l, n)| {
            u32::try_from(n)
                .map(|n| (l, n))
                .map_err(|_| BadEntry::Count(n))
        })
        .collect::<Result<_, _>>()?;
    let key: Option<String> = get(row, 7)?;
    if key
        .as_ref()
        .is_some_and(|k| berth_core::pool::read_key(k.as_bytes()).is_err())
    {
        return Err(BadEntry::Key);
    }
    let metadata: Option<String> = get(row, 8)?;
    let metadata =
        crate::rows::read_metadata_text(metadata.as_deref()).map_err(BadEntry::Metadata)?;
    Ok(InboxEntry {
        id,
        requestor,
        priority,
        created: Time(u64::try_from(created).unwrap_or(0)),
        wants,
        key,
        metadata,
    })
}

/// What [`CLAIM`] is run with: the distinct ids of `taken`, as text, and how
/// many.
pub(crate) fn claim_args(taken: &[RequestId]) -> (Vec<String>, i64) {
    let mut ids: Vec<String> = taken.iter().map(RequestId::to_string).collect();
    ids.sort();
    ids.dedup();
    let n = i64::try_from(ids.len()).unwrap_or(i64::MAX);
    (ids, n)
}

/// A claim that did not find all of its entries, as the commit's error.
/// The claim counts, it does not say which entry was missing: one of
/// several is named as one of them.
pub(crate) fn claim_refused(ids: &[String]) -> StoreError {
    let first = ids.first().cloned().unwrap_or_default();
    StoreError::Conflict {
        table: "request_inbox",
        id: match ids.len() {
            0 | 1 => first,
            n => format!("{first} (or another of the {n} taken in)"),
        },
    }
}
