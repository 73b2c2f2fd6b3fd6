//! Credentials the host adds to a driver's outbound requests, so that the
//! driver never holds a secret.
//!
//! A provider's config names, per host, how its requests are authenticated:
//! AWS Signature Version 4, a bearer token, or a header with a key. The
//! driver sends its requests unsigned; the outbound hook (`sandbox::Hooks`)
//! finds the credential whose host matches, removes whatever the guest put
//! in the headers that credential owns, and authenticates the request on the
//! way out. The guest sees neither the secret nor the added headers: it holds
//! only the response.
//!
//! Credentials are added only over HTTPS, or over plain HTTP to a loopback
//! address (a local test server): a token must not cross a network in the
//! clear.

use std::net::IpAddr;

use hmac::{Hmac, Mac};
use http::header::{AUTHORIZATION, HOST, HeaderName, HeaderValue};
use sha2::{Digest, Sha256};

use berth_config::{Auth, Credential, Secret};

/// The headers a credential owns: a guest's own values for them are
/// removed before it is applied.
fn owned_headers(auth: &Auth) -> Vec<HeaderName> {
    match auth {
        Auth::AwsSigV4 { .. } => vec![
            AUTHORIZATION,
            HeaderName::from_static("x-amz-date"),
            HeaderName::from_static("x-amz-security-token"),
            HeaderName::from_static("x-amz-content-sha256"),
        ],
        Auth::Header { name, .. } => vec![name.clone()],
    }
}

/// Why a credential was not applied.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotApplied {
    #[error(
        "credentials for {0} are only sent over HTTPS or to a loopback address; the request was plain HTTP"
    )]
    Insecure(String),
    #[error("the request body is over {0} bytes, too large to sign")]
    BodyTooLarge(usize),
}

/// The largest body the host reads to sign.
pub const MAX_SIGNED_BODY: usize = 8 << 20;

/// The credential for a request to `host`:`port`, if any: the first that
/// matches, in config order.
pub fn find<'c>(credentials: &'c [Credential], host: &str, port: u16) -> Option<&'c Credential> {
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    credentials.iter().find(|c| c.host.matches(&host, port))
}

/// Whether a request to `host` over `https` may carry a credential.
pub fn may_send(host: &str, https: bool) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    https
        || host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Authenticates `parts` (whose body is `body`) with `auth` at `now_ms`.
/// Headers the credential owns that the guest set are replaced.
pub fn apply(auth: &Auth, parts: &mut http::request::Parts, body: &[u8], now_ms: u64) {
    for h in owned_headers(auth) {
        parts.headers.remove(h);
    }
    match auth {
        Auth::Header { name, value } => {
            if let Ok(mut v) = HeaderValue::from_str(value.expose()) {
                v.set_sensitive(true);
                parts.headers.insert(name.clone(), v);
            }
        }
        Auth::AwsSigV4 {
            access_key_id,
            secret_access_key,
            session_token,
            region,
            service,
        } => {
            let signer = SigV4 {
                access_key_id,
                secret: secret_access_key.expose(),
                session_token: session_token.as_ref().map(Secret::expose),
                region,
                service,
            };
            signer.sign(parts, body, now_ms);
        }
    }
}

type HmacSha256 = Hmac<Sha256>;

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes a key of any length");
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// One signing of AWS Signature Version 4.
struct SigV4<'a> {
    access_key_id: &'a str,
    secret: &'a str,
    session_token: Option<&'a str>,
    region: &'a str,
    service: &'a str,
}

