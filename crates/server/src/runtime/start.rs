//! Starting a pool from the settings: the store opened (SQLite, or
//! PostgreSQL shared with other processes), the lease claimed, the drivers
//! loaded in the background, the pool restored.

// Time here is tokio's clock, which tests on paused time move.
#![deny(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;

use berth_config::{Config, Settings};
use berth_core::pool::Pool;
use berth_plugin::{DriverState, Engine, EngineConfig, Gate};
use berth_store::{Claimant, PgStore, SqliteStore, Store, Tenure};

use super::clock::Clock;
use super::mode::Holder;
use super::observer::{Deaf, Observer};
use super::providers::{Gates, Providers};
use super::service::{Backend, Parts, Service, Shared};
use super::shards::Shards;

/// Options for [`start`] beyond the config file.
#[derive(Clone, Default)]
pub struct StartOptions {
    /// Seed for node and request ids; random when `None`.
    pub seed: Option<u64>,
    /// Hears driver calls, notices and fulfilments (metrics); none if `None`.
    pub observer: Option<Arc<dyn Observer>>,
    /// Addresses no driver may reach whatever its allow-list says: the
    /// API's own.
    pub deny: Vec<SocketAddr>,
    /// The url at which the other processes sharing the pool reach this
    /// one's API (a PostgreSQL store).
    pub advertise: Option<String>,
    /// Where compiled drivers are cached; `None` uses
    /// [`berth_plugin::default_cache_dir`], else `cache` in the state
    /// directory.
    pub cache_dir: Option<std::path::PathBuf>,
    /// Adopt the pool's instances that the store cannot vouch for, as
    /// their tags say, until every provider has been listed once
    /// ([`Pool::adopt_instances`]).
    pub adopt_instances: bool,
}

/// Loads the configured drivers, opens the store in the state directory,
/// restores the pool from it, and starts it.
pub async fn start(settings: Settings, options: StartOptions) -> anyhow::Result<Service> {
    let state_dir = &settings.state_dir;
    std::fs::create_dir_all(state_dir)
        .with_context(|| format!("creating the state directory {}", state_dir.display()))?;
    let config = Arc::new(settings.pool.clone());
    // How the other processes of a shared store are reached: read before
    // the store is opened, so that a CA file that cannot be used ends the
    // start before this process takes the pool's lease.
    let connector = match &settings.store.postgres {
        Some(_) => {
            Some(super::peers::connector(&settings.api).map_err(|e| anyhow::anyhow!("{e}"))?)
        }
        None => None,
    };
    // The store first: opening it checks that the state directory can be
    // written (a read-only or full one is a clear error now, not a failed
    // commit later), before any driver starts loading.
    let Opened {
        mut store,
        records,
        shared,
    } = open_store(&settings, &config, options.advertise.clone()).await?;
    let tenure = store.claim().await.context("claiming the pool's lease")?;
    let (gate, standby) = match tenure {
        Tenure::Alone => (Gate::always(), None),
        Tenure::Held(held) => {
            let gate = Gate::shut();
            gate.open_until(held.valid_until);
            tracing::info!(epoch = held.epoch, "this process holds the pool");
            (gate, None)
        }
        Tenure::Other {
            holder, address, ..
        } => (
            Gate::shut(),
            Some(Holder {
                name: holder.into(),
                address: address.into(),
            }),
        ),
    };
    let gate = Arc::new(gate);
    let observer = options.observer.unwrap_or_else(|| Arc::new(Deaf));
    let backend = match shared {
        Some((pg, inbox)) => {
            let deadlines = (settings.drivers.iter())
                .map(|d| d.sandbox.call_deadline)
                .collect();
            let digest = berth_config::fleet_digest(&settings);
            let connector = connector
                .ok_or_else(|| anyhow::anyhow!("a shared store without its peers' connector"))?;
            let (shards, beating) =
                Shards::start(pg, deadlines, observer.clone(), digest, connector)
                    .await
                    .context("taking part in the providers' leases")?;
            Backend::Shared(Shared {
                standby,
                shards,
                beating,
                inbox: Arc::new(inbox),
            })
        }
        None => Backend::Embedded,
    };
    // Each provider's driver sends while this process may act on it: while
    // it holds the provider's lease (and the pool's holder is certain), or
    // for a store of its own, always.
    let (gates, stands_by) = match &backend {
        Backend::Shared(shared) => (
            Gates::Each(
                (0..config.providers.len())
                    .filter_map(|i| shared.shards.gate(i))
                    .collect(),
            ),
            shared.standby.is_some(),
        ),
        Backend::Embedded => (Gates::One(gate.clone()), false),
    };
    let loaded = if stands_by {
        // Loaded when the pool is taken over, as it then stands.
        berth_store::Loaded::default()
    } else {
        store.load(&config).await.context("loading the store")?
    };
    let engine = Engine::new(EngineConfig {
        cache_dir: Some(
            match (options.cache_dir.clone()).or_else(berth_plugin::default_cache_dir) {
                Some(dir) => dir,
                None => in_state_dir(state_dir, "cache", &[])?,
            },
        ),
        ..Default::default()
    })?;
    let driver_state = match records {
        Some(records) => records,
        None => {
            let path = in_state_dir(state_dir, "driver-state.sqlite", SQLITE_COMPANIONS)?;
            DriverState::on(Arc::new(
                berth_store::SqliteRecords::open(&path)
                    .with_context(|| format!("opening the driver records {}", path.display()))?,
            ))
        }
    };
    // In the background: a driver that fails to start costs its own
    // provider, not the service.
    let providers = Providers::start(engine, &settings, driver_state, options.deny, gates);
    for note in &loaded.dropped {
        tracing::warn!("store: {note}");
    }
    let clock = Clock::system();
    let seed = options.seed.unwrap_or_else(rand::random);
    let mut pool = Pool::restore(config.clone(), seed, loaded.snapshot, clock.now());
    if options.adopt_instances {
        tracing::warn!(
            "adopting on purpose: instances with this pool's tags that the store cannot vouch for are taken as their tags say (those tagged as handed out, on hold) and signed anew, until every provider has been listed once"
        );
        pool.adopt_instances();
    }
    tracing::info!(
        providers = config.providers.len(),
        labels = config.labels.len(),
        nodes = pool.nodes().count(),
        "pool started"
    );
    let parts = Parts {
        providers,
        store,
        clock,
        observer,
        gate,
        backend,
    };
    Ok(Service::spawn(pool, parts))
}

