//! The exchanges themselves: a credential's secrets read from the
//! environment or their files, and for the kinds exchanged for tokens, the
//! request to the token endpoint and what its answer means.
//!
//! Written from the public specifications:
//! - Keystone: OpenStack Identity API v3, "Password authentication with
//!   scoped authorization" and "Authenticating with an Application
//!   Credential" (`POST /v3/auth/tokens`; the token in `X-Subject-Token`,
//!   its expiry in `token.expires_at`);
//! - OAuth2: RFC 6749 §4.4 (client credentials grant), §2.3.1 (client
//!   secret in the body or HTTP Basic), §5.1/§5.2 (the answer and its
//!   errors); RFC 7523 §2.2 (a private-key JWT assertion as the client's
//!   proof);
//! - Google: "Using OAuth 2.0 for Server to Server Applications" (an RS256
//!   JWT with `iss`, `scope`, `aud`, `iat`, `exp`, exchanged with the
//!   `urn:ietf:params:oauth:grant-type:jwt-bearer` grant at the key's
//!   `token_uri`).
//!
//! The host makes these requests itself, never a driver: over hyper, with
//! rustls checking the endpoint against the system's trust store or the
//! credential's `ca-file` ([`crate::mtls::send`]). It follows no redirect
//! (a secret goes only to the URL configured), and reads at most
//! [`MAX_ANSWER`] bytes of an answer.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use http_body_util::BodyExt as _;

use http::header::HeaderName;
use serde::Deserialize;
use serde_json::{Value, json};

use berth_config::{
    Auth, ClientAuth, GoogleServiceAccount, Keystone, KeystoneMethod, KeystoneRef, OAuth2, Secret,
    SecretSource,
};

use crate::credentials::Material;

/// The most bytes of a token endpoint's answer read: a Keystone catalog
/// of a large cloud is a few hundred KiB.
pub(crate) const MAX_ANSWER: usize = 4 << 20;

/// How long one exchange may take.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);

/// A token whose endpoint states no lifetime is taken to last this long
/// (the usual hour), and is refreshed at 80% of it like any other.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(3600);

/// The lifetime of a Google assertion and of an OAuth2 client assertion.
const GOOGLE_ASSERTION: u64 = 3600;
const CLIENT_ASSERTION: u64 = 300;

/// A read or exchange that worked.
pub(crate) struct Exchanged {
    pub material: Material,
    /// How long the token lasts from now; `None`: until replaced.
    pub lifetime: Option<Duration>,
    pub info: Option<Value>,
    /// Every secret read or sent for it, to be masked.
    pub read: Vec<Vec<u8>>,
}

/// A read or exchange that failed.
pub(crate) struct Failure {
    /// The endpoint refused the credential (`400`, `401`, `403`), or a
    /// file is wrong: trying again will not help until something changes.
    pub refused: bool,
    pub message: String,
    pub read: Vec<Vec<u8>>,
}

impl Failure {
    fn new(refused: bool, message: impl Into<String>) -> Failure {
        Failure {
            refused,
            message: message.into(),
            read: Vec::new(),
        }
    }
}

/// What the exchanges' TLS trusts by default: the system's trust store
/// (the public roots if it has none), read at the first HTTPS exchange of
/// the process, not for every provider that never makes one.
pub(crate) struct Client;

impl Client {
    pub fn new() -> Client {
        Client
    }

    fn tls(&self) -> Option<Arc<rustls::ClientConfig>> {
        static SYSTEM: std::sync::OnceLock<Option<Arc<rustls::ClientConfig>>> =
            std::sync::OnceLock::new();
        SYSTEM
            .get_or_init(|| {
                let mut roots = rustls::RootCertStore::empty();
                roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
                if roots.is_empty() {
                    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
                }
                tls_config(roots)
                    .map_err(|e| tracing::error!(error = %e.message, "the TLS of credential exchanges did not start"))
                    .ok()
            })
            .clone()
    }
}