impl SigV4<'_> {
    fn sign(&self, parts: &mut http::request::Parts, body: &[u8], now_ms: u64) {
        // 2026-11-23T11:04:05.123Z → 20261123T110405Z
        let stamp: String = berth_core::duration::rfc3339(now_ms)
            .chars()
            .take(19)
            .filter(|c| c.is_ascii_alphanumeric())
            .chain(std::iter::once('Z'))
            .collect();
        let date = &stamp[..8];
        let payload = sha256_hex(body);
        let set = |parts: &mut http::request::Parts, name: &'static str, value: &str| {
            if let Ok(v) = HeaderValue::from_str(value) {
                parts.headers.insert(HeaderName::from_static(name), v);
            }
        };
        set(parts, "x-amz-date", &stamp);
        if let Some(t) = self.session_token {
            set(parts, "x-amz-security-token", t);
        }
        if !parts.headers.contains_key(HOST)
            && let Some(a) = parts.uri.authority()
            && let Ok(v) = HeaderValue::from_str(a.as_str())
        {
            parts.headers.insert(HOST, v);
        }

        // Every header is signed, so none can be changed on the way.
        let mut headers: Vec<(String, String)> = Vec::new();
        for name in parts.headers.keys() {
            let values: Vec<String> = parts
                .headers
                .get_all(name)
                .iter()
                .map(|v| collapse(&String::from_utf8_lossy(v.as_bytes())))
                .collect();
            headers.push((name.as_str().to_ascii_lowercase(), values.join(",")));
        }
        headers.sort();
        let signed: Vec<&str> = headers.iter().map(|(k, _)| k.as_str()).collect();
        let signed = signed.join(";");
        let canonical_headers: String = headers.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
        let canonical = format!(
            "{}\n{}\n{}\n{}\n{}\n{}",
            parts.method.as_str(),
            canonical_path(parts.uri.path()),
            canonical_query(parts.uri.query().unwrap_or("")),
            canonical_headers,
            signed,
            payload
        );
        let scope = format!("{date}/{}/{}/aws4_request", self.region, self.service);
        let to_sign = format!(
            "AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{}",
            sha256_hex(canonical.as_bytes())
        );
        let k_date = hmac(format!("AWS4{}", self.secret).as_bytes(), date.as_bytes());
        let k_region = hmac(&k_date, self.region.as_bytes());
        let k_service = hmac(&k_region, self.service.as_bytes());
        let k_signing = hmac(&k_service, b"aws4_request");
        let signature = hex::encode(hmac(&k_signing, to_sign.as_bytes()));
        let authorization = format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={signature}",
            self.access_key_id
        );
        if let Ok(mut v) = HeaderValue::from_str(&authorization) {
            v.set_sensitive(true);
            parts.headers.insert(AUTHORIZATION, v);
        }
    }
}

