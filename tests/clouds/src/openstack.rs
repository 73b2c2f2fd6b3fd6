//! A fake OpenStack Compute (Nova) API v2.1, written from the public
//! Compute API reference (servers, server metadata, limits) and its API
//! guide (faults, paginated collections, microversions); what it follows
//! and what it leaves out is in `tests/clouds/openstack.md`.
//!
//! It serves `/v2.1/…` on 127.0.0.1:0 until dropped. Every request needs a
//! live `X-Auth-Token` (checked through a [`TokenCheck`]), as Nova behind
//! Keystone's auth middleware does. Servers are built and deleted
//! asynchronously: a server is `BUILD` for the boot time, then `ACTIVE` (or
//! `ERROR` with a `fault`, when a test asks), and a deleted one is listed
//! with `task_state` `deleting` for the delete time before it is gone. The
//! cloud keeps its own record of every server it ever made
//! ([`Nova::machines`]), and counts calls by operation ([`Knobs`]):
//! `servers.list`, `servers.detail`, `servers.create`, `servers.get`,
//! `servers.delete`, `metadata.list`, `metadata.replace`,
//! `metadata.update`, `metadata.get-item`, `metadata.set-item`,
//! `metadata.delete-item`, `limits.get`.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use http_body_util::BodyExt as _;
use serde_json::{Map, Value, json};

use crate::common::{Answer, Knobs, Machine, Served, TokenCheck, lock};

/// What Keystone's auth middleware answers a request without a live token.
pub const UNAUTHORIZED: &str = "The request you have made requires authentication.";
/// The fault message of a build the scheduler found no host for.
pub const NO_VALID_HOST: &str = "No valid host was found. There are not enough hosts available.";
/// The image every default cloud knows.
pub const IMAGE_ID: &str = "70a599e0-31e7-49b7-b260-868f441e862b";
/// The network every default cloud has.
pub const NETWORK_ID: &str = "3cb9bc59-5699-4588-a4b1-b87f96708bc6";
/// The project the cloud's servers belong to.
pub const PROJECT_ID: &str = "6f70656e737461636b20342065766572";
/// The user that creates them.
pub const USER_ID: &str = "fake-user-0001";
/// The lowest and the highest microversion the cloud takes.
pub const MIN_VERSION: (u32, u32) = (2, 1);
pub const MAX_VERSION: (u32, u32) = (2, 104);
/// Nova's limit on a request body (oslo's `max_request_body_size`).
const MAX_BODY: usize = 114_688;
/// `user_data` is at most this long, base64-encoded.
pub const MAX_USER_DATA: usize = 65_535;
/// The pattern a metadata key must match.
const METADATA_KEY_CHARS: &str = "a-zA-Z0-9-_:. ";

/// A flavor: `flavorRef` names it by its id.
#[derive(Clone, Debug)]
pub struct Flavor {
    pub id: String,
    pub name: String,
    pub vcpus: u32,
    pub ram_mib: u64,
    pub disk_gib: u32,
}

impl Flavor {
    pub fn new(id: &str, name: &str, vcpus: u32, ram_mib: u64, disk_gib: u32) -> Flavor {
        Flavor {
            id: id.into(),
            name: name.into(),
            vcpus,
            ram_mib,
            disk_gib,
        }
    }
}

/// A network servers may join.
#[derive(Clone, Debug)]
pub struct Network {
    pub id: String,
    /// The key of `addresses` in a server.
    pub name: String,
}

/// The project's quota; `-1` is unlimited.
#[derive(Clone, Copy, Debug)]
pub struct Quota {
    pub instances: i64,
    pub cores: i64,
    pub ram_mib: i64,
    /// `metadata_items`, also the `maxServerMeta` absolute limit.
    pub metadata_items: i64,
}

impl Default for Quota {
    /// Nova's default quota.
    fn default() -> Quota {
        Quota {
            instances: 10,
            cores: 20,
            ram_mib: 51_200,
            metadata_items: 128,
        }
    }
}

/// How a cloud starts.
#[derive(Clone, Debug)]
pub struct NovaConfig {
    pub flavors: Vec<Flavor>,
    /// Image ids.
    pub images: Vec<String>,
    pub networks: Vec<Network>,
    /// Key pair names `key_name` may give.
    pub keypairs: Vec<String>,
    /// Security group names.
    pub security_groups: Vec<String>,
    /// Availability zone names.
    pub zones: Vec<String>,
    /// How long a server is `BUILD`.
    pub boot_time: Duration,
    /// How long a deleted server is listed with `task_state` `deleting`.
    pub delete_time: Duration,
    /// `[api] max_limit` (`osapi_max_limit`): the most items one page holds.
    pub max_limit: usize,
    pub quota: Quota,
}

impl Default for NovaConfig {
    fn default() -> NovaConfig {
        NovaConfig {
            flavors: vec![
                Flavor::new("1", "m1.tiny", 1, 512, 1),
                Flavor::new("2", "m1.small", 1, 2048, 20),
                Flavor::new("3", "m1.medium", 2, 4096, 40),
            ],
            images: vec![IMAGE_ID.into()],
            networks: vec![Network {
                id: NETWORK_ID.into(),
                name: "private".into(),
            }],
            keypairs: Vec::new(),
            security_groups: vec!["default".into()],
            zones: vec!["nova".into()],
            boot_time: Duration::from_millis(200),
            delete_time: Duration::from_millis(100),
            max_limit: 1000,
            quota: Quota::default(),
        }
    }
}

/// An asynchronous fault a build ends in.
#[derive(Clone, Debug)]
pub struct BuildFault {
    pub code: u16,
    pub message: String,
}

impl BuildFault {
    /// The scheduler found no host.
    pub fn no_valid_host() -> BuildFault {
        BuildFault {
            code: 500,
            message: NO_VALID_HOST.into(),
        }
    }
}

/// Nova's answer to a rate-limited request: `overLimit` with `retryAfter`,
/// and the `Retry-After` header, for [`Knobs::inject`].
pub fn over_limit(status: u16, retry_after_secs: u64) -> Answer {
    let after = retry_after_secs.to_string();
    Answer::json(
        status,
        &json!({"overLimit": {
            "code": status,
            "message": "This request was rate-limited.",
            "retryAfter": after,
        }}),
    )
    .with_header("retry-after", after)
}

