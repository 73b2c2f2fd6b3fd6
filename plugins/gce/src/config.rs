//! The provider config and the label options, read from JSON by hand so that
//! every problem is reported at once, each naming its key; and their schemas
//! for `describe`.

use berth_sdk::config::{Reader, field};
use berth_sdk::types::{ConfigField, FieldType};
use serde_json::Value;

use crate::names::valid_name;

/// `instances.list` takes 0 to 500 results per page (`maxResults`).
const PAGE_SIZES: std::ops::RangeInclusive<u64> = 1..=500;
const DEFAULT_PAGE_SIZE: u32 = 500;
/// A boot disk's size in GB.
const DISK_SIZES: std::ops::RangeInclusive<u64> = 10..=65536;
pub(crate) const DEFAULT_ENDPOINT: &str = "https://compute.googleapis.com";
pub(crate) const DEFAULT_SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
const DEFAULT_SSH_USER: &str = "berth";

/// The provider config, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Config {
    /// `None`: the `project_id` of the credential's `auth-info`.
    pub project: Option<String>,
    pub zone: String,
    /// Where requests go: `http(s)://host[:port]`, no trailing `/`.
    pub endpoint: String,
    /// `maxResults` of each `instances.list` page.
    pub page_size: u32,
}

/// How an instance is bought.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) enum Provisioning {
    #[default]
    Standard,
    /// A Spot VM, deleted (not stopped) when preempted.
    Spot,
    /// A preemptible VM (the older kind of Spot VM).
    Preemptible,
}

/// A label's options, checked.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct LabelOptions {
    pub network: Option<String>,
    pub subnetwork: Option<String>,
    pub external_ip: bool,
    pub disk_size_gb: Option<u32>,
    pub disk_type: Option<String>,
    pub service_account: Option<String>,
    pub scopes: Vec<String>,
    pub provisioning: Provisioning,
    pub network_tags: Vec<String>,
    pub ssh_user: String,
}

impl Default for LabelOptions {
    fn default() -> Self {
        LabelOptions {
            network: None,
            subnetwork: None,
            external_ip: true,
            disk_size_gb: None,
            disk_type: None,
            service_account: None,
            scopes: vec![DEFAULT_SCOPE.to_owned()],
            provisioning: Provisioning::Standard,
            network_tags: Vec::new(),
            ssh_user: DEFAULT_SSH_USER.to_owned(),
        }
    }
}

/// The provider config's schema.
pub(crate) fn config_fields() -> Vec<ConfigField> {
    vec![
        field(
            "project",
            FieldType::String,
            false,
            None,
            "The Google Cloud project id; absent: the `project_id` of the provider's \
             `google-service-account` credential for the endpoint's host.",
        ),
        field(
            "zone",
            FieldType::String,
            true,
            None,
            "The zone instances are made in, for example `us-central1-a`.",
        ),
        field(
            "endpoint",
            FieldType::String,
            false,
            Some("\"https://compute.googleapis.com\""),
            "Base URL of the Compute Engine API (`/compute/v1` follows it). Its host must be in \
             the provider's allowed hosts.",
        ),
        field(
            "page-size",
            FieldType::Integer,
            false,
            Some("500"),
            "`maxResults` of each instances.list page, 1 to 500. Every page is followed.",
        ),
    ]
}

/// The label options' schema.
pub(crate) fn label_option_fields() -> Vec<ConfigField> {
    vec![
        field(
            "network",
            FieldType::String,
            false,
            None,
            "The VPC network: a name or `projects/P/global/networks/N`; absent: `default` (or \
             the subnetwork's network).",
        ),
        field(
            "subnetwork",
            FieldType::String,
            false,
            None,
            "The subnetwork: a name (in the zone's region) or `projects/P/regions/R/subnetworks/S`.",
        ),
        field(
            "external-ip",
            FieldType::Boolean,
            false,
            Some("true"),
            "Whether the instance gets an ephemeral external IPv4 address.",
        ),
        field(
            "disk-size-gb",
            FieldType::Integer,
            false,
            None,
            "Size of the boot disk in GB, 10 to 65536; absent: the image's.",
        ),
        field(
            "disk-type",
            FieldType::String,
            false,
            None,
            "Type of the boot disk (`pd-balanced`, `pd-ssd`, `pd-standard`, \
             `hyperdisk-balanced`, …); absent: the zone's default.",
        ),
        field(
            "service-account",
            FieldType::String,
            false,
            None,
            "Email of a service account the instance runs as; absent: none.",
        ),
        field(
            "scopes",
            FieldType::StringList,
            false,
            Some("[\"https://www.googleapis.com/auth/cloud-platform\"]"),
            "OAuth scopes of the instance's service account.",
        ),
        field(
            "provisioning",
            FieldType::String,
            false,
            Some("\"standard\""),
            "`standard`, `spot` (deleted when preempted) or `preemptible`.",
        ),
        field(
            "network-tags",
            FieldType::StringList,
            false,
            Some("[]"),
            "Network tags for firewall rules.",
        ),
        field(
            "ssh-user",
            FieldType::String,
            false,
            Some("\"berth\""),
            "The login that berth's SSH key is authorised for (the `ssh-keys` metadata).",
        ),
    ]
}

