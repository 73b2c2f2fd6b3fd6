//! The fake Compute Engine's record: instances, operations and request ids,
//! the rules a create must follow (names, labels, machine types, images,
//! metadata), the regional quota, and how each resource is shown as JSON.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::{GceConfig, LINK_BASE};

/// Machine types this cloud knows, with their vCPUs (the `CPUS` quota
/// counts these).
pub(super) const MACHINE_TYPES: &[(&str, u32)] = &[
    ("e2-micro", 2),
    ("e2-small", 2),
    ("e2-medium", 2),
    ("e2-standard-2", 2),
    ("e2-standard-4", 4),
    ("e2-standard-8", 8),
    ("n1-standard-1", 1),
    ("n1-standard-2", 2),
    ("n2-standard-2", 2),
    ("n2-standard-4", 4),
    ("n2-standard-8", 8),
    ("c3-standard-4", 4),
];

/// Images this cloud knows (public families and images, as partial URLs).
pub(super) const IMAGES: &[&str] = &[
    "projects/debian-cloud/global/images/family/debian-12",
    "projects/debian-cloud/global/images/debian-12-bookworm-v20240515",
    "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64",
    "projects/cos-cloud/global/images/family/cos-stable",
];

/// How long a metadata value may be (256 KiB).
const MAX_METADATA_VALUE: usize = 256 * 1024;
/// Labels a resource may carry.
const MAX_LABELS: usize = 64;

/// An error a request is answered with: status, `errors[].reason`, message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Refusal {
    pub status: u16,
    pub reason: &'static str,
    pub message: String,
}

impl Refusal {
    pub(super) fn new(status: u16, reason: &'static str, message: impl Into<String>) -> Refusal {
        Refusal {
            status,
            reason,
            message: message.into(),
        }
    }

    pub(super) fn invalid(message: impl Into<String>) -> Refusal {
        Refusal::new(400, "invalid", message)
    }

    pub(super) fn not_found(resource: &str) -> Refusal {
        Refusal::new(
            404,
            "notFound",
            format!("The resource '{resource}' was not found"),
        )
    }
}

/// One entry of an operation's `error.errors`.
#[derive(Clone, Debug)]
pub(super) struct OpError {
    pub code: String,
    pub message: String,
    /// `errorDetails`, as the reference shows them (a `quotaInfo`).
    pub details: Option<Value>,
    /// `httpErrorStatusCode` and `httpErrorMessage` of the operation.
    pub http: (u16, &'static str),
}

/// One instance, as long as the cloud remembers it (deleted ones too).
pub(super) struct Inst {
    pub id: u64,
    pub name: String,
    pub zone: String,
    pub machine_type: String,
    pub cpus: u32,
    pub labels: BTreeMap<String, String>,
    pub label_fingerprint: String,
    pub metadata: Vec<(String, String)>,
    pub created: Instant,
    pub created_at: SystemTime,
    /// Set when its start fails: it ends its boot `TERMINATED`, this its
    /// `statusMessage`.
    pub boot_failure: Option<String>,
    /// Stopped (a guest shutdown, a preemption): `TERMINATED` from then on.
    pub stopped: Option<String>,
    /// When its delete began: `STOPPING` until the cloud's stop time passed.
    pub deleting: Option<Instant>,
    pub deleted: bool,
    /// What the create asked for besides the fields above (disks, network
    /// interfaces, scheduling, service accounts, tags, description), kept
    /// to be shown back.
    pub asked: Value,
}

impl Inst {
    pub(super) fn status(&self, cfg: &GceConfig, now: Instant) -> &'static str {
        if self.deleting.is_some() {
            return "STOPPING";
        }
        if self.stopped.is_some() {
            return "TERMINATED";
        }
        let age = now.saturating_duration_since(self.created);
        if age < cfg.boot / 2 {
            "PROVISIONING"
        } else if age < cfg.boot {
            "STAGING"
        } else if self.boot_failure.is_some() {
            "TERMINATED"
        } else {
            "RUNNING"
        }
    }