fn tls_config(roots: rustls::RootCertStore) -> Result<Arc<rustls::ClientConfig>, Failure> {
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| Failure::new(false, format!("TLS: {e}")))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The secrets of `auth` known without reading a file (from the
/// environment).
pub(crate) fn known_secrets(auth: &Auth) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut value = |s: &SecretSource| {
        if let SecretSource::Value(v) = s {
            out.push(v.expose().as_bytes().to_vec());
        }
    };
    match auth {
        Auth::AwsSigV4 {
            secret_access_key,
            session_token,
            ..
        } => {
            value(secret_access_key);
            if let Some(t) = session_token {
                value(t);
            }
        }
        Auth::Header { value: v, .. } => value(v),
        Auth::Keystone(k) => match &k.method {
            KeystoneMethod::Password { password, .. } => value(password),
            KeystoneMethod::ApplicationCredential { secret, .. } => value(secret),
        },
        Auth::OAuth2(o) => match &o.client {
            ClientAuth::Secret { secret, .. } => value(secret),
            ClientAuth::PrivateKeyJwt { key, .. } => value(key),
        },
        Auth::Google(g) => value(&g.key),
        Auth::ClientCertificate(c) => value(&c.key),
    }
    out
}

/// Reads `source`, noting the secret in `read`.
fn read(source: &SecretSource, what: &str, read: &mut Vec<Vec<u8>>) -> Result<Secret, Failure> {
    let s = source
        .read()
        .map_err(|e| Failure::new(true, format!("{what}: {e}")))?;
    read.push(s.expose().as_bytes().to_vec());
    Ok(s)
}

/// Reads or exchanges `auth` now.
pub(crate) async fn run(client: &Client, auth: &Auth) -> Result<Exchanged, Failure> {
    let mut secrets = Vec::new();
    let result = match auth {
        Auth::AwsSigV4 {
            access_key_id,
            secret_access_key,
            session_token,
            region,
            service,
        } => (|| {
            let secret_access_key = read(secret_access_key, "secret-access-key", &mut secrets)?;
            let session_token = session_token
                .as_ref()
                .map(|t| read(t, "session-token", &mut secrets))
                .transpose()?;
            Ok(Exchanged {
                material: Material::AwsSigV4 {
                    access_key_id: access_key_id.clone(),
                    secret_access_key,
                    session_token,
                    region: region.clone(),
                    service: service.clone(),
                },
                lifetime: None,
                info: None,
                read: Vec::new(),
            })
        })(),
        Auth::Header {
            name,
            scheme,
            value,
        } => read(value, "the header's value", &mut secrets).and_then(|v| {
            let value = match scheme {
                Some(s) => Secret::new(format!("{s} {}", v.expose())),
                None => v,
            };
            http::HeaderValue::from_str(value.expose()).map_err(|_| {
                Failure::new(true, "the secret has characters a header cannot carry")
            })?;
            Ok(Exchanged {
                material: Material::Header {
                    name: name.clone(),
                    value,
                },
                lifetime: None,
                info: None,
                read: Vec::new(),
            })
        }),
        Auth::Keystone(k) => keystone(client, k, &mut secrets).await,
        Auth::OAuth2(o) => oauth2(client, o, &mut secrets).await,
        Auth::Google(g) => google(client, g, &mut secrets).await,
        Auth::ClientCertificate(c) => crate::mtls::config(c, &mut secrets).map(|tls| Exchanged {
            material: Material::ClientTls(tls),
            lifetime: None,
            info: None,
            read: Vec::new(),
        }),
    };
    match result {
        Ok(mut e) => {
            e.read.extend(secrets);
            Ok(e)
        }
        Err(mut f) => {
            f.read.extend(secrets);
            Err(f)
        }
    }
}

/// An endpoint's answer, read whole (at most [`MAX_ANSWER`] bytes).
struct Answer {
    status: u16,
    headers: http::HeaderMap,
    body: Vec<u8>,
}