/// A project id: 6 to 30 lowercase letters, digits and `-`, a letter
/// first, or a domain-scoped one (`example.com:my-project`).
pub(crate) fn valid_project(project: &str) -> bool {
    let id = project.rsplit_once(':').map_or(project, |(_, id)| id);
    let b = id.as_bytes();
    (6..=30).contains(&b.len())
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[b.len() - 1] != b'-'
        && project
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"-.:".contains(&c))
}

/// `us-central1-a`, `europe-west4-b`, `northamerica-northeast1-c`:
/// lowercase words and digits joined by `-`, the last part one letter.
fn valid_zone(zone: &str) -> bool {
    let parts: Vec<&str> = zone.split('-').collect();
    parts.len() >= 3
        && parts.last().is_some_and(|p| p.len() == 1)
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        })
}

/// Reads the provider config. The error names every bad key.
pub(crate) fn parse_config(text: &str) -> Result<Config, String> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| format!("provider config: not JSON: {e}"))?;
    let mut r = Reader::new("provider config", &value, &config_fields())?;
    let project = r.string("project");
    if let Some(p) = &project
        && !valid_project(p)
    {
        r.problem(
            "project",
            format_args!("{p:?} is not a project id (6 to 30 lowercase letters, digits and -)"),
        );
    }
    let zone = r.string("zone");
    match &zone {
        Some(z) if !valid_zone(z) => r.problem(
            "zone",
            format_args!("{z:?} is not a zone name like us-central1-a"),
        ),
        Some(_) => {}
        None if !r.has("zone") => r.problem("zone", "missing; for example \"us-central1-a\""),
        None => {}
    }
    let endpoint = r.endpoint("endpoint");
    let page_size = r.integer("page-size", PAGE_SIZES);
    r.finish()?;
    Ok(Config {
        project,
        zone: zone.unwrap_or_default(),
        endpoint: endpoint.unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned()),
        page_size: page_size.map_or(DEFAULT_PAGE_SIZE, |n| n as u32),
    })
}

/// A network or subnetwork given as a name or a partial URL.
fn valid_resource(text: &str) -> bool {
    valid_name(text)
        || (text.starts_with("projects/")
            || text.starts_with("global/")
            || text.starts_with("regions/"))
            && text.split('/').all(|p| !p.is_empty())
}

