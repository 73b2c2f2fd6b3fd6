//! A small blocking HTTP client over the host's `wasi:http/outgoing-handler`.
//!
//! ```no_run
//! use berth_sdk::http::Request;
//! # fn demo() -> Result<(), berth_sdk::types::Error> {
//! let resp = Request::post("http://127.0.0.1:8080/v1/instances")
//!     .header("accept", "application/json")
//!     .json(&serde_json::json!({"instance_type": "small"}))
//!     .send()?; // an `HttpError` becomes a `transient` error
//! if resp.status == 201 {
//!     let created: serde_json::Value = resp.json()?;
//! }
//! # Ok(()) }
//! ```
//!
//! The host decides where a request may go (the provider's allowed hosts,
//! never link-local or metadata addresses) and adds the provider's
//! credentials itself; a refused request fails with the wasi:http error code
//! `HttpRequestDenied`. The host also bounds the whole call with a deadline,
//! so the client sets no timeouts of its own.

use std::fmt;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::bindings::wasi::http::outgoing_handler;
use crate::bindings::wasi::http::types::{
    ErrorCode, Fields, IncomingBody, IncomingResponse, Method, OutgoingBody, OutgoingRequest,
    Scheme,
};
use crate::bindings::wasi::io::streams::{InputStream, OutputStream, StreamError};
use crate::types::Error;

/// Why a request failed before a response arrived, or its body could not be
/// read or decoded. An HTTP error *status* is not an `HttpError`: it is a
/// [`Response`] whose `status` says so.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HttpError {
    /// The URL is not an absolute `http` or `https` URL.
    InvalidUrl(String),
    /// The host refused a header name or value (malformed, or one the host
    /// sets itself such as `host`).
    InvalidHeader(String),
    /// The request body could not be built or sent.
    Body(String),
    /// The host's HTTP stack failed the request.
    Request {
        /// The wasi:http `error-code` case, for example `HttpRequestDenied`
        /// (destination not allowed), `ConnectionRefused` or `DnsError`.
        code: String,
        /// The case's payload, if it has one.
        detail: Option<String>,
    },
    /// The response body could not be read or decoded.
    Response(String),
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpError::InvalidUrl(m) => write!(f, "invalid url: {m}"),
            HttpError::InvalidHeader(m) => write!(f, "invalid header: {m}"),
            HttpError::Body(m) => write!(f, "request body: {m}"),
            HttpError::Request { code, detail: None } => write!(f, "request failed: {code}"),
            HttpError::Request {
                code,
                detail: Some(d),
            } => write!(f, "request failed: {code}: {d}"),
            HttpError::Response(m) => write!(f, "response: {m}"),
        }
    }
}

impl std::error::Error for HttpError {}

/// A failed request is worth retrying: it becomes a `transient` error.
impl From<HttpError> for Error {
    fn from(e: HttpError) -> Self {
        crate::error::transient(e.to_string())
    }
}

/// An absolute `http` or `https` URL split the way wasi:http wants it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Url {
    https: bool,
    authority: String,
    path_and_query: String,
}

impl Url {
    /// Parses `scheme://authority[/path][?query][#fragment]`. The scheme must
    /// be `http` or `https`; user info (`user:pass@`) is refused because
    /// credentials are the host's business; the fragment is dropped.
    pub fn parse(text: &str) -> Result<Url, HttpError> {
        let bad = |why: &str| HttpError::InvalidUrl(format!("{text:?}: {why}"));
        if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(bad("contains whitespace or control characters"));
        }
        let (scheme, rest) = text
            .split_once("://")
            .ok_or_else(|| bad("not an absolute url"))?;
        let https = match scheme.to_ascii_lowercase().as_str() {
            "http" => false,
            "https" => true,
            _ => return Err(bad("scheme must be http or https")),
        };
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        if authority.is_empty() {
            return Err(bad("no host"));
        }
        check_authority(authority).map_err(bad)?;
        let tail = tail.split_once('#').map_or(tail, |(before, _)| before);
        let path_and_query = match tail.chars().next() {
            None => "/".to_owned(),
            Some('?') => format!("/{tail}"),
            Some(_) => tail.to_owned(),
        };
        Ok(Url {
            https,
            authority: authority.to_owned(),
            path_and_query,
        })
    }

    /// Whether the scheme is `https`.
    pub fn is_https(&self) -> bool {
        self.https
    }

    /// `host` or `host:port`, as written.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// The path and query, always starting with `/`.
    pub fn path_and_query(&self) -> &str {
        &self.path_and_query
    }
}

