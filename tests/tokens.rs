//! Credentials exchanged for tokens, through the `berth serve` binary: the
//! sim driver (which holds no secret) calls the sim cloud through a
//! [`Guard`] that wants a live token from the [`TokenServer`], and the host
//! makes the exchanges, refreshes, rotations and replays.

use std::time::Duration;

use serde_json::Value;

use crate::support::config::{OPS, serve_config_for};
use crate::support::server::{Berth, Launch, http, http_raw, until};
use crate::support::tokens::{
    GOOGLE_CLIENT_EMAIL, Guard, TokenConfig, TokenServer, google_key_json, key_path, key_pem,
};
use crate::support::{SimServer, metric, plugin};

const USER: &str = "berth-ci";
const PASSWORD: &str = "first-pa55word/with+signs=";
const ROTATED: &str = "second-pa55word%after&rotation";
const CLIENT: &str = "berth-client";
const CLIENT_SECRET: &str = "client-secret-0f6b2c9d1e";
const APP_CREDENTIAL: &str = "21dced0fd20347869b93710d2b98aae0";
const APP_SECRET: &str = "app-credential-secret-7d1f";

/// A sim cloud behind a guard that wants the token server's tokens.
struct Cloud {
    /// Held for as long as the test runs.
    _sim: SimServer,
    tokens: TokenServer,
    guard: Guard,
    dir: tempfile::TempDir,
}

impl Cloud {
    async fn start(lifetime: Duration) -> Cloud {
        let sim = SimServer::start().await;
        let tokens = TokenServer::start(TokenConfig {
            lifetime,
            passwords: vec![(USER.into(), PASSWORD.into())],
            app_credentials: vec![(APP_CREDENTIAL.into(), APP_SECRET.into())],
            client_secrets: vec![(CLIENT.into(), CLIENT_SECRET.into())],
            client_public_keys: vec![(CLIENT.into(), key_pem("service-account.pub.pem"))],
            google_public_keys: vec![(
                GOOGLE_CLIENT_EMAIL.into(),
                key_pem("service-account.pub.pem"),
            )],
            ..TokenConfig::default()
        })
        .await;
        let guard = Guard::start(&tokens, sim.addr()).await;
        Cloud {
            _sim: sim,
            tokens,
            guard,
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// Writes `text` to the file `name` of the test's directory.
    fn file(&self, name: &str, text: &str) -> String {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).expect("write a secret file");
        path.display().to_string()
    }

    /// `berth serve` with provider `sim` reaching the cloud through the
    /// guard, with `credential` (the keys of one
    /// `[[providers.sim.credentials]]` table, its host the guard's) and
    /// `min-ready = 2`.
    async fn berth(&self, credential: &str, env: &[(&str, &str)]) -> Berth {
        let keys = format!(
            "allow-hosts = [\"{addr}\"]\nconfig = {{ endpoint = \"{url}\" }}\n\
             [[providers.sim.credentials]]\nhost = \"{addr}\"\n{credential}",
            addr = self.guard.addr,
            url = self.guard.url(),
        );
        let config = serve_config_for(self.dir.path(), &plugin("sim"), &keys, "min-ready = 2", "");
        let cfg = config.display().to_string();
        Berth::launch(Launch {
            env,
            ..Launch::new(&["--config", &cfg], self.dir.path())
        })
        .await
    }

    fn keystone(&self, password_file: &str) -> String {
        format!(
            "kind = \"keystone\"\nauth-url = \"{}\"\nusername = \"{USER}\"\n\
             password-file = \"{password_file}\"\nproject-name = \"ci\"",
            self.tokens.keystone_url()
        )
    }
}

/// The provider `sim` in `/v1/providers`.
async fn provider(server: &Berth) -> Value {
    let (_, all) = server.call("GET", "/v1/providers", Some(OPS), None).await;
    all.as_array()
        .and_then(|a| a.iter().find(|p| p["name"] == "sim").cloned())
        .unwrap_or_else(|| panic!("no provider sim in {all}"))
}

/// Hands out and releases one node `rounds` times, until the token server
/// has issued at least `exchanges` tokens; the rounds made.
async fn serve_until_issued(cloud: &Cloud, server: &Berth, exchanges: u64, secs: u64) -> u32 {
    let mut rounds = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while cloud.tokens.counts().issued < exchanges {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {:?} within {secs}s",
            cloud.tokens.counts()
        );
        let request = server.request(OPS, &[("small", 1)]).await;
        let served = server.fulfilled(OPS, &request.id).await;
        for node in &served.nodes {
            let (s, r) = server
                .call(
                    "POST",
                    &format!("/v1/nodes/{}/release", node.id),
                    Some(OPS),
                    None,
                )
                .await;
            assert_eq!(s, 200, "{r}");
        }
        rounds += 1;
    }
    rounds
}

