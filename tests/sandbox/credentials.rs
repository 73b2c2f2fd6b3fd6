//! A driver never holds its provider's secrets, also when a server shows
//! them back to it.

use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use serde_json::json;

use super::{Hostile, start_with, until_error};
use crate::support::echo::{Echo, Recorder};
use crate::support::server::until;

/// The ways `text` shows `secret`: as it is, percent- or JSON-escaped, or
/// in base64 at any alignment (all of it but at most two bytes at each end,
/// which a longer encoded text mixes with the bytes around them).
fn shown(text: &str, secret: &str) -> Vec<String> {
    let mut found = Vec::new();
    let core = &secret.as_bytes()[2..secret.len() - 2];
    let unescaped = [
        text.to_owned(),
        percent_decoded(text),
        text.replace("\\/", "/"),
    ];
    if unescaped.iter().any(|t| t.contains(secret)) {
        found.push("as it is or escaped".to_owned());
    }
    for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || "+/=-_".contains(c))) {
        for skip in 0..4 {
            let word = word.get(skip..).unwrap_or_default();
            let word = &word[..word.len() / 4 * 4];
            for (name, engine) in [
                ("base64", &STANDARD_NO_PAD),
                ("base64url", &URL_SAFE_NO_PAD),
                ("base64", &STANDARD),
                ("base64url", &URL_SAFE),
            ] {
                if let Ok(bytes) = engine.decode(word.trim_end_matches('='))
                    && bytes.windows(core.len()).any(|w| w == core)
                {
                    found.push(format!("{name} in `{word}`"));
                }
            }
        }
    }
    found
}

