//! Rows as stored and their conversion to and from core types. The text of
//! every enum column is the core type's own name for it (`NodeState::name`,
//! `Idle::as_str`…), read back through the same names (`NodeStateName`,
//! `Idle`'s `FromStr`), so the two directions cannot drift apart.

use super::error::StoreError;
use super::value::{Cells, Reader, Val, big};
use berth_core::config::{Config, LabelIx, ProviderIx};
use berth_core::driver::{Addresses, Connection as Login};
use berth_core::pool::{
    DeleteReason, Endpoint, GoneReason, Idle, Metadata, Node, NodeId, NodeState, NodeStateName,
    Packing, PackingName, Request, RequestId, RequestState, RequestStateName, Resources, Time,
};

/// A `nodes` row. A slot node's `slot_backing` and `slot_index` repeat what
/// the `slots` table says while the node is live (the load trusts the table);
/// they are what keeps a finished slot node's packing, since its slot row goes
/// when the slot is freed.
#[derive(Debug)]
pub(super) struct NodeRow {
    pub id: String,
    pub label: String,
    pub provider: String,
    pub instance_type: String,
    pub vcpus: u32,
    pub ram_mib: u64,
    pub price: f64,
    pub instance: Option<String>,
    pub state: &'static str,
    pub since: u64,
    pub attempt: u32,
    pub request: Option<String>,
    pub reason: Option<String>,
    pub idle: &'static str,
    pub packing: &'static str,
    pub slot_label: Option<String>,
    pub slot_count: Option<u16>,
    pub free_since: Option<u64>,
    pub slot_backing: Option<String>,
    pub slot_index: Option<u16>,
    pub assigned: Option<String>,
    pub created: u64,
    pub endpoint: Option<String>,
    /// Why the node's last failed launch try failed (`Node::failure`).
    pub failure: Option<String>,
}

/// A `nodes` row as read: the enum columns are still free text.
pub(super) struct RawNodeRow {
    row: NodeRow,
    state: String,
    idle: String,
    packing: String,
}

impl NodeRow {
    /// The columns of [`NodeRow::into_vals`] and [`NodeRow::read`], in order.
    pub const COLUMNS: &'static str = "id, label, provider, instance_type, vcpus, ram_mib, price, \
        instance, state, since, attempt, request, reason, idle, packing, slot_label, slot_count, \
        free_since, slot_backing, slot_index, assigned, created, endpoint, failure";

    /// The row's values in [`NodeRow::COLUMNS`] order.
    pub fn into_vals(self) -> Result<Vec<Val>, StoreError> {
        let id = self.id.clone();
        let big = |v: u64, what: &str| big(v, &id, what);
        Ok(vec![
            self.id.into(),
            self.label.into(),
            self.provider.into(),
            self.instance_type.into(),
            self.vcpus.into(),
            big(self.ram_mib, "ram_mib")?,
            self.price.into(),
            self.instance.into(),
            self.state.into(),
            big(self.since, "since")?,
            self.attempt.into(),
            self.request.into(),
            self.reason.into(),
            self.idle.into(),
            self.packing.into(),
            self.slot_label.into(),
            self.slot_count.into(),
            match self.free_since {
                Some(t) => big(t, "free_since")?,
                None => Val::Null,
            },
            self.slot_backing.into(),
            self.slot_index.into(),
            self.assigned.into(),
            big(self.created, "created")?,
            self.endpoint.into(),
            self.failure.into(),
        ])
    }

