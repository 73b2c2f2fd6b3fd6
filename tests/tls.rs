//! TLS on the API, through the binary: `berth serve` with `[api] tls-cert`
//! and `tls-key` signed by a private CA the test makes, the CLI trusting it
//! with `--ca`, a certificate replaced on disk served without a restart,
//! one that cannot be used kept out, a listen address beyond this host
//! refused without TLS, and a fleet on PostgreSQL relaying over TLS.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{CertificateParams, Issuer, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

use crate::support::config::{CI, OPS, database, edit_config, serve_config_with};
use crate::support::server::{Berth, Launch, run_berth, until};
use crate::support::{SimServer, plugin};

/// A private CA, and certificates for 127.0.0.1 it signs.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    /// The CA's certificate, PEM.
    pem: String,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A server certificate for 127.0.0.1 named `name`: (certificate PEM,
    /// key PEM, certificate DER).
    fn server(&self, name: &str) -> (String, String, Vec<u8>) {
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem(), cert.der().to_vec())
    }
}

/// Writes `text` to `path` as a replacement does: a new file renamed over.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(tmp, path).unwrap();
}

/// A TLS connection to `addr`, with a client that trusts `ca` only.
async fn connect(
    addr: &str,
    ca: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::try_from("127.0.0.1").unwrap();
    connector.connect(name, tcp).await
}

/// The certificate the server at `addr` presents in a handshake, read with
/// a client that trusts `ca` only.
async fn presented(addr: &str, ca: &str) -> std::io::Result<Vec<u8>> {
    let stream = connect(addr, ca).await?;
    let (_, session) = stream.get_ref();
    let chain = session.peer_certificates().expect("a certificate");
    Ok(chain[0].as_ref().to_vec())
}

/// `GET path` over TLS as the admin: the whole answer.
async fn https_get(addr: &str, ca: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = connect(addr, ca).await.expect("a TLS connection");
    let head = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {OPS}\r\n\
         Connection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    String::from_utf8_lossy(&answer).into_owned()
}

struct Setup {
    _sim: SimServer,
    dir: tempfile::TempDir,
    config: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    ca_file: PathBuf,
}

async fn setup(ca: &Ca, first: &(String, String, Vec<u8>)) -> Setup {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = serve_config_with(&sim, dir.path(), &plugin("sim"), "min-ready = 1", "");
    let (cert, key, ca_file) = (
        dir.path().join("berth.crt"),
        dir.path().join("berth.key"),
        dir.path().join("ca.pem"),
    );
    replace(&cert, &first.0);
    replace(&key, &first.1);
    std::fs::write(&ca_file, &ca.pem).unwrap();
    edit_config(
        &config,
        "[api]\n",
        "[api]\ntls-cert = \"berth.crt\"\ntls-key = \"berth.key\"\n",
    );
    Setup {
        _sim: sim,
        dir,
        config,
        cert,
        key,
        ca_file,
    }
}

/// The CLI against `berth` with `args`, trusting the CA file if `ca`.
async fn cli(berth: &Berth, ca: Option<&Path>, args: &[&str]) -> crate::support::server::Ran {
    let mut all: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    all.extend([
        "--server".into(),
        berth.base.clone(),
        "--token".into(),
        OPS.into(),
    ]);
    if let Some(ca) = ca {
        all.extend(["--ca".into(), ca.display().to_string()]);
    }
    run_berth(all, &[]).await
}

