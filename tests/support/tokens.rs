//! Token servers for the credential tests, on 127.0.0.1:0, written from the
//! public specifications: Keystone v3's password and application credential
//! authentication, OAuth2's client credentials grant (RFC 6749 §4.4, the
//! client authenticated by a secret or by a private-key JWT, RFC 7523), and
//! Google's JWT bearer grant for service accounts. One [`TokenServer`]
//! answers all three and keeps one record: the secrets it accepts (which a
//! test can rotate), the tokens it issued with their expiry, and what it was
//! asked. A [`Guard`] in front of a backend (the sim cloud) plays a cloud API
//! that wants those tokens. Each serves until dropped.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use http_body_util::BodyExt as _;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

/// The service account of [`google_key_json`].
pub const GOOGLE_CLIENT_EMAIL: &str = "berth@berth-test-project.iam.gserviceaccount.com";
/// The project of [`google_key_json`].
pub const GOOGLE_PROJECT_ID: &str = "berth-test-project";
/// What Keystone and the [`Guard`] answer a request without a valid token.
pub const UNAUTHORIZED: &str = "The request you have made requires authentication.";
/// Google's answer to an assertion signed with another key.
pub const INVALID_JWT_SIGNATURE: &str = "Invalid JWT Signature.";
/// The JWT bearer grant (RFC 7523 §2.1; Google's `grant_type`).
pub const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// A JWT as a client's proof (RFC 7523 §2.2's `client_assertion_type`).
pub const CLIENT_ASSERTION: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";

/// `tests/fixtures/tokens/NAME`: the throwaway keys, `service-account.pem`
/// and `other.pem` (private, PKCS#8), and their `.pub.pem`.
pub fn key_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/tokens")
        .join(name)
}

/// The text of the key file `name` (see [`key_path`]).
pub fn key_pem(name: &str) -> String {
    let path = key_path(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// A Google service-account key file (JSON), as the console hands it out,
/// for [`GOOGLE_CLIENT_EMAIL`], with the private key read from
/// `key_pem_path` and `token_uri` as its token endpoint.
pub fn google_key_json(token_uri: &str, key_pem_path: &Path) -> String {
    let pem = std::fs::read_to_string(key_pem_path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", key_pem_path.display()));
    let key = json!({
        "type": "service_account",
        "project_id": GOOGLE_PROJECT_ID,
        "private_key_id": "0123456789abcdef",
        "private_key": pem,
        "client_email": GOOGLE_CLIENT_EMAIL,
        "client_id": "100000000000000000001",
        "auth_uri": "https://accounts.google.com/o/oauth2/auth",
        "token_uri": token_uri,
        "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
        "client_x509_cert_url": "https://www.googleapis.com/robot/v1/metadata/x509/berth%40berth-test-project.iam.gserviceaccount.com",
        "universe_domain": "googleapis.com",
    });
    serde_json::to_string_pretty(&key).expect("JSON")
}

/// `at` in UTC as Keystone writes times: `2026-11-28T18:00:00.000000Z`.
pub fn keystone_time(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (y, m, d) =
        berth_test_clouds::common::civil_from_days((secs / 86_400).try_into().expect("days"));
    let s = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:06}Z",
        s / 3600,
        s % 3600 / 60,
        s % 60,
        since.subsec_micros()
    )
}

/// What a [`TokenServer`] starts with. The secrets are pairs of a name (a
/// user, an application credential id, a client id, a service account's
/// email) and what it is accepted with; the server's setters change them
/// later.
#[derive(Clone, Debug)]
pub struct TokenConfig {
    /// How long each token lives (`expires_in` says it in whole seconds,
    /// rounded down).
    pub lifetime: Duration,
    /// The compute endpoint of Keystone's catalog; `None`:
    /// `http://ADDR/compute/v2.1`, on the token server itself.
    pub compute_url: Option<String>,
    /// Keystone users (by name or id) and their passwords.
    pub passwords: Vec<(String, String)>,
    /// Keystone application credentials: id and secret.
    pub app_credentials: Vec<(String, String)>,
    /// OAuth2 clients and their secrets.
    pub client_secrets: Vec<(String, String)>,
    /// OAuth2 clients and the public keys (PEM) their assertions are
    /// checked with.
    pub client_public_keys: Vec<(String, String)>,
    /// Google service accounts (`client_email`) and their public keys (PEM).
    pub google_public_keys: Vec<(String, String)>,
}

impl Default for TokenConfig {
    /// Tokens living 3 s; no secrets.
    fn default() -> TokenConfig {
        TokenConfig {
            lifetime: Duration::from_secs(3),
            compute_url: None,
            passwords: Vec::new(),
            app_credentials: Vec::new(),
            client_secrets: Vec::new(),
            client_public_keys: Vec::new(),
            google_public_keys: Vec::new(),
        }
    }
}

/// What a [`TokenServer`] and its guards have done.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counts {
    /// Exchanges that issued a token.
    pub issued: u64,
    /// Exchanges refused, at any endpoint (`set_fail` answers included).
    pub refused: u64,
    /// Requests a guard let through to its backend.
    pub guarded_ok: u64,
    /// Requests a guard answered `401`.
    pub guarded_401: u64,
}

