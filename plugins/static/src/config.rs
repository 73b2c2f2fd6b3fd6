//! The provider config: a fixed list of hosts, walked by hand from JSON so
//! that every problem is reported at once, each with its key path
//! (`hosts[2].max-parallel-jobs: must be between 1 and 1000`).

use std::collections::BTreeSet;
use std::fmt::Display;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde_json::{Map, Value};

/// Most jobs one host may run at once.
pub(crate) const MAX_JOBS: u64 = 1000;
/// Most slots over all hosts. Each allocation holds two of the host's
/// records (its slot and its node's index) and a provider may hold 10,000,
/// so this leaves room for records of hosts since removed from the config.
pub(crate) const MAX_SLOTS: u64 = 4000;
/// Longest host name; names become part of record keys and instance ids.
const MAX_NAME: usize = 64;
/// Longest probe wait the host allows.
const MAX_TIMEOUT_MS: u64 = 30_000;
/// The probe wait when `timeout-ms` is absent.
pub(crate) const DEFAULT_TIMEOUT_MS: u32 = 1000;
/// The login port when `port` is absent.
pub(crate) const DEFAULT_PORT: u16 = 22;

/// The keys of the config, of each host and of a host's `ready-check`.
pub(crate) const TOP_KEYS: &[&str] = &["hosts"];
pub(crate) const HOST_KEYS: &[&str] = &[
    "name",
    "address",
    "labels",
    "max-parallel-jobs",
    "username",
    "port",
    "host-keys",
    "ready-check",
];
pub(crate) const READY_CHECK_KEYS: &[&str] = &["port", "timeout-ms"];

/// The validated provider config.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Config {
    /// In config order, which is also the order allocation prefers among
    /// hosts running equally many jobs.
    pub hosts: Vec<Host>,
}

/// One configured host.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Host {
    /// Unique; part of every instance id on this host (`NAME/SLOT`).
    pub name: String,
    pub address: Address,
    /// The instance types it serves.
    pub labels: Vec<String>,
    /// How many nodes it may serve at once: its slots.
    pub max_jobs: u32,
    pub username: Option<String>,
    pub port: u16,
    pub host_keys: Vec<String>,
    pub ready_check: Option<ReadyCheck>,
}

impl Host {
    /// Whether the host serves `instance_type`.
    pub fn serves(&self, instance_type: &str) -> bool {
        self.labels.iter().any(|l| l == instance_type)
    }
}

/// Where a host is reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Address {
    V4(Ipv4Addr),
    V6(Ipv6Addr),
    Name(String),
}

impl Address {
    /// Reads an IPv4 or IPv6 literal (without brackets) or a DNS name.
    fn parse(text: &str) -> Result<Address, String> {
        if let Ok(ip) = text.parse::<IpAddr>() {
            return Ok(match ip {
                IpAddr::V4(v4) => Address::V4(v4),
                IpAddr::V6(v6) => Address::V6(v6),
            });
        }
        if text.starts_with('[') {
            return Err("write an IPv6 address without brackets".into());
        }
        let name = text.strip_suffix('.').unwrap_or(text);
        let label_ok = |l: &str| {
            (1..=63).contains(&l.len())
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
            return Err(format!("{text:?} is neither an IP address nor a host name"));
        }
        Ok(Address::Name(text.to_owned()))
    }
}

impl Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::V4(ip) => ip.fmt(f),
            Address::V6(ip) => ip.fmt(f),
            Address::Name(name) => f.write_str(name),
        }
    }
}

/// A TCP port that must accept before the host's instances report running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReadyCheck {
    pub port: u16,
    pub timeout_ms: u32,
}

impl Config {
    /// Total slots over all hosts.
    pub fn slots(&self) -> u32 {
        self.hosts.iter().map(|h| h.max_jobs).sum()
    }

    /// The host named `name`.
    pub fn host(&self, name: &str) -> Option<&Host> {
        self.hosts.iter().find(|h| h.name == name)
    }
}

