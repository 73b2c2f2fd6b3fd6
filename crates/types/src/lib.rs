//! The JSON bodies of the HTTP API, shared by the server and the CLI client.
//! Field names are the API's: changing one is a breaking change of `/v1`.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub use berth_core::duration::rfc3339;

/// `POST /v1/requests`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewRequest {
    /// Label name → how many nodes of it; all are handed out together.
    #[serde(deserialize_with = "each_key_once")]
    pub labels: BTreeMap<String, u32>,
    /// Who the nodes are for. A client token acts as its own name and may
    /// leave this out; an admin names anyone (default: its token's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requestor: Option<String>,
    /// Lower is served first; default 0.
    #[serde(default)]
    pub priority: i32,
    /// The client's own keys and values, shown on the request and on the
    /// nodes handed out to it, and filtered by (`?meta.KEY=VALUE`). At
    /// most 32 keys and 4096 bytes in all; a key is 1 to 64 of `A-Z a-z
    /// 0-9 . _ - /`, a value at most 512 bytes.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "each_key_once"
    )]
    pub metadata: BTreeMap<String, String>,
}

/// A map whose keys are each given once: `{"small": 1, "small": 2}` is
/// refused, not read as whichever came last.
fn each_key_once<'de, D: serde::Deserializer<'de>, V: Deserialize<'de>>(
    d: D,
) -> Result<BTreeMap<String, V>, D::Error> {
    struct Once<V>(std::marker::PhantomData<V>);
    impl<'de, V: Deserialize<'de>> serde::de::Visitor<'de> for Once<V> {
        type Value = BTreeMap<String, V>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object whose keys are each given once")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(key) = map.next_key::<String>()? {
                if out.contains_key(&key) {
                    return Err(serde::de::Error::custom(format!(
                        "the key `{}` is given twice",
                        berth_core::text::printable(&key)
                    )));
                }
                let value = map.next_value()?;
                out.insert(key, value);
            }
            Ok(out)
        }
    }
    d.deserialize_map(Once(std::marker::PhantomData))
}

/// A node-set request as the API shows it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Request {
    pub id: String,
    pub requestor: String,
    pub priority: i32,
    /// `pending`, `fulfilled`, `failed` or `cancelled`.
    pub state: String,
    /// Why it failed, in words a person can act on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The last failed launch try made for it: which node, on which
    /// provider, and why ("node n-… on provider `sim`: …"). Set from the
    /// first failed try on, whatever its state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<String>,
    pub labels: BTreeMap<String, u32>,
    /// RFC 3339, UTC.
    pub created: String,
    /// When it stopped being pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished: Option<String>,
    /// Its nodes: once fulfilled, every node with its connection details.
    pub nodes: Vec<Node>,
    /// The `Idempotency-Key` it was made with, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The metadata it was made with.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// While it is pending: what holds it back, for each of its nodes set
    /// aside and not handed out yet, and for the nodes it has none for
    /// yet, per provider offering them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<Waiting>,
}

/// One thing a pending request waits for.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Waiting {
    /// The label of the nodes that wait.
    pub label: String,
    /// How many of its nodes wait for it.
    pub nodes: u32,
    /// The node set aside for the request that waits, if one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The provider concerned, if one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// `creating`, `backing` (a slot's backing instance is not running
    /// yet), `booting`, `probing` (its readiness probe has not passed
    /// yet), `others` (ready; the request's other nodes are not),
    /// `not-listed` (the provider has not been listed since berth started:
    /// its driver is starting or failing), `store-mismatch`, `quota` (the
    /// cloud's quota), `rate-limit` (the cloud's), `capacity` (the cloud
    /// has none for the instance type), `limit` (the provider's own
    /// `max-instances`, `max-cores` or `max-ram`), `no-provider` (no
    /// provider offers the label any more), `together` (each label has
    /// room on its own, not all of them together), `kept` (there is room,
    /// but it is kept for a request ahead that has waited longer than
    /// `reserve-after`), `cap` (its nodes would take its requestor or a
    /// label over `max-nodes`), `next` (nothing holds
    /// it back: the next step serves it) or `inbox` (accepted by a process
    /// standing by; the pool's holder has not taken it in yet).
    pub reason: String,
    /// RFC 3339, UTC: when the wait ends, if that is known (a pause).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    /// The same, in words.
    pub detail: String,
}

