//! Azure Resource Manager for virtual machines, as its reference describes
//! it (tests/clouds/azure.md names the pages): bearer tokens, `api-version`,
//! ARM's error body and codes, virtual machines made by a `PUT` by name and
//! deleted by a `DELETE`, both long-running operations tracked through
//! `Azure-AsyncOperation`; network interfaces, public IP addresses and OS
//! disks the VM makes itself and deletes with it by their `deleteOption`;
//! lists paged by `nextLink`; tags and their limits; the subscription's
//! read and write budgets with their `x-ms-ratelimit-remaining-*` headers
//! and `429`; regional core quota and sizes out of capacity.
//!
//! Operations counted in [`Knobs`]: `vm.put`, `vm.get`, `vm.patch`,
//! `vm.delete`, `vm.list`, `nic.get`, `pip.get`, `operation.get`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Map, Value, json};

use crate::common::{Answer, Knobs, Machine, Served, TokenCheck, bearer, lock};

/// The Compute API version the fake answers (any `api-version` is taken,
/// but one must be given).
pub const COMPUTE_API: &str = "2024-07-01";
/// VM sizes and their cores.
const SIZES: [(&str, u32); 4] = [
    ("Standard_B2s", 2),
    ("Standard_D2s_v5", 2),
    ("Standard_D4s_v5", 4),
    ("Standard_F8s_v2", 8),
];
/// ARM's tag limits.
const MAX_TAGS: usize = 50;
const MAX_TAG_NAME: usize = 512;
const MAX_TAG_VALUE: usize = 256;
/// `customData` is at most 64 KB before base64.
const MAX_CUSTOM_DATA_B64: usize = 87_380;

/// How the cloud starts.
#[derive(Clone, Debug)]
pub struct Options {
    pub subscription: String,
    pub resource_group: String,
    pub location: String,
    /// Regional cores the subscription may use.
    pub core_quota: u32,
    /// Reads and writes in each bucket, and how many come back a second.
    pub reads: (u32, u32),
    pub writes: (u32, u32),
    /// VMs per list page.
    pub page_size: usize,
    /// From create to `Succeeded`.
    pub boot: Duration,
    /// From delete to gone.
    pub deletion: Duration,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            subscription: "00000000-0000-4000-8000-000000000001".into(),
            resource_group: "berth-rg".into(),
            location: "westeurope".into(),
            core_quota: 200,
            reads: (250, 25),
            writes: (200, 10),
            page_size: 50,
            boot: Duration::from_millis(300),
            deletion: Duration::from_millis(300),
        }
    }
}

/// What a VM made, deleted with it when its `deleteOption` is `Delete`.
#[derive(Clone, Debug)]
pub struct Made {
    pub kind: &'static str,
    pub name: String,
    pub delete_with_vm: bool,
    pub deleted: bool,
    pub vm: String,
}

#[derive(Clone, Debug)]
struct Vm {
    name: String,
    vm_id: String,
    size: String,
    body: Value,
    tags: Map<String, Value>,
    made: Instant,
    /// When it fails, with the error code and message.
    fails: Option<(String, String)>,
    deleting: Option<Instant>,
    gone: bool,
    private_ip: String,
    public_ip: Option<String>,
}

struct Operation {
    done_at: Instant,
    error: Option<(String, String)>,
    started: String,
}

struct Bucket {
    size: u32,
    per_sec: u32,
    left: f64,
    filled: Instant,
}

impl Bucket {
    fn new((size, per_sec): (u32, u32)) -> Bucket {
        Bucket {
            size,
            per_sec,
            left: f64::from(size),
            filled: Instant::now(),
        }
    }

    /// Takes a token; `Err` with the seconds until there is one.
    fn take(&mut self) -> Result<(), u64> {
        let rate = f64::from(self.per_sec.max(1));
        self.left =
            (self.left + self.filled.elapsed().as_secs_f64() * rate).min(f64::from(self.size));
        self.filled = Instant::now();
        if self.left >= 1.0 {
            self.left -= 1.0;
            Ok(())
        } else {
            Err(((1.0 - self.left) / rate).ceil().max(1.0) as u64)
        }
    }
}

struct Subscription {
    options: Options,
    vms: BTreeMap<String, Vm>,
    made: Vec<Made>,
    operations: BTreeMap<String, Operation>,
    reads: Bucket,
    writes: Bucket,
    next: u64,
    failing: Vec<(String, String)>,
    unavailable: Vec<String>,
}