/// Every driver call of the provider so far worked.
fn no_failed_call(p: &Value) {
    let errors = p["calls"]["last_errors"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(errors.is_empty(), "{errors:#?}");
}

/// The provider's (only) credential, as `/v1/providers` shows it.
fn credential(p: &Value) -> Value {
    p["credentials"][0].clone()
}

/// A pool served through eleven Keystone tokens of 2 s each: the host
/// exchanged each one before the last expired (at 80% of its lifetime),
/// so no call met a `401` and none failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_keeps_serving_across_ten_keystone_token_expiries() {
    let cloud = Cloud::start(Duration::from_secs(2)).await;
    let password = cloud.file("os-password", &format!("{PASSWORD}\n"));
    let server = cloud.berth(&cloud.keystone(&password), &[]).await;
    server
        .until_label_ready(60, "small", 2, "two ready nodes")
        .await;
    let rounds = serve_until_issued(&cloud, &server, 11, 120).await;
    // berth counts an exchange once it has read the answer.
    let c = until(10, "berth to count the exchanges", || async {
        let c = credential(&provider(&server).await);
        (c["exchanges"].as_u64() == Some(cloud.tokens.counts().issued)).then_some(c)
    })
    .await;
    let counts = cloud.tokens.counts();
    let p = provider(&server).await;
    eprintln!(
        "keystone: {rounds} hand-outs, server {counts:?}, berth {c}, refusals {:?}",
        cloud.guard.refusals()
    );
    assert_eq!(counts.guarded_401, 0, "{:?}", cloud.guard.refusals());
    assert_eq!(counts.refused, 0);
    assert!(counts.guarded_ok > 20, "{counts:?}");
    assert_eq!(c["state"], "ok", "{c}");
    assert_eq!(c["kind"], "keystone");
    assert!(c["exchanges"].as_u64() >= Some(11), "{c}");
    assert_eq!(c["refreshed_on_401"], 0, "{c}");
    assert_eq!(c["replays"], 0, "{c}");
    assert_eq!(p["status"], "ok", "{p}");
    no_failed_call(&p);
    let body = cloud
        .tokens
        .last_keystone_body()
        .expect("a keystone request");
    assert_eq!(body["auth"]["identity"]["methods"][0], "password");
    assert_eq!(body["auth"]["scope"]["project"]["name"], "ci");
    // No token and no password in the log, the API or the metrics.
    let (_, nodes) = server.call("GET", "/v1/nodes", Some(OPS), None).await;
    let (_, drivers) = server.call("GET", "/v1/drivers", Some(OPS), None).await;
    let shown = format!(
        "{}\n{p}\n{nodes}\n{drivers}\n{}",
        server.log_text(),
        server.metrics(Some(OPS)).await
    );
    for secret in cloud
        .tokens
        .issued_tokens()
        .iter()
        .map(String::as_str)
        .chain([PASSWORD])
    {
        assert!(!shown.contains(secret), "{secret} shown");
    }
    server.terminate().await.assert_success();
}

