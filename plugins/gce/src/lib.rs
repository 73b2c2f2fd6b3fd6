//! The berth driver for Google Compute Engine, over the Compute Engine API
//! (v1, JSON over HTTPS).
//!
//! The driver holds no credentials: the host exchanges the provider's
//! `google-service-account` key for tokens and adds them to each allowed
//! request; the driver reads only the project id the exchange learnt
//! (`auth-info`). Instances live in one zone, are named after their node
//! (so that every try of a node's create names the same instance), carry
//! berth's tags as labels from the insert on (through the label encoding
//! of docs/tags.md), and berth's create token is the insert's
//! `requestId`, so a create sent again makes nothing more. The driver
//! touches only instances labelled with its pool: every delete and
//! set-tags looks the instance up first.

#![forbid(unsafe_code)]

mod api;
mod config;
mod errors;
mod names;

use std::collections::BTreeMap;

use berth_sdk::http::{Request, Response, Url, encode_component};
use berth_sdk::tags::{self, NODE_TAG, POOL_TAG, encode_label, is_berth_tag};
use berth_sdk::types::{
    Addresses, Capabilities, Connection, CreateSpec, DriverInfo, Error, Instance, InstanceState,
    Page,
};
use berth_sdk::{Driver, error, pages};
use serde_json::{Value, json};

use api::{ApiInstance, Operation};
use config::{Config, LabelOptions, Provisioning};
use errors::{Call, api_error, from_operation, from_response};
use names::{MAX_LABEL, instance_name, label_value, labels_of, valid_label_key, valid_name};

/// `zoneOperations.wait` calls a create makes at most. Each returns when
/// the operation is `DONE` (or after at most 2 minutes at Google); one is
/// enough for an insert. An operation still running after these is
/// answered as accepted: its instance shows in lists when it is made.
const MAX_WAITS: usize = 2;
/// The fewest creates of a batch that go in one `bulkInsert`. A bulk
/// insert costs the insert, a wait, a list and one `setLabels` per
/// instance (N + 3 calls); lone inserts cost an insert and a wait each
/// (2N): the bulk is fewer calls from four on.
const BULK_MIN: usize = 4;
/// `setLabels` tries while another writer keeps changing the fingerprint.
const LABEL_TRIES: usize = 3;
/// The longest user data GCE keeps in one metadata value.
const MAX_METADATA_VALUE: usize = 256 * 1024;

/// The configured driver.
#[derive(Debug)]
struct Gce {
    pool_id: String,
    /// The pool id as its label stores it.
    pool_label: String,
    project: String,
    config: Config,
    /// `ENDPOINT/compute/v1/projects/PROJECT/zones/ZONE`.
    base: String,
}

/// What a create asks for, checked, before any request.
#[derive(Clone, Debug)]
struct Prepared {
    name: String,
    options: LabelOptions,
    /// The spec's tags, the pool tag forced to this pool.
    tags: Vec<(String, String)>,
    /// The same as GCE labels.
    labels: BTreeMap<String, String>,
}

impl Gce {
    /// An instance's URL.
    fn instance_url(&self, name: &str) -> String {
        format!("{}/instances/{}", self.base, encode_component(name))
    }

    /// The zonal internal DNS name of instance `name` (a domain-scoped
    /// project's has another form, left out).
    fn hostname(&self, name: &str) -> Option<String> {
        (!self.project.contains(':'))
            .then(|| format!("{name}.{}.c.{}.internal", self.config.zone, self.project))
    }

    fn owned(&self, i: &ApiInstance) -> bool {
        i.labels.get(POOL_TAG) == Some(&self.pool_label)
    }

    fn to_instance(&self, i: &ApiInstance) -> Instance {
        i.to_instance(self.hostname(&i.name))
    }

    /// The pool tag filter plus `filter`, with this pool's id.
    fn pool_filter(&self, filter: &[(String, String)]) -> Vec<(String, String)> {
        let mut wanted = vec![(POOL_TAG.to_owned(), self.pool_id.clone())];
        wanted.extend(filter.iter().filter(|(k, _)| k != POOL_TAG).cloned());
        wanted
    }

    /// Sends `req`; a refusal becomes the contract's error.
    fn send(
        &self,
        req: Request,
        call: Call,
        instance_type: Option<&str>,
    ) -> Result<Response, Error> {
        let resp = req.header("accept", "application/json").send()?;
        if resp.is_success() {
            Ok(resp)
        } else {
            Err(from_response(&resp, call, instance_type))
        }
    }

    fn body(resp: &Response, what: &str) -> Result<Value, Error> {
        resp.json::<Value>()
            .map_err(|e| error::transient(format!("{what}: {e}")))
    }

    fn read_op(resp: &Response) -> Result<Operation, Error> {
        api::operation(&Self::body(resp, "operation")?)
            .map_err(|e| error::transient(format!("operation: {e}")))
    }

    /// Whether `resp` is the 404 of instance `name` itself (not of its
    /// project or zone, which would say nothing about the instance).
    fn gone(resp: &Response, name: &str) -> bool {
        resp.status == 404
            && api_error(resp)
                .message
                .contains(&format!("instances/{name}"))
    }