    pub(super) fn status_message(&self, cfg: &GceConfig, now: Instant) -> Option<&str> {
        match self.status(cfg, now) {
            "TERMINATED" => self.stopped.as_deref().or(self.boot_failure.as_deref()),
            _ => None,
        }
    }

    pub(super) fn link(&self, project: &str) -> String {
        format!(
            "{LINK_BASE}/projects/{project}/zones/{}/instances/{}",
            self.zone, self.name
        )
    }

    pub(super) fn json(&self, cfg: &GceConfig, now: Instant) -> Value {
        let project = &cfg.project;
        let status = self.status(cfg, now);
        let mut interfaces = Vec::new();
        let asked_nics = self.asked["networkInterfaces"].as_array().cloned();
        for (n, nic) in asked_nics.unwrap_or_default().iter().enumerate() {
            let network = nic["network"]
                .as_str()
                .unwrap_or("global/networks/default")
                .to_owned();
            let mut shown = json!({
                "kind": "compute#networkInterface",
                "network": full_link(project, &network),
                "networkIP": format!("10.128.{}.{}", (self.id >> 8) & 0xff, self.id & 0xff),
                "name": format!("nic{n}"),
                "fingerprint": fingerprint(&format!("nic{n}{}", self.id)),
                "stackType": "IPV4_ONLY",
            });
            if let Some(sub) = nic["subnetwork"].as_str() {
                shown["subnetwork"] = full_link(project, sub).into();
            }
            if let Some(configs) = nic["accessConfigs"].as_array() {
                let shown_configs: Vec<Value> = configs
                    .iter()
                    .map(|c| {
                        json!({
                            "kind": "compute#accessConfig",
                            "type": c["type"].as_str().unwrap_or("ONE_TO_ONE_NAT"),
                            "name": c["name"].as_str().unwrap_or("External NAT"),
                            "natIP": format!("34.{}.{}.{}", 100 + (self.id >> 16 & 0x3f), (self.id >> 8) & 0xff, self.id & 0xff),
                            "networkTier": "PREMIUM",
                        })
                    })
                    .collect();
                shown["accessConfigs"] = shown_configs.into();
            }
            interfaces.push(shown);
        }
        let disks: Vec<Value> = (self.asked["disks"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let size = d["initializeParams"]["diskSizeGb"]
                    .as_str()
                    .map(str::to_owned)
                    .or_else(|| d["initializeParams"]["diskSizeGb"].as_u64().map(|n| n.to_string()))
                    .unwrap_or_else(|| "10".into());
                json!({
                    "kind": "compute#attachedDisk",
                    "type": "PERSISTENT",
                    "mode": "READ_WRITE",
                    "source": format!("{LINK_BASE}/projects/{project}/zones/{}/disks/{}{}", self.zone, self.name, if i == 0 { String::new() } else { format!("-{i}") }),
                    "deviceName": format!("persistent-disk-{i}"),
                    "index": i,
                    "boot": d["boot"].as_bool().unwrap_or(i == 0),
                    "autoDelete": d["autoDelete"].as_bool().unwrap_or(true),
                    "interface": "SCSI",
                    "diskSizeGb": size,
                })
            })
            .collect();
        let mut v = json!({
            "kind": "compute#instance",
            "id": self.id.to_string(),
            "creationTimestamp": timestamp(self.created_at),
            "name": self.name,
            "tags": {
                "items": self.asked["tags"]["items"].clone(),
                "fingerprint": fingerprint(&self.asked["tags"]["items"].to_string()),
            },
            "machineType": format!("{LINK_BASE}/projects/{project}/zones/{}/machineTypes/{}", self.zone, self.machine_type),
            "status": status,
            "zone": format!("{LINK_BASE}/projects/{project}/zones/{}", self.zone),
            "canIpForward": false,
            "networkInterfaces": interfaces,
            "disks": disks,
            "metadata": {
                "kind": "compute#metadata",
                "fingerprint": fingerprint(&format!("{:?}", self.metadata)),
                "items": self.metadata.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>(),
            },
            "selfLink": self.link(project),
            "scheduling": self.asked.get("scheduling").cloned().unwrap_or_else(|| json!({
                "onHostMaintenance": "MIGRATE",
                "automaticRestart": true,
                "preemptible": false,
                "provisioningModel": "STANDARD",
            })),
            "cpuPlatform": "Intel Broadwell",
            "labels": self.labels,
            "labelFingerprint": self.label_fingerprint,
            "startRestricted": false,
            "deletionProtection": false,
            "fingerprint": fingerprint(&format!("{}{status}", self.id)),
            "lastStartTimestamp": timestamp(self.created_at),
        });
        if self.metadata.is_empty() {
            v["metadata"].as_object_mut().map(|m| m.remove("items"));
        }
        if let Some(accounts) = self.asked.get("serviceAccounts") {
            v["serviceAccounts"] = accounts.clone();
        }
        if let Some(description) = self.asked.get("description") {
            v["description"] = description.clone();
        }
        if let Some(message) = self.status_message(cfg, now) {
            v["statusMessage"] = message.into();
        }
        v
    }
}

