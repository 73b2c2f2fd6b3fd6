//! The berth driver for Hetzner Cloud, over its REST API (`/v1/servers`).
//!
//! The driver holds no token: the host adds the project's API token to
//! each allowed request (a `bearer` credential). Servers carry berth's tags
//! as labels from their create, values through the label encoding
//! (docs/tags.md). A server's name is its node id, and Hetzner keeps names
//! unique in a project, so a create sent again for a node finds the server
//! the first one made (`uniqueness_error`) and answers with it. The driver
//! touches only servers labelled with its pool id.

#![forbid(unsafe_code)]

mod api;
mod config;

use berth_sdk::http::{Request, encode_component};
use berth_sdk::tags::{self, POOL_TAG, encode_label, is_berth_tag};
use berth_sdk::types::{
    AccountLimits, Capabilities, CreateSpec, DriverInfo, Error, Instance, InstanceState, Page,
};
use berth_sdk::{Driver, error, pages};
use serde_json::{Map, Value, json};

use config::{Config, LabelOptions};

/// Hetzner's limit on a label value, after the encoding.
const MAX_LABEL_VALUE: usize = 63;
/// Hetzner's limit on user data.
const MAX_USER_DATA: usize = 32 * 1024;
/// A `get` of at most this many ids asks for each by id; more are looked
/// for in the pool's list first.
const GET_ONE_BY_ONE: usize = 3;

/// The configured driver.
struct Hetzner {
    pool_id: String,
    config: Config,
}

/// A label key as Hetzner takes it: a name of 1 to 63 characters,
/// alphanumerics at both ends and `-_.` between (berth's own keys are).
fn valid_label_key(key: &str) -> bool {
    let b = key.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
}

/// A server name as Hetzner takes it: a hostname label of at most 63
/// characters.
fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
}

/// Tags as Hetzner labels: berth's values encoded; an error names the tag
/// Hetzner would refuse.
fn labels_of(tags: &[(String, String)]) -> Result<Map<String, Value>, Error> {
    let mut labels = Map::new();
    for (k, v) in tags {
        if !valid_label_key(k) {
            return Err(error::permanent(format!(
                "tag key {k:?} cannot be a Hetzner label key (1 to 63 letters, digits, `-_.`)"
            )));
        }
        let value = if is_berth_tag(k) {
            encode_label(v)
        } else {
            v.clone()
        };
        if value.len() > MAX_LABEL_VALUE {
            return Err(error::permanent(format!(
                "tag {k}: its value is {} characters as a label, Hetzner takes at most \
                 {MAX_LABEL_VALUE}",
                value.len()
            )));
        }
        labels.insert(k.clone(), Value::String(value));
    }
    Ok(labels)
}

