//! The provider config and the label options, each problem reported naming
//! its key; and their schemas for `describe`.

use berth_sdk::config::{Reader, field};
use berth_sdk::types::{ConfigField, FieldType};
use serde_json::Value;

/// ARM's public endpoint.
pub(crate) const DEFAULT_ENDPOINT: &str = "https://management.azure.com";
/// An OS disk's size in GiB.
const DISK_SIZES: std::ops::RangeInclusive<u64> = 1..=4095;

/// The provider config, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Config {
    pub endpoint: String,
    pub subscription: String,
    pub resource_group: String,
    pub location: String,
    pub subnet_id: Option<String>,
}

/// A label's options, checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LabelOptions {
    pub subnet_id: Option<String>,
    pub admin_username: Option<String>,
    pub ssh_public_key: Option<String>,
    pub os_disk_type: Option<String>,
    pub os_disk_size_gb: Option<u32>,
    pub public_ip: bool,
    pub spot: bool,
    pub zone: Option<String>,
}

/// The provider config's schema.
pub(crate) fn config_fields() -> Vec<ConfigField> {
    vec![
        field(
            "subscription-id",
            FieldType::String,
            true,
            None,
            "The Azure subscription (a GUID).",
        ),
        field(
            "resource-group",
            FieldType::String,
            true,
            None,
            "The resource group berth's VMs go in; best one kept for them.",
        ),
        field(
            "location",
            FieldType::String,
            true,
            None,
            "The region of the resource group's VMs (`westeurope`, `eastus2`, …).",
        ),
        field(
            "subnet-id",
            FieldType::String,
            false,
            None,
            "The ARM id of the subnet VMs' network interfaces join, unless a label sets its own.",
        ),
        field(
            "endpoint",
            FieldType::String,
            false,
            Some("\"https://management.azure.com\""),
            "Base URL of Azure Resource Manager (another cloud's, or a test server). Its host \
             must be in the provider's allowed hosts, with an `oauth2-client-credentials` \
             credential for it.",
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
            "The subnet's ARM id; absent: the provider's.",
        ),
        field(
            "admin-username",
            FieldType::String,
            false,
            Some("\"berth\""),
            "The VM's admin user, who gets the SSH key.",
        ),
        field(
            "ssh-public-key",
            FieldType::String,
            false,
            None,
            "An SSH public key for the admin user when the request brings none (Azure wants one).",
        ),
        field(
            "os-disk-type",
            FieldType::String,
            false,
            None,
            "The OS disk's storage type (`Standard_LRS`, `StandardSSD_LRS`, `Premium_LRS`, …); \
             absent: Azure's default for the size.",
        ),
        field(
            "os-disk-size-gb",
            FieldType::Integer,
            false,
            None,
            "The OS disk's size in GiB; absent: the image's.",
        ),
        field(
            "public-ip",
            FieldType::Boolean,
            false,
            Some("false"),
            "Whether the VM gets a public IP address (deleted with it).",
        ),
        field(
            "spot",
            FieldType::Boolean,
            false,
            Some("false"),
            "A Spot VM, deleted when evicted.",
        ),
        field(
            "zone",
            FieldType::String,
            false,
            None,
            "An availability zone (`1`, `2`, `3`).",
        ),
    ]
}

/// A subnet's ARM id.
fn valid_subnet(id: &str) -> bool {
    id.starts_with("/subscriptions/")
        && id.contains("/providers/Microsoft.Network/virtualNetworks/")
        && id.contains("/subnets/")
}