impl Answer {
    /// The body as the endpoint's own words for an error: its JSON error
    /// fields if it has them, else the text (at most 300 characters).
    fn error_text(&self) -> String {
        let text = match serde_json::from_slice::<Value>(&self.body) {
            Ok(v) => {
                let oauth = v.get("error").and_then(Value::as_str).map(|e| {
                    match v.get("error_description").and_then(Value::as_str) {
                        Some(d) => format!("{e}: {d}"),
                        None => e.to_owned(),
                    }
                });
                let keystone = v
                    .pointer("/error/message")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                oauth.or(keystone).unwrap_or_else(|| v.to_string())
            }
            Err(_) => String::from_utf8_lossy(&self.body).into_owned(),
        };
        let text: String = text.chars().take(300).collect();
        berth_core::text::printable(text.trim()).into_owned()
    }

    /// A failure for this answer of `url`.
    fn failure(&self, url: &str) -> Failure {
        Failure::new(
            matches!(self.status, 400 | 401 | 403),
            format!("{url} answered {}: {}", self.status, self.error_text()),
        )
    }
}

/// One request to a token endpoint.
struct Post<'a> {
    url: &'a str,
    /// Trusted in place of the system's store.
    ca: Option<&'a Path>,
    headers: Vec<(HeaderName, String)>,
    body: Vec<u8>,
}

/// Sends `post` and reads the whole answer, within [`EXCHANGE_TIMEOUT`].
async fn send(client: &Client, post: Post<'_>) -> Result<Answer, Failure> {
    let url = post.url;
    match tokio::time::timeout(EXCHANGE_TIMEOUT, send_now(client, post)).await {
        Ok(answer) => answer,
        Err(_) => Err(Failure::new(
            false,
            format!(
                "{url} did not answer within {}s",
                EXCHANGE_TIMEOUT.as_secs()
            ),
        )),
    }
}

async fn send_now(client: &Client, post: Post<'_>) -> Result<Answer, Failure> {
    let url = post.url;
    let unreachable = |e: String| Failure::new(false, format!("cannot reach {url}: {e}"));
    let uri: http::Uri = url.parse().map_err(|e| unreachable(format!("{e}")))?;
    let https = uri.scheme() == Some(&http::uri::Scheme::HTTPS);
    let authority = uri
        .authority()
        .ok_or_else(|| unreachable("the URL names no host".into()))?
        .clone();
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
    let addr = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| unreachable(e.to_string()))?
        .next()
        .ok_or_else(|| unreachable("the host name does not resolve".into()))?;
    let mut request = http::Request::builder()
        .method(http::Method::POST)
        .uri(uri.clone())
        .header(http::header::HOST, authority.as_str())
        .header(
            http::header::USER_AGENT,
            concat!("berth/", env!("CARGO_PKG_VERSION")),
        );
    for (name, value) in &post.headers {
        request = request.header(name, value);
    }
    let body = http_body_util::Full::new(bytes::Bytes::from(post.body))
        .map_err(|never| match never {})
        .boxed_unsync();
    let request = request.body(body).map_err(|e| unreachable(e.to_string()))?;
    let options = wasmtime_wasi_http::RequestOptions {
        connect_timeout: Some(EXCHANGE_TIMEOUT),
        first_byte_timeout: Some(EXCHANGE_TIMEOUT),
        between_bytes_timeout: Some(EXCHANGE_TIMEOUT),
    };
    let sent = if https {
        let tls = match post.ca {
            Some(ca) => ca_config(ca)?,
            None => client
                .tls()
                .ok_or_else(|| Failure::new(false, "the TLS of exchanges did not start"))?,
        };
        crate::mtls::send(request, options, tls, addr).await
    } else {
        // Plain HTTP goes only to loopback (checked with the config).
        wasmtime_wasi_http::default_send_request(request, Some(options))
            .await
            .map(crate::sandbox::boxed)
    };
    let (response, io) = sent.map_err(|e| unreachable(format!("{e:?}")))?;
    // The connection's I/O goes on while the body is read.
    let io = tokio::spawn(io);
    let status = response.status().as_u16();
    let (parts, body) = response.into_parts();
    let body = http_body_util::Limited::new(body, MAX_ANSWER)
        .collect()
        .await
        .map_err(|e| match e.downcast::<http_body_util::LengthLimitError>() {
            Ok(_) => Failure::new(
                false,
                format!("{url} answered more than {MAX_ANSWER} bytes"),
            ),
            Err(e) => unreachable(format!("{e:?}")),
        })?
        .to_bytes();
    io.abort();
    Ok(Answer {
        status,
        headers: parts.headers,
        body: body.to_vec(),
    })
}

