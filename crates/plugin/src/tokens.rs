//! A provider's credentials as they run: each one's secrets read, or
//! exchanged for a token, when a request first needs them, and kept
//! current after that.
//!
//! One [`Held`] per provider holds a [`Cell`] per `[[credentials]]`
//! table. A cell answers [`Cell::current`] with what to put on a request
//! ([`Issued`]):
//! - the kinds that sign or send a fixed value (`aws-sigv4`, `bearer`,
//!   `header`) read their secrets once, and again after `SIGHUP`
//!   ([`Held::reload`]);
//! - the kinds exchanged for a token (`keystone`,
//!   `oauth2-client-credentials`, `google-service-account`) make the
//!   exchange ([`crate::exchange`]) on first use, reading their secret
//!   files each time, and again once 80% of the token's lifetime has
//!   passed, after a `401` ([`Cell::refused`]) or after `SIGHUP`.
//!
//! One exchange per cell is in flight at a time: the cell's lock is held
//! across it, and callers that wait on it get its token. A failed exchange
//! is tried again only after a backoff (1 s, doubling to a minute), while
//! an earlier token that has not expired goes on being used. A `401` makes
//! a new exchange only for a token at least a second old, so a driver that
//! calls a host which refuses everything cannot make the host hammer the
//! token endpoint.
//!
//! Every secret a cell sent or read (tokens, the current and the one
//! before; passwords, client secrets, keys, assertions) is masked in what
//! the driver reads back: the provider's [`Scrubber`] is rebuilt before a
//! new token is first used.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use berth_config::{AllowedHost, Auth, Credential};

use crate::credentials::{Material, sent_secrets};
use crate::exchange::{self, Exchanged, Failure};
use crate::scrub::Scrubber;

/// The first wait after a failed exchange; it doubles up to
/// [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// A token younger than this that is refused (`401`) is not exchanged
/// again: the endpoint that refused it would refuse the next one too, and
/// the driver sees `unauthorized`.
const MIN_REFUSED_AGE: Duration = Duration::from_secs(1);

/// Refresh at this share of a token's lifetime.
const REFRESH_AT: f64 = 0.8;

/// What a credential puts on requests now.
#[derive(Debug)]
pub(crate) struct Issued {
    pub material: Material,
    /// The non-secret part of the exchange's answer (`auth-info`); `None`
    /// for kinds with no exchange.
    pub info: Option<serde_json::Value>,
    /// Counts the cell's issues, so that a `401` names the one refused.
    pub generation: u64,
    obtained: Instant,
    /// When to exchange again; `None`: only after a `401` or `SIGHUP`.
    refresh_at: Option<Instant>,
    /// When the token stops working; `None`: it does not expire.
    expires_at: Option<Instant>,
}

impl Issued {
    fn due(&self, now: Instant) -> bool {
        self.refresh_at.is_some_and(|r| now >= r)
    }

    fn usable(&self, now: Instant) -> bool {
        self.expires_at.is_none_or(|e| now < e)
    }
}

/// Why a credential could not be used: its exchange or its files failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Unusable {
    /// The token endpoint refused the credential (as opposed to being out
    /// of reach or answering something else).
    pub refused: bool,
    /// What went wrong, with the endpoint's own words; never a secret.
    pub message: String,
}

/// How one credential is doing, for `/v1/providers`, `/readyz` and the
/// metrics.
#[derive(Clone, Debug, PartialEq)]
pub struct CredentialStatus {
    /// The host it is for, as configured.
    pub host: String,
    pub kind: &'static str,
    /// The latest try failed, with this; `None` when it worked or none was
    /// made yet.
    pub error: Option<String>,
    /// When the latest try failed.
    pub failing_since: Option<SystemTime>,
    /// Whether a try was made yet (a credential is read or exchanged only
    /// when a request first needs it).
    pub used: bool,
    /// Until when the current token works, for kinds with tokens.
    pub expires: Option<SystemTime>,
    /// Exchanges (or reads, for kinds with none) that worked, and that
    /// failed.
    pub exchanges: u64,
    pub failures: u64,
    /// Exchanges made before expiry because a host answered `401`.
    pub refreshed_on_401: u64,
    /// Requests sent again with a new token after a `401`.
    pub replays: u64,
}

struct Slot {
    issued: Option<Arc<Issued>>,
    /// No exchange before this, after a failure.
    retry_at: Option<Instant>,
    backoff: Duration,
    last_error: Option<(Unusable, SystemTime)>,
    generations: u64,
}

/// One credential of a provider.
pub(crate) struct Cell {
    pub host: AllowedHost,
    auth: Auth,
    provider: Arc<str>,
    /// Held across an exchange: one in flight at a time.
    slot: tokio::sync::Mutex<Slot>,
    /// Set by `SIGHUP`: read the secrets again at the next use.
    stale: AtomicBool,
    /// What the scrubber masks for this credential: what the latest two
    /// issues sent and every secret read for them.
    secrets: Mutex<Vec<Vec<u8>>>,
    /// A copy of the status, read without waiting on an exchange.
    status: Mutex<CredentialStatus>,
    replays: AtomicU64,
}

