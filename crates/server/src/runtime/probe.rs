//! Readiness probes, made by the host (never by a driver): whether a running
//! instance's port accepts a TCP connection (`ready = "tcp"`), or completes
//! an SSH key exchange (`ready = "ssh"`), whose host keys are kept for
//! clients to pin.
//!
//! A probe reaches only the addresses the instance's cloud reported for it,
//! through its provider's address policy ([`HttpPolicy::probe_addresses`]):
//! never a link-local or metadata address, nor berth's own API. Probes run
//! at most [`MAX_PROBES`] at once in a process, each within its label's
//! `ready-timeout`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use berth_config::{AllowedHost, Check, ProviderIx};
use berth_core::pool::ProbeTarget;
use berth_plugin::HttpPolicy;
use russh::keys::{Algorithm, EcdsaCurve, HashAlg, PublicKeyOrCertificate};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// Probes under way at once in one process, at most; more wait their turn.
pub const MAX_PROBES: usize = 64;

/// A switch for berth's own test suite, which sets it for every `berth
/// serve` it starts: with it set, a probe connects to loopback addresses
/// only, and refuses any other with an error line naming it
/// ([`OFF_HOST_REFUSED`]), so that the suite can show that nothing it runs
/// sends a packet off the machine.
pub const LOOPBACK_ONLY_ENV: &str = "BERTH_TEST_PROBES_LOOPBACK_ONLY";

/// What the log says when [`LOOPBACK_ONLY_ENV`] refuses a probe.
pub const OFF_HOST_REFUSED: &str = "probe off this host refused";

/// The host key families an SSH probe asks for, one key exchange each, as
/// `ssh-keyscan` does: a server shows one host key per exchange.
const KEY_FAMILIES: [&[Algorithm]; 3] = [
    &[Algorithm::Ed25519],
    &[
        Algorithm::Ecdsa {
            curve: EcdsaCurve::NistP256,
        },
        Algorithm::Ecdsa {
            curve: EcdsaCurve::NistP384,
        },
        Algorithm::Ecdsa {
            curve: EcdsaCurve::NistP521,
        },
    ],
    &[
        Algorithm::Rsa {
            hash: Some(HashAlg::Sha512),
        },
        Algorithm::Rsa {
            hash: Some(HashAlg::Sha256),
        },
    ],
];

/// Makes the readiness probes of every provider's instances.
pub struct Prober {
    permits: Semaphore,
    /// Per provider, in the config's order: where its probes may go. A
    /// config reload replaces one (plain lock: held only to read or swap).
    policies: std::sync::RwLock<Vec<Arc<HttpPolicy>>>,
    /// Where no probe may go, whatever a policy allows (berth's own API).
    deny: Vec<SocketAddr>,
    /// [`LOOPBACK_ONLY_ENV`] was set at start.
    loopback_only: bool,
}

impl Prober {
    /// Probes for providers whose drivers may reach `allowed` (each in the
    /// config's order), never reaching `deny` (berth's own API).
    pub fn new(providers: Vec<(String, Vec<AllowedHost>)>, deny: Vec<SocketAddr>) -> Prober {
        let policies = providers
            .into_iter()
            .map(|(name, allowed)| {
                Arc::new(HttpPolicy::new(name.into(), allowed).denying(deny.clone()))
            })
            .collect();
        Prober {
            permits: Semaphore::new(MAX_PROBES),
            policies: std::sync::RwLock::new(policies),
            deny,
            loopback_only: std::env::var_os(LOOPBACK_ONLY_ENV).is_some_and(|v| v == "1"),
        }
    }

    /// Provider `p` (named `name`) may be reached at `allowed` from now on
    /// (a config reload changed its `allow-hosts`).
    pub(super) fn allow(&self, p: usize, name: &str, allowed: Vec<AllowedHost>) {
        let policy = HttpPolicy::new(name.into(), allowed).denying(self.deny.clone());
        let mut policies = self.policies.write().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = policies.get_mut(p) {
            *at = Arc::new(policy);
        }
    }

    /// A provider added after the others (by a config reload).
    pub(super) fn add(&self, name: &str, allowed: Vec<AllowedHost>) {
        let policy = HttpPolicy::new(name.into(), allowed).denying(self.deny.clone());
        let mut policies = self.policies.write().unwrap_or_else(|e| e.into_inner());
        policies.push(Arc::new(policy));
    }

    /// Only the first `n` providers: those added after them were taken
    /// back.
    pub(super) fn truncate(&self, n: usize) {
        let mut policies = self.policies.write().unwrap_or_else(|e| e.into_inner());
        policies.truncate(n);
    }

    /// Probes an instance of provider `p`: the host keys its SSH server
    /// showed (none for `tcp`), or why it is not ready.
    pub async fn probe(&self, p: ProviderIx, target: &ProbeTarget) -> Result<Vec<String>, String> {
        let policy = {
            let policies = self.policies.read().unwrap_or_else(|e| e.into_inner());
            policies.get(p.0 as usize).cloned()
        };
        let Some(policy) = policy else {
            return Err("no such provider".into());
        };
        let _permit = self.permits.acquire().await.map_err(|e| e.to_string())?;
        let attempt = attempt(&policy, target, self.loopback_only);
        match tokio::time::timeout(target.timeout, attempt).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "no answer within the ready-timeout ({:?})",
                target.timeout
            )),
        }
    }
}