/// A TLS configuration that trusts only the certificates in the PEM file
/// `ca` (read now, so a replaced file is used from the next exchange).
fn ca_config(ca: &Path) -> Result<Arc<rustls::ClientConfig>, Failure> {
    let refused = |e: String| Failure::new(true, format!("ca-file {}: {e}", ca.display()));
    let pem = std::fs::read(ca).map_err(|e| refused(e.to_string()))?;
    tls_config(crate::mtls::ca_roots(&pem).map_err(refused)?)
}

fn keystone_ref(r: &KeystoneRef) -> Value {
    match r {
        KeystoneRef::Id(id) => json!({ "id": id }),
        KeystoneRef::Name { name, domain } => json!({ "name": name, "domain": { "name": domain } }),
    }
}

async fn keystone(
    client: &Client,
    k: &Keystone,
    secrets: &mut Vec<Vec<u8>>,
) -> Result<Exchanged, Failure> {
    let url = format!("{}/auth/tokens", k.auth_url);
    let body = match &k.method {
        KeystoneMethod::Password {
            user,
            password,
            project,
        } => {
            let password = read(password, "password", secrets)?;
            let mut user = keystone_ref(user);
            user["password"] = Value::String(password.expose().to_owned());
            let mut auth = json!({
                "identity": { "methods": ["password"], "password": { "user": user } }
            });
            if let Some(p) = project {
                auth["scope"] = json!({ "project": keystone_ref(p) });
            }
            json!({ "auth": auth })
        }
        KeystoneMethod::ApplicationCredential { id, secret } => {
            let secret = read(secret, "application-credential-secret", secrets)?;
            json!({ "auth": { "identity": {
                "methods": ["application_credential"],
                "application_credential": { "id": id, "secret": secret.expose() }
            } } })
        }
    };
    let answer = send(
        client,
        Post {
            url: &url,
            ca: k.ca.as_deref(),
            headers: vec![(http::header::CONTENT_TYPE, "application/json".to_owned())],
            body: body.to_string().into_bytes(),
        },
    )
    .await?;
    if !(200..300).contains(&answer.status) {
        return Err(answer.failure(&url));
    }
    let token = answer
        .headers
        .get("x-subject-token")
        .and_then(|v| v.to_str().ok())
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            Failure::new(
                false,
                format!("{url} answered {} with no X-Subject-Token", answer.status),
            )
        })?
        .to_owned();
    secrets.push(token.as_bytes().to_vec());
    let doc: Value = serde_json::from_slice(&answer.body).map_err(|e| {
        Failure::new(
            false,
            format!("{url} answered with a body that is not JSON: {e}"),
        )
    })?;
    let t = doc.get("token").cloned().unwrap_or(Value::Null);
    let expires = t
        .get("expires_at")
        .and_then(Value::as_str)
        .ok_or_else(|| Failure::new(false, format!("{url} answered a token with no expires_at")))?;
    let expires_s = parse_utc(expires).ok_or_else(|| {
        Failure::new(
            false,
            format!("{url} answered an expires_at that is not a UTC time: {expires:?}"),
        )
    })?;
    // Measured from issued_at when given, so that a clock apart from the
    // server's does not shorten or stretch it.
    let from = t
        .get("issued_at")
        .and_then(Value::as_str)
        .and_then(parse_utc)
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64())
        });
    let lifetime = expires_s - from;
    if lifetime <= 0.0 {
        return Err(Failure::new(
            false,
            format!("{url} answered a token that has already expired (expires_at {expires})"),
        ));
    }
    let mut info = serde_json::Map::new();
    info.insert("kind".into(), json!("keystone"));
    info.insert("auth_url".into(), json!(k.auth_url));
    // What a driver needs (its endpoints, its project) and nothing that
    // authorises anything.
    for key in [
        "expires_at",
        "issued_at",
        "methods",
        "user",
        "project",
        "domain",
        "system",
        "roles",
        "catalog",
    ] {
        if let Some(v) = t.get(key) {
            info.insert(key.into(), v.clone());
        }
    }
    Ok(Exchanged {
        material: Material::Header {
            name: HeaderName::from_static("x-auth-token"),
            value: Secret::new(token),
        },
        lifetime: Some(Duration::from_secs_f64(lifetime)),
        info: Some(Value::Object(info)),
        read: Vec::new(),
    })
}