#[tokio::test]
async fn the_api_serves_tls_from_a_private_ca_and_a_replaced_certificate_without_a_restart() {
    let ca = Ca::new("berth test CA");
    let first = ca.server("berth one");
    let s = setup(&ca, &first).await;
    let cfg = s.config.display().to_string();
    let berth = Berth::start(&["--config", &cfg], s.dir.path()).await;
    assert!(
        berth.base.starts_with("https://127.0.0.1:"),
        "{}",
        berth.base
    );
    let addr = berth.base.trim_start_matches("https://").to_owned();
    let pid = berth.pid();

    // The CLI trusts the private CA with --ca, and only then. (The labels:
    // listed from the start, where nodes may not be there yet.)
    let ran = cli(&berth, Some(&s.ca_file), &["labels"]).await;
    assert!(ran.success(), "{ran}");
    assert!(ran.stdout.contains("small"), "{ran}");
    let ran = cli(&berth, None, &["labels"]).await;
    assert_eq!(ran.code(), Some(2), "{ran}");
    assert!(
        ran.stderr
            .contains("cannot reach berth at https://127.0.0.1:"),
        "{ran}"
    );
    // The typed client, too: a request handed out over TLS.
    let client = berth::client::Client::with_ca(&berth.base, Some(CI.into()), &s.ca_file).unwrap();
    let new = berth::client::types::NewRequest {
        labels: [("small".to_owned(), 1)].into(),
        ..Default::default()
    };
    let r = client
        .create_request(&new)
        .await
        .expect("a request over TLS");
    let r = client
        .request(&r.id, Some(Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(r.state, "fulfilled", "{r:?}");
    // Plain HTTP on the TLS port is no request at all, and berth stays up.
    let plain =
        crate::support::server::http(&format!("http://{addr}"), "GET", "/healthz", None, None)
            .await;
    assert!(plain.is_err(), "{plain:?}");
    assert_eq!(presented(&addr, &ca.pem).await.unwrap(), first.2);

    // Replaced on disk (the key first, then the certificate, as a renewal
    // writes them): served from the next handshake on, with no restart.
    let second = ca.server("berth two");
    replace(&s.key, &second.1);
    replace(&s.cert, &second.0);
    until(30, "the replaced certificate served", || async {
        let served = presented(&addr, &ca.pem).await.ok()?;
        (served == second.2).then_some(())
    })
    .await;
    assert_eq!(berth.pid(), pid);
    let ran = cli(&berth, Some(&s.ca_file), &["nodes"]).await;
    assert!(ran.success(), "{ran}");
    let log = berth.log_text();
    assert!(
        log.contains("the API's TLS certificate changed on disk: new connections get the new one"),
        "{log}"
    );

    // A certificate whose key is not beside it is kept out: the one in use
    // stays, and the log says why.
    let third = ca.server("berth three");
    replace(&s.cert, &third.0);
    crate::support::server::until(30, "the refusal in the log", || async {
        berth
            .log_text()
            .contains("cannot be used: the one in use is kept")
            .then_some(())
    })
    .await;
    assert_eq!(presented(&addr, &ca.pem).await.unwrap(), second.2);
    let log = berth.log_text();
    assert!(
        log.contains("is not the key of the certificate in"),
        "{log}"
    );
    // Its key, once there, completes it.
    replace(&s.key, &third.1);
    until(30, "the third certificate served", || async {
        let served = presented(&addr, &ca.pem).await.ok()?;
        (served == third.2).then_some(())
    })
    .await;
    let ran = cli(&berth, Some(&s.ca_file), &["requests"]).await;
    assert!(ran.success(), "{ran}");
    berth.terminate().await.assert_success();
}

#[tokio::test]
async fn a_listen_address_beyond_this_host_needs_tls_or_says_how_to_go_without() {
    let ca = Ca::new("berth test CA");
    let first = ca.server("berth one");
    let s = setup(&ca, &first).await;
    // Without TLS (the config has tokens): refused by `config check` and
    // by `serve`, each saying how.
    edit_config(
        &s.config,
        "tls-cert = \"berth.crt\"\ntls-key = \"berth.key\"\n",
        "",
    );
    edit_config(
        &s.config,
        "listen = \"127.0.0.1:0\"",
        "listen = \"0.0.0.0:0\"",
    );
    let cfg = s.config.display().to_string();
    let ran = run_berth(["config", "check", &cfg], &[]).await;
    assert_eq!(ran.code(), Some(1), "{ran}");
    assert!(
        ran.stdout
            .contains("api.listen: 0.0.0.0:0 is not a loopback address and the API has no TLS")
            && ran.stdout.contains("set api.tls-cert and api.tls-key")
            && ran.stdout.contains("api.allow-plain-http = true"),
        "{ran}"
    );
    refused(&["--config", &cfg], s.dir.path(), "the API has no TLS").await;
    // `--listen` is held to the same rule as the file's address.
    edit_config(
        &s.config,
        "listen = \"0.0.0.0:0\"",
        "listen = \"127.0.0.1:0\"",
    );
    let args = ["--config", &cfg, "--listen", "0.0.0.0:0"];
    refused(&args, s.dir.path(), "the API has no TLS").await;

    // Files that cannot serve TLS are named by `config check` and `serve`.
    edit_config(
        &s.config,
        "[api]\n",
        "[api]\ntls-cert = \"berth.crt\"\ntls-key = \"berth.key\"\n",
    );
    let other = ca.server("another");
    replace(&s.key, &other.1);
    let ran = run_berth(["config", "check", &cfg], &[]).await;
    assert_eq!(ran.code(), Some(1), "{ran}");
    assert!(
        ran.stdout.contains("api.tls-key: ")
            && ran.stdout.contains("is not the key of the certificate in"),
        "{ran}"
    );
    let said = "is not the key of the certificate in";
    refused(&["--config", &cfg], s.dir.path(), said).await;
}

/// `berth serve ARGS` ends without serving, its log saying `why`.
async fn refused(args: &[&str], dir: &Path, why: &str) {
    let exited = Berth::spawn(Launch::new(args, dir))
        .exit_within(Duration::from_secs(60))
        .await;
    assert_ne!(exited.status.code(), Some(0));
    let log = exited.log_text();
    assert!(log.contains(why), "{log}");
}

/// Two processes on one PostgreSQL store, each with its own certificate of
/// the private CA and `tls-peer-ca` naming it: the one standing by relays
/// the calls made to it to the holder over TLS, and offers it new requests
/// the same way; and with two providers, one held by each, the pool's
/// holder sends the other's driver calls to it over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_relays_over_tls_to_the_holder_its_peer_ca_signed() {
    let ca = Ca::new("berth fleet CA");
    let (sim, sim2) = (SimServer::start().await, SimServer::start().await);
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_, store) = database(one.path(), None);
    // A lease far longer than the test: the first holds the pool throughout.
    let store = store.replace("pool-lease-ttl = \"1s\"", "pool-lease-ttl = \"60s\"");
    std::fs::copy(one.path().join("pgpass"), two.path().join("pgpass")).unwrap();
    // A node of `small` on each provider: one instance each, two kept ready.
    let driver = plugin("sim");
    let driver = driver.file_name().unwrap().to_str().unwrap();
    let extra = format!(
        "[providers.sim.limits]\nmax-instances = 1\n\
         [providers.sim2]\ndriver = {driver:?}\nallow-hosts = [\"{}\"]\n\
         config = {{ endpoint = \"{}\" }}\n[providers.sim2.limits]\nmax-instances = 1\n\
         [labels.small.providers.sim2]\ninstance-type = \"small\"\nimage = \"img\"\n\
         vcpus = 1\nram = \"1GiB\"\nprice = 0.1\n{store}",
        sim2.addr(),
        sim2.url()
    );
    // A CA file that holds no certificate is refused by `config check` and
    // by `serve`, which reads it to reach the other processes.
    {
        let bad = tempfile::tempdir().unwrap();
        std::fs::copy(one.path().join("pgpass"), bad.path().join("pgpass")).unwrap();
        let config = serve_config_with(&sim, bad.path(), &plugin("sim"), "min-ready = 2", &extra);
        let (cert, key, _) = ca.server("bad");
        replace(&bad.path().join("berth.crt"), &cert);
        replace(&bad.path().join("berth.key"), &key);
        std::fs::write(bad.path().join("ca.pem"), "not a certificate\n").unwrap();
        edit_config(
            &config,
            "[api]\n",
            "[api]\ntls-cert = \"berth.crt\"\ntls-key = \"berth.key\"\ntls-peer-ca = \"ca.pem\"\n",
        );
        let cfg = config.display().to_string();
        let ran = run_berth(["config", "check", &cfg], &[]).await;
        assert_eq!(ran.code(), Some(1), "{ran}");
        assert!(
            ran.stdout.contains("api.tls-peer-ca: ") && ran.stdout.contains("holds no certificate"),
            "{ran}"
        );
        refused(&["--config", &cfg], bad.path(), "holds no certificate").await;
    }
    let mut servers = Vec::new();
    for (dir, name) in [(&one, "one"), (&two, "two")] {
        let config = serve_config_with(&sim, dir.path(), &plugin("sim"), "min-ready = 2", &extra);
        let (cert, key, _) = ca.server(name);
        replace(&dir.path().join("berth.crt"), &cert);
        replace(&dir.path().join("berth.key"), &key);
        std::fs::write(dir.path().join("ca.pem"), &ca.pem).unwrap();
        edit_config(
            &config,
            "[api]\n",
            "[api]\ntls-cert = \"berth.crt\"\ntls-key = \"berth.key\"\ntls-peer-ca = \"ca.pem\"\n",
        );
        let cfg = config.display().to_string();
        let berth = Berth::start(&["--config", &cfg], dir.path()).await;
        let client = berth::client::Client::with_ca(
            &berth.base,
            Some(OPS.into()),
            &dir.path().join("ca.pem"),
        )
        .unwrap();
        if servers.is_empty() {
            until(60, "the first holds the pool, two nodes ready", || async {
                let labels = client.labels().await.ok()?;
                let small = labels.iter().find(|l| l.name == "small")?;
                (small.ready == 2).then_some(())
            })
            .await;
        }
        servers.push((berth, client));
    }
    let (first, second) = (&servers[0], &servers[1]);
    // The second stands by: what it answers is the holder's, relayed.
    let mine = first.1.nodes(&Default::default()).await.unwrap();
    let relayed = second
        .1
        .nodes(&Default::default())
        .await
        .expect("relayed over TLS");
    let ids = |nodes: &[berth::client::types::Node]| -> Vec<String> {
        nodes.iter().map(|n| n.id.clone()).collect()
    };
    assert_eq!(ids(&relayed), ids(&mine));
    assert!(!mine.is_empty());
    // A request made to it is offered to the holder, over TLS too.
    let client =
        berth::client::Client::with_ca(&second.0.base, Some(CI.into()), &two.path().join("ca.pem"))
            .unwrap();
    let new = berth::client::types::NewRequest {
        labels: [("small".to_owned(), 1)].into(),
        ..Default::default()
    };
    let r = client.create_request(&new).await.unwrap();
    let r = client
        .request(&r.id, Some(Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(r.state, "fulfilled", "{r:?}");
    let log = second.0.log_text();
    assert!(!log.contains("into the store's inbox"), "{log}");
    assert!(!log.contains("UnknownIssuer"), "{log}");

    // Each process comes to hold one provider; the nodes handed out are
    // replaced on both, the second's through a driver call the pool's
    // holder sends it over TLS.
    let holders = until(60, "each process holding a provider", || async {
        let providers = first.1.providers().await.ok()?;
        let held: Vec<String> = (providers.iter())
            .map(|p| p.holder.clone().unwrap_or_default())
            .collect();
        (held
            .iter()
            .any(|h| h.starts_with(&format!("{} ", first.0.base)))
            && held
                .iter()
                .any(|h| h.starts_with(&format!("{} ", second.0.base))))
        .then_some(held)
    })
    .await;
    let taken = berth::client::types::NewRequest {
        labels: [("small".to_owned(), 2)].into(),
        ..Default::default()
    };
    let r = first.1.create_request(&taken).await.unwrap();
    let r = (first.1)
        .request(&r.id, Some(Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(r.state, "fulfilled", "{r:?}");
    for n in &r.nodes {
        first.1.release(&n.id).await.unwrap();
    }
    until(60, "a new node ready on each provider", || async {
        let nodes = first.1.nodes(&Default::default()).await.ok()?;
        let ready_on = |p: &str| {
            (nodes.iter()).any(|n| {
                n.provider == p && n.state == "ready" && !r.nodes.iter().any(|t| t.id == n.id)
            })
        };
        (ready_on("sim") && ready_on("sim2")).then_some(())
    })
    .await;
    let log = first.0.log_text();
    assert!(
        !log.contains("could not connect to https://"),
        "{holders:?}\n{log}"
    );
}

/// Clients that start a TLS handshake and never finish it, or speak plain
/// HTTP to the TLS port: at the connection cap they make room for a real
/// client, the rest are closed once `header-timeout` has passed, and each
/// is counted by why it was closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshakes_that_stall_or_are_not_tls_are_cut_and_leave_room() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const CAP: usize = 20;
    let ca = Ca::new("berth test CA");
    let first = ca.server("berth one");
    let s = setup(&ca, &first).await;
    edit_config(
        &s.config,
        "[api]\n",
        &format!("[api]\nheader-timeout = \"1s\"\nmax-connections = {CAP}\n"),
    );
    let cfg = s.config.display().to_string();
    let berth = Berth::start(&["--config", &cfg], s.dir.path()).await;
    let addr = berth.base.trim_start_matches("https://").to_owned();
    // A TLS record's head, promising a ClientHello that never comes.
    let mut stalled = Vec::new();
    for _ in 0..CAP {
        let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
        c.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00]).await.unwrap();
        stalled.push(c);
    }
    // With every place taken by a handshake that waits, a real client is
    // still served.
    let ran = cli(&berth, Some(&s.ca_file), &["labels"]).await;
    assert!(ran.success(), "{ran}");
    // Plain HTTP on the TLS port.
    let mut plain = tokio::net::TcpStream::connect(&addr).await.unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    // Every one of them is closed by berth, none later than the header
    // timeout and some slack.
    let started = std::time::Instant::now();
    for c in stalled.iter_mut().chain([&mut plain]) {
        let mut buf = [0u8; 256];
        let end = tokio::time::timeout(Duration::from_secs(15), async {
            loop {
                match c.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(end.is_ok(), "a stalled handshake still open after 15 s");
    }
    println!(
        "every stalled handshake closed within {:?}",
        started.elapsed()
    );
    let metrics = https_get(&addr, &ca.pem, "/metrics").await;
    let count = |reason: &str| {
        crate::support::metric(
            &metrics,
            &format!("berth_http_connections_closed_total{{reason=\"{reason}\"}}"),
        )
        .unwrap_or(0.0)
    };
    let (timeout, evicted, not_tls) = (
        count("tls_handshake_timeout"),
        count("evicted"),
        count("tls_handshake"),
    );
    println!("closed: {timeout} handshake timeouts, {evicted} evicted, {not_tls} not TLS");
    assert!(not_tls >= 1.0, "{metrics}");
    assert!(evicted >= 1.0, "room made at the cap: {metrics}");
    assert_eq!(timeout + evicted, CAP as f64, "{metrics}");
    berth.terminate().await.assert_success();
}