impl Subscription {
    fn settle(&mut self) {
        let deletion = self.options.deletion;
        for vm in self.vms.values_mut().filter(|v| !v.gone) {
            if vm.deleting.is_some_and(|at| at.elapsed() >= deletion) {
                vm.gone = true;
                for m in self
                    .made
                    .iter_mut()
                    .filter(|m| m.vm == vm.name && m.delete_with_vm)
                {
                    m.deleted = true;
                }
            }
        }
    }

    fn provisioning(&self, vm: &Vm) -> &'static str {
        if vm.deleting.is_some() {
            "Deleting"
        } else if vm.made.elapsed() < self.options.boot {
            "Creating"
        } else if vm.fails.is_some() {
            "Failed"
        } else {
            "Succeeded"
        }
    }

    fn base(&self) -> String {
        format!(
            "/subscriptions/{}/resourceGroups/{}",
            self.options.subscription, self.options.resource_group
        )
    }

    fn view(&self, vm: &Vm, instance_view: bool) -> Value {
        let mut body = vm.body.clone();
        let state = self.provisioning(vm);
        body["id"] = json!(format!(
            "{}/providers/Microsoft.Compute/virtualMachines/{}",
            self.base(),
            vm.name
        ));
        body["name"] = json!(vm.name);
        body["type"] = json!("Microsoft.Compute/virtualMachines");
        body["location"] = json!(self.options.location);
        body["tags"] = Value::Object(vm.tags.clone());
        let props = &mut body["properties"];
        props["provisioningState"] = json!(state);
        props["vmId"] = json!(vm.vm_id);
        props["timeCreated"] = json!(rfc3339(vm.made));
        let nics: Vec<Value> = (self.made.iter())
            .filter(|m| m.vm == vm.name && m.kind == "nic")
            .map(|m| {
                json!({"id": format!("{}/providers/Microsoft.Network/networkInterfaces/{}", self.base(), m.name),
                       "properties": {"deleteOption": if m.delete_with_vm { "Delete" } else { "Detach" }}})
            })
            .collect();
        props["networkProfile"]["networkInterfaces"] = json!(nics);
        if let Some(os) = props.pointer_mut("/storageProfile/osDisk")
            && let Some(disk) = self
                .made
                .iter()
                .find(|m| m.vm == vm.name && m.kind == "disk")
        {
            os["name"] = json!(disk.name);
        }
        if let Some(o) = props.get_mut("osProfile").and_then(Value::as_object_mut) {
            // Secrets never come back.
            o.remove("customData");
            o.remove("adminPassword");
        }
        if instance_view {
            let mut statuses = vec![json!({
                "code": format!("ProvisioningState/{}", state.to_lowercase()),
                "level": "Info",
                "displayStatus": format!("Provisioning {}", state.to_lowercase()),
            })];
            if let (Some((code, message)), "Failed") = (&vm.fails, state) {
                statuses[0] = json!({
                    "code": format!("ProvisioningState/failed/{code}"),
                    "level": "Error",
                    "displayStatus": "Provisioning failed",
                    "message": message,
                });
            }
            if state == "Succeeded" {
                statuses.push(json!({"code": "PowerState/running", "level": "Info", "displayStatus": "VM running"}));
            }
            props["instanceView"] = json!({"statuses": statuses});
        }
        body
    }

    fn operation(&mut self, takes: Duration, error: Option<(String, String)>) -> String {
        self.next += 1;
        let id = format!("{:08x}-0000-4000-8000-{:012x}", self.next, self.next);
        self.operations.insert(
            id.clone(),
            Operation {
                done_at: Instant::now() + takes,
                error,
                started: rfc3339(Instant::now()),
            },
        );
        id
    }
}

/// The fake Azure Resource Manager, serving until dropped.
pub struct Cloud {
    served: Served,
    state: Arc<Mutex<Subscription>>,
    knobs: Arc<Knobs>,
}

#[derive(Clone)]
struct Shared {
    state: Arc<Mutex<Subscription>>,
    knobs: Arc<Knobs>,
    check: TokenCheck,
    addr: Arc<Mutex<Option<SocketAddr>>>,
}

