//! Helpers for the answers of `get` and `list` (contract 0.2).
//!
//! The host follows a list's pages itself, one call per page, so a driver
//! fetches one page of its cloud's per call and hands back the cloud's
//! cursor in [`Page::next`]. [`page_of`] pages an answer the cloud gives
//! whole (a cloud without pages). [`only_ids`] keeps a
//! cloud's answer to what `get` may return. [`find_ids`] answers a `get`
//! of many ids from a few pages of the pool's list where that costs fewer
//! calls than a lookup each.

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

/// One page of a cloud's list, for [`find_ids`].
pub struct ListPage {
    /// This pool's instances on the page.
    pub instances: Vec<Instance>,
    /// The cursor of the next page; `None` on the last.
    pub next: Option<String>,
    /// How many pages come after this one, if the cloud says.
    pub pages_left: Option<usize>,
}

/// The instances among `ids` that carry pool `pool_id`'s tag, for `get`,
/// in few calls. Up to `one_by_one_at_most` ids are asked for one by one
/// (`one`, `None` for an instance the cloud does not know). More are looked
/// for in the pool's list first (`page`, from the cursor given; `None`: the
/// first page), for as long as the pages still to read are fewer than the
/// ids still missing (or, when the cloud does not say how many pages are
/// left, for no more pages than ids are missing): never more calls than
/// a lookup each. Whatever the list did not show (a list may lag behind a
/// create) is then asked for by id, since an id left out of `get`'s answer
/// is gone.
pub fn find_ids<D>(
    driver: &mut D,
    ids: &[String],
    pool_id: &str,
    one_by_one_at_most: usize,
    page: impl Fn(&mut D, Option<&str>) -> Result<ListPage, crate::types::Error>,
    one: impl Fn(&mut D, &str) -> Result<Option<Instance>, crate::types::Error>,
) -> Result<Vec<Instance>, crate::types::Error> {
    let mut found = Vec::new();
    let mut missing: Vec<&String> = ids.iter().collect();
    if ids.len() > one_by_one_at_most {
        let mut cursor: Option<String> = None;
        let mut read = 0;
        loop {
            let p = page(driver, cursor.as_deref())?;
            read += 1;
            for i in p.instances {
                if let Some(at) = missing.iter().position(|id| **id == i.id) {
                    missing.swap_remove(at);
                    found.push(i);
                }
            }
            let worth = match p.pages_left {
                Some(left) => left < missing.len(),
                None => read < missing.len(),
            };
            match p.next {
                Some(next) if !missing.is_empty() && worth => cursor = Some(next),
                _ => break,
            }
        }
    }
    for id in missing {
        if let Some(i) = one(driver, id)? {
            found.push(i);
        }
    }
    Ok(only_ids(found, ids, pool_id))
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

    /// A cloud of `pages` pages of this pool's instances (ids by page),
    /// whose lookups by id know `known`; it counts the calls made.
    struct Cloud {
        pages: Vec<Vec<&'static str>>,
        known: Vec<&'static str>,
        say_left: bool,
        calls: Vec<String>,
    }

    fn find(cloud: &mut Cloud, ids: &[&str]) -> Vec<String> {
        let ids: Vec<String> = ids.iter().map(|i| (*i).to_owned()).collect();
        let found = find_ids(
            cloud,
            &ids,
            "p",
            2,
            |c, cursor| {
                let n: usize = cursor.map_or(0, |c| c.parse().unwrap());
                c.calls.push(format!("page {n}"));
                let last = c.pages.len() - 1;
                Ok(ListPage {
                    instances: c.pages[n].iter().map(|id| inst(id, "p")).collect(),
                    next: (n < last).then(|| (n + 1).to_string()),
                    pages_left: c.say_left.then_some(last - n),
                })
            },
            |c, id| {
                c.calls.push(format!("get {id}"));
                Ok(c.known.contains(&id).then(|| inst(id, "p")))
            },
        )
        .expect("found");
        let mut ids: Vec<String> = found.into_iter().map(|i| i.id).collect();
        ids.sort();
        // In any order: the lookups go in no order of their own.
        cloud.calls.sort();
        ids
    }

    #[test]
    fn find_ids_reads_pages_only_while_they_cost_less_than_lookups() {
        let cloud = |say_left| Cloud {
            pages: vec![vec!["a", "b"], vec!["c", "d"], vec!["e"]],
            known: vec!["a", "b", "c", "d", "e", "new"],
            say_left,
            calls: Vec::new(),
        };
        // Few ids: a lookup each, no list.
        let mut c = cloud(true);
        assert_eq!(find(&mut c, &["a", "gone"]), ["a"]);
        assert_eq!(c.calls, ["get a", "get gone"]);
        // Many: the pages while fewer pages are left than ids missing, then
        // a lookup for what the list did not show (made after it, or gone).
        let mut c = cloud(true);
        assert_eq!(
            find(&mut c, &["a", "c", "e", "new", "gone"]),
            ["a", "c", "e", "new"]
        );
        assert_eq!(
            c.calls,
            ["get gone", "get new", "page 0", "page 1", "page 2"]
        );
        // Two pages left and two ids missing: lookups are no dearer.
        let mut c = cloud(true);
        assert_eq!(find(&mut c, &["a", "b", "d", "gone"]), ["a", "b", "d"]);
        assert_eq!(c.calls, ["get d", "get gone", "page 0"]);
        // A cloud that does not say: no more pages than ids are missing.
        let mut c = cloud(false);
        assert_eq!(find(&mut c, &["a", "b", "e"]), ["a", "b", "e"]);
        assert_eq!(c.calls, ["get e", "page 0"]);
    }
}
