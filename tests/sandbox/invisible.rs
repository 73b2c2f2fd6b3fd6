//! Names and ids hold no invisible characters: one that does would read as
//! another name in every table, log line and terminal.

use serde_json::json;

use super::{Hostile, start, until_metric};

/// Regression: a zero-width space (and the other format and
/// default-ignorable characters: joiners, word joiner, byte order mark,
/// soft hyphen, …) passed the checks of instance ids and of requestor
/// names, so `i-1` and `i-1` followed by U+200B were two instances that
/// look the same, and so were two requestors. Now a driver's answer with
/// one is refused and counted, and the API refuses such a requestor with
/// 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invisible_characters_are_refused_in_ids_and_names() {
    let (_sim, _dir, server) = start(
        &[Hostile {
            min_ready: 0,
            ..Hostile::new(
                "invisible",
                json!({"mode": "ok", "list": "invisible", "label": "invisible"}),
            )
        }],
        &[],
    )
    .await;
    let refused = until_metric(
        &server,
        30,
        "berth_driver_answers_refused_total{provider=\"invisible\",rule=\"id\"}",
        1.0,
    )
    .await;
    let (_, nodes) = server.call("GET", "/v1/nodes", None, None).await;
    assert!(
        !nodes.to_string().contains("i-1\u{200b}"),
        "the instance was taken: {nodes}"
    );
    for (requestor, name) in [
        ("ci\u{200b}", "zero-width space"),
        ("ci\u{200d}", "zero-width joiner"),
        ("c\u{2060}i", "word joiner"),
        ("\u{feff}ci", "byte order mark"),
        ("c\u{ad}i", "soft hyphen"),
    ] {
        let (status, body) = server
            .call(
                "POST",
                "/v1/requests",
                None,
                Some(json!({"labels": {"small": 1}, "requestor": requestor})),
            )
            .await;
        assert_eq!(status, 400, "{name}: {body}");
        assert_eq!(body["error"]["field"], "requestor", "{name}: {body}");
    }
    // The same request with a visible name is taken.
    let (status, body) = server
        .call(
            "POST",
            "/v1/requests",
            None,
            Some(json!({"labels": {"small": 1}, "requestor": "ci"})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    eprintln!("invisible: {refused} answers refused");
    server.terminate().await.assert_success();
}