impl Cloud {
    /// Starts the cloud; `check` checks the bearer tokens (the token
    /// server's, as Entra ID issues them).
    pub async fn start(options: Options, check: TokenCheck) -> Cloud {
        let state = Arc::new(Mutex::new(Subscription {
            reads: Bucket::new(options.reads),
            writes: Bucket::new(options.writes),
            options,
            vms: BTreeMap::new(),
            made: Vec::new(),
            operations: BTreeMap::new(),
            next: 0,
            failing: Vec::new(),
            unavailable: Vec::new(),
        }));
        let knobs = Arc::new(Knobs::default());
        let addr = Arc::new(Mutex::new(None));
        let shared = Shared {
            state: state.clone(),
            knobs: knobs.clone(),
            check,
            addr: addr.clone(),
        };
        let rg = "/subscriptions/{sub}/resourceGroups/{rg}/providers";
        let app = Router::new()
            .route(
                &format!("{rg}/Microsoft.Compute/virtualMachines"),
                get(list_vms),
            )
            .route(
                &format!("{rg}/Microsoft.Compute/virtualMachines/{{name}}"),
                get(vm).put(vm).patch(vm).delete(vm),
            )
            .route(
                &format!("{rg}/Microsoft.Network/{{kind}}/{{name}}"),
                get(network),
            )
            .route(
                "/subscriptions/{sub}/providers/Microsoft.Compute/locations/{loc}/operations/{id}",
                get(operation),
            )
            .fallback(no_route)
            .with_state(shared);
        let served = Served::start(app).await;
        *lock(&addr) = Some(served.addr);
        Cloud {
            served,
            state,
            knobs,
        }
    }

    /// `http://127.0.0.1:PORT`, ARM's endpoint.
    pub fn url(&self) -> String {
        self.served.url()
    }

    pub fn addr(&self) -> SocketAddr {
        self.served.addr
    }

    pub fn knobs(&self) -> &Knobs {
        &self.knobs
    }

    /// The regional cores quota from now on.
    pub fn set_core_quota(&self, cores: u32) {
        lock(&self.state).options.core_quota = cores;
    }

    /// The next create's VM fails to provision with `code` and `message`
    /// (`AllocationFailed`, `OSProvisioningTimedOut`, …).
    pub fn fail_next_create(&self, code: &str, message: &str) {
        lock(&self.state)
            .failing
            .push((code.into(), message.into()));
    }

    /// `size` cannot be had in the region (`SkuNotAvailable`).
    pub fn make_unavailable(&self, size: &str) {
        lock(&self.state).unavailable.push(size.into());
    }

    /// Puts a VM in the resource group directly, as another tool would.
    pub fn add_vm(&self, name: &str, tags: &[(&str, &str)]) {
        let mut s = lock(&self.state);
        let vm = Vm {
            name: name.into(),
            vm_id: format!("{name}-id"),
            size: "Standard_B2s".into(),
            body: json!({"properties": {"hardwareProfile": {"vmSize": "Standard_B2s"}}}),
            tags: (tags.iter())
                .map(|(k, v)| ((*k).to_owned(), json!(v)))
                .collect(),
            made: Instant::now() - Duration::from_secs(3600),
            fails: None,
            deleting: None,
            gone: false,
            private_ip: "10.9.9.9".into(),
            public_ip: None,
        };
        s.vms.insert(name.into(), vm);
    }

    /// Every VM the resource group ever had, deleted ones marked.
    pub fn machines(&self) -> Vec<Machine> {
        let mut s = lock(&self.state);
        s.settle();
        (s.vms.values())
            .map(|vm| Machine {
                id: vm.name.clone(),
                name: vm.name.clone(),
                tags: (vm.tags.iter())
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect(),
                status: if vm.gone {
                    "deleted".into()
                } else {
                    s.provisioning(vm).into()
                },
                deleted: vm.gone,
            })
            .collect()
    }

    /// The NICs, public IPs and disks VMs made, deleted ones marked.
    pub fn made(&self) -> Vec<Made> {
        let mut s = lock(&self.state);
        s.settle();
        s.made.clone()
    }

    /// The `customData` a VM was created with, decoded.
    pub fn custom_data(&self, name: &str) -> Option<String> {
        let s = lock(&self.state);
        let b64 = s
            .vms
            .get(name)?
            .body
            .pointer("/properties/osProfile/customData")?
            .as_str()?;
        String::from_utf8(base64_decode(b64)?).ok()
    }
}

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(text).ok()
}

fn rfc3339(at: Instant) -> String {
    let ago = at.elapsed();
    let when = SystemTime::now() - ago;
    let since = when.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (y, m, d) = crate::common::civil_from_days((secs / 86_400) as i64);
    let s = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:07}+00:00",
        s / 3600,
        s % 3600 / 60,
        s % 60,
        since.subsec_nanos() / 100
    )
}

/// ARM's error body.
pub fn error(status: u16, code: &str, message: &str) -> Answer {
    Answer::json(
        status,
        &json!({"error": {"code": code, "message": message}}),
    )
}