/// Checks `host`, `host:port`, `[v6]` or `[v6]:port`.
fn check_authority(authority: &str) -> Result<(), &'static str> {
    if authority.contains('@') {
        return Err("user info is not supported; the host adds credentials");
    }
    let (host, port) = match authority.strip_prefix('[') {
        Some(rest) => {
            let (host, after) = rest.split_once(']').ok_or("unclosed [")?;
            match after.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None if after.is_empty() => (host, None),
                None => return Err("junk after ]"),
            }
        }
        None => match authority.split_once(':') {
            Some((_, port)) if port.contains(':') => {
                return Err("ipv6 addresses must be in brackets");
            }
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    if host.is_empty() {
        return Err("no host");
    }
    if port.is_some_and(|p| p.parse::<u16>().is_err()) {
        return Err("bad port");
    }
    Ok(())
}

/// Percent-encodes `text` for use as one path segment or query key or value:
/// everything but `A-Z a-z 0-9 - . _ ~` is encoded.
pub fn encode_component(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// An HTTP request being built. Nothing is sent until [`Request::send`].
#[derive(Clone, Debug)]
#[must_use = "a request does nothing until `send` is called"]
pub struct Request {
    method: Method,
    url: String,
    headers: Vec<(String, String)>,
    body: Option<Vec<u8>>,
    // A builder step that failed (e.g. JSON encoding), reported by `send`.
    error: Option<HttpError>,
}

impl Request {
    fn new(method: Method, url: &str) -> Request {
        Request {
            method,
            url: url.to_owned(),
            headers: Vec::new(),
            body: None,
            error: None,
        }
    }

    /// A `GET` of `url`.
    pub fn get(url: &str) -> Request {
        Request::new(Method::Get, url)
    }

    /// A `POST` to `url`.
    pub fn post(url: &str) -> Request {
        Request::new(Method::Post, url)
    }

    /// A `PUT` to `url`.
    pub fn put(url: &str) -> Request {
        Request::new(Method::Put, url)
    }

    /// A `PATCH` to `url`.
    pub fn patch(url: &str) -> Request {
        Request::new(Method::Patch, url)
    }

    /// A `DELETE` of `url`.
    pub fn delete(url: &str) -> Request {
        Request::new(Method::Delete, url)
    }

    /// Adds a header. Names are case-insensitive; adding one twice sends both.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Request {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Sets the body to `value` as JSON and `content-type` to `application/json`.
    pub fn json<T: Serialize + ?Sized>(mut self, value: &T) -> Request {
        match serde_json::to_vec(value) {
            Ok(bytes) => {
                self.body = Some(bytes);
                if !self
                    .headers
                    .iter()
                    .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
                {
                    self.headers
                        .push(("content-type".to_owned(), "application/json".to_owned()));
                }
            }
            Err(e) => self.error = Some(HttpError::Body(format!("json: {e}"))),
        }
        self
    }

    /// Sets the body to `bytes` as they are.
    pub fn body(mut self, bytes: impl Into<Vec<u8>>) -> Request {
        self.body = Some(bytes.into());
        self
    }

    /// Sends the request and reads the whole response. Blocks until done.
    pub fn send(self) -> Result<Response, HttpError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let url = Url::parse(&self.url)?;
        let mut headers = self.headers;
        if !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        {
            // A declared length makes the request one complete message.
            // Without it the host streams a chunked body, and a server that
            // answers before the body's end (a 404 to a DELETE, say) may
            // close the connection under the client mid-request.
            let len = self.body.as_deref().map_or(0, <[u8]>::len);
            headers.push(("content-length".to_owned(), len.to_string()));
        }
        let entries: Vec<(String, Vec<u8>)> = headers
            .into_iter()
            .map(|(k, v)| (k, v.into_bytes()))
            .collect();
        let fields = Fields::from_list(&entries)
            .map_err(|e| HttpError::InvalidHeader(format!("{e:?}").replace("HeaderError::", "")))?;
        let request = OutgoingRequest::new(fields);
        let refused = |what: &str| HttpError::InvalidUrl(format!("{:?}: {what} refused", self.url));
        request
            .set_method(&self.method)
            .map_err(|()| refused("method"))?;
        let scheme = if url.https {
            Scheme::Https
        } else {
            Scheme::Http
        };
        request
            .set_scheme(Some(&scheme))
            .map_err(|()| refused("scheme"))?;
        request
            .set_authority(Some(&url.authority))
            .map_err(|()| refused("authority"))?;
        request
            .set_path_with_query(Some(&url.path_and_query))
            .map_err(|()| refused("path"))?;
        let outgoing = request
            .body()
            .map_err(|()| HttpError::Body("body already taken".into()))?;

        // Hand the request over first and stream the body after: the host
        // reads the body while it sends, so a large body written before
        // `handle` could fill the pipe and block forever.
        let future = outgoing_handler::handle(request, None).map_err(|e| request_error(&e))?;
        let written = write_body(&outgoing, self.body.as_deref().unwrap_or_default())
            .and_then(|()| OutgoingBody::finish(outgoing, None).map_err(|e| request_error(&e)));

        let pollable = future.subscribe();
        pollable.block();
        drop(pollable);
        let incoming = match future.get() {
            Some(Ok(Ok(resp))) => resp,
            // The host's reason beats a body write failure it caused.
            Some(Ok(Err(code))) => return Err(request_error(&code)),
            // Both "not ready after block" and "already taken" are host bugs.
            Some(Err(())) | None => {
                written?;
                return Err(HttpError::Response(
                    "response future yielded nothing".into(),
                ));
            }
        };
        // A response arrived, so it is the truth about the request even if
        // writing the body failed (a server may answer before reading it all,
        // as with 413); without one, the write failure is the error.
        let _ = written;
        read_response(incoming)
    }
}

