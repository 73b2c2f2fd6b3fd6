//! {{name}}: a berth driver. As written it drives berth's simulated cloud
//! (`berth sim`, whose API is in berth's docs/sim-cloud.md); every place to
//! change for your cloud's API is marked `Your cloud:`. The rules each call
//! must keep are in berth's docs/writing-a-driver.md, "The contract rules".

use berth_sdk::http::{Request, Response, Url, encode_component};
use berth_sdk::tags::{self, POOL_TAG, is_berth_tag};
use berth_sdk::types::{
    AccountLimits, Addresses, Capabilities, ConfigField, Connection, CreateSpec, DriverInfo,
    Error, FieldType, Instance, InstanceState, Page,
};
use berth_sdk::{Driver, error, pages};
use serde::Deserialize;
use serde_json::{Value, json};

/// The provider config, as `[providers.NAME] config` gives it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    endpoint: String,
    #[serde(default)]
    page_size: Option<u32>,
}

/// The configured driver. The host runs several instances side by side and
/// configures each, so this is all a driver keeps between calls.
struct Cloud {
    pool_id: String,
    endpoint: String,
    page_size: Option<u32>,
}

impl Driver for Cloud {
    fn describe() -> DriverInfo {
        DriverInfo {
            name: "{{name}}".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Machines on {{name}}.".into(),
            config: vec![
                ConfigField {
                    name: "endpoint".into(),
                    field_type: FieldType::String,
                    required: true,
                    default: None,
                    doc: "Base URL of the API; its host must be in the allowed hosts.".into(),
                },
                ConfigField {
                    name: "page_size".into(),
                    field_type: FieldType::Integer,
                    required: false,
                    default: None,
                    doc: "Instances per list page, 1 to 1000.".into(),
                },
            ],
            label_options: vec![],
            capabilities: Capabilities::IDEMPOTENT_CREATE,
        }
    }

    fn configure(pool_id: &str, config: &str) -> Result<Self, Error> {
        let config: Config = serde_json::from_str(config)
            .map_err(|e| error::invalid_config(format!("provider config: {e}")))?;
        // Name every wrong field at once.
        let mut problems = Vec::new();
        let endpoint = config.endpoint.trim_end_matches('/').to_owned();
        if let Err(e) = Url::parse(&endpoint) {
            problems.push(format!("endpoint: {e}"));
        }
        if config.page_size.is_some_and(|n| !(1..=1000).contains(&n)) {
            problems.push("page_size: must be between 1 and 1000".to_owned());
        }
        if !problems.is_empty() {
            return Err(error::invalid_config(problems.join("; ")));
        }
        Ok(Cloud {
            pool_id: pool_id.to_owned(),
            endpoint,
            page_size: config.page_size,
        })
    }

    fn create(&mut self, spec: CreateSpec) -> Result<Instance, Error> {
        // Never create outside this pool, whatever the spec says.
        let mut tags: serde_json::Map<String, Value> =
            spec.tags.into_iter().map(|(k, v)| (k, v.into())).collect();
        tags.insert(POOL_TAG.to_owned(), self.pool_id.clone().into());
        // Your cloud: its create call. berth's create token is the
        // idempotency key, so a create sent twice makes one machine.
        let resp = Request::post(&format!("{}/v1/instances", self.endpoint))
            .json(&json!({
                "instance_type": spec.instance_type,
                "image": spec.image,
                "tags": tags,
                "client_token": spec.token,
            }))
            .send()?;
        match resp.status {
            200 | 201 => instance(&resp.json()?),
            _ => Err(api_error(&resp)),
        }
    }

    fn get(&mut self, ids: &[String]) -> Result<Vec<Instance>, Error> {
        if ids.is_empty() {
            return Ok(vec![]);
        }
        // Your cloud: a lookup of just these ids (a filter by id, or one
        // call each), never a list of everything.
        let mut url = format!(
            "{}/v1/instances?tag:{POOL_TAG}={}&page_size=1000",
            self.endpoint,
            encode_component(&self.pool_id)
        );
        for id in ids {
            url.push_str(&format!("&id={}", encode_component(id)));
        }
        let (found, _) = list_page(&url)?;
        Ok(pages::only_ids(found, ids, &self.pool_id))
    }

    fn list(&mut self, filter: &[(String, String)], cursor: Option<&str>) -> Result<Page, Error> {
        // Another pool's instances are never shown.
        if filter.iter().any(|(k, v)| k == POOL_TAG && *v != self.pool_id) {
            return Ok(Page { instances: vec![], next: None });
        }
        // Your cloud: its list call, filtered by the pool tag, one page per
        // call: the host asks for the next with the cursor given back.
        let mut url = format!(
            "{}/v1/instances?tag:{POOL_TAG}={}",
            self.endpoint,
            encode_component(&self.pool_id)
        );
        if let Some(n) = self.page_size {
            url.push_str(&format!("&page_size={n}"));
        }
        if let Some(token) = cursor {
            url.push_str(&format!("&page_token={}", encode_component(token)));
        }
        let (mut found, next) = list_page(&url)?;
        // A token that does not move would have the host loop.
        if next.is_some() && next.as_deref() == cursor {
            return Err(error::transient("the API repeated a page token"));
        }
        let mut wanted = filter.to_vec();
        wanted.push((POOL_TAG.to_owned(), self.pool_id.clone()));
        found.retain(|i| tags::has_all(&i.tags, &wanted));
        Ok(Page { instances: found, next })
    }