fn query(raw: Option<&str>) -> Vec<(String, String)> {
    url::form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// What every request goes through: the subscription and group, the token,
/// `api-version`, the read or write budget, an injected answer.
fn admit(
    shared: &Shared,
    headers: &HeaderMap,
    sub: &str,
    rg: Option<&str>,
    raw: Option<&str>,
    write: bool,
    op: &str,
) -> Result<(), Answer> {
    let injected = shared.knobs.enter(op);
    let verdict = match bearer(headers) {
        None => Err(error(
            401,
            "AuthenticationFailed",
            "Authentication failed. The 'Authorization' header is missing.",
        )),
        Some(token) => (shared.check)(token).map_err(|why| {
            if why == "expired" {
                error(
                    401,
                    "ExpiredAuthenticationToken",
                    "The access token expiry UTC time is earlier than current UTC time.",
                )
            } else {
                error(
                    401,
                    "InvalidAuthenticationToken",
                    "The access token is invalid.",
                )
            }
        }),
    };
    verdict?;
    let mut s = lock(&shared.state);
    if sub != s.options.subscription {
        return Err(error(
            404,
            "SubscriptionNotFound",
            &format!("The subscription '{sub}' could not be found."),
        ));
    }
    if let Some(rg) = rg
        && !rg.eq_ignore_ascii_case(&s.options.resource_group)
    {
        return Err(error(
            404,
            "ResourceGroupNotFound",
            &format!("Resource group '{rg}' could not be found."),
        ));
    }
    if !query(raw)
        .iter()
        .any(|(k, v)| k == "api-version" && !v.is_empty())
    {
        return Err(error(
            400,
            "MissingApiVersionParameter",
            "The api-version query parameter (?api-version=) is required for all requests.",
        ));
    }
    let bucket = if write { &mut s.writes } else { &mut s.reads };
    if let Err(wait) = bucket.take() {
        let kind = if write { "write" } else { "read" };
        return Err(error(
            429,
            "TooManyRequests",
            &format!("The subscription has exceeded its {kind} request limit. Please try again after {wait} seconds."),
        )
        .with_header("retry-after", wait.to_string()));
    }
    match injected {
        Some(answer) => Err(answer),
        None => {
            s.settle();
            Ok(())
        }
    }
}

/// An answer with the budget headers of now.
fn finish(shared: &Shared, write: bool, answer: Answer) -> Response {
    let s = lock(&shared.state);
    let (name, left) = if write {
        (
            "x-ms-ratelimit-remaining-subscription-writes",
            s.writes.left,
        )
    } else {
        ("x-ms-ratelimit-remaining-subscription-reads", s.reads.left)
    };
    answer
        .with_header(name, (left.max(0.0).floor() as u64).to_string())
        .with_header(
            "x-ms-request-id",
            format!("{:032x}", rand::random::<u128>()),
        )
        .into_response()
}

fn not_found(kind: &str, name: &str, rg: &str) -> Answer {
    error(
        404,
        "ResourceNotFound",
        &format!(
            "The Resource '{kind}/{name}' under resource group '{rg}' was not found. For more details please go to https://aka.ms/ARMResourceNotFoundFix"
        ),
    )
}

/// A VM name Linux VMs take: 1 to 64 letters, digits, `-`, `_` and `.`,
/// not ending in `.` or `-`, not starting with `_`.
fn valid_vm_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
        && !b[0].eq(&b'_')
        && !matches!(b[b.len() - 1], b'.' | b'-')
}

fn check_tags(tags: Option<&Value>) -> Result<Map<String, Value>, Answer> {
    let Some(tags) = tags else {
        return Ok(Map::new());
    };
    let Some(map) = tags.as_object() else {
        return Err(error(
            400,
            "InvalidRequestContent",
            "The request content was invalid: tags must be an object.",
        ));
    };
    if map.len() > MAX_TAGS {
        return Err(error(
            400,
            "InvalidTag",
            &format!(
                "The resource has {} tags; at most {MAX_TAGS} are allowed.",
                map.len()
            ),
        ));
    }
    for (k, v) in map {
        let Some(v) = v.as_str() else {
            return Err(error(
                400,
                "InvalidRequestContent",
                &format!("The value of tag '{k}' must be a string."),
            ));
        };
        if k.is_empty() || k.len() > MAX_TAG_NAME || k.chars().any(|c| "<>%&\\?/".contains(c)) {
            return Err(error(
                400,
                "InvalidTagNameCharacters",
                &format!("The tag name '{k}' has invalid characters or length."),
            ));
        }
        if v.len() > MAX_TAG_VALUE {
            return Err(error(
                400,
                "InvalidTag",
                &format!("The value of tag '{k}' is longer than {MAX_TAG_VALUE} characters."),
            ));
        }
    }
    Ok(map.clone())
}