fn write_body(body: &OutgoingBody, bytes: &[u8]) -> Result<(), HttpError> {
    if bytes.is_empty() {
        return Ok(());
    }
    let stream: OutputStream = body
        .write()
        .map_err(|()| HttpError::Body("body stream already taken".into()))?;
    // `blocking-write-and-flush` takes at most 4096 bytes per call.
    for chunk in bytes.chunks(4096) {
        stream
            .blocking_write_and_flush(chunk)
            .map_err(|e| HttpError::Body(stream_error(e)))?;
    }
    Ok(())
}

fn read_response(incoming: IncomingResponse) -> Result<Response, HttpError> {
    let status = incoming.status();
    let headers = incoming
        .headers()
        .entries()
        .into_iter()
        .map(|(k, v)| {
            (
                k.to_ascii_lowercase(),
                String::from_utf8_lossy(&v).into_owned(),
            )
        })
        .collect();
    let body = incoming
        .consume()
        .map_err(|()| HttpError::Response("body already consumed".into()))?;
    let stream: InputStream = body
        .stream()
        .map_err(|()| HttpError::Response("body stream already taken".into()))?;
    let mut bytes = Vec::new();
    loop {
        match stream.blocking_read(64 * 1024) {
            Ok(chunk) => bytes.extend_from_slice(&chunk),
            Err(StreamError::Closed) => break,
            Err(e) => return Err(HttpError::Response(stream_error(e))),
        }
    }
    // The stream is a child of the body: it must go first.
    drop(stream);
    drop(IncomingBody::finish(body));
    Ok(Response {
        status,
        headers,
        body: bytes,
    })
}

fn stream_error(e: StreamError) -> String {
    match e {
        StreamError::Closed => "stream closed".to_owned(),
        StreamError::LastOperationFailed(err) => {
            match crate::bindings::wasi::http::types::http_error_code(&err) {
                Some(code) => request_error(&code).to_string(),
                None => err.to_debug_string(),
            }
        }
    }
}

/// Turns a wasi:http `error-code` into an [`HttpError::Request`] named after its case.
fn request_error(code: &ErrorCode) -> HttpError {
    if let ErrorCode::InternalError(Some(m)) = code {
        return HttpError::Request {
            code: "InternalError".into(),
            detail: Some(m.clone()),
        };
    }
    let (code, detail) = split_debug(&format!("{code:?}"));
    HttpError::Request { code, detail }
}

/// `ErrorCode::DnsError(DnsErrorPayload { .. })` -> (`DnsError`, `DnsErrorPayload { .. }`).
fn split_debug(debug: &str) -> (String, Option<String>) {
    let debug = debug.strip_prefix("ErrorCode::").unwrap_or(debug);
    match debug.split_once('(') {
        Some((name, rest)) => (
            name.to_owned(),
            Some(rest.strip_suffix(')').unwrap_or(rest).to_owned()),
        ),
        None => (debug.to_owned(), None),
    }
}

