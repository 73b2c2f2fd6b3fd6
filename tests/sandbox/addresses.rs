//! An address is the same address in every form it can be written in.

use serde_json::json;

use super::{Hostile, start, until_error};

/// Regression: berth's own address was compared with the address a driver
/// asked for by plain equality, so a driver with `[::ffff:127.0.0.1]:PORT`
/// in its allow-list reached the API listening on 127.0.0.1:PORT (`GET
/// /v1/nodes` answered 200). Now every address is compared in its
/// canonical form, and the API is refused in each of its IPv6 forms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn berths_own_api_is_unreachable_in_its_ipv6_forms() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let listen = format!("127.0.0.1:{port}");
    let forms = [
        ("mapped", "[::ffff:127.0.0.1]"),
        ("mappedhex", "[0:0:0:0:0:ffff:7f00:1]"),
    ];
    let hostile: Vec<Hostile<'_>> = forms
        .iter()
        .map(|(name, host)| Hostile {
            allow: vec![format!("{host}:{port}")],
            ..Hostile::new(
                name,
                json!({"mode": "http", "url": format!("http://{host}:{port}/v1/nodes")}),
            )
        })
        .collect();
    let (_sim, _dir, server) = start(&hostile, &["--listen", &listen]).await;
    for (name, host) in forms {
        let outcome = until_error(&server, 30, name, "http").await;
        eprintln!("{host}: {outcome}");
        assert!(
            outcome.contains("http failed") && !outcome.contains("http ok"),
            "{host}: {outcome}"
        );
    }
    let log = server.log_text();
    assert!(
        log.matches("is berth's own API").count() >= forms.len(),
        "no refusal of the API in the log"
    );
    server.terminate().await.assert_success();
}