impl Cell {
    fn new(provider: Arc<str>, c: Credential) -> Cell {
        Cell {
            status: Mutex::new(CredentialStatus {
                host: c.host.to_string(),
                kind: c.auth.kind(),
                error: None,
                failing_since: None,
                used: false,
                expires: None,
                exchanges: 0,
                failures: 0,
                refreshed_on_401: 0,
                replays: 0,
            }),
            host: c.host,
            auth: c.auth,
            provider,
            slot: tokio::sync::Mutex::new(Slot {
                issued: None,
                retry_at: None,
                backoff: FIRST_BACKOFF,
                last_error: None,
                generations: 0,
            }),
            stale: AtomicBool::new(false),
            secrets: Mutex::new(Vec::new()),
            replays: AtomicU64::new(0),
        }
    }

    /// Whether it is exchanged for tokens, which a `401` may renew.
    pub fn exchanged(&self) -> bool {
        matches!(
            self.auth,
            Auth::Keystone(_) | Auth::OAuth2(_) | Auth::Google(_)
        )
    }

    /// Counts a request sent again after a `401`.
    pub fn replayed(&self) {
        self.replays.fetch_add(1, Ordering::Relaxed);
    }
}

/// A provider's credentials.
pub(crate) struct Held {
    cells: Vec<Cell>,
    /// Masks every cell's secrets in what the driver reads back; `None`
    /// while there is nothing to mask.
    scrubber: RwLock<Option<Arc<Scrubber>>>,
    http: exchange::Client,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("credentials", &self.cells.len())
            .finish_non_exhaustive()
    }
}

impl Held {
    pub fn new(provider: Arc<str>, credentials: Vec<Credential>) -> Held {
        let held = Held {
            cells: credentials
                .into_iter()
                .map(|c| Cell::new(provider.clone(), c))
                .collect(),
            scrubber: RwLock::new(None),
            http: exchange::Client::new(),
        };
        // What is known before any use: values from the environment.
        for cell in &held.cells {
            if let Ok(mut s) = cell.secrets.lock() {
                *s = exchange::known_secrets(&cell.auth);
            }
        }
        held.rescrub();
        held
    }

    /// The credential for a request to `host`:`port`, if any: the first
    /// that matches, in config order.
    pub fn find(&self, host: &str, port: u16) -> Option<&Cell> {
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        self.cells.iter().find(|c| c.host.matches(&host, port))
    }

    /// The credential `auth-info` answers for `host` (a host as in the
    /// allowed hosts, with or without a port).
    pub fn for_host(&self, host: &str) -> Option<&Cell> {
        let asked = AllowedHost::parse(host).ok()?;
        self.cells
            .iter()
            .find(|c| c.host.covers(&asked) || asked.covers(&c.host))
    }

    /// The scrubber of every secret sent or read so far.
    pub fn scrubber(&self) -> Option<Arc<Scrubber>> {
        self.scrubber.read().ok().and_then(|s| s.clone())
    }

    fn rescrub(&self) {
        let all: Vec<Vec<u8>> = self
            .cells
            .iter()
            .flat_map(|c| c.secrets.lock().map(|s| s.clone()).unwrap_or_default())
            .collect();
        let scrubber = Scrubber::new(all).map(Arc::new);
        if let Ok(mut s) = self.scrubber.write() {
            *s = scrubber;
        }
    }

    /// `SIGHUP`: every credential reads its secrets (and is exchanged)
    /// again at its next use.
    pub fn reload(&self) {
        for cell in &self.cells {
            cell.stale.store(true, Ordering::SeqCst);
        }
    }

    pub fn statuses(&self) -> Vec<CredentialStatus> {
        self.cells
            .iter()
            .filter_map(|c| {
                let mut s = c.status.lock().ok()?.clone();
                s.replays = c.replays.load(Ordering::Relaxed);
                Some(s)
            })
            .collect()
    }

    /// What `cell` puts on a request now: read or exchanged first if it is
    /// due.
    pub async fn current(&self, cell: &Cell) -> Result<Arc<Issued>, Unusable> {
        let mut slot = cell.slot.lock().await;
        let now = Instant::now();
        let stale = cell.stale.swap(false, Ordering::SeqCst);
        if !stale
            && let Some(i) = &slot.issued
            && !i.due(now)
        {
            return Ok(i.clone());
        }
        if !stale
            && let Some(retry) = slot.retry_at
            && now < retry
        {
            return match (&slot.issued, &slot.last_error) {
                (Some(i), _) if i.usable(now) => Ok(i.clone()),
                (_, Some((e, _))) => Err(e.clone()),
                (_, None) => Err(Unusable {
                    refused: false,
                    message: "waiting to try the exchange again".to_owned(),
                }),
            };
        }
        self.renew(cell, &mut slot, now).await
    }