/// The token server: Keystone at `POST /v3/auth/tokens`, OAuth2 client
/// credentials at `POST /oauth2/token`, Google's JWT bearer grant at
/// `POST /google/token`.
pub struct TokenServer {
    pub addr: SocketAddr,
    /// Plain mutex: held to read or change the record, never across an
    /// await.
    state: Arc<Mutex<Record>>,
    task: JoinHandle<()>,
}

type Shared = Arc<Mutex<Record>>;

struct Record {
    addr: SocketAddr,
    lifetime: Duration,
    compute_url: String,
    passwords: HashMap<String, String>,
    app_credentials: HashMap<String, String>,
    client_secrets: HashMap<String, String>,
    client_keys: HashMap<String, String>,
    google_keys: HashMap<String, String>,
    /// Tokens not revoked, and when each expires.
    live: HashMap<String, Instant>,
    /// Every token issued, in order.
    issued: Vec<String>,
    counts: Counts,
    last_scope: Option<String>,
    last_resource: Option<String>,
    last_keystone_body: Option<Value>,
    delay: Duration,
    fail: Option<(u16, String)>,
    in_flight: usize,
    in_flight_max: usize,
}

impl Record {
    /// A new random token, live for the lifetime from now: for Keystone,
    /// `gAAAA` and 40 base64url characters (as its Fernet tokens start); else
    /// 43 (32 bytes).
    fn issue(&mut self, keystone: bool) -> String {
        let token = if keystone {
            format!(
                "gAAAA{}",
                URL_SAFE_NO_PAD.encode(rand::random::<[u8; 30]>())
            )
        } else {
            URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>())
        };
        self.live
            .insert(token.clone(), Instant::now() + self.lifetime);
        self.issued.push(token.clone());
        token
    }
}

