//! berth's tag conventions and helpers for the `set-tags` and `list` rules.
//!
//! Tags are an ordered list of `(key, value)` pairs ([`Tags`]). berth's own
//! keys all start with [`BERTH_PREFIX`]; a driver stores every tag verbatim
//! and returns it verbatim, because after a restart the cloud's tags are the
//! only record of which instances belong to which pool.

use crate::types::Tags;

/// The prefix of every tag key berth owns.
pub const BERTH_PREFIX: &str = "berth-";
/// The tag naming the pool an instance belongs to; its value is the pool id.
pub const POOL_TAG: &str = "berth-pool";
/// The tag naming the berth node an instance serves.
pub const NODE_TAG: &str = "berth-node";
/// The tag naming the label an instance was created for.
pub const LABEL_TAG: &str = "berth-label";

/// The value of the first tag named `key`, if any.
pub fn tag<'a>(tags: &'a [(String, String)], key: &str) -> Option<&'a str> {
    tags.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// Whether `tags` carries every `(key, value)` pair of `filter` (the rule of
/// `list`). An empty filter matches everything.
pub fn has_all(tags: &[(String, String)], filter: &[(String, String)]) -> bool {
    filter
        .iter()
        .all(|(fk, fv)| tags.iter().any(|(k, v)| k == fk && v == fv))
}

/// `tags` with `berth-pool` set to `pool_id` whatever they said, first: what
/// a driver creates with, filters its lists by and sets, since the pool tag
/// is the one a driver enforces itself.
pub fn with_pool(tags: &[(String, String)], pool_id: &str) -> Tags {
    let mut out: Tags = vec![(POOL_TAG.to_owned(), pool_id.to_owned())];
    out.extend(tags.iter().filter(|(k, _)| k != POOL_TAG).cloned());
    out
}

/// Whether `filter` names a pool other than `pool_id`: such a list matches
/// nothing the driver may see, and asks the cloud nothing.
pub fn names_other_pool(filter: &[(String, String)], pool_id: &str) -> bool {
    filter.iter().any(|(k, v)| k == POOL_TAG && v != pool_id)
}

/// Whether `key` is one of berth's own tag keys.
pub fn is_berth_tag(key: &str) -> bool {
    key.starts_with(BERTH_PREFIX)
}

/// The tags an instance ends up with after `set-tags(new)` on an instance
/// tagged `existing`: every berth tag of `existing` is dropped, every other
/// tag is kept in place, then the berth tags of `new` are appended in order.
///
/// Entries of `new` that are not berth tags are ignored, since `set-tags`
/// leaves the cloud's other tags alone. When `new` names a key twice, the
/// last value wins.
pub fn replace_berth_tags(existing: &[(String, String)], new: &[(String, String)]) -> Tags {
    let mut out: Tags = existing
        .iter()
        .filter(|(k, _)| !is_berth_tag(k))
        .cloned()
        .collect();
    let kept = out.len();
    for (k, v) in new.iter().filter(|(k, _)| is_berth_tag(k)) {
        match out[kept..].iter_mut().find(|(ok, _)| ok == k) {
            Some(slot) => slot.1.clone_from(v),
            None => out.push((k.clone(), v.clone())),
        }
    }
    out
}

/// A tag value in a form that clouds restricting label values accept
/// (lowercase letters, digits, `-` and `_`, a letter or digit at both ends;
/// GCP, Hetzner, Kubernetes), and that [`decode_label`] turns back into the
/// value (docs/tags.md). `a`–`y` and `0`–`9` stay as they are, and so do `-`
/// and `_` between the first and the last character; every other
/// character becomes `z` and two lowercase hex digits per UTF-8 byte
/// (`zuul` → `z7auul`, `My.pool` → `z4dyz2epool`). The result is never
/// shorter; check it against the cloud's length limit (63 for those clouds).
pub fn encode_label(value: &str) -> String {
    let n = value.chars().count();
    let mut out = String::with_capacity(value.len());
    for (i, c) in value.chars().enumerate() {
        let inner = i > 0 && i + 1 < n;
        if matches!(c, 'a'..='y' | '0'..='9') || (inner && matches!(c, '-' | '_')) {
            out.push(c);
        } else {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("z{b:02x}"));
            }
        }
    }
    out
}

