//! `/ui`: the operator's page, served by berth itself from files carried in
//! the binary (`crates/server/ui/`): no CDN, nothing fetched at run time.
//! The page reads the API under `/v1` and follows `GET /v1/events`.
//!
//! **Signing in.** With tokens configured, the page posts an API token to
//! `POST /ui/login`, which checks it and sets it in a cookie
//! ([`COOKIE`]: `HttpOnly`, `SameSite=Strict`, `Secure` over TLS), hex
//! encoded; the page's script never holds it. [`cookie_auth`] turns that
//! cookie into the `Authorization` header every handler (and a relay to the
//! pool's holder) reads, so the page sees and may do exactly what its
//! token may. Without tokens (a loopback address only), the page is open,
//! as the API is.
//!
//! **CSRF.** A call that changes something and is signed in by the cookie
//! must carry `X-Berth-CSRF`, a value derived from the token that only the
//! page can read (`GET /ui/session`, same-origin). And any call that
//! changes something from a browser on another origin (its `Origin` or
//! `Sec-Fetch-Site` says so) is refused, with tokens or without, so a page
//! elsewhere cannot make a berth on this host act.

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;

use super::auth;
use super::error::{ApiError, Result};
use super::state::Api;
use berth_types::ErrorCode;

/// The cookie that holds the page's token.
pub const COOKIE: &str = "berth_token";

/// The header a cookie-signed call that changes something must carry.
pub const CSRF_HEADER: &str = "x-berth-csrf";

const INDEX: &str = include_str!("../../ui/index.html");
const SCRIPT: &str = include_str!("../../ui/app.js");
const STYLE: &str = include_str!("../../ui/app.css");

/// What the page's own files may load: themselves, and the API.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                      connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
                      form-action 'self'; frame-ancestors 'none'";

/// The page's routes.
pub(super) fn routes() -> axum::Router<Api> {
    axum::Router::new()
        .route("/ui", get(index))
        .route("/ui/", get(index))
        .route("/ui/app.js", get(script))
        .route("/ui/app.css", get(style))
        .route("/ui/session", get(session))
        .route("/ui/login", post(login))
        .route("/ui/logout", post(logout))
}

fn file(content_type: &'static str, body: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    r
}

async fn index() -> Response {
    file("text/html; charset=utf-8", INDEX)
}

async fn script() -> Response {
    file("text/javascript; charset=utf-8", SCRIPT)
}

async fn style() -> Response {
    file("text/css; charset=utf-8", STYLE)
}

/// Whether the page is signed in (`signed_in`), and as whom: `name`,
/// `role`, the `csrf` value its changes carry, and `open` (no tokens: no
/// sign-in). Not signed in is an answer, not an error, so that a page
/// opened before signing in logs none.
async fn session(State(api): State<Api>, headers: HeaderMap) -> Response {
    let open = !api.tokens_configured();
    let body = match api.caller(&headers) {
        Ok(caller) => serde_json::json!({
            "signed_in": true,
            "name": caller.name(),
            "role": caller.role(),
            "csrf": auth::bearer(&headers).map(csrf).unwrap_or_default(),
            "open": open,
        }),
        Err(_) => serde_json::json!({"signed_in": false, "open": open}),
    };
    super::edge::json(StatusCode::OK, body)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Login {
    token: String,
}

/// Checks the token and keeps it in the page's cookie.
async fn login(State(api): State<Api>, body: Bytes) -> Result<Response> {
    let Login { token } = super::edge::body(&body)?;
    let caller = api.caller_of(&token)?;
    let secure = if api.settings().tls.is_some() {
        "; Secure"
    } else {
        ""
    };
    let cookie = format!(
        "{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict{secure}",
        hex::encode(token.as_bytes())
    );
    let mut r = super::edge::json(
        StatusCode::OK,
        serde_json::json!({"name": caller.name(), "role": caller.role()}),
    );
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&cookie).expect("hex is a cookie value"),
    );
    Ok(r)
}

/// Forgets the page's cookie.
async fn logout() -> Response {
    let mut r = StatusCode::NO_CONTENT.into_response();
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&format!(
            "{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"
        ))
        .expect("a cookie value"),
    );
    r
}

/// The CSRF value of a token: not the token, and not to be had without it.
fn csrf(token: &str) -> String {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    h.update(b"berth csrf\0");
    h.update(token.as_bytes());
    hex::encode(&h.finalize()[..16])
}

/// The page's token, from its cookie.
fn from_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .and_then(|(_, value)| hex::decode(value).ok())
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .filter(|t| !t.is_empty())
}

