//! The checked settings, plain data split by who reads them: the pool
//! core's `Config`, each provider's [`DriverSettings`], the service's
//! [`ApiSettings`] and the [`StoreSettings`]. Secrets in them print redacted.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use berth_core::config::{Config, ProviderIx};

use crate::sandbox::{AllowedHost, Credential, SandboxLimits};

/// A checked config file.
#[derive(Clone, Debug)]
pub struct Settings {
    /// What the pool core decides with.
    pub pool: Config,
    /// Where the embedded store and the compiled-driver cache live.
    pub state_dir: PathBuf,
    /// Where driver files are found (a provider's `driver` is relative to it).
    pub plugins_dir: PathBuf,
    /// Each provider's driver and sandbox, in the order of `pool.providers`.
    pub drivers: Vec<DriverSettings>,
    /// The HTTP service: where it listens, tokens, limits.
    pub api: ApiSettings,
    /// The pool's store (`[store]`).
    pub store: StoreSettings,
}

/// How a provider's driver runs: the file, its config, and its sandbox.
#[derive(Clone)]
pub struct DriverSettings {
    /// The driver file, resolved against the plugins directory: for
    /// messages and as the name of a loaded driver. Opened only as
    /// `driver_name` inside `plugins_dir` ([`crate::read_driver`]).
    pub driver: PathBuf,
    /// The driver file as the config names it (`driver`): a path relative
    /// to the plugins directory, neither absolute nor holding `..`.
    pub driver_name: PathBuf,
    /// The plugins directory the driver file is inside.
    pub plugins_dir: PathBuf,
    /// The sha256 the driver file must have (`driver-sha256`, lowercase
    /// hex): a file with other bytes is refused, never run.
    pub driver_sha256: Option<String>,
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
}

impl fmt::Debug for DriverSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DriverSettings")
            .field("driver", &self.driver)
            .field("driver_name", &self.driver_name)
            .field("plugins_dir", &self.plugins_dir)
            .field("driver_sha256", &self.driver_sha256)
            .field("driver_config", &"<redacted>")
            .field("allowed_hosts", &self.allowed_hosts)
            .field("credentials", &self.credentials)
            .field("sandbox", &self.sandbox)
            .finish()
    }
}

impl std::ops::Index<ProviderIx> for Settings {
    type Output = DriverSettings;
    fn index(&self, ix: ProviderIx) -> &DriverSettings {
        &self.drivers[ix.0 as usize]
    }
}

/// The pool's store (`[store]`).
#[derive(Clone, Debug, Default)]
pub struct StoreSettings {
    /// How far a commit to the embedded store is made durable before berth
    /// acts on it (`sync`).
    pub sync: StoreSync,
    /// A PostgreSQL database in place of the embedded SQLite store (`url`).
    pub postgres: Option<Postgres>,
}

/// Where the PostgreSQL store is and how berth logs in to it.
#[derive(Clone, Debug)]
pub struct Postgres {
    /// `postgres://USER@HOST:PORT/DATABASE?OPTIONS`, with no password in it.
    pub url: String,
    /// The password, if the server asks for one.
    pub password: Option<Password>,
    /// How long the pool's lease lasts unrenewed (`pool-lease-ttl`): how
    /// long after its holder dies another process takes the pool over.
    pub pool_lease_ttl: Duration,
    /// `ca-file`: the certificates (PEM) that the server's certificate must
    /// chain to when the url asks for TLS, in place of the system's roots.
    pub ca_file: Option<PathBuf>,
}

impl Postgres {
    pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);
}

/// Where the PostgreSQL password comes from: `password = "${NAME}"`, read
/// from the environment at start, or `password-file`, read at each
/// connect, so a rotated password is used from the next connection on.
pub type Password = crate::exchanged::SecretSource;

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

/// The HTTP service's settings (`[api]`; its `lease-ttl` is the pool's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiSettings {
    /// Where `berth serve` listens unless `--listen` says otherwise.
    pub listen: std::net::SocketAddr,
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
    /// The url at which the other berth processes sharing this pool reach
    /// this one's API (`advertise`); `http://` (`https://` with TLS) and
    /// the listening address when not given.
    pub advertise: Option<String>,
    /// TLS on the API (`tls-cert`, `tls-key`); `None` serves plain HTTP.
    pub tls: Option<TlsFiles>,
    /// Plain HTTP allowed on an address that is not a loopback one
    /// (`allow-plain-http`): TLS ends in front of berth.
    pub allow_plain_http: bool,
}

/// The API's certificate and key (PEM), read at start and again whenever
/// either file changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, the server's own certificate first
    /// (`tls-cert`).
    pub cert: PathBuf,
    /// Its private key: PKCS#8, PKCS#1 or SEC1 (`tls-key`).
    pub key: PathBuf,
    /// Roots that the other berth processes' certificates chain to, for the
    /// calls relayed to them, besides the system's (`tls-peer-ca`).
    pub peer_ca: Option<PathBuf>,
}

impl ApiSettings {
    pub const DEFAULT_LISTEN: std::net::SocketAddr = std::net::SocketAddr::V4(
        std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 8080),
    );
    pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
    pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
    pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
}

impl Default for ApiSettings {
    fn default() -> Self {
        ApiSettings {
            listen: Self::DEFAULT_LISTEN,
            tokens: Vec::new(),
            header_timeout: Self::DEFAULT_HEADER_TIMEOUT,
            body_timeout: Self::DEFAULT_BODY_TIMEOUT,
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
            advertise: None,
            tls: None,
            allow_plain_http: false,
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
    /// The most nodes its requestor may hold or have set aside at once
    /// (`max-nodes`), over every label.
    pub max_nodes: Option<u32>,
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Token")
            .field("name", &self.name)
            .field("role", &self.role)
            .field("secret", &"<redacted>")
            .field("max_nodes", &self.max_nodes)
            .finish()
    }
}
