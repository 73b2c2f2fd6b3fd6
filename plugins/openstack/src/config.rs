//! The provider config and the label options, read from JSON by hand so that
//! every problem is reported at once, each naming its key; and their schemas
//! for `describe`.

use std::time::Duration;

use berth_sdk::config::{Reader, field};
use berth_sdk::types::{ConfigField, FieldType};
use serde_json::Value;

/// Nova's `max_limit` is 1000 by default; a page asks for at most that.
const PAGE_SIZES: std::ops::RangeInclusive<u64> = 1..=1000;
const DEFAULT_PAGE_SIZE: u32 = 1000;
/// How long a re-sent create may wait for an earlier try's server to show
/// in a list: at most this, so that the call ends well within berth's call
/// deadline (30 s by default).
pub(crate) const MAX_LIST_LAG: Duration = Duration::from_secs(20);
const DEFAULT_LIST_LAG: Duration = Duration::from_secs(5);
/// How long set-tags waits for a server to be built, at most: the same
/// bound, for the same deadline.
pub(crate) const MAX_BUILD_WAIT: Duration = Duration::from_secs(20);
const DEFAULT_BUILD_WAIT: Duration = Duration::from_secs(10);
const INTERFACES: [&str; 3] = ["public", "internal", "admin"];

/// Where the compute endpoint comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// Keystone's catalog, from the exchange of the credential for this host.
    Catalog {
        host: String,
        interface: String,
        region: Option<String>,
    },
    /// Given in the config, without a trailing `/`.
    Fixed(String),
}

/// The provider config, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Config {
    pub endpoint: Endpoint,
    /// Networks (UUIDs) servers join; empty: Nova's `auto`.
    pub networks: Vec<String>,
    /// `limit` of each `servers/detail` page.
    pub page_size: u32,
    /// How long a new server may be missing from Nova's lists.
    pub list_lag: Duration,
    /// How long set-tags waits for a server still building.
    pub build_wait: Duration,
}

/// A label's options, checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LabelOptions {
    /// Networks (UUIDs), in place of the provider's.
    pub networks: Option<Vec<String>>,
    pub key_name: Option<String>,
    pub security_groups: Vec<String>,
    pub availability_zone: Option<String>,
    pub config_drive: Option<bool>,
}

/// The provider config's schema.
pub(crate) fn config_fields() -> Vec<ConfigField> {
    vec![
        field(
            "credential-host",
            FieldType::String,
            false,
            None,
            "The `host` of the provider's `keystone` credential (as in its allowed hosts). The \
             compute endpoint is read from the Keystone catalog its exchange returned. Required \
             unless `compute-endpoint` is set.",
        ),
        field(
            "compute-endpoint",
            FieldType::String,
            false,
            None,
            "The Compute API's base URL (`https://nova.example.com:8774/v2.1`), in place of the \
             catalog's. Its host must be in the allowed hosts and have the keystone credential.",
        ),
        field(
            "interface",
            FieldType::String,
            false,
            Some("\"public\""),
            "Which catalog endpoint of the compute service: `public`, `internal` or `admin`.",
        ),
        field(
            "region",
            FieldType::String,
            false,
            None,
            "The catalog region (its id or name) of the compute endpoint; needed when the \
             catalog has compute in several regions.",
        ),
        field(
            "networks",
            FieldType::StringList,
            false,
            Some("[]"),
            "Network UUIDs every server joins; empty: Nova's `auto` (the project's network).",
        ),
        field(
            "page-size",
            FieldType::Integer,
            false,
            Some("1000"),
            "`limit` of each `servers/detail` page, 1 to 1000. Every page is followed.",
        ),
        field(
            "list-lag",
            FieldType::String,
            false,
            Some("\"5s\""),
            "How long a new server may take to show in Nova's lists (`0s` to `20s`). A create \
             sent again after its answer was lost looks for the server the first try may have \
             made for this long before it makes another.",
        ),
        field(
            "build-wait",
            FieldType::String,
            false,
            Some("\"10s\""),
            "How long set-tags waits for a server that is still building (`0s` to `20s`): Nova \
             changes no metadata until a server is built. Past it, set-tags answers transient \
             and berth tries again later.",
        ),
    ]
}