/// One operation of a zone.
pub(super) struct Op {
    pub id: u64,
    pub name: String,
    pub zone: String,
    pub kind: &'static str,
    /// The instance it acts on (empty for a bulk insert).
    pub target: String,
    pub target_id: Option<u64>,
    pub started: Instant,
    pub started_at: SystemTime,
    pub errors: Vec<OpError>,
    pub request_id: Option<String>,
    /// `instancesBulkInsertOperationMetadata`, for a bulk insert.
    pub bulk: Option<Value>,
}

impl Op {
    pub(super) fn status(&self, cfg: &GceConfig, now: Instant) -> &'static str {
        let age = now.saturating_duration_since(self.started);
        if age >= cfg.operation {
            "DONE"
        } else if age < cfg.operation / 4 {
            "PENDING"
        } else {
            "RUNNING"
        }
    }

    /// When it will be `DONE`.
    pub(super) fn done_at(&self, cfg: &GceConfig) -> Instant {
        self.started + cfg.operation
    }

    pub(super) fn json(&self, cfg: &GceConfig, now: Instant) -> Value {
        let project = &cfg.project;
        let status = self.status(cfg, now);
        let zone_link = format!("{LINK_BASE}/projects/{project}/zones/{}", self.zone);
        let target_link = if self.target.is_empty() {
            zone_link.clone()
        } else {
            format!("{zone_link}/instances/{}", self.target)
        };
        let mut v = json!({
            "kind": "compute#operation",
            "id": self.id.to_string(),
            "name": self.name,
            "zone": zone_link,
            "operationType": self.kind,
            "targetLink": target_link,
            "status": status,
            "user": cfg.user,
            "progress": if status == "DONE" { 100 } else { 0 },
            "insertTime": timestamp(self.started_at),
            "startTime": timestamp(self.started_at),
            "selfLink": format!("{LINK_BASE}/projects/{project}/zones/{}/operations/{}", self.zone, self.name),
        });
        if let Some(id) = self.target_id {
            v["targetId"] = id.to_string().into();
        }
        if let Some(request) = &self.request_id {
            v["clientOperationId"] = request.clone().into();
        }
        if let Some(bulk) = &self.bulk {
            v["instancesBulkInsertOperationMetadata"] = bulk.clone();
        }
        if status == "DONE" {
            v["endTime"] = timestamp(self.started_at + cfg.operation).into();
            if let Some(first) = self.errors.first() {
                let errors: Vec<Value> = (self.errors.iter())
                    .map(|e| {
                        let mut one = json!({"code": e.code, "message": e.message});
                        if let Some(details) = &e.details {
                            one["errorDetails"] = details.clone();
                        }
                        one
                    })
                    .collect();
                v["error"] = json!({ "errors": errors });
                v["httpErrorStatusCode"] = first.http.0.into();
                v["httpErrorMessage"] = first.http.1.into();
            }
        }
        v
    }
}

