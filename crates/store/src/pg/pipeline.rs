//! A commit sent as one pipeline: each statement's text for PostgreSQL (a
//! write that must change certain rows checks itself in the server,
//! through `berth_expect`), and the commit's transaction (`BEGIN`, the
//! fence, the inbox's claim, the statements, `COMMIT`) in one round trip.

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Statement};

use super::lease::fence_error;
use crate::error::{StoreError, pg};
use crate::{inbox, write};

/// The SQLSTATE `berth_expect` raises when a statement changed other rows
/// than it had to.
const CONFLICT: &str = "BE002";

/// `stmt`'s text for PostgreSQL: a statement whose changed rows are
/// checked ([`write::Stmt::is_checked`]) becomes a query that raises
/// [`CONFLICT`] unless it changed as many rows as its one more parameter
/// says.
pub(super) fn pg_text(stmt: write::Stmt) -> String {
    let text = stmt.dollar_sql();
    if !stmt.is_checked() {
        return text.to_owned();
    }
    // The parameters are $1 to $n; the expected count is $n+1.
    let n = text
        .split('$')
        .skip(1)
        .filter_map(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<usize>().ok()
        })
        .max()
        .unwrap_or(0);
    format!(
        "WITH w AS ({text} RETURNING 1) SELECT berth_expect(count(*), ${}::BIGINT) FROM w",
        n + 1
    )
}

/// A statement's future, queued but not yet awaited.
type Queued<F> = std::pin::Pin<Box<futures_util::future::MaybeDone<F>>>;

/// Polls `run` once, which makes tokio-postgres send its statement to the
/// server, and leaves its answer to be awaited later.
async fn send<F: std::future::Future>(run: &mut Queued<F>) {
    std::future::poll_fn(|cx| {
        let _ = run.as_mut().poll(cx);
        std::task::Poll::Ready(())
    })
    .await
}

/// One commit's transaction, in one round trip: `BEGIN`, the fence (with
/// its statement and arguments, when the store shares the pool), the claim
/// of the inbox entries taken in (`inbox::CLAIM`, with their ids and how
/// many), `ops`, `COMMIT`. Returns the lease's new expiry when fenced.
///
/// Every statement, the `COMMIT` too, is sent before the first answer is
/// awaited: each is polled once, in order, with no await between, then all
/// are awaited in order. The checks that must hold for the commit to stand
/// are made in the server, so nothing waits on the client: the fence
/// raises when the lease is not this process's, and each write of a
/// versioned row raises when it changed other rows than it had to
/// ([`pg_text`]). The first statement to fail aborts the transaction, the
/// server ends it at the `COMMIT` (as a rollback), and its error is the
/// one returned; the statements after it fail too, as statements of an
/// aborted transaction, and are not looked at. Since the `COMMIT` goes out
/// with the rest, the connection is never left inside a transaction,
/// whenever this future is dropped. While the fence renews the lease in
/// this transaction, its row stays locked, so no takeover can slip in
/// before the commit ends.
pub(super) async fn pipeline(
    client: &mut Client,
    statements: &[Statement],
    fence: Option<(&Statement, (&str, i64, i64))>,
    claim: Option<(&Statement, (&[String], i64))>,
    ops: &[write::Op],
) -> Result<Option<std::time::SystemTime>, StoreError> {
    let client: &Client = client;
    let expected: Vec<Option<i64>> = ops.iter().map(write::Op::expected_rows).collect();
    let params: Vec<Vec<&(dyn ToSql + Sync)>> = ops
        .iter()
        .zip(&expected)
        .map(|(op, expected)| {
            let mut params: Vec<&(dyn ToSql + Sync)> =
                op.vals.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
            if op.stmt.is_checked() {
                params.push(expected);
            }
            params
        })
        .collect();
    let mut begin = Box::pin(futures_util::future::maybe_done(async move {
        client
            .batch_execute("BEGIN")
            .await
            .map_err(pg("starting a commit"))
    }));
    send(&mut begin).await;
    let mut fenced = Box::pin(futures_util::future::maybe_done(async move {
        match fence {
            Some((statement, (who, epoch, ttl))) => client
                .query_one(statement, &[&who, &epoch, &ttl])
                .await
                .map(|row| Some(row.get::<_, std::time::SystemTime>(0)))
                .map_err(fence_error("renewing the pool's lease in a commit")),
            None => Ok(None),
        }
    }));
    send(&mut fenced).await;
    let mut claimed = Box::pin(futures_util::future::maybe_done(async move {
        let Some((statement, (ids, count))) = claim else {
            return Ok(());
        };
        match client.query_one(statement, &[&ids, &count]).await {
            Ok(_) => Ok(()),
            Err(e) if e.code().is_some_and(|c| c.code() == CONFLICT) => {
                Err(inbox::claim_refused(ids))
            }
            Err(e) => Err(pg("taking requests in from the inbox")(e)),
        }
    }));
    send(&mut claimed).await;
    let mut runs: Vec<_> = ops
        .iter()
        .zip(&params)
        .map(|(op, params)| {
            let statement = &statements[op.stmt as usize];
            Box::pin(futures_util::future::maybe_done(async move {
                if !op.stmt.is_checked() {
                    return client
                        .execute(statement, params)
                        .await
                        .map(drop)
                        .map_err(pg(op.stmt.doing()));
                }
                match client.query_one(statement, params).await {
                    Ok(_) => Ok(()),
                    Err(e) if e.code().is_some_and(|c| c.code() == CONFLICT) => Err(op.conflict()),
                    Err(e) => Err(pg(op.stmt.doing())(e)),
                }
            }))
        })
        .collect();
    for run in &mut runs {
        send(run).await;
    }
    let mut commit = Box::pin(futures_util::future::maybe_done(async move {
        client
            .batch_execute("COMMIT")
            .await
            .map_err(pg("committing"))
    }));
    send(&mut commit).await;
    begin.as_mut().await;
    begin.as_mut().take_output().unwrap_or(Ok(()))?;
    fenced.as_mut().await;
    let expires = fenced.as_mut().take_output().unwrap_or(Ok(None))?;
    claimed.as_mut().await;
    claimed.as_mut().take_output().unwrap_or(Ok(()))?;
    for run in &mut runs {
        run.as_mut().await;
        if let Some(Err(e)) = run.as_mut().take_output() {
            return Err(e);
        }
    }
    commit.as_mut().await;
    commit.as_mut().take_output().unwrap_or(Ok(()))?;
    Ok(expires)
}