/// A header value trimmed, with runs of spaces made one.
fn collapse(v: &str) -> String {
    v.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// RFC 3986 encoding as SigV4 wants it: everything but unreserved characters.
fn encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b'/' if keep_slash => out.push('/'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Decodes `%XX` escapes (and, in a query, `+` as a space is not assumed:
/// SigV4 takes the query as sent).
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(h) = s.get(i + 1..i + 3)
            && let Ok(b) = u8::from_str_radix(h, 16)
        {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The path with each segment normalised and encoded once (non-S3 services
/// sign the path encoded twice; the path is sent encoded once, so encoding
/// the decoded segments once more here gives the same).
fn canonical_path(path: &str) -> String {
    if path.is_empty() {
        return "/".into();
    }
    path.split('/')
        .map(|seg| encode(&encode(&decode(seg), false), false))
        .collect::<Vec<_>>()
        .join("/")
}

/// The query's pairs decoded, encoded again, sorted.
fn canonical_query(q: &str) -> String {
    let mut pairs: Vec<(String, String)> = q
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (encode(&decode(k), false), encode(&decode(v), false))
        })
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_config::AllowedHost;

    fn parts(method: &str, uri: &str, headers: &[(&str, &str)]) -> http::request::Parts {
        let mut b = http::Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";

    fn aws(service: &str) -> Auth {
        Auth::AwsSigV4 {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: Secret::new(SECRET),
            session_token: None,
            region: "us-east-1".into(),
            service: service.into(),
        }
    }

    /// 2015-08-30T12:36:00Z, the instant of AWS's published examples.
    const EXAMPLE_MS: u64 = 1_440_938_160_000;

    #[test]
    fn sigv4_matches_the_published_get_vanilla_example() {
        let mut p = parts("GET", "https://example.amazonaws.com/", &[]);
        p.headers
            .insert(HOST, HeaderValue::from_static("example.amazonaws.com"));
        let signer = SigV4 {
            access_key_id: "AKIDEXAMPLE",
            secret: SECRET,
            session_token: None,
            region: "us-east-1",
            service: "service",
        };
        signer.sign(&mut p, b"", EXAMPLE_MS);
        let auth = p.headers[AUTHORIZATION].to_str().unwrap().to_owned();
        assert_eq!(
            auth,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
             SignedHeaders=host;x-amz-date, Signature=\
             5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
            "{auth}"
        );
        assert_eq!(p.headers["x-amz-date"], "20150830T123600Z");
    }

    #[test]
    fn canonical_forms() {
        assert_eq!(canonical_query("b=2&a=1&a=0"), "a=0&a=1&b=2");
        assert_eq!(canonical_query("k=a b"), "k=a%20b");
        assert_eq!(canonical_query("k=a%2Fb&x"), "k=a%2Fb&x=");
        assert_eq!(canonical_path(""), "/");
        assert_eq!(canonical_path("/"), "/");
        assert_eq!(canonical_path("/a b/c"), "/a%2520b/c");
        assert_eq!(encode("Tag:berth-pool", false), "Tag%3Aberth-pool");
    }

    #[test]
    fn a_guest_cannot_choose_the_owned_headers() {
        let mut p = parts(
            "POST",
            "http://127.0.0.1:5000/",
            &[
                ("authorization", "AWS4-HMAC-SHA256 forged"),
                ("x-amz-date", "19990101T000000Z"),
                ("host", "127.0.0.1:5000"),
            ],
        );
        apply(&aws("ec2"), &mut p, b"Action=DescribeInstances", EXAMPLE_MS);
        let auth = p.headers.get_all(AUTHORIZATION).iter().count();
        assert_eq!(auth, 1);
        assert!(
            p.headers[AUTHORIZATION]
                .to_str()
                .unwrap()
                .contains("Credential=AKIDEXAMPLE/20150830/us-east-1/ec2/aws4_request")
        );
        assert_eq!(p.headers["x-amz-date"], "20150830T123600Z");
        assert!(p.headers[AUTHORIZATION].is_sensitive());

        let mut p = parts("GET", "https://api.example.com/", &[("x-api-key", "guess")]);
        let header = Auth::Header {
            name: HeaderName::from_static("x-api-key"),
            value: Secret::new("s3cr3t-value"),
        };
        apply(&header, &mut p, b"", 0);
        assert_eq!(p.headers.get_all("x-api-key").iter().count(), 1);
        assert_eq!(p.headers["x-api-key"], "s3cr3t-value");
    }

    #[test]
    fn credentials_go_only_where_they_may() {
        assert!(may_send("api.example.com", true));
        assert!(!may_send("api.example.com", false));
        assert!(may_send("127.0.0.1", false));
        assert!(may_send("[::1]", false));
        assert!(may_send("localhost", false));
        assert!(!may_send("10.0.0.1", false));
        let creds = vec![Credential {
            host: AllowedHost::parse("*.amazonaws.com").unwrap(),
            auth: aws("ec2"),
        }];
        assert!(find(&creds, "ec2.us-east-1.amazonaws.com", 443).is_some());
        assert!(find(&creds, "EC2.US-EAST-1.AMAZONAWS.COM", 443).is_some());
        assert!(find(&creds, "amazonaws.com.evil.example", 443).is_none());
        assert!(!format!("{:?}", creds[0]).contains(SECRET));
    }
}
