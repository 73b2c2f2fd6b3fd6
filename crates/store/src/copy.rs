//! Moving a pool's records from one store into another, empty one
//! (`berth store migrate`: the embedded SQLite file onto PostgreSQL).

use super::error::StoreError;
use super::store::{Loaded, Store};
use berth_core::config::Config;
use berth_core::pool::Changes;

/// What [`copy_into_empty`] moved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Copied {
    pub nodes: usize,
    pub requests: usize,
    pub leases: usize,
    /// What the source's load left out (records that no longer fit
    /// `config`), in words: these were not copied.
    pub dropped: Vec<String>,
}

/// Copies every record of `source`, as loaded against `config`, into
/// `target` in one commit, then reads `target` back and checks that it holds
/// exactly what was read. `target` must be empty: records already there
/// would be mixed with the copied ones, so nothing is written.
pub async fn copy_into_empty(
    source: &mut dyn Store,
    target: &mut dyn Store,
    config: &Config,
) -> Result<Copied, StoreError> {
    let Loaded { snapshot, dropped } = source.load(config).await?;
    let there = target.load(config).await?;
    let held = &there.snapshot;
    if !(held.nodes.is_empty() && held.requests.is_empty() && held.leases.is_empty()) {
        return Err(StoreError::NotEmpty {
            nodes: held.nodes.len(),
            requests: held.requests.len(),
            leases: held.leases.len(),
        });
    }
    let changes = Changes {
        nodes: snapshot.nodes.clone(),
        requests: snapshot.requests.clone(),
        leases: snapshot.leases.clone(),
        // The same store for the clouds: its instances stay vouched for.
        identity: Some(snapshot.identity.clone()),
        ..Default::default()
    };
    target.commit(&changes).await?;
    let written = target.load(config).await?.snapshot;
    if written != snapshot {
        return Err(StoreError::CopyDiffers);
    }
    Ok(Copied {
        nodes: snapshot.nodes.len(),
        requests: snapshot.requests.len(),
        leases: snapshot.leases.len(),
        dropped,
    })
}