/// The value [`encode_label`] turned into `label`; `None` for text it
/// cannot have written.
pub fn decode_label(label: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(label.len());
    let mut rest = label.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'z' {
            let hex = tail.get(..2)?;
            if !hex.iter().all(|h| matches!(h, b'0'..=b'9' | b'a'..=b'f')) {
                return None;
            }
            bytes.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            rest = &tail[2..];
        } else if matches!(b, b'a'..=b'y' | b'0'..=b'9' | b'-' | b'_') {
            bytes.push(b);
            rest = tail;
        } else {
            return None;
        }
    }
    let value = String::from_utf8(bytes).ok()?;
    // Only the one spelling encode writes: no escape of a byte kept as is,
    // no bare `-` or `_` at an end.
    (encode_label(&value) == label).then_some(value)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_pool_tag_is_the_drivers_own() {
        use super::{names_other_pool, with_pool};
        let t = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect()
        };
        assert_eq!(
            with_pool(&t(&[("a", "1"), ("berth-pool", "other")]), "p"),
            t(&[("berth-pool", "p"), ("a", "1")])
        );
        assert!(names_other_pool(&t(&[("berth-pool", "other")]), "p"));
        assert!(!names_other_pool(
            &t(&[("berth-pool", "p"), ("a", "1")]),
            "p"
        ));
        assert!(!names_other_pool(&[], "p"));
    }

    #[test]
    fn label_encoding_vectors() {
        use super::{decode_label, encode_label};
        let vectors = [
            ("", ""),
            ("ci-pool", "ci-pool"),
            ("n-00000000000000ab", "n-00000000000000ab"),
            ("zuul", "z7auul"),
            ("My.pool", "z4dyz2epool"),
            ("My.Pool", "z4dyz2ez50ool"),
            ("-edge_", "z2dedgez5f"),
            ("é", "zc3za9"),
        ];
        for (value, label) in vectors {
            assert_eq!(encode_label(value), label, "{value:?}");
            assert_eq!(decode_label(label).as_deref(), Some(value), "{label:?}");
        }
        for bad in ["Upper", "a.b", "z6", "zzz", "z61", "-a", "a_", "zc3"] {
            assert_eq!(decode_label(bad), None, "{bad:?}");
        }
    }

    use super::*;

    fn t(pairs: &[(&str, &str)]) -> Tags {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn tag_finds_first_value() {
        let tags = t(&[("a", "1"), ("berth-pool", "p1"), ("a", "2")]);
        assert_eq!(tag(&tags, "a"), Some("1"));
        assert_eq!(tag(&tags, POOL_TAG), Some("p1"));
        assert_eq!(tag(&tags, "missing"), None);
    }

    #[test]
    fn has_all_cases() {
        fn check(tags: &[(&str, &str)], filter: &[(&str, &str)], expect: bool) {
            assert_eq!(
                has_all(&t(tags), &t(filter)),
                expect,
                "tags {tags:?} filter {filter:?}"
            );
        }
        check(&[], &[], true);
        check(&[("berth-pool", "p1")], &[], true);
        check(
            &[("berth-pool", "p1"), ("x", "y")],
            &[("berth-pool", "p1")],
            true,
        );
        check(&[("berth-pool", "p1")], &[("berth-pool", "p2")], false);
        check(
            &[("berth-pool", "p1")],
            &[("berth-pool", "p1"), ("berth-node", "n")],
            false,
        );
        // A key present with another value does not match.
        check(&[("berth-node", "n-1")], &[("berth-node", "n-2")], false);
        // Duplicate keys: any matching pair counts.
        check(&[("k", "1"), ("k", "2")], &[("k", "2")], true);
    }

    #[test]
    fn berth_tag_prefix() {
        assert!(is_berth_tag(POOL_TAG));
        assert!(is_berth_tag(NODE_TAG));
        assert!(is_berth_tag(LABEL_TAG));
        assert!(is_berth_tag("berth-anything"));
        assert!(!is_berth_tag("berth"));
        assert!(!is_berth_tag("Berth-pool"));
        assert!(!is_berth_tag("name"));
    }

    #[test]
    fn replace_berth_tags_cases() {
        fn check(existing: &[(&str, &str)], new: &[(&str, &str)], expect: &[(&str, &str)]) {
            assert_eq!(replace_berth_tags(&t(existing), &t(new)), t(expect));
        }
        // Berth tags absent from `new` are removed; others are kept.
        check(
            &[("Name", "web"), ("berth-pool", "p1"), ("berth-node", "n-1")],
            &[("berth-pool", "p1")],
            &[("Name", "web"), ("berth-pool", "p1")],
        );
        // Berth tags in `new` are set, added or changed.
        check(
            &[
                ("berth-pool", "p1"),
                ("env", "prod"),
                ("berth-label", "old"),
            ],
            &[
                ("berth-pool", "p1"),
                ("berth-label", "new"),
                ("berth-extra", "x"),
            ],
            &[
                ("env", "prod"),
                ("berth-pool", "p1"),
                ("berth-label", "new"),
                ("berth-extra", "x"),
            ],
        );
        // Non-berth keys in `new` are ignored; existing ones are left alone.
        check(
            &[("env", "prod")],
            &[("env", "dev"), ("berth-pool", "p")],
            &[("env", "prod"), ("berth-pool", "p")],
        );
        // Empty `new` removes every berth tag.
        check(&[("berth-pool", "p"), ("a", "b")], &[], &[("a", "b")]);
        // Last value of a duplicated key wins.
        check(
            &[],
            &[("berth-node", "1"), ("berth-node", "2")],
            &[("berth-node", "2")],
        );
    }
}
