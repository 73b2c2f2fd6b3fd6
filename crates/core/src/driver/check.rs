//! What a driver answers is a claim, not a fact: these checks run on every
//! instance a driver returns, before the pool sees it. An instance that fails
//! one is refused as a whole (as if the driver had not reported it), so that
//! a lying or broken driver cannot hand out a machine twice, inject text into
//! logs and tables, or make berth hold unbounded data.

use std::collections::{HashMap, HashSet};
use std::net::{Ipv4Addr, Ipv6Addr};

use super::{Instance, InstanceState, Tags};
use crate::text::{is_unsafe, printable, truncated};

/// Longest instance id, instance type or user name, in bytes.
pub const MAX_ID: usize = 256;
/// Most tags on one instance.
pub const MAX_TAGS: usize = 64;
/// Longest tag key and value, in bytes.
pub const MAX_TAG_KEY: usize = 128;
pub const MAX_TAG_VALUE: usize = 512;
/// Most host keys, and the longest one, in bytes.
pub const MAX_HOST_KEYS: usize = 16;
pub const MAX_HOST_KEY: usize = 8192;
/// Longest host name (DNS's own limit).
pub const MAX_HOSTNAME: usize = 253;
/// Longest reason of a failed instance, in bytes.
pub const MAX_FAILURE: usize = 1024;

/// An instance refused, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadAnswer {
    /// The instance's id, made safe to show (escaped, cut).
    pub instance: String,
    /// The rule it broke, in a word (for metrics): `id`, `duplicate`,
    /// `type`, `tags`, `address`, `connection`, `failure`.
    pub rule: &'static str,
    /// What exactly, for the log.
    pub why: String,
}

impl std::fmt::Display for BadAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "instance `{}`: {}", self.instance, self.why)
    }
}

/// Checks one instance (a create's answer, or one entry of a list).
pub fn instance(i: &Instance) -> Result<(), BadAnswer> {
    let refuse = |rule, why: String| BadAnswer {
        instance: printable(&truncated(&i.id, 64)).into_owned(),
        rule,
        why,
    };
    text("id", &i.id, MAX_ID).map_err(|w| refuse("id", w))?;
    if i.id.is_empty() {
        return Err(refuse("id", "the id is empty".into()));
    }
    text("instance type", &i.instance_type, MAX_ID).map_err(|w| refuse("type", w))?;
    tags(&i.tags).map_err(|w| refuse("tags", w))?;
    let a = &i.addresses;
    let ip = |what: &str, v: &Option<String>, ok: &dyn Fn(&str) -> bool| match v {
        Some(s) if !ok(s) => Err(format!(
            "{what} `{}` is not an address",
            printable(&truncated(s, 64))
        )),
        _ => Ok(()),
    };
    ip("public-ipv4", &a.public_ipv4, &|s| {
        s.parse::<Ipv4Addr>().is_ok()
    })
    .and_then(|()| {
        ip("private-ipv4", &a.private_ipv4, &|s| {
            s.parse::<Ipv4Addr>().is_ok()
        })
    })
    .and_then(|()| ip("ipv6", &a.ipv6, &|s| s.parse::<Ipv6Addr>().is_ok()))
    .and_then(|()| ip("hostname", &a.hostname, &is_hostname))
    .map_err(|w| refuse("address", w))?;
    let c = &i.connection;
    if let Some(u) = &c.username {
        text("username", u, MAX_ID).map_err(|w| refuse("connection", w))?;
    }
    if c.host_keys.len() > MAX_HOST_KEYS {
        return Err(refuse(
            "connection",
            format!("{} host keys, more than {MAX_HOST_KEYS}", c.host_keys.len()),
        ));
    }
    for k in &c.host_keys {
        text("host key", k, MAX_HOST_KEY).map_err(|w| refuse("connection", w))?;
    }
    match (&i.failure, i.state == InstanceState::Failed) {
        (Some(why), true) => text("failure", why, MAX_FAILURE).map_err(|w| refuse("failure", w)),
        (None, _) => Ok(()),
        (Some(_), false) => Err(refuse(
            "failure",
            format!("a reason for failing in state {}", i.state),
        )),
    }
}

/// Checks a list answer: every instance, and that no id appears twice.
/// Returns the instances kept, in order, and those refused. Every entry of
/// a duplicated id is refused: which of them, if any, tells the truth is not
/// for berth to guess.
pub fn listing(instances: Vec<Instance>) -> (Vec<Instance>, Vec<BadAnswer>) {
    let mut count: HashMap<&str, u32> = HashMap::with_capacity(instances.len());
    for i in &instances {
        *count.entry(i.id.as_str()).or_default() += 1;
    }
    let duplicated: HashSet<String> = count
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(id, _)| id.to_owned())
        .collect();
    let mut kept = Vec::with_capacity(instances.len());
    let mut refused = Vec::new();
    for i in instances {
        if duplicated.contains(&i.id) {
            refused.push(BadAnswer {
                instance: printable(&truncated(&i.id, 64)).into_owned(),
                rule: "duplicate",
                why: "listed more than once in one answer".into(),
            });
            continue;
        }
        match instance(&i) {
            Ok(()) => kept.push(i),
            Err(r) => refused.push(r),
        }
    }
    (kept, refused)
}

/// A string a driver supplied: bounded, and nothing in it that could forge
/// a line or reorder a table.
fn text(what: &str, s: &str, max: usize) -> Result<(), String> {
    if s.len() > max {
        return Err(format!("the {what} is {} bytes, more than {max}", s.len()));
    }
    if s.chars().any(is_unsafe) {
        return Err(format!(
            "the {what} `{}` holds control, invisible or direction characters",
            printable(&truncated(s, 64))
        ));
    }
    Ok(())
}