fn invalid(message: &str, target: &str) -> Answer {
    Answer::json(
        400,
        &json!({"error": {"code": "InvalidParameter", "message": message, "target": target}}),
    )
}

fn async_headers(shared: &Shared, answer: Answer, op: &str) -> Answer {
    let addr = lock(&shared.addr)
        .map(|a| a.to_string())
        .unwrap_or_default();
    let s = lock(&shared.state);
    let url = format!(
        "http://{addr}/subscriptions/{}/providers/Microsoft.Compute/locations/{}/operations/{op}?api-version={COMPUTE_API}",
        s.options.subscription, s.options.location
    );
    answer
        .with_header("azure-asyncoperation", url.clone())
        .with_header("location", format!("{url}&monitor=true"))
        .with_header("retry-after", "10")
}

async fn vm(
    State(shared): State<Shared>,
    method: Method,
    headers: HeaderMap,
    Path((sub, rg, name)): Path<(String, String, String)>,
    RawQuery(raw): RawQuery,
    body: Bytes,
) -> Response {
    let (op, write) = match method {
        Method::PUT => ("vm.put", true),
        Method::PATCH => ("vm.patch", true),
        Method::DELETE => ("vm.delete", true),
        _ => ("vm.get", false),
    };
    if let Err(a) = admit(
        &shared,
        &headers,
        &sub,
        Some(&rg),
        raw.as_deref(),
        write,
        op,
    ) {
        return finish(&shared, write, a);
    }
    let answer = match method {
        Method::PUT => put_vm(&shared, &rg, &name, &body),
        Method::PATCH => patch_vm(&shared, &rg, &name, &body),
        Method::DELETE => delete_vm(&shared, &name),
        _ => {
            let expand = query(raw.as_deref())
                .iter()
                .any(|(k, v)| k == "$expand" && v == "instanceView");
            let s = lock(&shared.state);
            match s.vms.get(&name).filter(|v| !v.gone) {
                Some(vm) => Answer::json(200, &s.view(vm, expand)),
                None => not_found("Microsoft.Compute/virtualMachines", &name, &rg),
            }
        }
    };
    if answer.status < 300 && matches!(method, Method::PUT | Method::DELETE) {
        shared.knobs.held(op).await;
    }
    finish(&shared, write, answer)
}

