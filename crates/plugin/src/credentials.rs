//! Credentials the host adds to a driver's outbound requests, so that the
//! driver never holds a secret.
//!
//! A provider's config names, per host, how its requests are authenticated:
//! AWS Signature Version 4, a bearer token, or a header with a key. The
//! driver sends its requests unsigned; the outbound hook (`sandbox::Hooks`)
//! finds the credential whose host matches, removes whatever the guest put
//! in the headers that credential owns, and authenticates the request on the
//! way out. The guest sees neither the secret nor the added headers: it holds
//! only the response, from which the secrets are masked ([`crate::scrub`])
//! in case the server echoes the request.
//!
//! Credentials are added only over HTTPS, or over plain HTTP to a loopback
//! address (a local test server): a token must not cross a network in the
//! clear.

use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4::SigningParams;
use http::header::{AUTHORIZATION, HOST, HeaderName, HeaderValue};

use berth_config::{Secret, canonical_ip};

/// What a credential puts on a request, its secrets read: from the config
/// and files for the kinds that sign or send a fixed value, from the
/// latest exchange for the kinds exchanged for tokens
/// ([`crate::tokens`]).
#[derive(Clone, Debug)]
pub enum Material {
    /// AWS Signature Version 4.
    AwsSigV4 {
        access_key_id: String,
        secret_access_key: Secret,
        session_token: Option<Secret>,
        region: String,
        service: String,
    },
    /// `name: value`.
    Header { name: HeaderName, value: Secret },
    /// TLS with a client certificate ([`crate::mtls`]); nothing is added
    /// to the request itself.
    ClientTls(std::sync::Arc<rustls::ClientConfig>),
}

/// The headers a credential owns: a guest's own values for them are
/// removed before it is applied.
fn owned_headers(auth: &Material) -> Vec<HeaderName> {
    match auth {
        Material::AwsSigV4 { .. } => vec![
            AUTHORIZATION,
            HeaderName::from_static("x-amz-date"),
            HeaderName::from_static("x-amz-security-token"),
            HeaderName::from_static("x-amz-content-sha256"),
        ],
        Material::Header { name, .. } => vec![name.clone()],
        Material::ClientTls(_) => Vec::new(),
    }
}

/// The secret bytes `auth` puts on a request, each as it goes out: what no
/// response may show the guest ([`crate::scrub`]). A header's value, and for
/// a value of the form `SCHEME CREDENTIALS` (`Bearer …`) the credentials
/// alone too; for SigV4 the session token. A SigV4 signature is not among
/// them: it is good for the one request it signs, and the key it is made
/// with is never sent.
pub fn sent_secrets(auth: &Material) -> Vec<Vec<u8>> {
    match auth {
        Material::Header { value, .. } => {
            let value = value.expose();
            let mut out = vec![value.as_bytes().to_vec()];
            if let Some((scheme, rest)) = value.split_once(' ')
                && !scheme.is_empty()
                && scheme
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !rest.trim().is_empty()
            {
                out.push(rest.trim().as_bytes().to_vec());
            }
            out
        }
        Material::AwsSigV4 { session_token, .. } => session_token
            .iter()
            .map(|t| t.expose().as_bytes().to_vec())
            .collect(),
        // The key never leaves the host: TLS proves it has it.
        Material::ClientTls(_) => Vec::new(),
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
    #[error("the request could not be signed: {0}")]
    Unsignable(String),
}

/// The largest body the host reads to sign.
pub const MAX_SIGNED_BODY: usize = 8 << 20;

/// Whether a request to `host` over `https` may carry a credential.
pub fn may_send(host: &str, https: bool) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    https
        || host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<IpAddr>()
            .is_ok_and(|ip| canonical_ip(ip).is_loopback())
}