fn tags(tags: &Tags) -> Result<(), String> {
    if tags.len() > MAX_TAGS {
        return Err(format!("{} tags, more than {MAX_TAGS}", tags.len()));
    }
    for (k, v) in tags {
        text("tag key", k, MAX_TAG_KEY)?;
        text("tag value", v, MAX_TAG_VALUE)?;
    }
    Ok(())
}

/// A DNS name: labels of letters, digits, `-` and `_`, 1 to 63 bytes each,
/// not starting or ending with `-`.
fn is_hostname(s: &str) -> bool {
    let s = s.strip_suffix('.').unwrap_or(s);
    !s.is_empty()
        && s.len() <= MAX_HOSTNAME
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::{Addresses, Connection};

    fn inst(id: &str) -> Instance {
        Instance {
            id: id.into(),
            state: InstanceState::Running,
            instance_type: "small".into(),
            tags: Tags::from([("berth-pool".into(), "p".into())]),
            addresses: Addresses {
                private_ipv4: Some("10.0.0.1".into()),
                hostname: Some("node-1.example.com".into()),
                ..Addresses::default()
            },
            created_at_ms: None,
            connection: Connection::default(),
            failure: None,
        }
    }

    /// Each case: what is changed, and the rule that refuses it (`None`:
    /// kept).
    #[test]
    fn each_rule_refuses_what_it_names() {
        type Edit = fn(&mut Instance);
        let cases: Vec<(&str, Edit, Option<&str>)> = vec![
            ("as it is", |_| {}, None),
            ("an empty id", |i| i.id.clear(), Some("id")),
            (
                "a newline in the id",
                |i| i.id = "i-1\nINFO forged".into(),
                Some("id"),
            ),
            ("a long id", |i| i.id = "x".repeat(MAX_ID + 1), Some("id")),
            (
                "a zero-width space in the id",
                |i| i.id = "i-1\u{200b}".into(),
                Some("id"),
            ),
            (
                "a word joiner in a tag value",
                |i| {
                    i.tags.insert("owner".into(), "ci\u{2060}".into());
                },
                Some("tags"),
            ),
            (
                "a byte order mark in the user name",
                |i| i.connection.username = Some("\u{feff}berth".into()),
                Some("connection"),
            ),
            (
                "a soft hyphen in the type",
                |i| i.instance_type = "sm\u{ad}all".into(),
                Some("type"),
            ),
            (
                "a bidi override in the type",
                |i| i.instance_type = "a\u{202e}b".into(),
                Some("type"),
            ),
            (
                "too many tags",
                |i| {
                    for n in 0..MAX_TAGS {
                        i.tags.insert(format!("k{n}"), "v".into());
                    }
                },
                Some("tags"),
            ),
            (
                "a long tag value",
                |i| {
                    i.tags.insert("k".into(), "v".repeat(MAX_TAG_VALUE + 1));
                },
                Some("tags"),
            ),
            (
                "a bad IPv4",
                |i| i.addresses.public_ipv4 = Some("1.2.3.4; rm -rf".into()),
                Some("address"),
            ),
            (
                "a bad IPv6",
                |i| i.addresses.ipv6 = Some("::g".into()),
                Some("address"),
            ),
            (
                "a bad host name",
                |i| i.addresses.hostname = Some("a b.example".into()),
                Some("address"),
            ),
            (
                "an IPv6 address",
                |i| i.addresses.ipv6 = Some("2001:db8::1".into()),
                None,
            ),
            (
                "a control in a host key",
                |i| i.connection.host_keys = vec!["ssh-ed25519 AAAA\x1b[2J".into()],
                Some("connection"),
            ),
            (
                "too many host keys",
                |i| i.connection.host_keys = vec!["ssh-ed25519 AAAA".into(); MAX_HOST_KEYS + 1],
                Some("connection"),
            ),
            (
                "failed, with its reason",
                |i| {
                    i.state = InstanceState::Failed;
                    i.failure = Some("No valid host was found.".into());
                },
                None,
            ),
            (
                "failed, with no reason",
                |i| i.state = InstanceState::Failed,
                None,
            ),
            (
                "a reason for failing while running",
                |i| i.failure = Some("No valid host was found.".into()),
                Some("failure"),
            ),
            (
                "a newline in a reason for failing",
                |i| {
                    i.state = InstanceState::Failed;
                    i.failure = Some("fault\nINFO forged".into());
                },
                Some("failure"),
            ),
            (
                "a long reason for failing",
                |i| {
                    i.state = InstanceState::Failed;
                    i.failure = Some("x".repeat(MAX_FAILURE + 1));
                },
                Some("failure"),
            ),
        ];
        for (what, edit, want) in cases {
            let mut i = inst("i-1");
            edit(&mut i);
            assert_eq!(instance(&i).err().map(|r| r.rule), want, "{what}");
        }
    }

    #[test]
    fn every_copy_of_a_duplicated_id_is_refused() {
        let mut twin = inst("i-2");
        twin.tags.insert("berth-node".into(), "n-other".into());
        let (kept, refused) = listing(vec![inst("i-1"), inst("i-2"), twin, inst("i-3")]);
        let kept: Vec<&str> = kept.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(kept, ["i-1", "i-3"]);
        assert_eq!(refused.len(), 2);
        assert!(
            refused
                .iter()
                .all(|r| r.rule == "duplicate" && r.instance == "i-2")
        );
    }
}
