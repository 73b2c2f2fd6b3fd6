//! The providers' leases: with several berth processes on one PostgreSQL
//! pool, each provider is held by one process at a time (table
//! `provider_lease`), which alone sends that provider's calls to its cloud.
//! The leases spread over the live processes (table `members`): each
//! process takes free leases up to its fair share, the number of providers
//! over the number of live processes rounded up, and gives up what it holds
//! beyond that share, so that a process that joins gets work and one that
//! dies has its providers taken over once their leases expire.
//!
//! One statement does a heartbeat (`berth_shards`): it renews this
//! process's membership and the leases it keeps, takes free ones (`FOR
//! UPDATE SKIP LOCKED`, so processes beating together never wait on each
//! other), and answers every lease as it now stands, the pool's too. A
//! takeover bumps the lease's epoch. Each beat also records the digest
//! of the config the process runs, and answers every live process's
//! (`berth_beat`, migration step 11), so that a config reload on the
//! pool's holder can wait for the whole fleet to run the same file.

// Time here is tokio's clock, which tests on paused time move.
#![deny(clippy::disallowed_methods)]

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use tokio_postgres::{Client, Statement};

use crate::connect::{
    DEADLINE_MIN, LEASES_CHANNEL, Login, NOTIFY_POOL, NOTIFY_PROVIDERS, NOTIFY_REQUESTS,
    connect_listening,
};
use crate::error::{StoreError, lost};
use crate::store::Claimant;

/// A heartbeat's statement: see the module docs and migration steps 4 and
/// 11.
const BEAT: &str = "SELECT provider, holder, address, epoch, expires, remaining_ms, members, \
     config FROM berth_beat($1, $2, $3, $4, $5, $6)";

/// A connection, the task that runs it, and the heartbeat prepared on it.
type Connected = (Client, tokio::task::JoinHandle<()>, Statement);

/// One process's heartbeats, on a connection of its own
/// ([`crate::PgStore::shards`]).
pub struct PgShards {
    login: Login,
    me: Claimant,
    /// The configured providers, in the config's order.
    providers: Vec<String>,
    /// The digest of the config this process runs, recorded at each beat.
    config: String,
    connected: Option<Connected>,
    /// What any process announces (leases given up, requests put into
    /// the inbox), as the server passes it on.
    announced: Option<tokio::sync::mpsc::UnboundedReceiver<String>>,
    /// A connection was made since [`PgShards::announced`] last answered:
    /// requests put into the inbox while none listened were not heard of.
    missed: bool,
}

/// What processes announced, as [`PgShards::announced`] gathers it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Announced {
    /// The pool's lease was given up.
    pub pool: bool,
    /// Providers' leases were given up.
    pub providers: bool,
    /// Requests were put into the inbox.
    pub requests: bool,
}

/// Every lease as one heartbeat found it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Roster {
    /// When the heartbeat's statement was sent, by the monotonic clock as
    /// tokio reads it;
    /// `None` before the first one.
    pub sent: Option<Instant>,
    /// Processes whose membership has not expired, this one included.
    pub members: u32,
    /// Each configured provider's lease, in the config's order: `None`
    /// while nobody holds it.
    pub providers: Vec<Option<RosterLease>>,
    /// The pool's lease (the process that decides), if anybody holds it.
    pub pool: Option<RosterLease>,
    /// Every process whose membership has not expired, this one included,
    /// with the config it runs.
    pub fleet: Vec<Member>,
}

/// A live process, as its last heartbeat recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub holder: String,
    /// Where its API is reached.
    pub address: String,
    /// The digest of the config it runs (`berth_config::fleet_digest`);
    /// empty for a process of a version that records none.
    pub config: String,
}

/// A lease that has not expired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RosterLease {
    pub holder: String,
    /// Where the holder's API is reached.
    pub address: String,
    /// The fencing token: bumped at each takeover.
    pub epoch: i64,
    /// When it expires unrenewed, by the database's clock.
    pub expires: SystemTime,
    /// How long it had to run when the heartbeat read it.
    pub remaining: Duration,
}

