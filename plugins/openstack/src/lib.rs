//! The berth driver for OpenStack, over the Compute API (Nova) v2.1.
//!
//! The driver holds no credentials: the host exchanges the provider's
//! `keystone` credential for a token and puts it on every request to the
//! credential's host; the driver reads the compute endpoint from the
//! catalog that exchange returned (`auth-info`). A server carries berth's
//! tags as its metadata from its create on, and its name is the node id.
//! Nova has no idempotency key, so the driver keeps a durable record of
//! each node's create (`records`): the first try posts, a try sent again
//! looks for the server the first one made (waiting out a lagging list)
//! before it makes another. Only servers whose metadata carries this
//! pool's `berth-pool` are listed, tagged or deleted.

#![forbid(unsafe_code)]

mod catalog;
mod config;
mod env;
mod errors;
mod records;
mod server;
mod userdata;

use std::collections::BTreeMap;

use berth_sdk::http::{Response, encode_component};
use berth_sdk::tags::{self, NODE_TAG, POOL_TAG};
use berth_sdk::types::{
    AccountLimits, Capabilities, CreateSpec, DriverInfo, Error, Instance, InstanceState, Page,
};
use berth_sdk::{Driver, error, pages};
use serde_json::{Map, Value, json};

use config::{Config, Endpoint, LabelOptions};
use env::Sandbox;
use env::{Env, Method, Outgoing};
use errors::Call;
use records::{CreateRecord, ServerRecord};
use server::Server;

/// The microversion every request asks for: `networks` is required (2.37)
/// and an unknown status filter is refused (2.38); a server's `flavor` is
/// still its id and links (2.47 made it the flavor's description), so the
/// instance type berth reads back is the flavor id it asked for. Nova has
/// taken it since Newton (2016).
pub(crate) const MICROVERSION: &str = "2.38";
/// The metadata key a server's create token is kept under. Not a
/// `berth-` key: set-tags replaces those and berth compares them with its
/// own, while this one is the driver's.
pub(crate) const TOKEN_KEY: &str = "create-token";
/// A `get` of at most this many ids looks each one up; of more, one list
/// filtered by their names first.
const LOOKUPS_AT_MOST: usize = 2;
/// What berth takes back of a tag that is not its own (docs/tags.md): a
/// server's other metadata is passed on only within these.
const MAX_TAGS: usize = 64;
const MAX_TAG_KEY: usize = 128;
const MAX_TAG_VALUE: usize = 512;

/// The configured driver.
pub(crate) struct OpenStack<E: Env = Sandbox> {
    pool_id: String,
    config: Config,
    /// The compute endpoint, once found. Only saves a catalog lookup:
    /// another instance of the driver finds it again.
    endpoint: Option<String>,
    env: E,
}

/// The instance of `server` as berth may take it: berth's own tags all,
/// the server's other metadata as far as berth takes tags.
fn for_berth(mut s: Server) -> Instance {
    let (mut keep, others): (Vec<_>, Vec<_>) = std::mem::take(&mut s.instance.tags)
        .into_iter()
        .partition(|(k, _)| tags::is_berth_tag(k));
    for (k, v) in others {
        if keep.len() < MAX_TAGS
            && k.len() <= MAX_TAG_KEY
            && v.len() <= MAX_TAG_VALUE
            && !k.chars().chain(v.chars()).any(char::is_control)
        {
            keep.push((k, v));
        }
    }
    s.instance.tags = keep;
    s.instance
}

/// The `marker` of a `next` link, percent-decoded.
fn marker_of(href: &str) -> Option<String> {
    let query = href.split_once('?')?.1;
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == "marker").then(|| percent_decode(v))
    })
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// An answer's JSON body, or a transient error naming what it was for.
fn json_of(resp: &Response, what: &str) -> Result<Value, Error> {
    serde_json::from_slice(&resp.body).map_err(|e| {
        error::transient(format!(
            "Nova's answer to {what} ({}) is not JSON: {e}",
            resp.status
        ))
    })
}

