//! The berth driver for Azure virtual machines, over the Azure Resource
//! Manager REST API.
//!
//! The driver holds no secret: the host exchanges the provider's
//! `oauth2-client-credentials` (a service principal of Entra ID) for a
//! token and adds it to each allowed request. A VM is made by a `PUT` by
//! name, its node id, which is idempotent: a create sent again finds the VM
//! the first one made. It carries berth's tags from that `PUT`, and makes
//! its network interface (and public IP) and OS disk itself, with
//! `deleteOption: Delete`, so one `DELETE` of the VM removes all it made and
//! nothing else. The driver touches only VMs tagged with its pool id.

#![forbid(unsafe_code)]

mod api;
mod config;

use std::collections::HashMap;

use berth_sdk::http::{Request, Response};
use berth_sdk::tags::{self, POOL_TAG};
use berth_sdk::types::{
    AccountLimits, Addresses, Capabilities, CreateSpec, DriverInfo, Error, Instance, InstanceState,
    Page,
};
use berth_sdk::{Driver, error, pages, state};
use serde_json::{Map, Value, json};

use config::{Config, LabelOptions};

/// The Compute API version spoken.
const COMPUTE_API: &str = "2024-07-01";
/// The Network API version, for network interfaces and public IPs, and for
/// the interfaces a VM makes itself.
const NETWORK_API: &str = "2024-05-01";
/// ARM's tag limits: tags per resource, name and value lengths.
const MAX_TAGS: usize = 50;
const MAX_TAG_NAME: usize = 512;
const MAX_TAG_VALUE: usize = 256;
/// `customData` is at most 64 KiB before base64.
const MAX_CUSTOM_DATA: usize = 65_535;
/// Where the addresses of VM `NAME` are kept in the provider's `state`
/// records: `addresses/NAME`.
const ADDRESSES: &str = "addresses/";
/// A `get` of at most this many ids asks for each by name.
const GET_ONE_BY_ONE: usize = 3;

/// The configured driver.
struct Azure {
    pool_id: String,
    config: Config,
    /// VM name → its addresses, learnt from its network interface: they do
    /// not change while the VM exists. Also kept in the provider's `state`
    /// records, so that the host's other instances of the driver, and the
    /// next start, do not ask again.
    addresses: HashMap<String, Addresses>,
}

/// Addresses as [`Azure::addresses_of`] stores them.
fn stored_addresses(text: &str) -> Option<Addresses> {
    let v: Value = serde_json::from_str(text).ok()?;
    let ip = |key: &str| -> Option<String> {
        (v.get(key)?.as_str())
            .filter(|ip| ip.parse::<std::net::Ipv4Addr>().is_ok())
            .map(str::to_owned)
    };
    Some(Addresses {
        public_ipv4: ip("public"),
        private_ipv4: ip("private"),
        ipv6: None,
        hostname: None,
    })
}

/// A VM name as Linux VMs take it.
fn valid_vm_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
        && b[0] != b'_'
        && !matches!(b[b.len() - 1], b'.' | b'-')
}

/// Tags as ARM takes them; an error names the one it would refuse.
fn tags_object(tags: &[(String, String)]) -> Result<Map<String, Value>, Error> {
    if tags.len() > MAX_TAGS {
        return Err(error::permanent(format!(
            "{} tags: Azure takes at most {MAX_TAGS} on a resource",
            tags.len()
        )));
    }
    let mut out = Map::new();
    for (k, v) in tags {
        if k.is_empty() || k.len() > MAX_TAG_NAME || k.chars().any(|c| "<>%&\\?/".contains(c)) {
            return Err(error::permanent(format!(
                "tag name {k:?} cannot be an Azure tag name (1 to {MAX_TAG_NAME} characters, none \
                 of <>%&\\?/)"
            )));
        }
        if v.len() > MAX_TAG_VALUE {
            return Err(error::permanent(format!(
                "tag {k}: its value is {} bytes, Azure takes at most {MAX_TAG_VALUE}",
                v.len()
            )));
        }
        out.insert(k.clone(), Value::String(v.clone()));
    }
    Ok(out)
}