impl TokenServer {
    pub async fn start(cfg: TokenConfig) -> TokenServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let pairs = |v: Vec<(String, String)>| v.into_iter().collect::<HashMap<_, _>>();
        let state = Arc::new(Mutex::new(Record {
            addr,
            lifetime: cfg.lifetime,
            compute_url: (cfg.compute_url).unwrap_or_else(|| format!("http://{addr}/compute/v2.1")),
            passwords: pairs(cfg.passwords),
            app_credentials: pairs(cfg.app_credentials),
            client_secrets: pairs(cfg.client_secrets),
            client_keys: pairs(cfg.client_public_keys),
            google_keys: pairs(cfg.google_public_keys),
            live: HashMap::new(),
            issued: Vec::new(),
            counts: Counts::default(),
            last_scope: None,
            last_resource: None,
            last_keystone_body: None,
            delay: Duration::ZERO,
            fail: None,
            in_flight: 0,
            in_flight_max: 0,
        }));
        let app = Router::new()
            .route("/v3/auth/tokens", post(keystone))
            .route("/oauth2/token", post(oauth2))
            .route("/google/token", post(google))
            .with_state(state.clone());
        TokenServer {
            addr,
            state,
            task: serve(listener, app),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A fake cloud's check of the tokens its callers carry: one this
    /// server issued, not revoked and not expired.
    pub fn token_check(&self) -> berth_test_clouds::common::TokenCheck {
        let state = self.state.clone();
        std::sync::Arc::new(move |token: &str| {
            let r = state.lock().expect("token server");
            match r.live.get(token) {
                Some(expiry) if Instant::now() < *expiry => Ok(()),
                Some(_) => Err("expired".into()),
                None => Err("unknown".into()),
            }
        })
    }

    /// Keystone's base URL, the `auth_url` of a `clouds.yaml`:
    /// `http://ADDR/v3`.
    pub fn keystone_url(&self) -> String {
        format!("http://{}/v3", self.addr)
    }

    /// The OAuth2 token endpoint, also the `aud` its client assertions must
    /// have.
    pub fn oauth2_token_url(&self) -> String {
        format!("http://{}/oauth2/token", self.addr)
    }

    /// The Google token endpoint, the `token_uri` of a key file and the
    /// `aud` its assertions must have.
    pub fn google_token_url(&self) -> String {
        format!("http://{}/google/token", self.addr)
    }

    fn with<T>(&self, f: impl FnOnce(&mut Record) -> T) -> T {
        f(&mut self.state.lock().expect("token server"))
    }

    /// Keystone accepts `user` (a name, or an id) with `password` from now
    /// on, and no longer its old password.
    pub fn set_password(&self, user: &str, password: &str) {
        self.with(|r| r.passwords.insert(user.to_owned(), password.to_owned()));
    }

    /// Keystone accepts application credential `id` with `secret` from now
    /// on, and no longer its old secret.
    pub fn set_app_credential(&self, id: &str, secret: &str) {
        self.with(|r| r.app_credentials.insert(id.to_owned(), secret.to_owned()));
    }

    /// The OAuth2 endpoint accepts `client_id` with `secret` from now on.
    pub fn set_client_secret(&self, client_id: &str, secret: &str) {
        self.with(|r| {
            r.client_secrets
                .insert(client_id.to_owned(), secret.to_owned())
        });
    }

    /// The OAuth2 endpoint checks `client_id`'s assertions with the public
    /// key `pem` from now on.
    pub fn set_client_public_key(&self, client_id: &str, pem: &str) {
        self.with(|r| r.client_keys.insert(client_id.to_owned(), pem.to_owned()));
    }

    /// The Google endpoint checks `client_email`'s assertions with the
    /// public key `pem` from now on.
    pub fn set_google_public_key(&self, client_email: &str, pem: &str) {
        self.with(|r| {
            r.google_keys
                .insert(client_email.to_owned(), pem.to_owned())
        });
    }

    /// The compute endpoint in Keystone's catalog from now on (a [`Guard`]'s
    /// URL, say, with the path the driver expects).
    pub fn set_compute_url(&self, url: &str) {
        self.with(|r| r.compute_url = url.to_owned());
    }

    /// Each exchange answers only after `delay` from now on.
    pub fn set_delay(&self, delay: Duration) {
        self.with(|r| r.delay = delay);
    }

    /// Every exchange answers `status` with `body` (JSON) from now on, or
    /// as it should again with `None`.
    pub fn set_fail(&self, fail: Option<(u16, String)>) {
        self.with(|r| r.fail = fail);
    }

    /// Every token issued so far is refused from now on, expired or not.
    pub fn revoke_all(&self) {
        self.with(|r| r.live.clear());
    }

    pub fn counts(&self) -> Counts {
        self.with(|r| r.counts)
    }

    /// Every token ever issued, oldest first.
    pub fn issued_tokens(&self) -> Vec<String> {
        self.with(|r| r.issued.clone())
    }

    /// The scope the last successful OAuth2 or Google exchange asked for.
    pub fn last_scope(&self) -> Option<String> {
        self.with(|r| r.last_scope.clone())
    }

    /// The `resource` the last successful OAuth2 exchange asked for.
    pub fn last_resource(&self) -> Option<String> {
        self.with(|r| r.last_resource.clone())
    }

    /// The body of the last request to Keystone that was JSON.
    pub fn last_keystone_body(&self) -> Option<Value> {
        self.with(|r| r.last_keystone_body.clone())
    }

    /// The most exchanges that were in flight at once.
    pub fn in_flight_max(&self) -> usize {
        self.with(|r| r.in_flight_max)
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `app` on `listener`, one task per connection; aborting the task
/// returned ends them all.
fn serve(listener: TcpListener, app: Router) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else { break };
                    let service = hyper_util::service::TowerToHyperService::new(app.clone());
                    connections.spawn(async move {
                        let io = hyper_util::rt::TokioIo::new(stream);
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(io, service)
                            .await;
                    });
                }
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
    })
}