impl<E: Env> OpenStack<E> {
    fn new(pool_id: &str, config: &str, env: E) -> Result<Self, Error> {
        let mut config = config::parse_config(config);
        if pool_id.is_empty() {
            let problem = "pool id: must not be empty".to_owned();
            config = Err(match config {
                Ok(_) => problem,
                Err(m) => format!("{m}; {problem}"),
            });
        }
        let config = config.map_err(error::invalid_config)?;
        let endpoint = match &config.endpoint {
            Endpoint::Fixed(url) => Some(url.clone()),
            Endpoint::Catalog { .. } => None,
        };
        Ok(OpenStack {
            pool_id: pool_id.to_owned(),
            config,
            endpoint,
            env,
        })
    }

    /// The compute endpoint: the config's, or the catalog's.
    fn endpoint(&mut self) -> Result<String, Error> {
        if let Some(url) = &self.endpoint {
            return Ok(url.clone());
        }
        let Endpoint::Catalog {
            host,
            interface,
            region,
        } = &self.config.endpoint
        else {
            return Err(error::invalid_config("compute-endpoint: not set"));
        };
        let Some(info) = self.env.auth_info(host)? else {
            return Err(error::invalid_config(format!(
                "credential-host: the provider has no keystone credential for host {host:?} \
                 (a [[providers.NAME.credentials]] table with kind = \"keystone\" and that host)"
            )));
        };
        let url = catalog::compute_endpoint(&info, interface, region.as_deref())
            .map_err(|e| error::invalid_config(format!("credential-host {host}: {e}")))?;
        let parsed = berth_sdk::http::Url::parse(&url)
            .map_err(|e| error::invalid_config(format!("the catalog's compute endpoint: {e}")))?;
        if !catalog::covered(host, parsed.authority()) {
            return Err(error::invalid_config(format!(
                "the catalog's compute endpoint {url} is not on {host}, the credential's host, \
                 so its requests would carry no token: set credential-host (and the \
                 credential's host) to {}, or compute-endpoint",
                parsed.authority()
            )));
        }
        self.endpoint = Some(url.clone());
        Ok(url)
    }