/// An OAuth2 token endpoint's success answer (RFC 6749 §5.1).
#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    token_type: String,
    /// A number, or a string of one (some endpoints send that).
    expires_in: Option<Value>,
    scope: Option<String>,
}

/// Posts `form` to `url` (with `headers` besides, trusting `ca` if
/// given) and reads a bearer token from the answer.
async fn token_endpoint(
    client: &Client,
    (url, ca): (&str, Option<&Path>),
    mut headers: Vec<(HeaderName, String)>,
    form: &[(&str, &str)],
    secrets: &mut Vec<Vec<u8>>,
) -> Result<(Secret, Duration, TokenAnswer), Failure> {
    let body = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(form)
        .finish();
    headers.extend([
        (
            http::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded".to_owned(),
        ),
        (http::header::ACCEPT, "application/json".to_owned()),
    ]);
    let post = Post {
        url,
        ca,
        headers,
        body: body.into_bytes(),
    };
    let answer = send(client, post).await?;
    if answer.status != 200 {
        return Err(answer.failure(url));
    }
    let parsed: TokenAnswer = serde_json::from_slice(&answer.body).map_err(|e| {
        Failure::new(
            false,
            format!("{url} answered 200 with a body that is not a token answer: {e}"),
        )
    })?;
    secrets.push(parsed.access_token.as_bytes().to_vec());
    if !parsed.token_type.eq_ignore_ascii_case("bearer") {
        return Err(Failure::new(
            false,
            format!(
                "{url} answered a token of type {:?}, not Bearer",
                parsed.token_type
            ),
        ));
    }
    if parsed.access_token.is_empty()
        || http::HeaderValue::from_str(&format!("Bearer {}", parsed.access_token)).is_err()
    {
        return Err(Failure::new(
            false,
            format!("{url} answered a token a header cannot carry"),
        ));
    }
    let lifetime = match &parsed.expires_in {
        None => DEFAULT_LIFETIME,
        Some(v) => {
            let secs = v
                .as_f64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                .filter(|s: &f64| s.is_finite() && *s > 0.0)
                .ok_or_else(|| {
                    Failure::new(
                        false,
                        format!("{url} answered expires_in {v}, not a number of seconds above 0"),
                    )
                })?;
            Duration::from_secs_f64(secs.min(1e9))
        }
    };
    let token = Secret::new(format!("Bearer {}", parsed.access_token));
    Ok((token, lifetime, parsed))
}