impl Roster {
    /// How many providers a process should hold: the providers over the
    /// live processes, rounded up.
    pub fn share(&self) -> usize {
        self.providers.len().div_ceil(self.members.max(1) as usize)
    }

    /// The providers (by index) whose lease `holder` holds.
    pub fn held_by(&self, holder: &str) -> Vec<usize> {
        (self.providers.iter().enumerate())
            .filter(|(_, l)| l.as_ref().is_some_and(|l| l.holder == holder))
            .map(|(i, _)| i)
            .collect()
    }
}

impl PgShards {
    pub(crate) fn new(login: Login, me: Claimant, providers: Vec<String>) -> PgShards {
        PgShards {
            login,
            me,
            providers,
            config: String::new(),
            connected: None,
            announced: None,
            missed: false,
        }
    }

    /// This process, as the leases name it.
    pub fn me(&self) -> &Claimant {
        &self.me
    }

    /// The configured providers, in the config's order.
    pub fn providers(&self) -> &[String] {
        &self.providers
    }

    /// The configured providers, in the config's order, from the next beat
    /// on: a config reload adds providers at the end.
    pub fn set_providers(&mut self, providers: Vec<String>) {
        self.providers = providers;
    }

    /// The digest of the config this process runs, recorded from the next
    /// beat on.
    pub fn set_config(&mut self, digest: String) {
        self.config = digest;
    }

    async fn client(&mut self) -> Result<&Client, StoreError> {
        Ok(&self.connection().await?.0)
    }

    async fn connection(&mut self) -> Result<&Connected, StoreError> {
        if self
            .connected
            .as_ref()
            .is_some_and(|(c, _, _)| c.is_closed())
        {
            self.disconnect();
        }
        if self.connected.is_none() {
            let (client, task, announced) = connect_listening(&self.login).await?;
            let listen = client
                .batch_execute(&format!("LISTEN {LEASES_CHANNEL}"))
                .await;
            if let Err(error) = listen {
                task.abort();
                return Err(StoreError::Postgres {
                    doing: "listening for announcements",
                    error,
                });
            }
            let beat = match client.prepare(BEAT).await {
                Ok(beat) => beat,
                Err(error) => {
                    task.abort();
                    return Err(StoreError::Postgres {
                        doing: "preparing the heartbeat",
                        error,
                    });
                }
            };
            self.connected = Some((client, task, beat));
            self.announced = Some(announced);
            self.missed = true;
        }
        Ok(self.connected.as_ref().expect("connected above"))
    }

    fn disconnect(&mut self) {
        if let Some((_, task, _)) = self.connected.take() {
            task.abort();
        }
        self.announced = None;
    }

    /// Waits until a process announces something: a lease given up (the
    /// pool's, or providers'), or requests put into the inbox; several
    /// announcements at once come as one. Right after a connection is made,
    /// requests count as announced, since nobody listened before (leases
    /// are looked at by every beat anyway). Waits for ever while not
    /// connected.
    pub async fn announced(&mut self) -> Announced {
        if std::mem::take(&mut self.missed) {
            return Announced {
                requests: true,
                ..Announced::default()
            };
        }
        let Some(rx) = self.announced.as_mut() else {
            return std::future::pending().await;
        };
        let Some(first) = rx.recv().await else {
            // The connection ended: the next beat connects again.
            self.announced = None;
            return std::future::pending().await;
        };
        let mut seen = Announced::default();
        let mut payload = Some(first);
        while let Some(p) = payload {
            match p.as_str() {
                NOTIFY_POOL => seen.pool = true,
                NOTIFY_PROVIDERS => seen.providers = true,
                NOTIFY_REQUESTS => seen.requests = true,
                _ => {}
            }
            payload = rx.try_recv().ok();
        }
        seen
    }