/// An exchange's answer: `Ok` issued a token, `Err` refused (boxed, as
/// answers are large).
type Exchanged = Result<Response, Box<Response>>;

/// Counts an exchange in flight until dropped.
struct InFlight(Shared);

impl InFlight {
    fn begin(state: &Shared) -> (InFlight, Duration) {
        let mut r = state.lock().expect("token server");
        r.in_flight += 1;
        r.in_flight_max = r.in_flight_max.max(r.in_flight);
        (InFlight(state.clone()), r.delay)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Ok(mut r) = self.0.lock() {
            r.in_flight -= 1;
        }
    }
}

/// One exchange: after the delay, the failure set, or what `answer` makes
/// of it (`Ok` issued a token), counted.
async fn exchange(state: &Shared, answer: impl FnOnce(&Shared) -> Exchanged) -> Response {
    let (_in_flight, delay) = InFlight::begin(state);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let fail = state.lock().expect("token server").fail.clone();
    let result = match fail {
        Some((status, body)) => Err(Box::new(json_response(status, body))),
        None => answer(state),
    };
    let mut r = state.lock().expect("token server");
    match result {
        Ok(response) => {
            r.counts.issued += 1;
            response
        }
        Err(response) => {
            r.counts.refused += 1;
            *response
        }
    }
}

fn json_response(status: u16, body: impl Into<Body>) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, body.into()).into_response();
    (response.headers_mut()).insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

// Keystone v3: https://docs.openstack.org/api-ref/identity/v3/

async fn keystone(State(state): State<Shared>, body: Bytes) -> Response {
    exchange(&state, |s| keystone_auth(s, &body)).await
}

/// Keystone's error shape.
fn keystone_error(code: u16, title: &str, message: &str) -> Box<Response> {
    let body = json!({"error": {"code": code, "message": message, "title": title}});
    Box::new(json_response(code, body.to_string()))
}

fn unauthorized() -> Box<Response> {
    keystone_error(401, "Unauthorized", UNAUTHORIZED)
}