/// A store just opened, and what comes with it.
pub(super) struct Opened {
    pub(super) store: Box<dyn Store>,
    /// The drivers' records in the same PostgreSQL database, shared with
    /// every process on the pool; `None` for a store of this process's
    /// own, whose drivers keep theirs beside it.
    pub(super) records: Option<DriverState>,
    /// The providers' leases and the requests inbox in the same database.
    pub(super) shared: Option<(berth_store::PgShards, berth_store::PgInbox)>,
}

/// Opens the store the settings name: SQLite in the state directory, or a
/// PostgreSQL database shared with other processes, which reach this one's
/// API at `advertise`.
pub(super) async fn open_store(
    settings: &Settings,
    config: &Arc<Config>,
    advertise: Option<String>,
) -> anyhow::Result<Opened> {
    let Some(pg) = &settings.store.postgres else {
        let path = in_state_dir(&settings.state_dir, "berth.db", SQLITE_COMPANIONS)?;
        let store = SqliteStore::open(&path, config.clone(), settings.store.sync)
            .with_context(|| format!("opening the store {}", path.display()))?;
        return Ok(Opened {
            store: Box::new(store),
            records: None,
            shared: None,
        });
    };
    let address = advertise.unwrap_or_default();
    let claimant = Claimant {
        holder: format!(
            "{address} pid {} #{:04x}",
            std::process::id(),
            rand::random::<u16>()
        ),
        address,
        ttl: pg.pool_lease_ttl,
    };
    let store = PgStore::open(pg, config.clone(), Some(claimant))
        .await
        .with_context(|| format!("opening the PostgreSQL store {}", pg.url))?;
    let names = config.providers.iter().map(|p| p.name.clone()).collect();
    // Both are there for a store opened with a claimant, as this one is.
    let shards = store.shards(names).context("the store has no claimant")?;
    let inbox = store.request_inbox().context("the store has no claimant")?;
    Ok(Opened {
        records: Some(DriverState::on(Arc::new(store.records()))),
        shared: Some((shards, inbox)),
        store: Box::new(store),
    })
}

/// What SQLite makes beside a database file, by the file's name and these.
const SQLITE_COMPANIONS: &[&str] = &["-wal", "-shm", "-journal"];

/// The path of `file` in the state directory, refused when it, or one of
/// `companions` beside it, is a symlink that leads out of the directory.
/// SQLite opens files by path, not relative to a directory held open, so
/// this is checked before it opens them: berth's records are written
/// inside the state directory, never where a link in it points.
fn in_state_dir(
    state_dir: &std::path::Path,
    file: &str,
    companions: &[&str],
) -> anyhow::Result<std::path::PathBuf> {
    let names =
        std::iter::once(file.to_owned()).chain(companions.iter().map(|c| file.to_owned() + c));
    for name in names {
        berth_config::stays_inside(state_dir, std::path::Path::new(&name))
            .map_err(|e| anyhow::anyhow!("the state directory's {file}: {e}"))?;
    }
    Ok(state_dir.join(file))
}