/// Reads the provider config (JSON text). Returns every problem found, each
/// starting with the path of its key.
pub(crate) fn parse(text: &str) -> Result<Config, Vec<String>> {
    let value: Value = serde_json::from_str(text).map_err(|e| vec![format!("config: {e}")])?;
    let mut w = Walk::default();
    let config = w.config(&value);
    match config {
        Some(c) if w.problems.is_empty() => Ok(c),
        _ => Err(w.problems),
    }
}

/// Collects problems as the config is walked.
#[derive(Default)]
struct Walk {
    problems: Vec<String>,
}

impl Walk {
    fn problem(&mut self, path: &str, message: impl Display) {
        self.problems.push(format!("{path}: {message}"));
    }

    /// Reports keys of `map` not in `known`.
    fn unknown_keys(&mut self, path: &str, map: &Map<String, Value>, known: &[&str]) {
        for key in map.keys().filter(|k| !known.contains(&k.as_str())) {
            let at = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            self.problem(
                &at,
                format!("unknown key; expected one of {}", known.join(", ")),
            );
        }
    }

    fn config(&mut self, value: &Value) -> Option<Config> {
        let Some(map) = value.as_object() else {
            self.problem("config", "must be a JSON object");
            return None;
        };
        self.unknown_keys("", map, TOP_KEYS);
        let Some(hosts) = map.get("hosts") else {
            self.problem("hosts", "missing; it is required");
            return None;
        };
        let Some(list) = hosts.as_array() else {
            self.problem("hosts", "must be a list of hosts");
            return None;
        };
        let mut out = Vec::with_capacity(list.len());
        let mut names = BTreeSet::new();
        for (i, h) in list.iter().enumerate() {
            let path = format!("hosts[{i}]");
            let host = self.host(&path, h);
            // Checked on the raw text, so a host with other problems still
            // has its name compared.
            if let Some(name) = h.get("name").and_then(Value::as_str)
                && !names.insert(name)
            {
                self.problem(
                    &format!("{path}.name"),
                    format!("{name:?} is already the name of another host"),
                );
            }
            out.extend(host);
        }
        let slots: u64 = out.iter().map(|h| u64::from(h.max_jobs)).sum();
        if slots > MAX_SLOTS {
            self.problem(
                "hosts",
                format!("{slots} slots in all, more than the {MAX_SLOTS} allowed"),
            );
        }
        Some(Config { hosts: out })
    }

    fn host(&mut self, path: &str, value: &Value) -> Option<Host> {
        let Some(map) = value.as_object() else {
            self.problem(path, "must be an object");
            return None;
        };
        self.unknown_keys(path, map, HOST_KEYS);
        let name = self.required(path, map, "name", |v| {
            let s = v.as_str().ok_or("must be a string")?;
            let ok = (1..=MAX_NAME).contains(&s.len())
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
            if ok {
                Ok(s.to_owned())
            } else {
                Err(format!(
                    "must be 1 to {MAX_NAME} of A-Z a-z 0-9 . _ -; got {s:?}"
                ))
            }
        });
        let address = self.required(path, map, "address", |v| {
            Address::parse(v.as_str().ok_or("must be a string")?)
        });
        let labels = self.required(path, map, "labels", |v| {
            let labels = string_list(v)?;
            if labels.is_empty() {
                return Err("must name at least one instance type".into());
            }
            if labels.iter().any(String::is_empty) {
                return Err("must not hold an empty string".into());
            }
            Ok(labels)
        });
        let max_jobs = self
            .optional(path, map, "max-parallel-jobs", |v| {
                integer(v, 1, MAX_JOBS).map(|n| n as u32)
            })
            .unwrap_or(Some(1));
        let username = self
            .optional(path, map, "username", |v| match v.as_str() {
                Some(s) if !s.is_empty() => Ok(s.to_owned()),
                Some(_) => Err("must not be empty".into()),
                None => Err("must be a string".into()),
            })
            // Absent is a good `None`; `None` outside means a problem.
            .map_or(Some(None), |read| read.map(Some));
        let port = self
            .optional(path, map, "port", port)
            .unwrap_or(Some(DEFAULT_PORT));
        let host_keys = self
            .optional(path, map, "host-keys", string_list)
            .unwrap_or(Some(Vec::new()));
        let ready_check = match map.get("ready-check") {
            None => Some(None),
            Some(v) => self.ready_check(&format!("{path}.ready-check"), v, port),
        };
        Some(Host {
            name: name?,
            address: address?,
            labels: labels?,
            max_jobs: max_jobs?,
            username: username?,
            port: port?,
            host_keys: host_keys?,
            ready_check: ready_check?,
        })
    }