    /// One heartbeat: renews this process's membership and the leases in
    /// `keep` that it still holds, takes free ones up to its share, and
    /// answers every lease as it stands.
    pub async fn beat(&mut self, keep: &[String]) -> Result<Roster, StoreError> {
        let ttl = i64::try_from(self.me.ttl.as_millis()).unwrap_or(i64::MAX);
        let (holder, address, providers, config) = (
            self.me.holder.clone(),
            self.me.address.clone(),
            self.providers.clone(),
            self.config.clone(),
        );
        let sent = Instant::now();
        // A database that stops answering is a lost connection after this,
        // not a heartbeat that never ends (the gates shut meanwhile, when
        // the leases could lapse).
        let after = (self.me.ttl * 2).max(DEADLINE_MIN);
        let rows = {
            let (client, _, beat) = self.connection().await?;
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
                [&holder, &address, &ttl, &providers, &keep, &config];
            tokio::time::timeout(after, client.query(beat, &params)).await
        };
        let rows = match rows {
            Ok(Ok(rows)) => rows,
            Err(_) => {
                self.disconnect();
                return Err(StoreError::TimedOut {
                    doing: "renewing the providers' leases",
                    after,
                });
            }
            Ok(Err(error)) => {
                if lost(&error) {
                    self.disconnect();
                }
                return Err(StoreError::Postgres {
                    doing: "renewing the providers' leases",
                    error,
                });
            }
        };
        let mut roster = Roster {
            sent: Some(sent),
            providers: vec![None; self.providers.len()],
            ..Roster::default()
        };
        for row in rows {
            if let Some(config) = row.get::<_, Option<String>>(7) {
                roster.fleet.push(Member {
                    holder: row.get(1),
                    address: row.get(2),
                    config,
                });
                continue;
            }
            let name: Option<String> = row.get(0);
            roster.members = u32::try_from(row.get::<_, i64>(6)).unwrap_or(u32::MAX);
            let expires: Option<SystemTime> = row.get(4);
            let lease = expires.map(|expires| RosterLease {
                holder: row.get(1),
                address: row.get(2),
                epoch: row.get(3),
                expires,
                remaining: Duration::from_millis(u64::try_from(row.get::<_, i64>(5)).unwrap_or(0)),
            });
            match name {
                None => roster.pool = lease,
                Some(name) => {
                    if let Some(i) = self.providers.iter().position(|p| *p == name) {
                        roster.providers[i] = lease;
                    }
                }
            }
        }
        roster.fleet.sort_by(|a, b| a.holder.cmp(&b.holder));
        Ok(roster)
    }

    /// Gives up `providers`' leases (those this process holds) at once, so
    /// that another process takes them at its next heartbeat.
    pub async fn release(&mut self, providers: &[String]) -> Result<(), StoreError> {
        let holder = self.me.holder.clone();
        let client = self.client().await?;
        // Announced, so that the others take them at once.
        client
            .execute(
                "WITH given AS (UPDATE provider_lease SET expires = clock_timestamp() \
                   WHERE holder = $1 AND provider = ANY($2) AND expires > clock_timestamp() \
                   RETURNING 1) \
                 SELECT pg_notify($3, $4) FROM given LIMIT 1",
                &[&holder, &providers, &LEASES_CHANNEL, &NOTIFY_PROVIDERS],
            )
            .await
            .map(drop)
            .map_err(|error| StoreError::Postgres {
                doing: "giving providers' leases up",
                error,
            })
    }

    /// Gives up every lease and the membership: a clean stop.
    pub async fn leave(&mut self) -> Result<(), StoreError> {
        let all = self.providers.clone();
        self.release(&all).await?;
        let holder = self.me.holder.clone();
        let client = self.client().await?;
        client
            .execute("DELETE FROM members WHERE holder = $1", &[&holder])
            .await
            .map(drop)
            .map_err(|error| StoreError::Postgres {
                doing: "leaving the pool's members",
                error,
            })
    }

    /// The secret the processes on this pool show each other when one
    /// carries out a call for another.
    pub async fn peer_secret(&mut self) -> Result<String, StoreError> {
        let client = self.client().await?;
        client
            .query_one("SELECT secret FROM peer_secret WHERE id = 1", &[])
            .await
            .map(|row| row.get(0))
            .map_err(|error| StoreError::Postgres {
                doing: "reading the pool's peer secret",
                error,
            })
    }
}

impl Drop for PgShards {
    fn drop(&mut self) {
        self.disconnect();
    }
}