/// Everything the cloud holds.
pub(super) struct World {
    /// Every instance it ever made, in the order made.
    pub instances: Vec<Inst>,
    pub ops: BTreeMap<String, Op>,
    /// `requestId` → the operation it started.
    pub requests: HashMap<String, String>,
    pub next_id: u64,
    pub quota_instances: u64,
    pub quota_cpus: u64,
    /// Machine types the zones have no capacity for.
    pub exhausted: BTreeSet<String>,
    /// Errors the next inserts' operations end with.
    pub fail_inserts: VecDeque<OpError>,
    /// Messages of the next instances whose start fails.
    pub fail_boots: VecDeque<String>,
    pub rate_limit: Option<u32>,
    /// The current second's start and the calls made in it.
    pub window: (Instant, u32),
}

impl World {
    pub(super) fn new(cfg: &GceConfig) -> World {
        World {
            instances: Vec::new(),
            ops: BTreeMap::new(),
            requests: HashMap::new(),
            next_id: 6_100_000_000_000_000_000 + u64::from(rand::random::<u32>()),
            quota_instances: cfg.quota_instances,
            quota_cpus: cfg.quota_cpus,
            exhausted: BTreeSet::new(),
            fail_inserts: VecDeque::new(),
            fail_boots: VecDeque::new(),
            rate_limit: cfg.rate_limit,
            window: (Instant::now(), 0),
        }
    }

    pub(super) fn id(&mut self) -> u64 {
        self.next_id += 1 + u64::from(rand::random::<u16>());
        self.next_id
    }

    /// Ends the deletes whose stop time has passed.
    pub(super) fn settle(&mut self, cfg: &GceConfig, now: Instant) {
        for i in &mut self.instances {
            if let Some(since) = i.deleting
                && !i.deleted
                && now.saturating_duration_since(since) >= cfg.stop
            {
                i.deleted = true;
            }
        }
    }

    /// The live instance `name` of `zone`.
    pub(super) fn live(&self, zone: &str, name: &str) -> Option<&Inst> {
        (self.instances.iter()).find(|i| !i.deleted && i.zone == zone && i.name == name)
    }

    pub(super) fn live_mut(&mut self, zone: &str, name: &str) -> Option<&mut Inst> {
        (self.instances.iter_mut()).find(|i| !i.deleted && i.zone == zone && i.name == name)
    }

    /// Counts a call against the per-second rate limit: whether it is over.
    pub(super) fn over_rate(&mut self, now: Instant) -> bool {
        let Some(limit) = self.rate_limit else {
            return false;
        };
        if now.saturating_duration_since(self.window.0) >= Duration::from_secs(1) {
            self.window = (now, 0);
        }
        self.window.1 += 1;
        self.window.1 > limit
    }

    /// What the region of `zone` has in use: instances and vCPUs. Stopped
    /// (`TERMINATED`) instances hold no vCPUs.
    pub(super) fn usage(&self, cfg: &GceConfig, zone: &str, now: Instant) -> (u64, u64) {
        let region = region_of(zone);
        let mut used = (0, 0);
        for i in self.instances.iter().filter(|i| !i.deleted) {
            if region_of(&i.zone) != region {
                continue;
            }
            used.0 += 1;
            if i.status(cfg, now) != "TERMINATED" {
                used.1 += u64::from(i.cpus);
            }
        }
        used
    }

    /// The quota error for `count` more instances of `cpus` vCPUs each in
    /// `zone`'s region, if they do not fit.
    pub(super) fn quota_error(
        &self,
        cfg: &GceConfig,
        zone: &str,
        count: u64,
        cpus: u32,
        now: Instant,
    ) -> Option<OpError> {
        let (instances, used_cpus) = self.usage(cfg, zone, now);
        let region = region_of(zone);
        let (metric, limit_name, limit) = if instances + count > self.quota_instances {
            (
                "INSTANCES",
                "INSTANCES-per-project-region",
                self.quota_instances,
            )
        } else if used_cpus + count * u64::from(cpus) > self.quota_cpus {
            ("CPUS", "CPUS-per-project-region", self.quota_cpus)
        } else {
            return None;
        };
        Some(OpError {
            code: "QUOTA_EXCEEDED".into(),
            message: format!("Quota '{metric}' exceeded.  Limit: {limit}.0 in region {region}."),
            details: Some(json!([{
                "quotaInfo": {
                    "metricName": format!("compute.googleapis.com/{}", metric.to_ascii_lowercase()),
                    "limitName": limit_name,
                    "dimensions": {"region": region},
                    "limit": limit,
                }
            }])),
            http: (403, "FORBIDDEN"),
        })
    }

