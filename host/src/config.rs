//! berth's config file: the TOML as written (`raw`), checked into a typed
//! [`Config`] that reports every problem at once, each with its path.
//!
//! The typed config is plain data. The pool core reads labels, offers, limits
//! and timings from it; the runtime reads drivers, driver config and sandbox
//! settings; the service reads `api`. Secrets reach the driver config and API
//! tokens through `${ENV}` interpolation and are never printed: [`Config`]'s
//! `Debug` shows them redacted.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::plugin::{AllowedHost, Credential, SandboxLimits};

mod parse;
#[cfg(test)]
mod tests;

pub use parse::{ConfigErrors, Problem, base_dir, check_files, credentials, load, parse};

/// Index of a provider in [`Config::providers`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProviderIx(pub u16);

/// Index of a label in [`Config::labels`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LabelIx(pub u16);

/// A checked config.
#[derive(Clone, Debug)]
pub struct Config {
    /// The ownership tag value: every instance berth creates carries it.
    pub pool_id: String,
    /// Where the embedded store and the compiled-driver cache live.
    pub state_dir: PathBuf,
    /// Where driver files are found (a provider's `driver` is relative to it).
    pub plugins_dir: PathBuf,
    /// Pool-wide timings.
    pub timings: Timings,
    /// Providers, in the order the file names them.
    pub providers: Vec<Provider>,
    /// Labels, in the order the file names them.
    pub labels: Vec<Label>,
    /// The HTTP service: where it listens, client leases, tokens, limits.
    pub api: Api,
    /// The pool's store (`[store]`).
    pub store: StoreSettings,
}

/// The pool's store (`[store]`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreSettings {
    /// How far a commit is made durable before berth acts on it (`sync`).
    pub sync: StoreSync,
}

/// How far a commit is made durable before berth acts on it or answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StoreSync {
    /// On disk (fsync) before anything is done or answered: a hand-out a
    /// client has seen survives power loss (`full`, the default).
    #[default]
    Full,
    /// Written, and on disk at the next checkpoint (within a second or
    /// two): survives the process dying, not the machine (`normal`).
    Normal,
}

/// The HTTP service's settings (`[api]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Api {
    /// Where `berth serve` listens unless `--listen` says otherwise.
    pub listen: std::net::SocketAddr,
    /// How long a requestor's lease lasts after its last call or heartbeat
    /// (`lease-ttl`).
    pub lease_ttl: Duration,
    /// Bearer tokens (`[api.tokens.NAME]`). None configured: every caller is
    /// an admin, which is only allowed on a loopback address.
    pub tokens: Vec<Token>,
    /// How long a client may take to send a request's header, counted from
    /// the connection (or the end of its previous answer): also how long a
    /// kept-alive connection may sit idle (`header-timeout`).
    pub header_timeout: Duration,
    /// How long a client may take to send a request's body (`body-timeout`).
    pub body_timeout: Duration,
    /// Connections open at once; at the cap, the one idle longest is closed
    /// for a new one (`max-connections`).
    pub max_connections: usize,
}

impl Api {
    pub const DEFAULT_LISTEN: std::net::SocketAddr = std::net::SocketAddr::V4(
        std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 8080),
    );
    pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(600);
    pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
    pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
    pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
}

