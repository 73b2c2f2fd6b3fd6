//! Helpers for the answers of `get` and `list` (contract 0.2).
//!
//! The host follows a list's pages itself, one call per page, so a driver
//! fetches one page of its cloud's per call and hands back the cloud's
//! cursor in [`Page::next`]. [`page_of`] pages an answer the cloud gives
//! whole (a cloud without pages). [`only_ids`] keeps a
//! cloud's answer to what `get` may return.

use crate::tags::{POOL_TAG, tag};
use crate::types::{Instance, Page};

/// Page `cursor` (`None`: the first) of `all`, `size` instances a page,
/// in id order. The cursor is the id of the last instance of the page
/// before (a marker, as OpenStack's), not an offset: an instance that goes
/// away between two pages moves no other from one page to the next, so
/// none is skipped.
pub fn page_of(mut all: Vec<Instance>, cursor: Option<&str>, size: usize) -> Page {
    all.sort_by(|a, b| a.id.cmp(&b.id));
    let size = size.max(1);
    let mut rest = all
        .into_iter()
        .skip_while(|i| cursor.is_some_and(|after| i.id.as_str() <= after));
    let instances: Vec<Instance> = rest.by_ref().take(size).collect();
    let next = match rest.next() {
        Some(_) => instances.last().map(|i| i.id.clone()),
        None => None,
    };
    Page { instances, next }
}

/// The instances of `found` whose id is one of `ids` and that carry pool
/// `pool_id`'s tag: what `get` answers, from a cloud's answer that may
/// hold more (a filter the cloud applies loosely, a lookup that also
/// finds other pools' instances).
pub fn only_ids(
    found: impl IntoIterator<Item = Instance>,
    ids: &[String],
    pool_id: &str,
) -> Vec<Instance> {
    found
        .into_iter()
        .filter(|i| ids.contains(&i.id) && tag(&i.tags, POOL_TAG) == Some(pool_id))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Addresses, Connection, InstanceState};

    fn inst(id: &str, pool: &str) -> Instance {
        Instance {
            id: id.into(),
            state: InstanceState::Running,
            instance_type: "small".into(),
            tags: vec![(POOL_TAG.into(), pool.into())],
            addresses: Addresses {
                public_ipv4: None,
                private_ipv4: None,
                ipv6: None,
                hostname: None,
            },
            created_at_ms: None,
            connection: Connection {
                username: None,
                port: None,
                host_keys: vec![],
            },
        }
    }

    #[test]
    fn pages_cover_the_whole_answer_once() {
        let all: Vec<Instance> = (0..7).rev().map(|n| inst(&format!("i-{n}"), "p")).collect();
        let mut seen = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let page = page_of(all.clone(), cursor.as_deref(), 3);
            seen.extend(page.instances.into_iter().map(|i| i.id));
            match page.next {
                None => break,
                next => cursor = next,
            }
        }
        let want: Vec<String> = (0..7).map(|n| format!("i-{n}")).collect();
        assert_eq!(seen, want);
        let empty = page_of(vec![], None, 3);
        assert!(empty.instances.is_empty() && empty.next.is_none());
        let exact = page_of(all.clone(), None, 7);
        assert_eq!((exact.instances.len(), exact.next), (7, None));
    }

    #[test]
    fn an_instance_gone_between_pages_moves_no_other() {
        let all: Vec<Instance> = (0..6).map(|n| inst(&format!("i-{n}"), "p")).collect();
        let first = page_of(all.clone(), None, 3);
        let after = first.next.clone().unwrap();
        // `i-1`, on the first page, went away before the second was asked.
        let fewer: Vec<Instance> = all.into_iter().filter(|i| i.id != "i-1").collect();
        let second = page_of(fewer, Some(&after), 3);
        let ids: Vec<&str> = second.instances.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["i-3", "i-4", "i-5"]);
        assert_eq!(second.next, None);
    }

    #[test]
    fn get_keeps_the_ids_asked_of_the_pool() {
        let found = vec![inst("i-1", "p"), inst("i-2", "other"), inst("i-3", "p")];
        let kept = only_ids(found, &["i-2".into(), "i-3".into()], "p");
        let kept: Vec<&str> = kept.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(kept, ["i-3"]);
    }
}
