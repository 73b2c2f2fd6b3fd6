//! The token servers of `support::tokens`, driven with raw HTTP: each
//! endpoint issues tokens for the right secret and refuses the wrong one
//! as its specification says, and the guard lets only live tokens through.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::SimServer;
use crate::support::server::until;
use crate::support::tokens::{
    CLIENT_ASSERTION, GOOGLE_CLIENT_EMAIL, Guard, INVALID_JWT_SIGNATURE, JWT_BEARER, TokenConfig,
    TokenServer, UNAUTHORIZED, google_key_json, key_path, key_pem, keystone_time,
};

/// An answer: its status, head and body.
struct Answer {
    status: u16,
    head: String,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// Sends one request on a connection of its own and reads the answer to
/// its end.
async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(request.as_bytes()).await.expect("write");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.expect("read");
    let text = String::from_utf8(raw).expect("UTF-8");
    let (head, body) = text.split_once("\r\n\r\n").expect("a head");
    assert!(!head.to_ascii_lowercase().contains("chunked"), "{head}");
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok());
    Answer {
        status: status.expect("a status"),
        head: head.to_owned(),
        body: body.to_owned(),
    }
}

async fn post_json(addr: SocketAddr, path: &str, body: &Value) -> Answer {
    let headers = [("Content-Type", "application/json")];
    send(addr, "POST", path, &headers, &body.to_string()).await
}

async fn post_form(
    addr: SocketAddr,
    path: &str,
    auth: Option<&str>,
    form: &[(&str, &str)],
) -> Answer {
    let body = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(form)
        .finish();
    let mut headers = vec![("Content-Type", "application/x-www-form-urlencoded")];
    if let Some(auth) = auth {
        headers.push(("Authorization", auth));
    }
    send(addr, "POST", path, &headers, &body).await
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

/// An RS256 JWT of `claims`, signed with the private key `pem`.
fn sign(pem: &str, kid: Option<&str>, claims: &Value) -> String {
    let key = EncodingKey::from_rsa_pem(pem.as_bytes()).expect("an RSA key");
    let mut header = Header::new(Algorithm::RS256);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, claims, &key).expect("signing")
}

fn password_auth(user: Value, password: &str) -> Value {
    let mut user = user;
    user["password"] = password.into();
    json!({"auth": {
        "identity": {"methods": ["password"], "password": {"user": user}},
        "scope": {"project": {"name": "berth", "domain": {"name": "Default"}}},
    }})
}

fn alice() -> Value {
    json!({"name": "alice", "domain": {"name": "Default"}})
}