fn keystone_auth(state: &Shared, body: &Bytes) -> Exchanged {
    let bad = |message: &str| keystone_error(400, "Bad Request", message);
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| bad(&format!("The request body is not JSON: {e}")))?;
    state.lock().expect("token server").last_keystone_body = Some(v.clone());
    let identity = &v["auth"]["identity"];
    let methods: Vec<&str> = (identity["methods"].as_array())
        .ok_or_else(|| bad("Expecting to find methods in identity."))?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let default_domain = json!({"id": "default", "name": "Default"});
    let (user, app_credential) = match methods.as_slice() {
        ["password"] => {
            let user = &identity["password"]["user"];
            let password = (user["password"].as_str())
                .ok_or_else(|| bad("Expecting to find password in user."))?;
            let (key, id, name, domain) = if let Some(id) = user["id"].as_str() {
                (id, id.to_owned(), id, default_domain.clone())
            } else {
                let name = (user["name"].as_str())
                    .ok_or_else(|| bad("Expecting to find name or id in user."))?;
                let domain = &user["domain"];
                let domain = match (domain["id"].as_str(), domain["name"].as_str()) {
                    (None, None) => return Err(bad("Expecting to find domain in user.")),
                    (id, name) => json!({
                        "id": id.unwrap_or("default"),
                        "name": name.unwrap_or("Default"),
                    }),
                };
                (name, format!("u-{name}"), name, domain)
            };
            let known = state
                .lock()
                .expect("token server")
                .passwords
                .get(key)
                .cloned();
            if known.as_deref() != Some(password) {
                return Err(unauthorized());
            }
            (json!({"id": id, "name": name, "domain": domain}), None)
        }
        ["application_credential"] => {
            let credential = &identity["application_credential"];
            let (Some(id), Some(secret)) =
                (credential["id"].as_str(), credential["secret"].as_str())
            else {
                return Err(bad(
                    "Expecting to find id and secret in application_credential.",
                ));
            };
            let known = (state.lock().expect("token server").app_credentials)
                .get(id)
                .cloned();
            if known.as_deref() != Some(secret) {
                return Err(unauthorized());
            }
            let user = json!({"id": "u-berth-app", "name": "berth-app", "domain": default_domain});
            let credential = json!({"id": id, "name": format!("ac-{id}"), "restricted": true});
            (user, Some(credential))
        }
        _ => return Err(bad("Unsupported authentication method.")),
    };
    // Scoped to the project asked for; an application credential always
    // to its own.
    let asked = &v["auth"]["scope"]["project"];
    let project = if app_credential.is_some() {
        Some(json!({
            "id": "p-0001",
            "name": "berth-project",
            "domain": {"id": "default", "name": "Default"},
        }))
    } else if asked.is_object() {
        let id = asked["id"].as_str();
        let name = asked["name"].as_str();
        let domain = &asked["domain"];
        let domain_name = domain["name"].as_str().or(domain["id"].as_str());
        if id.is_none() && (name.is_none() || domain_name.is_none()) {
            return Err(bad("Expecting to find id, or name and domain, in project."));
        }
        Some(json!({
            "id": id.unwrap_or("p-0001"),
            "name": name.unwrap_or("berth-project"),
            "domain": {
                "id": domain["id"].as_str().unwrap_or("default"),
                "name": domain_name.unwrap_or("Default"),
            },
        }))
    } else {
        None
    };
    let mut r = state.lock().expect("token server");
    let token = r.issue(true);
    let now = SystemTime::now();
    let mut body = json!({
        "methods": methods,
        "expires_at": keystone_time(now + r.lifetime),
        "issued_at": keystone_time(now),
        "audit_ids": [URL_SAFE_NO_PAD.encode(rand::random::<[u8; 16]>())],
        "user": user,
    });
    if let Some(project) = project {
        body["project"] = project;
        body["roles"] = json!([{"id": "r1", "name": "member"}]);
        body["catalog"] = json!([{
            "type": "compute",
            "name": "nova",
            "id": "c1",
            "endpoints": [{
                "id": "e1",
                "interface": "public",
                "region": "RegionOne",
                "region_id": "RegionOne",
                "url": r.compute_url,
            }],
        }]);
    }
    if let Some(credential) = app_credential {
        body["application_credential"] = credential;
    }
    let mut response = json_response(201, json!({ "token": body }).to_string());
    let value = HeaderValue::from_str(&token).expect("token header");
    (response.headers_mut()).insert(HeaderName::from_static("x-subject-token"), value);
    Ok(response)
}

// OAuth2 client credentials: RFC 6749 §4.4, §5.1, §5.2, §2.3.1; RFC 7523.

async fn oauth2(State(state): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    exchange(&state, |s| client_credentials(s, &headers, &body)).await
}

/// RFC 6749 §5.2's error shape.
fn oauth_error(status: u16, error: &str, description: &str) -> Box<Response> {
    let body = json!({"error": error, "error_description": description});
    Box::new(json_response(status, body.to_string()))
}

/// The form parameters of `body`, if it is a form, each at most once.
fn form(headers: &HeaderMap, body: &Bytes) -> Result<HashMap<String, String>, String> {
    let content_type = (headers.get(header::CONTENT_TYPE))
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    if !essence.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
        return Err(format!(
            "The body must be application/x-www-form-urlencoded, not {content_type:?}."
        ));
    }
    let mut params = HashMap::new();
    for (k, v) in url::form_urlencoded::parse(body) {
        if params
            .insert(k.clone().into_owned(), v.into_owned())
            .is_some()
        {
            return Err(format!("The parameter {k} is repeated."));
        }
    }
    Ok(params)
}

/// The client id and secret of an `Authorization: Basic` header, each
/// form-decoded (RFC 6749 §2.3.1).
fn basic(headers: &HeaderMap) -> Option<Result<(String, String), ()>> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, credentials) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = STANDARD.decode(credentials.trim()).map_err(|_| ());
    let text = decoded.and_then(|d| String::from_utf8(d).map_err(|_| ()));
    let decode = |s: &str| -> String {
        let form = format!("x={s}");
        (url::form_urlencoded::parse(form.as_bytes()))
            .next()
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default()
    };
    Some(text.and_then(|t| {
        let (id, secret) = t.split_once(':').ok_or(())?;
        Ok((decode(id), decode(secret)))
    }))
}