    /// Instance `name`, strongly consistent (`instances.get`); `None` when
    /// the cloud says it does not exist.
    fn get_one(&self, name: &str) -> Result<Option<ApiInstance>, Error> {
        if !valid_name(name) {
            return Ok(None);
        }
        let resp = Request::get(&self.instance_url(name))
            .header("accept", "application/json")
            .send()?;
        if Self::gone(&resp, name) {
            return Ok(None);
        }
        if !resp.is_success() {
            return Err(from_response(&resp, Call::Other, None));
        }
        let v = Self::body(&resp, "instances.get")?;
        let i = api::instance(&v).map_err(|e| error::transient(format!("instances.get: {e}")))?;
        if i.name != name {
            return Err(error::transient(format!(
                "instances.get of {name} answered {}",
                i.name
            )));
        }
        Ok(Some(i))
    }

    /// The instances among `names` that exist: one list filtered by name,
    /// then one `instances.get` for each the list left out (a list may lag
    /// behind a create; a get does not), so an instance left out is gone.
    fn lookup(&self, names: &[String]) -> Result<Vec<ApiInstance>, Error> {
        let mut wanted: Vec<&str> = names
            .iter()
            .map(String::as_str)
            .filter(|n| valid_name(n))
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        if wanted.len() <= 1 {
            return Ok(match wanted.first() {
                Some(n) => self.get_one(n)?.into_iter().collect(),
                None => vec![],
            });
        }
        let filter: Vec<String> = wanted.iter().map(|n| format!("(name = \"{n}\")")).collect();
        let url = format!(
            "{}/instances?maxResults=500&filter={}",
            self.base,
            encode_component(&filter.join(" OR "))
        );
        let v = Self::body(
            &self.send(Request::get(&url), Call::Other, None)?,
            "instances.list",
        )?;
        let mut found: Vec<ApiInstance> = Vec::new();
        for item in items(&v)? {
            let i = api::instance(item)
                .map_err(|e| error::transient(format!("instances.list: {e}")))?;
            if wanted.contains(&i.name.as_str()) && !found.iter().any(|f| f.name == i.name) {
                found.push(i);
            }
        }
        for n in wanted {
            if !found.iter().any(|f| f.name == n)
                && let Some(i) = self.get_one(n)?
            {
                found.push(i);
            }
        }
        Ok(found)
    }

    /// Waits on `op` until it is `DONE`, with at most `waits`
    /// `zoneOperations.wait` calls.
    fn finish(&self, mut op: Operation, waits: usize) -> Result<Operation, Error> {
        for _ in 0..waits {
            if op.done() {
                break;
            }
            let url = format!(
                "{}/operations/{}/wait",
                self.base,
                encode_component(&op.name)
            );
            op = Self::read_op(&self.send(Request::post(&url), Call::Other, None)?)?;
        }
        Ok(op)
    }

