//! A TLS front on 127.0.0.1:0 (rustls) with the test CA's server
//! certificate for 127.0.0.1 (`tests/fixtures/tls`), relaying each
//! connection byte for byte to a backend (the sim cloud, a token server).
//! It may want a client certificate: then a connection whose client
//! presents one of the test CA's is relayed, and any other is refused in
//! the handshake. Serves until dropped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};

/// `tests/fixtures/tls/NAME`.
pub fn tls_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/tls")
        .join(name)
}

pub struct TlsFront {
    pub addr: SocketAddr,
    /// What each handshake came to: the client's subject as `ok …`, or
    /// `refused: …`. Plain mutex, never held across an await.
    seen: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl TlsFront {
    /// A front that wants a client certificate of the test CA.
    pub async fn start(upstream: SocketAddr) -> TlsFront {
        Self::start_with(upstream, true).await
    }

    /// A front that wants none when `client_certificate` is false.
    pub async fn start_with(upstream: SocketAddr, client_certificate: bool) -> TlsFront {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(tls_file("ca.crt")).expect("ca.crt") {
            roots
                .add(cert.expect("a CA certificate"))
                .expect("add the CA");
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .expect("a client verifier");
        let chain = CertificateDer::pem_file_iter(tls_file("server.crt"))
            .expect("server.crt")
            .collect::<Result<Vec<_>, _>>()
            .expect("the server's chain");
        let key = PrivateKeyDer::from_pem_file(tls_file("server.key")).expect("server.key");
        let versions = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions");
        let config = if client_certificate {
            versions.with_client_cert_verifier(verifier)
        } else {
            versions.with_no_client_auth()
        }
        .with_single_cert(chain, key)
        .expect("the server's certificate");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, record) = (acceptor.clone(), record.clone());
                tokio::spawn(async move {
                    let mut tls = match acceptor.accept(tcp).await {
                        Ok(t) => t,
                        Err(e) => {
                            record.lock().unwrap().push(format!("refused: {e}"));
                            return;
                        }
                    };
                    let presented = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .map_or(0, |c| c.len());
                    record
                        .lock()
                        .unwrap()
                        .push(format!("ok: a client certificate of {presented} bytes"));
                    let Ok(mut backend) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut backend).await;
                });
            }
        });
        TlsFront { addr, seen, task }
    }

    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// What each handshake came to, in order.
    pub fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}