/// A response: status, headers (names lowercased) and the whole body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// The HTTP status code.
    pub status: u16,
    /// Headers in the order received, names lowercased.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body decoded as JSON.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, HttpError> {
        serde_json::from_slice(&self.body)
            .map_err(|e| HttpError::Response(format!("status {}: bad json: {e}", self.status)))
    }

    /// The body as text; invalid UTF-8 is replaced.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, expect: Result<(bool, &str, &str), &str>) {
        let got =
            Url::parse(text).map(|u| (u.https, u.authority.clone(), u.path_and_query.clone()));
        match expect {
            Ok((https, auth, path)) => {
                assert_eq!(got, Ok((https, auth.to_owned(), path.to_owned())), "{text}")
            }
            Err(why) => match got {
                Err(HttpError::InvalidUrl(m)) => assert!(m.contains(why), "{text}: {m}"),
                other => panic!("{text}: expected error containing {why:?}, got {other:?}"),
            },
        }
    }

    #[test]
    fn url_parse() {
        check("http://127.0.0.1:8080", Ok((false, "127.0.0.1:8080", "/")));
        check("http://127.0.0.1:8080/", Ok((false, "127.0.0.1:8080", "/")));
        check(
            "HTTPS://api.example.com/v1/x?a=1&b=2",
            Ok((true, "api.example.com", "/v1/x?a=1&b=2")),
        );
        check("http://h?x=1", Ok((false, "h", "/?x=1")));
        check("http://h/p#frag", Ok((false, "h", "/p")));
        check("http://h#frag", Ok((false, "h", "/")));
        check("http://[::1]:9000/a", Ok((false, "[::1]:9000", "/a")));
        check("http://[::1]/a", Ok((false, "[::1]", "/a")));
        check(
            "https://169.254.169.254/latest/meta-data/",
            Ok((true, "169.254.169.254", "/latest/meta-data/")),
        );
        check("ftp://h/", Err("scheme must be http or https"));
        check("127.0.0.1:8080", Err("not an absolute url"));
        check("http:///path", Err("no host"));
        check("http://user:pw@h/", Err("user info"));
        check("http://h:notaport/", Err("bad port"));
        check("http://h:99999/", Err("bad port"));
        check("http://:80/", Err("no host"));
        check("http://h:/", Err("bad port"));
        check("http://[::1/", Err("unclosed"));
        check("http://::1/", Err("brackets"));
        check("http://h/a b", Err("whitespace"));
        check("http://h/\n", Err("whitespace"));
    }

    #[test]
    fn encode() {
        assert_eq!(encode_component("berth-pool"), "berth-pool");
        assert_eq!(encode_component("a b/c?d=e&f"), "a%20b%2Fc%3Fd%3De%26f");
        assert_eq!(encode_component("tag:x"), "tag%3Ax");
        assert_eq!(encode_component("é"), "%C3%A9");
        assert_eq!(encode_component("A-z_0.9~"), "A-z_0.9~");
    }

    #[test]
    fn error_code_names() {
        assert_eq!(
            split_debug("ErrorCode::HttpRequestDenied"),
            ("HttpRequestDenied".into(), None)
        );
        assert_eq!(
            split_debug("ErrorCode::DnsError(DnsErrorPayload { rcode: None })"),
            (
                "DnsError".into(),
                Some("DnsErrorPayload { rcode: None }".into())
            )
        );
        let e = request_error(&ErrorCode::HttpRequestDenied);
        assert_eq!(e.to_string(), "request failed: HttpRequestDenied");
        let e = request_error(&ErrorCode::InternalError(Some("boom".into())));
        assert_eq!(e.to_string(), "request failed: InternalError: boom");
        let e = request_error(&ErrorCode::ConnectionRefused);
        let err: Error = e.into();
        assert!(
            matches!(err, Error::Transient(ref m) if m.contains("ConnectionRefused")),
            "{err:?}"
        );
    }

    #[test]
    fn request_builder() {
        let r = Request::post("http://h/x").json(&serde_json::json!({"a": 1}));
        assert_eq!(r.body.as_deref(), Some(&br#"{"a":1}"#[..]));
        assert_eq!(
            r.headers,
            vec![("content-type".to_owned(), "application/json".to_owned())]
        );
        let r = Request::put("http://h/x")
            .header("Content-Type", "text/plain")
            .json(&1);
        assert_eq!(r.headers.len(), 1);
    }

    #[test]
    fn response_helpers() {
        let resp = Response {
            status: 429,
            headers: vec![("retry-after".into(), "2".into())],
            body: br#"{"n": 3}"#.to_vec(),
        };
        assert!(!resp.is_success());
        assert_eq!(resp.header("Retry-After"), Some("2"));
        assert_eq!(resp.json::<serde_json::Value>().unwrap()["n"], 3);
        assert_eq!(resp.text(), r#"{"n": 3}"#);
        assert!(matches!(
            resp.json::<Vec<u8>>(),
            Err(HttpError::Response(_))
        ));
    }
}