/// The `imageReference` of `image`: a Marketplace URN
/// (`publisher:offer:sku:version`) or an image's ARM id.
fn image_reference(image: &str) -> Result<Value, Error> {
    if image.starts_with("/subscriptions/") && !image.contains(['?', '#']) {
        return Ok(json!({"id": image}));
    }
    match image.split(':').collect::<Vec<_>>().as_slice() {
        [publisher, offer, sku, version]
            if [publisher, offer, sku, version]
                .iter()
                .all(|p| !p.is_empty()) =>
        {
            Ok(json!({"publisher": publisher, "offer": offer, "sku": sku, "version": version}))
        }
        _ => Err(error::invalid_config(format!(
            "image {image:?}: expected a URN (publisher:offer:sku:version) or an image's ARM id"
        ))),
    }
}

impl Azure {
    fn group_url(&self) -> String {
        format!(
            "{}/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachines",
            self.config.endpoint, self.config.subscription, self.config.resource_group
        )
    }

    fn vm_url(&self, name: &str) -> String {
        format!("{}/{name}?api-version={COMPUTE_API}", self.group_url())
    }

    /// Sends one request; a 2xx answer, or the contract's error.
    fn call(&self, request: Request, size: Option<&str>) -> Result<Response, Error> {
        let resp = request.send()?;
        if let Some((budget, left)) = api::low_budget(&resp) {
            berth_sdk::log::warn(
                "the subscription's ARM request budget is nearly spent; ARM answers 429 when it is",
                &[("budget", budget), ("remaining", &left.to_string())],
            );
        }
        if resp.is_success() {
            Ok(resp)
        } else {
            Err(api::from_response(&resp, size))
        }
    }

    fn json(resp: &Response) -> Result<Value, Error> {
        resp.json::<Value>()
            .map_err(|e| error::transient(format!("ARM's answer: {e}")))
    }