/// Authenticates `parts` (whose body is `body`) with `auth` at `now_ms`.
/// Headers the credential owns that the guest set are replaced. A request
/// that cannot be signed (a header that is not text, no host) is refused
/// rather than sent unsigned.
pub fn apply(
    auth: &Material,
    parts: &mut http::request::Parts,
    body: &[u8],
    now_ms: u64,
) -> Result<(), NotApplied> {
    for h in owned_headers(auth) {
        parts.headers.remove(h);
    }
    match auth {
        Material::Header { name, value } => {
            if let Ok(mut v) = HeaderValue::from_str(value.expose()) {
                v.set_sensitive(true);
                parts.headers.insert(name.clone(), v);
            }
            Ok(())
        }
        Material::AwsSigV4 {
            access_key_id,
            secret_access_key,
            session_token,
            region,
            service,
        } => {
            let credentials = Credentials::new(
                access_key_id,
                secret_access_key.expose(),
                session_token.as_ref().map(|t| t.expose().to_owned()),
                None,
                "berth",
            );
            let at = SystemTime::UNIX_EPOCH + Duration::from_millis(now_ms);
            sigv4(credentials, region, service, parts, body, at).map_err(NotApplied::Unsignable)
        }
        Material::ClientTls(_) => Ok(()),
    }
}

