//! How a berth process reaches the other processes of its fleet: the API
//! calls a process standing by relays to the pool's holder
//! (`api/forward.rs`), and the driver calls the holder sends to a
//! provider's holder ([`super::shards`]). Both go to the url each process
//! advertises, `http://` or, with TLS on the fleet, `https://`, trusting
//! the system's roots and `api.tls-peer-ca`.

use std::sync::Arc;
use std::time::Duration;

use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;

use berth_config::{ApiSettings, Problem};

/// How long connecting to another process may take: its host is down, and
/// its leases (or the pool) will move to another.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The connector to the other processes. Built once, at start, with the
/// leases of a shared store ([`super::shards::Shards::connector`]); the
/// relay of a process standing by uses the same.
pub type Connector = HttpsConnector<HttpConnector>;

/// The connector to the other processes, giving up connecting after
/// [`CONNECT_TIMEOUT`]; an error names the CA file that cannot be used.
pub fn connector(api: &ApiSettings) -> Result<Connector, Problem> {
    Ok(connector_with(roots(api)?))
}

/// A connector that trusts `roots` for `https://` processes.
pub fn connector_with(roots: rustls::RootCertStore) -> Connector {
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    http.set_nodelay(true);
    http.enforce_http(false);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http)
}

/// The roots a call to another process of the fleet trusts: with TLS on
/// this API (a fleet serves TLS on every process), the system's and
/// `api.tls-peer-ca`'s; without, none. An error names the file.
pub fn roots(api: &ApiSettings) -> Result<rustls::RootCertStore, Problem> {
    let Some(tls) = &api.tls else {
        return Ok(rustls::RootCertStore::empty());
    };
    let mut roots = native_roots();
    if let Some(file) = &tls.peer_ca {
        let shown = file.display();
        let problem = |message| Problem::at("api.tls-peer-ca", message);
        let pem = std::fs::read(file).map_err(|e| problem(format!("cannot read {shown}: {e}")))?;
        let ca = berth_plugin::ca_roots(&pem).map_err(|e| problem(format!("{shown}: {e}")))?;
        roots.roots.extend(ca.roots);
    }
    Ok(roots)
}

/// The system's trusted roots, those that can be read.
fn native_roots() -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(found.certs);
    roots
}
