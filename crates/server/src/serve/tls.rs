//! TLS on the API (`[api] tls-cert`, `tls-key`), with rustls.
//!
//! The certificate and key are read at start, where a problem stops
//! `serve` with the file named, and read again whenever either file
//! changes: [`Certificates::watch`] looks at both files' metadata every
//! [`LOOK_EVERY`]. A new pair is served to every handshake from then on; a
//! pair that cannot be used (a half-written file, a key of another
//! certificate) is said in the log and the pair in use is kept, until the
//! files change again.
//!
//! Polling two `stat`s, not a file watcher: certificates are replaced by a
//! rename, by a symlink switched to another directory (certbot's `live/`,
//! a Kubernetes secret's `..data`), or written in place, and a `stat` that
//! follows symlinks sees every one of these at no cost.

use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use berth_config::{Problem, TlsFiles};

/// How often the files are looked at.
pub const LOOK_EVERY: Duration = Duration::from_secs(1);

/// What a file's metadata says of its contents: a new file (a rename, a
/// switched symlink) or one written to since has another.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
    #[cfg(unix)]
    inode: (u64, u64, i64, i64),
}

impl Stamp {
    fn of(path: &Path) -> Option<Stamp> {
        let m = std::fs::metadata(path).ok()?;
        Some(Stamp {
            len: m.len(),
            modified: m.modified().ok(),
            #[cfg(unix)]
            inode: {
                use std::os::unix::fs::MetadataExt;
                (m.dev(), m.ino(), m.ctime(), m.ctime_nsec())
            },
        })
    }
}

/// The certificate the API serves, and the files it comes from.
#[derive(Debug)]
pub struct Certificates {
    files: TlsFiles,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
    /// The files' stamps when last read, whether or not they could be used.
    read: RwLock<[Option<Stamp>; 2]>,
}

impl Certificates {
    /// Reads the pair from `files`; the error names the file at fault.
    pub fn load(files: &TlsFiles) -> Result<Certificates, Problem> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let read = [Stamp::of(&files.cert), Stamp::of(&files.key)];
        let key = read_pair(files, &provider)?;
        Ok(Certificates {
            files: files.clone(),
            provider,
            current: RwLock::new(Arc::new(key)),
            read: RwLock::new(read),
        })
    }

    /// The rustls config that serves these certificates: HTTP/1.1 over
    /// TLS 1.2 or 1.3.
    pub fn server_config(self: &Arc<Self>) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        let mut config = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// The sha256 of the certificate served now (its first), in hex.
    pub fn fingerprint(&self) -> String {
        fingerprint(&self.current.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Reads the files again if either changed since they were last read.
    /// `Ok(true)`: a new pair is served; `Ok(false)`: nothing changed; an
    /// error: the pair in use is kept.
    pub fn refresh(&self) -> Result<bool, Problem> {
        let now = [Stamp::of(&self.files.cert), Stamp::of(&self.files.key)];
        {
            let mut read = self.read.write().unwrap_or_else(|e| e.into_inner());
            if *read == now {
                return Ok(false);
            }
            // Noted before reading: a file written again while it is read
            // has another stamp at the next look, and is read again then.
            *read = now;
        }
        let key = read_pair(&self.files, &self.provider)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(key);
        Ok(true)
    }

    /// Looks at the files every [`LOOK_EVERY`] until dropped, and says in
    /// the log what each change came to.
    pub async fn watch(self: Arc<Self>) {
        let mut every = tokio::time::interval(LOOK_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            match self.refresh() {
                Ok(false) => {}
                Ok(true) => tracing::info!(
                    cert = %self.files.cert.display(),
                    sha256 = %self.fingerprint(),
                    "the API's TLS certificate changed on disk: new connections get the new one"
                ),
                Err(error) => tracing::error!(
                    %error,
                    sha256 = %self.fingerprint(),
                    "the API's TLS certificate or key changed on disk and cannot be used: the one \
                     in use is kept until the files change again"
                ),
            }
        }
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        )
    }
}