/// A node as the API shows it. `addresses` and `connection` are left out for
/// a client that does not hold the node.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Node {
    pub id: String,
    pub label: String,
    pub provider: String,
    /// `creating`, `booting`, `ready`, `in-use`, `used`, `deleting`, `gone`
    /// or `failed`.
    pub state: String,
    /// Why it is deleting, gone or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Why its last failed launch try failed: the cloud's reason for a
    /// failed instance, the driver's error for a failed create, a boot
    /// timeout. Set once a try of it failed, whatever its state; a node
    /// launched on a later try keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// `run`, `hold` or `drain`.
    pub idle: String,
    pub instance_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// The request it is handed out to (in use) or set aside for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requestor: Option<String>,
    /// That request's metadata, shown to its requestor and to admins.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// When it entered its state.
    pub since: String,
    pub created: String,
    /// For a slot node, the node whose instance it shares and its slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<Slot>,
    /// For a backing node, the slot nodes its instance hosts. Such a node is
    /// never handed out itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosting: Option<Hosting>,
    /// Set when the provider's lists stopped showing its instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing: Option<MissingInstance>,
    /// Set while its instance runs and its label's readiness probe has not
    /// passed yet (the node is `booting`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<Probe>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addresses: Option<Addresses>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<Connection>,
}