    /// `ready-check`; its port defaults to the host's `port`.
    fn ready_check(
        &mut self,
        path: &str,
        value: &Value,
        host_port: Option<u16>,
    ) -> Option<Option<ReadyCheck>> {
        let Some(map) = value.as_object() else {
            self.problem(path, "must be an object (`{}` probes the host's port)");
            return None;
        };
        self.unknown_keys(path, map, READY_CHECK_KEYS);
        let probe_port = self.optional(path, map, "port", port).unwrap_or(host_port);
        let timeout_ms = self
            .optional(path, map, "timeout-ms", |v| {
                integer(v, 1, MAX_TIMEOUT_MS).map(|n| n as u32)
            })
            .unwrap_or(Some(DEFAULT_TIMEOUT_MS));
        Some(Some(ReadyCheck {
            port: probe_port?,
            timeout_ms: timeout_ms?,
        }))
    }

    /// The value of a required key, or `None` with a problem noted.
    fn required<T>(
        &mut self,
        path: &str,
        map: &Map<String, Value>,
        key: &str,
        read: impl FnOnce(&Value) -> Result<T, String>,
    ) -> Option<T> {
        match map.get(key) {
            None => {
                self.problem(&format!("{path}.{key}"), "missing; it is required");
                None
            }
            Some(v) => self.read(path, key, v, read),
        }
    }

    /// `None` when the key is absent, `Some(None)` when it is present but
    /// wrong (a problem is noted), `Some(Some(value))` otherwise.
    fn optional<T>(
        &mut self,
        path: &str,
        map: &Map<String, Value>,
        key: &str,
        read: impl FnOnce(&Value) -> Result<T, String>,
    ) -> Option<Option<T>> {
        map.get(key).map(|v| self.read(path, key, v, read))
    }

    fn read<T>(
        &mut self,
        path: &str,
        key: &str,
        value: &Value,
        read: impl FnOnce(&Value) -> Result<T, String>,
    ) -> Option<T> {
        match read(value) {
            Ok(v) => Some(v),
            Err(message) => {
                self.problem(&format!("{path}.{key}"), message);
                None
            }
        }
    }
}

fn integer(v: &Value, min: u64, max: u64) -> Result<u64, String> {
    match v.as_u64() {
        Some(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!("must be a whole number from {min} to {max}")),
    }
}

fn port(v: &Value) -> Result<u16, String> {
    integer(v, 1, u64::from(u16::MAX)).map(|n| n as u16)
}