/// Signs `parts` with AWS Signature Version 4 (`aws-sigv4`) at `at`, and
/// adds `x-amz-date`, `authorization` and, with a session token,
/// `x-amz-security-token`.
fn sigv4(
    credentials: Credentials,
    region: &str,
    service: &str,
    parts: &mut http::request::Parts,
    body: &[u8],
    at: SystemTime,
) -> Result<(), String> {
    // The host is signed as the request names it and sent as signed: a
    // plain HTTP request later goes to the checked address instead.
    if !parts.headers.contains_key(HOST) {
        let authority = parts.uri.authority().ok_or("the request names no host")?;
        let host = HeaderValue::from_str(authority.as_str()).map_err(|e| e.to_string())?;
        parts.headers.insert(HOST, host);
    }
    let headers = parts
        .headers
        .iter()
        .map(|(name, value)| Ok((name.as_str(), std::str::from_utf8(value.as_bytes())?)))
        .collect::<Result<Vec<_>, std::str::Utf8Error>>()
        .map_err(|_| "a header value is not UTF-8".to_owned())?;
    let request = SignableRequest::new(
        parts.method.as_str(),
        parts.uri.to_string(),
        headers.into_iter(),
        SignableBody::Bytes(body),
    )
    .map_err(|e| e.to_string())?;
    // Every header is signed (by default a few that proxies may change are
    // left out), so none can be changed on the way.
    let mut settings = SigningSettings::default();
    settings.excluded_headers = None;
    let identity = credentials.into();
    let params = SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(service)
        .time(at)
        .settings(settings)
        .build()
        .map_err(|e| e.to_string())?
        .into();
    let (instructions, _signature) = sign(request, &params)
        .map_err(|e| e.to_string())?
        .into_parts();
    let (add, _query) = instructions.into_parts();
    for header in add {
        let mut value = HeaderValue::from_str(header.value()).map_err(|e| e.to_string())?;
        value.set_sensitive(header.sensitive() || header.name() == AUTHORIZATION);
        parts.headers.insert(header.name(), value);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_config::Secret;

    fn parts(method: &str, uri: &str, headers: &[(&str, &str)]) -> http::request::Parts {
        let mut b = http::Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";

    fn aws(service: &str) -> Material {
        Material::AwsSigV4 {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: Secret::new(SECRET),
            session_token: None,
            region: "us-east-1".into(),
            service: service.into(),
        }
    }

    /// [`aws`] with temporary credentials: a session token.
    fn temporary(service: &str, token: &str) -> Material {
        match aws(service) {
            Material::AwsSigV4 {
                access_key_id,
                secret_access_key,
                region,
                service,
                ..
            } => Material::AwsSigV4 {
                access_key_id,
                secret_access_key,
                session_token: Some(Secret::new(token)),
                region,
                service,
            },
            other => other,
        }
    }

    /// 2015-08-30T12:36:00Z, the instant of AWS's published examples.
    const EXAMPLE_MS: u64 = 1_440_938_160_000;

    /// A request of the published Signature Version 4 test suite signed
    /// through [`apply`] (`AKIDEXAMPLE`, us-east-1, service `service`, at
    /// [`EXAMPLE_MS`], body not signed so empty), and its `Authorization`.
    fn suite(
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        auth: &Material,
    ) -> (http::request::Parts, String) {
        let mut p = parts(
            method,
            &format!("https://example.amazonaws.com{path}"),
            headers,
        );
        apply(auth, &mut p, b"", EXAMPLE_MS).unwrap();
        let authorization = p.headers[AUTHORIZATION].to_str().unwrap().to_owned();
        (p, authorization)
    }

    fn expect(signed_headers: &str, signature: &str) -> String {
        format!(
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
             SignedHeaders={signed_headers}, Signature={signature}"
        )
    }

    #[test]
    fn sigv4_matches_the_published_get_vanilla_example() {
        let (p, auth) = suite(
            "GET",
            "/",
            &[("host", "example.amazonaws.com")],
            &aws("service"),
        );
        assert_eq!(
            auth,
            expect(
                "host;x-amz-date",
                "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
            )
        );
        assert_eq!(p.headers["x-amz-date"], "20150830T123600Z");
        // The host is taken from the URI when the request has none.
        let (p, auth2) = suite("GET", "/", &[], &aws("service"));
        assert_eq!(auth2, auth);
        assert_eq!(p.headers[HOST], "example.amazonaws.com");
    }

    #[test]
    fn sigv4_matches_the_published_suite() {
        let host = ("host", "example.amazonaws.com");
        for (name, method, path, headers, signed, signature) in [
            (
                "get-vanilla-query-order-key-case",
                "GET",
                "/?Param2=value2&Param1=value1",
                &[host][..],
                "host;x-amz-date",
                "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500",
            ),
            (
                "get-vanilla-query-order-encoded",
                "GET",
                "/?Param-3=Value3&Param=Value2&%E1%88%B4=Value1",
                &[host][..],
                "host;x-amz-date",
                "371d3713e185cc334048618a97f809c9ffe339c62934c032af5a0e595648fcac",
            ),
            (
                "get-vanilla-utf8-query",
                "GET",
                "/?%E1%88%B4=bar",
                &[host][..],
                "host;x-amz-date",
                "2cdec8eed098649ff3a119c94853b13c643bcf08f8b0a1d91e12c9027818dd04",
            ),
            (
                "post-vanilla-query",
                "POST",
                "/?Param1=value1",
                &[host][..],
                "host;x-amz-date",
                "28038455d6de14eafc1f9222cf5aa6f1a96197d7deb8263271d420d138af7f11",
            ),
            (
                "get-header-value-trim",
                "GET",
                "/",
                &[
                    host,
                    ("my-header1", "value1"),
                    ("my-header2", "\"a   b   c\""),
                ][..],
                "host;my-header1;my-header2;x-amz-date",
                "acc3ed3afb60bb290fc8d2dd0098b9911fcaa05412b367055dee359757a9c736",
            ),
            (
                "get-header-key-duplicate",
                "GET",
                "/",
                &[
                    host,
                    ("my-header1", "value2"),
                    ("my-header1", "value2"),
                    ("my-header1", "value1"),
                ][..],
                "host;my-header1;x-amz-date",
                "c9d5ea9f3f72853aea855b47ea873832890dbdd183b4468f858259531a5138ea",
            ),
        ] {
            let (_, auth) = suite(method, path, headers, &aws("service"));
            assert_eq!(auth, expect(signed, signature), "{name}");
        }
    }

    #[test]
    fn sigv4_matches_the_published_session_token_example() {
        let token = "6e86291e8372ff2a2260956d9b8aae1d763fbf315fa00fa31553b73ebf194267";
        let auth = temporary("service", token);
        let guest = [
            ("host", "example.amazonaws.com"),
            ("x-amz-security-token", "guess"),
        ];
        let (p, authorization) = suite("GET", "/", &guest, &auth);
        assert_eq!(
            authorization,
            expect(
                "host;x-amz-date;x-amz-security-token",
                "07ec1639c89043aa0e3e2de82b96708f198cceab042d4a97044c66dd9f74e7f8"
            )
        );
        assert_eq!(p.headers.get_all("x-amz-security-token").iter().count(), 1);
        assert_eq!(p.headers["x-amz-security-token"], token);
        assert!(p.headers["x-amz-security-token"].is_sensitive());
    }

    /// The path is encoded once more than it is sent, as every service but
    /// S3 wants (the suite's `double-encode-path`, signed with its own key).
    #[test]
    fn sigv4_encodes_the_path_twice() {
        let auth = Material::AwsSigV4 {
            access_key_id: "ANOTREAL".into(),
            secret_access_key: Secret::new("notrealrnrELgWzOk3IfjzDKtFBhDby"),
            session_token: None,
            region: "us-east-1".into(),
            service: "service".into(),
        };
        let mut p = parts(
            "POST",
            "https://tj9n5r0m12.execute-api.us-east-1.amazonaws.com/test/@connections/JBDvjfGEIAMCERw%3D",
            &[],
        );
        apply(&auth, &mut p, b"", EXAMPLE_MS).unwrap();
        assert!(
            p.headers[AUTHORIZATION].to_str().unwrap().ends_with(
                "SignedHeaders=host;x-amz-date, \
                 Signature=57d157672191bac40bae387e48bbe14b15303c001fdbb01f4abf295dccb09705"
            ),
            "{:?}",
            p.headers[AUTHORIZATION]
        );
    }

    #[test]
    fn sigv4_signs_every_header_and_refuses_what_it_cannot_sign() {
        let mut p = parts(
            "POST",
            "https://ec2.us-east-1.amazonaws.com/",
            &[("user-agent", "berth"), ("content-type", "text/plain")],
        );
        apply(&aws("ec2"), &mut p, b"Action=DescribeInstances", EXAMPLE_MS).unwrap();
        assert!(
            p.headers[AUTHORIZATION]
                .to_str()
                .unwrap()
                .contains("SignedHeaders=content-type;host;user-agent;x-amz-date,")
        );

        let mut p = parts("GET", "https://ec2.us-east-1.amazonaws.com/", &[]);
        p.headers
            .insert("x-note", HeaderValue::from_bytes(b"caf\xe9").unwrap());
        let refused = apply(&aws("ec2"), &mut p, b"", EXAMPLE_MS);
        assert!(
            matches!(refused, Err(NotApplied::Unsignable(_))),
            "{refused:?}"
        );
        assert!(!p.headers.contains_key(AUTHORIZATION));
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
        apply(&aws("ec2"), &mut p, b"Action=DescribeInstances", EXAMPLE_MS).unwrap();
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
        let header = Material::Header {
            name: HeaderName::from_static("x-api-key"),
            value: Secret::new("s3cr3t-value"),
        };
        apply(&header, &mut p, b"", 0).unwrap();
        assert_eq!(p.headers.get_all("x-api-key").iter().count(), 1);
        assert_eq!(p.headers["x-api-key"], "s3cr3t-value");
    }

    #[test]
    fn the_secrets_sent_are_named_for_the_scrubber() {
        let bearer = Material::Header {
            name: AUTHORIZATION,
            value: Secret::new("Bearer abc.def"),
        };
        assert_eq!(
            sent_secrets(&bearer),
            [b"Bearer abc.def".to_vec(), b"abc.def".to_vec()]
        );
        let key = Material::Header {
            name: HeaderName::from_static("x-api-key"),
            value: Secret::new("k3y"),
        };
        assert_eq!(sent_secrets(&key), [b"k3y".to_vec()]);
        assert!(sent_secrets(&aws("ec2")).is_empty());
        assert_eq!(
            sent_secrets(&temporary("ec2", "session")),
            [b"session".to_vec()]
        );
    }

    #[test]
    fn credentials_go_only_where_they_may() {
        assert!(may_send("api.example.com", true));
        assert!(!may_send("api.example.com", false));
        assert!(may_send("127.0.0.1", false));
        assert!(may_send("[::1]", false));
        assert!(may_send("[::ffff:127.0.0.1]", false));
        assert!(may_send("localhost", false));
        assert!(!may_send("10.0.0.1", false));
        assert!(!format!("{:?}", aws("ec2")).contains(SECRET));
    }
}
