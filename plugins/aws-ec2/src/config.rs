//! The provider config and the label options, read from JSON by hand so that
//! every problem is reported at once, each naming its key; and their schemas
//! for `describe`.

use berth_sdk::config::{Reader, field};
use berth_sdk::types::{ConfigField, FieldType};
use serde_json::Value;

/// `DescribeInstances` takes 5 to 1000 results per page.
const PAGE_SIZES: std::ops::RangeInclusive<u64> = 5..=1000;
const DEFAULT_PAGE_SIZE: u32 = 1000;
/// An EBS root volume's size in GiB (gp2/gp3 allow 1 to 16384, io2 more).
const VOLUME_SIZES: std::ops::RangeInclusive<u64> = 1..=65536;

/// The provider config, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Config {
    pub region: String,
    /// Where requests go: `http(s)://host[:port][/path]`, no trailing `/`.
    pub endpoint: String,
    /// `MaxResults` of each `DescribeInstances` page.
    pub page_size: u32,
}

/// How an instance is bought.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Market {
    #[default]
    OnDemand,
    /// A one-time Spot request that terminates on interruption.
    Spot,
}

/// A label's options, checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LabelOptions {
    pub subnet_id: Option<String>,
    pub security_group_ids: Vec<String>,
    pub key_name: Option<String>,
    pub root_volume_size: Option<u32>,
    pub root_volume_type: Option<String>,
    pub root_device_name: Option<String>,
    pub market: Market,
    /// An instance profile name, or its ARN.
    pub instance_profile: Option<String>,
}

impl LabelOptions {
    /// Whether the root volume is changed from the image's, which needs the
    /// image's root device name.
    pub fn sets_root_volume(&self) -> bool {
        self.root_volume_size.is_some() || self.root_volume_type.is_some()
    }
}

/// The provider config's schema.
pub(crate) fn config_fields() -> Vec<ConfigField> {
    vec![
        field(
            "region",
            FieldType::String,
            true,
            None,
            "The AWS region, for example `us-east-1`. The host signs each request for this \
             region and the `ec2` service.",
        ),
        field(
            "endpoint",
            FieldType::String,
            false,
            None,
            "Base URL of the EC2 API; absent: `https://ec2.REGION.amazonaws.com` (`.com.cn` for \
             `cn-` regions). Set it for other partitions, VPC endpoints or a local test server. \
             Its host must be in the provider's allowed hosts.",
        ),
        field(
            "page-size",
            FieldType::Integer,
            false,
            Some("1000"),
            "`MaxResults` of each DescribeInstances page, 5 to 1000. Every page is followed.",
        ),
    ]
}

/// The label options' schema.
pub(crate) fn label_option_fields() -> Vec<ConfigField> {
    vec![
        field(
            "subnet-id",
            FieldType::String,
            false,
            None,
            "The subnet to launch into (`subnet-…`); absent: the default subnet of the \
             default VPC.",
        ),
        field(
            "security-group-ids",
            FieldType::StringList,
            false,
            Some("[]"),
            "Security group ids (`sg-…`) for the instance; empty: the VPC's default group.",
        ),
        field(
            "key-name",
            FieldType::String,
            false,
            None,
            "Name of an EC2 key pair to authorise for login.",
        ),
        field(
            "root-volume-size",
            FieldType::Integer,
            false,
            None,
            "Size of the root EBS volume in GiB; absent: the image's.",
        ),
        field(
            "root-volume-type",
            FieldType::String,
            false,
            None,
            "EBS type of the root volume (`gp3`, `gp2`, `io2`, …); absent: the image's.",
        ),
        field(
            "root-device-name",
            FieldType::String,
            false,
            None,
            "The image's root device (`/dev/xvda`, `/dev/sda1`), used with the two options \
             above; absent: asked of DescribeImages.",
        ),
        field(
            "market",
            FieldType::String,
            false,
            Some("\"on-demand\""),
            "`on-demand` or `spot` (a one-time Spot request, terminated on interruption).",
        ),
        field(
            "instance-profile",
            FieldType::String,
            false,
            None,
            "IAM instance profile for the instance: its name, or its ARN (`arn:…`).",
        ),
    ]
}