/// Reads a create spec's label options. The error names every bad key.
pub(crate) fn parse_label_options(text: &str) -> Result<LabelOptions, String> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| format!("label options: not JSON: {e}"))?;
    let mut r = Reader::new("label option", &value, &label_option_fields())?;
    let d = LabelOptions::default();
    let network = r.string("network");
    let subnetwork = r.string("subnetwork");
    for (key, v) in [("network", &network), ("subnetwork", &subnetwork)] {
        if let Some(v) = v
            && !valid_resource(v)
        {
            r.problem(
                key,
                format_args!("{v:?} is neither a name nor a partial URL (projects/…)"),
            );
        }
    }
    let external_ip = r.boolean("external-ip").unwrap_or(d.external_ip);
    let disk_size_gb = r.integer("disk-size-gb", DISK_SIZES).map(|n| n as u32);
    let disk_type = r.string("disk-type");
    if let Some(t) = &disk_type
        && !valid_name(t)
    {
        r.problem(
            "disk-type",
            format_args!("{t:?} is not a disk type name like pd-balanced"),
        );
    }
    let service_account = r.string("service-account");
    if let Some(sa) = &service_account
        && (!sa.contains('@') || sa.contains(char::is_whitespace))
    {
        r.problem("service-account", format_args!("{sa:?} is not an email"));
    }
    let scopes = if r.has("scopes") {
        r.strings("scopes")
    } else {
        d.scopes
    };
    for s in &scopes {
        if !s.starts_with("https://") {
            r.problem(
                "scopes",
                format_args!("{s:?} is not a scope URL (https://…)"),
            );
        }
    }
    let provisioning = match r.string("provisioning").as_deref() {
        None | Some("standard") => Provisioning::Standard,
        Some("spot") => Provisioning::Spot,
        Some("preemptible") => Provisioning::Preemptible,
        Some(other) => {
            r.problem(
                "provisioning",
                format_args!("{other:?}: expected \"standard\", \"spot\" or \"preemptible\""),
            );
            Provisioning::Standard
        }
    };
    let network_tags = r.strings("network-tags");
    for t in &network_tags {
        if !valid_name(t) {
            r.problem(
                "network-tags",
                format_args!("{t:?} is not a tag (1 to 63 lowercase letters, digits and -)"),
            );
        }
    }
    let ssh_user = r.string("ssh-user").unwrap_or(d.ssh_user);
    let user_ok = (1..=32).contains(&ssh_user.len())
        && ssh_user
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && !ssh_user.starts_with('-');
    if !user_ok {
        r.problem(
            "ssh-user",
            format_args!("{ssh_user:?} is not a login name (letters, digits, ., _ and -)"),
        );
    }
    r.finish()?;
    Ok(LabelOptions {
        network,
        subnetwork,
        external_ip,
        disk_size_gb,
        disk_type,
        service_account,
        scopes,
        provisioning,
        network_tags,
        ssh_user,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_and_overrides() {
        let c = parse_config(r#"{"zone": "us-central1-a"}"#).expect("valid");
        assert_eq!(
            c,
            Config {
                project: None,
                zone: "us-central1-a".into(),
                endpoint: DEFAULT_ENDPOINT.into(),
                page_size: 500,
            }
        );
        let c = parse_config(
            r#"{"zone": "europe-west4-b", "project": "my-project-1", "endpoint": "http://127.0.0.1:9/", "page-size": 3}"#,
        )
        .expect("valid");
        assert_eq!(c.project.as_deref(), Some("my-project-1"));
        assert_eq!(c.endpoint, "http://127.0.0.1:9");
        assert_eq!(c.page_size, 3);
        assert!(
            parse_config(r#"{"zone": "us-east1-b", "project": "example.com:ci-pool"}"#).is_ok()
        );
    }

    #[test]
    fn config_problems_name_every_key() {
        for (text, needles) in [
            ("{}", &["zone: missing"][..]),
            ("[]", &["must be a JSON object"]),
            ("nope", &["not JSON"]),
            (r#"{"zone": ""}"#, &["zone: must not be empty"]),
            (
                r#"{"zone": "us-central1"}"#,
                &["zone: \"us-central1\" is not a zone"],
            ),
            (
                r#"{"zone": "us-central1-a", "project": "P"}"#,
                &["project: \"P\" is not"],
            ),
            (
                r#"{"zone": "us-central1-a", "endpoint": "ftp://x"}"#,
                &["endpoint:"],
            ),
            (
                r#"{"zone": "us-central1-a", "endpoint": "http://h/?a=1"}"#,
                &["endpoint: must not have a query"],
            ),
            (
                r#"{"zone": "us-central1-a", "page-size": 501}"#,
                &["page-size: must be a whole number from 1 to 500"],
            ),
            (
                r#"{"key": "x", "page-size": "9"}"#,
                &[
                    "zone: missing",
                    "page-size: must be an integer",
                    "key: unknown key; expected one of project, zone, endpoint, page-size",
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
            r#"{"network": "ci", "subnetwork": "projects/p/regions/us-central1/subnetworks/ci-a",
                "external-ip": false, "disk-size-gb": 50, "disk-type": "pd-ssd",
                "service-account": "runner@p.iam.gserviceaccount.com",
                "scopes": ["https://www.googleapis.com/auth/devstorage.read_only"],
                "provisioning": "spot", "network-tags": ["ci-runner"], "ssh-user": "ci"}"#,
        )
        .expect("valid");
        assert_eq!(o.network.as_deref(), Some("ci"));
        assert!(!o.external_ip);
        assert_eq!(o.disk_size_gb, Some(50));
        assert_eq!(o.provisioning, Provisioning::Spot);
        assert_eq!(o.network_tags, ["ci-runner"]);
        assert_eq!(o.ssh_user, "ci");
    }

    #[test]
    fn label_option_problems_name_every_key() {
        for (text, needles) in [
            ("[]", &["must be a JSON object"][..]),
            (
                r#"{"network": "Bad Net"}"#,
                &["network: \"Bad Net\" is neither"],
            ),
            (
                r#"{"external-ip": "yes"}"#,
                &["external-ip: must be true or false"],
            ),
            (
                r#"{"disk-size-gb": 5}"#,
                &["disk-size-gb: must be a whole number from 10"],
            ),
            (r#"{"disk-type": "SSD"}"#, &["disk-type: \"SSD\""]),
            (
                r#"{"service-account": "me"}"#,
                &["service-account: \"me\" is not an email"],
            ),
            (
                r#"{"scopes": ["cloud-platform"]}"#,
                &["scopes: \"cloud-platform\""],
            ),
            (
                r#"{"provisioning": "cheap"}"#,
                &["provisioning: \"cheap\": expected"],
            ),
            (r#"{"network-tags": ["Web"]}"#, &["network-tags: \"Web\""]),
            (r#"{"ssh-user": "-x"}"#, &["ssh-user: \"-x\""]),
            (
                r#"{"zone": "a", "network-tags": "x"}"#,
                &[
                    "label option zone: unknown key",
                    "network-tags: must be a list",
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
    fn project_and_zone_names() {
        for ok in ["berth-test-project", "my-project-1", "example.com:ci-pool"] {
            assert!(valid_project(ok), "{ok}");
        }
        for bad in [
            "",
            "short",
            "1project",
            "Project-x",
            "project-",
            "a/b-cdefg",
        ] {
            assert!(!valid_project(bad), "{bad}");
        }
        for ok in [
            "us-central1-a",
            "europe-west4-b",
            "northamerica-northeast1-c",
        ] {
            assert!(valid_zone(ok), "{ok}");
        }
        for bad in ["us-central1", "US-central1-a", "us-central1-ab", "us--a"] {
            assert!(!valid_zone(bad), "{bad}");
        }
    }
}