/// Nova's fault body for `status` (`badRequest`, `itemNotFound`, …).
pub fn fault(status: u16, message: &str) -> Answer {
    let name = match status {
        400 => "badRequest",
        401 => "unauthorized",
        403 => "forbidden",
        404 => "itemNotFound",
        405 => "badMethod",
        406 => "notAcceptable",
        409 => "conflictingRequest",
        413 | 429 => "overLimit",
        415 => "badMediaType",
        501 => "notImplemented",
        503 => "serviceUnavailable",
        _ => "computeFault",
    };
    Answer::json(
        status,
        &json!({ name: {"code": status, "message": message} }),
    )
}

/// Keystone's auth middleware's answer to a missing or dead token.
fn unauthorized(url: &str) -> Answer {
    Answer::json(
        401,
        &json!({"error": {"code": 401, "title": "Unauthorized", "message": UNAUTHORIZED}}),
    )
    .with_header("www-authenticate", format!("Keystone uri=\"{url}\""))
}

/// A fake Nova serving on 127.0.0.1:0 until dropped.
pub struct Nova {
    served: Served,
    shared: Arc<Shared>,
}

struct Shared {
    knobs: Knobs,
    tokens: TokenCheck,
    /// Every request that named an operation, as `METHOD /path?query`.
    requests: Mutex<Vec<String>>,
    cloud: Mutex<Cloud>,
    /// `http://ADDR`, for links.
    base: Mutex<String>,
}

struct Cloud {
    config: NovaConfig,
    /// Every server ever made, in the order made.
    servers: Vec<Server>,
    /// Faults the next builds end in, one each.
    fail_next: VecDeque<BuildFault>,
    rate: Option<RateLimit>,
    /// Addresses handed out so far.
    addresses: u32,
}

struct RateLimit {
    per_second: u32,
    status: u16,
    window: Instant,
    count: u32,
}

struct Server {
    id: String,
    name: String,
    flavor: Flavor,
    image: String,
    metadata: BTreeMap<String, String>,
    key_name: Option<String>,
    user_data: Option<String>,
    /// (network name, address)
    addresses: Vec<(String, String)>,
    security_groups: Vec<String>,
    zone: String,
    created: Instant,
    created_wall: SystemTime,
    updated_wall: SystemTime,
    boot: Duration,
    fault: Option<BuildFault>,
    /// When its delete was asked, and how long the delete takes.
    deleting: Option<(Instant, SystemTime, Duration)>,
}

/// A server's state at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Building,
    Active,
    Error,
    Gone,
}

impl Server {
    fn phase(&self, now: Instant) -> Phase {
        if let Some((at, _, took)) = self.deleting
            && now >= at + took
        {
            return Phase::Gone;
        }
        if now < self.created + self.boot {
            Phase::Building
        } else if self.fault.is_some() {
            Phase::Error
        } else {
            Phase::Active
        }
    }

    fn vm_state(&self, now: Instant) -> &'static str {
        match self.phase(now) {
            Phase::Building => "building",
            Phase::Active => "active",
            Phase::Error => "error",
            Phase::Gone => "deleted",
        }
    }

    fn task_state(&self, now: Instant) -> Option<&'static str> {
        match self.phase(now) {
            Phase::Gone => None,
            _ if self.deleting.is_some() => Some("deleting"),
            Phase::Building if now < self.created + self.boot / 2 => Some("scheduling"),
            Phase::Building => Some("spawning"),
            _ => None,
        }
    }

    /// The API's status word: the vm state's, whatever the task.
    fn status(&self, now: Instant) -> &'static str {
        match self.phase(now) {
            Phase::Building => "BUILD",
            Phase::Active => "ACTIVE",
            Phase::Error => "ERROR",
            Phase::Gone => "DELETED",
        }
    }

    /// The key lists are sorted by: created_at (whole seconds, as the
    /// database keeps it) then id, both descending.
    fn sort_key(&self) -> (u64, &str) {
        let secs = (self.created_wall.duration_since(UNIX_EPOCH)).map_or(0, |d| d.as_secs());
        (secs, self.id.as_str())
    }

    fn machine(&self, now: Instant) -> Machine {
        Machine {
            id: self.id.clone(),
            name: self.name.clone(),
            tags: self.metadata.clone(),
            status: self.status(now).into(),
            deleted: self.phase(now) == Phase::Gone,
        }
    }

    fn updated(&self, now: Instant) -> SystemTime {
        let mut t = self.updated_wall;
        if self.phase(now) != Phase::Building {
            t = t.max(self.created_wall + self.boot);
        }
        if let Some((_, asked, _)) = self.deleting {
            t = t.max(asked);
        }
        t
    }
}

/// One request's context: what it asked for and with which microversion.
struct Call<'a> {
    shared: &'a Shared,
    version: (u32, u32),
    base: String,
}

