//! What the driver writes into Compute Engine's restricted fields: an
//! instance's name from its node, berth's tags as labels (through the
//! label encoding of docs/tags.md), and a bulk insert's request id.

use std::collections::BTreeMap;

use berth_sdk::tags::{BERTH_PREFIX, decode_label, encode_label, is_berth_tag};

/// GCE label keys and values, and resource names, take at most 63
/// characters; a resource at most 64 labels.
pub(crate) const MAX_LABEL: usize = 63;
pub(crate) const MAX_LABELS: usize = 64;

/// FNV-1a, 64 bits, from `seed`: a stable hash for names and request ids
/// (not for secrets).
pub(crate) fn fnv64(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325 ^ seed;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Whether `name` is a valid resource name: 1 to 63 of lowercase letters,
/// digits and `-`, starting with a letter and not ending with `-`
/// (RFC 1035, as the reference says).
pub(crate) fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_LABEL
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[b.len() - 1] != b'-'
}

/// The name of the instance of node `node_id` in pool `pool_id`: the node
/// id and 8 hex digits of the pool's hash (`n-00000000000000ab-1a2b3c4d`),
/// so that two pools in one project never take each other's names. A node
/// id that cannot be part of a name becomes `n` and 16 hex digits of its
/// hash. Every try of a node's create uses the same name, so the zone holds
/// at most one instance per node: a second try finds the first's.
pub(crate) fn instance_name(pool_id: &str, node_id: &str) -> String {
    let pool = fnv64(0, pool_id.as_bytes()) as u32;
    let suffix = format!("-{pool:08x}");
    if valid_name(node_id) && node_id.len() + suffix.len() <= MAX_LABEL {
        format!("{node_id}{suffix}")
    } else {
        format!("n{:016x}{suffix}", fnv64(0, node_id.as_bytes()))
    }
}

/// A request id for a bulk insert of creates with `tokens`: a UUID
/// (version 8) made from all of them, in order, so that the same batch
/// sent again is the same request to the cloud. A lone token is its own.
pub(crate) fn batch_request_id(tokens: &[&str]) -> String {
    if let [one] = tokens {
        return (*one).to_owned();
    }
    let joined = tokens.join("\n");
    let (a, b) = (
        fnv64(0x6265_7274_682d_6763, joined.as_bytes()),
        fnv64(0x6263_652d_6261_7463, joined.as_bytes()),
    );
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&a.to_be_bytes());
    bytes[8..].copy_from_slice(&b.to_be_bytes());
    bytes[6] = (bytes[6] & 0x0f) | 0x80;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// Whether `token` can be a `requestId`: a UUID, not the zero one.
pub(crate) fn valid_request_id(token: &str) -> bool {
    let groups: Vec<&str> = token.split('-').collect();
    groups.len() == 5
        && groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups
            .iter()
            .all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()))
        && token.bytes().any(|b| b != b'0' && b != b'-')
}

fn label_char(c: char) -> bool {
    c.is_ascii_lowercase()
        || c.is_ascii_digit()
        || c == '_'
        || c == '-'
        || (!c.is_ascii() && !c.is_uppercase())
}

/// Whether `key` is a valid label key: 1 to 63 characters, a lowercase
/// letter first, then lowercase letters, digits, `_` and `-`.
pub(crate) fn valid_label_key(key: &str) -> bool {
    let mut chars = key.chars();
    (1..=MAX_LABEL).contains(&key.chars().count())
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || (!c.is_ascii() && !c.is_uppercase()))
        && chars.all(label_char)
}

/// Whether `value` is a valid label value as it is.
pub(crate) fn valid_label_value(value: &str) -> bool {
    value.chars().count() <= MAX_LABEL && value.chars().all(label_char)
}

/// The label value a tag is stored as: berth's values through the label
/// encoding; others as they are, if GCE takes them.
pub(crate) fn label_value(key: &str, value: &str) -> Result<String, String> {
    let stored = if is_berth_tag(key) {
        encode_label(value)
    } else {
        value.to_owned()
    };
    if !valid_label_value(&stored) {
        return Err(format!(
            "tag {key}={value:?} cannot be a GCE label: stored as {stored:?}, {} characters, where \
             GCE takes at most {MAX_LABEL} lowercase letters, digits, `_` and `-`",
            stored.chars().count()
        ));
    }
    Ok(stored)
}