fn fingerprint(key: &CertifiedKey) -> String {
    use sha2::Digest as _;
    key.cert
        .first()
        .map(|c| hex::encode(sha2::Sha256::digest(c.as_ref())))
        .unwrap_or_default()
}

/// The chain and key in `files`, checked to belong together.
fn read_pair(files: &TlsFiles, provider: &CryptoProvider) -> Result<CertifiedKey, Problem> {
    let cert = files.cert.display();
    let key_file = files.key.display();
    let chain = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| Problem::at("api.tls-cert", format!("{cert}: {}", pem_error(e))))?;
    if chain.is_empty() {
        return Err(Problem::at(
            "api.tls-cert",
            format!("{cert}: no certificate (a PEM `BEGIN CERTIFICATE` block) in it"),
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| Problem::at("api.tls-key", format!("{key_file}: {}", pem_error(e))))?;
    let key = provider.key_provider.load_private_key(key).map_err(|e| {
        Problem::at(
            "api.tls-key",
            format!("{key_file}: not a key rustls can sign with: {e}"),
        )
    })?;
    let pair = CertifiedKey::new(chain, key);
    pair.keys_match().map_err(|e| {
        Problem::at(
            "api.tls-key",
            format!("{key_file} is not the key of the certificate in {cert}: {e}"),
        )
    })?;
    Ok(pair)
}

fn pem_error(e: rustls::pki_types::pem::Error) -> String {
    use rustls::pki_types::pem::Error;
    match e {
        Error::Io(e) => format!("cannot read it: {e}"),
        Error::NoItemsFound => "no PEM block of that kind in it".into(),
        other => format!("not PEM: {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/tls")
            .join(name)
    }

    fn copy(dir: &Path, from: &str, to: &str) {
        let tmp = dir.join(format!("{to}.new"));
        std::fs::copy(fixture(from), &tmp).unwrap();
        std::fs::rename(tmp, dir.join(to)).unwrap();
    }

    fn files(dir: &Path) -> TlsFiles {
        TlsFiles {
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
            peer_ca: None,
        }
    }

    #[test]
    fn a_pair_is_read_checked_and_read_again_only_when_its_files_change() {
        let dir = tempfile::tempdir().unwrap();
        copy(dir.path(), "server.crt", "cert.pem");
        copy(dir.path(), "server.key", "key.pem");
        let c = Certificates::load(&files(dir.path())).unwrap();
        let first = c.fingerprint();
        assert_eq!(c.refresh(), Ok(false));
        // The client's certificate with the server's key: refused, and the
        // server's pair kept.
        copy(dir.path(), "client.crt", "cert.pem");
        let e = c.refresh().unwrap_err();
        assert_eq!(e.path, "api.tls-key");
        assert!(
            e.message.contains("is not the key of the certificate"),
            "{e}"
        );
        assert_eq!(c.fingerprint(), first);
        // Not tried again until a file changes.
        assert_eq!(c.refresh(), Ok(false));
        copy(dir.path(), "client.key", "key.pem");
        assert_eq!(c.refresh(), Ok(true));
        assert_ne!(c.fingerprint(), first);
    }

    #[test]
    fn files_that_cannot_be_used_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let f = files(dir.path());
        let e = Certificates::load(&f).unwrap_err();
        assert_eq!(e.path, "api.tls-cert");
        assert!(e.message.contains("cannot read it"), "{e}");
        copy(dir.path(), "server.key", "cert.pem");
        let e = Certificates::load(&f).unwrap_err();
        assert!(e.message.contains("no certificate"), "{e}");
        copy(dir.path(), "server.crt", "cert.pem");
        copy(dir.path(), "server.crt", "key.pem");
        let e = Certificates::load(&f).unwrap_err();
        assert_eq!(e.path, "api.tls-key");
        assert!(e.message.contains("no PEM block"), "{e}");
    }
}
