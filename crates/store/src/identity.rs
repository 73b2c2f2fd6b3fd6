//! The store's identity ([`Identity`]): its generation and the key the
//! tags of its instances are signed with, one row of `pool_identity`. It is
//! made when the store is, from the operating system's random source, and
//! never changes; `berth store migrate` carries it over.

use berth_core::pool::{Identity, is_generation};

use super::error::StoreError;
use super::value::{Cells, Reader, Val};

/// Puts an identity into a store that has none yet: a new generation and
/// key, confirmed only if the store already holds records (a store made
/// before identities, in use: its instances are its own). Nothing if one
/// is there; two processes doing this at once keep the first.
pub(super) const ENSURE: &str = "INSERT INTO pool_identity (id, generation, key, confirmed) \
     SELECT 1, ?1, ?2, CASE WHEN EXISTS (SELECT 1 FROM nodes) OR EXISTS (SELECT 1 FROM requests) \
     THEN 1 ELSE 0 END \
     ON CONFLICT DO NOTHING";

/// Writes `identity` over the store's own ([`berth_core::pool::Changes::identity`]):
/// the store has faced the clouds, or `berth store migrate` makes the new
/// store the same store as the old one for the clouds.
pub(super) const REPLACE: &str =
    "UPDATE pool_identity SET generation = ?1, key = ?2, confirmed = ?3 WHERE id = 1";

/// A new generation and key, as [`ENSURE`]'s values.
pub(super) fn fresh() -> [Val; 2] {
    let generation: [u8; 8] = rand::random();
    let key: [u8; 32] = rand::random();
    [hex::encode(generation).into(), hex::encode(key).into()]
}

/// `identity` as [`REPLACE`]'s values.
pub(super) fn values(identity: &Identity) -> [Val; 3] {
    [
        identity.generation.as_str().into(),
        hex::encode(identity.key).into(),
        i64::from(identity.confirmed).into(),
    ]
}

/// The identity row, read back: `id, generation, key, confirmed`.
pub(super) fn read<C: Cells + ?Sized>(row: &C) -> Result<Identity, StoreError> {
    let r = Reader::new(row, "pool_identity")?;
    let generation = r.text(1, "generation")?;
    if !is_generation(&generation) {
        return Err(corrupt("generation", "not 16 lowercase hex digits"));
    }
    let key = r.text(2, "key")?;
    let key: [u8; 32] = (hex::decode(&key).ok())
        .and_then(|k| k.try_into().ok())
        .ok_or_else(|| corrupt("key", "not 32 bytes of hex"))?;
    let confirmed = match r.num::<i64>(3, "confirmed")? {
        0 => false,
        1 => true,
        other => return Err(corrupt("confirmed", &format!("{other} is neither 0 nor 1"))),
    };
    Ok(Identity {
        generation,
        key,
        confirmed,
    })
}

fn corrupt(column: &'static str, what: &str) -> StoreError {
    StoreError::Corrupt {
        table: "pool_identity",
        id: "1".into(),
        column,
        what: what.into(),
    }
}