fn put_vm(shared: &Shared, rg: &str, name: &str, body: &[u8]) -> Answer {
    let request: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return error(
                400,
                "InvalidRequestContent",
                &format!("The request content was invalid and could not be deserialized: {e}"),
            );
        }
    };
    if !valid_vm_name(name) {
        return invalid(&format!("The VM name '{name}' is invalid."), "name");
    }
    let tags = match check_tags(request.get("tags")) {
        Ok(t) => t,
        Err(a) => return a,
    };
    let mut s = lock(&shared.state);
    let location = request
        .get("location")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !location.eq_ignore_ascii_case(&s.options.location) {
        return error(
            400,
            "LocationRequired",
            "The location property is required for this definition.",
        );
    }
    let props = request.get("properties").cloned().unwrap_or(Value::Null);
    let Some(size) = props
        .pointer("/hardwareProfile/vmSize")
        .and_then(Value::as_str)
    else {
        return invalid(
            "Required parameter 'hardwareProfile.vmSize' is missing (null).",
            "hardwareProfile.vmSize",
        );
    };
    let Some(cores) = SIZES
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(size))
        .map(|s| s.1)
    else {
        return invalid(
            &format!("The value {size} provided for the VM size is not valid."),
            "vmSize",
        );
    };
    if let Some(existing) = s.vms.get(name).filter(|v| !v.gone) {
        // A PUT again: an update of what may change (tags), the rest must
        // be as it was.
        if existing.deleting.is_some() {
            return error(
                409,
                "OperationNotAllowed",
                &format!(
                    "Operation 'PUT' is not allowed on VM '{name}' since the VM is marked for deletion."
                ),
            );
        }
        if !existing.size.eq_ignore_ascii_case(size) {
            return error(
                409,
                "PropertyChangeNotAllowed",
                "Changing property 'hardwareProfile.vmSize' is not allowed while the VM is provisioning.",
            );
        }
        let view = {
            let vm = s.vms.get_mut(name).expect("present");
            vm.tags = tags;
            vm.clone()
        };
        return Answer::json(200, &s.view(&view, false));
    }
    if s.unavailable.iter().any(|u| u.eq_ignore_ascii_case(size)) {
        return error(
            409,
            "SkuNotAvailable",
            &format!(
                "The requested VM size for resource 'Following SKUs have failed for Capacity Restrictions: {size}' is currently not available in location '{}'. Please try another size or deploy to a different location or different zone.",
                s.options.location
            ),
        );
    }
    if props.pointer("/storageProfile/imageReference").is_none() {
        return invalid(
            "Required parameter 'storageProfile.imageReference' is missing (null).",
            "imageReference",
        );
    }
    let os = props.get("osProfile").cloned().unwrap_or(Value::Null);
    if os
        .get("adminUsername")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return invalid(
            "Required parameter 'osProfile.adminUsername' is missing (null).",
            "adminUsername",
        );
    }
    let keys = os
        .pointer("/linuxConfiguration/ssh/publicKeys")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    if keys == 0 && os.get("adminPassword").is_none() {
        return invalid(
            "Required parameter 'adminPassword' is missing (null).",
            "adminPassword",
        );
    }
    if os
        .get("customData")
        .and_then(Value::as_str)
        .is_some_and(|c| c.len() > MAX_CUSTOM_DATA_B64 || base64_decode(c).is_none())
    {
        return invalid(
            "Custom data in OSProfile must be in Base64 encoding and with a maximum length of 87380 characters.",
            "customData",
        );
    }
    let Some(configs) = props
        .pointer("/networkProfile/networkInterfaceConfigurations")
        .and_then(Value::as_array)
        .filter(|c| !c.is_empty())
    else {
        return invalid(
            "Required parameter 'networkProfile' is missing (null).",
            "networkProfile",
        );
    };
    for c in configs {
        let subnet = c
            .pointer("/properties/ipConfigurations/0/properties/subnet/id")
            .and_then(Value::as_str);
        if subnet.is_none_or(|id| !id.contains("/providers/Microsoft.Network/virtualNetworks/")) {
            return invalid(
                "Subnet id is missing or invalid in the network interface configuration.",
                "subnet",
            );
        }
    }
    let used: u32 = (s.vms.values())
        .filter(|v| !v.gone)
        .map(|v| {
            SIZES
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(&v.size))
                .map_or(0, |s| s.1)
        })
        .sum();
    if used + cores > s.options.core_quota {
        let (loc, limit) = (s.options.location.clone(), s.options.core_quota);
        return error(
            409,
            "OperationNotAllowed",
            &format!(
                "Operation could not be completed as it results in exceeding approved Total Regional Cores quota. Additional details - Deployment Model: Resource Manager, Location: {loc}, Current Limit: {limit}, Current Usage: {used}, Additional Required: {cores}, (Minimum) New Limit Required: {}.",
                used + cores
            ),
        );
    }
    s.next += 1;
    let n = s.next;
    let fails = (!s.failing.is_empty()).then(|| s.failing.remove(0));
    for c in configs {
        let nic = c
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("nic")
            .to_owned();
        let delete = c
            .pointer("/properties/deleteOption")
            .and_then(Value::as_str)
            == Some("Delete");
        s.made.push(Made {
            kind: "nic",
            name: nic,
            delete_with_vm: delete,
            deleted: false,
            vm: name.into(),
        });
        if let Some(pip) =
            c.pointer("/properties/ipConfigurations/0/properties/publicIPAddressConfiguration")
        {
            let pname = pip
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("pip")
                .to_owned();
            let delete = pip
                .pointer("/properties/deleteOption")
                .and_then(Value::as_str)
                == Some("Delete");
            s.made.push(Made {
                kind: "pip",
                name: pname,
                delete_with_vm: delete,
                deleted: false,
                vm: name.into(),
            });
        }
    }
    let disk_delete = props
        .pointer("/storageProfile/osDisk/deleteOption")
        .and_then(Value::as_str)
        == Some("Delete");
    s.made.push(Made {
        kind: "disk",
        name: format!("{name}_OsDisk_1_{n:032x}"),
        delete_with_vm: disk_delete,
        deleted: false,
        vm: name.into(),
    });
    let has_pip = s
        .made
        .iter()
        .any(|m| m.vm == name && m.kind == "pip" && !m.deleted);
    let vm = Vm {
        name: name.into(),
        vm_id: format!("{n:08x}-1111-4000-8000-{n:012x}"),
        size: size.into(),
        body: json!({"properties": props}),
        tags,
        made: Instant::now(),
        fails: fails.clone(),
        deleting: None,
        gone: false,
        private_ip: format!("10.0.{}.{}", n / 250, n % 250 + 4),
        public_ip: has_pip.then(|| format!("198.51.100.{}", n % 250 + 1)),
    };
    let boot = s.options.boot;
    s.vms.insert(name.into(), vm.clone());
    let op = s.operation(boot, fails);
    let view = s.view(&vm, false);
    let _ = rg;
    drop(s);
    async_headers(shared, Answer::json(201, &view), &op)
}