fn client_credentials(state: &Shared, headers: &HeaderMap, body: &Bytes) -> Exchanged {
    let params = form(headers, body).map_err(|e| oauth_error(400, "invalid_request", &e))?;
    let param = |k: &str| params.get(k).map(String::as_str);
    match param("grant_type") {
        None => {
            let missing = "The grant_type parameter is missing.";
            return Err(oauth_error(400, "invalid_request", missing));
        }
        Some("client_credentials") => {}
        Some(other) => {
            let description = format!("The grant type {other:?} is not supported.");
            return Err(oauth_error(400, "unsupported_grant_type", &description));
        }
    }
    let basic = basic(headers);
    let methods = usize::from(basic.is_some())
        + usize::from(params.contains_key("client_secret"))
        + usize::from(params.contains_key("client_assertion"));
    if methods > 1 {
        let description = "More than one client authentication method was used.";
        return Err(oauth_error(400, "invalid_request", description));
    }
    let tried_basic = basic.is_some();
    let invalid_client = |description: &str| {
        let mut response = oauth_error(401, "invalid_client", description);
        if tried_basic {
            let challenge = HeaderValue::from_static("Basic realm=\"berth-test\"");
            (response.headers_mut()).insert(header::WWW_AUTHENTICATE, challenge);
        }
        response
    };
    let failed = "Client authentication failed.";
    if let Some(assertion) = param("client_assertion") {
        if param("client_assertion_type") != Some(CLIENT_ASSERTION) {
            let description = format!("The client_assertion_type must be {CLIENT_ASSERTION}.");
            return Err(oauth_error(400, "invalid_request", &description));
        }
        let token_url = format!(
            "http://{}/oauth2/token",
            state.lock().expect("token server").addr
        );
        let claims: Value = jsonwebtoken::dangerous::insecure_decode_claims(assertion)
            .map_err(|e| invalid_client(&format!("The client assertion is not a JWT: {e}")))?;
        let Some(client_id) = claims["iss"].as_str() else {
            return Err(invalid_client("The client assertion has no iss."));
        };
        if param("client_id").is_some_and(|id| id != client_id) {
            return Err(invalid_client("The client_id is not the assertion's iss."));
        }
        let pem = (state.lock().expect("token server").client_keys)
            .get(client_id)
            .cloned()
            .ok_or_else(|| invalid_client(failed))?;
        let mut validation = Validation::new(Algorithm::RS256);
        validation.leeway = 0;
        validation.set_audience(&[&token_url]);
        validation.set_issuer(&[client_id]);
        validation.sub = Some(client_id.to_owned());
        validation.set_required_spec_claims(&["exp", "aud", "iss", "sub"]);
        let key = DecodingKey::from_rsa_pem(pem.as_bytes()).expect("a client's public key");
        let checked = jsonwebtoken::decode::<Value>(assertion, &key, &validation);
        let claims = checked.map_err(|e| match e.kind() {
            ErrorKind::InvalidSignature => {
                invalid_client("The client assertion's signature is not valid.")
            }
            _ => invalid_client(&format!("The client assertion is not valid: {e}.")),
        })?;
        if (claims.claims["jti"].as_str()).is_none_or(str::is_empty) {
            return Err(invalid_client("The client assertion has no jti."));
        }
    } else {
        let (client_id, secret) = match basic {
            Some(Ok(pair)) => pair,
            Some(Err(())) => return Err(invalid_client("The Basic credentials are malformed.")),
            None => match (param("client_id"), param("client_secret")) {
                (Some(id), Some(secret)) => (id.to_owned(), secret.to_owned()),
                _ => return Err(invalid_client("No client authentication was given.")),
            },
        };
        let known = (state.lock().expect("token server").client_secrets)
            .get(&client_id)
            .cloned();
        if known.as_deref() != Some(secret.as_str()) {
            return Err(invalid_client(failed));
        }
    }
    let mut r = state.lock().expect("token server");
    r.last_scope = param("scope").map(str::to_owned);
    r.last_resource = param("resource").map(str::to_owned);
    let token = r.issue(false);
    let mut body = json!({
        "access_token": token,
        "token_type": "Bearer",
        "expires_in": r.lifetime.as_secs(),
    });
    if let Some(scope) = param("scope") {
        body["scope"] = scope.into();
    }
    let mut response = json_response(200, body.to_string());
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::PRAGMA, HeaderValue::from_static("no-cache"));
    Ok(response)
}