impl Call<'_> {
    fn at_least(&self, major: u32, minor: u32) -> bool {
        self.version >= (major, minor)
    }

    fn link(&self, path: &str) -> Value {
        json!([
            {"rel": "self", "href": format!("{}/v2.1/{path}", self.base)},
            {"rel": "bookmark", "href": format!("{}/{path}", self.base)},
        ])
    }

    /// The detailed view of `s` at `now`.
    fn detail(&self, s: &Server, now: Instant) -> Value {
        let phase = s.phase(now);
        let mut addresses = Map::new();
        if phase == Phase::Active {
            for (network, addr) in &s.addresses {
                let list = addresses
                    .entry(network.clone())
                    .or_insert_with(|| json!([]));
                if let Value::Array(items) = list {
                    items.push(json!({
                        "version": 4,
                        "addr": addr,
                        "OS-EXT-IPS:type": "fixed",
                        "OS-EXT-IPS-MAC:mac_addr": mac(addr),
                    }));
                }
            }
        }
        let flavor = if self.at_least(2, 47) {
            json!({
                "vcpus": s.flavor.vcpus,
                "ram": s.flavor.ram_mib,
                "disk": s.flavor.disk_gib,
                "ephemeral": 0,
                "swap": 0,
                "original_name": s.flavor.name,
                "extra_specs": {},
            })
        } else {
            json!({"id": s.flavor.id, "links": [
                {"rel": "bookmark", "href": format!("{}/flavors/{}", self.base, s.flavor.id)},
            ]})
        };
        let launched = (phase == Phase::Active).then(|| iso(s.created_wall + s.boot, true));
        let mut v = json!({
            "id": s.id,
            "name": s.name,
            "status": s.status(now),
            "tenant_id": PROJECT_ID,
            "user_id": USER_ID,
            "metadata": s.metadata,
            "hostId": if phase == Phase::Active { host_id(&s.id) } else { String::new() },
            "image": {"id": s.image, "links": [
                {"rel": "bookmark", "href": format!("{}/images/{}", self.base, s.image)},
            ]},
            "flavor": flavor,
            "created": iso(s.created_wall, false),
            "updated": iso(s.updated(now), false),
            "addresses": addresses,
            "accessIPv4": "",
            "accessIPv6": "",
            "links": self.link(&format!("servers/{}", s.id)),
            "OS-DCF:diskConfig": "MANUAL",
            "progress": if phase == Phase::Active { 100 } else { 0 },
            "OS-EXT-AZ:availability_zone": if phase == Phase::Building { "" } else { s.zone.as_str() },
            "config_drive": "",
            "key_name": s.key_name,
            "OS-SRV-USG:launched_at": launched,
            "OS-SRV-USG:terminated_at": Value::Null,
            "security_groups": s.security_groups.iter().map(|n| json!({"name": n})).collect::<Vec<_>>(),
            "OS-EXT-STS:task_state": s.task_state(now),
            "OS-EXT-STS:vm_state": s.vm_state(now),
            "OS-EXT-STS:power_state": if phase == Phase::Active { 1 } else { 0 },
            "os-extended-volumes:volumes_attached": [],
        });
        if self.at_least(2, 9) {
            v["locked"] = json!(false);
        }
        if self.at_least(2, 19) {
            v["description"] = Value::Null;
        }
        if self.at_least(2, 26) {
            v["tags"] = json!([]);
        }
        if phase == Phase::Error
            && let Some(f) = &s.fault
        {
            v["fault"] = json!({
                "code": f.code,
                "message": f.message,
                "created": iso(s.created_wall + s.boot, false),
            });
        }
        v
    }

    fn summary(&self, s: &Server) -> Value {
        json!({"id": s.id, "name": s.name, "links": self.link(&format!("servers/{}", s.id))})
    }
}

impl Nova {
    /// A cloud with the default config.
    pub async fn start(tokens: TokenCheck) -> Nova {
        Nova::start_with(NovaConfig::default(), tokens).await
    }

    pub async fn start_with(config: NovaConfig, tokens: TokenCheck) -> Nova {
        let shared = Arc::new(Shared {
            knobs: Knobs::default(),
            tokens,
            requests: Mutex::new(Vec::new()),
            cloud: Mutex::new(Cloud {
                config,
                servers: Vec::new(),
                fail_next: VecDeque::new(),
                rate: None,
                addresses: 0,
            }),
            base: Mutex::new(String::new()),
        });
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let served = Served::start(app).await;
        *lock(&shared.base) = served.url();
        Nova { served, shared }
    }

    pub fn addr(&self) -> SocketAddr {
        self.served.addr
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        self.served.url()
    }

    /// The compute endpoint as Keystone's catalog gives it:
    /// `http://ADDR/v2.1`.
    pub fn compute_url(&self) -> String {
        format!("{}/v2.1", self.served.url())
    }

    pub fn knobs(&self) -> &Knobs {
        &self.shared.knobs
    }

    /// Every server the cloud ever made, deleted ones marked, with their
    /// metadata as tags, in the order made.
    pub fn machines(&self) -> Vec<Machine> {
        let now = Instant::now();
        let cloud = lock(&self.shared.cloud);
        cloud.servers.iter().map(|s| s.machine(now)).collect()
    }

    /// The next `n` builds end in `ERROR` with `fault`.
    pub fn fail_next_builds(&self, n: usize, fault: BuildFault) {
        let mut cloud = lock(&self.shared.cloud);
        cloud.fail_next.extend(std::iter::repeat_n(fault, n));
    }

    pub fn set_quota(&self, quota: Quota) {
        lock(&self.shared.cloud).config.quota = quota;
    }

    /// How long servers made from now on are `BUILD`.
    pub fn set_boot_time(&self, boot: Duration) {
        lock(&self.shared.cloud).config.boot_time = boot;
    }

    /// At most `per_second` requests a second from now on, the others
    /// answered `status` (429, or 413 as older clouds do) with `overLimit`
    /// and `Retry-After`; `None` lifts the limit.
    pub fn set_rate_limit(&self, limit: Option<(u32, u16)>) {
        lock(&self.shared.cloud).rate = limit.map(|(per_second, status)| RateLimit {
            per_second,
            status,
            window: Instant::now(),
            count: 0,
        });
    }

    /// Every request that named an operation, in order, as `METHOD
    /// /v2.1/path?query` (the query as sent).
    pub fn requests(&self) -> Vec<String> {
        lock(&self.shared.requests).clone()
    }

    /// The user data a server was created with, base64 as sent.
    pub fn user_data(&self, id: &str) -> Option<String> {
        let cloud = lock(&self.shared.cloud);
        cloud
            .servers
            .iter()
            .find(|s| s.id == id)
            .and_then(|s| s.user_data.clone())
    }
}

