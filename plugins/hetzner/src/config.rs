//! The provider config and the label options, each problem reported naming
//! its key; and their schemas for `describe`.

use berth_sdk::config::{Reader, field};
use berth_sdk::types::{ConfigField, FieldType};
use serde_json::Value;

/// The API's public endpoint.
pub(crate) const DEFAULT_ENDPOINT: &str = "https://api.hetzner.cloud/v1";
/// Hetzner pages hold 1 to 50 items.
const PAGE_SIZES: std::ops::RangeInclusive<u64> = 1..=50;
const DEFAULT_PAGE_SIZE: u32 = 50;

/// The provider config, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Config {
    /// The API's base URL, no trailing `/`.
    pub endpoint: String,
    /// `per_page` of each list.
    pub page_size: u32,
    /// Where servers go unless a label says otherwise.
    pub location: Option<String>,
}

/// A label's options, checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LabelOptions {
    pub location: Option<String>,
    pub ssh_keys: Vec<String>,
    pub networks: Vec<u64>,
    pub firewalls: Vec<u64>,
    pub placement_group: Option<u64>,
    pub public_ipv4: Option<bool>,
    pub public_ipv6: Option<bool>,
}

/// The provider config's schema.
pub(crate) fn config_fields() -> Vec<ConfigField> {
    vec![
        field(
            "endpoint",
            FieldType::String,
            false,
            Some("\"https://api.hetzner.cloud/v1\""),
            "Base URL of the Hetzner Cloud API. Its host must be in the provider's allowed \
             hosts, with a `bearer` credential holding the project's API token.",
        ),
        field(
            "page-size",
            FieldType::Integer,
            false,
            Some("50"),
            "`per_page` of each list, 1 to 50. Every page is followed.",
        ),
        field(
            "location",
            FieldType::String,
            false,
            None,
            "The location servers are created in (`fsn1`, `nbg1`, `hel1`, `ash`, `hil`, \
             `sin`) unless a label sets its own; absent: the one Hetzner picks.",
        ),
    ]
}

/// The label options' schema.
pub(crate) fn label_option_fields() -> Vec<ConfigField> {
    vec![
        field(
            "location",
            FieldType::String,
            false,
            None,
            "The location to create the label's servers in; absent: the provider's.",
        ),
        field(
            "ssh-keys",
            FieldType::StringList,
            false,
            Some("[]"),
            "Names or ids of SSH keys of the project to authorise for `root`.",
        ),
        field(
            "networks",
            FieldType::StringList,
            false,
            Some("[]"),
            "Ids of private networks to attach.",
        ),
        field(
            "firewalls",
            FieldType::StringList,
            false,
            Some("[]"),
            "Ids of firewalls to apply.",
        ),
        field(
            "placement-group",
            FieldType::String,
            false,
            None,
            "Id of a placement group to create the servers in.",
        ),
        field(
            "public-ipv4",
            FieldType::Boolean,
            false,
            Some("true"),
            "Whether the server gets a public IPv4 address.",
        ),
        field(
            "public-ipv6",
            FieldType::Boolean,
            false,
            Some("true"),
            "Whether the server gets a public IPv6 network.",
        ),
    ]
}

/// A location name: lowercase letters and digits.
fn valid_location(l: &str) -> bool {
    !l.is_empty()
        && l.len() <= 32
        && l.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Reads the provider config. The error names every bad key.
pub(crate) fn parse_config(text: &str) -> Result<Config, String> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| format!("provider config: not JSON: {e}"))?;
    let mut r = Reader::new("provider config", &value, &config_fields())?;
    let endpoint = r.endpoint("endpoint");
    let page_size = r.integer("page-size", PAGE_SIZES);
    let location = r.string("location");
    if let Some(l) = &location
        && !valid_location(l)
    {
        r.problem(
            "location",
            format_args!("{l:?} is not a location name like fsn1"),
        );
    }
    r.finish()?;
    Ok(Config {
        endpoint: endpoint.unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned()),
        page_size: page_size.map_or(DEFAULT_PAGE_SIZE, |n| n as u32),
        location,
    })
}

/// The ids among `texts` (positive integers); a problem of `key` for each
/// other.
fn ids(r: &mut Reader<'_>, key: &str, texts: Vec<String>) -> Vec<u64> {
    let mut out = Vec::new();
    for id in texts {
        match id.parse::<u64>() {
            Ok(n) if n > 0 => out.push(n),
            _ => r.problem(
                key,
                format_args!("{id:?} is not an id (a positive integer)"),
            ),
        }
    }
    out
}

/// Reads a create spec's label options. The error names every bad key.
pub(crate) fn parse_label_options(text: &str) -> Result<LabelOptions, String> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| format!("label options: not JSON: {e}"))?;
    let mut r = Reader::new("label option", &value, &label_option_fields())?;
    let location = r.string("location");
    if let Some(l) = &location
        && !valid_location(l)
    {
        r.problem(
            "location",
            format_args!("{l:?} is not a location name like fsn1"),
        );
    }
    let ssh_keys = r.strings("ssh-keys");
    let texts = r.strings("networks");
    let networks = ids(&mut r, "networks", texts);
    let texts = r.strings("firewalls");
    let firewalls = ids(&mut r, "firewalls", texts);
    let placement_group =
        (r.string("placement-group")).and_then(|id| ids(&mut r, "placement-group", vec![id]).pop());
    let public_ipv4 = r.boolean("public-ipv4");
    let public_ipv6 = r.boolean("public-ipv6");
    r.finish()?;
    Ok(LabelOptions {
        location,
        ssh_keys,
        networks,
        firewalls,
        placement_group,
        public_ipv4,
        public_ipv6,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_and_problems() {
        let c = parse_config("{}").expect("valid");
        assert_eq!(c.endpoint, DEFAULT_ENDPOINT);
        assert_eq!(c.page_size, 50);
        assert_eq!(c.location, None);
        let c = parse_config(
            r#"{"endpoint": "http://127.0.0.1:9/v1/", "page-size": 5, "location": "nbg1"}"#,
        )
        .expect("valid");
        assert_eq!(c.endpoint, "http://127.0.0.1:9/v1");
        assert_eq!((c.page_size, c.location.as_deref()), (5, Some("nbg1")));
        let e = parse_config(r#"{"page-size": 51, "location": "Falkenstein", "region": "x"}"#)
            .expect_err("three problems");
        for needle in ["page-size", "location", "region: unknown key"] {
            assert!(e.contains(needle), "{needle}: {e}");
        }
    }

    #[test]
    fn label_options_are_checked() {
        let o = parse_label_options(
            r#"{"location": "hel1", "ssh-keys": ["ops"], "networks": ["12"], "firewalls": ["7"],
                "placement-group": "3", "public-ipv4": false}"#,
        )
        .expect("valid");
        assert_eq!(o.networks, [12]);
        assert_eq!(o.firewalls, [7]);
        assert_eq!(o.placement_group, Some(3));
        assert_eq!(o.public_ipv4, Some(false));
        assert_eq!(o.public_ipv6, None);
        let e = parse_label_options(r#"{"networks": ["net-1"], "public-ipv6": "yes"}"#)
            .expect_err("two problems");
        assert!(e.contains("networks") && e.contains("public-ipv6"), "{e}");
    }
}