/// A token the cloud revokes before its time: the first request that
/// meets the `401` makes the host exchange again and send it once more,
/// and the driver never sees the `401`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_is_exchanged_again_and_the_request_sent_once_more() {
    let cloud = Cloud::start(Duration::from_secs(3600)).await;
    let password = cloud.file("os-password", PASSWORD);
    let server = cloud.berth(&cloud.keystone(&password), &[]).await;
    server
        .until_label_ready(60, "small", 2, "two ready nodes")
        .await;
    // A token lives an hour here: one exchange so far.
    assert_eq!(cloud.tokens.counts().issued, 1);
    // Old enough to be renewed on a 401 (a token under a second old is not).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    cloud.guard.revoke_all();
    let request = server.request(OPS, &[("small", 2)]).await;
    server.fulfilled(OPS, &request.id).await;
    let c = until(30, "a replay after the 401", || async {
        let c = credential(&provider(&server).await);
        (c["replays"].as_u64() >= Some(1)).then_some(c)
    })
    .await;
    let counts = cloud.tokens.counts();
    eprintln!("revoked: server {counts:?}, berth {c}");
    assert_eq!(counts.issued, 2, "{counts:?}");
    assert_eq!(c["refreshed_on_401"], 1, "{c}");
    assert!(counts.guarded_401 >= 1, "{counts:?}");
    no_failed_call(&provider(&server).await);
    server.terminate().await.assert_success();
}

/// The password file is rotated while berth runs: the next exchange reads
/// the new one, and the token server, which no longer takes the old one,
/// issues tokens to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_password_file_is_used_by_the_next_exchange() {
    let cloud = Cloud::start(Duration::from_secs(2)).await;
    let password = cloud.file("os-password", PASSWORD);
    let server = cloud.berth(&cloud.keystone(&password), &[]).await;
    server
        .until_label_ready(60, "small", 2, "two ready nodes")
        .await;
    serve_until_issued(&cloud, &server, 2, 60).await;
    // Rotated as an operator would: the file first, then the identity
    // service. An exchange in between is refused once, and berth goes on
    // with the token it has.
    cloud.file("os-password", ROTATED);
    cloud.tokens.set_password(USER, ROTATED);
    let before = cloud.tokens.counts();
    serve_until_issued(&cloud, &server, before.issued + 3, 60).await;
    // The old password is refused now.
    let (status, body) = http(
        &cloud.tokens.url(),
        "POST",
        "/v3/auth/tokens",
        None,
        Some(serde_json::json!({"auth": {"identity": {"methods": ["password"],
            "password": {"user": {"name": USER, "domain": {"name": "Default"}, "password": PASSWORD}}}}})),
    )
    .await
    .expect("the token server answers");
    assert_eq!(status, 401, "{body}");
    let p = provider(&server).await;
    let counts = cloud.tokens.counts();
    eprintln!("rotated: server {counts:?}, berth {}", credential(&p));
    assert_eq!(counts.guarded_401, 0, "{:?}", cloud.guard.refusals());
    assert_eq!(credential(&p)["state"], "ok");
    no_failed_call(&p);
    let log = server.log_text();
    assert!(!log.contains(PASSWORD) && !log.contains(ROTATED));
    server.terminate().await.assert_success();
}

/// A `bearer` token read from a file, replaced and re-read on `SIGHUP`:
/// the old one is revoked, and the pool goes on with the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_rereads_a_token_file() {
    let cloud = Cloud::start(Duration::from_secs(3600)).await;
    let token = |cloud: &Cloud| {
        let url = cloud.tokens.url();
        async move {
            let form = format!(
                "grant_type=client_credentials&client_id={CLIENT}&client_secret={CLIENT_SECRET}"
            );
            let request = format!(
                "POST /oauth2/token HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
                 Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{form}",
                form.len()
            );
            let (s, body) = http_raw(&url, request.as_bytes())
                .await
                .expect("the token server answers");
            assert_eq!(s, 200, "{body}");
            let v: Value = serde_json::from_str(&body).expect("JSON");
            v["access_token"].as_str().expect("a token").to_owned()
        }
    };
    let first = token(&cloud).await;
    let file = cloud.file("bearer", &first);
    let server = cloud
        .berth(&format!("kind = \"bearer\"\ntoken-file = \"{file}\""), &[])
        .await;
    server
        .until_label_ready(60, "small", 2, "two ready nodes")
        .await;
    cloud.guard.revoke_all();
    let second = token(&cloud).await;
    cloud.file("bearer", &second);
    server.signal(libc::SIGHUP);
    let request = server.request(OPS, &[("small", 1)]).await;
    server.fulfilled(OPS, &request.id).await;
    let c = credential(&provider(&server).await);
    eprintln!("sighup: berth {c}, refusals {:?}", cloud.guard.refusals());
    assert_eq!(c["kind"], "bearer");
    assert_eq!(c["exchanges"], 2, "read at start and after SIGHUP: {c}");
    server.terminate().await.assert_success();
}