    /// Sets instance `name`'s labels to `wanted` plus the labels it has
    /// that are not berth's (`current` is how it was last seen), with the
    /// label fingerprint; a stale fingerprint (`412`) reads it again and
    /// tries again. With `wait`, waits for the operation once. The
    /// instance as it is after.
    fn relabel(
        &self,
        name: &str,
        mut current: ApiInstance,
        wanted: &BTreeMap<String, String>,
        wait: bool,
    ) -> Result<ApiInstance, Error> {
        for _ in 0..LABEL_TRIES {
            let mut labels: BTreeMap<String, String> = (current.labels.iter())
                .filter(|(k, _)| !is_berth_tag(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            labels.extend(wanted.iter().map(|(k, v)| (k.clone(), v.clone())));
            if labels == current.labels {
                return Ok(current);
            }
            if labels.len() > names::MAX_LABELS {
                return Err(error::permanent(format!(
                    "{name} would carry {} labels; GCE takes at most {}",
                    labels.len(),
                    names::MAX_LABELS
                )));
            }
            let body = json!({"labels": labels, "labelFingerprint": current.label_fingerprint});
            let url = format!("{}/setLabels", self.instance_url(name));
            let resp = Request::post(&url)
                .header("accept", "application/json")
                .json(&body)
                .send()?;
            if resp.status == 412 {
                current = match self.get_one(name)? {
                    Some(i) if self.owned(&i) => i,
                    _ => return Err(error::not_found(format!("{name} is gone"))),
                };
                continue;
            }
            if Self::gone(&resp, name) {
                return Err(error::not_found(format!("{name} is gone")));
            }
            if !resp.is_success() {
                return Err(from_response(&resp, Call::Other, None));
            }
            let op = Self::read_op(&resp)?;
            if wait {
                let op = self.finish(op, 1)?;
                if op.done() && !op.errors.is_empty() {
                    return Err(from_operation(&op.errors, op.http_status, None));
                }
            }
            current.labels = labels;
            return Ok(current);
        }
        Err(error::transient(format!(
            "the labels of {name} changed under each of {LABEL_TRIES} tries"
        )))
    }

    /// Checks what `spec` asks for and turns it into a name and labels.
    fn prepare(&self, spec: &CreateSpec) -> Result<Prepared, Error> {
        let options = config::parse_label_options(&spec.options).map_err(error::invalid_config)?;
        if spec.image.trim().is_empty() {
            return Err(error::invalid_config(
                "image: must name an image (projects/P/global/images/family/F, or an image of \
                 the project)",
            ));
        }
        if !valid_name(&spec.instance_type) {
            return Err(error::invalid_config(format!(
                "instance type {:?}: must be a machine type name such as e2-small",
                spec.instance_type
            )));
        }
        if !names::valid_request_id(&spec.token) {
            return Err(error::permanent(format!(
                "create token {:?} cannot be a requestId: GCE takes a UUID",
                spec.token
            )));
        }
        if spec
            .user_data
            .as_ref()
            .is_some_and(|u| u.len() > MAX_METADATA_VALUE)
        {
            return Err(error::permanent(format!(
                "user data is longer than the {MAX_METADATA_VALUE} bytes a GCE metadata value holds"
            )));
        }
        if spec
            .ssh_public_key
            .as_ref()
            .is_some_and(|k| k.trim().is_empty() || k.trim().contains(['\n', '\r']))
        {
            return Err(error::permanent(
                "the SSH public key must be one line in OpenSSH format",
            ));
        }
        // The pool tag is this pool's, whatever the spec says.
        let mut tags: Vec<(String, String)> = (spec.tags.iter())
            .filter(|(k, _)| k != POOL_TAG)
            .cloned()
            .collect();
        tags.push((POOL_TAG.to_owned(), self.pool_id.clone()));
        let labels = labels_of(&tags).map_err(error::permanent)?;
        Ok(Prepared {
            name: instance_name(&self.pool_id, &spec.node_id),
            options,
            tags,
            labels,
        })
    }

    /// What an instance of `spec` is made with, but its name: the insert's
    /// body, or a bulk insert's `instanceProperties` (`bulk`), whose
    /// machine and disk types are names, not URLs.
    fn properties(
        &self,
        spec: &CreateSpec,
        o: &LabelOptions,
        labels: &BTreeMap<String, String>,
        bulk: bool,
    ) -> Value {
        let zone = &self.config.zone;
        let machine_type = if bulk {
            spec.instance_type.clone()
        } else {
            format!("zones/{zone}/machineTypes/{}", spec.instance_type)
        };
        let image = if spec.image.contains('/') {
            spec.image.clone()
        } else {
            format!("global/images/{}", spec.image)
        };
        let mut init = json!({ "sourceImage": image });
        if let Some(size) = o.disk_size_gb {
            init["diskSizeGb"] = size.to_string().into();
        }
        if let Some(t) = &o.disk_type {
            init["diskType"] = if bulk {
                t.clone()
            } else {
                format!("zones/{zone}/diskTypes/{t}")
            }
            .into();
        }
        let mut nic = json!({});
        if o.network.is_none() && o.subnetwork.is_none() {
            nic["network"] = "global/networks/default".into();
        }
        if let Some(n) = &o.network {
            nic["network"] = partial(n, "global/networks").into();
        }
        if let Some(s) = &o.subnetwork {
            let region = zone.rsplit_once('-').map_or(zone.as_str(), |(r, _)| r);
            nic["subnetwork"] = partial(s, &format!("regions/{region}/subnetworks")).into();
        }
        if o.external_ip {
            nic["accessConfigs"] = json!([{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]);
        }
        let mut items = Vec::new();
        if let Some(data) = &spec.user_data {
            items.push(json!({"key": "user-data", "value": data}));
        }
        if let Some(key) = &spec.ssh_public_key {
            items.push(
                json!({"key": "ssh-keys", "value": format!("{}:{}", o.ssh_user, key.trim())}),
            );
        }
        let mut v = json!({
            "machineType": machine_type,
            "labels": labels,
            "disks": [{"boot": true, "autoDelete": true, "type": "PERSISTENT", "initializeParams": init}],
            "networkInterfaces": [nic],
        });
        if !items.is_empty() {
            v["metadata"] = json!({ "items": items });
        }
        if let Some(sa) = &o.service_account {
            v["serviceAccounts"] = json!([{"email": sa, "scopes": o.scopes}]);
        }
        match o.provisioning {
            Provisioning::Standard => {}
            Provisioning::Spot => {
                v["scheduling"] = json!({
                    "provisioningModel": "SPOT",
                    "instanceTerminationAction": "DELETE",
                    "automaticRestart": false,
                    "onHostMaintenance": "TERMINATE",
                });
            }
            Provisioning::Preemptible => {
                v["scheduling"] = json!({
                    "preemptible": true,
                    "automaticRestart": false,
                    "onHostMaintenance": "TERMINATE",
                });
            }
        }
        if !o.network_tags.is_empty() {
            v["tags"] = json!({ "items": o.network_tags });
        }
        v
    }

    /// The instance a create made, as accepted: `pending`, with the spec's
    /// tags (GCE has them from the insert on).
    fn accepted(&self, p: &Prepared, spec: &CreateSpec, created_at_ms: Option<u64>) -> Instance {
        Instance {
            id: p.name.clone(),
            state: InstanceState::Pending,
            instance_type: spec.instance_type.clone(),
            tags: p.tags.clone(),
            addresses: Addresses {
                public_ipv4: None,
                private_ipv4: None,
                ipv6: None,
                hostname: self.hostname(&p.name),
            },
            created_at_ms,
            connection: Connection {
                username: spec
                    .ssh_public_key
                    .as_ref()
                    .map(|_| p.options.ssh_user.clone()),
                port: None,
                host_keys: vec![],
            },
        }
    }

    /// `instances.insert` of `spec`, with its token as `requestId`, then a
    /// wait on its operation, whose errors are the create's.
    fn insert(&self, spec: &CreateSpec, p: &Prepared) -> Result<Instance, Error> {
        let mut body = self.properties(spec, &p.options, &p.labels, false);
        body["name"] = p.name.clone().into();
        let url = format!(
            "{}/instances?requestId={}",
            self.base,
            encode_component(&spec.token)
        );
        let resp = Request::post(&url)
            .header("accept", "application/json")
            .json(&body)
            .send()?;
        if resp.status == 409 && api_error(&resp).has("alreadyExists") {
            // An earlier try of this node's create made it.
            return self.adopt(spec, p);
        }
        if !resp.is_success() {
            return Err(from_response(
                &resp,
                Call::Create,
                Some(&spec.instance_type),
            ));
        }
        let op = self.finish(Self::read_op(&resp)?, MAX_WAITS)?;
        if op.done() && !op.errors.is_empty() {
            if op
                .errors
                .iter()
                .any(|e| e.code == "RESOURCE_ALREADY_EXISTS")
            {
                return self.adopt(spec, p);
            }
            return Err(from_operation(
                &op.errors,
                op.http_status,
                Some(&spec.instance_type),
            ));
        }
        Ok(self.accepted(p, spec, op.insert_ms))
    }

    /// The instance named for `spec`'s node, which exists already: an
    /// earlier try of this node's create made it (with another token, or
    /// in a bulk insert whose labels it may lack). It is answered, with the
    /// spec's tags set, if it is this pool's and this node's.
    fn adopt(&self, spec: &CreateSpec, p: &Prepared) -> Result<Instance, Error> {
        let Some(found) = self.get_one(&p.name)? else {
            return Err(error::transient(format!(
                "the name {} is taken, says GCE, but no instance has it; try again",
                p.name
            )));
        };
        if !self.owned(&found) {
            return Err(error::permanent(format!(
                "an instance named {} exists and does not carry {POOL_TAG}={}; left alone",
                p.name, self.pool_id
            )));
        }
        let node = encode_label(&spec.node_id);
        if let Some(other) = found.labels.get(NODE_TAG).filter(|n| **n != node) {
            return Err(error::permanent(format!(
                "an instance named {} exists for node {other}, not {}; left alone",
                p.name, spec.node_id
            )));
        }
        let labelled = self.relabel(&p.name, found, &p.labels, false)?;
        Ok(self.to_instance(&labelled))
    }

    /// One `bulkInsert` for `group` (indexes into `specs`, each prepared),
    /// which share everything but their names and labels: the labels they
    /// all carry go in at the insert, each instance's own after it (a
    /// `setLabels` each). One answer per item.
    fn bulk(
        &self,
        specs: &[CreateSpec],
        group: &[(usize, Prepared)],
    ) -> Vec<Result<Instance, Error>> {
        let all_fail = |e: Error| group.iter().map(|_| Err(e.clone())).collect();
        let Some((first, p0)) = group.first() else {
            return vec![];
        };
        let spec0 = &specs[*first];
        let mut shared = p0.labels.clone();
        shared.retain(|k, v| group.iter().all(|(_, p)| p.labels.get(k) == Some(v)));
        let per: serde_json::Map<String, Value> = (group.iter())
            .map(|(_, p)| (p.name.clone(), json!({ "name": p.name })))
            .collect();
        let count = group.len().to_string();
        let body = json!({
            "count": count,
            "minCount": count,
            "perInstanceProperties": per,
            "instanceProperties": self.properties(spec0, &p0.options, &shared, true),
        });
        let tokens: Vec<&str> = group
            .iter()
            .map(|(i, _)| specs[*i].token.as_str())
            .collect();
        let url = format!(
            "{}/instances/bulkInsert?requestId={}",
            self.base,
            encode_component(&names::batch_request_id(&tokens))
        );
        let sent = Request::post(&url)
            .header("accept", "application/json")
            .json(&body)
            .send();
        let resp = match sent {
            Ok(r) => r,
            Err(e) => return all_fail(e.into()),
        };
        if resp.status == 409 && api_error(&resp).has("alreadyExists") {
            // Some names are taken: earlier tries of these nodes made
            // instances. One insert each finds its own or makes it.
            return (group.iter())
                .map(|(i, p)| self.insert(&specs[*i], p))
                .collect();
        }
        if !resp.is_success() {
            return all_fail(from_response(
                &resp,
                Call::Create,
                Some(&spec0.instance_type),
            ));
        }
        let op = match Self::read_op(&resp).and_then(|op| self.finish(op, MAX_WAITS)) {
            Ok(op) => op,
            Err(e) => return all_fail(e),
        };
        if !op.done() {
            return all_fail(error::transient(format!(
                "the bulk insert {} was still running after waiting; a create sent again finds \
                 what it made",
                op.name
            )));
        }
        if !op.errors.is_empty() {
            return all_fail(from_operation(
                &op.errors,
                op.http_status,
                Some(&spec0.instance_type),
            ));
        }
        let made: Vec<String> = group.iter().map(|(_, p)| p.name.clone()).collect();
        let found = match self.lookup(&made) {
            Ok(f) => f,
            Err(e) => return all_fail(e),
        };
        (group.iter())
            .map(|(_, p)| match found.iter().find(|f| f.name == p.name) {
                Some(i) => self
                    .relabel(&p.name, i.clone(), &p.labels, false)
                    .map(|i| self.to_instance(&i)),
                None => Err(error::transient(format!(
                    "the bulk insert {} is done, but {} is not there",
                    op.name, p.name
                ))),
            })
            .collect()
    }

    /// `instances.delete` of an instance of this pool.
    fn delete_owned(&self, name: &str) -> Result<(), Error> {
        let resp = Request::delete(&self.instance_url(name))
            .header("accept", "application/json")
            .send()?;
        if Self::gone(&resp, name) {
            return Err(error::not_found(format!("{name} is gone")));
        }
        if !resp.is_success() {
            return Err(from_response(&resp, Call::Other, None));
        }
        Self::read_op(&resp).map(|_| ())
    }
}

/// `name` as a partial URL under `under`, unless it is one already.
fn partial(name: &str, under: &str) -> String {
    if name.contains('/') {
        name.to_owned()
    } else {
        format!("{under}/{name}")
    }
}

/// The `items` of a list answer (none when absent).
fn items(v: &Value) -> Result<&[Value], Error> {
    match &v["items"] {
        Value::Null => Ok(&[]),
        Value::Array(a) => Ok(a),
        other => Err(error::transient(format!(
            "instances.list: items is not a list: {other}"
        ))),
    }
}

/// The project the provider's credential for `endpoint`'s host was made
/// for (`auth-info`'s `project_id`).
fn project_from_credential(endpoint: &str) -> Result<String, Error> {
    let url = Url::parse(endpoint)
        .map_err(|e| error::invalid_config(format!("provider config endpoint: {e}")))?;
    let host = url.authority();
    let Some(text) = berth_sdk::auth::info(host)? else {
        return Err(error::invalid_config(format!(
            "provider config project: missing, and no google-service-account credential for \
             {host} names one; set project, or add the credential"
        )));
    };
    let v: Value = serde_json::from_str(&text).map_err(|e| {
        error::invalid_config(format!(
            "the auth-info of {host} is not JSON ({e}); set project"
        ))
    })?;
    match v["project_id"].as_str() {
        Some(p) if config::valid_project(p) => Ok(p.to_owned()),
        Some(p) => Err(error::invalid_config(format!(
            "the credential for {host} names project_id {p:?}, which is not a project id; set \
             project"
        ))),
        None => Err(error::invalid_config(format!(
            "provider config project: missing, and the credential for {host} (kind {}) names no \
             project_id; set project",
            v["kind"].as_str().unwrap_or("unknown")
        ))),
    }
}

impl Driver for Gce {
    fn describe() -> DriverInfo {
        DriverInfo {
            name: "gce".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Instances on Google Compute Engine, in one zone, over the Compute \
                          Engine API v1. The host exchanges the provider's google-service-account \
                          key for tokens; the driver holds none. berth's tags are the instances' \
                          labels (label-encoded), set at the insert, and berth's create token is \
                          the insert's requestId. The instance type is a machine type name \
                          (e2-small), the image a source image (projects/debian-cloud/global/\
                          images/family/debian-12)."
                .into(),
            config: config::config_fields(),
            label_options: config::label_option_fields(),
            capabilities: Capabilities::IDEMPOTENT_CREATE
                | Capabilities::USER_DATA
                | Capabilities::SSH_KEYS
                | Capabilities::CREATE_MANY
                | Capabilities::DELETE_MANY,
        }
    }

    fn configure(pool_id: &str, config: &str) -> Result<Self, Error> {
        let pool_label = encode_label(pool_id);
        let problem = if pool_id.is_empty() {
            Some("pool id: must not be empty".to_owned())
        } else if pool_label.chars().count() > MAX_LABEL {
            Some(format!(
                "pool id {pool_id:?}: its label encoding {pool_label:?} is {} characters; a GCE \
                 label value takes at most {MAX_LABEL} (docs/tags.md, \"The limit\")",
                pool_label.chars().count()
            ))
        } else {
            None
        };
        let config = match (config::parse_config(config), problem) {
            (Ok(c), None) => c,
            (Ok(_), Some(p)) => return Err(error::invalid_config(p)),
            (Err(m), None) => return Err(error::invalid_config(m)),
            (Err(m), Some(p)) => return Err(error::invalid_config(format!("{m}; {p}"))),
        };
        let project = match &config.project {
            Some(p) => p.clone(),
            None => project_from_credential(&config.endpoint)?,
        };
        let base = format!(
            "{}/compute/v1/projects/{}/zones/{}",
            config.endpoint,
            encode_component(&project),
            config.zone
        );
        Ok(Gce {
            pool_id: pool_id.to_owned(),
            pool_label,
            project,
            config,
            base,
        })
    }

    fn create(&mut self, spec: CreateSpec) -> Result<Instance, Error> {
        let p = self.prepare(&spec)?;
        self.insert(&spec, &p)
    }

    /// Creates that share their machine type, image, options, user data and
    /// SSH key go in one `bulkInsert` when there are at least [`BULK_MIN`]
    /// of them; the others in one insert each.
    fn create_many(&mut self, specs: Vec<CreateSpec>) -> Vec<Result<Instance, Error>> {
        let mut answers: Vec<Option<Result<Instance, Error>>> =
            specs.iter().map(|_| None).collect();
        let mut groups: BTreeMap<String, Vec<(usize, Prepared)>> = BTreeMap::new();
        for (i, spec) in specs.iter().enumerate() {
            match self.prepare(spec) {
                Err(e) => answers[i] = Some(Err(e)),
                Ok(p) => {
                    let key = format!(
                        "{:?}",
                        (
                            &spec.instance_type,
                            &spec.image,
                            &spec.user_data,
                            &spec.ssh_public_key,
                            &p.options
                        )
                    );
                    groups.entry(key).or_default().push((i, p));
                }
            }
        }
        for group in groups.into_values() {
            if group.len() < BULK_MIN {
                for (i, p) in group {
                    answers[i] = Some(self.insert(&specs[i], &p));
                }
            } else {
                let results = self.bulk(&specs, &group);
                for ((i, _), r) in group.iter().zip(results) {
                    answers[*i] = Some(r);
                }
            }
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(error::permanent("no answer for this create"))))
            .collect()
    }

    fn get(&mut self, ids: &[String]) -> Result<Vec<Instance>, Error> {
        let found = self.lookup(ids)?;
        let owned = found
            .iter()
            .filter(|i| self.owned(i))
            .map(|i| self.to_instance(i));
        Ok(pages::only_ids(owned, ids, &self.pool_id))
    }

    fn list(&mut self, filter: &[(String, String)], cursor: Option<&str>) -> Result<Page, Error> {
        let nothing = || {
            Ok(Page {
                instances: vec![],
                next: None,
            })
        };
        // A filter naming another pool matches nothing this driver may see.
        if filter
            .iter()
            .any(|(k, v)| k == POOL_TAG && *v != self.pool_id)
        {
            return nothing();
        }
        let wanted = self.pool_filter(filter);
        let mut terms = Vec::new();
        for (k, v) in &wanted {
            // A tag no label can hold is on no instance.
            let Ok(stored) = label_value(k, v) else {
                return nothing();
            };
            if !valid_label_key(k) {
                return nothing();
            }
            terms.push(format!("(labels.{k} = \"{stored}\")"));
        }
        let mut url = format!(
            "{}/instances?maxResults={}&filter={}",
            self.base,
            self.config.page_size,
            encode_component(&terms.join(" AND "))
        );
        if let Some(token) = cursor {
            url.push_str(&format!("&pageToken={}", encode_component(token)));
        }
        let call = if cursor.is_some() {
            Call::ListPage
        } else {
            Call::Other
        };
        let v = Self::body(
            &self.send(Request::get(&url), call, None)?,
            "instances.list",
        )?;
        let mut instances: Vec<Instance> = Vec::new();
        for item in items(&v)? {
            let i = api::instance(item)
                .map_err(|e| error::transient(format!("instances.list: {e}")))?;
            let i = self.to_instance(&i);
            if tags::has_all(&i.tags, &wanted) && !instances.iter().any(|o| o.id == i.id) {
                instances.push(i);
            }
        }
        let next = match &v["nextPageToken"] {
            Value::String(t) if !t.is_empty() => Some(t.clone()),
            _ => None,
        };
        // A token that does not move would have the host loop.
        if next.is_some() && next.as_deref() == cursor {
            return Err(error::transient(format!(
                "instances.list repeated its page token {cursor:?}"
            )));
        }
        Ok(Page { instances, next })
    }

    fn delete(&mut self, instance_id: &str) -> Result<(), Error> {
        let mut answers = self.delete_many(&[instance_id.to_owned()]);
        answers
            .pop()
            .unwrap_or_else(|| Err(error::transient("no answer for the delete")))
    }

    /// One look-up for the batch (a list by name, a get for each it left
    /// out), to leave alone what does not carry this pool's label, then
    /// one `instances.delete` each: GCE has no call that deletes many.
    fn delete_many(&mut self, instance_ids: &[String]) -> Vec<Result<(), Error>> {
        let found = match self.lookup(instance_ids) {
            Ok(f) => f,
            Err(e) => return instance_ids.iter().map(|_| Err(e.clone())).collect(),
        };
        instance_ids
            .iter()
            .map(|id| match found.iter().find(|i| i.name == *id) {
                Some(i) if self.owned(i) => self.delete_owned(id),
                Some(_) => Err(error::not_found(format!(
                    "{id} does not carry {POOL_TAG}={}; left alone",
                    self.pool_id
                ))),
                None => Err(error::not_found(format!("{id} is gone"))),
            })
            .collect()
    }

    fn set_tags(&mut self, instance_id: &str, new: &[(String, String)]) -> Result<(), Error> {
        if new.iter().any(|(k, v)| k == POOL_TAG && *v != self.pool_id) {
            return Err(error::permanent(
                "set-tags cannot move an instance to another pool",
            ));
        }
        // The pool tag always stays; tags that are not berth's are left
        // alone, whatever `new` says.
        let berth: Vec<(String, String)> = (self.pool_filter(new).into_iter())
            .filter(|(k, _)| is_berth_tag(k))
            .collect();
        let wanted = labels_of(&berth).map_err(error::permanent)?;
        let Some(found) = self.get_one(instance_id)? else {
            return Err(error::not_found(format!("{instance_id} is gone")));
        };
        if !self.owned(&found) {
            return Err(error::not_found(format!(
                "{instance_id} does not carry {POOL_TAG}={}; left alone",
                self.pool_id
            )));
        }
        self.relabel(instance_id, found, &wanted, true).map(|_| ())
    }
}

berth_sdk::export_driver!(Gce);

#[cfg(test)]
mod tests {
    use super::*;

    fn t(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect()
    }

    fn driver() -> Gce {
        Gce::configure(
            "p1",
            r#"{"project": "my-project-1", "zone": "us-central1-a", "endpoint": "http://127.0.0.1:9"}"#,
        )
        .unwrap_or_else(|e| panic!("configure: {e:?}"))
    }

    fn spec(options: &str) -> CreateSpec {
        CreateSpec {
            node_id: "n-00000000000000ab".into(),
            token: "3f2c1a4e-7b6d-8e9f-a0b1-c2d3e4f5a6b7".into(),
            instance_type: "e2-small".into(),
            image: "projects/debian-cloud/global/images/family/debian-12".into(),
            tags: t(&[("berth-pool", "p1"), ("berth-node", "n-00000000000000ab")]),
            user_data: None,
            ssh_public_key: None,
            options: options.into(),
        }
    }

    #[test]
    fn describe_declares_what_it_does() {
        let info = Gce::describe();
        assert_eq!(info.name, "gce");
        let names: Vec<&str> = info.config.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["project", "zone", "endpoint", "page-size"]);
        assert!(info.config.iter().any(|f| f.name == "zone" && f.required));
        for field in info.config.iter().chain(&info.label_options) {
            if let Some(default) = &field.default {
                assert!(
                    serde_json::from_str::<Value>(default).is_ok(),
                    "{}",
                    field.name
                );
            }
        }
        for cap in [
            Capabilities::IDEMPOTENT_CREATE,
            Capabilities::USER_DATA,
            Capabilities::SSH_KEYS,
            Capabilities::CREATE_MANY,
            Capabilities::DELETE_MANY,
        ] {
            assert!(info.capabilities.contains(cap), "{cap:?}");
        }
        assert!(!info.capabilities.contains(Capabilities::ACCOUNT_LIMITS));
    }

    #[test]
    fn configure_refuses_bad_config_and_pools_too_long_for_a_label() {
        let d = driver();
        assert_eq!(
            d.base,
            "http://127.0.0.1:9/compute/v1/projects/my-project-1/zones/us-central1-a"
        );
        let config = r#"{"project": "my-project-1", "zone": "us-central1-a"}"#;
        assert!(matches!(
            Gce::configure("", config),
            Err(Error::InvalidConfig(m)) if m.contains("pool id")
        ));
        // 63 characters encode to themselves and fit; one more does not,
        // nor a shorter one that grows when encoded.
        assert!(Gce::configure(&"p".repeat(63), config).is_ok());
        for pool in ["p".repeat(64), format!("{}Z", "p".repeat(61))] {
            match Gce::configure(&pool, config) {
                Err(Error::InvalidConfig(m)) => {
                    assert!(
                        m.contains("at most 63") && m.contains("label encoding"),
                        "{m}"
                    )
                }
                other => panic!("{pool}: {other:?}"),
            }
        }
        assert!(matches!(
            Gce::configure("p", r#"{"project": "my-project-1"}"#),
            Err(Error::InvalidConfig(m)) if m.contains("zone: missing")
        ));
    }

    #[test]
    fn an_insert_carries_every_option() {
        let d = driver();
        let mut s = spec(
            r#"{"subnetwork": "ci-a", "disk-size-gb": 40, "disk-type": "pd-ssd",
                "service-account": "runner@my-project-1.iam.gserviceaccount.com",
                "provisioning": "spot", "network-tags": ["ci"], "ssh-user": "ci", "external-ip": false}"#,
        );
        s.user_data = Some("#!/bin/sh\necho hi\n".into());
        s.ssh_public_key = Some("ssh-ed25519 AAAAC3Nz test@host\n".into());
        let p = d.prepare(&s).expect("prepared");
        assert_eq!(p.name, instance_name("p1", "n-00000000000000ab"));
        let v = d.properties(&s, &p.options, &p.labels, false);
        assert_eq!(
            v["machineType"],
            "zones/us-central1-a/machineTypes/e2-small"
        );
        let disk = &v["disks"][0];
        assert_eq!(disk["boot"], true);
        assert_eq!(disk["autoDelete"], true);
        assert_eq!(
            disk["initializeParams"]["sourceImage"],
            "projects/debian-cloud/global/images/family/debian-12"
        );
        assert_eq!(disk["initializeParams"]["diskSizeGb"], "40");
        assert_eq!(
            disk["initializeParams"]["diskType"],
            "zones/us-central1-a/diskTypes/pd-ssd"
        );
        let nic = &v["networkInterfaces"][0];
        assert_eq!(nic["subnetwork"], "regions/us-central1/subnetworks/ci-a");
        assert!(nic.get("network").is_none() && nic.get("accessConfigs").is_none());
        assert_eq!(
            v["metadata"]["items"][0],
            json!({"key": "user-data", "value": "#!/bin/sh\necho hi\n"})
        );
        assert_eq!(
            v["metadata"]["items"][1],
            json!({"key": "ssh-keys", "value": "ci:ssh-ed25519 AAAAC3Nz test@host"})
        );
        assert_eq!(v["scheduling"]["provisioningModel"], "SPOT");
        assert_eq!(v["scheduling"]["instanceTerminationAction"], "DELETE");
        assert_eq!(
            v["serviceAccounts"][0]["email"],
            "runner@my-project-1.iam.gserviceaccount.com"
        );
        assert_eq!(v["tags"]["items"], json!(["ci"]));
        assert_eq!(v["labels"]["berth-pool"], "p1");
        // A bulk insert's properties name types, not URLs.
        let bulk = d.properties(&s, &p.options, &p.labels, true);
        assert_eq!(bulk["machineType"], "e2-small");
        assert_eq!(bulk["disks"][0]["initializeParams"]["diskType"], "pd-ssd");
    }

    #[test]
    fn an_insert_leaves_out_what_is_not_asked() {
        let d = driver();
        let s = spec("{}");
        let p = d.prepare(&s).expect("prepared");
        let v = d.properties(&s, &p.options, &p.labels, false);
        for absent in ["metadata", "serviceAccounts", "scheduling", "tags"] {
            assert!(v.get(absent).is_none(), "{absent} in {v}");
        }
        let nic = &v["networkInterfaces"][0];
        assert_eq!(nic["network"], "global/networks/default");
        assert_eq!(nic["accessConfigs"][0]["type"], "ONE_TO_ONE_NAT");
        let mut own = spec(r#"{"provisioning": "preemptible", "network": "ci"}"#);
        own.image = "runner-image".into();
        let p = d.prepare(&own).expect("prepared");
        let v = d.properties(&own, &p.options, &p.labels, false);
        assert_eq!(
            v["disks"][0]["initializeParams"]["sourceImage"],
            "global/images/runner-image"
        );
        assert_eq!(v["scheduling"]["preemptible"], true);
        assert_eq!(v["networkInterfaces"][0]["network"], "global/networks/ci");
    }

    #[test]
    fn create_refuses_bad_specs_before_any_request() {
        let mut d = driver();
        for (options, needle) in [
            (r#"{"zone": "a"}"#, "zone"),
            (r#"{"provisioning": "cheap"}"#, "provisioning"),
            ("[]", "JSON object"),
        ] {
            match d.create(spec(options)) {
                Err(Error::InvalidConfig(m)) => assert!(m.contains(needle), "{options}: {m}"),
                other => panic!("{options}: {other:?}"),
            }
        }
        let mut s = spec("{}");
        s.image = String::new();
        assert!(matches!(d.create(s), Err(Error::InvalidConfig(m)) if m.contains("image")));
        let mut s = spec("{}");
        s.instance_type = "zones/us-central1-a/machineTypes/e2-small".into();
        assert!(
            matches!(d.create(s), Err(Error::InvalidConfig(m)) if m.contains("machine type name"))
        );
        let mut s = spec("{}");
        s.token = "n-1".into();
        assert!(matches!(d.create(s), Err(Error::Permanent(m)) if m.contains("requestId")));
        let mut s = spec("{}");
        s.tags.push(("berth-label".into(), "L".repeat(40)));
        assert!(matches!(d.create(s), Err(Error::Permanent(m)) if m.contains("berth-label")));
        let mut s = spec("{}");
        s.ssh_public_key = Some("ssh-rsa A\nssh-rsa B".into());
        assert!(matches!(d.create(s), Err(Error::Permanent(m)) if m.contains("one line")));
        // The pool tag is this pool's, whatever the spec says.
        let mut s = spec("{}");
        s.tags = t(&[("berth-pool", "other"), ("berth-node", "n-1")]);
        let p = d.prepare(&s).expect("prepared");
        assert_eq!(p.labels["berth-pool"], "p1");
    }

    #[test]
    fn foreign_pools_and_impossible_filters_list_nothing_without_a_request() {
        let mut d = driver();
        for filter in [
            t(&[("berth-pool", "other")]),
            t(&[("berth-label", &"x".repeat(64))]),
            t(&[("Not-A-Label", "x")]),
        ] {
            assert!(matches!(
                d.list(&filter, None),
                Ok(p) if p.instances.is_empty() && p.next.is_none()
            ));
        }
        assert!(matches!(
            d.set_tags("i-1", &t(&[("berth-pool", "other")])),
            Err(Error::Permanent(_))
        ));
        // Ids that cannot be instance names exist nowhere.
        assert!(matches!(d.get(&["Not A Name".into()]), Ok(v) if v.is_empty()));
    }
}