    /// A row read in [`NodeRow::COLUMNS`] order.
    pub fn read<C: Cells + ?Sized>(cells: &C) -> Result<RawNodeRow, StoreError> {
        let r = Reader::new(cells, "nodes")?;
        Ok(RawNodeRow {
            row: NodeRow {
                id: r.id.clone(),
                label: r.text(1, "label")?,
                provider: r.text(2, "provider")?,
                instance_type: r.text(3, "instance_type")?,
                vcpus: r.num(4, "vcpus")?,
                ram_mib: r.num(5, "ram_mib")?,
                price: r.real(6, "price")?,
                instance: r.opt_text(7)?,
                state: "",
                since: r.num(9, "since")?,
                attempt: r.num(10, "attempt")?,
                request: r.opt_text(11)?,
                reason: r.opt_text(12)?,
                idle: "",
                packing: "",
                slot_label: r.opt_text(15)?,
                slot_count: r.opt_num(16, "slot_count")?,
                free_since: r.opt_num(17, "free_since")?,
                slot_backing: r.opt_text(18)?,
                slot_index: r.opt_num(19, "slot_index")?,
                assigned: r.opt_text(20)?,
                created: r.num(21, "created")?,
                endpoint: r.opt_text(22)?,
                failure: r.opt_text(23)?,
            },
            state: r.text(8, "state")?,
            idle: r.text(13, "idle")?,
            packing: r.text(14, "packing")?,
        })
    }

    /// The row for `n`, naming its label and provider as `config` does.
    pub fn encode(n: &Node, config: &Config) -> Result<NodeRow, StoreError> {
        let (since, attempt, request, reason) = match &n.state {
            NodeState::Creating { since, attempt } => (since, *attempt, None, None),
            NodeState::Booting { since }
            | NodeState::Ready { since }
            | NodeState::Used { since } => (since, 0, None, None),
            NodeState::InUse { request, since } => (since, 0, Some(request.to_string()), None),
            NodeState::Deleting { since, reason } => {
                (since, 0, None, Some(reason.as_str().to_owned()))
            }
            NodeState::Gone { since, reason } => (since, 0, None, Some(reason.as_str().to_owned())),
            NodeState::Failed { since, reason } => (since, 0, None, Some(reason.clone())),
        };
        let state = n.state.name();
        let mut row = NodeRow {
            id: n.id.to_string(),
            label: label_name(config, n.label)?.to_owned(),
            provider: provider_name(config, n.provider)?.to_owned(),
            instance_type: n.instance_type.clone(),
            vcpus: n.resources.vcpus,
            ram_mib: n.resources.ram_mib,
            price: n.price,
            instance: n.instance.clone(),
            state,
            since: since.0,
            attempt,
            request,
            reason,
            idle: n.idle.as_str(),
            packing: n.packing.name(),
            slot_label: None,
            slot_count: None,
            free_since: None,
            slot_backing: None,
            slot_index: None,
            assigned: n.assigned.map(|r| r.to_string()),
            created: n.created.0,
            endpoint: None,
            failure: n.failure.clone(),
        };
        match &n.packing {
            Packing::Plain => {}
            Packing::Backing {
                slot_label,
                slots,
                free_since,
            } => {
                row.slot_label = Some(label_name(config, *slot_label)?.to_owned());
                row.slot_count =
                    Some(
                        u16::try_from(slots.len()).map_err(|_| StoreError::Unstorable {
                            node: n.id.to_string(),
                            what: format!("{} slots, more than a slot index can name", slots.len()),
                        })?,
                    );
                row.free_since = free_since.map(|t| t.0);
            }
            Packing::Slot { backing, index } => {
                row.slot_backing = Some(backing.to_string());
                row.slot_index = Some(*index);
            }
        }
        if let Some(e) = &n.endpoint {
            let text = serde_json::to_string(&EndpointRow::from(e.as_ref())).map_err(|e| {
                StoreError::Unstorable {
                    node: n.id.to_string(),
                    what: format!("endpoint: {e}"),
                }
            })?;
            row.endpoint = Some(text);
        }
        Ok(row)
    }
}

/// The note for a node whose row names a label or provider the config no
/// longer has. The node is left out of the snapshot, but its instance (if
/// any) still carries the pool id and its node id: the reconciler finds no
/// node for it in the provider's list, treats it as a leak and deletes it
/// once `leak-grace` has passed (if the provider itself is gone, nothing
/// lists it and the operator has to).
fn unconfigured(id: NodeId, what: &str, name: &str) -> String {
    format!(
        "node {id}: {what} `{name}` is no longer configured; the node is dropped and its \
         instance, if any, will be deleted as a leak"
    )
}