fn percent_decoded(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b
            .get(i + 1..i + 3)
            .filter(|_| b[i] == b'%')
            .and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok())
        {
            Some(v) => {
                out.push(v);
                i += 3;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Regression: a server that echoes requests showed a driver the bearer
/// token the host had added to its request, and the driver sent the token
/// on to another host it may reach. Now every response of a provider with
/// credentials has the secrets masked before the driver reads it: in its
/// headers and all through its body, as sent, escaped and in base64, also
/// where the body arrives split inside the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_cannot_read_its_providers_credential_from_an_echo() {
    // `+`, `/` and `=` tell the base64 alphabets and escapes apart.
    const TOKEN: &str = "echo+Tok/3n=Zq8RwX5vY1pLk-7";
    const VAR: &str = "BERTH_TEST_ECHO_TOKEN";
    let echo = Echo::start().await;
    let recorder = Recorder::start().await;
    let credential = format!(
        "host = \"{}\"\nkind = \"bearer\"\ntoken = \"${{{VAR}}}\"",
        echo.addr
    );
    let (_sim, _dir, server) = start_with(
        &[Hostile {
            allow: vec![echo.addr.to_string(), recorder.addr.to_string()],
            credentials: &credential,
            ..Hostile::new(
                "echoed",
                json!({
                    "mode": "echo",
                    "url": format!("http://{}/echo", echo.addr),
                    "to": format!("http://{}/loot", recorder.addr),
                }),
            )
        }],
        &[],
        &[(VAR, TOKEN)],
    )
    .await;
    let outcome = until_error(&server, 30, "echoed", "echo:").await;
    // What the driver read, as it sent it on.
    let sent_on = until(20, "the echo sent on", || async {
        let r = recorder.received();
        r.contains("status 200").then_some(r)
    })
    .await;
    eprintln!("echo: {outcome}");
    // The driver read the echo, the request head with the authorization
    // the host added, and sent it on.
    assert!(
        sent_on.contains("GET /echo") && sent_on.to_ascii_lowercase().contains("authorization: "),
        "{sent_on}"
    );
    assert!(outcome.contains("sent on: 200"), "{outcome}");
    for (what, text) in [
        ("the driver's outcome", &outcome),
        ("the echo sent on", &sent_on),
    ] {
        let found = shown(text, TOKEN);
        assert!(
            found.is_empty(),
            "{what} shows the token: {found:?}\n{text}"
        );
    }
    server.terminate().await.assert_success();
}

/// A token the host exchanged a password for, and the password itself,
/// stay out of a hostile driver's reach whatever it tries, each from a
/// provider of its own with a Keystone credential for its own echo server:
/// - `echoed`: reads the echo of its request (the `X-Auth-Token` in it, as
///   sent, escaped, in base64, split) and sends it all on to another host;
/// - `asked`: asks `auth-info` for its credentialed host (the catalog and
///   project, no token), for an allowed host with no credential, and for
///   hosts it may not reach (nothing);
/// - `redirected`: follows a redirect from its credentialed host to another
///   host, which gets no credential;
/// - `refused`: calls a path that answers `401` to everything, 20 times a
///   try: the host exchanges again at most about once a second, and the
///   driver gets the `401`s;
/// - `traced`: sends `TRACE` (which would echo the token), refused before
///   anything is sent.
///
/// Nothing any of them sends on, nor the log, nor the API, holds a token
/// the token server issued, or the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_cannot_obtain_an_exchanged_token_or_its_password() {
    use crate::support::tokens::{TokenConfig, TokenServer};
    const PASSWORD: &str = "keystone+Pa55/word=Zq8RwX";
    const VAR: &str = "BERTH_TEST_KEYSTONE_PASSWORD";
    let tokens = TokenServer::start(TokenConfig {
        lifetime: Duration::from_secs(3600),
        passwords: vec![("hostile".into(), PASSWORD.into())],
        ..TokenConfig::default()
    })
    .await;
    let recorder = Recorder::start().await;
    let echoes = [
        Echo::start().await,
        Echo::start().await,
        Echo::start().await,
        Echo::start().await,
        Echo::start().await,
    ];
    let credential = |echo: &Echo| {
        format!(
            "host = \"{}\"\nkind = \"keystone\"\nauth-url = \"{}\"\nusername = \"hostile\"\n\
             password = \"${{{VAR}}}\"\nproject-name = \"ci\"",
            echo.addr,
            tokens.keystone_url()
        )
    };
    let creds: Vec<String> = echoes.iter().map(credential).collect();
    let to = format!("http://{}/loot", recorder.addr);
    let allow = |echo: &Echo| vec![echo.addr.to_string(), recorder.addr.to_string()];
    let [echoed, asked, redirected, refused, traced] = &echoes;
    let started = Instant::now();
    let (_sim, _dir, server) = start_with(
        &[
            Hostile {
                allow: allow(echoed),
                credentials: &creds[0],
                ..Hostile::new(
                    "echoed",
                    json!({"mode": "echo", "url": format!("http://{}/echo", echoed.addr), "to": to}),
                )
            },
            Hostile {
                allow: allow(asked),
                credentials: &creds[1],
                ..Hostile::new(
                    "asked",
                    json!({"mode": "authinfo", "to": to, "hosts": [
                        asked.addr.to_string(),
                        recorder.addr.to_string(),
                        echoed.addr.to_string(),
                        "169.254.169.254",
                        "evil.example.com",
                    ]}),
                )
            },
            Hostile {
                allow: allow(redirected),
                credentials: &creds[2],
                ..Hostile::new(
                    "redirected",
                    json!({"mode": "follow", "to": to,
                        "url": format!("http://{}/redirect/{}/landed", redirected.addr, recorder.addr)}),
                )
            },
            Hostile {
                allow: allow(refused),
                credentials: &creds[3],
                ..Hostile::new(
                    "refused",
                    json!({"mode": "repeat", "count": 20, "to": to,
                        "url": format!("http://{}/unauthorized", refused.addr)}),
                )
            },
            Hostile {
                allow: allow(traced),
                credentials: &creds[4],
                ..Hostile::new(
                    "traced",
                    json!({"mode": "burst", "count": 1, "method": "TRACE",
                        "url": format!("http://{}/echo", traced.addr)}),
                )
            },
        ],
        &[],
        &[(VAR, PASSWORD)],
    )
    .await;
    let echo_outcome = until_error(&server, 30, "echoed", "echo:").await;
    let info = until_error(&server, 30, "asked", "authinfo:").await;
    let follow = until_error(&server, 30, "redirected", "follow:").await;
    let repeat = until_error(&server, 30, "refused", "repeat:").await;
    let trace = until_error(&server, 30, "traced", "burst:").await;
    eprintln!(
        "echo: {echo_outcome}\nauthinfo: {info}\nfollow: {follow}\nrepeat: {repeat}\ntrace: {trace}"
    );
    assert!(trace.contains("HttpRequestMethodInvalid"), "{trace}");

    // auth-info: the catalog and project of its own credential, nothing
    // for any other host (not its own echo's sibling either).
    let own = info
        .lines()
        .find(|l| l.contains(&format!("{} => ", asked.addr)))
        .unwrap_or_else(|| panic!("{info}"));
    assert!(
        own.contains("some ") && own.contains("catalog") && own.contains("\"project\""),
        "{own}"
    );
    for other in [
        recorder.addr.to_string(),
        echoed.addr.to_string(),
        "169.254.169.254".into(),
        "evil.example.com".into(),
    ] {
        assert!(
            info.contains(&format!("{other} => none")),
            "{other}: {info}"
        );
    }
    // The redirect was followed by the driver, to a host with no credential.
    assert!(
        follow.contains("302") && follow.contains("/landed"),
        "{follow}"
    );
    let received = until(20, "everything sent on", || async {
        let r = recorder.received();
        (r.contains("GET /landed") && r.matches("POST /loot").count() >= 4).then_some(r)
    })
    .await;
    let landed = received
        .split("GET /landed")
        .nth(1)
        .and_then(|r| r.split("\r\n\r\n").next())
        .unwrap_or_default()
        .to_ascii_lowercase();
    assert!(!landed.contains("x-auth-token"), "{landed}");
    // The 401s reached the driver; the host renewed on them at most about
    // once a second.
    assert!(repeat.contains("\"401\": 20"), "{repeat}");
    let (_, providers) = server.call("GET", "/v1/providers", None, None).await;
    let c = providers
        .as_array()
        .and_then(|a| a.iter().find(|p| p["name"] == "refused"))
        .map(|p| p["credentials"][0].clone())
        .unwrap_or_default();
    let secs = started.elapsed().as_secs();
    eprintln!("refused after {secs}s: {c}");
    assert!(c["refreshed_on_401"].as_u64() <= Some(secs + 1), "{c}");
    assert_eq!(c["replays"].as_u64(), c["refreshed_on_401"].as_u64(), "{c}");

    let issued = tokens.issued_tokens();
    assert!(issued.len() >= 4, "{issued:?}");
    let log = server.log_text();
    for (what, text) in [
        ("the echo's outcome", &echo_outcome),
        ("auth-info's outcome", &info),
        ("the follow's outcome", &follow),
        ("the repeat's outcome", &repeat),
        ("the trace's outcome", &trace),
        ("what was sent on", &received),
        ("the providers", &providers.to_string()),
        ("the log", &log),
    ] {
        for secret in issued.iter().map(String::as_str).chain([PASSWORD]) {
            let found = shown(text, secret);
            assert!(found.is_empty(), "{what} shows {secret}: {found:?}\n{text}");
        }
    }
    server.terminate().await.assert_success();
}

