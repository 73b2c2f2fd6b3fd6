//! The driver's records in the host's durable `state`: which server each
//! create made, so that a create sent again (its answer lost to a crash, a
//! deadline, a restart of berth) finds the server the first try made
//! instead of making a second one. Nova has no idempotency key of its own.
//!
//! - `create/NODE`: the node's create was sent, with which token and name,
//!   when (wall-clock ms), and the server it made once Nova answered. Put
//!   in place before the `POST /servers`, with compare-and-swap, so that
//!   exactly one try per node ever posts without looking first. Removed
//!   when Nova refused the create (nothing was made) and when the server is
//!   deleted.
//! - `server/ID`: a server this provider made, and for which node and
//!   name: a `get` of many ids lists them by name in one call, and a
//!   `delete` knows it is the pool's without a lookup.
//!
//! Both are dropped a day after they were written: by then the create they
//! guard is long settled, and what they save is a call, never a server.

use serde_json::{Value, json};

pub(crate) const CREATE_PREFIX: &str = "create/";
pub(crate) const SERVER_PREFIX: &str = "server/";
/// How long a record is kept.
pub(crate) const KEEP_MS: u64 = 24 * 3600 * 1000;
/// The host takes keys of at most 256 bytes.
const MAX_KEY: usize = 256;

/// `create/NODE`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CreateRecord {
    pub token: String,
    /// The server's name the try sent.
    pub name: String,
    /// When the try was sent.
    pub at_ms: u64,
    /// The server Nova answered with, once it did.
    pub server: Option<String>,
}

impl CreateRecord {
    pub fn encode(&self) -> String {
        json!({"token": self.token, "name": self.name, "at_ms": self.at_ms, "server": self.server})
            .to_string()
    }

    /// A record as stored; `None` for text this driver did not write.
    pub fn decode(text: &str) -> Option<CreateRecord> {
        let v: Value = serde_json::from_str(text).ok()?;
        Some(CreateRecord {
            token: v.get("token")?.as_str()?.to_owned(),
            name: v.get("name")?.as_str()?.to_owned(),
            at_ms: v.get("at_ms")?.as_u64()?,
            server: match v.get("server") {
                None | Some(Value::Null) => None,
                Some(s) => Some(s.as_str()?.to_owned()),
            },
        })
    }
}

/// `server/ID`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ServerRecord {
    pub node: String,
    pub name: String,
    pub at_ms: u64,
}

impl ServerRecord {
    pub fn encode(&self) -> String {
        json!({"node": self.node, "name": self.name, "at_ms": self.at_ms}).to_string()
    }

    pub fn decode(text: &str) -> Option<ServerRecord> {
        let v: Value = serde_json::from_str(text).ok()?;
        Some(ServerRecord {
            node: v.get("node")?.as_str()?.to_owned(),
            name: v.get("name")?.as_str()?.to_owned(),
            at_ms: v.get("at_ms")?.as_u64()?,
        })
    }
}

/// When a record of either kind was written, if it says.
pub(crate) fn written_at(text: &str) -> Option<u64> {
    serde_json::from_str::<Value>(text)
        .ok()?
        .get("at_ms")?
        .as_u64()
}

/// `PREFIX` and `id`, or, for an id too long for a key, a digest of it.
fn key(prefix: &str, id: &str) -> String {
    let key = format!("{prefix}{id}");
    if key.len() <= MAX_KEY {
        return key;
    }
    // FNV-1a, twice over: unique enough for ids that long, which berth's
    // node ids and Nova's server ids never are.
    let mut a: u64 = 0xcbf2_9ce4_8422_2325;
    let mut b: u64 = 0x8422_2325_cbf2_9ce4;
    for byte in id.bytes() {
        a = (a ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        b = (b ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{prefix}#{a:016x}{b:016x}")
}

pub(crate) fn create_key(node: &str) -> String {
    key(CREATE_PREFIX, node)
}

pub(crate) fn server_key(id: &str) -> String {
    key(SERVER_PREFIX, id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let r = CreateRecord {
            token: "t".into(),
            name: "n-1".into(),
            at_ms: 5,
            server: None,
        };
        assert_eq!(CreateRecord::decode(&r.encode()), Some(r.clone()));
        let made = CreateRecord {
            server: Some("9168b536".into()),
            ..r
        };
        assert_eq!(CreateRecord::decode(&made.encode()), Some(made.clone()));
        assert_eq!(written_at(&made.encode()), Some(5));
        let s = ServerRecord {
            node: "n-1".into(),
            name: "n-1".into(),
            at_ms: 7,
        };
        assert_eq!(ServerRecord::decode(&s.encode()), Some(s));
        for bad in ["", "{}", "[1]", r#"{"token": 1, "name": "n", "at_ms": 1}"#] {
            assert_eq!(CreateRecord::decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn keys_fit_the_hosts_limit() {
        assert_eq!(
            create_key("n-00000000000000ab"),
            "create/n-00000000000000ab"
        );
        assert_eq!(server_key("x"), "server/x");
        let long = "n".repeat(300);
        let k = create_key(&long);
        assert!(k.len() <= MAX_KEY && k.starts_with("create/#"), "{k}");
        assert_ne!(k, create_key(&"n".repeat(301)));
    }
}