/// The label options' schema.
pub(crate) fn label_option_fields() -> Vec<ConfigField> {
    vec![
        field(
            "networks",
            FieldType::StringList,
            false,
            None,
            "Network UUIDs the label's servers join, in place of the provider's `networks`.",
        ),
        field(
            "key-name",
            FieldType::String,
            false,
            None,
            "A Nova key pair to authorise for login (`key_name`).",
        ),
        field(
            "security-groups",
            FieldType::StringList,
            false,
            Some("[]"),
            "Security group names; empty: the project's `default`.",
        ),
        field(
            "availability-zone",
            FieldType::String,
            false,
            None,
            "The availability zone to boot in; absent: the cloud's default.",
        ),
        field(
            "config-drive",
            FieldType::Boolean,
            false,
            None,
            "Whether Nova attaches a config drive (for images that read user data from one).",
        ),
    ]
}

/// A network id as Nova takes it: a UUID, with or without dashes.
fn is_uuid(text: &str) -> bool {
    let hex: String = text.chars().filter(|c| *c != '-').collect();
    hex.len() == 32
        && hex.chars().all(|c| c.is_ascii_hexdigit())
        && (text.len() == 32 || text.len() == 36)
}

/// Reads the provider config. The error names every bad key.
pub(crate) fn parse_config(text: &str) -> Result<Config, String> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| format!("provider config: not JSON: {e}"))?;
    let mut r = Reader::new("provider config", &value, &config_fields())?;
    let host = r.string("credential-host");
    if let Some(h) = &host
        && (h.contains('/') || h.contains(char::is_whitespace))
    {
        r.problem(
            "credential-host",
            format_args!("{h:?} is not a host or host:port (the credential's `host`)"),
        );
    }
    let fixed = r.endpoint("compute-endpoint");
    let interface = r.string("interface");
    if let Some(i) = &interface
        && !INTERFACES.contains(&i.as_str())
    {
        r.problem(
            "interface",
            format_args!("{i:?}: expected public, internal or admin"),
        );
    }
    let region = r.string("region");
    if host.is_none() && fixed.is_none() && !r.has("credential-host") {
        r.problem(
            "credential-host",
            "missing: name the keystone credential's host, or set compute-endpoint",
        );
    }
    let networks = r.strings("networks");
    for n in &networks {
        if !is_uuid(n) {
            r.problem("networks", format_args!("{n:?} is not a network UUID"));
        }
    }
    let page_size = r.integer("page-size", PAGE_SIZES);
    let list_lag = r.duration("list-lag", MAX_LIST_LAG);
    let build_wait = r.duration("build-wait", MAX_BUILD_WAIT);
    r.finish()?;
    let endpoint = match (fixed, host) {
        (Some(url), _) => Endpoint::Fixed(url),
        (None, Some(host)) => Endpoint::Catalog {
            host,
            interface: interface.unwrap_or_else(|| "public".into()),
            region,
        },
        (None, None) => return Err("provider config credential-host: missing".into()),
    };
    Ok(Config {
        endpoint,
        networks,
        page_size: page_size.map_or(DEFAULT_PAGE_SIZE, |n| n as u32),
        list_lag: list_lag.unwrap_or(DEFAULT_LIST_LAG),
        build_wait: build_wait.unwrap_or(DEFAULT_BUILD_WAIT),
    })
}

