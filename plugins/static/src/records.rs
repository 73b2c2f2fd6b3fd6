//! What the driver keeps in the host's records, and under which keys.
//!
//! - `slot/HOST/INDEX` → a [`Record`] (JSON): the slot is taken. The key
//!   holds no pool id on purpose: a slot is a share of a real machine, so
//!   every pool whose records share this provider's space competes for the
//!   same keys and no host is ever booked twice. The record names its pool,
//!   and the driver never lists, tags or frees another pool's records.
//! - `node/POOL/NODE` → the instance id (`HOST/INDEX`) of the node's slot,
//!   both parts percent-encoded. It decides which claim wins when two creates
//!   for one node id run at once (see `Static::create`).
//!
//! A record is replaced only with compare-and-swap against the exact text
//! read, so two driver instances never overwrite each other's change.

use std::fmt::Display;

use berth_sdk::error;
use berth_sdk::http::encode_component;
use berth_sdk::types::{Error, Tags};
use serde::{Deserialize, Serialize};

/// Prefix of every slot key.
pub(crate) const SLOT_PREFIX: &str = "slot/";
/// The host's longest key, in bytes.
const MAX_KEY: usize = 256;
/// The host's longest value, in bytes.
const MAX_VALUE: usize = 64 * 1024;

/// One slot of one host: also the instance id berth sees, `HOST/INDEX`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct SlotId {
    pub host: String,
    pub index: u32,
}

impl SlotId {
    /// Reads an instance id. Host names never hold `/` (the config refuses
    /// it), so the last `/` separates the index.
    pub fn parse(id: &str) -> Option<SlotId> {
        let (host, index) = id.rsplit_once('/')?;
        if host.is_empty() || host.contains('/') {
            return None;
        }
        // Only the canonical form, so one slot has one id.
        let index: u32 = index
            .parse()
            .ok()
            .filter(|i: &u32| i.to_string() == index)?;
        Some(SlotId {
            host: host.to_owned(),
            index,
        })
    }

    /// Reads a slot key.
    pub fn from_key(key: &str) -> Option<SlotId> {
        SlotId::parse(key.strip_prefix(SLOT_PREFIX)?)
    }

    /// The key of the slot's record.
    pub fn key(&self) -> String {
        format!("{SLOT_PREFIX}{self}")
    }
}

impl Display for SlotId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.host, self.index)
    }
}

/// The key naming which slot serves `node` of `pool`. Fails (for good) when
/// the ids are too long for the host's keys.
pub(crate) fn node_key(pool: &str, node: &str) -> Result<String, Error> {
    let key = format!("node/{}/{}", encode_component(pool), encode_component(node));
    if key.len() > MAX_KEY {
        return Err(error::permanent(format!(
            "pool id and node id are too long for a record key ({} bytes encoded, at most {MAX_KEY})",
            key.len()
        )));
    }
    Ok(key)
}

/// A taken slot. Field names are the stored JSON's; unknown fields are
/// ignored so that a newer driver's records still read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct Record {
    /// The pool that holds the slot.
    pub pool: String,
    /// The node it was created for: the create's idempotency key.
    pub node: String,
    /// The instance type it was created as (one of the host's labels).
    pub instance_type: String,
    /// Every tag, verbatim and in order.
    pub tags: Tags,
    pub created_at_ms: u64,
    /// When the host first answered its ready check (or the create time, for
    /// a host without one). A ready slot stays ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_at_ms: Option<u64>,
    /// How the host was reached at create time, reported once the host has
    /// left the config so the node can still be found and reached.
    pub host: HostSnapshot,
}

/// The connection details of a host as they were when the slot was taken.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct HostSnapshot {
    pub address: String,
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub port: Option<u16>,
    #[serde(default)]
    pub host_keys: Vec<String>,
}

impl Record {
    /// The stored text. Fails (for good) when the tags make it larger than
    /// the host keeps.
    pub fn encode(&self) -> Result<String, Error> {
        let text = serde_json::to_string(self)
            .map_err(|e| error::permanent(format!("encoding a slot record: {e}")))?;
        if text.len() > MAX_VALUE {
            return Err(error::permanent(format!(
                "the slot record would be {} bytes, more than the {MAX_VALUE} kept; use fewer or shorter tags",
                text.len()
            )));
        }
        Ok(text)
    }

    pub fn decode(text: &str) -> Result<Record, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }
}

/// A slot record as read: its text (the `expected` of a later
/// compare-and-swap) and what it says, if it could be read.
#[derive(Clone, Debug)]
pub(crate) struct Stored {
    pub slot: SlotId,
    pub text: String,
    pub record: Result<Record, String>,
}

impl Stored {
    /// The record, if it is readable and belongs to `pool`.
    pub fn of_pool(&self, pool: &str) -> Option<&Record> {
        self.record.as_ref().ok().filter(|r| r.pool == pool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_ids() {
        let id = SlotId {
            host: "build-1".into(),
            index: 3,
        };
        assert_eq!(id.to_string(), "build-1/3");
        assert_eq!(id.key(), "slot/build-1/3");
        assert_eq!(SlotId::parse("build-1/3"), Some(id.clone()));
        assert_eq!(SlotId::from_key("slot/build-1/3"), Some(id));
        for bad in ["", "a", "/1", "a/", "a/x", "a/03", "a/-1", "a/b/1", "a/+1"] {
            assert_eq!(SlotId::parse(bad), None, "{bad}");
        }
        assert_eq!(SlotId::from_key("node/p/n"), None);
    }

    #[test]
    fn node_keys_are_encoded_and_bounded() {
        assert_eq!(node_key("p/1", "n 1").unwrap(), "node/p%2F1/n%201");
        assert!(node_key("p", &"n".repeat(240)).is_ok_and(|k| k.len() == 247));
        assert!(matches!(
            node_key("p", &"n".repeat(300)),
            Err(Error::Permanent(m)) if m.contains("too long")
        ));
    }

    #[test]
    fn records_round_trip_and_read_leniently() {
        let record = Record {
            pool: "p".into(),
            node: "n-1".into(),
            instance_type: "small".into(),
            tags: vec![
                ("berth-pool".into(), "p".into()),
                ("k".into(), "1".into()),
                ("k".into(), "2".into()),
            ],
            created_at_ms: 5,
            ready_at_ms: None,
            host: HostSnapshot {
                address: "10.0.0.5".into(),
                username: Some("ci".into()),
                port: Some(22),
                host_keys: vec![],
            },
        };
        let text = record.encode().unwrap();
        assert!(!text.contains("ready-at-ms"), "{text}");
        assert_eq!(Record::decode(&text).unwrap(), record);
        let newer = text.replacen('{', r#"{"from-the-future": 1, "#, 1);
        assert_eq!(Record::decode(&newer).unwrap(), record);
        assert!(Record::decode("{}").is_err());
        let huge = Record {
            tags: vec![("berth-x".into(), "v".repeat(70_000))],
            ..record
        };
        assert!(
            matches!(huge.encode(), Err(Error::Permanent(m)) if m.contains("fewer or shorter"))
        );
    }
}