    /// VM `name` with its instance view, whatever its tags; `None` if there
    /// is none.
    fn vm(&self, name: &str) -> Result<Option<Value>, Error> {
        if !valid_vm_name(name) {
            return Ok(None);
        }
        let url = format!("{}&$expand=instanceView", self.vm_url(name));
        match self.call(Request::get(&url), None) {
            Ok(resp) => Self::json(&resp).map(Some),
            Err(Error::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn ours(&self, vm: &Value) -> bool {
        vm.pointer(&format!("/tags/{POOL_TAG}"))
            .and_then(Value::as_str)
            == Some(self.pool_id.as_str())
    }

    /// The addresses of a VM that has finished provisioning, from its
    /// network interface (and public IP), asked once per VM: then kept
    /// here and in the `state` records.
    fn addresses_of(&mut self, name: &str, vm: &Value) -> Result<Addresses, Error> {
        if let Some(known) = self.addresses.get(name) {
            return Ok(known.clone());
        }
        let key = format!("{ADDRESSES}{name}");
        // A record that cannot be read is asked of the cloud again.
        if let Some(known) = (state::get(&key).ok().flatten()).and_then(|t| stored_addresses(&t)) {
            self.addresses.insert(name.to_owned(), known.clone());
            return Ok(known);
        }
        let done = vm
            .pointer("/properties/provisioningState")
            .and_then(Value::as_str)
            == Some("Succeeded");
        let Some(nic) = api::nic_id(vm).filter(|_| done) else {
            return Ok(Addresses::default());
        };
        let url = format!("{}{nic}?api-version={NETWORK_API}", self.config.endpoint);
        let nic = Self::json(&self.call(Request::get(&url), None)?)?;
        let (private, pip) = api::nic_addresses(&nic);
        let public = match pip {
            None => None,
            Some(id) => {
                let url = format!("{}{id}?api-version={NETWORK_API}", self.config.endpoint);
                let pip = Self::json(&self.call(Request::get(&url), None)?)?;
                (pip.pointer("/properties/ipAddress").and_then(Value::as_str))
                    .filter(|ip| ip.parse::<std::net::Ipv4Addr>().is_ok())
                    .map(str::to_owned)
            }
        };
        let addresses = Addresses {
            public_ipv4: public,
            private_ipv4: private,
            ipv6: None,
            hostname: None,
        };
        self.addresses.insert(name.to_owned(), addresses.clone());
        let text = json!({"private": addresses.private_ipv4, "public": addresses.public_ipv4});
        // Another instance may have stored them first; they are the same.
        let _ = state::compare_and_swap(&key, None, Some(&text.to_string()));
        Ok(addresses)
    }

    /// Forgets the addresses of VM `name`, deleted.
    fn forget(&mut self, name: &str) {
        self.addresses.remove(name);
        let key = format!("{ADDRESSES}{name}");
        if let Ok(Some(text)) = state::get(&key) {
            let _ = state::compare_and_swap(&key, Some(&text), None);
        }
    }

    /// A VM of an answer as an instance: its addresses once it is up, and
    /// the reason of a failure from its instance view (asked for when a
    /// list left it out).
    fn instance_of(&mut self, vm: &Value) -> Result<Instance, Error> {
        let name = (vm.get("name").and_then(Value::as_str))
            .unwrap_or_default()
            .to_owned();
        let failed = matches!(
            vm.pointer("/properties/provisioningState")
                .and_then(Value::as_str),
            Some("Failed" | "Canceled")
        );
        if failed
            && vm.pointer("/properties/instanceView").is_none()
            && let Some(full) = self.vm(&name)?
        {
            return api::instance(&full, Addresses::default()).map_err(error::transient);
        }
        let addresses = self.addresses_of(&name, vm)?;
        api::instance(vm, addresses).map_err(error::transient)
    }

    /// One page of the resource group's VMs at `url`: this pool's, and the
    /// next page's link.
    fn page(&mut self, url: &str) -> Result<(Vec<Instance>, Option<String>), Error> {
        let body = Self::json(&self.call(Request::get(url), None)?)?;
        let vms = (body.get("value").and_then(Value::as_array))
            .ok_or_else(|| error::transient("ARM's VM list has no `value`"))?;
        let mut out = Vec::new();
        for vm in vms {
            if self.ours(vm) {
                out.push(self.instance_of(vm)?);
            }
        }
        let next = (body.get("nextLink").and_then(Value::as_str)).map(str::to_owned);
        if let Some(link) = &next {
            self.check_link(link)?;
            if link == url {
                return Err(error::transient(
                    "ARM's nextLink points back to the same page",
                ));
            }
        }
        Ok((out, next))
    }

    /// A `nextLink` must stay on the configured endpoint: the driver never
    /// follows one elsewhere.
    fn check_link(&self, link: &str) -> Result<(), Error> {
        let ours = link
            .strip_prefix(&self.config.endpoint)
            .is_some_and(|rest| rest.starts_with('/'));
        if ours {
            Ok(())
        } else {
            Err(error::transient(format!(
                "a list cursor {link:?} that is not on {}",
                self.config.endpoint
            )))
        }
    }

    /// The VMs among `ids` that carry this pool's tag, from pages of the
    /// group's list where they cost fewer calls than a GET each
    /// ([`pages::find_ids`]; ARM does not say how many pages are left).
    fn find(&mut self, ids: &[String]) -> Result<Vec<Instance>, Error> {
        let pool_id = self.pool_id.clone();
        let first = format!("{}?api-version={COMPUTE_API}", self.group_url());
        pages::find_ids(
            self,
            ids,
            &pool_id,
            GET_ONE_BY_ONE,
            |d, cursor| {
                let (instances, next) = d.page(cursor.unwrap_or(&first))?;
                Ok(pages::ListPage {
                    instances,
                    next,
                    pages_left: None,
                })
            },
            |d, id| match d.vm(id)?.filter(|vm| d.ours(vm)) {
                Some(vm) => d.instance_of(&vm).map(Some),
                None => Ok(None),
            },
        )
    }

    /// The `PUT` body for `spec`.
    fn vm_body(&self, spec: &CreateSpec, options: &LabelOptions) -> Result<Value, Error> {
        let tags = tags_object(&tags::with_pool(&spec.tags, &self.pool_id))?;
        let subnet = (options
            .subnet_id
            .as_ref()
            .or(self.config.subnet_id.as_ref()))
        .ok_or_else(|| {
            error::invalid_config("subnet-id: set it in the provider config or the label's options")
        })?;
        let user = options.admin_username.as_deref().unwrap_or("berth");
        let key = (spec
            .ssh_public_key
            .as_deref()
            .or(options.ssh_public_key.as_deref()))
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .ok_or_else(|| {
            error::invalid_config(
                "ssh-public-key: Azure's Linux VMs need a key for the admin user, and the \
                     request brought none",
            )
        })?;
        if key.contains(['\n', '\r']) {
            return Err(error::permanent("ssh public key: must be one line"));
        }
        let mut ip_config = json!({"subnet": {"id": subnet}});
        if options.public_ip {
            ip_config["publicIPAddressConfiguration"] = json!({
                "name": format!("{}-pip", spec.node_id),
                "sku": {"name": "Standard"},
                "properties": {"deleteOption": "Delete", "publicIPAllocationMethod": "Static"},
            });
        }
        let mut os_disk = json!({"createOption": "FromImage", "deleteOption": "Delete"});
        if let Some(kind) = &options.os_disk_type {
            os_disk["managedDisk"] = json!({"storageAccountType": kind});
        }
        if let Some(size) = options.os_disk_size_gb {
            os_disk["diskSizeGB"] = json!(size);
        }
        let mut os = json!({
            "computerName": spec.node_id,
            "adminUsername": user,
            "linuxConfiguration": {
                "disablePasswordAuthentication": true,
                "ssh": {"publicKeys": [{"path": format!("/home/{user}/.ssh/authorized_keys"), "keyData": key}]},
            },
        });
        if let Some(data) = &spec.user_data {
            if data.len() > MAX_CUSTOM_DATA {
                return Err(error::permanent(format!(
                    "user data: {} bytes, Azure takes at most {MAX_CUSTOM_DATA}",
                    data.len()
                )));
            }
            os["customData"] = json!(berth_sdk::cloud_init::base64(data.as_bytes()));
        }
        let mut properties = json!({
            "hardwareProfile": {"vmSize": spec.instance_type},
            "storageProfile": {"imageReference": image_reference(&spec.image)?, "osDisk": os_disk},
            "osProfile": os,
            "networkProfile": {
                "networkApiVersion": NETWORK_API,
                "networkInterfaceConfigurations": [{
                    "name": format!("{}-nic", spec.node_id),
                    "properties": {
                        "primary": true,
                        "deleteOption": "Delete",
                        "ipConfigurations": [{"name": "ipconfig", "properties": ip_config}],
                    },
                }],
            },
        });
        if options.spot {
            properties["priority"] = json!("Spot");
            properties["evictionPolicy"] = json!("Delete");
            properties["billingProfile"] = json!({"maxPrice": -1});
        }
        let mut body = json!({
            "location": self.config.location,
            "tags": tags,
            "properties": properties,
        });
        if let Some(zone) = &options.zone {
            body["zones"] = json!([zone]);
        }
        Ok(body)
    }
}

impl Driver for Azure {
    fn describe() -> DriverInfo {
        DriverInfo {
            name: "azure".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Virtual machines on Azure, over Azure Resource Manager. The host \
                          exchanges the provider's service principal for tokens; the driver holds \
                          none. A VM is a PUT by its node's name, so a create sent again finds the \
                          first one's VM; it carries berth's tags and makes its own network \
                          interface and disk, deleted with it. The image is a Marketplace URN or \
                          an image id, the instance type a VM size (`Standard_D2s_v5`, …)."
                .into(),
            config: config::config_fields(),
            label_options: config::label_option_fields(),
            capabilities: Capabilities::IDEMPOTENT_CREATE
                | Capabilities::USER_DATA
                | Capabilities::SSH_KEYS
                | Capabilities::DELETE_MANY,
        }
    }

    fn configure(pool_id: &str, config: &str) -> Result<Self, Error> {
        let mut problems = Vec::new();
        let config = config::parse_config(config)
            .map_err(|m| problems.push(m))
            .ok();
        if pool_id.is_empty() {
            problems.push("pool id: must not be empty".to_owned());
        }
        match config {
            Some(config) if problems.is_empty() => Ok(Azure {
                pool_id: pool_id.to_owned(),
                config,
                addresses: HashMap::new(),
            }),
            _ => Err(error::invalid_config(problems.join("; "))),
        }
    }

    fn create(&mut self, spec: CreateSpec) -> Result<Instance, Error> {
        let options = config::parse_label_options(&spec.options).map_err(error::invalid_config)?;
        if spec.instance_type.trim().is_empty() {
            return Err(error::invalid_config("instance type: must name a VM size"));
        }
        if !valid_vm_name(&spec.node_id) {
            return Err(error::permanent(format!(
                "node id {:?} cannot be a VM name",
                spec.node_id
            )));
        }
        let body = self.vm_body(&spec, &options)?;
        let request = Request::put(&self.vm_url(&spec.node_id)).json(&body);
        let vm = Self::json(&self.call(request, Some(&spec.instance_type))?)?;
        if !self.ours(&vm) {
            return Err(error::permanent(format!(
                "VM {} answered without {POOL_TAG}={}",
                spec.node_id, self.pool_id
            )));
        }
        self.instance_of(&vm)
    }

    fn get(&mut self, ids: &[String]) -> Result<Vec<Instance>, Error> {
        self.find(ids)
    }

    fn list(&mut self, filter: &[(String, String)], cursor: Option<&str>) -> Result<Page, Error> {
        if tags::names_other_pool(filter, &self.pool_id) {
            return Ok(Page {
                instances: vec![],
                next: None,
            });
        }
        let url = match cursor {
            None => format!("{}?api-version={COMPUTE_API}", self.group_url()),
            Some(link) => {
                self.check_link(link)?;
                link.to_owned()
            }
        };
        let (mut instances, next) = self.page(&url)?;
        let wanted = tags::with_pool(filter, &self.pool_id);
        instances.retain(|i| tags::has_all(&i.tags, &wanted));
        Ok(Page { instances, next })
    }

    fn delete(&mut self, instance_id: &str) -> Result<(), Error> {
        let mut answers = self.delete_many(&[instance_id.to_owned()]);
        answers
            .pop()
            .unwrap_or_else(|| Err(error::transient("no answer for the delete")))
    }

    /// One lookup for the batch, to leave alone what does not carry this
    /// pool's tag, then a `DELETE` per VM (ARM has no batch delete); each
    /// takes the interface, IP and disk the VM made with it.
    fn delete_many(&mut self, instance_ids: &[String]) -> Vec<Result<(), Error>> {
        let owned = match self.find(instance_ids) {
            Ok(owned) => owned,
            Err(e) => return instance_ids.iter().map(|_| Err(e.clone())).collect(),
        };
        let mut answers = Vec::with_capacity(instance_ids.len());
        for id in instance_ids {
            let answer = match owned.iter().find(|i| i.id == *id) {
                None => {
                    self.forget(id);
                    Err(error::not_found(format!(
                        "VM {id} does not exist or does not carry {POOL_TAG}={}; left alone",
                        self.pool_id
                    )))
                }
                Some(i) if i.state == InstanceState::Stopping => Ok(()),
                Some(_) => {
                    let deleted = (self.call(Request::delete(&self.vm_url(id)), None)).map(|_| ());
                    if deleted.is_ok() {
                        self.forget(id);
                    }
                    deleted
                }
            };
            answers.push(answer);
        }
        answers
    }

    fn set_tags(&mut self, instance_id: &str, new: &[(String, String)]) -> Result<(), Error> {
        if tags::names_other_pool(new, &self.pool_id) {
            return Err(error::permanent(
                "set-tags cannot move a VM to another pool",
            ));
        }
        let vm = self
            .vm(instance_id)?
            .filter(|vm| self.ours(vm))
            .ok_or_else(|| {
                error::not_found(format!(
                    "VM {instance_id} does not exist or does not carry {POOL_TAG}={}; left alone",
                    self.pool_id
                ))
            })?;
        let instance = api::instance(&vm, Addresses::default()).map_err(error::transient)?;
        let result = tags::replace_berth_tags(&instance.tags, &tags::with_pool(new, &self.pool_id));
        if result.len() == instance.tags.len()
            && result
                .iter()
                .all(|(k, v)| tags::tag(&instance.tags, k) == Some(v))
        {
            return Ok(());
        }
        let body = json!({"tags": tags_object(&result)?});
        self.call(Request::patch(&self.vm_url(instance_id)).json(&body), None)
            .map(|_| ())
    }

    /// Azure keeps quotas per VM family in another API (`usages`); the
    /// driver does not declare `account-limits`.
    fn limits(&mut self) -> Result<AccountLimits, Error> {
        Err(error::permanent(
            "the azure driver does not report the subscription's limits",
        ))
    }
}

berth_sdk::export_driver!(Azure);

#[cfg(test)]
mod tests {
    use super::*;

    const SUBNET: &str = "/subscriptions/s/resourceGroups/net/providers/Microsoft.Network/virtualNetworks/v/subnets/ci";

    fn driver() -> Azure {
        Azure::configure(
            "p1",
            &format!(
                r#"{{"subscription-id": "00000000-0000-4000-8000-000000000001", "resource-group": "rg",
                    "location": "westeurope", "subnet-id": "{SUBNET}", "endpoint": "http://127.0.0.1:9"}}"#
            ),
        )
        .unwrap_or_else(|e| panic!("configure: {e:?}"))
    }

    fn spec(options: &str) -> CreateSpec {
        CreateSpec {
            node_id: "n-00000000000000ab".into(),
            token: "3f2c1a4e-7b6d-8e9f-a0b1-c2d3e4f5a6b7".into(),
            instance_type: "Standard_B2s".into(),
            image: "Canonical:ubuntu-24_04-lts:server:latest".into(),
            tags: vec![
                ("berth-pool".into(), "other".into()),
                ("berth-node".into(), "n-00000000000000ab".into()),
            ],
            user_data: Some("#!/bin/sh\n".into()),
            ssh_public_key: Some("ssh-ed25519 AAAA ops@example".into()),
            options: options.into(),
        }
    }

    #[test]
    fn the_put_body_makes_what_the_vm_deletes_with_it() {
        let d = driver();
        let options = config::parse_label_options(
            r#"{"public-ip": true, "spot": true, "zone": "2", "os-disk-type": "Premium_LRS"}"#,
        )
        .expect("valid");
        let body = d.vm_body(&spec("{}"), &options).expect("builds");
        assert_eq!(body["tags"]["berth-pool"], "p1", "the pool is this one's");
        assert_eq!(body["location"], "westeurope");
        assert_eq!(body["zones"], json!(["2"]));
        let p = &body["properties"];
        assert_eq!(p["storageProfile"]["osDisk"]["deleteOption"], "Delete");
        assert_eq!(p["storageProfile"]["imageReference"]["sku"], "server");
        let nic = &p["networkProfile"]["networkInterfaceConfigurations"][0];
        assert_eq!(nic["properties"]["deleteOption"], "Delete");
        let ip = &nic["properties"]["ipConfigurations"][0]["properties"];
        assert_eq!(ip["subnet"]["id"], SUBNET);
        assert_eq!(
            ip["publicIPAddressConfiguration"]["properties"]["deleteOption"],
            "Delete"
        );
        assert_eq!(p["osProfile"]["customData"], "IyEvYmluL3NoCg==");
        assert_eq!(
            p["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"][0]["path"],
            "/home/berth/.ssh/authorized_keys"
        );
        assert_eq!(
            (p["priority"].as_str(), p["evictionPolicy"].as_str()),
            (Some("Spot"), Some("Delete"))
        );
    }

    #[test]
    fn what_azure_would_refuse_is_refused_before_any_request() {
        let mut d = driver();
        let mut s = spec("{}");
        s.ssh_public_key = None;
        assert!(
            matches!(d.create(s), Err(Error::InvalidConfig(m)) if m.contains("ssh-public-key"))
        );
        let mut s = spec("{}");
        s.image = "ubuntu".into();
        assert!(matches!(d.create(s), Err(Error::InvalidConfig(m)) if m.contains("URN")));
        let mut s = spec("{}");
        s.node_id = "_n".into();
        assert!(matches!(d.create(s), Err(Error::Permanent(m)) if m.contains("VM name")));
        let many: Vec<(String, String)> = (0..51).map(|i| (format!("k{i}"), "v".into())).collect();
        assert!(matches!(tags_object(&many), Err(Error::Permanent(_))));
        assert!(matches!(
            tags_object(&[("a/b".into(), "v".into())]),
            Err(Error::Permanent(_))
        ));
        assert!(
            image_reference(
                "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/images/i"
            )
            .is_ok()
        );
    }

    #[test]
    fn stored_addresses_are_read_back_and_checked() {
        let a = stored_addresses(r#"{"private": "10.0.0.4", "public": null}"#).expect("reads");
        assert_eq!(a.private_ipv4.as_deref(), Some("10.0.0.4"));
        assert_eq!(a.public_ipv4, None);
        let odd = stored_addresses(r#"{"private": "10.0.0.4; rm", "public": 7}"#).expect("reads");
        assert_eq!((odd.private_ipv4, odd.public_ipv4), (None, None));
        assert!(stored_addresses("not json").is_none());
    }

    #[test]
    fn list_cursors_stay_on_the_endpoint() {
        let mut d = driver();
        assert!(
            d.check_link("http://127.0.0.1:9/subscriptions/x?$skiptoken=1")
                .is_ok()
        );
        assert!(d.check_link("http://127.0.0.1:99/subscriptions/x").is_err());
        assert!(d.check_link("http://evil.example/subscriptions").is_err());
        assert!(matches!(
            d.list(&[], Some("http://evil.example/")),
            Err(Error::Transient(_))
        ));
        assert!(matches!(
            d.list(&[("berth-pool".into(), "other".into())], None),
            Ok(p) if p.instances.is_empty() && p.next.is_none()
        ));
    }
}