    /// Sends one request to the compute API; `path` starts with `/`.
    fn send(
        &mut self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Response, Error> {
        let url = format!("{}{path}", self.endpoint()?);
        let mut headers = vec![
            ("accept".to_owned(), "application/json".to_owned()),
            (
                "openstack-api-version".to_owned(),
                format!("compute {MICROVERSION}"),
            ),
        ];
        let body = body.map(|b| {
            headers.push(("content-type".to_owned(), "application/json".to_owned()));
            b.to_string().into_bytes()
        });
        let request = Outgoing {
            method,
            url,
            headers,
            body,
        };
        Ok(self.env.send(&request)?)
    }

    fn owned(&self, s: &Server) -> bool {
        s.metadata(POOL_TAG) == Some(self.pool_id.as_str())
    }

    /// The pool tag plus `filter`, with this pool's id.
    fn pool_filter(&self, filter: &[(String, String)]) -> Vec<(String, String)> {
        tags::with_pool(filter, &self.pool_id)
    }

    /// Server `id` (`GET /servers/{id}`, which Nova answers from its
    /// database, lists' lag or not); `None` when Nova does not know it.
    fn server(&mut self, id: &str) -> Result<Option<Server>, Error> {
        let resp = self.send(
            Method::Get,
            &format!("/servers/{}", encode_component(id)),
            None,
        )?;
        match resp.status {
            200 => {
                let v = json_of(&resp, "a server lookup")?;
                let s = server::read(&v["server"]).map_err(error::transient)?;
                if s.instance.id != id {
                    return Err(error::transient(format!(
                        "Nova answered a lookup of {id} with server {}",
                        s.instance.id
                    )));
                }
                Ok(Some(s))
            }
            404 => Ok(None),
            _ => Err(errors::from_response(&resp, Call::Server, None)),
        }
    }

    /// One page of `servers/detail` for `query`: its servers, and the
    /// marker of the next page if Nova says there is one.
    fn page(&mut self, query: &str, call: Call) -> Result<(Vec<Server>, Option<String>), Error> {
        let resp = self.send(Method::Get, &format!("/servers/detail?{query}"), None)?;
        if resp.status != 200 {
            return Err(errors::from_response(&resp, call, None));
        }
        let v = json_of(&resp, "a list of servers")?;
        let Some(items) = v.get("servers").and_then(Value::as_array) else {
            return Err(error::transient(
                "Nova's list of servers has no \"servers\"",
            ));
        };
        let servers = items
            .iter()
            .map(server::read)
            .collect::<Result<Vec<_>, _>>()
            .map_err(error::transient)?;
        let next = (v.get("servers_links").and_then(Value::as_array))
            .into_iter()
            .flatten()
            .find(|l| l.get("rel").and_then(Value::as_str) == Some("next"))
            .and_then(|l| l.get("href").and_then(Value::as_str))
            .map(|href| marker_of(href).or_else(|| servers.last().map(|s| s.instance.id.clone())));
        let next = match next {
            // A next page after an empty one would never end.
            Some(Some(marker)) if !servers.is_empty() => Some(marker),
            _ => None,
        };
        Ok((servers, next))
    }

    /// The pool's servers named `name` made for `node`, not being deleted,
    /// the oldest first, from one filtered list (which may lag).
    fn find(&mut self, name: &str, node: &str) -> Result<Option<Server>, Error> {
        let query = format!(
            "name={}&limit=1000",
            encode_component(&server::names_pattern(&[name]))
        );
        let (servers, _) = self.page(&query, Call::List { cursor: false })?;
        let mut found: Vec<Server> = servers
            .into_iter()
            .filter(|s| self.owned(s) && s.metadata(NODE_TAG) == Some(node) && !s.deleting)
            .collect();
        found.sort_by(|a, b| {
            (a.instance.created_at_ms, &a.instance.id)
                .cmp(&(b.instance.created_at_ms, &b.instance.id))
        });
        Ok(found.into_iter().next())
    }

    /// The `POST /servers` body for `spec`.
    fn create_body(
        &self,
        spec: &CreateSpec,
        options: &LabelOptions,
        name: &str,
        metadata: &[(String, String)],
        user_data: Option<String>,
    ) -> Value {
        let networks = options.networks.as_ref().unwrap_or(&self.config.networks);
        let networks = if networks.is_empty() {
            json!("auto")
        } else {
            Value::Array(networks.iter().map(|n| json!({"uuid": n})).collect())
        };
        let metadata: Map<String, Value> = metadata
            .iter()
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect();
        let mut server = json!({
            "name": name,
            "flavorRef": spec.instance_type,
            "imageRef": spec.image,
            "networks": networks,
            "metadata": metadata,
        });
        if let Some(u) = user_data {
            server["user_data"] = json!(u);
        }
        if let Some(k) = &options.key_name {
            server["key_name"] = json!(k);
        }
        if !options.security_groups.is_empty() {
            server["security_groups"] = options
                .security_groups
                .iter()
                .map(|g| json!({"name": g}))
                .collect();
        }
        if let Some(z) = &options.availability_zone {
            server["availability_zone"] = json!(z);
        }
        if let Some(c) = options.config_drive {
            server["config_drive"] = json!(c);
        }
        json!({ "server": server })
    }

    /// Writes `record` over `expected` at `key`; a failure is only logged:
    /// the record saves calls, and a lookup stands in for it.
    fn note(&self, key: &str, expected: Option<&str>, record: Option<&str>) {
        match self.env.compare_and_swap(key, expected, record) {
            Ok(true) => {}
            Ok(false) => self.env.warn(
                "a driver record changed under this call; left as it is",
                &[("key", key)],
            ),
            Err(e) => self.env.warn(
                "could not write a driver record",
                &[("key", key), ("error", &format!("{e:?}"))],
            ),
        }
    }

    /// Sends the create and records what it made. `record` is what `key`
    /// holds now.
    fn post(
        &mut self,
        key: &str,
        record: &CreateRecord,
        body: &Value,
        spec: &CreateSpec,
        metadata: Vec<(String, String)>,
    ) -> Result<Instance, Error> {
        let held = record.encode();
        // No answer: the server may exist. The record stays, and a create
        // sent again looks for it first.
        let resp = self.send(Method::Post, "/servers", Some(body))?;
        if resp.status != 202 {
            let e = errors::from_response(&resp, Call::Create, Some(&spec.instance_type));
            // A 4xx is Nova (or what is in front of it) refusing the
            // create: nothing was made, and the next try need not look.
            if (400..500).contains(&resp.status) && resp.status != 408 {
                self.note(key, Some(&held), None);
            }
            return Err(e);
        }
        let id = json_of(&resp, "a create")
            .ok()
            .and_then(|v| v["server"]["id"].as_str().map(str::to_owned))
            .filter(|id| !id.trim().is_empty());
        let Some(id) = id else {
            return Err(error::transient(format!(
                "Nova accepted the create but named no server: {}",
                resp.text().chars().take(200).collect::<String>()
            )));
        };
        let made = CreateRecord {
            server: Some(id.clone()),
            ..record.clone()
        };
        self.note(key, Some(&held), Some(&made.encode()));
        let noted = ServerRecord {
            node: spec.node_id.clone(),
            name: record.name.clone(),
            at_ms: self.env.now_ms(),
        };
        self.note(&records::server_key(&id), None, Some(&noted.encode()));
        Ok(Instance {
            id,
            state: InstanceState::Pending,
            instance_type: spec.instance_type.clone(),
            tags: metadata,
            addresses: berth_sdk::types::Addresses {
                public_ipv4: None,
                private_ipv4: None,
                ipv6: None,
                hostname: None,
            },
            created_at_ms: None,
            connection: berth_sdk::types::Connection {
                username: None,
                port: None,
                host_keys: vec![],
            },
        })
    }

    /// A create for a node whose create was sent before: the server an
    /// earlier try made, if there is one; else a new one.
    fn recreate(
        &mut self,
        key: &str,
        fresh: CreateRecord,
        body: &Value,
        spec: &CreateSpec,
        metadata: Vec<(String, String)>,
    ) -> Result<Instance, Error> {
        let Some(text) = self.env.get(key)? else {
            // Removed meanwhile (Nova refused that try, or its server was
            // deleted): this try is the first again.
            if self
                .env
                .compare_and_swap(key, None, Some(&fresh.encode()))?
            {
                return self.post(key, &fresh, body, spec, metadata);
            }
            return Err(error::transient(
                "another try of this node's create is under way; try again",
            ));
        };
        let earlier = CreateRecord::decode(&text);
        let name = earlier
            .as_ref()
            .map_or(fresh.name.as_str(), |r| r.name.as_str())
            .to_owned();
        match earlier.as_ref().and_then(|r| r.server.clone()) {
            Some(id) => {
                // Nova answered that try: its server, unless it is gone.
                if let Some(s) = self.server(&id)?
                    && self.owned(&s)
                    && !s.deleting
                {
                    return Ok(for_berth(s));
                }
            }
            None => {
                // That try's answer was lost: it may have made a server,
                // which a list may not show yet.
                if let Some(s) = self.found(&name, spec)? {
                    return Ok(s);
                }
                let lag = self.config.list_lag.as_millis() as u64;
                let visible = earlier.as_ref().map_or(0, |r| r.at_ms).saturating_add(lag);
                let now = self.env.now_ms();
                if now < visible {
                    self.env.sleep_ms(visible - now);
                    if let Some(s) = self.found(&name, spec)? {
                        return Ok(s);
                    }
                }
            }
        }
        // Nothing an earlier try made is there: make it now.
        let fresh = CreateRecord {
            at_ms: self.env.now_ms(),
            ..fresh
        };
        if !self
            .env
            .compare_and_swap(key, Some(&text), Some(&fresh.encode()))?
        {
            return Err(error::transient(
                "another try of this node's create is under way; try again",
            ));
        }
        self.post(key, &fresh, body, spec, metadata)
    }

    /// The server an earlier try made for `spec`'s node, found by name, and
    /// its records brought up to date.
    fn found(&mut self, name: &str, spec: &CreateSpec) -> Result<Option<Instance>, Error> {
        let Some(s) = self.find(name, &spec.node_id)? else {
            return Ok(None);
        };
        let key = records::create_key(&spec.node_id);
        if let Ok(Some(text)) = self.env.get(&key)
            && let Some(r) = CreateRecord::decode(&text)
        {
            let made = CreateRecord {
                server: Some(s.instance.id.clone()),
                ..r
            };
            self.note(&key, Some(&text), Some(&made.encode()));
        }
        let noted = ServerRecord {
            node: spec.node_id.clone(),
            name: name.to_owned(),
            at_ms: self.env.now_ms(),
        };
        let server_key = records::server_key(&s.instance.id);
        if matches!(self.env.get(&server_key), Ok(None)) {
            self.note(&server_key, None, Some(&noted.encode()));
        }
        Ok(Some(for_berth(s)))
    }

    /// Forgets the records of server `id` (of `node`, if known), deleted.
    fn forget(&self, id: &str, node: Option<&str>) {
        let key = records::server_key(id);
        if let Ok(Some(text)) = self.env.get(&key) {
            let _ = self.env.compare_and_swap(&key, Some(&text), None);
        }
        if let Some(node) = node {
            let key = records::create_key(node);
            if let Ok(Some(text)) = self.env.get(&key)
                && CreateRecord::decode(&text)
                    .and_then(|r| r.server)
                    .as_deref()
                    == Some(id)
            {
                let _ = self.env.compare_and_swap(&key, Some(&text), None);
            }
        }
    }

    /// Drops records older than [`records::KEEP_MS`]. Best effort.
    fn prune(&self) {
        let now = self.env.now_ms();
        for prefix in [records::CREATE_PREFIX, records::SERVER_PREFIX] {
            let Ok(all) = self.env.scan(prefix) else {
                return;
            };
            for (key, text) in all {
                let old = records::written_at(&text)
                    .is_none_or(|at| at.saturating_add(records::KEEP_MS) < now);
                if old {
                    let _ = self.env.compare_and_swap(&key, Some(&text), None);
                }
            }
        }
    }

    fn do_create(&mut self, spec: CreateSpec) -> Result<Instance, Error> {
        let options = config::parse_label_options(&spec.options).map_err(error::invalid_config)?;
        if spec.image.trim().is_empty() {
            return Err(error::invalid_config("image: must name a Glance image id"));
        }
        if spec.instance_type.trim().is_empty() {
            return Err(error::invalid_config(
                "instance type: must name a flavor id",
            ));
        }
        if spec.token.is_empty() {
            return Err(error::permanent("create token: empty"));
        }
        let name = if server::valid_name(&spec.node_id) {
            spec.node_id.clone()
        } else {
            format!("berth-{}", spec.token)
        };
        // The pool tag is this pool's, whatever the spec says; the token
        // beside berth's tags.
        let mut metadata: Vec<(String, String)> = spec
            .tags
            .iter()
            .filter(|(k, _)| k != POOL_TAG && k != TOKEN_KEY)
            .cloned()
            .collect();
        metadata.push((POOL_TAG.to_owned(), self.pool_id.clone()));
        metadata.push((TOKEN_KEY.to_owned(), spec.token.clone()));
        let unique: BTreeMap<&str, &str> = metadata
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        if unique.len() != metadata.len() {
            return Err(error::permanent(
                "the create's tags name a key twice; Nova keeps one value per key",
            ));
        }
        server::check_metadata(&metadata).map_err(error::permanent)?;
        let user_data =
            userdata::compose(spec.user_data.as_deref(), spec.ssh_public_key.as_deref())
                .map_err(error::permanent)?
                .map(|text| userdata::base64(text.as_bytes()));
        let body = self.create_body(&spec, &options, &name, &metadata, user_data);
        let key = records::create_key(&spec.node_id);
        let record = CreateRecord {
            token: spec.token.clone(),
            name,
            at_ms: self.env.now_ms(),
            server: None,
        };
        // The first try for this node posts; any other looks first.
        if self
            .env
            .compare_and_swap(&key, None, Some(&record.encode()))?
        {
            return self.post(&key, &record, &body, &spec, metadata);
        }
        self.recreate(&key, record, &body, &spec, metadata)
    }

    fn do_get(&mut self, ids: &[String]) -> Result<Vec<Instance>, Error> {
        let mut asked: Vec<&str> = ids.iter().map(String::as_str).collect();
        asked.sort_unstable();
        asked.dedup();
        let mut found: Vec<Server> = Vec::new();
        if asked.len() > LOOKUPS_AT_MOST {
            // The servers this provider made, by the names its records
            // keep: one list for them all. A list may lag, so an id it
            // leaves out is still looked up.
            let mut names: Vec<String> = asked
                .iter()
                .filter_map(|id| self.env.get(&records::server_key(id)).ok().flatten())
                .filter_map(|text| ServerRecord::decode(&text))
                .map(|r| r.name)
                .collect();
            names.sort();
            names.dedup();
            if !names.is_empty() {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                let query = format!(
                    "name={}&limit=1000",
                    encode_component(&server::names_pattern(&names))
                );
                let (servers, _) = self.page(&query, Call::List { cursor: false })?;
                found.extend(
                    servers
                        .into_iter()
                        .filter(|s| asked.contains(&s.instance.id.as_str())),
                );
            }
        }
        let seen: Vec<String> = found.iter().map(|s| s.instance.id.clone()).collect();
        for id in asked {
            if !seen.iter().any(|s| s == id)
                && let Some(s) = self.server(id)?
            {
                found.push(s);
            }
        }
        let instances = found.into_iter().map(for_berth);
        Ok(pages::only_ids(instances, ids, &self.pool_id))
    }

    fn do_list(
        &mut self,
        filter: &[(String, String)],
        cursor: Option<&str>,
    ) -> Result<Page, Error> {
        // A filter naming another pool matches nothing this driver may see.
        if tags::names_other_pool(filter, &self.pool_id) {
            return Ok(Page {
                instances: vec![],
                next: None,
            });
        }
        if cursor.is_none() {
            self.prune();
        }
        let wanted = self.pool_filter(filter);
        let mut query = format!("limit={}", self.config.page_size);
        if let Some(marker) = cursor {
            query.push_str(&format!("&marker={}", encode_component(marker)));
        }
        let (servers, next) = self.page(
            &query,
            Call::List {
                cursor: cursor.is_some(),
            },
        )?;
        if next.is_some() && next.as_deref() == cursor {
            return Err(error::transient(format!(
                "Nova repeated the marker {cursor:?} as the next page's"
            )));
        }
        // Nova cannot filter by metadata: keep the pool's servers, each once.
        let mut seen = std::collections::HashSet::new();
        let instances = servers
            .into_iter()
            .map(for_berth)
            .filter(|i| tags::has_all(&i.tags, &wanted) && seen.insert(i.id.clone()))
            .collect();
        Ok(Page { instances, next })
    }

    fn do_delete(&mut self, id: &str) -> Result<(), Error> {
        let noted = (self.env.get(&records::server_key(id)).ok().flatten())
            .and_then(|text| ServerRecord::decode(&text));
        // A server this provider made is the pool's; any other is looked at
        // first and left alone unless it carries the pool's tag.
        let node = match noted {
            Some(r) => Some(r.node),
            None => match self.server(id)? {
                None => return Err(error::not_found(format!("server {id} is gone"))),
                Some(s) if !self.owned(&s) => {
                    return Err(error::not_found(format!(
                        "server {id} does not carry {POOL_TAG}={}; left alone",
                        self.pool_id
                    )));
                }
                Some(s) if s.deleting => {
                    return Err(error::not_found(format!(
                        "server {id} is being deleted already"
                    )));
                }
                Some(s) => s.metadata(NODE_TAG).map(str::to_owned),
            },
        };
        let resp = self.send(
            Method::Delete,
            &format!("/servers/{}", encode_component(id)),
            None,
        )?;
        match resp.status {
            200..=204 => {
                self.forget(id, node.as_deref());
                Ok(())
            }
            404 => {
                self.forget(id, node.as_deref());
                Err(errors::from_response(&resp, Call::Delete, None))
            }
            _ => Err(errors::from_response(&resp, Call::Delete, None)),
        }
    }

    fn do_set_tags(&mut self, id: &str, new: &[(String, String)]) -> Result<(), Error> {
        if tags::names_other_pool(new, &self.pool_id) {
            return Err(error::permanent(
                "set-tags cannot move a server to another pool",
            ));
        }
        let s = match self.server(id)? {
            None => return Err(error::not_found(format!("server {id} is gone"))),
            Some(s) if !self.owned(&s) => {
                return Err(error::not_found(format!(
                    "server {id} does not carry {POOL_TAG}={}; left alone",
                    self.pool_id
                )));
            }
            Some(s) => s,
        };
        // Nova answers 409 to a metadata change until the server is built:
        // wait for it a while, looking at growing gaps; past `build-wait`,
        // berth tries again later.
        let budget = self.config.build_wait.as_millis() as u64;
        let (mut waited, mut gap) = (0, 250);
        let mut s = s;
        while s.building && !s.deleting {
            if waited >= budget {
                return Err(error::transient(format!(
                    "server {id} is still building after {waited} ms, and Nova changes no \
                     metadata until it is built"
                )));
            }
            let step = gap.min(budget - waited);
            self.env.sleep_ms(step);
            waited += step;
            gap *= 2;
            s = match self.server(id)? {
                Some(s) => s,
                None => return Err(error::not_found(format!("server {id} is gone"))),
            };
        }
        if s.deleting {
            return Err(error::not_found(format!("server {id} is being deleted")));
        }
        if let InstanceState::Failed(why) = &s.instance.state {
            return Err(error::permanent(format!(
                "server {id} is in ERROR ({why}); Nova changes no metadata of it"
            )));
        }
        // The pool tag always stays, whatever `new` says.
        let wanted = self.pool_filter(new);
        let result = tags::replace_berth_tags(&s.instance.tags, &wanted);
        let before: BTreeMap<&str, &str> = (s.instance.tags.iter())
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let after: BTreeMap<&str, &str> = result
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        if before == after {
            return Ok(());
        }
        let items: Vec<(String, String)> = after
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        server::check_metadata(&items).map_err(error::permanent)?;
        // One write of the whole metadata: berth's tags replaced, the
        // server's other metadata as it was read.
        let body = json!({ "metadata": after });
        let resp = self.send(
            Method::Put,
            &format!("/servers/{}/metadata", encode_component(id)),
            Some(&body),
        )?;
        match resp.status {
            200 => Ok(()),
            _ => Err(errors::from_response(&resp, Call::SetTags, None)),
        }
    }

    fn do_limits(&mut self) -> Result<AccountLimits, Error> {
        let resp = self.send(Method::Get, "/limits", None)?;
        if resp.status != 200 {
            return Err(errors::from_response(&resp, Call::Limits, None));
        }
        let v = json_of(&resp, "the limits")?;
        let absolute = &v["limits"]["absolute"];
        if !absolute.is_object() {
            return Err(error::transient("Nova's limits have no \"absolute\""));
        }
        // -1 is unlimited; what is not there is unknown.
        let n = |k: &str| absolute.get(k).and_then(Value::as_i64).filter(|n| *n >= 0);
        let n32 = |k: &str| n(k).and_then(|n| u32::try_from(n).ok());
        let n64 = |k: &str| n(k).and_then(|n| u64::try_from(n).ok());
        Ok(AccountLimits {
            max_instances: n32("maxTotalInstances"),
            max_cores: n32("maxTotalCores"),
            max_ram_mib: n64("maxTotalRAMSize"),
            used_instances: n32("totalInstancesUsed"),
            used_cores: n32("totalCoresUsed"),
            used_ram_mib: n64("totalRAMUsed"),
        })
    }
}

impl Driver for OpenStack<Sandbox> {
    fn describe() -> DriverInfo {
        DriverInfo {
            name: "openstack".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Servers on OpenStack, over the Compute API (Nova) v2.1. The host \
                          exchanges the provider's keystone credential for a token and adds it \
                          to each request; the driver finds Nova in the token's catalog and \
                          holds no secret. The instance type is a flavor id, the image a Glance \
                          image id; berth's tags are the server's metadata, its name the node \
                          id."
            .into(),
            config: config::config_fields(),
            label_options: config::label_option_fields(),
            capabilities: Capabilities::IDEMPOTENT_CREATE
                | Capabilities::USER_DATA
                | Capabilities::SSH_KEYS
                | Capabilities::ACCOUNT_LIMITS,
        }
    }

    fn configure(pool_id: &str, config: &str) -> Result<Self, Error> {
        OpenStack::new(pool_id, config, Sandbox)
    }

    fn create(&mut self, spec: CreateSpec) -> Result<Instance, Error> {
        self.do_create(spec)
    }

    fn get(&mut self, ids: &[String]) -> Result<Vec<Instance>, Error> {
        self.do_get(ids)
    }

    fn list(&mut self, filter: &[(String, String)], cursor: Option<&str>) -> Result<Page, Error> {
        self.do_list(filter, cursor)
    }

    fn delete(&mut self, instance_id: &str) -> Result<(), Error> {
        self.do_delete(instance_id)
    }

    fn set_tags(&mut self, instance_id: &str, tags: &[(String, String)]) -> Result<(), Error> {
        self.do_set_tags(instance_id, tags)
    }

    fn limits(&mut self) -> Result<AccountLimits, Error> {
        self.do_limits()
    }
}

berth_sdk::export_driver!(OpenStack<Sandbox>);

#[cfg(test)]
mod tests;