/// Reads the provider config. The error names every bad key.
pub(crate) fn parse_config(text: &str) -> Result<Config, String> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| format!("provider config: not JSON: {e}"))?;
    let mut r = Reader::new("provider config", &value, &config_fields())?;
    let required = |r: &mut Reader<'_>, key: &str, example: &str| {
        let v = r.string(key);
        if v.is_none() && !r.has(key) {
            r.problem(key, format_args!("missing; for example {example:?}"));
        }
        v
    };
    let subscription = required(
        &mut r,
        "subscription-id",
        "00000000-0000-0000-0000-000000000000",
    );
    if let Some(s) = &subscription
        && !(s.len() == 36 && s.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-'))
    {
        r.problem(
            "subscription-id",
            format_args!("{s:?} is not a subscription GUID"),
        );
    }
    let resource_group = required(&mut r, "resource-group", "berth-ci");
    if let Some(g) = &resource_group
        && (g.len() > 90
            || !g
                .chars()
                .all(|c| c.is_alphanumeric() || "-_.()".contains(c)))
    {
        r.problem(
            "resource-group",
            format_args!("{g:?} is not a resource group name"),
        );
    }
    let location = required(&mut r, "location", "westeurope");
    if let Some(l) = &location
        && !l
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        r.problem(
            "location",
            format_args!("{l:?} is not a region name like westeurope"),
        );
    }
    let subnet_id = r.string("subnet-id");
    if let Some(id) = &subnet_id
        && !valid_subnet(id)
    {
        r.problem("subnet-id", format_args!("{id:?} is not a subnet's ARM id"));
    }
    let endpoint = r.endpoint("endpoint");
    r.finish()?;
    Ok(Config {
        endpoint: endpoint.unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned()),
        subscription: subscription.unwrap_or_default(),
        resource_group: resource_group.unwrap_or_default(),
        location: location.unwrap_or_default(),
        subnet_id,
    })
}

/// Reads a create spec's label options. The error names every bad key.
pub(crate) fn parse_label_options(text: &str) -> Result<LabelOptions, String> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| format!("label options: not JSON: {e}"))?;
    let mut r = Reader::new("label option", &value, &label_option_fields())?;
    let subnet_id = r.string("subnet-id");
    if let Some(id) = &subnet_id
        && !valid_subnet(id)
    {
        r.problem("subnet-id", format_args!("{id:?} is not a subnet's ARM id"));
    }
    let admin_username = r.string("admin-username");
    if let Some(u) = &admin_username
        && (u.len() > 64
            || !u
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_'))
    {
        r.problem(
            "admin-username",
            format_args!("{u:?} is not a Linux user name"),
        );
    }
    let ssh_public_key = r.string("ssh-public-key");
    let os_disk_type = r.string("os-disk-type");
    let os_disk_size_gb = r.integer("os-disk-size-gb", DISK_SIZES).map(|n| n as u32);
    let public_ip = r.boolean("public-ip").unwrap_or(false);
    let spot = r.boolean("spot").unwrap_or(false);
    let zone = r.string("zone");
    r.finish()?;
    Ok(LabelOptions {
        subnet_id,
        admin_username,
        ssh_public_key,
        os_disk_type,
        os_disk_size_gb,
        public_ip,
        spot,
        zone,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUBNET: &str = "/subscriptions/s/resourceGroups/net/providers/Microsoft.Network/virtualNetworks/v/subnets/ci";

    #[test]
    fn config_needs_its_three_keys() {
        let e = parse_config("{}").expect_err("missing");
        for key in ["subscription-id", "resource-group", "location"] {
            assert!(e.contains(&format!("{key}: missing")), "{key}: {e}");
        }
        let c = parse_config(&format!(
            r#"{{"subscription-id": "00000000-0000-4000-8000-000000000001", "resource-group": "ci",
                "location": "westeurope", "subnet-id": "{SUBNET}", "endpoint": "http://127.0.0.1:1/"}}"#
        ))
        .expect("valid");
        assert_eq!(c.endpoint, "http://127.0.0.1:1");
        assert_eq!(c.subnet_id.as_deref(), Some(SUBNET));
        let e = parse_config(
            r#"{"subscription-id": "x", "resource-group": "a/b", "location": "West Europe", "subnet-id": "s"}"#,
        )
        .expect_err("four problems");
        for key in ["subscription-id", "resource-group", "location", "subnet-id"] {
            assert!(e.contains(key), "{key}: {e}");
        }
    }

    #[test]
    fn label_options_are_checked() {
        let o = parse_label_options(&format!(
            r#"{{"subnet-id": "{SUBNET}", "public-ip": true, "spot": true, "zone": "2", "os-disk-size-gb": 64}}"#
        ))
        .expect("valid");
        assert!(o.public_ip && o.spot);
        assert_eq!(
            (o.zone.as_deref(), o.os_disk_size_gb),
            (Some("2"), Some(64))
        );
        let e = parse_label_options(r#"{"admin-username": "Root User", "os-disk-size-gb": 0}"#)
            .expect_err("two problems");
        assert!(
            e.contains("admin-username") && e.contains("os-disk-size-gb"),
            "{e}"
        );
    }
}