// Google's JWT bearer grant:
// https://developers.google.com/identity/protocols/oauth2/service-account

async fn google(State(state): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    exchange(&state, |s| jwt_bearer(s, &headers, &body)).await
}

fn jwt_bearer(state: &Shared, headers: &HeaderMap, body: &Bytes) -> Exchanged {
    let params = form(headers, body).map_err(|e| oauth_error(400, "invalid_request", &e))?;
    let param = |k: &str| params.get(k).map(String::as_str);
    match param("grant_type") {
        None => {
            let missing = "Missing required parameter: grant_type";
            return Err(oauth_error(400, "invalid_request", missing));
        }
        Some(JWT_BEARER) => {}
        Some(other) => {
            let description = format!("Invalid grant_type: {other}");
            return Err(oauth_error(400, "unsupported_grant_type", &description));
        }
    }
    let Some(assertion) = param("assertion") else {
        let missing = "Missing required parameter: assertion";
        return Err(oauth_error(400, "invalid_request", missing));
    };
    let invalid_grant = |description: &str| oauth_error(400, "invalid_grant", description);
    let short_lived = "Invalid JWT: Token must be a short-lived token (60 minutes) and in a \
                       reasonable timeframe. Check your iat and exp values in the JWT claim.";
    let claims: Value = jsonwebtoken::dangerous::insecure_decode_claims(assertion)
        .map_err(|e| invalid_grant(&format!("Invalid JWT: {e}")))?;
    let Some(email) = claims["iss"].as_str() else {
        return Err(invalid_grant("Invalid JWT: no iss."));
    };
    let (pem, token_url) = {
        let r = state.lock().expect("token server");
        let url = format!("http://{}/google/token", r.addr);
        (r.google_keys.get(email).cloned(), url)
    };
    let pem = pem.ok_or_else(|| invalid_grant("Invalid grant: account not found"))?;
    let mut validation = Validation::new(Algorithm::RS256);
    validation.leeway = 0;
    validation.set_audience(&[&token_url]);
    validation.set_required_spec_claims(&["exp", "aud", "iss"]);
    let key = DecodingKey::from_rsa_pem(pem.as_bytes()).expect("a service account's public key");
    let checked = jsonwebtoken::decode::<Value>(assertion, &key, &validation);
    let claims = checked
        .map_err(|e| match e.kind() {
            ErrorKind::InvalidSignature | ErrorKind::InvalidAlgorithm => {
                invalid_grant(INVALID_JWT_SIGNATURE)
            }
            ErrorKind::InvalidAudience => invalid_grant(&format!(
                "Invalid JWT: Failed audience check. The right audience is {token_url}"
            )),
            ErrorKind::ExpiredSignature => invalid_grant(short_lived),
            _ => invalid_grant(&format!("Invalid JWT: {e}")),
        })?
        .claims;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let (Some(iat), Some(exp)) = (claims["iat"].as_u64(), claims["exp"].as_u64()) else {
        return Err(invalid_grant(short_lived));
    };
    if exp < iat || exp - iat > 3600 || iat > now + 60 {
        return Err(invalid_grant(short_lived));
    }
    let Some(scope) = claims["scope"].as_str().filter(|s| !s.trim().is_empty()) else {
        let description = "Invalid OAuth scope or ID token audience provided.";
        return Err(oauth_error(400, "invalid_scope", description));
    };
    let mut r = state.lock().expect("token server");
    r.last_scope = Some(scope.to_owned());
    let token = r.issue(false);
    let body = json!({
        "access_token": token,
        "expires_in": r.lifetime.as_secs(),
        "token_type": "Bearer",
    });
    Ok(json_response(200, body.to_string()))
}