fn string_list(v: &Value) -> Result<Vec<String>, String> {
    let err = || "must be a list of strings".to_owned();
    v.as_array()
        .ok_or_else(err)?
        .iter()
        .map(|s| s.as_str().map(str::to_owned).ok_or_else(err))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_host_and_defaults() {
        let config = parse(
            r#"{"hosts": [
                {"name": "build-1", "address": "10.0.0.5", "labels": ["small", "large"],
                 "max-parallel-jobs": 3, "username": "ci", "port": 2222,
                 "host-keys": ["ssh-ed25519 AAAA"], "ready-check": {"timeout-ms": 500}},
                {"name": "build-2", "address": "build-2.example.com", "labels": ["small"]},
                {"name": "v6", "address": "2001:db8::1", "labels": ["x"],
                 "ready-check": {"port": 8080}}
            ]}"#,
        )
        .expect("valid");
        assert_eq!(
            config.hosts[0],
            Host {
                name: "build-1".into(),
                address: Address::V4(Ipv4Addr::new(10, 0, 0, 5)),
                labels: vec!["small".into(), "large".into()],
                max_jobs: 3,
                username: Some("ci".into()),
                port: 2222,
                host_keys: vec!["ssh-ed25519 AAAA".into()],
                // The probe port defaults to the host's port.
                ready_check: Some(ReadyCheck {
                    port: 2222,
                    timeout_ms: 500
                }),
            }
        );
        assert_eq!(
            config.hosts[1],
            Host {
                name: "build-2".into(),
                address: Address::Name("build-2.example.com".into()),
                labels: vec!["small".into()],
                max_jobs: 1,
                username: None,
                port: DEFAULT_PORT,
                host_keys: vec![],
                ready_check: None,
            }
        );
        assert_eq!(
            config.hosts[2].address,
            Address::V6("2001:db8::1".parse().unwrap())
        );
        assert_eq!(
            config.hosts[2].ready_check,
            Some(ReadyCheck {
                port: 8080,
                timeout_ms: DEFAULT_TIMEOUT_MS
            })
        );
        assert_eq!(config.slots(), 5);
        assert!(parse(r#"{"hosts": []}"#).is_ok_and(|c| c.hosts.is_empty()));
    }

    /// Every problem of a config, in order.
    fn check(config: &str, expect: &[&str]) {
        match parse(config) {
            Ok(_) => panic!("{config}: accepted"),
            Err(problems) => assert_eq!(problems, expect, "{config}"),
        }
    }

    #[test]
    fn problems_name_their_key() {
        check("[]", &["config: must be a JSON object"]);
        check(
            "{",
            &["config: EOF while parsing an object at line 1 column 1"],
        );
        check("{}", &["hosts: missing; it is required"]);
        check(
            r#"{"hosts": {}, "colour": 1}"#,
            &[
                "colour: unknown key; expected one of hosts",
                "hosts: must be a list of hosts",
            ],
        );
        check(
            r#"{"hosts": [
                {"name": "a", "address": "10.0.0.1", "labels": ["s"]},
                {"name": "a", "address": "[::1]", "labels": []},
                7,
                {"name": "c/d", "address": "-bad-", "labels": ["s", ""], "max-parallel-jobs": 0,
                 "port": 70000, "username": "", "host-keys": "k", "ready-check": {"timeout-ms": 0, "x": 1},
                 "colour": "red"}
            ]}"#,
            &[
                "hosts[1].address: write an IPv6 address without brackets",
                "hosts[1].labels: must name at least one instance type",
                "hosts[1].name: \"a\" is already the name of another host",
                "hosts[2]: must be an object",
                "hosts[3].colour: unknown key; expected one of name, address, labels, \
                 max-parallel-jobs, username, port, host-keys, ready-check",
                "hosts[3].name: must be 1 to 64 of A-Z a-z 0-9 . _ -; got \"c/d\"",
                "hosts[3].address: \"-bad-\" is neither an IP address nor a host name",
                "hosts[3].labels: must not hold an empty string",
                "hosts[3].max-parallel-jobs: must be a whole number from 1 to 1000",
                "hosts[3].username: must not be empty",
                "hosts[3].port: must be a whole number from 1 to 65535",
                "hosts[3].host-keys: must be a list of strings",
                "hosts[3].ready-check.x: unknown key; expected one of port, timeout-ms",
                "hosts[3].ready-check.timeout-ms: must be a whole number from 1 to 30000",
            ],
        );
        check(
            r#"{"hosts": [
                {"name": "a", "address": "h", "labels": ["s"]},
                {"name": "a", "address": "h", "labels": ["s"], "ready-check": true}
            ]}"#,
            &[
                "hosts[1].ready-check: must be an object (`{}` probes the host's port)",
                "hosts[1].name: \"a\" is already the name of another host",
            ],
        );
        check(
            r#"{"hosts": [{"labels": ["s"]}]}"#,
            &[
                "hosts[0].name: missing; it is required",
                "hosts[0].address: missing; it is required",
            ],
        );
        let many: Vec<String> = (0..5)
            .map(|i| {
                format!(r#"{{"name": "h{i}", "address": "h", "labels": ["s"], "max-parallel-jobs": 1000}}"#)
            })
            .collect();
        check(
            &format!(r#"{{"hosts": [{}]}}"#, many.join(",")),
            &["hosts: 5000 slots in all, more than the 4000 allowed"],
        );
    }
}