/// The operation a request is, by method and path below `/v2.1`.
fn operation(method: &Method, segments: &[&str]) -> Option<&'static str> {
    Some(match (method.as_str(), segments) {
        ("GET", ["servers"]) => "servers.list",
        ("POST", ["servers"]) => "servers.create",
        ("GET", ["servers", "detail"]) => "servers.detail",
        ("GET", ["servers", _]) => "servers.get",
        ("DELETE", ["servers", _]) => "servers.delete",
        ("GET", ["servers", _, "metadata"]) => "metadata.list",
        ("PUT", ["servers", _, "metadata"]) => "metadata.replace",
        ("POST", ["servers", _, "metadata"]) => "metadata.update",
        ("GET", ["servers", _, "metadata", _]) => "metadata.get-item",
        ("PUT", ["servers", _, "metadata", _]) => "metadata.set-item",
        ("DELETE", ["servers", _, "metadata", _]) => "metadata.delete-item",
        ("GET", ["limits"]) => "limits.get",
        _ => return None,
    })
}

/// Whether some method serves `segments`: for 405 rather than 404.
fn known_path(segments: &[&str]) -> bool {
    matches!(
        segments,
        ["servers"]
            | ["servers", _]
            | ["servers", _, "metadata"]
            | ["servers", _, "metadata", _]
            | ["limits"]
    )
}

async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path().to_owned();
    let query = parts.uri.query().unwrap_or_default().to_owned();
    let base = lock(&shared.base).clone();
    let Some(rest) = path.strip_prefix("/v2.1/") else {
        return fault(404, "The resource could not be found.").into_response();
    };
    let decoded: Vec<String> = rest
        .split('/')
        .map(|s| {
            url::form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default()
        })
        .collect();
    let segments: Vec<&str> = decoded.iter().map(String::as_str).collect();
    let Some(op) = operation(&parts.method, &segments) else {
        return if known_path(&segments) {
            fault(405, "The method is not allowed for the requested URL.").into_response()
        } else {
            fault(404, "The resource could not be found.").into_response()
        };
    };
    lock(&shared.requests).push(match parts.uri.query() {
        Some(q) => format!("{} {path}?{q}", parts.method),
        None => format!("{} {path}", parts.method),
    });
    if let Some(answer) = shared.knobs.enter(op) {
        return answer.into_response();
    }
    let token = parts
        .headers
        .get("x-auth-token")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|t| !t.is_empty());
    if token.is_none_or(|t| (shared.tokens)(t).is_err()) {
        return unauthorized(&base).into_response();
    }
    if let Some(answer) = rate_limited(&shared) {
        return answer.into_response();
    }
    let version = match microversion(&parts.headers) {
        Ok(v) => v,
        Err(answer) => return answer.into_response(),
    };
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return fault(400, "The request body could not be read.").into_response(),
    };
    if body.len() > MAX_BODY {
        return fault(413, "Request is too large.").into_response();
    }
    let call = Call {
        shared: &shared,
        version,
        base,
    };
    let answer = match (op, segments.as_slice()) {
        ("servers.list", _) => list(&call, &query, false),
        ("servers.detail", _) => list(&call, &query, true),
        ("servers.create", _) => create(&call, &body),
        ("servers.get", [_, id]) => show(&call, id),
        ("servers.delete", [_, id]) => delete(&call, id),
        ("metadata.list", [_, id, _]) => metadata_list(&call, id),
        ("metadata.replace", [_, id, _]) => metadata_write(&call, id, &body, true),
        ("metadata.update", [_, id, _]) => metadata_write(&call, id, &body, false),
        ("metadata.get-item", [_, id, _, key]) => metadata_item(&call, id, key),
        ("metadata.set-item", [_, id, _, key]) => metadata_set_item(&call, id, key, &body),
        ("metadata.delete-item", [_, id, _, key]) => metadata_delete_item(&call, id, key),
        ("limits.get", _) => limits(&call),
        _ => fault(404, "The resource could not be found."),
    };
    // What the answer reports is done: a caller gone meanwhile never
    // learns of it.
    shared.knobs.held(op).await;
    // Every answer says which microversion served it: 2.1 when none was
    // asked for.
    let v = format!("{}.{}", version.0, version.1);
    answer
        .with_header("openstack-api-version", format!("compute {v}"))
        .with_header("x-openstack-nova-api-version", v)
        .with_header(
            "vary",
            "OpenStack-API-Version, X-OpenStack-Nova-API-Version",
        )
        .with_header("x-compute-request-id", request_id())
        .into_response()
}

/// The rate limit's answer, when this request is over it.
fn rate_limited(shared: &Shared) -> Option<Answer> {
    let mut cloud = lock(&shared.cloud);
    let rate = cloud.rate.as_mut()?;
    let now = Instant::now();
    if now >= rate.window + Duration::from_secs(1) {
        rate.window = now;
        rate.count = 0;
    }
    rate.count += 1;
    if rate.count <= rate.per_second {
        return None;
    }
    Some(over_limit(rate.status, 1))
}

/// The microversion a request asks for (`OpenStack-API-Version: compute
/// 2.38`, or the older `X-OpenStack-Nova-API-Version: 2.38`); 2.1 when it
/// asks for none.
fn microversion(headers: &HeaderMap) -> Result<(u32, u32), Answer> {
    let asked = headers
        .get_all("openstack-api-version")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|item| {
            let mut words = item.split_whitespace();
            (words.next()?.eq_ignore_ascii_case("compute")).then(|| words.next().map(str::to_owned))
        })
        .flatten()
        .or_else(|| {
            (headers.get("x-openstack-nova-api-version"))
                .and_then(|v| v.to_str().ok())
                .map(|v| v.trim().to_owned())
        });
    let Some(asked) = asked else {
        return Ok(MIN_VERSION);
    };
    if asked.eq_ignore_ascii_case("latest") {
        return Ok(MAX_VERSION);
    }
    let parsed = asked
        .split_once('.')
        .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)));
    let Some(v) = parsed else {
        return Err(fault(
            400,
            &format!(
                "API Version String {asked} is of invalid format. Must be of format MajorNum.MinorNum."
            ),
        ));
    };
    if v < MIN_VERSION || v > MAX_VERSION {
        return Err(fault(
            406,
            &format!(
                "Version {asked} is not supported by the API. Minimum is {}.{} and maximum is {}.{}.",
                MIN_VERSION.0, MIN_VERSION.1, MAX_VERSION.0, MAX_VERSION.1
            ),
        ));
    }
    Ok(v)
}