/// How a running node's readiness probes stand (`ready = "tcp"` or `"ssh"`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Probe {
    /// `tcp` or `ssh`.
    pub check: String,
    /// When its instance was first seen running.
    pub since: String,
    /// Probes that ended without the node being ready.
    pub failed: u32,
    /// Why the last one failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// A node whose instance the provider's lists stopped showing.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct MissingInstance {
    /// When a list first did not show it.
    pub since: String,
    /// `suspected` (lists do not show it; nothing changes until it is
    /// confirmed) or `confirmed` (gone while in use: the node stays with its
    /// holder and is deleted once released).
    pub state: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Slot {
    pub backing: String,
    pub index: u16,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Hosting {
    /// The slot label whose nodes it hosts.
    pub label: String,
    /// Slots taken by a node.
    pub used: u16,
    pub slots: u16,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Addresses {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_ipv4: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_ipv4: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Connection {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_keys: Vec<String>,
}

/// `PUT /v1/nodes/{id}/idle`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetIdle {
    /// `run`, `hold` or `drain`.
    pub idle: String,
}

/// A configured label, with what the pool has of it now.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Label {
    pub name: String,
    /// `machine` or `slots`.
    pub kind: String,
    /// The `min-ready` in force now: a schedule's window may set it.
    pub min_ready: u32,
    /// Nodes (or free slots) ready to hand out now.
    pub ready: usize,
    /// Live nodes by state.
    pub nodes: BTreeMap<String, usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backing_label: Option<String>,
    /// Where a machine label's nodes can be launched.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub offers: Vec<Offer>,
    /// Removed from the config file while berth runs: asked for no more,
    /// and its nodes drained (deleted once idle). Listed until berth
    /// stops. Absent while false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removed: bool,
    /// How long its nodes took from their launch to ready: of its last 256
    /// nodes this berth process saw become ready. Absent until one has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_to_ready: Option<TimeToReady>,
}

/// How long a label's nodes took from their launch to ready.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct TimeToReady {
    /// The median, in seconds.
    pub p50_s: f64,
    /// The 95th percentile (nearest rank), in seconds.
    pub p95_s: f64,
    /// Of how many nodes.
    pub nodes: usize,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Offer {
    pub provider: String,
    pub instance_type: String,
    pub vcpus: u32,
    pub ram_mib: u64,
    /// Per hour.
    pub price: f64,
}

/// A configured provider and its health.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Provider {
    pub name: String,
    /// The driver's file name.
    pub driver: String,
    pub priority: i32,
    /// `ok`; `starting` or `failed` (its driver: see `start_error`);
    /// `list-failing` or `list-suspect` (its lists: see `list_error`);
    /// `store-mismatch` (see `store_mismatch`); `credential-failing` (a
    /// credential could not be read or exchanged: see `credentials`); or
    /// why creates or calls
    /// are held right now (`rate-limited`, `quota-paused`,
    /// `not-listed-yet`, `capacity-paused`).
    pub status: String,
    pub limits: Limits,
    pub usage: Usage,
    /// Listed at least once since start (creates wait for that).
    pub listed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_paused_until: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limited_until: Option<String>,
    /// Instance types without capacity (`*`: all), until when.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capacity_paused: BTreeMap<String, String>,
    pub leaks_pending: usize,
    pub leaks_deleted: u64,
    /// The latest driver calls' outcome and duration.
    pub calls: CallStats,
    /// Why the provider's driver could not start (status `failed`); it is
    /// tried again with backoff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_error: Option<String>,
    /// Why its lists are not believed (status `list-failing` or
    /// `list-suspect`), and since when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub list_error: Option<String>,
    /// When the last list berth believed started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_listed: Option<String>,
    /// Nodes whose instance its lists stopped showing.
    pub missing: usize,
    /// Why nothing is created on the provider (status `store-mismatch`):
    /// the store has not faced the clouds yet (it is new, emptied or
    /// replaced) and the provider has instances of the pool that it cannot
    /// vouch for, listed in `quarantined`. Put back the store that made
    /// them, delete them in the cloud, or adopt them on purpose (`berth
    /// serve --adopt-instances`; docs/tags.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_mismatch: Option<String>,
    /// Instances with the pool's tags that berth neither hands out nor
    /// deletes: the store cannot vouch for them (no signature, another
    /// store's, or one that does not match), or their tags say they are in
    /// use. For a person to look at (docs/tags.md); as the last believed
    /// list showed them, by instance id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quarantined: Vec<QuarantinedInstance>,
    /// The berth process that holds the provider (with a store shared by
    /// several processes): only it sends the provider's calls (launches,
    /// deletes, lists), as the pool's holder decides them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// When the holder's lease expires unless it renews it (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_expires: Option<String>,
    /// The credentials the host adds to the driver's requests, one per
    /// `[[providers.NAME.credentials]]`, as the process that runs the
    /// driver has them. Never a secret.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<CredentialState>,
    /// Removed from the config file while berth runs: no label offers it,
    /// and its nodes are drained (deleted once idle); it is still listed,
    /// so that nothing on it is lost or leaked. Listed until berth stops.
    /// Absent while false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removed: bool,
}

/// How one credential of a provider is doing ([`Provider::credentials`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct CredentialState {
    /// The host it is added to, as configured.
    pub host: String,
    /// Its kind (`aws-sigv4`, `bearer`, `header`, `keystone`,
    /// `oauth2-client-credentials`, `google-service-account`,
    /// `client-certificate`).
    pub kind: String,
    /// `ok`, `unused` (no request needed it yet: it is read or exchanged
    /// at first use) or `failing` (see `error`).
    pub state: String,
    /// Why the latest read or exchange failed, in the token endpoint's own
    /// words where it gave some.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Since when it fails (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing_since: Option<String>,
    /// Until when the current token works (RFC 3339), for the kinds
    /// exchanged for tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
    /// Reads or exchanges that worked, and that failed, since start.
    pub exchanges: u64,
    pub failures: u64,
    /// Exchanges made early because a host answered `401`.
    pub refreshed_on_401: u64,
    /// Requests sent again with a new token after a `401`.
    pub replays: u64,
}