/// Reads the provider config. The error names every bad key.
pub(crate) fn parse_config(text: &str) -> Result<Config, String> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| format!("provider config: not JSON: {e}"))?;
    let mut r = Reader::new("provider config", &value, &config_fields())?;
    let region = r.string("region");
    match &region {
        Some(region) if !valid_region(region) => {
            r.problem(
                "region",
                format_args!("{region:?} is not a region name like us-east-1"),
            );
        }
        Some(_) => {}
        None if !r.has("region") => r.problem("region", "missing; for example \"us-east-1\""),
        None => {}
    }
    let endpoint = r.endpoint("endpoint");
    let page_size = r.integer("page-size", PAGE_SIZES);
    r.finish()?;
    let region = region.unwrap_or_default();
    let endpoint = endpoint.unwrap_or_else(|| default_endpoint(&region));
    Ok(Config {
        region,
        endpoint,
        page_size: page_size.map_or(DEFAULT_PAGE_SIZE, |n| n as u32),
    })
}

/// `us-east-1`, `eu-central-2`, `us-gov-west-1`, `cn-north-1`, `us-isob-east-1`:
/// lowercase words and digits joined by `-`, at least three parts.
fn valid_region(region: &str) -> bool {
    let parts: Vec<&str> = region.split('-').collect();
    parts.len() >= 3
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
}

/// The public endpoint of EC2 in `region`.
fn default_endpoint(region: &str) -> String {
    let domain = if region.starts_with("cn-") {
        "amazonaws.com.cn"
    } else {
        "amazonaws.com"
    };
    format!("https://ec2.{region}.{domain}")
}