/// `Invalid input for field/attribute …`: the words of Nova's schema check.
fn invalid_input(field: &str, value: &Value, why: &str) -> Answer {
    fault(
        400,
        &format!("Invalid input for field/attribute {field}. Value: {value}. {why}"),
    )
}

fn not_found(id: &str) -> Answer {
    fault(404, &format!("Instance {id} could not be found."))
}

fn body_json(body: &[u8]) -> Result<Value, Answer> {
    serde_json::from_slice(body)
        .map_err(|_| fault(400, "Malformed request body"))
        .and_then(|v: Value| {
            if v.is_object() {
                Ok(v)
            } else {
                Err(fault(400, "Malformed request body"))
            }
        })
}

/// Checks metadata as Nova's schema and quota do; the map if it passes.
fn check_metadata(
    field: &str,
    value: &Value,
    quota: i64,
) -> Result<BTreeMap<String, String>, Answer> {
    let Value::Object(map) = value else {
        return Err(invalid_input(
            field,
            value,
            &format!("{value} is not of type 'object'"),
        ));
    };
    let mut out = BTreeMap::new();
    for (k, v) in map {
        let key_ok = (1..=255).contains(&k.chars().count())
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_:. ".contains(c));
        if !key_ok {
            return Err(invalid_input(
                field,
                value,
                &format!(
                    "Additional properties are not allowed ('{k}' was unexpected): keys match ^[{METADATA_KEY_CHARS}]{{1,255}}$"
                ),
            ));
        }
        match v {
            Value::String(s) if s.chars().count() <= 255 => {
                out.insert(k.clone(), s.clone());
            }
            Value::String(s) => {
                return Err(invalid_input(field, value, &format!("'{s}' is too long")));
            }
            other => {
                return Err(invalid_input(
                    field,
                    value,
                    &format!("{other} is not of type 'string'"),
                ));
            }
        }
    }
    if quota >= 0 && out.len() as i64 > quota {
        return Err(fault(
            403,
            &format!("Maximum number of metadata items exceeds {quota}"),
        ));
    }
    Ok(out)
}

/// A server name: 1 to 255 printable characters, not starting or ending
/// with whitespace.
fn valid_name(name: &str) -> bool {
    let n = name.chars().count();
    (1..=255).contains(&n)
        && !name.chars().any(char::is_control)
        && !name.starts_with(char::is_whitespace)
        && !name.ends_with(char::is_whitespace)
}

const SERVER_KEYS: [&str; 22] = [
    "name",
    "flavorRef",
    "imageRef",
    "networks",
    "key_name",
    "user_data",
    "metadata",
    "security_groups",
    "availability_zone",
    "config_drive",
    "adminPass",
    "accessIPv4",
    "accessIPv6",
    "OS-DCF:diskConfig",
    "description",
    "block_device_mapping_v2",
    "min_count",
    "max_count",
    "return_reservation_id",
    "tags",
    "hostname",
    "personality",
];

fn create(call: &Call<'_>, body: &[u8]) -> Answer {
    match try_create(call, body) {
        Ok(answer) | Err(answer) => answer,
    }
}