/// The other kinds serve a pool across token expiries the same way: a
/// Keystone application credential, an OAuth2 client with a secret (in the
/// body and as HTTP Basic) or a private-key JWT, and a Google
/// service-account key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_other_exchanged_kinds_serve_across_expiries() {
    let cloud = Cloud::start(Duration::from_secs(2)).await;
    let secret = cloud.file("client-secret", CLIENT_SECRET);
    let key = google_key_json(
        &cloud.tokens.google_token_url(),
        &key_path("service-account.pem"),
    );
    let key = cloud.file("gce.json", &key);
    let private = key_path("service-account.pem").display().to_string();
    let url = cloud.tokens.oauth2_token_url();
    let kinds = [
        (
            "keystone application credential",
            format!(
                "kind = \"keystone\"\nauth-url = \"{}\"\napplication-credential-id = \"{APP_CREDENTIAL}\"\n\
                 application-credential-secret = \"${{BERTH_TEST_APP_SECRET}}\"",
                cloud.tokens.keystone_url()
            ),
        ),
        (
            "oauth2 secret",
            format!(
                "kind = \"oauth2-client-credentials\"\ntoken-url = \"{url}\"\nclient-id = \"{CLIENT}\"\n\
                 client-secret-file = \"{secret}\"\nscope = \"https://management.azure.com/.default\""
            ),
        ),
        (
            "oauth2 basic",
            format!(
                "kind = \"oauth2-client-credentials\"\ntoken-url = \"{url}\"\nclient-id = \"{CLIENT}\"\n\
                 client-secret = \"${{BERTH_TEST_CLIENT_SECRET}}\"\nclient-auth = \"basic\""
            ),
        ),
        (
            "oauth2 private key",
            format!(
                "kind = \"oauth2-client-credentials\"\ntoken-url = \"{url}\"\nclient-id = \"{CLIENT}\"\n\
                 private-key-file = \"{private}\"\nresource = \"https://management.core.windows.net/\""
            ),
        ),
        (
            "google",
            format!("kind = \"google-service-account\"\nkey-file = \"{key}\""),
        ),
    ];
    for (what, table) in kinds {
        let start = cloud.tokens.counts();
        let server = cloud
            .berth(
                &table,
                &[
                    ("BERTH_TEST_CLIENT_SECRET", CLIENT_SECRET),
                    ("BERTH_TEST_APP_SECRET", APP_SECRET),
                ],
            )
            .await;
        server
            .until_label_ready(60, "small", 2, "two ready nodes")
            .await;
        let rounds = serve_until_issued(&cloud, &server, start.issued + 4, 90).await;
        let p = until(10, "berth to count the exchanges", || async {
            let p = provider(&server).await;
            (credential(&p)["exchanges"].as_u64()
                == Some(cloud.tokens.counts().issued - start.issued))
            .then_some(p)
        })
        .await;
        let counts = cloud.tokens.counts();
        eprintln!(
            "{what}: {rounds} hand-outs, server {counts:?}, berth {}",
            credential(&p)
        );
        assert_eq!(
            counts.guarded_401,
            start.guarded_401,
            "{what}: {:?}",
            cloud.guard.refusals()
        );
        assert_eq!(counts.refused, start.refused, "{what}");
        assert_eq!(credential(&p)["state"], "ok", "{what}");
        no_failed_call(&p);
        let log = server.log_text();
        assert!(
            !log.contains(CLIENT_SECRET),
            "{what}: the secret in the log"
        );
        // The next berth starts on the same store, and so takes on these
        // nodes.
        server.terminate().await.assert_success();
    }
    assert!(cloud.tokens.last_scope().is_some());
    assert_eq!(
        cloud.tokens.last_resource().as_deref(),
        Some("https://management.core.windows.net/")
    );
}