/// A cloud API that wants the [`TokenServer`]'s tokens, in front of a
/// backend (the sim cloud, plain HTTP/1.1): a request with a live token, in
/// `X-Auth-Token` or `Authorization: Bearer`, is relayed as it came (less
/// the token and the hop-by-hop headers) and gets the backend's answer;
/// any other gets `401` with Keystone's error body.
pub struct Guard {
    pub addr: SocketAddr,
    state: Arc<GuardState>,
    task: JoinHandle<()>,
}

struct GuardState {
    server: Shared,
    upstream: SocketAddr,
    /// Plain mutex, never held across an await.
    refusals: Mutex<Vec<String>>,
}

impl Guard {
    pub async fn start(server: &TokenServer, upstream: SocketAddr) -> Guard {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(GuardState {
            server: server.state.clone(),
            upstream,
            refusals: Mutex::new(Vec::new()),
        });
        let app = Router::new().fallback(guard).with_state(state.clone());
        Guard {
            addr,
            state,
            task: serve(listener, app),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Why each refused request was refused, in order: `missing` (no
    /// token), `expired`, or `unknown` (never issued, or revoked).
    pub fn refusals(&self) -> Vec<String> {
        self.state.refusals.lock().expect("guard").clone()
    }

    /// Every token issued so far is refused from now on, as by a server
    /// that revokes early.
    pub fn revoke_all(&self) {
        self.state.server.lock().expect("token server").live.clear();
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The token a request carries: `X-Auth-Token`, or a bearer token.
fn token_of(headers: &HeaderMap) -> Option<&str> {
    if let Some(t) = headers.get("x-auth-token").and_then(|v| v.to_str().ok()) {
        return Some(t.trim());
    }
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

async fn guard(State(state): State<Arc<GuardState>>, request: Request) -> Response {
    let verdict = match token_of(request.headers()) {
        None => Err("missing"),
        Some(token) => {
            let r = state.server.lock().expect("token server");
            match r.live.get(token) {
                Some(expiry) if Instant::now() < *expiry => Ok(()),
                Some(_) => Err("expired"),
                None => Err("unknown"),
            }
        }
    };
    {
        let mut r = state.server.lock().expect("token server");
        match verdict {
            Ok(()) => r.counts.guarded_ok += 1,
            Err(_) => r.counts.guarded_401 += 1,
        }
    }
    if let Err(reason) = verdict {
        state
            .refusals
            .lock()
            .expect("guard")
            .push(reason.to_owned());
        return *unauthorized();
    }
    match relay(state.upstream, request).await {
        Ok(response) => response,
        Err(e) => json_response(
            502,
            json!({"error": {"code": 502, "message": e}}).to_string(),
        ),
    }
}

/// Headers that belong to one connection, not to the request (RFC 9110
/// §7.6.1), and the names `connection` lists.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let listed: Vec<String> = (headers.get_all(header::CONNECTION).iter())
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .filter(|n| !n.is_empty())
        .collect();
    for name in listed {
        headers.remove(name.as_str());
    }
    for name in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ] {
        headers.remove(name);
    }
}

/// Sends `request` to `upstream` on a connection of its own, without its
/// token; the answer, whole.
async fn relay(upstream: SocketAddr, request: Request) -> Result<Response, String> {
    let (mut parts, body) = request.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove("x-auth-token");
    parts.headers.remove(header::AUTHORIZATION);
    let path = (parts.uri.path_and_query()).map_or("/", |p| p.as_str());
    let mut outgoing = axum::http::Request::builder()
        .method(parts.method.clone())
        .uri(path)
        .body(http_body_util::Full::new(body))
        .map_err(|e| e.to_string())?;
    *outgoing.headers_mut() = parts.headers;
    let stream = tokio::net::TcpStream::connect(upstream)
        .await
        .map_err(|e| format!("connecting to {upstream}: {e}"))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    let connection = tokio::spawn(connection);
    let answer = sender.send_request(outgoing).await;
    let answer = answer.map_err(|e| format!("relaying to {upstream}: {e}"))?;
    let (mut parts, body) = answer.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    drop(sender);
    connection.abort();
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(header::CONTENT_LENGTH);
    Ok(Response::from_parts(parts, Body::from(body)))
}