/// `tags` as GCE labels. A key GCE cannot take, a value too long once
/// encoded, or more than 64 labels is an error naming it.
pub(crate) fn labels_of(tags: &[(String, String)]) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (k, v) in tags {
        if !valid_label_key(k) {
            return Err(format!(
                "tag key {k:?} cannot be a GCE label key (1 to {MAX_LABEL} lowercase letters, \
                 digits, `_` and `-`, a letter first)"
            ));
        }
        out.insert(k.clone(), label_value(k, v)?);
    }
    if out.len() > MAX_LABELS {
        return Err(format!(
            "{} tags: a GCE instance takes at most {MAX_LABELS} labels",
            out.len()
        ));
    }
    Ok(out)
}

/// The tag a label stands for: berth's values decoded (one that does not
/// decode, which berth never wrote, as it is); others as they are.
pub(crate) fn tag_of(key: &str, label: &str) -> (String, String) {
    let value = if key.starts_with(BERTH_PREFIX) {
        decode_label(label).unwrap_or_else(|| label.to_owned())
    } else {
        label.to_owned()
    };
    (key.to_owned(), value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect()
    }

    #[test]
    fn names_come_from_the_node_and_the_pool() {
        let a = instance_name("ci", "n-00000000000000ab");
        assert!(a.starts_with("n-00000000000000ab-"), "{a}");
        assert_eq!(a.len(), 27);
        assert!(valid_name(&a));
        assert_eq!(a, instance_name("ci", "n-00000000000000ab"));
        assert_ne!(a, instance_name("cd", "n-00000000000000ab"));
        for node in ["N-Upper", "1abc", "x".repeat(60).as_str(), "a_b", "node-"] {
            let n = instance_name("ci", node);
            assert!(valid_name(&n), "{node} → {n}");
            assert!(n.starts_with('n') && n.len() == 26, "{n}");
        }
        assert_ne!(instance_name("ci", "a_b"), instance_name("ci", "a_c"));
        for bad in ["", "-a", "a-", "Ab", "a.b", &"a".repeat(64)] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn request_ids_are_uuids() {
        let one = "3f2c1a4e-7b6d-8e9f-a0b1-c2d3e4f5a6b7";
        assert_eq!(batch_request_id(&[one]), one);
        let two = batch_request_id(&[one, "4f2c1a4e-7b6d-8e9f-a0b1-c2d3e4f5a6b7"]);
        assert!(valid_request_id(&two), "{two}");
        assert_eq!(&two[14..15], "8");
        assert_ne!(
            two,
            batch_request_id(&["4f2c1a4e-7b6d-8e9f-a0b1-c2d3e4f5a6b7", one])
        );
        assert!(valid_request_id(one));
        for bad in [
            "",
            "n-1",
            "00000000-0000-0000-0000-000000000000",
            "3f2c1a4e7b6d8e9fa0b1c2d3e4f5a6b7",
            "3f2c1a4e-7b6d-8e9f-a0b1-c2d3e4f5a6bz",
        ] {
            assert!(!valid_request_id(bad), "{bad}");
        }
    }

    #[test]
    fn tags_become_labels_and_back() {
        let labels = labels_of(&t(&[
            ("berth-pool", "My.pool"),
            ("berth-node", "n-00000000000000ab"),
            ("env", "ci"),
        ]))
        .expect("valid");
        assert_eq!(labels["berth-pool"], "z4dyz2epool");
        assert_eq!(labels["berth-node"], "n-00000000000000ab");
        assert_eq!(labels["env"], "ci");
        assert_eq!(
            tag_of("berth-pool", "z4dyz2epool"),
            ("berth-pool".into(), "My.pool".into())
        );
        // Not berth's: as it is, even when it looks encoded.
        assert_eq!(tag_of("env", "z41"), ("env".into(), "z41".into()));
        // berth's, but not written by the encoding: as it is.
        assert_eq!(
            tag_of("berth-idle", "zz"),
            ("berth-idle".into(), "zz".into())
        );
        for (tags, needle) in [
            (t(&[("Env", "x")]), "tag key \"Env\""),
            (t(&[("env", "Prod")]), "env=\"Prod\""),
            (t(&[("berth-label", &"a".repeat(64))]), "64 characters"),
            (
                t(&[("berth-label", &"Z".repeat(30))]),
                "GCE takes at most 63",
            ),
        ] {
            match labels_of(&tags) {
                Err(m) => assert!(m.contains(needle), "{m}"),
                Ok(l) => panic!("{tags:?} accepted as {l:?}"),
            }
        }
        let many: Vec<(String, String)> =
            (0..65).map(|n| (format!("k{n}"), String::new())).collect();
        assert!(labels_of(&many).unwrap_err().contains("at most 64"));
    }
}