fn try_create(call: &Call<'_>, body: &[u8]) -> Result<Answer, Answer> {
    let v = body_json(body)?;
    let Some(server) = v.get("server").and_then(Value::as_object) else {
        return Err(invalid_input(
            "server",
            &v,
            "'server' is a required property",
        ));
    };
    if let Some(extra) = v.as_object().and_then(|o| {
        o.keys().find(|k| {
            *k != "server" && *k != "os:scheduler_hints" && *k != "OS-SCH-HNT:scheduler_hints"
        })
    }) {
        return Err(fault(
            400,
            &format!(
                "Invalid input for field/attribute. Additional properties are not allowed ('{extra}' was unexpected)"
            ),
        ));
    }
    if let Some(extra) = server.keys().find(|k| !SERVER_KEYS.contains(&k.as_str())) {
        return Err(invalid_input(
            "server",
            &Value::Object(server.clone()),
            &format!("Additional properties are not allowed ('{extra}' was unexpected)"),
        ));
    }
    let name = match server.get("name") {
        Some(Value::String(n)) if valid_name(n) => n.clone(),
        Some(other) => {
            return Err(invalid_input(
                "name",
                other,
                "printable characters. Can not start or end with whitespace.",
            ));
        }
        None => {
            return Err(invalid_input(
                "server",
                &Value::Object(server.clone()),
                "'name' is a required property",
            ));
        }
    };
    let flavor_ref = match server.get("flavorRef") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(other) => return Err(invalid_input("flavorRef", other, "is not valid")),
        None => {
            return Err(invalid_input(
                "server",
                &Value::Object(server.clone()),
                "'flavorRef' is a required property",
            ));
        }
    };
    // An id, or a URL ending in one.
    let flavor_id = flavor_ref.rsplit('/').next().unwrap_or_default().to_owned();
    let image = match server.get("imageRef") {
        Some(Value::String(s)) if !s.is_empty() => {
            s.rsplit('/').next().unwrap_or_default().to_owned()
        }
        Some(other) if !other.is_null() => {
            return Err(invalid_input("imageRef", other, "is not a 'uuid'"));
        }
        _ => return Err(fault(400, "Missing imageRef attribute")),
    };
    let key_name = match server.get("key_name") {
        None => None,
        Some(Value::String(k)) => Some(k.clone()),
        Some(other) => return Err(invalid_input("key_name", other, "is not of type 'string'")),
    };
    let user_data = match server.get("user_data") {
        None => None,
        Some(Value::String(u)) if u.len() > MAX_USER_DATA => {
            return Err(invalid_input(
                "user_data",
                &json!("…"),
                &format!(
                    "is too long: {} characters, at most {MAX_USER_DATA}",
                    u.len()
                ),
            ));
        }
        Some(Value::String(u)) => {
            if base64::engine::general_purpose::STANDARD.decode(u).is_err() {
                return Err(invalid_input("user_data", &json!(u), "is not a 'base64'"));
            }
            Some(u.clone())
        }
        Some(other) => return Err(invalid_input("user_data", other, "is not of type 'string'")),
    };
    let groups = match server.get("security_groups") {
        None => vec!["default".to_owned()],
        Some(Value::Array(items)) => {
            let mut names = Vec::new();
            for item in items {
                match item.get("name").and_then(Value::as_str) {
                    Some(n) => names.push(n.to_owned()),
                    None => {
                        return Err(invalid_input(
                            "security_groups",
                            item,
                            "'name' is a required property",
                        ));
                    }
                }
            }
            names
        }
        Some(other) => {
            return Err(invalid_input(
                "security_groups",
                other,
                "is not of type 'array'",
            ));
        }
    };
    let zone = match server.get("availability_zone") {
        None => None,
        Some(Value::String(z)) => Some(z.clone()),
        Some(other) => {
            return Err(invalid_input(
                "availability_zone",
                other,
                "is not of type 'string'",
            ));
        }
    };
    let networks = server.get("networks");
    if call.at_least(2, 37) && networks.is_none() {
        return Err(invalid_input(
            "server",
            &Value::Object(server.clone()),
            "'networks' is a required property",
        ));
    }

    let shared = call.shared;
    let mut cloud = lock(&shared.cloud);
    let quota = cloud.config.quota;
    let metadata = match server.get("metadata") {
        None => BTreeMap::new(),
        Some(m) => check_metadata("metadata", m, quota.metadata_items)?,
    };
    let Some(flavor) = cloud
        .config
        .flavors
        .iter()
        .find(|f| f.id == flavor_id)
        .cloned()
    else {
        return Err(fault(
            400,
            &format!("Flavor {flavor_id} could not be found."),
        ));
    };
    if !cloud.config.images.contains(&image) {
        return Err(fault(400, "Can not find requested image"));
    }
    if let Some(k) = &key_name
        && !cloud.config.keypairs.contains(k)
    {
        return Err(fault(400, "Invalid key_name provided."));
    }
    for g in &groups {
        if !cloud.config.security_groups.contains(g) {
            return Err(fault(400, &format!("Security group {g} not found.")));
        }
    }
    let zone = match zone {
        Some(z) if !cloud.config.zones.contains(&z) => {
            return Err(fault(
                400,
                "The requested availability zone is not available",
            ));
        }
        Some(z) => z,
        None => cloud
            .config
            .zones
            .first()
            .cloned()
            .unwrap_or_else(|| "nova".into()),
    };
    let joined: Vec<Network> = match networks {
        None if cloud.config.networks.len() > 1 => {
            return Err(fault(
                409,
                "More than one possible network found. Specify network ID(s) to select which one(s) to connect to.",
            ));
        }
        None => cloud.config.networks.clone(),
        Some(Value::String(s)) if s == "none" => Vec::new(),
        Some(Value::String(s)) if s == "auto" => {
            cloud.config.networks.iter().take(1).cloned().collect()
        }
        Some(Value::Array(items)) => {
            let mut joined = Vec::new();
            for item in items {
                let Some(uuid) = item.get("uuid").and_then(Value::as_str) else {
                    return Err(invalid_input(
                        "networks",
                        item,
                        "'uuid' is a required property (ports and fixed IPs are left out)",
                    ));
                };
                match cloud.config.networks.iter().find(|n| n.id == uuid) {
                    Some(n) => joined.push(n.clone()),
                    None => return Err(fault(400, &format!("Network {uuid} could not be found."))),
                }
            }
            joined
        }
        Some(other) => {
            return Err(invalid_input(
                "networks",
                other,
                "is not valid under any of the given schemas",
            ));
        }
    };

    // Quota: what the project holds, deleting servers included.
    let now = Instant::now();
    let live: Vec<&Server> = (cloud.servers.iter())
        .filter(|s| s.phase(now) != Phase::Gone)
        .collect();
    let used_instances = live.len() as i64;
    let used_cores: i64 = live.iter().map(|s| i64::from(s.flavor.vcpus)).sum();
    let used_ram: i64 = live.iter().map(|s| s.flavor.ram_mib as i64).sum();
    for (resource, requested, used, allowed) in [
        ("instances", 1, used_instances, quota.instances),
        ("cores", i64::from(flavor.vcpus), used_cores, quota.cores),
        ("ram", flavor.ram_mib as i64, used_ram, quota.ram_mib),
    ] {
        if allowed >= 0 && used + requested > allowed {
            return Err(fault(
                403,
                &format!(
                    "Quota exceeded for {resource}: Requested {requested}, but already used {used} of {allowed} {resource}"
                ),
            ));
        }
    }

    let id = uuid4();
    let mut addresses = Vec::new();
    for n in &joined {
        let k = cloud.addresses;
        cloud.addresses += 1;
        addresses.push((n.name.clone(), format!("10.0.{}.{}", k / 250, k % 250 + 2)));
    }
    let fault_ahead = cloud.fail_next.pop_front();
    let wall = SystemTime::now();
    let boot = cloud.config.boot_time;
    cloud.servers.push(Server {
        id: id.clone(),
        name,
        flavor,
        image,
        metadata,
        key_name,
        user_data,
        addresses,
        security_groups: groups.clone(),
        zone,
        created: now,
        created_wall: wall,
        updated_wall: wall,
        boot,
        fault: fault_ahead,
        deleting: None,
    });
    drop(cloud);
    let admin_pass: String = (0..12)
        .map(|_| {
            char::from(
                b"abcdefghjkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789"
                    [rand::random_range(0..55)],
            )
        })
        .collect();
    let links = call.link(&format!("servers/{id}"));
    let location = links[0]["href"].as_str().unwrap_or_default().to_owned();
    Ok(Answer::json(
        202,
        &json!({"server": {
            "id": id,
            "links": links,
            "OS-DCF:diskConfig": "MANUAL",
            "security_groups": groups.iter().map(|n| json!({"name": n})).collect::<Vec<_>>(),
            "adminPass": admin_pass,
        }}),
    )
    .with_header("location", location))
}

