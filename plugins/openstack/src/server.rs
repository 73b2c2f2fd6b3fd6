//! Nova's servers as the contract's instances, and what Nova accepts as a
//! server's name and metadata.

use berth_sdk::types::{Addresses, Connection, Instance, InstanceState};
use serde_json::{Map, Value};

/// Nova's limits on metadata: keys and values of at most 255 characters,
/// keys of these characters, and (`maxServerMeta`, the `metadata_items`
/// quota) 128 items by default.
pub(crate) const MAX_META_LEN: usize = 255;
pub(crate) const MAX_META_ITEMS: usize = 128;

/// A server of a list or a lookup, read from Nova's JSON.
#[derive(Clone, Debug)]
pub(crate) struct Server {
    pub instance: Instance,
    /// `OS-EXT-STS:task_state` is `deleting`.
    pub deleting: bool,
    /// `status` is `BUILD`.
    pub building: bool,
}

impl Server {
    pub fn metadata(&self, key: &str) -> Option<&str> {
        berth_sdk::tags::tag(&self.instance.tags, key)
    }
}

/// Reads one server of `servers/detail` or `servers/{id}`. Anything not
/// as Nova documents it is an error naming what.
pub(crate) fn read(v: &Value) -> Result<Server, String> {
    let Some(map) = v.as_object() else {
        return Err(format!("a server is not a JSON object: {}", short(v)));
    };
    let id = match map.get("id") {
        Some(Value::String(id)) if !id.trim().is_empty() => id.clone(),
        _ => return Err(format!("a server has no id: {}", short(v))),
    };
    let text = |k: &str| map.get(k).and_then(Value::as_str);
    let Some(status) = text("status") else {
        return Err(format!("server {id} has no status"));
    };
    let task = text("OS-EXT-STS:task_state");
    let deleting = task == Some("deleting");
    let state = if deleting {
        InstanceState::Stopping
    } else {
        match status {
            "BUILD" => InstanceState::Pending,
            "ACTIVE" => InstanceState::Running,
            "ERROR" => InstanceState::Failed(failure(map)),
            "DELETED" | "SOFT_DELETED" => InstanceState::Terminated,
            // Stopped, set aside or taken over: serves nobody until someone
            // acts, and berth never does.
            "SHUTOFF" | "PAUSED" | "SUSPENDED" | "SHELVED" | "SHELVED_OFFLOADED" | "RESCUE" => {
                InstanceState::Stopping
            }
            _ => InstanceState::Unknown,
        }
    };
    let tags = match map.get("metadata") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(m)) => {
            let mut tags = Vec::new();
            for (k, v) in m {
                match v {
                    Value::String(s) => tags.push((k.clone(), s.clone())),
                    other => {
                        return Err(format!(
                            "server {id}: metadata {k:?} is {}, not a string",
                            short(other)
                        ));
                    }
                }
            }
            tags
        }
        Some(other) => {
            return Err(format!(
                "server {id}: metadata is not an object: {}",
                short(other)
            ));
        }
    };
    let flavor = map.get("flavor");
    let instance_type = (flavor.and_then(|f| f.get("id")).and_then(Value::as_str))
        .or_else(|| {
            flavor
                .and_then(|f| f.get("original_name"))
                .and_then(Value::as_str)
        })
        .unwrap_or_default()
        .to_owned();
    Ok(Server {
        deleting,
        building: status == "BUILD",
        instance: Instance {
            id,
            state,
            instance_type,
            tags,
            addresses: addresses(map),
            created_at_ms: text("created").and_then(parse_time),
            connection: Connection {
                username: None,
                port: None,
                host_keys: vec![],
            },
        },
    })
}

/// The reason of a server in `ERROR`: its fault's message, as Nova gave it.
fn failure(map: &Map<String, Value>) -> String {
    let fault = map.get("fault");
    let message = fault
        .and_then(|f| f.get("message"))
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|m| !m.is_empty());
    match message {
        Some(m) => m.to_owned(),
        None => "Nova put the server in ERROR and gave no fault".into(),
    }
}

/// The first fixed IPv4 address as the private one, the first floating one
/// (or `accessIPv4`) as the public one, the first IPv6 address; networks in
/// name order.
fn addresses(map: &Map<String, Value>) -> Addresses {
    let mut out = Addresses {
        public_ipv4: None,
        private_ipv4: None,
        ipv6: None,
        hostname: None,
    };
    if let Some(Value::Object(networks)) = map.get("addresses") {
        let mut by_name: Vec<(&String, &Value)> = networks.iter().collect();
        by_name.sort_by_key(|(name, _)| *name);
        for (_, list) in by_name {
            for a in list.as_array().into_iter().flatten() {
                let Some(addr) = a.get("addr").and_then(Value::as_str) else {
                    continue;
                };
                let floating = a.get("OS-EXT-IPS:type").and_then(Value::as_str) == Some("floating");
                let slot = match a.get("version").and_then(Value::as_u64) {
                    Some(4) if floating => &mut out.public_ipv4,
                    Some(4) => &mut out.private_ipv4,
                    Some(6) => &mut out.ipv6,
                    _ => continue,
                };
                if slot.is_none() {
                    *slot = Some(addr.to_owned());
                }
            }
        }
    }
    if out.public_ipv4.is_none() {
        out.public_ipv4 = map
            .get("accessIPv4")
            .and_then(Value::as_str)
            .filter(|a| !a.is_empty())
            .map(str::to_owned);
    }
    out
}