fn patch_vm(shared: &Shared, rg: &str, name: &str, body: &[u8]) -> Answer {
    let request: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return error(
                400,
                "InvalidRequestContent",
                &format!("The request content was invalid and could not be deserialized: {e}"),
            );
        }
    };
    let tags = match request.get("tags").map(|t| check_tags(Some(t))).transpose() {
        Ok(t) => t,
        Err(a) => return a,
    };
    let mut s = lock(&shared.state);
    let Some(vm) = s.vms.get_mut(name).filter(|v| !v.gone) else {
        return not_found("Microsoft.Compute/virtualMachines", name, rg);
    };
    if vm.deleting.is_some() {
        return error(
            409,
            "OperationNotAllowed",
            &format!(
                "Operation 'PATCH' is not allowed on VM '{name}' since the VM is marked for deletion."
            ),
        );
    }
    if let Some(tags) = tags {
        vm.tags = tags;
    }
    let vm = vm.clone();
    Answer::json(200, &s.view(&vm, false))
}

fn delete_vm(shared: &Shared, name: &str) -> Answer {
    let mut s = lock(&shared.state);
    let Some(vm) = s.vms.get_mut(name).filter(|v| !v.gone) else {
        // ARM answers a DELETE of what is not there with 204.
        return Answer {
            status: 204,
            headers: vec![],
            body: String::new(),
        };
    };
    if vm.deleting.is_none() {
        vm.deleting = Some(Instant::now());
    }
    let deletion = s.options.deletion;
    let op = s.operation(deletion, None);
    drop(s);
    async_headers(
        shared,
        Answer {
            status: 202,
            headers: vec![],
            body: String::new(),
        },
        &op,
    )
}

