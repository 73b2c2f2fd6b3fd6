//! Which store made an instance, and whether its tags are berth's own.
//!
//! Every store has an [`Identity`]: a generation, a random name given when
//! the store is made, and a key, a random secret kept only in the store
//! (shared by every process on a PostgreSQL pool). Every instance berth
//! creates carries the generation (`berth-store`) and a signature of its
//! tags (`berth-sig`): an HMAC-SHA256 under the key over the pool id, the
//! generation, the node id, the label, the instance type and, for a backing
//! instance, its slot label and slot count.
//!
//! So the cloud's tags say which store made an instance, and nobody without
//! the key can make tags berth takes for its own: a server made by hand in
//! the cloud project with every tag right but the signature is never
//! adopted, handed out or deleted (see `reconcile`). A store that is not the
//! one the instances were made by (lost, emptied, replaced) cannot vouch for
//! them either, and an unconfirmed store facing them refuses to go on.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::NodeId;

/// Hex digits of a signature: 128 bits of HMAC-SHA256, short enough for
/// clouds whose label values hold 63 characters.
pub const SIGNATURE_HEX: usize = 32;

/// Hex digits of a generation.
pub const GENERATION_HEX: usize = 16;

/// A store's identity as instances carry it. `Debug` never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct Identity {
    /// The store's generation: 16 lowercase hex digits, random, made with
    /// the store and never changed (a copy by `berth store migrate` keeps
    /// it).
    pub generation: String,
    /// The key signatures are made with.
    pub key: [u8; 32],
    /// Whether the store has faced the clouds: every provider has been
    /// listed once with nothing of the pool on it that the store cannot
    /// vouch for. Until then, such instances stop the pool
    /// ([`super::Pool::mismatch`]): a store that is new, emptied or
    /// replaced does not take another store's machines for its own.
    pub confirmed: bool,
}

impl Default for Identity {
    /// A fixed identity for tests and pools that no store keeps: its key
    /// is public, so nothing it signs is worth anything.
    fn default() -> Identity {
        Identity {
            generation: "0".repeat(GENERATION_HEX),
            key: [0; 32],
            confirmed: true,
        }
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("generation", &self.generation)
            .field("key", &"<redacted>")
            .field("confirmed", &self.confirmed)
            .finish()
    }
}

/// What a signature covers.
#[derive(Clone, Copy, Debug)]
pub struct Signed<'a> {
    pub pool_id: &'a str,
    pub node: NodeId,
    pub label: &'a str,
    pub instance_type: &'a str,
    /// A backing instance's slot label and slot count.
    pub slots: Option<(&'a str, u16)>,
}

impl Identity {
    /// The `berth-sig` value of an instance made by this store.
    pub fn sign(&self, what: Signed<'_>) -> String {
        let bytes = self.mac(&what).finalize().into_bytes();
        let mut text = hex::encode(bytes);
        text.truncate(SIGNATURE_HEX);
        text
    }

    /// Whether `signature` is this store's for `what`: compared in
    /// constant time.
    pub fn verify(&self, what: Signed<'_>, signature: &str) -> bool {
        let Some(given) = parse_hex(signature) else {
            return false;
        };
        if given.len() * 2 != SIGNATURE_HEX {
            return false;
        }
        self.mac(&what).verify_truncated_left(&given).is_ok()
    }

    fn mac(&self, what: &Signed<'_>) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .expect("HMAC takes a key of any length");
        // Each field with its length first, so that no two different sets
        // of fields give the same bytes.
        let node = what.node.to_string();
        let count = what.slots.map(|(_, n)| n.to_string()).unwrap_or_default();
        let fields: [&str; 7] = [
            what.pool_id,
            &self.generation,
            &node,
            what.label,
            what.instance_type,
            what.slots.map_or("", |(l, _)| l),
            &count,
        ];
        mac.update(b"berth-sig-1");
        for field in fields {
            mac.update(&(field.len() as u64).to_be_bytes());
            mac.update(field.as_bytes());
        }
        mac
    }
}

/// Lowercase hex read back; `None` for anything else (uppercase too: berth
/// writes lowercase, and one value has one spelling).
pub fn parse_hex(text: &str) -> Option<Vec<u8>> {
    if text.bytes().any(|b| b.is_ascii_uppercase()) {
        return None;
    }
    hex::decode(text).ok()
}

/// Whether `text` is a generation: 16 lowercase hex digits.
pub fn is_generation(text: &str) -> bool {
    text.len() == GENERATION_HEX && parse_hex(text).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(key: u8) -> Identity {
        Identity {
            generation: "00112233445566ff".into(),
            key: [key; 32],
            confirmed: true,
        }
    }

    fn signed(node: u64, slots: Option<(&str, u16)>) -> Signed<'_> {
        Signed {
            pool_id: "ci",
            node: NodeId(node),
            label: "small",
            instance_type: "t3.small",
            slots,
        }
    }

    #[test]
    fn a_signature_holds_for_what_it_signed_and_nothing_else() {
        let id = identity(7);
        let sig = id.sign(signed(1, None));
        assert_eq!(sig.len(), SIGNATURE_HEX);
        assert!(
            sig.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert!(id.verify(signed(1, None), &sig));
        // Another node, label, type, pool, slot count, generation or key.
        assert!(!id.verify(signed(2, None), &sig));
        assert!(!id.verify(signed(1, Some(("shared", 4))), &sig));
        let mut other = signed(1, None);
        other.label = "large";
        assert!(!id.verify(other, &sig));
        other = signed(1, None);
        other.instance_type = "t3.large";
        assert!(!id.verify(other, &sig));
        other = signed(1, None);
        other.pool_id = "cj";
        assert!(!id.verify(other, &sig));
        let backing = id.sign(signed(1, Some(("shared", 4))));
        assert!(!id.verify(signed(1, Some(("shared", 5))), &backing));
        assert!(id.verify(signed(1, Some(("shared", 4))), &backing));
        let mut elsewhere = identity(7);
        elsewhere.generation = "00112233445566fe".into();
        assert!(!elsewhere.verify(signed(1, None), &sig));
        assert!(!identity(8).verify(signed(1, None), &sig));
    }

    #[test]
    fn malformed_signatures_are_refused() {
        let id = identity(7);
        let sig = id.sign(signed(1, None));
        for bad in [
            "",
            "0",
            &sig[..SIGNATURE_HEX - 2],
            &format!("{sig}00"),
            &sig.to_uppercase(),
            &format!("{}zz", &sig[..SIGNATURE_HEX - 2]),
        ] {
            assert!(!id.verify(signed(1, None), bad), "{bad:?}");
        }
    }

    #[test]
    fn fields_cannot_be_shifted_into_one_another() {
        let id = identity(7);
        let a = Signed {
            label: "ab",
            instance_type: "c",
            ..signed(1, None)
        };
        let b = Signed {
            label: "a",
            instance_type: "bc",
            ..signed(1, None)
        };
        assert_ne!(id.sign(a), id.sign(b));
    }

    #[test]
    fn the_key_is_never_shown() {
        let shown = format!("{:?}", identity(0xab));
        assert!(!shown.contains("171"), "{shown}");
        assert!(shown.contains("redacted"));
    }

    #[test]
    fn generations_are_sixteen_lowercase_hex_digits() {
        assert!(is_generation("00112233445566ff"));
        assert!(!is_generation("00112233445566FF"));
        assert!(!is_generation("00112233445566f"));
        assert!(!is_generation("00112233445566fg"));
    }
}