impl Hetzner {
    /// Sends one request; a 2xx answer's JSON, or the contract's error.
    fn call(&self, request: Request, server_type: Option<&str>) -> Result<Value, Error> {
        let resp = request.send()?;
        if !resp.is_success() {
            return Err(api::from_response(&resp, server_type));
        }
        resp.json::<Value>()
            .map_err(|e| error::transient(format!("Hetzner's answer: {e}")))
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.config.endpoint)
    }

    /// The label selector for `filter` (with this pool's id), or `None`
    /// when a key cannot be a label, which no server can then carry.
    fn selector(&self, filter: &[(String, String)]) -> Option<String> {
        let mut terms = vec![format!("{POOL_TAG}=={}", encode_label(&self.pool_id))];
        for (k, v) in filter.iter().filter(|(k, _)| k != POOL_TAG) {
            if !valid_label_key(k) {
                return None;
            }
            let value = if is_berth_tag(k) {
                encode_label(v)
            } else {
                v.clone()
            };
            terms.push(format!("{k}=={value}"));
        }
        Some(terms.join(","))
    }

    /// One page of the pool's servers matching `filter`: the instances and
    /// the next page number.
    fn page(
        &self,
        filter: &[(String, String)],
        page: u32,
    ) -> Result<(Vec<Instance>, Option<u32>, u32), Error> {
        let Some(selector) = self.selector(filter) else {
            return Ok((Vec::new(), None, 1));
        };
        let url = self.url(&format!(
            "/servers?label_selector={}&page={page}&per_page={}&sort=id:asc",
            encode_component(&selector),
            self.config.page_size
        ));
        let body = self.call(Request::get(&url), None)?;
        let servers = (body.get("servers").and_then(Value::as_array))
            .ok_or_else(|| error::transient("Hetzner's server list has no `servers`"))?;
        let mut instances = Vec::with_capacity(servers.len());
        for s in servers {
            instances.push(api::instance(s).map_err(error::transient)?);
        }
        let pagination = body.pointer("/meta/pagination");
        let number = |key: &str| {
            pagination
                .and_then(|p| p.get(key))
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
        };
        let next = number("next_page");
        if next.is_some_and(|n| n <= page) {
            return Err(error::transient(format!(
                "Hetzner's page {page} points back to page {next:?}"
            )));
        }
        let last = number("last_page").unwrap_or(page);
        let wanted = tags::with_pool(filter, &self.pool_id);
        instances.retain(|i| tags::has_all(&i.tags, &wanted));
        Ok((instances, next, last))
    }

    /// The server `id`, whatever its labels; `None` if there is none.
    fn server(&self, id: &str) -> Result<Option<Value>, Error> {
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
            return Ok(None);
        }
        match self.call(Request::get(&self.url(&format!("/servers/{id}"))), None) {
            Ok(body) => Ok(body.get("server").cloned()),
            Err(Error::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The servers among `ids` that carry this pool's label, from pages of
    /// the pool's list where they cost fewer calls than a GET each
    /// ([`pages::find_ids`]).
    fn find(&mut self, ids: &[String]) -> Result<Vec<Instance>, Error> {
        let pool_id = self.pool_id.clone();
        pages::find_ids(
            self,
            ids,
            &pool_id,
            GET_ONE_BY_ONE,
            |d, cursor| {
                let page = cursor.and_then(|c| c.parse().ok()).unwrap_or(1);
                let (instances, next, last) = d.page(&[], page)?;
                Ok(pages::ListPage {
                    instances,
                    next: next.map(|n| n.to_string()),
                    pages_left: Some(last.saturating_sub(page) as usize),
                })
            },
            |d, id| match d.server(id)? {
                Some(server) => api::instance(&server).map(Some).map_err(error::transient),
                None => Ok(None),
            },
        )
    }

    /// The create body for `spec`.
    fn create_body(&self, spec: &CreateSpec, options: &LabelOptions) -> Result<Value, Error> {
        let tags = tags::with_pool(&spec.tags, &self.pool_id);
        let mut body = json!({
            "name": spec.node_id,
            "server_type": spec.instance_type,
            "image": spec.image,
            "start_after_create": true,
            "labels": labels_of(&tags)?,
        });
        let location = options.location.as_ref().or(self.config.location.as_ref());
        if let Some(location) = location {
            body["location"] = json!(location);
        }
        let user_data = berth_sdk::cloud_init::compose(
            spec.user_data.as_deref(),
            spec.ssh_public_key.as_deref(),
        )
        .map_err(error::permanent)?;
        if let Some(text) = user_data {
            if text.len() > MAX_USER_DATA {
                return Err(error::permanent(format!(
                    "user data: {} bytes, Hetzner takes at most {MAX_USER_DATA}",
                    text.len()
                )));
            }
            body["user_data"] = json!(text);
        }
        if !options.ssh_keys.is_empty() {
            body["ssh_keys"] = json!(options.ssh_keys);
        }
        if !options.networks.is_empty() {
            body["networks"] = json!(options.networks);
        }
        if !options.firewalls.is_empty() {
            let firewalls: Vec<Value> = options
                .firewalls
                .iter()
                .map(|id| json!({"firewall": id}))
                .collect();
            body["firewalls"] = json!(firewalls);
        }
        if let Some(group) = options.placement_group {
            body["placement_group"] = json!(group);
        }
        if options.public_ipv4.is_some() || options.public_ipv6.is_some() {
            body["public_net"] = json!({
                "enable_ipv4": options.public_ipv4.unwrap_or(true),
                "enable_ipv6": options.public_ipv6.unwrap_or(true),
            });
        }
        Ok(body)
    }

    /// The server an earlier create for `spec`'s node made: its name is
    /// taken. Answered only if it is this pool's server for this node.
    fn made_before(&self, spec: &CreateSpec) -> Result<Instance, Error> {
        let url = self.url(&format!(
            "/servers?name={}",
            encode_component(&spec.node_id)
        ));
        let body = self.call(Request::get(&url), None)?;
        let server = (body.get("servers").and_then(Value::as_array))
            .and_then(|s| s.first())
            .ok_or_else(|| {
                error::transient(format!(
                    "server name {} is taken, and no server of that name is listed yet",
                    spec.node_id
                ))
            })?;
        let instance = api::instance(server).map_err(error::transient)?;
        let ours = tags::tag(&instance.tags, POOL_TAG) == Some(self.pool_id.as_str())
            && tags::tag(&instance.tags, tags::NODE_TAG) == Some(spec.node_id.as_str());
        if ours {
            Ok(instance)
        } else {
            Err(error::permanent(format!(
                "server name {} is taken by server {} of another pool or node; left alone",
                spec.node_id, instance.id
            )))
        }
    }
}

impl Driver for Hetzner {
    fn describe() -> DriverInfo {
        DriverInfo {
            name: "hetzner".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Servers on Hetzner Cloud, over its REST API. The host adds the \
                          project's API token to every request; the driver holds none. Servers \
                          are labelled at create and named after their node, which makes a \
                          create sent again find the first one's server. The image is an image \
                          name or id, the instance type a server type (`cx22`, `cax11`, …)."
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
        } else if encode_label(pool_id).len() > MAX_LABEL_VALUE {
            problems.push(format!(
                "pool id {pool_id:?}: {} characters as a label value, Hetzner takes at most \
                 {MAX_LABEL_VALUE} (docs/tags.md)",
                encode_label(pool_id).len()
            ));
        }
        match config {
            Some(config) if problems.is_empty() => Ok(Hetzner {
                pool_id: pool_id.to_owned(),
                config,
            }),
            _ => Err(error::invalid_config(problems.join("; "))),
        }
    }

    fn create(&mut self, spec: CreateSpec) -> Result<Instance, Error> {
        let options = config::parse_label_options(&spec.options).map_err(error::invalid_config)?;
        if spec.image.trim().is_empty() {
            return Err(error::invalid_config("image: must name an image"));
        }
        if spec.instance_type.trim().is_empty() {
            return Err(error::invalid_config(
                "instance type: must name a server type",
            ));
        }
        if !valid_name(&spec.node_id) {
            return Err(error::permanent(format!(
                "node id {:?} cannot be a server name (a hostname label)",
                spec.node_id
            )));
        }
        let body = self.create_body(&spec, &options)?;
        let request = Request::post(&self.url("/servers")).json(&body);
        let answer = match self.call(request, Some(&spec.instance_type)) {
            Ok(answer) => answer,
            Err(Error::Permanent(m)) if m.starts_with("uniqueness_error") => {
                return self.made_before(&spec);
            }
            Err(e) => return Err(e),
        };
        let server = (answer.get("server"))
            .ok_or_else(|| error::transient("Hetzner's create answer has no `server`"))?;
        let mut instance = api::instance(server).map_err(error::transient)?;
        // A create whose action already failed made a server that will
        // never run.
        let action = answer.get("action");
        if action.and_then(|a| a.get("status")).and_then(Value::as_str) == Some("error") {
            let reason = (action.and_then(|a| a.pointer("/error/message")))
                .and_then(Value::as_str)
                .unwrap_or("the create_server action failed");
            instance.state = InstanceState::Failed(reason.chars().take(300).collect());
        }
        Ok(instance)
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
        let page = match cursor {
            None => 1,
            Some(c) => c.parse::<u32>().ok().filter(|n| *n >= 1).ok_or_else(|| {
                error::transient(format!("list cursor {c:?} is not a page number"))
            })?,
        };
        let (instances, next, _) = self.page(filter, page)?;
        Ok(Page {
            instances,
            next: next.map(|n| n.to_string()),
        })
    }

    fn delete(&mut self, instance_id: &str) -> Result<(), Error> {
        let mut answers = self.delete_many(&[instance_id.to_owned()]);
        answers
            .pop()
            .unwrap_or_else(|| Err(error::transient("no answer for the delete")))
    }

    /// One lookup for the batch ([`Hetzner::find`]), to leave alone what
    /// does not carry this pool's label, then a DELETE per server: Hetzner
    /// has no batch delete.
    fn delete_many(&mut self, instance_ids: &[String]) -> Vec<Result<(), Error>> {
        let owned = match self.find(instance_ids) {
            Ok(owned) => owned,
            Err(e) => return instance_ids.iter().map(|_| Err(e.clone())).collect(),
        };
        instance_ids
            .iter()
            .map(|id| match owned.iter().find(|i| i.id == *id) {
                None => Err(error::not_found(format!(
                    "server {id} does not exist or does not carry {POOL_TAG}={}; left alone",
                    self.pool_id
                ))),
                Some(_) => {
                    let url = self.url(&format!("/servers/{id}"));
                    self.call(Request::delete(&url), None).map(|_| ())
                }
            })
            .collect()
    }

    fn set_tags(&mut self, instance_id: &str, new: &[(String, String)]) -> Result<(), Error> {
        if tags::names_other_pool(new, &self.pool_id) {
            return Err(error::permanent(
                "set-tags cannot move a server to another pool",
            ));
        }
        let not_ours = || {
            error::not_found(format!(
                "server {instance_id} does not exist or does not carry {POOL_TAG}={}; left alone",
                self.pool_id
            ))
        };
        let server = self.server(instance_id)?.ok_or_else(not_ours)?;
        let instance = api::instance(&server).map_err(error::transient)?;
        if tags::tag(&instance.tags, POOL_TAG) != Some(self.pool_id.as_str()) {
            return Err(not_ours());
        }
        let wanted = tags::with_pool(new, &self.pool_id);
        let result = tags::replace_berth_tags(&instance.tags, &wanted);
        if result.len() == instance.tags.len()
            && result
                .iter()
                .all(|(k, v)| tags::tag(&instance.tags, k) == Some(v))
        {
            return Ok(());
        }
        // Others' labels go back as they were stored; berth's encoded.
        let stored = server.get("labels").and_then(Value::as_object);
        let mut labels = labels_of(
            &result
                .iter()
                .filter(|(k, _)| is_berth_tag(k))
                .cloned()
                .collect::<Vec<_>>(),
        )?;
        for (k, v) in stored
            .into_iter()
            .flatten()
            .filter(|(k, _)| !is_berth_tag(k))
        {
            labels.insert(k.clone(), v.clone());
        }
        let url = self.url(&format!("/servers/{instance_id}"));
        self.call(Request::put(&url).json(&json!({"labels": labels})), None)
            .map(|_| ())
    }

    /// Hetzner's API has no call for a project's limits; the driver does
    /// not declare `account-limits`.
    fn limits(&mut self) -> Result<AccountLimits, Error> {
        Err(error::permanent(
            "Hetzner's API does not report a project's limits",
        ))
    }
}

berth_sdk::export_driver!(Hetzner);

#[cfg(test)]
mod tests {
    use super::*;

    fn t(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect()
    }

    fn driver() -> Hetzner {
        Hetzner::configure("p1", r#"{"endpoint": "http://127.0.0.1:9/v1"}"#)
            .unwrap_or_else(|e| panic!("configure: {e:?}"))
    }

    fn spec(options: &str) -> CreateSpec {
        CreateSpec {
            node_id: "n-00000000000000ab".into(),
            token: "3f2c1a4e-7b6d-8e9f-a0b1-c2d3e4f5a6b7".into(),
            instance_type: "cx22".into(),
            image: "ubuntu-24.04".into(),
            tags: t(&[
                ("berth-pool", "other"),
                ("berth-node", "n-00000000000000ab"),
                ("berth-label", "CI.big"),
            ]),
            user_data: None,
            ssh_public_key: None,
            options: options.into(),
        }
    }

    #[test]
    fn configure_refuses_a_pool_id_too_long_as_a_label() {
        assert!(Hetzner::configure(&"p".repeat(63), "{}").is_ok());
        assert!(matches!(
            Hetzner::configure(&"P".repeat(30), "{}"),
            Err(Error::InvalidConfig(m)) if m.contains("at most 63")
        ));
        assert!(matches!(
            Hetzner::configure("", r#"{"page-size": 0}"#),
            Err(Error::InvalidConfig(m)) if m.contains("pool id") && m.contains("page-size")
        ));
    }

    #[test]
    fn the_create_body_carries_the_pool_and_every_option() {
        let d = driver();
        let mut s = spec(
            r#"{"location": "hel1", "ssh-keys": ["ops"], "networks": ["12"], "firewalls": ["7"],
                "placement-group": "3", "public-ipv6": false}"#,
        );
        s.ssh_public_key = Some("ssh-ed25519 AAAA ops@example".into());
        let options = config::parse_label_options(&s.options).expect("valid");
        let body = d.create_body(&s, &options).expect("builds");
        assert_eq!(body["name"], "n-00000000000000ab");
        assert_eq!(body["server_type"], "cx22");
        assert_eq!(
            body["labels"]["berth-pool"], "p1",
            "the pool is always this one's"
        );
        assert_eq!(body["labels"]["berth-label"], "z43z49z2ebig", "{body}");
        assert_eq!(body["location"], "hel1");
        assert_eq!(body["ssh_keys"], json!(["ops"]));
        assert_eq!(body["networks"], json!([12]));
        assert_eq!(body["firewalls"], json!([{"firewall": 7}]));
        assert_eq!(body["placement_group"], 3);
        assert_eq!(
            body["public_net"],
            json!({"enable_ipv4": true, "enable_ipv6": false})
        );
        assert!(
            body["user_data"]
                .as_str()
                .is_some_and(|u| u.starts_with("#cloud-config"))
        );
        let plain = d
            .create_body(&spec("{}"), &LabelOptions::default())
            .expect("builds");
        for absent in [
            "location",
            "ssh_keys",
            "networks",
            "firewalls",
            "public_net",
            "user_data",
        ] {
            assert!(plain.get(absent).is_none(), "{absent}: {plain}");
        }
    }

    #[test]
    fn tags_hetzner_would_refuse_are_refused_before_any_request() {
        assert!(labels_of(&t(&[("berth-node", "n-1")])).is_ok());
        assert!(
            matches!(labels_of(&t(&[("bad key", "v")])), Err(Error::Permanent(m)) if m.contains("bad key"))
        );
        let long = "é".repeat(11);
        assert!(
            matches!(labels_of(&t(&[("berth-label", &long)])), Err(Error::Permanent(m)) if m.contains("at most 63"))
        );
        let mut d = driver();
        let mut s = spec("{}");
        s.node_id = "node_1".into();
        assert!(matches!(d.create(s), Err(Error::Permanent(m)) if m.contains("server name")));
        assert!(
            matches!(d.create(spec(r#"{"zone": "a"}"#)), Err(Error::InvalidConfig(m)) if m.contains("zone"))
        );
    }

    #[test]
    fn selectors_encode_berth_values_and_skip_impossible_keys() {
        let d = driver();
        assert_eq!(
            d.selector(&t(&[("berth-pool", "p1"), ("berth-label", "zuul")]))
                .as_deref(),
            Some("berth-pool==p1,berth-label==z7auul")
        );
        assert_eq!(d.selector(&t(&[("not a key", "x")])), None);
        let mut d = driver();
        assert!(matches!(
            d.list(&t(&[("berth-pool", "other")]), None),
            Ok(p) if p.instances.is_empty() && p.next.is_none()
        ));
        assert!(matches!(d.list(&[], Some("two")), Err(Error::Transient(_))));
        assert!(matches!(
            d.set_tags("1", &t(&[("berth-pool", "other")])),
            Err(Error::Permanent(_))
        ));
    }
}