impl Default for Api {
    fn default() -> Self {
        Api {
            listen: Self::DEFAULT_LISTEN,
            lease_ttl: Self::DEFAULT_LEASE_TTL,
            tokens: Vec::new(),
            header_timeout: Self::DEFAULT_HEADER_TIMEOUT,
            body_timeout: Self::DEFAULT_BODY_TIMEOUT,
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// What a token's holder may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Creates and reads its own requests; uses and releases its own nodes.
    /// Its requestor name is the token's name.
    Client,
    /// Everything.
    Admin,
}

/// A bearer token. The secret is never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    /// The token's name; for a client, the requestor it acts as.
    pub name: String,
    pub role: Role,
    /// The secret the client sends (`token`, `${ENV}` allowed).
    pub secret: String,
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Token")
            .field("name", &self.name)
            .field("role", &self.role)
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// Pool-wide timings, each with a named default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timings {
    /// How often each provider is listed and reconciled (`sync-interval`).
    pub sync_interval: Duration,
    /// How often a provider with booting nodes is listed (`boot-poll-interval`).
    pub boot_poll_interval: Duration,
    /// How long an owned instance no node accounts for is left alone before it
    /// is deleted as leaked (`leak-grace`).
    pub leak_grace: Duration,
    /// How long after a delete an instance still listed is deleted again
    /// (`delete-retry`).
    pub delete_retry: Duration,
    /// How long a node's instance must stay missing from complete lists (two
    /// at least) before berth believes it is gone (`missing-confirm`).
    pub missing_confirm: Duration,
    /// How long creates stay paused after quota-exceeded if no instance goes
    /// away first (`quota-pause`).
    pub quota_pause: Duration,
    /// How long an instance type stays paused on a provider after a capacity
    /// error (`capacity-pause`).
    pub capacity_pause: Duration,
    /// How long a failed or cancelled request, or a gone node, is kept for
    /// clients to read before it is forgotten (`history`).
    pub history: Duration,
}

impl Timings {
    pub const DEFAULT_SYNC_INTERVAL: Duration = Duration::from_secs(60);
    pub const DEFAULT_BOOT_POLL_INTERVAL: Duration = Duration::from_secs(5);
    pub const DEFAULT_LEAK_GRACE: Duration = Duration::from_secs(120);
    pub const DEFAULT_DELETE_RETRY: Duration = Duration::from_secs(60);
    pub const DEFAULT_MISSING_CONFIRM: Duration = Duration::from_secs(60);
    pub const DEFAULT_QUOTA_PAUSE: Duration = Duration::from_secs(60);
    pub const DEFAULT_CAPACITY_PAUSE: Duration = Duration::from_secs(300);
    pub const DEFAULT_HISTORY: Duration = Duration::from_secs(3600);
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            sync_interval: Self::DEFAULT_SYNC_INTERVAL,
            boot_poll_interval: Self::DEFAULT_BOOT_POLL_INTERVAL,
            leak_grace: Self::DEFAULT_LEAK_GRACE,
            delete_retry: Self::DEFAULT_DELETE_RETRY,
            missing_confirm: Self::DEFAULT_MISSING_CONFIRM,
            quota_pause: Self::DEFAULT_QUOTA_PAUSE,
            capacity_pause: Self::DEFAULT_CAPACITY_PAUSE,
            history: Self::DEFAULT_HISTORY,
        }
    }
}

/// A provider: a driver file, its config, and the limits berth keeps it in.
#[derive(Clone)]
pub struct Provider {
    pub name: String,
    /// The driver file, resolved against the plugins directory.
    pub driver: PathBuf,
    /// The driver config as JSON text, `${ENV}` already substituted. May hold
    /// secrets: never log it.
    pub driver_config: String,
    /// Hosts the driver may reach.
    pub allowed_hosts: Vec<AllowedHost>,
    /// Credentials the host adds to the driver's requests (`credentials`);
    /// the driver never sees them.
    pub credentials: Vec<Credential>,
    /// Sandbox limits; `max_instances` is the provider's max concurrent calls.
    pub sandbox: SandboxLimits,
    /// Host-side call rate limit in calls per second (`rate`); `None` is none.
    pub rate: Option<f64>,
    /// Burst size of the rate limiter (`burst`, default: one second's worth).
    pub burst: u32,
    /// Lower is preferred when several providers serve a label (`priority`).
    pub priority: i32,
    /// What berth may have on this provider at once.
    pub limits: ProviderLimits,
}

