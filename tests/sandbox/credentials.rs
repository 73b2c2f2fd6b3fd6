//! A driver never holds its provider's secrets, also when a server shows
//! them back to it.

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