/// Whether a browser says this call comes from a page of another origin.
fn cross_origin(headers: &HeaderMap) -> bool {
    let site = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok());
    if matches!(site, Some("cross-site" | "same-site")) {
        return true;
    }
    let (Some(origin), Some(host)) = (
        headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()),
        headers.get(header::HOST).and_then(|v| v.to_str().ok()),
    ) else {
        return false;
    };
    // `null` (a sandboxed frame, a file) is another origin too.
    let origin_host = origin
        .split_once("://")
        .map(|(_, rest)| rest.trim_end_matches('/'));
    origin_host != Some(host)
}

/// Whether a browser sent this call: browsers send `Origin` or
/// `Sec-Fetch-Mode` with what a page asks for; other clients neither.
fn from_browser(headers: &HeaderMap) -> bool {
    headers.contains_key(header::ORIGIN) || headers.contains_key("sec-fetch-mode")
}

/// Whether the `Host` a call names is this host's loopback: an address of
/// 127.0.0.0/8 or `::1`, or `localhost`, with any port.
fn loopback_host(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| berth_config::canonical_ip(ip).is_loopback())
}

/// The middleware: a call from a page of another origin that changes
/// something is refused; without tokens, a browser's call is answered only
/// at a loopback name (a page of a name that resolves to 127.0.0.1 is
/// another site, whatever the browser takes for its origin: DNS
/// rebinding); a call signed in by the page's cookie (and no
/// `Authorization` of its own) goes on with the cookie's token as its
/// bearer token, once its CSRF header matches if it changes something.
pub(super) async fn cookie_auth(
    State(api): State<Api>,
    mut request: Request,
    next: Next,
) -> Response {
    let changes = !matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    );
    let headers = request.headers();
    if changes && cross_origin(headers) {
        return forbidden("a call from a page of another origin may not change anything");
    }
    if from_browser(headers) && !loopback_host(headers) && !api.tokens_configured() {
        return forbidden(
            "berth has no api.tokens, so it answers a browser only at a loopback address \
             (127.0.0.1, [::1] or localhost); configure tokens to reach it by another name",
        );
    }
    if headers.contains_key(header::AUTHORIZATION) {
        return next.run(request).await;
    }
    let Some(token) = from_cookie(headers) else {
        return next.run(request).await;
    };
    // Signing in and out change only the cookie itself (a stale cookie
    // must not keep a page from signing in again).
    let path = request.uri().path();
    if changes && path != "/ui/login" && path != "/ui/logout" {
        let sent = headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok());
        if sent != Some(csrf(&token).as_str()) {
            return forbidden(
                "a call signed in by the page's cookie that changes something must carry the \
                 page's X-Berth-CSRF header",
            );
        }
    }
    if let Ok(value) = HeaderValue::from_str(&format!("Bearer {token}")) {
        request.headers_mut().insert(header::AUTHORIZATION, value);
    }
    next.run(request).await
}

fn forbidden(message: &str) -> Response {
    ApiError::new(StatusCode::FORBIDDEN, ErrorCode::Forbidden, message).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn the_cookie_holds_the_token_hex_encoded_among_others() {
        let token = "a token; with=odd chars";
        let cookie = format!("other=1; {COOKIE}={}; x=y", hex::encode(token));
        assert_eq!(
            from_cookie(&headers(&[("cookie", &cookie)])).as_deref(),
            Some(token)
        );
        assert_eq!(from_cookie(&headers(&[("cookie", "berth_token=zz")])), None);
        assert_eq!(from_cookie(&headers(&[("cookie", "berth_token=")])), None);
        assert_ne!(csrf(token), csrf("another token"));
        assert!(!csrf(token).contains(&hex::encode(token)));
    }

    #[test]
    fn a_loopback_host_is_an_address_of_it_or_localhost() {
        for host in [
            "127.0.0.1:8080",
            "127.1.2.3",
            "[::1]:80",
            "localhost:8080",
            "LOCALHOST",
        ] {
            assert!(loopback_host(&headers(&[("host", host)])), "{host}");
        }
        for host in [
            "evil.example:8080",
            "10.0.0.5:80",
            "[::2]:80",
            "localhost.evil.example",
        ] {
            assert!(!loopback_host(&headers(&[("host", host)])), "{host}");
        }
        assert!(!loopback_host(&HeaderMap::new()));
    }

    #[test]
    fn a_browser_call_from_another_origin_is_told_apart() {
        let host = ("host", "127.0.0.1:8080");
        assert!(!cross_origin(&headers(&[host])));
        assert!(!cross_origin(&headers(&[
            host,
            ("origin", "http://127.0.0.1:8080")
        ])));
        assert!(cross_origin(&headers(&[
            host,
            ("origin", "http://evil.example")
        ])));
        assert!(cross_origin(&headers(&[host, ("origin", "null")])));
        assert!(cross_origin(&headers(&[
            host,
            ("sec-fetch-site", "cross-site")
        ])));
        assert!(!cross_origin(&headers(&[
            host,
            ("sec-fetch-site", "same-origin")
        ])));
    }
}
