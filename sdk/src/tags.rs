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

#[cfg(test)]
mod tests {
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