async fn list_vms(
    State(shared): State<Shared>,
    headers: HeaderMap,
    Path((sub, rg)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
) -> Response {
    if let Err(a) = admit(
        &shared,
        &headers,
        &sub,
        Some(&rg),
        raw.as_deref(),
        false,
        "vm.list",
    ) {
        return finish(&shared, false, a);
    }
    let pairs = query(raw.as_deref());
    // The skip token is the last name of the page before (VMs list by
    // name): a VM made meanwhile never shows twice.
    let after = (pairs.iter())
        .find(|(k, _)| k == "$skiptoken")
        .map(|(_, v)| v.clone());
    if after.as_deref().is_some_and(|t| !valid_vm_name(t)) {
        return finish(
            &shared,
            false,
            error(400, "InvalidSkipToken", "The skip token is invalid."),
        );
    }
    let addr = lock(&shared.addr)
        .map(|a| a.to_string())
        .unwrap_or_default();
    let s = lock(&shared.state);
    let visible: Vec<&Vm> = (s.vms.values())
        .filter(|v| !v.gone && shared.knobs.listed(v.made))
        .filter(|v| after.as_ref().is_none_or(|a| v.name > *a))
        .collect();
    let page: Vec<&Vm> = visible.iter().take(s.options.page_size).copied().collect();
    let mut body = json!({"value": page.iter().map(|v| s.view(v, false)).collect::<Vec<_>>()});
    if let (true, Some(last)) = (visible.len() > page.len(), page.last()) {
        body["nextLink"] = json!(format!(
            "http://{addr}{}/providers/Microsoft.Compute/virtualMachines?api-version={COMPUTE_API}&$skiptoken={}",
            s.base(),
            last.name
        ));
    }
    drop(s);
    finish(&shared, false, Answer::json(200, &body))
}

/// `GET` of a network interface or public IP address a VM made.
async fn network(
    State(shared): State<Shared>,
    headers: HeaderMap,
    Path((sub, rg, kind, name)): Path<(String, String, String, String)>,
    RawQuery(raw): RawQuery,
) -> Response {
    let (made, op) = match kind.as_str() {
        "networkInterfaces" => ("nic", "nic.get"),
        "publicIPAddresses" => ("pip", "pip.get"),
        _ => return no_route().await,
    };
    let admitted = admit(
        &shared,
        &headers,
        &sub,
        Some(&rg),
        raw.as_deref(),
        false,
        op,
    );
    if let Err(a) = admitted {
        return finish(&shared, false, a);
    }
    let s = lock(&shared.state);
    let found = (s.made.iter())
        .find(|m| m.kind == made && m.name == name && !m.deleted)
        .and_then(|m| s.vms.get(&m.vm));
    let answer = match (found, made) {
        (None, _) => not_found(&format!("Microsoft.Network/{kind}"), &name, &rg),
        (Some(vm), "nic") => {
            let pip = (s.made.iter())
                .find(|p| p.vm == vm.name && p.kind == "pip" && !p.deleted)
                .map(|p| json!({"id": format!("{}/providers/Microsoft.Network/publicIPAddresses/{}", s.base(), p.name)}));
            let mut config = json!({"name": "ipconfig", "properties": {
                "privateIPAddress": vm.private_ip, "privateIPAllocationMethod": "Dynamic", "primary": true}});
            if let Some(pip) = pip {
                config["properties"]["publicIPAddress"] = pip;
            }
            Answer::json(
                200,
                &json!({
                    "name": name,
                    "id": format!("{}/providers/Microsoft.Network/networkInterfaces/{name}", s.base()),
                    "properties": {"provisioningState": "Succeeded", "ipConfigurations": [config],
                                   "virtualMachine": {"id": format!("{}/providers/Microsoft.Compute/virtualMachines/{}", s.base(), vm.name)}},
                }),
            )
        }
        (Some(vm), _) => Answer::json(
            200,
            &json!({
                "name": name,
                "properties": {"provisioningState": "Succeeded", "publicIPAllocationMethod": "Static",
                               "ipAddress": vm.public_ip},
            }),
        ),
    };
    drop(s);
    finish(&shared, false, answer)
}

async fn operation(
    State(shared): State<Shared>,
    headers: HeaderMap,
    Path((sub, _loc, id)): Path<(String, String, String)>,
    RawQuery(raw): RawQuery,
) -> Response {
    if let Err(a) = admit(
        &shared,
        &headers,
        &sub,
        None,
        raw.as_deref(),
        false,
        "operation.get",
    ) {
        return finish(&shared, false, a);
    }
    let s = lock(&shared.state);
    let answer = match s.operations.get(&id) {
        None => error(
            404,
            "NotFound",
            &format!("The operation '{id}' was not found."),
        ),
        Some(o) => {
            let done = Instant::now() >= o.done_at;
            let mut body = json!({"name": id, "startTime": o.started,
                "status": match (done, &o.error) { (false, _) => "InProgress", (true, None) => "Succeeded", (true, Some(_)) => "Failed" }});
            if let (true, Some((code, message))) = (done, &o.error) {
                body["error"] = json!({"code": code, "message": message});
                body["endTime"] = json!(rfc3339(o.done_at));
            }
            Answer::json(200, &body)
        }
    };
    drop(s);
    finish(&shared, false, answer)
}

async fn no_route() -> Response {
    error(
        404,
        "InvalidResourceType",
        "The resource type could not be found in the namespace.",
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_refill_at_their_rate() {
        let mut b = Bucket::new((2, 1));
        assert!(b.take().is_ok() && b.take().is_ok());
        assert_eq!(b.take(), Err(1));
    }

    #[test]
    fn names_and_tags_follow_the_documented_rules() {
        assert!(valid_vm_name("n-00000000000000ab"));
        assert!(valid_vm_name("a.b_c"));
        for bad in ["", "_a", "a-", "a.", "a b", &"n".repeat(65)] {
            assert!(!valid_vm_name(bad), "{bad}");
        }
        let ok = json!({"berth-pool": "p", "k": "v".repeat(256)});
        assert!(check_tags(Some(&ok)).is_ok());
        for bad in [
            json!({"a/b": "v"}),
            json!({"k": "v".repeat(257)}),
            json!({"k": 1}),
            Value::Object((0..51).map(|i| (format!("k{i}"), json!("v"))).collect()),
        ] {
            assert!(check_tags(Some(&bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn base64_round_trips() {
        assert_eq!(
            base64_decode("IyEvYmluL3NoCg==").as_deref(),
            Some(&b"#!/bin/sh\n"[..])
        );
        assert_eq!(base64_decode("not base64!"), None);
    }
}
