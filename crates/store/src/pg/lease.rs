//! The pool's lease in SQL: the statements that take it and that say who
//! holds it, what `berth_fence` is called with while this process holds
//! it, and how the fence's refusal reads ([`StoreError::Fenced`]).

// Time here is tokio's clock, which tests on paused time move.
#![deny(clippy::disallowed_methods)]

use crate::connect::FENCED;
use crate::error::StoreError;
use crate::store::{Claimant, Holding};

/// Takes the pool's lease when it is free, expired, or already this
/// process's under the epoch it holds ($4); a takeover bumps the epoch.
pub(super) const CLAIM: &str = "INSERT INTO pool_lease AS l (scope, holder, address, epoch, expires) \
     VALUES ('pool', $1, $2, 1, clock_timestamp() + $3::BIGINT * INTERVAL '1 millisecond') \
     ON CONFLICT (scope) DO UPDATE SET holder = EXCLUDED.holder, address = EXCLUDED.address, \
       epoch = CASE WHEN l.holder = EXCLUDED.holder AND l.epoch = $4 THEN l.epoch \
               ELSE l.epoch + 1 END, \
       expires = EXCLUDED.expires \
     WHERE (l.holder = EXCLUDED.holder AND l.epoch = $4::BIGINT) OR l.expires <= clock_timestamp() \
     RETURNING epoch, expires";

/// Who holds the pool's lease and for how much longer, in milliseconds.
pub(super) const HOLDER: &str = "SELECT holder, address, \
     GREATEST(EXTRACT(EPOCH FROM expires - clock_timestamp()) * 1000, 0)::BIGINT \
     FROM pool_lease WHERE scope = 'pool'";

/// [`pg`](crate::error::pg) for a statement that runs `berth_fence`: its
/// own refusal is [`StoreError::Fenced`] (the epoch is filled in by the
/// store).
pub(super) fn fence_error(doing: &'static str) -> impl Fn(tokio_postgres::Error) -> StoreError {
    move |error| {
        if error.code().is_some_and(|c| c.code() == FENCED) {
            StoreError::Fenced { epoch: None }
        } else {
            StoreError::Postgres { doing, error }
        }
    }
}

/// What `berth_fence` is called with while `claimant` holds the lease:
/// `None` for a store without a claimant, which writes unconditionally;
/// [`StoreError::Fenced`] for one that holds nothing.
pub(super) fn fence_args(
    claimant: &Option<Claimant>,
    holding: Option<Holding>,
) -> Result<Option<(&str, i64, i64)>, StoreError> {
    match (claimant, holding) {
        (None, _) => Ok(None),
        (Some(me), Some(held)) => Ok(Some((me.holder.as_str(), held.epoch, ttl_ms(me)))),
        (Some(_), None) => Err(StoreError::Fenced { epoch: None }),
    }
}

pub(super) fn ttl_ms(me: &Claimant) -> i64 {
    i64::try_from(me.ttl.as_millis()).unwrap_or(i64::MAX)
}