/// An OAuth2 token (`Authorization: Bearer …`) that lasts `lifetime`.
fn bearer(token: Secret, lifetime: Duration, info: Value) -> Exchanged {
    Exchanged {
        material: Material::Header {
            name: http::header::AUTHORIZATION,
            value: token,
        },
        lifetime: Some(lifetime),
        info: Some(info),
        read: Vec::new(),
    }
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Signs `claims` RS256 with the PEM key `key`, with `kid` (or, given as
/// `x5t:…`, `x5t`) in the header.
fn rs256(claims: &Value, key: &str, key_id: Option<&str>, what: &str) -> Result<String, Failure> {
    let key = jsonwebtoken::EncodingKey::from_rsa_pem(key.as_bytes()).map_err(|e| {
        Failure::new(
            true,
            format!("{what} is not an RSA private key in PEM: {e}"),
        )
    })?;
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
    if let Some(id) = key_id {
        match id.strip_prefix("x5t:") {
            Some(t) => header.x5t = Some(t.to_owned()),
            None => header.kid = Some(id.to_owned()),
        }
    }
    jsonwebtoken::encode(&header, claims, &key)
        .map_err(|e| Failure::new(true, format!("signing with {what}: {e}")))
}

/// `tenant` of an Entra ID token URL (`https://login…/{tenant}/oauth2/…`).
fn tenant_of(token_url: &str) -> Option<String> {
    let url = url::Url::parse(token_url).ok()?;
    let mut segments = url.path_segments()?;
    let tenant = segments.next()?;
    (segments.next() == Some("oauth2") && !tenant.is_empty()).then(|| tenant.to_owned())
}

async fn oauth2(
    client: &Client,
    o: &OAuth2,
    secrets: &mut Vec<Vec<u8>>,
) -> Result<Exchanged, Failure> {
    let url = &o.token_url;
    let mut headers = Vec::new();
    let mut form: Vec<(&str, String)> = vec![("grant_type", "client_credentials".to_owned())];
    if let Some(s) = &o.scope {
        form.push(("scope", s.clone()));
    }
    if let Some(r) = &o.resource {
        form.push(("resource", r.clone()));
    }
    match &o.client {
        ClientAuth::Secret { secret, basic } => {
            let secret = read(secret, "client-secret", secrets)?;
            if *basic {
                // RFC 6749 §2.3.1: each form-encoded, then Basic.
                let enc = |s: &str| {
                    url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>()
                };
                let user = enc(&o.client_id);
                let pass = enc(secret.expose());
                secrets.push(pass.as_bytes().to_vec());
                let basic = format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
                );
                secrets.push(basic.as_bytes().to_vec());
                headers.push((http::header::AUTHORIZATION, basic));
            } else {
                form.push(("client_id", o.client_id.clone()));
                form.push(("client_secret", secret.expose().to_owned()));
            }
        }
        ClientAuth::PrivateKeyJwt { key, key_id } => {
            let key = read(key, "private-key", secrets)?;
            let now = now_s();
            let claims = json!({
                "iss": o.client_id,
                "sub": o.client_id,
                "aud": url,
                "iat": now,
                "nbf": now,
                "exp": now + CLIENT_ASSERTION,
                "jti": hex::encode(rand::random::<[u8; 16]>()),
            });
            let assertion = rs256(&claims, key.expose(), key_id.as_deref(), "private-key")?;
            secrets.push(assertion.as_bytes().to_vec());
            form.push(("client_id", o.client_id.clone()));
            form.push((
                "client_assertion_type",
                "urn:ietf:params:oauth:client-assertion-type:jwt-bearer".to_owned(),
            ));
            form.push(("client_assertion", assertion));
        }
    }
    let pairs: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (token, lifetime, answer) =
        token_endpoint(client, (url, o.ca.as_deref()), headers, &pairs, secrets).await?;
    let mut info = json!({
        "kind": "oauth2-client-credentials",
        "token_url": url,
        "client_id": o.client_id,
        "token_type": "Bearer",
        "expires_in": lifetime.as_secs(),
    });
    if let Some(s) = answer.scope.or_else(|| o.scope.clone()) {
        info["scope"] = json!(s);
    }
    if let Some(r) = &o.resource {
        info["resource"] = json!(r);
    }
    if let Some(t) = tenant_of(url) {
        info["tenant"] = json!(t);
    }
    Ok(bearer(token, lifetime, info))
}

/// A Google service-account key file: the fields used.
#[derive(Deserialize)]
struct GoogleKey {
    #[serde(rename = "type")]
    kind: Option<String>,
    client_email: String,
    private_key: String,
    private_key_id: Option<String>,
    token_uri: String,
    project_id: Option<String>,
}

/// Whether `url` is one a secret may go to: HTTPS, or plain HTTP to a
/// loopback address.
fn secret_may_go(url: &str) -> bool {
    match url::Url::parse(url) {
        Ok(u) => match u.scheme() {
            "https" => true,
            "http" => crate::credentials::may_send(u.host_str().unwrap_or(""), false),
            _ => false,
        },
        Err(_) => false,
    }
}

async fn google(
    client: &Client,
    g: &GoogleServiceAccount,
    secrets: &mut Vec<Vec<u8>>,
) -> Result<Exchanged, Failure> {
    let text = read(&g.key, "key", secrets)?;
    let key: GoogleKey = serde_json::from_str(text.expose()).map_err(|e| {
        Failure::new(
            true,
            format!("the key is not a service-account JSON key: {e}"),
        )
    })?;
    // The PEM as the file holds it is masked whole above; each line of it
    // too, since an echo may show it with its newlines escaped.
    for line in key.private_key.lines().filter(|l| l.len() >= 16) {
        secrets.push(line.as_bytes().to_vec());
    }
    secrets.push(key.private_key.as_bytes().to_vec());
    if key.kind.as_deref().is_some_and(|k| k != "service_account") {
        return Err(Failure::new(
            true,
            format!("the key is of type {:?}, not service_account", key.kind),
        ));
    }
    if !secret_may_go(&key.token_uri) {
        return Err(Failure::new(
            true,
            format!(
                "the key's token_uri {:?} is not https:// (or http:// to a loopback address)",
                key.token_uri
            ),
        ));
    }
    let now = now_s();
    let claims = json!({
        "iss": key.client_email,
        "scope": g.scopes.join(" "),
        "aud": key.token_uri,
        "iat": now,
        "exp": now + GOOGLE_ASSERTION,
    });
    let assertion = rs256(
        &claims,
        &key.private_key,
        key.private_key_id.as_deref(),
        "the key's private_key",
    )?;
    secrets.push(assertion.as_bytes().to_vec());
    let form = [
        ("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer"),
        ("assertion", assertion.as_str()),
    ];
    let (token, lifetime, _) =
        token_endpoint(client, (&key.token_uri, None), Vec::new(), &form, secrets).await?;
    let info = json!({
        "kind": "google-service-account",
        "project_id": key.project_id,
        "client_email": key.client_email,
        "token_uri": key.token_uri,
        "scopes": g.scopes,
        "expires_in": lifetime.as_secs(),
    });
    Ok(bearer(token, lifetime, info))
}

/// Seconds since the epoch of a time as Keystone writes it (RFC 3339:
/// `2026-11-28T18:00:00.000000Z`).
pub(crate) fn parse_utc(text: &str) -> Option<f64> {
    let t: jiff::Timestamp = text.trim().parse().ok()?;
    Some(t.as_millisecond() as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keystone_times_are_read() {
        assert_eq!(parse_utc("1970-01-01T00:00:00Z"), Some(0.0));
        assert_eq!(
            parse_utc("2015-08-30T12:36:00.000000Z"),
            Some(1_440_938_160.0)
        );
        assert_eq!(parse_utc("2015-08-30T12:36:00.5Z"), Some(1_440_938_160.5));
        assert_eq!(
            parse_utc("2015-08-30T12:36:00+00:00"),
            Some(1_440_938_160.0)
        );
        assert_eq!(parse_utc("2024-02-29T00:00:00Z"), Some(1_709_164_800.0));
        for bad in [
            "",
            "2015-08-30",
            "2015-13-01T00:00:00Z",
            "x-08-30T12:36:00Z",
            "2015-08-30T25:00:00Z",
        ] {
            assert_eq!(parse_utc(bad), None, "{bad}");
        }
    }

    #[test]
    fn an_entra_token_url_names_its_tenant() {
        assert_eq!(
            tenant_of("https://login.microsoftonline.com/72f988bf-86f1/oauth2/v2.0/token")
                .as_deref(),
            Some("72f988bf-86f1")
        );
        assert_eq!(tenant_of("https://idp.example.com/token"), None);
    }

    #[test]
    fn error_answers_are_told_in_the_endpoints_words() {
        let answer = |status, body: &str| Answer {
            status,
            headers: http::HeaderMap::new(),
            body: body.as_bytes().to_vec(),
        };
        let f = answer(
            401,
            r#"{"error":"invalid_client","error_description":"bad secret"}"#,
        )
        .failure("u");
        assert!(f.refused);
        assert_eq!(f.message, "u answered 401: invalid_client: bad secret");
        let f = answer(401, r#"{"error":{"code":401,"message":"The request you have made requires authentication.","title":"Unauthorized"}}"#).failure("u");
        assert_eq!(
            f.message,
            "u answered 401: The request you have made requires authentication."
        );
        let f = answer(503, "down\n\u{1b}[31m").failure("u");
        assert!(!f.refused);
        assert!(!f.message.contains('\u{1b}'), "{}", f.message);
    }
}