/// One exchange at a time per credential: a driver starts ten requests to
/// its credentialed host at once while the token endpoint takes a second
/// to answer; all ten wait for the one exchange and go with its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_need_a_token_at_once_share_one_exchange() {
    use crate::support::tokens::{TokenConfig, TokenServer};
    const VAR: &str = "BERTH_TEST_KEYSTONE_PASSWORD";
    let tokens = TokenServer::start(TokenConfig {
        lifetime: Duration::from_secs(3600),
        passwords: vec![("flood".into(), "flood-pa55word".into())],
        ..TokenConfig::default()
    })
    .await;
    tokens.set_delay(Duration::from_secs(1));
    let echo = Echo::start().await;
    let credential = format!(
        "host = \"{}\"\nkind = \"keystone\"\nauth-url = \"{}\"\nusername = \"flood\"\n\
         password = \"${{{VAR}}}\"",
        echo.addr,
        tokens.keystone_url()
    );
    let (_sim, _dir, server) = start_with(
        &[Hostile {
            allow: vec![echo.addr.to_string()],
            credentials: &credential,
            ..Hostile::new(
                "flood",
                json!({"mode": "burst", "count": 10, "url": format!("http://{}/echo", echo.addr)}),
            )
        }],
        &[],
        &[(VAR, "flood-pa55word")],
    )
    .await;
    let outcome = until_error(&server, 30, "flood", "burst:").await;
    eprintln!(
        "flood: {outcome}; {:?}, at most {} in flight",
        tokens.counts(),
        tokens.in_flight_max()
    );
    assert!(outcome.contains("\"200\": 10"), "{outcome}");
    assert_eq!(tokens.counts().issued, 1, "{:?}", tokens.counts());
    assert_eq!(tokens.in_flight_max(), 1);
    server.terminate().await.assert_success();
}