/// A credential whose exchange fails shows on the provider, in `/readyz`
/// and in a metric, with the token endpoint's own words, and never the
/// secret, even when the endpoint quotes it back; once the endpoint takes
/// it again, the provider is well again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_exchange_shows_with_the_endpoints_words_and_never_the_secret() {
    let cloud = Cloud::start(Duration::from_secs(3600)).await;
    let body = serde_json::json!({"error": {"code": 401, "title": "Unauthorized",
        "message": format!("The password {PASSWORD} of user {USER} is not the one we have.")}});
    cloud.tokens.set_fail(Some((401, body.to_string())));
    let password = cloud.file("os-password", PASSWORD);
    let server = cloud.berth(&cloud.keystone(&password), &[]).await;
    let c = until(60, "the credential to fail", || async {
        let c = credential(&provider(&server).await);
        (c["state"] == "failing").then_some(c)
    })
    .await;
    let p = provider(&server).await;
    let (ready, why) = server.call("GET", "/readyz", None, None).await;
    let metrics = server.metrics(Some(OPS)).await;
    eprintln!("failing: {c}\nreadyz {ready}: {why}");
    let error = c["error"].as_str().unwrap_or_default();
    assert!(error.contains("answered 401"), "{error}");
    assert!(error.contains("is not the one we have"), "{error}");
    assert_eq!(p["status"], "credential-failing", "{p}");
    assert_eq!(ready, 503);
    assert!(why.to_string().contains("keystone credential"), "{why}");
    let series = format!(
        "berth_credential_exchanges_total{{provider=\"sim\",host=\"{}\",outcome=\"failed\"}}",
        cloud.guard.addr
    );
    assert!(metric(&metrics, &series) >= Some(1.0), "{metrics}");
    for (what, text) in [
        ("the provider", p.to_string()),
        ("readyz", why.to_string()),
        ("the metrics", metrics.clone()),
        ("the log", server.log_text()),
    ] {
        assert!(
            !text.contains(PASSWORD),
            "{what} shows the password:\n{text}"
        );
    }
    // The endpoint takes the password again: the next try (after a backoff)
    // works, and the pool fills.
    cloud.tokens.set_fail(None);
    server
        .until_label_ready(60, "small", 2, "two ready nodes")
        .await;
    let c = credential(&provider(&server).await);
    assert_eq!(c["state"], "ok", "{c}");
    server.until_ready(30, "ready again").await;
    server.terminate().await.assert_success();
}

/// A host that wants a client certificate (rustls, the test CA's): berth's
/// calls present the credential's, and the pool fills through it. A
/// certificate of another CA is refused in the handshake, and the
/// provider's lists say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_presented_to_a_host_that_requires_one() {
    use crate::support::mtls::{TlsFront, tls_file};
    let sim = SimServer::start().await;
    let front = TlsFront::start(sim.addr()).await;
    let file = |name: &str| tls_file(name).display().to_string();
    for (who, cert, key) in [
        ("berth-client", "client.crt", "client.key"),
        ("stranger", "stranger.crt", "stranger.key"),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let keys = format!(
            "allow-hosts = [\"{addr}\"]\nconfig = {{ endpoint = \"{url}\" }}\n\
             [[providers.sim.credentials]]\nhost = \"{addr}\"\nkind = \"client-certificate\"\n\
             cert-file = \"{cert}\"\nkey-file = \"{key}\"\nca-file = \"{ca}\"",
            addr = front.addr,
            url = front.url(),
            cert = file(cert),
            key = file(key),
            ca = file("ca.crt"),
        );
        let config = serve_config_for(dir.path(), &plugin("sim"), &keys, "min-ready = 2", "");
        let cfg = config.display().to_string();
        let server = Berth::start(&["--config", &cfg], dir.path()).await;
        if who == "berth-client" {
            server
                .until_label_ready(60, "small", 2, "two ready nodes")
                .await;
            let p = provider(&server).await;
            no_failed_call(&p);
            assert_eq!(credential(&p)["kind"], "client-certificate");
            assert_eq!(credential(&p)["state"], "ok");
            assert!(
                front.seen().iter().all(|s| s.starts_with("ok")),
                "{:?}",
                front.seen()
            );
        } else {
            let error = until(60, "the stranger's lists to fail", || async {
                provider(&server).await["list_error"]
                    .as_str()
                    .map(str::to_owned)
            })
            .await;
            eprintln!("stranger: {error}\nfront: {:?}", front.seen());
            assert!(front.seen().iter().any(|s| s.starts_with("refused")));
        }
        // The key is never shown.
        let key_text = std::fs::read_to_string(tls_file(key)).expect("the key");
        let line = key_text.lines().nth(1).expect("a PEM line");
        assert!(!server.log_text().contains(line));
        server.terminate().await.assert_success();
    }
}