    fn delete(&mut self, instance_id: &str) -> Result<(), Error> {
        // Your cloud: its delete call. A 404 becomes `not-found`, which the
        // host counts as deleted.
        let url = format!("{}/v1/instances/{}", self.endpoint, encode_component(instance_id));
        let resp = Request::delete(&url).send()?;
        match resp.status {
            200 | 202 | 204 => Ok(()),
            _ => Err(api_error(&resp)),
        }
    }

    fn set_tags(&mut self, instance_id: &str, new: &[(String, String)]) -> Result<(), Error> {
        // Only berth's tags are replaced, and the pool tag always stays.
        let mut tags: serde_json::Map<String, Value> = new
            .iter()
            .filter(|(k, _)| is_berth_tag(k) && k != POOL_TAG)
            .map(|(k, v)| (k.clone(), v.clone().into()))
            .collect();
        tags.insert(POOL_TAG.to_owned(), self.pool_id.clone().into());
        // Your cloud: its call that replaces an instance's tags.
        let url = format!(
            "{}/v1/instances/{}/tags",
            self.endpoint,
            encode_component(instance_id)
        );
        let resp = Request::put(&url).json(&json!({ "tags": tags })).send()?;
        match resp.status {
            200 | 204 => Ok(()),
            _ => Err(api_error(&resp)),
        }
    }

    fn limits(&mut self) -> Result<AccountLimits, Error> {
        // Without the `ACCOUNT_LIMITS` capability the host never asks.
        Err(error::permanent("{{name}} reports no account limits"))
    }
}

/// Your cloud: one page of its list call, and its token for the next.
fn list_page(url: &str) -> Result<(Vec<Instance>, Option<String>), Error> {
    let resp = Request::get(url).send()?;
    if resp.status != 200 {
        return Err(api_error(&resp));
    }
    let page: Value = resp.json()?;
    let mut found = Vec::new();
    for i in page["instances"].as_array().into_iter().flatten() {
        found.push(instance(i)?);
    }
    let next = page["next_page_token"].as_str().map(str::to_owned);
    Ok((found, next))
}

/// Your cloud: its instance JSON as the contract's `Instance`.
fn instance(v: &Value) -> Result<Instance, Error> {
    let text = |key: &str| v[key].as_str().map(str::to_owned);
    let id = text("id").ok_or_else(|| error::transient(format!("an instance without an id: {v}")))?;
    let state = match v["state"].as_str() {
        Some("pending") => InstanceState::Pending,
        Some("running") => InstanceState::Running,
        Some("stopping") => InstanceState::Stopping,
        Some("terminated") => InstanceState::Terminated,
        // The cloud gave up on it; berth replaces it at once.
        Some("failed") => InstanceState::Failed(text("fault").unwrap_or_default()),
        _ => InstanceState::Unknown,
    };
    let tags = v["tags"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
        .collect();
    Ok(Instance {
        id,
        state,
        instance_type: text("instance_type").unwrap_or_default(),
        tags,
        addresses: Addresses {
            private_ipv4: text("private_ipv4"),
            public_ipv4: text("public_ipv4"),
            ipv6: text("ipv6"),
            hostname: text("hostname"),
        },
        created_at_ms: v["created_at_ms"].as_u64(),
        connection: Connection {
            username: None,
            port: None,
            host_keys: vec![],
        },
    })
}

/// Your cloud: its error responses as the contract's errors. The sim says
/// what went wrong in `error.code`; the rest goes by the status.
fn api_error(resp: &Response) -> Error {
    let body: Value = resp.json().unwrap_or(Value::Null);
    let code = body["error"]["code"].as_str().unwrap_or_default();
    let message = format!("{} answered {}: {}", "{{name}}", resp.status, body["error"]["message"]);
    match (resp.status, code) {
        (429, _) => match body["retry_after_ms"].as_u64() {
            Some(ms) => error::rate_limited(ms, message),
            None => error::from_status(429, resp.header("retry-after"), message),
        },
        (403, "quota_exceeded") => error::quota_exceeded(message),
        (503, "insufficient_capacity") => match body["instance_type"].as_str() {
            Some(t) => error::capacity_for_type(t, message),
            None => error::capacity_general(message),
        },
        (status, _) => error::from_status(status, resp.header("retry-after"), message),
    }
}

berth_sdk::export_driver!(Cloud);