/// Milliseconds since the epoch of `2026-11-28T18:00:00Z` (also with a
/// fraction, an offset such as `+00:00`, or no zone, which Nova means as
/// UTC).
pub(crate) fn parse_time(text: &str) -> Option<u64> {
    let text = text.trim();
    berth_sdk::time::parse_ms(text).or_else(|| {
        // No zone: the date and time alone, with a fraction or not.
        let unzoned = text
            .get(19..)
            .is_some_and(|rest| !rest.contains(['Z', 'z', '+', '-']));
        unzoned.then(|| berth_sdk::time::parse_ms(&format!("{text}Z")))?
    })
}

/// Whether Nova takes `name` as a server's name: 1 to 255 printable
/// characters, not starting or ending with whitespace.
pub(crate) fn valid_name(name: &str) -> bool {
    (1..=MAX_META_LEN).contains(&name.chars().count())
        && !name.chars().any(char::is_control)
        && !name.starts_with(char::is_whitespace)
        && !name.ends_with(char::is_whitespace)
}

/// Checks metadata against Nova's limits; the first problem, naming the key.
pub(crate) fn check_metadata(items: &[(String, String)]) -> Result<(), String> {
    if items.len() > MAX_META_ITEMS {
        return Err(format!(
            "{} metadata items, Nova takes at most {MAX_META_ITEMS}",
            items.len()
        ));
    }
    for (k, v) in items {
        let key_ok = (1..=MAX_META_LEN).contains(&k.chars().count())
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_:. ".contains(c));
        if !key_ok {
            return Err(format!(
                "tag {k:?}: Nova takes metadata keys of 1 to {MAX_META_LEN} letters, digits, \
                 spaces and -_:."
            ));
        }
        if v.chars().count() > MAX_META_LEN {
            return Err(format!(
                "tag {k:?}: its value is {} characters, Nova takes at most {MAX_META_LEN}",
                v.chars().count()
            ));
        }
    }
    Ok(())
}

/// A regular expression that matches exactly one of `names`, as Nova's
/// `name` filter reads it (Python's `re`, MySQL's and PostgreSQL's
/// regular expressions alike): each name with every character that is not
/// a letter or a digit escaped.
pub(crate) fn names_pattern(names: &[&str]) -> String {
    let escaped: Vec<String> = names
        .iter()
        .map(|n| {
            n.chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || !c.is_ascii() {
                        c.to_string()
                    } else {
                        format!("\\{c}")
                    }
                })
                .collect()
        })
        .collect();
    match escaped.as_slice() {
        [one] => format!("^{one}$"),
        _ => format!("^({})$", escaped.join("|")),
    }
}