/// An instance in quarantine ([`Provider::quarantined`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct QuarantinedInstance {
    /// The cloud's instance id.
    pub instance: String,
    /// Its `berth-node` tag, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Why berth neither uses nor deletes it.
    pub why: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Limits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_instances: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cores: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ram_mib: Option<u64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Usage {
    pub instances: u32,
    pub vcpus: u32,
    pub ram_mib: u64,
}

/// Recent driver calls of one provider.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct CallStats {
    /// How many of the recent calls are summarised here.
    pub recent: usize,
    pub errors: usize,
    /// Milliseconds, over the recent calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p50_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99_ms: Option<f64>,
    /// The latest errors, newest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub last_errors: Vec<CallError>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct CallError {
    pub at: String,
    /// `create`, `list`, `delete` or `set-tags`.
    pub call: String,
    pub error: String,
}

/// A loaded driver.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Driver {
    /// The file name without `.wasm`.
    pub file: String,
    pub path: String,
    /// What the driver calls itself, and its version.
    pub name: String,
    pub version: String,
    /// The contract version it was built against (`0.2.0`), read from
    /// what the file exports. (Empty from a berth before contract 0.2.)
    #[serde(default)]
    pub contract: String,
    pub sha256: String,
    /// `compiled` or `cache`.
    pub loaded_from: String,
    pub load_ms: f64,
    /// Providers that use it.
    pub providers: Vec<String>,
    /// The last reload of one of these providers that failed, while they
    /// go on with this driver (the newest, if several did).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reload_error: Option<DriverReloadError>,
    /// The sha256 of the driver these providers ran before their last
    /// switch: `berth driver rollback PROVIDER` returns to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_sha256: Option<String>,
}

/// `POST /v1/config/check`: a config file's text, to compare with the one
/// berth runs.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConfigText {
    /// The whole file, as TOML.
    pub text: String,
}

/// What reading a config file again would change in the running berth.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ConfigCheck {
    /// The file berth runs, whose directory anchors the text's relative
    /// paths.
    pub file: String,
    /// Every difference, in the file's order.
    pub differences: Vec<ConfigDifference>,
    /// What is wrong with the text, each as `path: message` (nothing
    /// changes while there is any).
    pub problems: Vec<String>,
    /// Why a reload of this text would be refused whole, besides its
    /// problems: each difference that cannot change while berth runs, and
    /// each change berth does not yet take while it runs.
    pub reasons: Vec<String>,
    /// Whether a reload of this text would be refused whole: a problem or
    /// a reason.
    pub refused: bool,
}

/// What reading the config file again did (`POST /v1/config/reload`,
/// `SIGHUP`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ConfigReload {
    /// The file berth runs, read again.
    pub file: String,
    /// Whether berth now runs what the file says: every difference was
    /// taken (also when there was none). When not, nothing changed.
    pub applied: bool,
    /// Every difference from the config berth ran, in the file's order.
    pub differences: Vec<ConfigDifference>,
    /// What is wrong with the file, each as `path: message`.
    pub problems: Vec<String>,
    /// Why the reload was refused, besides the file's problems.
    pub reasons: Vec<String>,
}

/// One difference between the running config and a file's.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ConfigDifference {
    /// The dotted key (`labels.small.min-ready`), or a table added or
    /// removed (`providers.sim`).
    pub key: String,
    /// `2 → 4`, `added`, `removed`, or `changed` for what may hold a secret.
    pub what: String,
    /// Whether it can change while berth runs.
    pub live: bool,
}

/// A driver reload that failed: the file was refused, and the provider
/// goes on with the driver it runs.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct DriverReloadError {
    pub provider: String,
    /// The sha256 of the file refused (empty when it could not be read).
    pub sha256: String,
    pub error: String,
    pub at: String,
}

