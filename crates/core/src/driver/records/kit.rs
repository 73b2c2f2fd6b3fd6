//! What every [`Records`] backend must answer alike, written once and run
//! against each of them (the plugin's memory, the store's SQLite file and
//! PostgreSQL). Each check panics, naming what differed.

use std::sync::Arc;

use super::{MAX_KEYS, Records, RecordsError};

/// A compare-and-swap of `key` in `provider`'s records, from `from` to
/// `to`, with the contract's text arguments as `&str`.
pub async fn cas(
    r: &dyn Records,
    provider: &str,
    key: &str,
    from: Option<&str>,
    to: Option<&str>,
) -> Result<bool, RecordsError> {
    r.compare_and_swap(
        provider.into(),
        key.into(),
        from.map(str::to_owned),
        to.map(str::to_owned),
    )
    .await
}

/// A write stores only over the value it expects, each provider has its
/// own keys, and a removed key may be taken again. Providers `p` and `q`
/// start empty, and this process may write them.
pub async fn compare_and_swap_decides_and_spaces_are_apart(r: &dyn Records) {
    let p: Arc<str> = "p".into();
    assert_eq!(cas(r, "p", "k", None, Some("1")).await, Ok(true));
    // A second claim of the same key fails; another provider's does not.
    assert_eq!(cas(r, "p", "k", None, Some("2")).await, Ok(false));
    assert_eq!(cas(r, "p", "k", Some("0"), Some("2")).await, Ok(false));
    assert_eq!(cas(r, "q", "k", None, Some("x")).await, Ok(true));
    assert_eq!(cas(r, "p", "k", Some("1"), Some("3")).await, Ok(true));
    assert_eq!(r.get(p.clone(), "k".into()).await, Ok(Some("3".into())));
    // Removing, and taking a removed key again.
    assert_eq!(cas(r, "p", "k", Some("3"), None).await, Ok(true));
    assert_eq!(r.get(p.clone(), "k".into()).await, Ok(None));
    assert_eq!(cas(r, "p", "k", Some("3"), None).await, Ok(false));
    assert_eq!(cas(r, "p", "k", None, Some("4")).await, Ok(true));
    assert_eq!(r.get(p, "k".into()).await, Ok(Some("4".into())));
    assert_eq!(r.get("q".into(), "k".into()).await, Ok(Some("x".into())));
}

/// A scan answers the keys under a prefix taken literally, in byte order
/// (`%` is no wildcard, `K` sorts before `j`, `ä` after `k%2`), or an
/// error once the keys and values would pass its budget, never a part.
/// Provider `s` starts empty, and this process may write it.
pub async fn a_scan_answers_in_byte_order_within_its_budget(r: &dyn Records) {
    let s: Arc<str> = "s".into();
    for k in ["k", "k%2", "K", "k\u{e4}", "j", "kz"] {
        let value = if k == "k" { "2" } else { "v" };
        assert_eq!(cas(r, "s", k, None, Some(value)).await, Ok(true), "{k}");
    }
    let keys = |v: Vec<(String, String)>| v.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
    let all = r.scan(s.clone(), String::new(), 1 << 20).await.map(keys);
    assert_eq!(
        all,
        Ok(["K", "j", "k", "k%2", "kz", "k\u{e4}"]
            .map(String::from)
            .to_vec())
    );
    let under_k = r.scan(s.clone(), "k".into(), 1 << 20).await.map(keys);
    assert_eq!(
        under_k,
        Ok(["k", "k%2", "kz", "k\u{e4}"].map(String::from).to_vec())
    );
    let literal = r.scan(s.clone(), "k%".into(), 1 << 20).await;
    assert_eq!(literal, Ok(vec![("k%2".into(), "v".into())]));
    assert_eq!(r.scan(s.clone(), "none".into(), 0).await, Ok(vec![]));
    // A budget holds what comes to it exactly ("k%2"+"v" is 4 bytes), and
    // refuses one byte less: "k"+"2" and "k%2"+"v" come to 6, past 5.
    let within = r.scan(s.clone(), "k%".into(), 4).await;
    assert_eq!(within, Ok(vec![("k%2".into(), "v".into())]));
    let over = r.scan(s.clone(), "k".into(), 5).await;
    assert_eq!(over, Err(RecordsError::OverBudget { max_bytes: 5 }));
    let text = over.unwrap_err().to_string();
    assert!(text.contains("more than the 5 bytes"), "{text}");
}

/// The key of the `i`th record a full provider holds (1-based), for the
/// caller that fills one in bulk before
/// [`a_full_provider_takes_no_new_key_but_changes_its_own`].
pub fn filler_key(i: u64) -> String {
    format!("h/{i}")
}

/// A provider holding [`MAX_KEYS`] keys takes no new one, while its held
/// keys still change and a freed place may be taken; other providers are
/// not held back. Provider `full` holds [`filler_key`] 1 to [`MAX_KEYS`],
/// each with the value `v`, and provider `q` has no key `new`.
pub async fn a_full_provider_takes_no_new_key_but_changes_its_own(r: &dyn Records) {
    let first = filler_key(1);
    let full = cas(r, "full", "new", None, Some("v")).await;
    assert_eq!(full, Err(RecordsError::TooManyKeys { held: MAX_KEYS }));
    let text = full.unwrap_err().to_string();
    assert!(
        text.contains(&format!("already holds {MAX_KEYS} keys")),
        "{text}"
    );
    assert_eq!(cas(r, "full", &first, Some("v"), Some("w")).await, Ok(true));
    assert_eq!(cas(r, "full", &first, Some("w"), None).await, Ok(true));
    assert_eq!(cas(r, "full", "new", None, Some("v")).await, Ok(true));
    assert_eq!(
        cas(r, "full", &first, None, Some("v")).await,
        Err(RecordsError::TooManyKeys { held: MAX_KEYS })
    );
    assert_eq!(cas(r, "q", "new", None, Some("v")).await, Ok(true));
}