/// At most 200 characters of `v`, for messages.
fn short(v: &Value) -> String {
    let text = v.to_string();
    match text.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn server(status: &str, task: Option<&str>) -> Value {
        json!({
            "id": "9168b536-cd40-4630-b43f-b259807c6e87",
            "name": "n-00000000000000ab",
            "status": status,
            "OS-EXT-STS:task_state": task,
            "OS-EXT-STS:vm_state": "active",
            "flavor": {"id": "2", "links": []},
            "metadata": {"berth-pool": "p1", "berth-node": "n-00000000000000ab", "create-token": "t"},
            "created": "2026-02-14T19:23:58Z",
            "addresses": {
                "public": [{"addr": "2001:db8::5", "version": 6, "OS-EXT-IPS:type": "fixed"}],
                "private": [
                    {"addr": "10.0.0.5", "version": 4, "OS-EXT-IPS:type": "fixed"},
                    {"addr": "172.24.4.9", "version": 4, "OS-EXT-IPS:type": "floating"},
                ],
            },
            "accessIPv4": "",
        })
    }

    #[test]
    fn a_server_becomes_an_instance() {
        let s = read(&server("ACTIVE", None)).expect("reads");
        let i = &s.instance;
        assert_eq!(i.id, "9168b536-cd40-4630-b43f-b259807c6e87");
        assert_eq!(i.state, InstanceState::Running);
        assert_eq!(i.instance_type, "2");
        assert_eq!(s.metadata("berth-pool"), Some("p1"));
        assert_eq!(i.tags.len(), 3);
        assert_eq!(i.addresses.private_ipv4.as_deref(), Some("10.0.0.5"));
        assert_eq!(i.addresses.public_ipv4.as_deref(), Some("172.24.4.9"));
        assert_eq!(i.addresses.ipv6.as_deref(), Some("2001:db8::5"));
        assert_eq!(i.created_at_ms, Some(1_771_097_038_000));
        assert!(!s.deleting && !s.building);
    }

    #[test]
    fn states_follow_status_and_task() {
        let state = |status: &str, task: Option<&str>| {
            read(&server(status, task)).expect("reads").instance.state
        };
        assert_eq!(state("BUILD", Some("spawning")), InstanceState::Pending);
        assert_eq!(state("ACTIVE", Some("deleting")), InstanceState::Stopping);
        assert_eq!(state("BUILD", Some("deleting")), InstanceState::Stopping);
        assert_eq!(state("DELETED", None), InstanceState::Terminated);
        assert_eq!(state("SOFT_DELETED", None), InstanceState::Terminated);
        assert_eq!(state("SHUTOFF", None), InstanceState::Stopping);
        assert_eq!(state("SHELVED_OFFLOADED", None), InstanceState::Stopping);
        assert_eq!(state("REBOOT", Some("rebooting")), InstanceState::Unknown);
        assert_eq!(state("UNKNOWN", None), InstanceState::Unknown);
        let mut failed = server("ERROR", None);
        failed["fault"] = json!({"code": 500, "created": "2026-02-14T19:23:59Z",
            "message": "No valid host was found. There are not enough hosts available."});
        assert_eq!(
            read(&failed).expect("reads").instance.state,
            InstanceState::Failed(
                "No valid host was found. There are not enough hosts available.".into()
            )
        );
        assert_eq!(
            state("ERROR", None),
            InstanceState::Failed("Nova put the server in ERROR and gave no fault".into())
        );
    }

    #[test]
    fn what_nova_should_not_send_is_refused_by_name() {
        for (v, needle) in [
            (json!([]), "not a JSON object"),
            (json!({"status": "ACTIVE"}), "no id"),
            (json!({"id": "x"}), "server x has no status"),
            (
                json!({"id": "x", "status": "ACTIVE", "metadata": []}),
                "metadata is not an object",
            ),
            (
                json!({"id": "x", "status": "ACTIVE", "metadata": {"k": 1}}),
                "metadata \"k\" is 1",
            ),
        ] {
            match read(&v) {
                Err(m) => assert!(m.contains(needle), "{v}: {m}"),
                Ok(s) => panic!("{v}: read as {s:?}"),
            }
        }
        // The flavor of microversion 2.47 on, and no metadata at all.
        let v = json!({"id": "x", "status": "BUILD", "flavor": {"original_name": "m1.small"}});
        let s = read(&v).expect("reads");
        assert_eq!(s.instance.instance_type, "m1.small");
        assert!(s.instance.tags.is_empty() && s.building);
        assert_eq!(s.instance.created_at_ms, None);
    }

    #[test]
    fn times() {
        assert_eq!(parse_time("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_time("2026-02-14T19:23:58Z"), Some(1_771_097_038_000));
        assert_eq!(
            parse_time("2026-02-14T19:23:58.123456"),
            Some(1_771_097_038_123)
        );
        assert_eq!(
            parse_time("2026-02-14T20:23:58+01:00"),
            Some(1_771_097_038_000)
        );
        assert_eq!(parse_time("2000-02-29T00:00:00Z"), Some(951_782_400_000));
        for bad in [
            "",
            "2026-02-14",
            "2026-13-01T00:00:00Z",
            "2026-02-14T19:23:58Q",
            "x026-02-14T19:23:58Z",
            "2026-02-14T19:23:58.",
        ] {
            assert_eq!(parse_time(bad), None, "{bad}");
        }
    }

    #[test]
    fn names_and_metadata_nova_takes() {
        assert!(valid_name("n-00000000000000ab"));
        assert!(valid_name("conformance-node-0a1b2c3d"));
        for bad in ["", " n", "n ", "a\nb", &"x".repeat(256)] {
            assert!(!valid_name(bad), "{bad:?}");
        }
        let t = |k: &str, v: &str| vec![(k.to_owned(), v.to_owned())];
        assert!(check_metadata(&t("berth-pool", "p")).is_ok());
        assert!(check_metadata(&t("a:b. c_d", "")).is_ok());
        assert!(check_metadata(&t("k/x", "v")).is_err_and(|e| e.contains("\"k/x\"")));
        assert!(check_metadata(&t("", "v")).is_err());
        assert!(
            check_metadata(&t("k", &"v".repeat(256))).is_err_and(|e| e.contains("256 characters"))
        );
        let many: Vec<(String, String)> = (0..129).map(|i| (format!("k{i}"), "v".into())).collect();
        assert!(check_metadata(&many).is_err_and(|e| e.contains("129 metadata items")));
    }

    #[test]
    fn a_pattern_matches_the_names_and_nothing_else() {
        assert_eq!(names_pattern(&["n-0a"]), "^n\\-0a$");
        assert_eq!(names_pattern(&["n-1", "a.b"]), "^(n\\-1|a\\.b)$");
    }
}