    /// How many of `count` instances of `cpus` vCPUs fit the quota.
    pub(super) fn fitting(
        &self,
        cfg: &GceConfig,
        zone: &str,
        count: u64,
        cpus: u32,
        now: Instant,
    ) -> u64 {
        (0..=count)
            .rev()
            .find(|n| self.quota_error(cfg, zone, *n, cpus, now).is_none())
            .unwrap_or(0)
    }
}

pub(super) fn capacity_error(project: &str, zone: &str) -> OpError {
    OpError {
        code: "ZONE_RESOURCE_POOL_EXHAUSTED".into(),
        message: format!(
            "The zone 'projects/{project}/zones/{zone}' does not have enough resources \
             available to fulfill the request.  Try a different zone, or try again later."
        ),
        details: None,
        http: (503, "SERVICE UNAVAILABLE"),
    }
}

/// `us-central1-a` → `us-central1`.
pub(super) fn region_of(zone: &str) -> &str {
    zone.rsplit_once('-').map_or(zone, |(region, _)| region)
}

/// A full link for a partial URL (`global/networks/default`).
fn full_link(project: &str, partial: &str) -> String {
    if partial.starts_with("https://") {
        partial.to_owned()
    } else if partial.starts_with("projects/") {
        format!("{LINK_BASE}/{partial}")
    } else {
        format!("{LINK_BASE}/projects/{project}/{partial}")
    }
}

/// The short name of a machine type given as a name, a partial URL
/// (`zones/Z/machineTypes/T`, `projects/P/zones/Z/machineTypes/T`) or a
/// full one; it must be in `zone`.
pub(super) fn machine_type(asked: &str, zone: &str) -> Result<(String, u32), Refusal> {
    let trimmed = asked
        .strip_prefix(LINK_BASE)
        .map_or(asked, |s| s.trim_start_matches('/'));
    let (in_zone, name) = match trimmed.rsplit_once("/machineTypes/") {
        Some((before, name)) => (before.rsplit('/').next().unwrap_or_default(), name),
        None => (zone, trimmed),
    };
    let bad = || {
        Refusal::invalid(format!(
            "Invalid value for field 'resource.machineType': '{asked}'. Machine type with name \
             '{name}' does not exist in zone '{zone}'."
        ))
    };
    if in_zone != zone {
        return Err(bad());
    }
    match MACHINE_TYPES.iter().find(|(t, _)| *t == name) {
        Some((t, cpus)) => Ok(((*t).to_owned(), *cpus)),
        None => Err(bad()),
    }
}

/// Checks a source image: known to this cloud, or a 404 naming it.
pub(super) fn check_image(project: &str, asked: &str) -> Result<(), Refusal> {
    let partial = asked
        .strip_prefix(LINK_BASE)
        .map_or(asked, |s| s.trim_start_matches('/'));
    let partial = match partial.strip_prefix("global/") {
        Some(rest) => format!("projects/{project}/global/{rest}"),
        None => partial.to_owned(),
    };
    if IMAGES.contains(&partial.as_str()) {
        Ok(())
    } else {
        Err(Refusal::not_found(&partial))
    }
}

/// RFC 1035 names of 1 to 63 characters, as the reference's regex says.
pub(super) fn check_name(field: &str, name: &str) -> Result<(), Refusal> {
    let b = name.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[b.len() - 1] != b'-';
    if ok {
        Ok(())
    } else {
        Err(Refusal::invalid(format!(
            "Invalid value for field '{field}': '{name}'. Must be a match of regex \
             '(?:[a-z](?:[-a-z0-9]{{0,61}}[a-z0-9])?|[1-9][0-9]{{0,19}})'"
        )))
    }
}

fn label_char(c: char) -> bool {
    c.is_ascii_lowercase()
        || c.is_ascii_digit()
        || c == '_'
        || c == '-'
        || (!c.is_ascii() && !c.is_uppercase())
}