    /// A host answered `401` to a request that carried issue `generation`:
    /// the token is exchanged again (unless it is under a second old) and
    /// the new one returned, to send the request again with. `None`: send
    /// nothing again, the driver sees the `401`.
    pub async fn refused(&self, cell: &Cell, generation: u64) -> Option<Arc<Issued>> {
        if !cell.exchanged() {
            return None;
        }
        let mut slot = cell.slot.lock().await;
        let now = Instant::now();
        match &slot.issued {
            // Another request renewed it already.
            Some(i) if i.generation != generation => return Some(i.clone()),
            Some(i) if now.duration_since(i.obtained) < MIN_REFUSED_AGE => return None,
            _ => {}
        }
        if slot.retry_at.is_some_and(|r| now < r) {
            return None;
        }
        // Known bad: never used again, even if the exchange fails.
        slot.issued = None;
        if let Ok(mut s) = cell.status.lock() {
            s.refreshed_on_401 += 1;
        }
        let fresh = self.renew(cell, &mut slot, now).await.ok()?;
        (fresh.generation != generation).then_some(fresh)
    }

    /// Reads or exchanges `cell`'s credential now, with its lock held.
    async fn renew(
        &self,
        cell: &Cell,
        slot: &mut Slot,
        now: Instant,
    ) -> Result<Arc<Issued>, Unusable> {
        let outcome = exchange::run(&self.http, &cell.auth).await;
        // Every secret read is masked from now on, whatever the outcome:
        // an endpoint may quote a refused one back.
        let read = match &outcome {
            Ok(e) => e.read.clone(),
            Err(f) => f.read.clone(),
        };
        match outcome {
            Ok(Exchanged {
                material,
                lifetime,
                info,
                ..
            }) => {
                slot.generations += 1;
                let obtained = Instant::now();
                let issued = Arc::new(Issued {
                    info,
                    generation: slot.generations,
                    obtained,
                    refresh_at: lifetime.map(|l| obtained + l.mul_f64(REFRESH_AT)),
                    expires_at: lifetime.map(|l| obtained + l),
                    material,
                });
                if let Ok(mut s) = cell.secrets.lock() {
                    let previous = slot
                        .issued
                        .as_ref()
                        .map(|i| sent_secrets(&i.material))
                        .unwrap_or_default();
                    *s = exchange::known_secrets(&cell.auth);
                    s.extend(read);
                    s.extend(previous);
                    s.extend(sent_secrets(&issued.material));
                }
                // Before the token is first used.
                self.rescrub();
                slot.issued = Some(issued.clone());
                slot.retry_at = None;
                slot.backoff = FIRST_BACKOFF;
                let recovered = slot.last_error.take().is_some();
                if let Ok(mut s) = cell.status.lock() {
                    s.used = true;
                    s.exchanges += 1;
                    s.error = None;
                    s.failing_since = None;
                    s.expires = lifetime.map(|l| SystemTime::now() + l);
                }
                if recovered {
                    tracing::info!(provider = %cell.provider, host = %cell.host, kind = cell.auth.kind(), "credential works again");
                }
                tracing::debug!(provider = %cell.provider, host = %cell.host, generation = issued.generation, lifetime_s = lifetime.map(|l| l.as_secs_f64()), "credential issued");
                Ok(issued)
            }
            Err(Failure {
                refused, message, ..
            }) => {
                if let Ok(mut s) = cell.secrets.lock() {
                    s.extend(read);
                }
                self.rescrub();
                let message = match self.scrubber() {
                    Some(s) => s.text(&message),
                    None => message,
                };
                let e = Unusable { refused, message };
                slot.retry_at = Some(now + slot.backoff);
                slot.backoff = (slot.backoff * 2).min(MAX_BACKOFF);
                let since = match &slot.last_error {
                    Some((_, since)) => *since,
                    None => SystemTime::now(),
                };
                slot.last_error = Some((e.clone(), since));
                if let Ok(mut s) = cell.status.lock() {
                    s.used = true;
                    s.failures += 1;
                    s.error = Some(e.message.clone());
                    s.failing_since = Some(since);
                }
                tracing::warn!(provider = %cell.provider, host = %cell.host, kind = cell.auth.kind(), error = %e.message, "credential could not be used");
                match &slot.issued {
                    Some(i) if i.usable(now) => Ok(i.clone()),
                    _ => Err(e),
                }
            }
        }
    }
}

/// What the `auth` import (contract 0.2) answers from: the provider's
/// credentials.
pub(crate) struct AuthCtx {
    pub policy: Arc<crate::sandbox::HttpPolicy>,
}

impl AuthCtx {
    /// The non-secret part of what exchanging `host`'s credential for a
    /// token returned, as JSON text, exchanging it first if it is due;
    /// `None` when no credential of the provider for `host` is exchanged
    /// (also when `host` is not one the driver may reach: no credential
    /// is).
    pub async fn info(
        &self,
        host: &str,
    ) -> Result<Option<String>, berth_core::driver::DriverError> {
        let held = self.policy.credentials();
        let Some(cell) = held.for_host(host).filter(|c| c.exchanged()) else {
            return Ok(None);
        };
        match held.current(cell).await {
            Ok(issued) => Ok(issued.info.as_ref().map(|v| v.to_string())),
            Err(e) if e.refused => Err(berth_core::driver::DriverError::Unauthorized(e.message)),
            Err(e) => Err(berth_core::driver::DriverError::Transient(e.message)),
        }
    }
}