/// Reads a create spec's label options. The error names every bad key.
pub(crate) fn parse_label_options(text: &str) -> Result<LabelOptions, String> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| format!("label options: not JSON: {e}"))?;
    let mut r = Reader::new("label option", &value, &label_option_fields())?;
    let subnet_id = r.string("subnet-id");
    if let Some(id) = &subnet_id
        && !id.starts_with("subnet-")
    {
        r.problem(
            "subnet-id",
            format_args!("{id:?} is not a subnet id (subnet-…)"),
        );
    }
    let security_group_ids = r.strings("security-group-ids");
    for id in &security_group_ids {
        if !id.starts_with("sg-") {
            r.problem(
                "security-group-ids",
                format_args!("{id:?} is not a security group id (sg-…)"),
            );
        }
    }
    let key_name = r.string("key-name");
    let root_volume_size = r
        .integer("root-volume-size", VOLUME_SIZES)
        .map(|n| n as u32);
    let root_volume_type = r.string("root-volume-type");
    let root_device_name = r.string("root-device-name");
    if let Some(name) = &root_device_name
        && !name.starts_with("/dev/")
    {
        r.problem(
            "root-device-name",
            format_args!("{name:?} is not a device name (/dev/…)"),
        );
    }
    let market = match r.string("market").as_deref() {
        None | Some("on-demand") => Market::OnDemand,
        Some("spot") => Market::Spot,
        Some(other) => {
            r.problem(
                "market",
                format_args!("{other:?}: expected \"on-demand\" or \"spot\""),
            );
            Market::OnDemand
        }
    };
    let instance_profile = r.string("instance-profile");
    r.finish()?;
    Ok(LabelOptions {
        subnet_id,
        security_group_ids,
        key_name,
        root_volume_size,
        root_volume_type,
        root_device_name,
        market,
        instance_profile,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_and_overrides() {
        let c = parse_config(r#"{"region": "us-east-1"}"#).expect("valid");
        assert_eq!(
            c,
            Config {
                region: "us-east-1".into(),
                endpoint: "https://ec2.us-east-1.amazonaws.com".into(),
                page_size: 1000,
            }
        );
        let c = parse_config(r#"{"region": "cn-north-1"}"#).expect("valid");
        assert_eq!(c.endpoint, "https://ec2.cn-north-1.amazonaws.com.cn");
        let c = parse_config(
            r#"{"region": "us-gov-west-1", "endpoint": "http://127.0.0.1:5000/", "page-size": 5}"#,
        )
        .expect("valid");
        assert_eq!(c.endpoint, "http://127.0.0.1:5000");
        assert_eq!(c.page_size, 5);
    }

    #[test]
    fn config_problems_name_every_key() {
        for (text, needles) in [
            ("{}", &["region: missing"][..]),
            ("[]", &["must be a JSON object"]),
            ("nope", &["not JSON"]),
            (r#"{"region": ""}"#, &["region: must not be empty"]),
            (r#"{"region": 1}"#, &["region: must be a string"]),
            (
                r#"{"region": "US East"}"#,
                &["region: \"US East\" is not a region"],
            ),
            (
                r#"{"region": "us-east-1", "endpoint": "ftp://x"}"#,
                &["endpoint:"],
            ),
            (
                r#"{"region": "us-east-1", "endpoint": "http://h/?a=1"}"#,
                &["endpoint: must not have a query"],
            ),
            (
                r#"{"region": "us-east-1", "page-size": 4}"#,
                &["page-size: must be a whole number from 5 to 1000"],
            ),
            (
                r#"{"region": "us-east-1", "page-size": "9"}"#,
                &["page-size: must be an integer"],
            ),
            (
                r#"{"access_key": "x", "page-size": 2000}"#,
                &[
                    "region: missing",
                    "page-size",
                    "access_key: unknown key; expected one of region, endpoint, page-size",
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
        let o = parse_label_options(
            r#"{"subnet-id": "subnet-1", "security-group-ids": ["sg-1", "sg-2"], "key-name": "ops",
                "root-volume-size": 40, "root-volume-type": "gp3", "market": "spot",
                "instance-profile": "runner"}"#,
        )
        .expect("valid");
        assert_eq!(
            o,
            LabelOptions {
                subnet_id: Some("subnet-1".into()),
                security_group_ids: vec!["sg-1".into(), "sg-2".into()],
                key_name: Some("ops".into()),
                root_volume_size: Some(40),
                root_volume_type: Some("gp3".into()),
                root_device_name: None,
                market: Market::Spot,
                instance_profile: Some("runner".into()),
            }
        );
        assert!(o.sets_root_volume());
    }

    #[test]
    fn label_option_problems_name_every_key() {
        for (text, needles) in [
            ("[]", &["must be a JSON object"][..]),
            (
                r#"{"subnet-id": "s-1"}"#,
                &["subnet-id: \"s-1\" is not a subnet id"],
            ),
            (
                r#"{"security-group-ids": "sg-1"}"#,
                &["security-group-ids: must be a list"],
            ),
            (
                r#"{"security-group-ids": ["sg-1", 2, "x"]}"#,
                &[
                    "item 1 must be a string",
                    "\"x\" is not a security group id",
                ],
            ),
            (
                r#"{"root-volume-size": 0}"#,
                &["root-volume-size: must be a whole number from 1"],
            ),
            (
                r#"{"root-volume-size": 8.5}"#,
                &["root-volume-size: must be a whole number"],
            ),
            (
                r#"{"root-device-name": "xvda"}"#,
                &["root-device-name: \"xvda\" is not a device name"],
            ),
            (
                r#"{"market": "reserved"}"#,
                &["market: \"reserved\": expected \"on-demand\" or \"spot\""],
            ),
            (
                r#"{"zone": "a", "key-name": 3}"#,
                &[
                    "label option zone: unknown key",
                    "key-name: must be a string",
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
    fn region_names() {
        for ok in [
            "us-east-1",
            "eu-central-2",
            "us-gov-west-1",
            "cn-north-1",
            "us-isob-east-1",
        ] {
            assert!(valid_region(ok), "{ok}");
        }
        for bad in [
            "",
            "us",
            "us-east",
            "US-EAST-1",
            "us--1",
            "us_east_1",
            "us-east-1/x",
        ] {
            assert!(!valid_region(bad), "{bad}");
        }
    }
}