/// The labels rules: at most 64; keys 1 to 63 characters starting with a
/// lowercase letter; values at most 63; lowercase letters, digits, `_`,
/// `-` and international characters only.
pub(super) fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), Refusal> {
    if labels.len() > MAX_LABELS {
        return Err(Refusal::invalid(format!(
            "Invalid value for field 'resource.labels': ''. Too many labels: {}; a resource may \
             have at most {MAX_LABELS}.",
            labels.len()
        )));
    }
    for (k, v) in labels {
        let first = k.chars().next();
        let key_ok = (1..=63).contains(&k.chars().count())
            && first
                .is_some_and(|c| c.is_ascii_lowercase() || (!c.is_ascii() && !c.is_uppercase()))
            && k.chars().all(label_char);
        if !key_ok {
            return Err(Refusal::invalid(format!(
                "Invalid value for field 'resource.labels': ''. Label key '{k}' violates format \
                 constraints. The key must start with a lowercase character, can only contain \
                 lowercase letters, numeric characters, underscores and dashes. The key can be at \
                 most 63 characters long. International characters are allowed."
            )));
        }
        if v.chars().count() > 63 || !v.chars().all(label_char) {
            return Err(Refusal::invalid(format!(
                "Invalid value for field 'resource.labels': ''. Label value '{v}' violates format \
                 constraints. The value can only contain lowercase letters, numeric characters, \
                 underscores and dashes. The value can be at most 63 characters long. \
                 International characters are allowed."
            )));
        }
    }
    Ok(())
}

/// `labels` of a request body as a map of strings.
pub(super) fn read_labels(v: &Value, field: &str) -> Result<BTreeMap<String, String>, Refusal> {
    match v {
        Value::Null => Ok(BTreeMap::new()),
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                _ => Err(Refusal::invalid(format!(
                    "Invalid value for field '{field}': label '{k}' must be a string."
                ))),
            })
            .collect(),
        _ => Err(Refusal::invalid(format!(
            "Invalid value for field '{field}': must be a map of strings."
        ))),
    }
}

/// `metadata.items`: unique keys of letters, digits, `-` and `_` (at most
/// 128), values at most 256 KiB.
pub(super) fn read_metadata(v: &Value) -> Result<Vec<(String, String)>, Refusal> {
    let mut out: Vec<(String, String)> = Vec::new();
    for item in v["items"].as_array().cloned().unwrap_or_default() {
        let (Some(k), Some(val)) = (item["key"].as_str(), item["value"].as_str()) else {
            return Err(Refusal::invalid(
                "Invalid value for field 'resource.metadata': metadata items need a key and a \
                 string value.",
            ));
        };
        let key_ok = (1..=128).contains(&k.len())
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !key_ok {
            return Err(Refusal::invalid(format!(
                "Invalid value for field 'resource.metadata.items[].key': '{k}'. Must be a match \
                 of regex '[a-zA-Z0-9-_]{{1,128}}'"
            )));
        }
        if val.len() > MAX_METADATA_VALUE {
            return Err(Refusal::invalid(format!(
                "Invalid value for field 'resource.metadata.items[].value': the value of '{k}' \
                 is longer than {MAX_METADATA_VALUE} bytes."
            )));
        }
        if out.iter().any(|(seen, _)| seen == k) {
            return Err(Refusal::invalid(format!(
                "Invalid value for field 'resource.metadata': duplicate key '{k}'."
            )));
        }
        out.push((k.to_owned(), val.to_owned()));
    }
    Ok(out)
}

/// A `requestId` must be a UUID, not the zero one.
pub(super) fn check_request_id(id: &str) -> Result<(), Refusal> {
    let groups: Vec<&str> = id.split('-').collect();
    let shaped = groups.len() == 5
        && groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups
            .iter()
            .all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()));
    if shaped && id.bytes().any(|b| b != b'0' && b != b'-') {
        Ok(())
    } else {
        Err(Refusal::invalid(format!(
            "Invalid value for field 'requestId': '{id}'. The request id must be a valid UUID \
             with the exception that zero UUID is not supported."
        )))
    }
}