/// `berth driver test` takes the same credential kinds as `berth.toml`
/// (a password file named relative to provider.json), and expands
/// `${ENV}` in provider.json's `config` as `berth.toml` does: every step of
/// the kit passes against the guarded sim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kit_takes_an_exchanged_credential_and_expands_the_environment() {
    use std::ffi::OsStr;
    let cloud = Cloud::start(Duration::from_secs(2)).await;
    cloud.file("os-password", PASSWORD);
    let provider_json = cloud.dir.path().join("provider.json");
    let json = serde_json::json!({
        "config": { "endpoint": "${BERTH_TEST_ENDPOINT}", "page_size": 2 },
        "allow_hosts": [cloud.guard.addr.to_string()],
        "credentials": [{
            "host": cloud.guard.addr.to_string(),
            "kind": "keystone",
            "auth-url": cloud.tokens.keystone_url(),
            "username": USER,
            "password-file": "os-password",
            "project-name": "ci",
        }],
    });
    std::fs::write(&provider_json, json.to_string()).expect("provider.json");
    let wasm = plugin("sim");
    let cache = cloud.dir.path().join("cache");
    let endpoint = cloud.guard.url();
    let ran = crate::support::server::run_berth(
        [
            OsStr::new("driver"),
            "test".as_ref(),
            wasm.as_ref(),
            "--config".as_ref(),
            provider_json.as_ref(),
        ],
        &[
            ("BERTH_CACHE_DIR", cache.as_ref()),
            ("BERTH_TEST_ENDPOINT", OsStr::new(&endpoint)),
        ],
    )
    .await;
    let counts = cloud.tokens.counts();
    eprintln!("kit: server {counts:?}\n{ran}");
    assert!(ran.success(), "{ran}");
    for step in crate::support::KIT_STEPS {
        assert!(
            ran.stdout.contains(&format!("PASS  {step}")),
            "{step}: {ran}"
        );
    }
    assert!(ran.stdout.contains("PASS  paging"), "{ran}");
    assert!(counts.issued >= 1 && counts.guarded_ok > 0, "{counts:?}");
    assert_eq!(counts.guarded_401, 0, "{:?}", cloud.guard.refusals());
    assert!(!ran.stdout.contains(PASSWORD) && !ran.stderr.contains(PASSWORD));
}

/// A Keystone behind a private CA: with `ca-file` naming the CA, the
/// exchange trusts it and the pool fills; without, the exchange fails on
/// the certificate and the provider says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_endpoint_of_a_private_ca_is_trusted_through_ca_file() {
    use crate::support::mtls::{TlsFront, tls_file};
    let cloud = Cloud::start(Duration::from_secs(3600)).await;
    let front = TlsFront::start_with(cloud.tokens.addr, false).await;
    let password = cloud.file("os-password", PASSWORD);
    let keystone = format!(
        "kind = \"keystone\"\nauth-url = \"{}/v3\"\nusername = \"{USER}\"\n\
         password-file = \"{password}\"",
        front.url()
    );
    let ca = tls_file("ca.crt").display().to_string();
    let server = cloud
        .berth(&format!("{keystone}\nca-file = \"{ca}\""), &[])
        .await;
    server
        .until_label_ready(60, "small", 2, "two ready nodes")
        .await;
    let c = credential(&provider(&server).await);
    assert_eq!(c["state"], "ok", "{c}");
    server.terminate().await.assert_success();

    let server = cloud.berth(&keystone, &[]).await;
    let c = until(60, "the exchange to fail on the certificate", || async {
        let c = credential(&provider(&server).await);
        (c["state"] == "failing").then_some(c)
    })
    .await;
    eprintln!("without ca-file: {c}");
    assert!(
        c["error"]
            .as_str()
            .is_some_and(|e| e.contains("cannot reach")),
        "{c}"
    );
    server.terminate().await.assert_success();
}