impl RawNodeRow {
    /// The node this row describes; `None` (with a note) if it no longer
    /// fits `config`. The packing of a live slot node is placed later, from the
    /// `slots` table.
    pub fn decode(
        self,
        config: &Config,
        notes: &mut Vec<String>,
    ) -> Result<Option<Node>, StoreError> {
        let RawNodeRow {
            row,
            state,
            idle,
            packing,
        } = self;
        let corrupt = |column: &'static str, what: String| StoreError::Corrupt {
            table: "nodes",
            id: row.id.clone(),
            column,
            what,
        };
        let id: NodeId = row
            .id
            .parse()
            .map_err(|()| corrupt("id", "not a node id".into()))?;
        let Some(label) = config.label(&row.label) else {
            notes.push(unconfigured(id, "label", &row.label));
            return Ok(None);
        };
        let Some(provider) = config.provider(&row.provider) else {
            notes.push(unconfigured(id, "provider", &row.provider));
            return Ok(None);
        };
        let since = Time(row.since);
        let reason = || {
            row.reason
                .as_deref()
                .ok_or_else(|| corrupt("reason", format!("missing for state `{state}`")))
        };
        let unknown = |text: &str| corrupt("reason", format!("unknown `{text}`"));
        let name = state
            .parse::<NodeStateName>()
            .map_err(|_| corrupt("state", format!("unknown `{state}`")))?;
        let decoded = match name {
            NodeStateName::Creating => NodeState::Creating {
                since,
                attempt: row.attempt,
            },
            NodeStateName::Booting => NodeState::Booting { since },
            NodeStateName::Ready => NodeState::Ready { since },
            NodeStateName::InUse => NodeState::InUse {
                request: parse_request(row.request.as_deref(), "request", &corrupt)?,
                since,
            },
            NodeStateName::Used => NodeState::Used { since },
            NodeStateName::Deleting => {
                let text = reason()?;
                NodeState::Deleting {
                    since,
                    reason: text.parse::<DeleteReason>().map_err(|_| unknown(text))?,
                }
            }
            NodeStateName::Gone => {
                let text = reason()?;
                NodeState::Gone {
                    since,
                    reason: text.parse::<GoneReason>().map_err(|_| unknown(text))?,
                }
            }
            NodeStateName::Failed => NodeState::Failed {
                since,
                reason: reason()?.to_owned(),
            },
        };
        let idle = idle
            .parse::<Idle>()
            .map_err(|_| corrupt("idle", format!("unknown `{idle}`")))?;
        let packing = packing
            .parse::<PackingName>()
            .map_err(|_| corrupt("packing", format!("unknown `{packing}`")))?;
        let packing = match packing {
            PackingName::Plain => Packing::Plain,
            PackingName::Backing => {
                let name = row
                    .slot_label
                    .as_deref()
                    .ok_or_else(|| corrupt("slot_label", "missing for a backing node".into()))?;
                let Some(slot_label) = config.label(name) else {
                    notes.push(unconfigured(id, "slot label", name));
                    return Ok(None);
                };
                let count = row
                    .slot_count
                    .ok_or_else(|| corrupt("slot_count", "missing for a backing node".into()))?;
                Packing::Backing {
                    slot_label,
                    slots: vec![None; usize::from(count)],
                    free_since: row.free_since.map(Time),
                }
            }
            PackingName::Slot => {
                let backing = row
                    .slot_backing
                    .as_deref()
                    .ok_or_else(|| corrupt("slot_backing", "missing for a slot node".into()))?;
                Packing::Slot {
                    backing: backing.parse().map_err(|()| {
                        corrupt("slot_backing", format!("not a node id: `{backing}`"))
                    })?,
                    index: row
                        .slot_index
                        .ok_or_else(|| corrupt("slot_index", "missing for a slot node".into()))?,
                }
            }
        };
        let assigned = match row.assigned.as_deref() {
            None => None,
            some => Some(parse_request(some, "assigned", &corrupt)?),
        };
        let endpoint = match row.endpoint.as_deref() {
            None => None,
            Some(text) => {
                let e: EndpointRow =
                    serde_json::from_str(text).map_err(|e| corrupt("endpoint", e.to_string()))?;
                Some(Box::new(Endpoint::from(e)))
            }
        };
        Ok(Some(Node {
            id,
            label,
            provider,
            instance_type: row.instance_type,
            resources: Resources {
                vcpus: row.vcpus,
                ram_mib: row.ram_mib,
            },
            price: row.price,
            instance: row.instance,
            state: decoded,
            idle,
            packing,
            assigned,
            created: Time(row.created),
            endpoint,
            failure: row.failure,
        }))
    }
}

