//! Where each problem is in the text: its path looked up in a spanned parse
//! of the same text, keyed by the walker's own path builder.

use crate::problem::{Location, Problem};
use crate::walker::join;

/// Gives each problem that has none the location of its path in `text`: the
/// key, or the nearest table above it that the text has (a missing key is
/// missing from somewhere). Paths are built by the same [`join`] the walker
/// uses, so the two always agree.
pub fn locate(text: &str, problems: &mut [Problem]) {
    let Ok(doc) = toml::de::DeTable::parse(text) else {
        return;
    };
    let mut starts = std::collections::HashMap::new();
    index_table("", doc.get_ref(), &mut starts);
    for p in problems.iter_mut().filter(|p| p.location.is_none()) {
        let mut path = p.path.as_str();
        p.location = loop {
            if let Some(&start) = starts.get(path) {
                break Some(Location::of(text, start));
            }
            // Up one level: the longest indexed path that this one extends.
            let Some(parent) = starts
                .keys()
                .filter(|k| {
                    k.len() < path.len()
                        && path.starts_with(k.as_str())
                        && matches!(path.as_bytes()[k.len()], b'.' | b'[')
                })
                .max_by_key(|k| k.len())
            else {
                break None;
            };
            path = parent;
        };
    }
}

/// Byte offset of every key, and every array element, by its path.
fn index_table(
    path: &str,
    t: &toml::de::DeTable<'_>,
    out: &mut std::collections::HashMap<String, usize>,
) {
    for (key, value) in t {
        let at = join(path, key.get_ref());
        out.entry(at.clone()).or_insert(key.span().start);
        index_value(&at, value, out);
    }
}

fn index_value(
    path: &str,
    v: &toml::Spanned<toml::de::DeValue<'_>>,
    out: &mut std::collections::HashMap<String, usize>,
) {
    match v.get_ref() {
        toml::de::DeValue::Table(t) => index_table(path, t, out),
        toml::de::DeValue::Array(a) => {
            for (i, item) in a.iter().enumerate() {
                let at = format!("{path}[{i}]");
                out.entry(at.clone()).or_insert(item.span().start);
                index_value(&at, item, out);
            }
        }
        _ => {}
    }
}