/// What a reload (`POST /v1/drivers/reload`) or a rollback
/// (`POST /v1/drivers/{provider}/rollback`) did with one provider.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct DriverReload {
    pub provider: String,
    /// `unchanged` (its file holds the driver it runs), `switched` (it now
    /// runs the file's driver), `failed` (the file was refused: see
    /// `error`), `passed_over` (the file failed before or was rolled back
    /// from; a reload an operator asks for loads it again) or `not_started`
    /// (its start reads the file anyway).
    pub outcome: String,
    /// The sha256 of the file read (or of the driver a rollback returned to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// The sha256 of the driver it runs now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `POST /v1/lease`: the caller's lease, renewed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Lease {
    pub requestor: String,
    pub expires: String,
    pub ttl_seconds: u64,
}

/// Every error body.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ErrorDetail {
    /// Stable, for programs (see [`ErrorCode`]).
    #[schema(value_type = ErrorCode)]
    pub code: String,
    /// For people.
    pub message: String,
    /// The request field at fault (`bad_request`, `unknown_label`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// The longest a `wait` long-poll is held.
pub const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_of_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(1_795_431_845_123), "2026-11-23T11:04:05.123Z");
        assert_eq!(rfc3339(4_102_444_799_999), "2099-12-31T23:59:59.999Z");
    }

    /// `as_str` is what the server writes, serde what clients read: both
    /// must spell every code the same.
    #[test]
    fn error_codes_spell_as_serde_does() {
        let all = [
            ErrorCode::BadRequest,
            ErrorCode::Unauthorized,
            ErrorCode::Forbidden,
            ErrorCode::NotFound,
            ErrorCode::MethodNotAllowed,
            ErrorCode::BodyTimeout,
            ErrorCode::Conflict,
            ErrorCode::TooLarge,
            ErrorCode::UnsupportedMediaType,
            ErrorCode::UnknownLabel,
            ErrorCode::UnknownProvider,
            ErrorCode::Unsatisfiable,
            ErrorCode::Stopping,
            ErrorCode::Busy,
            ErrorCode::NotReady,
            ErrorCode::StoreUnwritable,
            ErrorCode::StoreUnavailable,
            ErrorCode::Standby,
            ErrorCode::Internal,
        ];
        for code in all {
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
        }
    }

    #[test]
    fn a_new_request_refuses_unknown_fields() {
        let e =
            serde_json::from_str::<NewRequest>(r#"{"labels": {"a": 1}, "prio": 1}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field `prio`"), "{e}");
    }
}

/// A request's state, as `GET /v1/requests?state=` takes it.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RequestStateName {
    Pending,
    Fulfilled,
    Failed,
    Cancelled,
}

/// A node's state, as `GET /v1/nodes?state=` takes it.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum NodeStateName {
    Creating,
    Booting,
    Ready,
    InUse,
    Used,
    Deleting,
    Gone,
    Failed,
}

/// The codes an error body carries: stable, for programs.
#[derive(
    Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, ToSchema, strum::IntoStaticStr,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum ErrorCode {
    BadRequest,
    Unauthorized,
    Forbidden,
    NotFound,
    MethodNotAllowed,
    BodyTimeout,
    Conflict,
    TooLarge,
    UnsupportedMediaType,
    UnknownLabel,
    UnknownProvider,
    Unsatisfiable,
    IdempotencyKeyReused,
    MetadataTooLarge,
    Stopping,
    Busy,
    NotReady,
    StoreUnwritable,
    StoreUnavailable,
    Standby,
    Internal,
}

impl ErrorCode {
    /// The code as an error body spells it (the same word serde writes,
    /// which a test holds).
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Whether the same call is worth making again in a moment, unchanged
    /// (the answer carries `Retry-After`).
    pub fn try_again_soon(self) -> bool {
        matches!(
            self,
            ErrorCode::Busy | ErrorCode::StoreUnavailable | ErrorCode::Standby
        )
    }
}