async fn attempt(
    policy: &HttpPolicy,
    target: &ProbeTarget,
    loopback_only: bool,
) -> Result<Vec<String>, String> {
    let a = &target.addresses;
    let mut hosts: Vec<&str> = [&a.private_ipv4, &a.public_ipv4, &a.ipv6]
        .into_iter()
        .filter_map(|h| h.as_deref())
        .collect();
    // A name is looked up only when the cloud reports no address: a lookup
    // that hangs must not hold up a probe that has one.
    if hosts.is_empty() {
        hosts.extend(a.hostname.as_deref());
    }
    if hosts.is_empty() {
        return Err("the cloud reports no address for the instance".into());
    }
    let mut allowed = Vec::new();
    let mut refused = Vec::new();
    for host in hosts {
        match policy.probe_addresses(host, target.port).await {
            Ok(addrs) => allowed.extend(addrs),
            Err(why) => refused.push(format!("{host}: {why}")),
        }
    }
    if allowed.is_empty() {
        return Err(format!("refused: {}", refused.join("; ")));
    }
    if loopback_only
        && let Some(off) = allowed
            .iter()
            .find(|a| !berth_config::canonical_ip(a.ip()).is_loopback())
    {
        tracing::error!(address = %off, "{OFF_HOST_REFUSED} ({LOOPBACK_ONLY_ENV} is set)");
        return Err(format!(
            "{off}: {OFF_HOST_REFUSED} ({LOOPBACK_ONLY_ENV} is set)"
        ));
    }
    let (addr, first) = connect_any(&allowed).await?;
    match target.check {
        Check::Running | Check::Tcp => Ok(Vec::new()),
        Check::Ssh => host_keys(addr, first).await,
    }
}

/// A TCP connection to the first of `addrs` that accepts one, tried at
/// once; why none did.
async fn connect_any(addrs: &[SocketAddr]) -> Result<(SocketAddr, TcpStream), String> {
    let mut tries = JoinSet::new();
    for &addr in addrs {
        tries.spawn(async move { (addr, TcpStream::connect(addr).await) });
    }
    let mut failed = Vec::new();
    while let Some(done) = tries.join_next().await {
        match done {
            Ok((addr, Ok(stream))) => return Ok((addr, stream)),
            Ok((addr, Err(e))) => failed.push(format!("{addr}: {e}")),
            Err(e) => failed.push(e.to_string()),
        }
    }
    Err(failed.join("; "))
}

/// The host keys an SSH server at `addr` shows, one key exchange for each
/// family of [`KEY_FAMILIES`] (the first on `first`, already connected),
/// at once. Ready when at least one exchange completes; a family the
/// server has no key of fails its exchange, which is no fault.
async fn host_keys(addr: SocketAddr, first: TcpStream) -> Result<Vec<String>, String> {
    let mut exchanges = JoinSet::new();
    let mut first = Some(first);
    for (i, family) in KEY_FAMILIES.iter().enumerate() {
        let stream = first.take();
        exchanges.spawn(async move {
            let stream = match stream {
                Some(s) => s,
                None => TcpStream::connect(addr).await.map_err(|e| e.to_string())?,
            };
            exchange(stream, family).await.map(|k| (i, k))
        });
    }
    let mut keys = Vec::new();
    let mut failed = Vec::new();
    while let Some(done) = exchanges.join_next().await {
        match done {
            Ok(Ok(key)) => keys.push(key),
            Ok(Err(e)) => failed.push(e),
            Err(e) => failed.push(e.to_string()),
        }
    }
    if keys.is_empty() {
        failed.dedup();
        return Err(format!("ssh to {addr}: {}", failed.join("; ")));
    }
    keys.sort();
    Ok(keys.into_iter().map(|(_, k)| k).collect())
}

/// One SSH key exchange on `stream`, offering only the host key
/// algorithms `family`: the key the server proved it holds, in OpenSSH's
/// `TYPE BASE64` form. No authentication is tried.
async fn exchange(stream: TcpStream, family: &'static [Algorithm]) -> Result<String, String> {
    let _ = stream.set_nodelay(true);
    let config = russh::client::Config {
        preferred: russh::Preferred {
            key: family.into(),
            ..Default::default()
        },
        ..Default::default()
    };
    let shown = Arc::new(Mutex::new(None));
    let handler = Keep(shown.clone());
    let session = russh::client::connect_stream(Arc::new(config), stream, handler)
        .await
        .map_err(|e| e.to_string())?;
    let _ = session
        .disconnect(russh::Disconnect::ByApplication, "", "")
        .await;
    let key = shown.lock().unwrap_or_else(|e| e.into_inner()).take();
    key.ok_or_else(|| "the server showed no host key".to_owned())
}

/// Keeps the host key a server proves it holds, and accepts it: the key
/// exchange is the probe, so any key completes it.
struct Keep(Arc<Mutex<Option<String>>>);

impl russh::client::Handler for Keep {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let text = match key {
            PublicKeyOrCertificate::PublicKey { key, .. } => key.to_openssh().ok(),
            PublicKeyOrCertificate::Certificate(cert) => cert.to_openssh().ok(),
        };
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = text;
        Ok(true)
    }
}