fn parse_request(
    text: Option<&str>,
    column: &'static str,
    corrupt: &impl Fn(&'static str, String) -> StoreError,
) -> Result<RequestId, StoreError> {
    let text = text.ok_or_else(|| corrupt(column, "missing".into()))?;
    text.parse()
        .map_err(|()| corrupt(column, format!("not a request id: `{text}`")))
}

/// A `requests` row; its wants and nodes live in `request_wants` and
/// `request_nodes`.
#[derive(Debug)]
pub(super) struct RequestRow {
    pub id: String,
    pub requestor: String,
    pub priority: i32,
    pub created: u64,
    pub state: String,
    pub at: Option<u64>,
    pub reason: Option<String>,
    pub failures: u32,
    /// The last failed launch try made for it (`Request::last_failure`).
    pub last_failure: Option<String>,
    /// Its idempotency key (`Request::key`).
    pub key: Option<String>,
    /// Its metadata as a JSON object of strings; `None` for none.
    pub metadata: Option<String>,
}

impl RequestRow {
    /// The columns of [`RequestRow::into_vals`] and [`RequestRow::read`], in order.
    pub const COLUMNS: &'static str = "id, requestor, priority, created, state, at, reason, \
                                       failures, last_failure, idempotency_key, metadata";

    /// The row's values in [`RequestRow::COLUMNS`] order.
    pub fn into_vals(self) -> Result<Vec<Val>, StoreError> {
        let big = |v: u64, what: &str| big(v, &self.id, what);
        let (created, at) = (
            big(self.created, "created")?,
            match self.at {
                Some(t) => big(t, "at")?,
                None => Val::Null,
            },
        );
        Ok(vec![
            self.id.into(),
            self.requestor.into(),
            self.priority.into(),
            created,
            self.state.into(),
            at,
            self.reason.into(),
            self.failures.into(),
            self.last_failure.into(),
            self.key.into(),
            self.metadata.into(),
        ])
    }

    /// A row read in [`RequestRow::COLUMNS`] order.
    pub fn read<C: Cells + ?Sized>(cells: &C) -> Result<RequestRow, StoreError> {
        let r = Reader::new(cells, "requests")?;
        Ok(RequestRow {
            id: r.id.clone(),
            requestor: r.text(1, "requestor")?,
            priority: r.num(2, "priority")?,
            created: r.num(3, "created")?,
            state: r.text(4, "state")?,
            at: r.opt_num(5, "at")?,
            reason: r.opt_text(6)?,
            failures: r.num(7, "failures")?,
            last_failure: r.opt_text(8)?,
            key: r.opt_text(9)?,
            metadata: r.opt_text(10)?,
        })
    }

    pub fn encode(r: &Request) -> RequestRow {
        let (at, reason) = match &r.state {
            RequestState::Pending => (None, None),
            RequestState::Fulfilled { at } | RequestState::Cancelled { at } => (Some(at.0), None),
            RequestState::Failed { at, reason } => (Some(at.0), Some(reason.clone())),
        };
        RequestRow {
            id: r.id.to_string(),
            requestor: r.requestor.clone(),
            priority: r.priority,
            created: r.created.0,
            state: r.state.name().to_owned(),
            at,
            reason,
            failures: r.failures,
            last_failure: r.last_failure.clone(),
            key: r.key.clone(),
            metadata: metadata_text(&r.metadata),
        }
    }

    pub fn corrupt(&self, column: &'static str, what: String) -> StoreError {
        StoreError::Corrupt {
            table: "requests",
            id: self.id.clone(),
            column,
            what,
        }
    }

    pub fn parse_id(&self) -> Result<RequestId, StoreError> {
        self.id
            .parse()
            .map_err(|()| self.corrupt("id", "not a request id".into()))
    }

    pub fn decode_state(&self) -> Result<RequestState, StoreError> {
        let at = || {
            self.at
                .map(Time)
                .ok_or_else(|| self.corrupt("at", format!("missing for state `{}`", self.state)))
        };
        let name = self
            .state
            .parse::<RequestStateName>()
            .map_err(|_| self.corrupt("state", format!("unknown `{}`", self.state)))?;
        Ok(match name {
            RequestStateName::Pending => RequestState::Pending,
            RequestStateName::Fulfilled => RequestState::Fulfilled { at: at()? },
            RequestStateName::Failed => RequestState::Failed {
                at: at()?,
                reason: self
                    .reason
                    .clone()
                    .ok_or_else(|| self.corrupt("reason", "missing for state `failed`".into()))?,
            },
            RequestStateName::Cancelled => RequestState::Cancelled { at: at()? },
        })
    }
}

/// A request's metadata as a row keeps it: a JSON object, or `None` when
/// it holds nothing.
pub(super) fn metadata_text(m: &Metadata) -> Option<String> {
    (!m.is_empty()).then(|| serde_json::to_string(m).unwrap_or_default())
}

/// A request's metadata read back from a row, checked as the API checks
/// what a client states (`read_metadata`); what cannot be read is said.
pub(super) fn read_metadata_text(text: Option<&str>) -> Result<Metadata, String> {
    let Some(text) = text else {
        return Ok(Metadata::new());
    };
    let m: Metadata =
        serde_json::from_str(text).map_err(|e| format!("not a JSON object of strings: {e}"))?;
    berth_core::pool::read_metadata(m).map_err(|e| format!("{}: {e}", e.field()))
}

/// The name of label `ix` in `config`. The core's indexes come from the same
/// config the store was opened with, so a miss is a bug, reported rather than
/// a panic.
pub(super) fn label_name(config: &Config, ix: LabelIx) -> Result<&str, StoreError> {
    config
        .labels
        .get(usize::from(ix.0))
        .map(|l| l.name.as_str())
        .ok_or(StoreError::NoSuchIndex {
            what: "label",
            index: ix.0,
        })
}

fn provider_name(config: &Config, ix: ProviderIx) -> Result<&str, StoreError> {
    config
        .providers
        .get(usize::from(ix.0))
        .map(|p| p.name.as_str())
        .ok_or(StoreError::NoSuchIndex {
            what: "provider",
            index: ix.0,
        })
}

/// An endpoint as stored (JSON text): core types do not derive serde.
#[derive(serde::Serialize, serde::Deserialize)]
struct EndpointRow {
    public_ipv4: Option<String>,
    private_ipv4: Option<String>,
    ipv6: Option<String>,
    hostname: Option<String>,
    username: Option<String>,
    port: Option<u16>,
    #[serde(default)]
    host_keys: Vec<String>,
}

impl From<&Endpoint> for EndpointRow {
    fn from(e: &Endpoint) -> Self {
        EndpointRow {
            public_ipv4: e.addresses.public_ipv4.clone(),
            private_ipv4: e.addresses.private_ipv4.clone(),
            ipv6: e.addresses.ipv6.clone(),
            hostname: e.addresses.hostname.clone(),
            username: e.connection.username.clone(),
            port: e.connection.port,
            host_keys: e.connection.host_keys.clone(),
        }
    }
}

impl From<EndpointRow> for Endpoint {
    fn from(r: EndpointRow) -> Self {
        Endpoint {
            addresses: Addresses {
                public_ipv4: r.public_ipv4,
                private_ipv4: r.private_ipv4,
                ipv6: r.ipv6,
                hostname: r.hostname,
            },
            connection: Login {
                username: r.username,
                port: r.port,
                host_keys: r.host_keys,
            },
        }
    }
}