/// Query parameters, each name's values in order.
fn params(query: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        out.entry(k.into_owned()).or_default().push(v.into_owned());
    }
    out
}

const STATUSES: [&str; 20] = [
    "ACTIVE",
    "BUILD",
    "DELETED",
    "ERROR",
    "HARD_REBOOT",
    "MIGRATING",
    "PASSWORD",
    "PAUSED",
    "REBOOT",
    "REBUILD",
    "RESCUE",
    "RESIZE",
    "REVERT_RESIZE",
    "SHELVED",
    "SHELVED_OFFLOADED",
    "SHUTOFF",
    "SOFT_DELETED",
    "SUSPENDED",
    "UNKNOWN",
    "VERIFY_RESIZE",
];

fn list(call: &Call<'_>, query: &str, detail: bool) -> Answer {
    let params = params(query);
    let last = |k: &str| params.get(k).and_then(|v| v.last()).map(String::as_str);
    let max_limit = lock(&call.shared.cloud).config.max_limit;
    let limit = match last("limit") {
        None => max_limit,
        Some(text) => match text.trim().parse::<i64>() {
            Ok(n) if n < 0 => return fault(400, "limit must be >= 0"),
            Ok(n) => max_limit.min(usize::try_from(n).unwrap_or(usize::MAX)),
            Err(_) => return fault(400, "limit must be an integer"),
        },
    };
    let name = match last("name") {
        None => None,
        Some(pattern) => match regex::Regex::new(pattern) {
            Ok(re) => Some(re),
            Err(_) => {
                return fault(
                    400,
                    &format!(
                        "Invalid input for query parameters name. Value: {pattern}. '{pattern}' is not a 'regex'"
                    ),
                );
            }
        },
    };
    let statuses: Vec<String> = params
        .get("status")
        .map(|v| v.iter().map(|s| s.to_ascii_uppercase()).collect())
        .unwrap_or_default();
    if call.at_least(2, 38) && statuses.iter().any(|s| !STATUSES.contains(&s.as_str())) {
        return fault(400, "Invalid status value");
    }
    let now = Instant::now();
    let cloud = lock(&call.shared.cloud);
    let knobs = &call.shared.knobs;
    let mut order: Vec<&Server> = cloud.servers.iter().collect();
    order.sort_by(|a, b| b.sort_key().cmp(&a.sort_key()));
    // Servers after the marker's place in this order; the marker may be
    // any server the project ever had, deleted ones included.
    let after = match last("marker") {
        None => None,
        Some(marker) => match cloud.servers.iter().find(|s| s.id == marker) {
            Some(s) => Some(s.sort_key()),
            None => return fault(400, &format!("marker [{marker}] not found")),
        },
    };
    let page: Vec<&Server> = order
        .into_iter()
        .filter(|s| after.is_none_or(|k| s.sort_key() < k))
        .filter(|s| s.phase(now) != Phase::Gone && knobs.listed(s.created))
        .filter(|s| name.as_ref().is_none_or(|re| re.is_match(&s.name)))
        .filter(|s| statuses.is_empty() || statuses.iter().any(|st| st == s.status(now)))
        .take(limit)
        .collect();
    let servers: Vec<Value> = page
        .iter()
        .map(|s| {
            if detail {
                call.detail(s, now)
            } else {
                call.summary(s)
            }
        })
        .collect();
    let mut body = json!({ "servers": servers });
    if limit > 0
        && page.len() == limit
        && let Some(last) = page.last()
    {
        let mut next: BTreeMap<String, String> = params
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.last()?.clone())))
            .collect();
        next.insert("marker".into(), last.id.clone());
        let query: String = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(next.iter())
            .finish();
        let collection = if detail { "servers/detail" } else { "servers" };
        body["servers_links"] = json!([{
            "rel": "next",
            "href": format!("{}/v2.1/{collection}?{query}", call.base),
        }]);
    }
    Answer::json(200, &body)
}

fn show(call: &Call<'_>, id: &str) -> Answer {
    let now = Instant::now();
    let cloud = lock(&call.shared.cloud);
    match cloud
        .servers
        .iter()
        .find(|s| s.id == id && s.phase(now) != Phase::Gone)
    {
        Some(s) => Answer::json(200, &json!({"server": call.detail(s, now)})),
        None => not_found(id),
    }
}

fn delete(call: &Call<'_>, id: &str) -> Answer {
    let now = Instant::now();
    let mut cloud = lock(&call.shared.cloud);
    let delete_time = cloud.config.delete_time;
    match cloud
        .servers
        .iter_mut()
        .find(|s| s.id == id && s.phase(now) != Phase::Gone)
    {
        Some(s) => {
            if s.deleting.is_none() {
                s.deleting = Some((now, SystemTime::now(), delete_time));
            }
            Answer {
                status: 204,
                headers: Vec::new(),
                body: String::new(),
            }
        }
        None => not_found(id),
    }
}

/// The server `id` as the metadata calls find it: 404 if it is not there.
fn with_server<T>(
    call: &Call<'_>,
    id: &str,
    f: impl FnOnce(&mut Server, Instant, &NovaConfig) -> Result<T, Answer>,
) -> Result<T, Answer> {
    let now = Instant::now();
    let mut cloud = lock(&call.shared.cloud);
    let cloud = &mut *cloud;
    match cloud
        .servers
        .iter_mut()
        .find(|s| s.id == id && s.phase(now) != Phase::Gone)
    {
        Some(s) => f(s, now, &cloud.config),
        None => Err(not_found(id)),
    }
}

/// Nova changes metadata only of a server that is built and busy with
/// nothing else (vm state active, paused, suspended or stopped, no task).
fn writable(s: &Server, now: Instant, action: &str) -> Result<(), Answer> {
    let conflict = |attr: &str, state: &str| {
        Err(fault(
            409,
            &format!(
                "Cannot '{action}' instance {} while it is in {attr} {state}",
                s.id
            ),
        ))
    };
    let vm = s.vm_state(now);
    if vm != "active" {
        return conflict("vm_state", vm);
    }
    if let Some(task) = s.task_state(now) {
        return conflict("task_state", task);
    }
    Ok(())
}

