//! Requests that present a client certificate (`kind =
//! "client-certificate"`): the TLS configuration read from the
//! credential's files, and the sender that uses it.
//!
//! wasi:http's own sender (`wasmtime_wasi_http::default_send_request`)
//! makes TLS with the public roots and no client certificate; a request to
//! a host with a client certificate goes through [`send`] instead, which
//! does the same over a TLS connection with the credential's certificate,
//! key and, when given, its CA in place of the public roots. The timeouts
//! are the guest's, as there.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody};

use berth_config::ClientCertificate;

use crate::exchange::Failure;

/// The most a certificate or CA file may hold.
const MAX_PEM: u64 = 1 << 20;

/// The TLS configuration of `c`, its files read now. Every secret read is
/// pushed to `secrets` (to be masked in what the driver reads back).
pub(crate) fn config(
    c: &ClientCertificate,
    secrets: &mut Vec<Vec<u8>>,
) -> Result<Arc<rustls::ClientConfig>, Failure> {
    let refused = |m: String| Failure {
        refused: true,
        message: m,
        read: Vec::new(),
    };
    let pem = |path: &std::path::Path| -> Result<Vec<u8>, Failure> {
        let shown = path.display();
        let meta =
            std::fs::metadata(path).map_err(|e| refused(format!("cannot read {shown}: {e}")))?;
        if meta.len() > MAX_PEM {
            return Err(refused(format!("{shown} is over {MAX_PEM} bytes")));
        }
        std::fs::read(path).map_err(|e| refused(format!("cannot read {shown}: {e}")))
    };
    let chain = CertificateDer::pem_slice_iter(&pem(&c.cert)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| refused(format!("cert-file {}: {e}", c.cert.display())))?;
    if chain.is_empty() {
        return Err(refused(format!(
            "cert-file {} holds no certificate",
            c.cert.display()
        )));
    }
    let key_text = c.key.read().map_err(|e| refused(format!("key: {e}")))?;
    for line in key_text.expose().lines().filter(|l| l.len() >= 16) {
        secrets.push(line.as_bytes().to_vec());
    }
    secrets.push(key_text.expose().as_bytes().to_vec());
    let key = PrivateKeyDer::from_pem_slice(key_text.expose().as_bytes())
        .map_err(|e| refused(format!("key: not a PEM private key: {e}")))?;
    let mut roots = rustls::RootCertStore::empty();
    match &c.ca {
        Some(ca) => {
            roots = ca_roots(&pem(ca)?)
                .map_err(|e| refused(format!("ca-file {}: {e}", ca.display())))?;
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| refused(format!("TLS: {e}")))?
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)
    .map_err(|e| refused(format!("the certificate and key do not go together: {e}")))?;
    Ok(Arc::new(config))
}

/// The certificates of a PEM CA file, as roots to trust; an error names
/// what is wrong (to be prefixed with the file).
pub fn ca_roots(pem: &[u8]) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        roots
            .add(cert.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    if roots.is_empty() {
        return Err("holds no certificate".into());
    }
    Ok(roots)
}

/// Sends `request` over TLS made with `tls` to `addr`, the address the
/// allow-list checked (the request's host names the server for SNI and
/// the certificate check); the answer and the future that finishes the
/// connection, as wasi:http's own sender gives them.
pub(crate) async fn send(
    mut request: http::Request<WasiBody>,
    options: RequestOptions,
    tls: Arc<rustls::ClientConfig>,
    addr: std::net::SocketAddr,
) -> Result<(http::Response<WasiBody>, crate::sandbox::Io), Error> {
    let far = Duration::from_secs(600);
    let uri = request.uri().clone();
    let host = uri.host().ok_or(Error::HttpRequestUriInvalid)?;
    if uri.scheme() != Some(&http::uri::Scheme::HTTPS) {
        return Err(Error::HttpProtocolError);
    }
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(bare.to_owned()).map_err(|_| Error::HttpRequestUriInvalid)?;
    let connect = options.connect_timeout.unwrap_or(far);
    let tcp = tokio::time::timeout(connect, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| Error::ConnectionTimeout)?
        .map_err(Error::Connect)?;
    let stream = tokio::time::timeout(
        connect,
        tokio_rustls::TlsConnector::from(tls).connect(name, tcp),
    )
    .await
    .map_err(|_| Error::ConnectionTimeout)?
    .map_err(Error::Tls)?;
    let (mut sender, conn) = tokio::time::timeout(
        connect,
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)),
    )
    .await
    .map_err(|_| Error::ConnectionTimeout)?
    .map_err(Error::from)?;
    // The head names the path only, as to an origin server.
    *request.uri_mut() = http::Uri::builder()
        .path_and_query(uri.path_and_query().map_or("/", |p| p.as_str()))
        .build()
        .map_err(|_| Error::HttpRequestUriInvalid)?;
    let conn = tokio::spawn(conn);
    let first_byte = options.first_byte_timeout.unwrap_or(far);
    let response = tokio::time::timeout(first_byte, sender.send_request(request))
        .await
        .map_err(|_| Error::ConnectionReadTimeout)?
        .map_err(Error::from)?;
    let between = options.between_bytes_timeout.unwrap_or(far);
    let response = response.map(|body| {
        body.map_err(Error::from)
            .map_frame(|f| f.map_data(|d: Bytes| d))
            .boxed_unsync()
    });
    let response = response.map(|body| {
        Paced {
            inner: body,
            between,
            timer: Box::pin(tokio::time::sleep(between)),
        }
        .boxed_unsync()
    });
    let io: crate::sandbox::Io = Box::pin(async move {
        match conn.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(Error::from(e)),
            Err(_) => Err(Error::InternalError(Some(
                "the TLS connection's task ended".into(),
            ))),
        }
    });
    Ok((response, io))
}

/// A body that fails with `ConnectionReadTimeout` when `between` passes
/// with no frame.
struct Paced {
    inner: WasiBody,
    between: Duration,
    timer: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl http_body::Body for Paced {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Error>>> {
        use std::task::Poll;
        match std::pin::Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                let next = tokio::time::Instant::now() + self.between;
                self.timer.as_mut().reset(next);
                Poll::Ready(frame)
            }
            Poll::Pending => match self.timer.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(Error::ConnectionReadTimeout))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
