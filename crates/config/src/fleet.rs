//! What every berth process on one shared store must run alike, as one
//! digest: the pool's id, timings and lease, its providers' limits and
//! rates, its labels with their offers, and the API's tokens. A reload on
//! the pool's holder is refused until every other live process runs the
//! new file's digest (each process records its own in the store), so that
//! the pool is never decided under one config while requests are checked
//! under another.
//!
//! Left out, as each process's own: where it listens and is reached, its
//! state and plugins directories, its store login, and its drivers' files,
//! settings and credentials (a provider's calls are sent by the process
//! that holds it, with that process's driver).
//!
//! The digest depends on meaning, not on arrangement: labels and providers
//! are taken in name order, offers name their provider, a slot label names
//! its backing label, and what a reload retired (`berth_config::align`)
//! is left out. So a process that reloaded a file and one that started on
//! it agree. Every process of a pool runs the same version of berth, so
//! the `Debug` form of the core's plain settings is a stable text to hash.

use std::fmt::Write;

use berth_core::config::{Label, LabelKind, Offer, ProviderIx};
use sha2::{Digest, Sha256};

use crate::settings::Settings;

/// The lowercase hex sha256 of what a pool's processes must run alike.
/// Token secrets enter it only through their own sha256.
pub fn fleet_digest(settings: &Settings) -> String {
    let pool = &settings.pool;
    let mut text = String::new();
    let _ = writeln!(
        text,
        "pool-id {:?}\ntimings {:?}\nlease-ttl {:?}",
        pool.pool_id, pool.timings, pool.requestor_lease_ttl
    );
    let mut providers: Vec<_> = pool.providers.iter().filter(|p| !p.retired).collect();
    providers.sort_by(|a, b| a.name.cmp(&b.name));
    for p in providers {
        let _ = writeln!(text, "provider {p:?}");
    }
    let mut labels: Vec<&Label> = pool.labels.iter().filter(|l| !l.retired).collect();
    labels.sort_by(|a, b| a.name.cmp(&b.name));
    for l in labels {
        // The kind apart, with names for indexes.
        let bare = Label {
            kind: LabelKind::Machine { offers: Vec::new() },
            ..l.clone()
        };
        let _ = write!(text, "label {bare:?} ");
        match &l.kind {
            LabelKind::Machine { offers } => {
                // In the file's order: it is the order of preference.
                for o in offers {
                    let provider = pool.providers.get(usize::from(o.provider.0));
                    let anonymous = Offer {
                        provider: ProviderIx(0),
                        ..o.clone()
                    };
                    let _ = write!(
                        text,
                        "offer on {:?} {anonymous:?} ",
                        provider.map(|p| &p.name)
                    );
                }
            }
            LabelKind::Slots {
                slots,
                backing,
                grace_time,
            } => {
                let backing = pool.labels.get(usize::from(backing.0)).map(|b| &b.name);
                let _ = write!(text, "slots {slots} of {backing:?} grace {grace_time:?}");
            }
        }
        text.push('\n');
    }
    let mut tokens: Vec<_> = settings.api.tokens.iter().collect();
    tokens.sort_by(|a, b| a.name.cmp(&b.name));
    for t in tokens {
        let secret = hex::encode(Sha256::digest(t.secret.as_bytes()));
        let _ = writeln!(
            text,
            "token {:?} {:?} {secret} max-nodes {:?}",
            t.name, t.role, t.max_nodes
        );
    }
    hex::encode(Sha256::digest(text.as_bytes()))
}