fn metadata_list(call: &Call<'_>, id: &str) -> Answer {
    let got = with_server(call, id, |s, _, _| Ok(json!({"metadata": s.metadata})));
    match got {
        Ok(body) => Answer::json(200, &body),
        Err(answer) => answer,
    }
}

fn metadata_write(call: &Call<'_>, id: &str, body: &[u8], replace: bool) -> Answer {
    let result = body_json(body).and_then(|v| {
        let Some(m) = v.get("metadata") else {
            return Err(invalid_input(
                "metadata",
                &v,
                "'metadata' is a required property",
            ));
        };
        let m = m.clone();
        with_server(call, id, |s, now, config| {
            let asked = check_metadata("metadata", &m, -1)?;
            writable(s, now, "update metadata")?;
            let mut result = if replace {
                BTreeMap::new()
            } else {
                s.metadata.clone()
            };
            result.extend(asked);
            let quota = config.quota.metadata_items;
            if quota >= 0 && result.len() as i64 > quota {
                return Err(fault(
                    403,
                    &format!("Maximum number of metadata items exceeds {quota}"),
                ));
            }
            s.metadata = result.clone();
            s.updated_wall = SystemTime::now();
            Ok(json!({ "metadata": result }))
        })
    });
    match result {
        Ok(body) => Answer::json(200, &body),
        Err(answer) => answer,
    }
}

fn metadata_item(call: &Call<'_>, id: &str, key: &str) -> Answer {
    let got = with_server(call, id, |s, _, _| match s.metadata.get(key) {
        Some(v) => Ok(json!({"meta": { key: v }})),
        None => Err(fault(404, "Metadata item was not found")),
    });
    match got {
        Ok(body) => Answer::json(200, &body),
        Err(answer) => answer,
    }
}

fn metadata_set_item(call: &Call<'_>, id: &str, key: &str, body: &[u8]) -> Answer {
    let result = body_json(body).and_then(|v| {
        let Some(meta) = v.get("meta") else {
            return Err(invalid_input("meta", &v, "'meta' is a required property"));
        };
        let item = check_metadata("meta", meta, -1)?;
        if item.len() != 1 {
            return Err(invalid_input("meta", meta, "must hold exactly one item"));
        }
        if !item.contains_key(key) {
            return Err(fault(400, "Request body and URI mismatch"));
        }
        with_server(call, id, |s, now, config| {
            writable(s, now, "update metadata")?;
            let mut result = s.metadata.clone();
            result.extend(item.clone());
            let quota = config.quota.metadata_items;
            if quota >= 0 && result.len() as i64 > quota {
                return Err(fault(
                    403,
                    &format!("Maximum number of metadata items exceeds {quota}"),
                ));
            }
            s.metadata = result;
            s.updated_wall = SystemTime::now();
            Ok(json!({ "meta": item }))
        })
    });
    match result {
        Ok(body) => Answer::json(200, &body),
        Err(answer) => answer,
    }
}

fn metadata_delete_item(call: &Call<'_>, id: &str, key: &str) -> Answer {
    let result = with_server(call, id, |s, now, _| {
        if !s.metadata.contains_key(key) {
            return Err(fault(404, "Metadata item was not found"));
        }
        writable(s, now, "delete metadata")?;
        s.metadata.remove(key);
        s.updated_wall = SystemTime::now();
        Ok(())
    });
    match result {
        Ok(()) => Answer {
            status: 204,
            headers: Vec::new(),
            body: String::new(),
        },
        Err(answer) => answer,
    }
}

fn limits(call: &Call<'_>) -> Answer {
    let now = Instant::now();
    let cloud = lock(&call.shared.cloud);
    let q = cloud.config.quota;
    let live: Vec<&Server> = (cloud.servers.iter())
        .filter(|s| s.phase(now) != Phase::Gone)
        .collect();
    let cores: u64 = live.iter().map(|s| u64::from(s.flavor.vcpus)).sum();
    let ram: u64 = live.iter().map(|s| s.flavor.ram_mib).sum();
    Answer::json(
        200,
        &json!({"limits": {
            "rate": [],
            "absolute": {
                "maxImageMeta": 128,
                "maxPersonality": 5,
                "maxPersonalitySize": 10240,
                "maxServerMeta": q.metadata_items,
                "maxTotalCores": q.cores,
                "maxTotalInstances": q.instances,
                "maxTotalKeypairs": 100,
                "maxTotalRAMSize": q.ram_mib,
                "maxServerGroups": 10,
                "maxServerGroupMembers": 10,
                "totalCoresUsed": cores,
                "totalInstancesUsed": live.len(),
                "totalRAMUsed": ram,
                "totalServerGroupsUsed": 0,
            },
        }}),
    )
}

/// A random version 4 UUID.
fn uuid4() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

fn request_id() -> String {
    format!("req-{}", uuid4())
}

/// A host id as Nova shows it (a digest of the project and host).
fn host_id(id: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes().chain(PROJECT_ID.bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!(
        "{h:016x}{:016x}{:016x}{:08x}",
        h.rotate_left(17),
        h.rotate_left(31),
        h as u32
    )
}

/// A MAC address derived from an IP address.
fn mac(addr: &str) -> String {
    let parts: Vec<u8> = addr.split('.').filter_map(|p| p.parse().ok()).collect();
    let b = |i: usize| parts.get(i).copied().unwrap_or(0);
    format!("fa:16:3e:{:02x}:{:02x}:{:02x}", b(1), b(2), b(3))
}

/// `at` in UTC as Nova writes times: `2026-11-28T18:00:00Z`, or with
/// microseconds (`launched_at`: `2026-11-28T18:00:00.000000`).
pub fn iso(at: SystemTime, micros: bool) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (y, m, d) = crate::common::civil_from_days((secs / 86_400) as i64);
    let s = secs % 86_400;
    let time = format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
        s / 3600,
        s % 3600 / 60,
        s % 60
    );
    if micros {
        format!("{time}.{:06}", since.subsec_micros())
    } else {
        format!("{time}Z")
    }
}

#[cfg(test)]
mod tests;
