//! The compute endpoint from Keystone's service catalog, as the host's
//! `keystone` credential returned it (`auth-info`), and whether requests to
//! it carry that credential's token.

use serde_json::Value;

/// The URL of the `compute` service's endpoint of `interface` (and
/// `region`, its id or name, when given) in `info`, the `auth-info` JSON of
/// a keystone credential; without a trailing `/`.
pub(crate) fn compute_endpoint(
    info: &str,
    interface: &str,
    region: Option<&str>,
) -> Result<String, String> {
    let v: Value = serde_json::from_str(info)
        .map_err(|e| format!("the credential's auth-info is not JSON: {e}"))?;
    if v.get("kind").and_then(Value::as_str) != Some("keystone") {
        return Err(format!(
            "the credential is of kind {}, not keystone",
            v.get("kind").map_or_else(|| "?".into(), Value::to_string)
        ));
    }
    let Some(catalog) = v.get("catalog").and_then(Value::as_array) else {
        return Err(
            "Keystone returned no service catalog: the token is not scoped to a project \
             (name project-name or project-id in the credential)"
                .into(),
        );
    };
    let mut found: Vec<(String, String)> = Vec::new();
    let mut regions: Vec<String> = Vec::new();
    for service in catalog {
        if service.get("type").and_then(Value::as_str) != Some("compute") {
            continue;
        }
        let endpoints = service.get("endpoints").and_then(Value::as_array);
        for e in endpoints.into_iter().flatten() {
            let Some(url) = e.get("url").and_then(Value::as_str) else {
                continue;
            };
            if e.get("interface").and_then(Value::as_str) != Some(interface) {
                continue;
            }
            let id = e.get("region_id").and_then(Value::as_str);
            let name = e.get("region").and_then(Value::as_str);
            let shown = id.or(name).unwrap_or("(none)").to_owned();
            if !regions.contains(&shown) {
                regions.push(shown.clone());
            }
            if region.is_none_or(|r| Some(r) == id || Some(r) == name) {
                found.push((shown, url.trim_end_matches('/').to_owned()));
            }
        }
    }
    found.dedup();
    match found.as_slice() {
        [(_, url)] => Ok(url.clone()),
        [] if regions.is_empty() => Err(format!(
            "Keystone's catalog has no {interface} endpoint of the compute service"
        )),
        [] => Err(format!(
            "Keystone's catalog has no {interface} compute endpoint in region {}; it has \
             one in {}",
            region.unwrap_or_default(),
            regions.join(", ")
        )),
        several => Err(format!(
            "Keystone's catalog has {interface} compute endpoints in {}: set region",
            several
                .iter()
                .map(|(r, _)| r.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// Whether a request to `authority` (`host` or `host:port` of a URL) goes to
/// the credential `host` names (`host`, `host:port`, `*.domain`), and so
/// carries its token.
pub(crate) fn covered(credential: &str, authority: &str) -> bool {
    let credential = credential.to_ascii_lowercase();
    let authority = authority.to_ascii_lowercase();
    let (want_host, want_port) = split(&credential);
    let (host, port) = split(&authority);
    if want_port.is_some() && want_port != port {
        return false;
    }
    match want_host.strip_prefix("*.") {
        Some(domain) => host.ends_with(&format!(".{domain}")),
        None => want_host == host,
    }
}

/// `host` and the port, if any; `[v6]` kept in brackets.
fn split(authority: &str) -> (&str, Option<&str>) {
    if authority.starts_with('[') {
        return match authority.split_once("]:") {
            Some((h, p)) => (&authority[..=h.len()], Some(p)),
            None => (authority, None),
        };
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (authority, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(endpoints: &[(&str, &str, &str)]) -> String {
        let endpoints: Vec<Value> = endpoints
            .iter()
            .map(|(interface, region, url)| {
                serde_json::json!({"interface": interface, "region": region, "region_id": region, "url": url})
            })
            .collect();
        serde_json::json!({
            "kind": "keystone",
            "auth_url": "https://keystone.example.com/v3",
            "catalog": [
                {"type": "identity", "endpoints": [{"interface": "public", "region": "RegionOne", "url": "https://keystone.example.com/v3"}]},
                {"type": "compute", "name": "nova", "endpoints": endpoints},
            ],
        })
        .to_string()
    }

    #[test]
    fn finds_the_compute_endpoint_of_the_interface_and_region() {
        let one = info(&[
            ("public", "RegionOne", "https://nova.example.com:8774/v2.1/"),
            ("internal", "RegionOne", "http://10.0.0.5:8774/v2.1"),
        ]);
        assert_eq!(
            compute_endpoint(&one, "public", None).as_deref(),
            Ok("https://nova.example.com:8774/v2.1")
        );
        assert_eq!(
            compute_endpoint(&one, "internal", Some("RegionOne")).as_deref(),
            Ok("http://10.0.0.5:8774/v2.1")
        );
        let two = info(&[
            ("public", "RegionOne", "https://one.example.com/v2.1"),
            ("public", "RegionTwo", "https://two.example.com/v2.1"),
        ]);
        assert_eq!(
            compute_endpoint(&two, "public", Some("RegionTwo")).as_deref(),
            Ok("https://two.example.com/v2.1")
        );
        let several = compute_endpoint(&two, "public", None).unwrap_err();
        assert!(
            several.contains("RegionOne, RegionTwo: set region"),
            "{several}"
        );
        let elsewhere = compute_endpoint(&two, "public", Some("RegionThree")).unwrap_err();
        assert!(elsewhere.contains("in region RegionThree"), "{elsewhere}");
        let none = compute_endpoint(&one, "admin", None).unwrap_err();
        assert!(none.contains("no admin endpoint"), "{none}");
    }

    #[test]
    fn refuses_what_is_not_a_scoped_keystone_token() {
        let unscoped = r#"{"kind": "keystone", "user": {"id": "u"}}"#;
        assert!(
            compute_endpoint(unscoped, "public", None).is_err_and(|e| e.contains("not scoped"))
        );
        let oauth = r#"{"kind": "oauth2-client-credentials"}"#;
        assert!(compute_endpoint(oauth, "public", None).is_err_and(|e| e.contains("not keystone")));
        assert!(compute_endpoint("nope", "public", None).is_err());
    }

    #[test]
    fn a_credential_covers_its_host() {
        assert!(covered("nova.example.com:8774", "nova.example.com:8774"));
        assert!(covered("nova.example.com", "NOVA.example.com:8774"));
        assert!(!covered("nova.example.com:8774", "nova.example.com"));
        assert!(!covered("nova.example.com:8774", "nova.example.com:443"));
        assert!(covered("*.example.com", "nova.example.com:8774"));
        assert!(!covered("*.example.com", "example.com"));
        assert!(!covered("127.0.0.1:1", "127.0.0.2:1"));
        assert!(covered("[::1]:8774", "[::1]:8774"));
        assert!(!covered("[::1]:8774", "[::1]:1"));
    }
}