/// Reads a create spec's label options. The error names every bad key.
pub(crate) fn parse_label_options(text: &str) -> Result<LabelOptions, String> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| format!("label options: not JSON: {e}"))?;
    let mut r = Reader::new("label option", &value, &label_option_fields())?;
    let networks = r.has("networks").then(|| r.strings("networks"));
    for n in networks.iter().flatten() {
        if !is_uuid(n) {
            r.problem("networks", format_args!("{n:?} is not a network UUID"));
        }
    }
    let key_name = r.string("key-name");
    let security_groups = r.strings("security-groups");
    let availability_zone = r.string("availability-zone");
    let config_drive = r.boolean("config-drive");
    r.finish()?;
    Ok(LabelOptions {
        networks,
        key_name,
        security_groups,
        availability_zone,
        config_drive,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NET: &str = "3cb9bc59-5699-4588-a4b1-b87f96708bc6";

    #[test]
    fn config_defaults_and_overrides() {
        let c = parse_config(r#"{"credential-host": "nova.example.com:8774"}"#).expect("valid");
        assert_eq!(
            c,
            Config {
                endpoint: Endpoint::Catalog {
                    host: "nova.example.com:8774".into(),
                    interface: "public".into(),
                    region: None,
                },
                networks: vec![],
                page_size: 1000,
                list_lag: Duration::from_secs(5),
                build_wait: Duration::from_secs(10),
            }
        );
        let c = parse_config(&format!(
            r#"{{"credential-host": "h", "interface": "internal", "region": "RegionTwo",
                "networks": ["{NET}"], "page-size": 5, "list-lag": "1500ms", "build-wait": "0s"}}"#
        ))
        .expect("valid");
        assert_eq!(
            c.endpoint,
            Endpoint::Catalog {
                host: "h".into(),
                interface: "internal".into(),
                region: Some("RegionTwo".into()),
            }
        );
        assert_eq!(c.networks, [NET]);
        assert_eq!((c.page_size, c.list_lag), (5, Duration::from_millis(1500)));
        assert_eq!(c.build_wait, Duration::ZERO);
        let c =
            parse_config(r#"{"compute-endpoint": "http://127.0.0.1:8774/v2.1/"}"#).expect("valid");
        assert_eq!(
            c.endpoint,
            Endpoint::Fixed("http://127.0.0.1:8774/v2.1".into())
        );
    }

    #[test]
    fn config_problems_name_every_key() {
        for (text, needles) in [
            ("{}", &["credential-host: missing"][..]),
            ("[]", &["must be a JSON object"]),
            ("nope", &["not JSON"]),
            (
                r#"{"credential-host": "https://k/v3"}"#,
                &["credential-host: \"https://k/v3\" is not a host"],
            ),
            (r#"{"compute-endpoint": "ftp://x"}"#, &["compute-endpoint:"]),
            (
                r#"{"compute-endpoint": "http://h/v2.1?x=1"}"#,
                &["compute-endpoint: must not have a query"],
            ),
            (
                r#"{"credential-host": "h", "interface": "private"}"#,
                &["interface: \"private\": expected public"],
            ),
            (
                r#"{"credential-host": "h", "networks": ["net-1", 3]}"#,
                &["\"net-1\" is not a network UUID", "item 1 must be a string"],
            ),
            (
                r#"{"credential-host": "h", "page-size": 0}"#,
                &["page-size: must be a whole number from 1 to 1000"],
            ),
            (
                r#"{"credential-host": "h", "list-lag": "1m"}"#,
                &["list-lag: \"1m\" is not a duration"],
            ),
            (
                r#"{"credential-host": "h", "list-lag": "21s"}"#,
                &["list-lag: \"21s\" is more than 20s"],
            ),
            (
                r#"{"credential-host": "h", "build-wait": "1h"}"#,
                &["build-wait: \"1h\" is not a duration"],
            ),
            (
                r#"{"password": "x", "page-size": "9"}"#,
                &[
                    "credential-host: missing",
                    "page-size: must be an integer",
                    "password: unknown key; expected one of credential-host, compute-endpoint",
                ],
            ),
        ] {
            match parse_config(text) {
                Err(m) => {
                    for needle in needles {
                        assert!(m.contains(needle), "{text}: {m:?} lacks {needle:?}");
                    }
                }
                Ok(c) => panic!("{text}: accepted as {c:?}"),
            }
        }
    }

    #[test]
    fn label_options_read() {
        assert_eq!(parse_label_options("{}"), Ok(LabelOptions::default()));
        let o = parse_label_options(&format!(
            r#"{{"networks": ["{NET}"], "key-name": "ops", "security-groups": ["default", "ssh"],
                "availability-zone": "az1", "config-drive": true}}"#
        ))
        .expect("valid");
        assert_eq!(
            o,
            LabelOptions {
                networks: Some(vec![NET.into()]),
                key_name: Some("ops".into()),
                security_groups: vec!["default".into(), "ssh".into()],
                availability_zone: Some("az1".into()),
                config_drive: Some(true),
            }
        );
        for (text, needles) in [
            ("[]", &["must be a JSON object"][..]),
            (r#"{"networks": "x"}"#, &["networks: must be a list"]),
            (
                r#"{"config-drive": "yes"}"#,
                &["config-drive: must be true or false"],
            ),
            (
                r#"{"flavor": "m1.small", "key-name": ""}"#,
                &[
                    "label option flavor: unknown key",
                    "key-name: must not be empty",
                ],
            ),
        ] {
            match parse_label_options(text) {
                Err(m) => {
                    for needle in needles {
                        assert!(m.contains(needle), "{text}: {m:?} lacks {needle:?}");
                    }
                }
                Ok(o) => panic!("{text}: accepted as {o:?}"),
            }
        }
    }

    #[test]
    fn uuids() {
        assert!(is_uuid(NET));
        assert!(is_uuid(&NET.replace('-', "")));
        assert!(!is_uuid("private"));
        assert!(!is_uuid(&format!("{NET}0")));
    }
}