impl fmt::Debug for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Provider")
            .field("name", &self.name)
            .field("driver", &self.driver)
            .field("driver_config", &"<redacted>")
            .field("allowed_hosts", &self.allowed_hosts)
            .field("credentials", &self.credentials)
            .field("sandbox", &self.sandbox)
            .field("rate", &self.rate)
            .field("burst", &self.burst)
            .field("priority", &self.priority)
            .field("limits", &self.limits)
            .finish()
    }
}

/// Per-provider limits; `None` is unlimited. Creating, booting and deleting
/// nodes count, so concurrent launches never overshoot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProviderLimits {
    pub max_instances: Option<u32>,
    pub max_cores: Option<u32>,
    pub max_ram_mib: Option<u64>,
}

/// A label: what clients ask for.
#[derive(Clone, Debug, PartialEq)]
pub struct Label {
    pub name: String,
    /// Ready nodes kept waiting (`min-ready`).
    pub min_ready: u32,
    /// A ready node older than this is recycled (`max-ready-age`).
    pub max_ready_age: Option<Duration>,
    /// A node not running this long after its create is deleted and
    /// relaunched (`boot-timeout`).
    pub boot_timeout: Duration,
    /// Failed launches tried again before a request fails (`launch-retries`).
    pub launch_retries: u32,
    /// A ready node beyond `min-ready` idle this long is deleted
    /// (`idle-timeout`); `None` keeps it until it is used or too old.
    pub idle_timeout: Option<Duration>,
    /// A node a client returns goes back to ready instead of being deleted
    /// (`reuse`, default false: single use).
    pub reuse: bool,
    /// Machines or slots.
    pub kind: LabelKind,
}

impl Label {
    pub const DEFAULT_BOOT_TIMEOUT: Duration = Duration::from_secs(600);
    pub const DEFAULT_LAUNCH_RETRIES: u32 = 3;
    pub const DEFAULT_GRACE_TIME: Duration = Duration::from_secs(60);

    /// A label with every setting at its default (no ready nodes kept, no
    /// ageing, single use).
    pub fn new(name: &str, kind: LabelKind) -> Label {
        Label {
            name: name.into(),
            min_ready: 0,
            max_ready_age: None,
            boot_timeout: Label::DEFAULT_BOOT_TIMEOUT,
            launch_retries: Label::DEFAULT_LAUNCH_RETRIES,
            idle_timeout: None,
            reuse: false,
            kind,
        }
    }
}

/// What a label's nodes are.
#[derive(Clone, Debug, PartialEq)]
pub enum LabelKind {
    /// Each node is one cloud instance from one of these offers.
    Machine { offers: Vec<Offer> },
    /// Up to `slots` nodes share one instance of the backing label.
    Slots {
        slots: u16,
        backing: LabelIx,
        /// A backing instance with every slot free this long is deleted.
        grace_time: Duration,
    },
}

/// How one provider serves a machine label.
#[derive(Clone, Debug, PartialEq)]
pub struct Offer {
    pub provider: ProviderIx,
    pub instance_type: String,
    pub image: String,
    /// Driver-specific label options, JSON text.
    pub options: String,
    pub vcpus: u32,
    pub ram_mib: u64,
    /// Hourly price, in whatever currency the operator uses.
    pub price: f64,
}

impl Config {
    /// Finds a provider by name.
    pub fn provider(&self, name: &str) -> Option<ProviderIx> {
        self.providers
            .iter()
            .position(|p| p.name == name)
            .map(|i| ProviderIx(i as u16))
    }

    /// Finds a label by name.
    pub fn label(&self, name: &str) -> Option<LabelIx> {
        self.labels
            .iter()
            .position(|l| l.name == name)
            .map(|i| LabelIx(i as u16))
    }
}

impl std::ops::Index<ProviderIx> for Config {
    type Output = Provider;
    fn index(&self, ix: ProviderIx) -> &Provider {
        &self.providers[ix.0 as usize]
    }
}

impl std::ops::Index<LabelIx> for Config {
    type Output = Label;
    fn index(&self, ix: LabelIx) -> &Label {
        &self.labels[ix.0 as usize]
    }
}