#[test]
fn keystone_times_are_utc_with_microseconds() {
    let at = UNIX_EPOCH + Duration::from_micros(1_764_352_800_123_456);
    assert_eq!(keystone_time(at), "2025-11-28T18:00:00.123456Z");
    assert_eq!(keystone_time(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
    let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
    assert_eq!(keystone_time(leap), "2000-02-29T00:00:00.000000Z");
}

#[tokio::test]
async fn keystone_issues_tokens_for_passwords_and_application_credentials() {
    let server = TokenServer::start(TokenConfig::default()).await;
    server.set_password("alice", "pw-1");
    server.set_password("u-0042", "pw-id");
    server.set_app_credential("ac-1", "s-1");
    server.set_compute_url("http://compute.test/v2.1");

    let ok = post_json(
        server.addr,
        "/v3/auth/tokens",
        &password_auth(alice(), "pw-1"),
    )
    .await;
    assert_eq!(ok.status, 201, "{}", ok.body);
    let token = ok.header("x-subject-token").expect("X-Subject-Token");
    assert!(token.starts_with("gAAAA") && token.len() == 45, "{token}");
    let t = &ok.json()["token"];
    assert_eq!(t["project"]["name"], "berth");
    assert_eq!(t["project"]["id"], "p-0001");
    assert_eq!(t["user"]["name"], "alice");
    let url = &t["catalog"][0]["endpoints"][0]["url"];
    assert_eq!(url, "http://compute.test/v2.1", "{t}");
    let expires = t["expires_at"].as_str().expect("expires_at");
    assert!(expires.len() == 27 && expires.ends_with('Z'), "{expires}");
    assert!(expires > t["issued_at"].as_str().expect("issued_at"), "{t}");

    let by_id = password_auth(json!({"id": "u-0042"}), "pw-id");
    let ok = post_json(server.addr, "/v3/auth/tokens", &by_id).await;
    assert_eq!(ok.status, 201, "{}", ok.body);
    let app = json!({"auth": {"identity": {
        "methods": ["application_credential"],
        "application_credential": {"id": "ac-1", "secret": "s-1"},
    }}});
    let ok = post_json(server.addr, "/v3/auth/tokens", &app).await;
    assert_eq!(ok.status, 201, "{}", ok.body);
    assert_eq!(ok.json()["token"]["catalog"][0]["type"], "compute");
    assert_eq!(server.last_keystone_body(), Some(app));

    let wrong = post_json(
        server.addr,
        "/v3/auth/tokens",
        &password_auth(alice(), "pw-2"),
    )
    .await;
    assert_eq!(wrong.status, 401, "{}", wrong.body);
    let expected =
        json!({"error": {"code": 401, "message": UNAUTHORIZED, "title": "Unauthorized"}});
    assert_eq!(wrong.json(), expected);
    let bob = json!({"name": "bob", "domain": {"name": "Default"}});
    let unknown = post_json(server.addr, "/v3/auth/tokens", &password_auth(bob, "pw-1")).await;
    assert_eq!(unknown.status, 401, "{}", unknown.body);
    let headers = [("Content-Type", "application/json")];
    let malformed = send(
        server.addr,
        "POST",
        "/v3/auth/tokens",
        &headers,
        "{\"auth\":",
    )
    .await;
    assert_eq!(malformed.status, 400, "{}", malformed.body);
    assert_eq!(malformed.json()["error"]["code"], 400);

    let counts = server.counts();
    assert_eq!((counts.issued, counts.refused), (3, 3), "{counts:?}");
    assert_eq!(server.issued_tokens().len(), 3);
}

#[tokio::test]
async fn a_rotated_secret_refuses_the_old_one() {
    let server = TokenServer::start(TokenConfig::default()).await;
    server.set_password("alice", "old");
    let old = password_auth(alice(), "old");
    assert_eq!(
        post_json(server.addr, "/v3/auth/tokens", &old).await.status,
        201
    );
    server.set_password("alice", "new");
    assert_eq!(
        post_json(server.addr, "/v3/auth/tokens", &old).await.status,
        401
    );
    let new = password_auth(alice(), "new");
    assert_eq!(
        post_json(server.addr, "/v3/auth/tokens", &new).await.status,
        201
    );

    server.set_client_secret("c1", "old");
    let form = [("grant_type", "client_credentials"), ("client_id", "c1")];
    let with = |secret| [form[0], form[1], ("client_secret", secret)];
    assert_eq!(
        post_form(server.addr, "/oauth2/token", None, &with("old"))
            .await
            .status,
        200
    );
    server.set_client_secret("c1", "new");
    assert_eq!(
        post_form(server.addr, "/oauth2/token", None, &with("old"))
            .await
            .status,
        401
    );
    assert_eq!(
        post_form(server.addr, "/oauth2/token", None, &with("new"))
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn oauth2_client_secret_in_the_form_or_basic() {
    let server = TokenServer::start(TokenConfig::default()).await;
    server.set_client_secret("client one", "s:1");
    let form = [
        ("grant_type", "client_credentials"),
        ("client_id", "client one"),
        ("client_secret", "s:1"),
        ("scope", "compute.read compute.write"),
    ];
    let ok = post_form(server.addr, "/oauth2/token", None, &form).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(ok.header("cache-control"), Some("no-store"));
    let body = ok.json();
    assert_eq!(body["token_type"], "Bearer");
    assert_eq!(body["expires_in"], 3);
    assert_eq!(body["scope"], "compute.read compute.write");
    assert_eq!(
        body["access_token"].as_str().map(str::len),
        Some(43),
        "{body}"
    );
    assert_eq!(
        server.last_scope().as_deref(),
        Some("compute.read compute.write")
    );

    // RFC 6749 §2.3.1: id and secret form-encoded, then base64.
    let basic = base64::engine::general_purpose::STANDARD.encode("client+one:s%3A1");
    let basic = format!("Basic {basic}");
    let form = [
        ("grant_type", "client_credentials"),
        ("resource", "https://management.test/"),
    ];
    let ok = post_form(server.addr, "/oauth2/token", Some(&basic), &form).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(
        server.last_resource().as_deref(),
        Some("https://management.test/")
    );

    let bad = [
        form[0],
        ("client_id", "client one"),
        ("client_secret", "s:2"),
    ];
    let refused = post_form(server.addr, "/oauth2/token", None, &bad).await;
    assert_eq!(refused.status, 401, "{}", refused.body);
    assert_eq!(refused.json()["error"], "invalid_client");
    let password = [("grant_type", "password"), bad[1], bad[2]];
    let refused = post_form(server.addr, "/oauth2/token", None, &password).await;
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert_eq!(refused.json()["error"], "unsupported_grant_type");
    let refused = post_form(server.addr, "/oauth2/token", None, &bad[1..]).await;
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert_eq!(refused.json()["error"], "invalid_request");
    let counts = server.counts();
    assert_eq!((counts.issued, counts.refused), (2, 3), "{counts:?}");
}

#[tokio::test]
async fn oauth2_private_key_jwt_signed_with_another_key_is_refused() {
    let server = TokenServer::start(TokenConfig::default()).await;
    server.set_client_public_key("c-jwt", &key_pem("service-account.pub.pem"));
    let claims = |jti: Option<&str>| {
        let mut c = json!({
            "iss": "c-jwt",
            "sub": "c-jwt",
            "aud": server.oauth2_token_url(),
            "iat": now(),
            "exp": now() + 300,
        });
        if let Some(jti) = jti {
            c["jti"] = jti.into();
        }
        c
    };
    let exchange = |assertion: String| async move {
        let form = [
            ("grant_type", "client_credentials"),
            ("client_assertion_type", CLIENT_ASSERTION),
            ("client_assertion", assertion.as_str()),
            ("scope", "https://management.test/.default"),
        ];
        post_form(server.addr, "/oauth2/token", None, &form).await
    };
    let good = sign(&key_pem("service-account.pem"), None, &claims(Some("j-1")));
    let ok = exchange(good).await;
    assert_eq!(ok.status, 200, "{}", ok.body);

    let other = sign(&key_pem("other.pem"), None, &claims(Some("j-2")));
    let refused = exchange(other).await;
    assert_eq!(refused.status, 401, "{}", refused.body);
    assert_eq!(refused.json()["error"], "invalid_client");
    assert!(refused.body.contains("signature"), "{}", refused.body);

    let no_jti = sign(&key_pem("service-account.pem"), None, &claims(None));
    assert_eq!(exchange(no_jti).await.status, 401);
    let mut wrong_aud = claims(Some("j-3"));
    wrong_aud["aud"] = "http://elsewhere.test/token".into();
    let wrong_aud = sign(&key_pem("service-account.pem"), None, &wrong_aud);
    assert_eq!(exchange(wrong_aud).await.status, 401);
    let counts = server.counts();
    assert_eq!((counts.issued, counts.refused), (1, 3), "{counts:?}");
}

#[tokio::test]
async fn google_assertions_are_checked_with_the_service_account_key() {
    let server = TokenServer::start(TokenConfig::default()).await;
    server.set_google_public_key(GOOGLE_CLIENT_EMAIL, &key_pem("service-account.pub.pem"));
    let file = google_key_json(&server.google_token_url(), &key_path("service-account.pem"));
    let file: Value = serde_json::from_str(&file).expect("key file JSON");
    assert_eq!(file["type"], "service_account");
    let private_key = file["private_key"].as_str().expect("private_key");
    let kid = file["private_key_id"].as_str();
    let claims = |aud: &str, lifetime: u64| {
        json!({
            "iss": file["client_email"],
            "scope": "https://www.googleapis.com/auth/compute",
            "aud": aud,
            "iat": now(),
            "exp": now() + lifetime,
        })
    };
    let exchange = |assertion: String| async move {
        let form = [
            ("grant_type", JWT_BEARER),
            ("assertion", assertion.as_str()),
        ];
        post_form(server.addr, "/google/token", None, &form).await
    };
    let url = file["token_uri"].as_str().expect("token_uri");
    let ok = exchange(sign(private_key, kid, &claims(url, 3600))).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(ok.json()["token_type"], "Bearer");
    let scope = server.last_scope();
    assert_eq!(
        scope.as_deref(),
        Some("https://www.googleapis.com/auth/compute")
    );

    let other = exchange(sign(&key_pem("other.pem"), kid, &claims(url, 3600))).await;
    assert_eq!(other.status, 400, "{}", other.body);
    let expected = json!({"error": "invalid_grant", "error_description": INVALID_JWT_SIGNATURE});
    assert_eq!(other.json(), expected);
    let elsewhere = claims("https://oauth2.googleapis.com/token", 3600);
    let wrong_aud = exchange(sign(private_key, kid, &elsewhere)).await;
    assert_eq!(wrong_aud.status, 400, "{}", wrong_aud.body);
    assert_eq!(wrong_aud.json()["error"], "invalid_grant");
    let too_long = exchange(sign(private_key, kid, &claims(url, 7200))).await;
    assert_eq!(too_long.status, 400, "{}", too_long.body);
    assert_eq!(too_long.json()["error"], "invalid_grant");
}

#[tokio::test]
async fn the_guard_relays_live_tokens_and_refuses_the_rest() {
    let sim = SimServer::start().await;
    let config = TokenConfig {
        lifetime: Duration::from_millis(300),
        client_secrets: vec![("c1".into(), "s1".into())],
        ..TokenConfig::default()
    };
    let server = TokenServer::start(config).await;
    let guard = Guard::start(&server, sim.addr()).await;
    let form = [
        ("grant_type", "client_credentials"),
        ("client_id", "c1"),
        ("client_secret", "s1"),
    ];
    let issued = post_form(server.addr, "/oauth2/token", None, &form).await;
    let token = issued.json()["access_token"]
        .as_str()
        .expect("a token")
        .to_owned();
    let bearer = format!("Bearer {token}");
    let with_token = [("Authorization", bearer.as_str())];

    let listed = send(guard.addr, "GET", "/v1/instances", &with_token, "").await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    assert!(listed.json()["instances"].is_array(), "{}", listed.body);
    let missing = send(guard.addr, "GET", "/v1/instances", &[], "").await;
    assert_eq!(missing.status, 401);
    assert_eq!(missing.json()["error"]["message"], UNAUTHORIZED);
    let unknown = [("X-Auth-Token", "gAAAAnot-a-token")];
    assert_eq!(
        send(guard.addr, "GET", "/v1/instances", &unknown, "")
            .await
            .status,
        401
    );
    // The sim saw only the list let through.
    let calls = sim.cloud.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");

    until(5, "the token to expire", || async {
        let answer = send(guard.addr, "GET", "/v1/instances", &with_token, "").await;
        (answer.status == 401).then_some(())
    })
    .await;
    assert_eq!(guard.refusals(), ["missing", "unknown", "expired"]);
    let counts = server.counts();
    assert!(
        counts.guarded_ok >= 1 && counts.guarded_401 == 3,
        "{counts:?}"
    );

    // A fresh token, revoked early.
    let keystone = TokenServer::start(TokenConfig {
        lifetime: Duration::from_secs(60),
        passwords: vec![("alice".into(), "pw".into())],
        ..TokenConfig::default()
    })
    .await;
    let guard = Guard::start(&keystone, sim.addr()).await;
    let ok = post_json(
        keystone.addr,
        "/v3/auth/tokens",
        &password_auth(alice(), "pw"),
    )
    .await;
    let token = ok.header("x-subject-token").expect("a token").to_owned();
    let headers = [("X-Auth-Token", token.as_str())];
    let before = send(guard.addr, "GET", "/v1/limits", &headers, "").await;
    assert_eq!(before.status, 200, "{}", before.body);
    guard.revoke_all();
    let after = send(guard.addr, "GET", "/v1/limits", &headers, "").await;
    assert_eq!(after.status, 401, "{}", after.body);
    assert_eq!(guard.refusals(), ["unknown"]);
    assert_eq!(keystone.issued_tokens(), [token]);
}

#[tokio::test]
async fn delayed_exchanges_overlap_and_a_set_failure_is_answered() {
    let server = TokenServer::start(TokenConfig {
        client_secrets: vec![("c1".into(), "s1".into())],
        ..TokenConfig::default()
    })
    .await;
    let form = [
        ("grant_type", "client_credentials"),
        ("client_id", "c1"),
        ("client_secret", "s1"),
    ];
    server.set_delay(Duration::from_millis(300));
    let addr = server.addr;
    let all = (0..3).map(|_| {
        tokio::spawn(async move { post_form(addr, "/oauth2/token", None, &form).await.status })
    });
    let all: Vec<_> = all.collect();
    for one in all {
        assert_eq!(one.await.expect("an exchange"), 200);
    }
    assert_eq!(server.in_flight_max(), 3);

    server.set_delay(Duration::ZERO);
    let down = r#"{"error":"temporarily_unavailable"}"#;
    server.set_fail(Some((503, down.to_owned())));
    let failed = post_form(server.addr, "/oauth2/token", None, &form).await;
    assert_eq!((failed.status, failed.body.as_str()), (503, down));
    server.set_fail(None);
    assert_eq!(
        post_form(server.addr, "/oauth2/token", None, &form)
            .await
            .status,
        200
    );
    let counts = server.counts();
    assert_eq!((counts.issued, counts.refused), (4, 1), "{counts:?}");
}