/// A fingerprint as the cloud shows them: 8 bytes, base64.
pub(super) fn fingerprint(of: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    of.hash(&mut h);
    base64(&h.finish().to_be_bytes())
}

pub(super) fn labels_fingerprint(labels: &BTreeMap<String, String>) -> String {
    fingerprint(&format!("{labels:?}"))
}

fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// `at` as the cloud writes times: RFC 3339 in US Pacific daylight time,
/// `2024-05-01T05:34:56.789-07:00`.
pub(super) fn timestamp(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let local = since.as_secs() as i64 - 7 * 3600;
    let days = local.div_euclid(86_400);
    let s = local.rem_euclid(86_400);
    let (y, m, d) = crate::common::civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}-07:00",
        s / 3600,
        s % 3600 / 60,
        s % 60,
        since.subsec_millis()
    )
}

/// An operation's name as the cloud makes them:
/// `operation-1714566896789-5f3a1c2b4d6e8-0a1b2c3d-4e5f6a7b`.
pub(super) fn operation_name(at: SystemTime) -> String {
    let ms = at
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    format!(
        "operation-{ms}-{:013x}-{:08x}-{:08x}",
        rand::random::<u64>() & 0x1f_ffff_ffff_ffff,
        rand::random::<u32>(),
        rand::random::<u32>()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_labels_and_request_ids_follow_the_rules() {
        assert!(check_name("resource.name", "n-00000000000000ab-1a2b3c4d").is_ok());
        for bad in ["", "Vm", "1vm", "vm-", "vm_1", &"a".repeat(64)] {
            assert!(check_name("resource.name", bad).is_err(), "{bad}");
        }
        let ok: BTreeMap<String, String> =
            [("berth-pool", "z4dyz2epool"), ("e", ""), ("ключ", "é")]
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect();
        assert!(check_labels(&ok).is_ok());
        for (k, v) in [("Env", "x"), ("1a", "x"), ("env", "Prod"), ("env", "a.b")] {
            let one = BTreeMap::from([(k.to_owned(), v.to_owned())]);
            assert!(check_labels(&one).is_err(), "{k}={v}");
        }
        let long = BTreeMap::from([("k".to_owned(), "v".repeat(64))]);
        assert!(check_labels(&long).is_err());
        let many: BTreeMap<String, String> =
            (0..65).map(|n| (format!("k{n}"), String::new())).collect();
        assert!(check_labels(&many).is_err());
        assert!(check_request_id("3f2c1a4e-7b6d-8e9f-a0b1-c2d3e4f5a6b7").is_ok());
        for bad in [
            "",
            "x",
            "00000000-0000-0000-0000-000000000000",
            "3f2c1a4e7b6d8e9fa0b1c2d3e4f5a6b7",
        ] {
            assert!(check_request_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn machine_types_and_images() {
        assert_eq!(machine_type("e2-small", "us-central1-a").unwrap().1, 2);
        assert!(
            machine_type(
                "zones/us-central1-a/machineTypes/n2-standard-4",
                "us-central1-a"
            )
            .is_ok()
        );
        assert!(
            machine_type("zones/us-central1-b/machineTypes/e2-small", "us-central1-a").is_err()
        );
        assert!(machine_type("e2-huge", "us-central1-a").is_err());
        assert!(check_image("p", "projects/debian-cloud/global/images/family/debian-12").is_ok());
        let missing = check_image("p", "global/images/mine").unwrap_err();
        assert_eq!(missing.status, 404);
        assert!(
            missing.message.contains("projects/p/global/images/mine"),
            "{missing:?}"
        );
    }

    #[test]
    fn times_and_fingerprints_look_like_the_clouds() {
        let at = UNIX_EPOCH + Duration::from_millis(1_714_566_896_789);
        assert_eq!(timestamp(at), "2024-05-01T05:34:56.789-07:00");
        assert_eq!(base64(b"abc"), "YWJj");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(fingerprint("x").len(), 12);
        assert_eq!(region_of("us-central1-a"), "us-central1");
    }
}
