//! A request as a client or the store's inbox states it, by label name,
//! read into a [`NewRequest`]: the one place that says what a stated
//! request must be. [`super::servable`] then says whether the pool could ever
//! serve it.

use crate::config::Config;
use crate::text::{is_requestor, is_unsafe, printable};

use super::{Metadata, NewRequest};

/// The most nodes of one label a request may ask for.
pub const MAX_COUNT: u32 = 10_000;

/// The most keys a request's metadata may hold.
pub const MAX_METADATA_KEYS: usize = 32;
/// The longest metadata key, in bytes.
pub const MAX_METADATA_KEY: usize = 64;
/// The longest metadata value, in bytes.
pub const MAX_METADATA_VALUE: usize = 512;
/// The most bytes a request's metadata may hold, keys and values together.
pub const MAX_METADATA: usize = 4096;
/// The longest idempotency key, in bytes.
pub const MAX_KEY: usize = 255;

/// Why a stated request cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unreadable {
    #[error("ask for at least one node")]
    NoLabels,
    /// The name, escaped to be shown.
    #[error(
        "`{0}` is not a label name: names hold no control, invisible or direction-changing characters"
    )]
    LabelName(String),
    #[error("must be a whole number from 1 to {MAX_COUNT}")]
    Count { label: String },
    /// `known`: this pool's label names, comma-separated.
    #[error("no label `{name}`; labels are {known}")]
    UnknownLabel { name: String, known: String },
    #[error(
        "must be 1 to 128 printable characters, with no control, invisible or direction-changing ones"
    )]
    Requestor,
    /// The key, escaped to be shown.
    #[error("`{0}` is not a metadata key: 1 to {MAX_METADATA_KEY} of A-Z a-z 0-9 . _ - /")]
    MetadataKey(String),
    #[error("must hold no control, invisible or direction-changing characters")]
    MetadataValue { key: String },
    #[error("is {len} bytes; a value is at most {MAX_METADATA_VALUE}")]
    MetadataValueTooLong { key: String, len: usize },
    #[error(
        "holds {keys} keys and {bytes} bytes; at most {MAX_METADATA_KEYS} keys and {MAX_METADATA} bytes of keys and values"
    )]
    MetadataTooLarge { keys: usize, bytes: usize },
    #[error("must be 1 to {MAX_KEY} visible ASCII characters (no spaces)")]
    Key,
}

impl Unreadable {
    /// The part of the stated request at fault: `labels`, `labels.NAME` or
    /// `requestor`.
    pub fn field(&self) -> String {
        match self {
            Unreadable::NoLabels | Unreadable::LabelName(_) => "labels".into(),
            Unreadable::Count { label } => format!("labels.{label}"),
            Unreadable::UnknownLabel { name, .. } => format!("labels.{name}"),
            Unreadable::Requestor => "requestor".into(),
            Unreadable::MetadataKey(_) | Unreadable::MetadataTooLarge { .. } => "metadata".into(),
            Unreadable::MetadataValue { key } | Unreadable::MetadataValueTooLong { key, .. } => {
                format!("metadata.{key}")
            }
            Unreadable::Key => "Idempotency-Key".into(),
        }
    }

    /// Whether the fault is one of size: the ask is well-formed, but more
    /// than berth keeps.
    pub fn too_large(&self) -> bool {
        matches!(
            self,
            Unreadable::MetadataTooLarge { .. } | Unreadable::MetadataValueTooLong { .. }
        )
    }
}

/// Whether `key` may name a metadata entry: 1 to [`MAX_METADATA_KEY`] of
/// `A-Z a-z 0-9 . _ - /`, so that it reads the same in a query
/// (`?meta.KEY=VALUE`), a log and a shell.
pub fn is_metadata_key(key: &str) -> bool {
    (1..=MAX_METADATA_KEY).contains(&key.len())
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/'))
}

/// Reads a request's metadata as a client states it: every key a metadata
/// key, every value free of unsafe characters and at most
/// [`MAX_METADATA_VALUE`] bytes, and the whole within [`MAX_METADATA_KEYS`]
/// and [`MAX_METADATA`]. The first fault found is the answer.
pub fn read_metadata(stated: Metadata) -> Result<Metadata, Unreadable> {
    let bytes: usize = stated.iter().map(|(k, v)| k.len() + v.len()).sum();
    if stated.len() > MAX_METADATA_KEYS || bytes > MAX_METADATA {
        return Err(Unreadable::MetadataTooLarge {
            keys: stated.len(),
            bytes,
        });
    }
    for (key, value) in &stated {
        if !is_metadata_key(key) {
            return Err(Unreadable::MetadataKey(printable(key).into_owned()));
        }
        if value.len() > MAX_METADATA_VALUE {
            return Err(Unreadable::MetadataValueTooLong {
                key: key.clone(),
                len: value.len(),
            });
        }
        if value.chars().any(is_unsafe) {
            return Err(Unreadable::MetadataValue { key: key.clone() });
        }
    }
    Ok(stated)
}

/// Reads an idempotency key as a client states it: 1 to [`MAX_KEY`]
/// visible ASCII characters.
pub fn read_key(stated: &[u8]) -> Result<String, Unreadable> {
    if !(1..=MAX_KEY).contains(&stated.len()) || !stated.iter().all(u8::is_ascii_graphic) {
        return Err(Unreadable::Key);
    }
    Ok(String::from_utf8_lossy(stated).into_owned())
}

/// Reads a request for `labels` (name and count, in the order given) at
/// `priority`, naming each label by its place in `config`. Its requestor is
/// the one stated, or else `otherwise` (the caller's own name, which is not
/// checked again). The first fault found is the answer.
pub fn read_request<'a>(
    config: &Config,
    stated: Option<String>,
    otherwise: &str,
    priority: i32,
    labels: impl IntoIterator<Item = (&'a str, u32)>,
) -> Result<NewRequest, Unreadable> {
    let mut wants = Vec::new();
    for (name, count) in labels {
        if name.is_empty() || name.chars().any(is_unsafe) {
            return Err(Unreadable::LabelName(printable(name).into_owned()));
        }
        if !(1..=MAX_COUNT).contains(&count) {
            return Err(Unreadable::Count {
                label: name.to_owned(),
            });
        }
        let Some(ix) = config.label(name).filter(|&ix| !config[ix].retired) else {
            let known: Vec<&str> = (config.labels.iter())
                .filter(|l| !l.retired)
                .map(|l| l.name.as_str())
                .collect();
            return Err(Unreadable::UnknownLabel {
                name: name.to_owned(),
                known: known.join(", "),
            });
        };
        wants.push((ix, count));
    }
    if wants.is_empty() {
        return Err(Unreadable::NoLabels);
    }
    let requestor = match stated {
        None => otherwise.to_owned(),
        Some(r) if is_requestor(&r) => r,
        Some(_) => return Err(Unreadable::Requestor),
    };
    Ok(NewRequest {
        requestor,
        priority,
        wants,
        ..NewRequest::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::testkit::{config, machine};

    fn read(labels: &[(&str, u32)], stated: Option<&str>) -> Result<NewRequest, Unreadable> {
        let config = config(
            Vec::new(),
            vec![machine("small", Vec::new()), machine("big", Vec::new())],
        );
        read_request(
            &config,
            stated.map(str::to_owned),
            "caller",
            3,
            labels.iter().copied(),
        )
    }

    #[test]
    fn a_stated_request_is_read_by_label_name() {
        let new = read(&[("big", 2), ("small", 1)], None).unwrap();
        assert_eq!(new.requestor, "caller");
        assert_eq!(new.priority, 3);
        assert_eq!(new.wants.len(), 2);
        assert_eq!(read(&[("small", 1)], Some("ci")).unwrap().requestor, "ci");
    }

    #[test]
    fn the_first_fault_is_named_with_its_field() {
        let fault = |labels: &[(&str, u32)], stated| {
            let e = read(labels, stated).unwrap_err();
            (e.field(), e)
        };
        assert_eq!(fault(&[], None), ("labels".into(), Unreadable::NoLabels));
        assert!(
            matches!(fault(&[("a\u{202e}b", 1)], None), (f, Unreadable::LabelName(_)) if f == "labels")
        );
        assert!(
            matches!(fault(&[("small", 0)], None), (f, Unreadable::Count { .. }) if f == "labels.small")
        );
        assert!(
            matches!(fault(&[("small", MAX_COUNT + 1)], None), (f, Unreadable::Count { .. }) if f == "labels.small")
        );
        let (field, e) = fault(&[("huge", 1)], None);
        assert_eq!(field, "labels.huge");
        assert_eq!(e.to_string(), "no label `huge`; labels are small, big");
        // Labels are read before the requestor.
        assert!(matches!(
            fault(&[("huge", 1)], Some("")),
            (_, Unreadable::UnknownLabel { .. })
        ));
        assert_eq!(
            fault(&[("small", 1)], Some("")),
            ("requestor".into(), Unreadable::Requestor)
        );
    }

    fn meta(pairs: &[(&str, &str)]) -> Metadata {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn metadata_is_read_within_its_bounds_and_each_fault_names_its_field() {
        let fine = meta(&[("zuul.tenant", "north"), ("build/id", "b-1"), ("empty", "")]);
        assert_eq!(read_metadata(fine.clone()), Ok(fine));
        let at_most = (0..MAX_METADATA_KEYS)
            .map(|i| (format!("k{i}"), "v".repeat(100)))
            .collect::<Metadata>();
        assert!(read_metadata(at_most).is_ok());

        let fault = |m: Metadata| {
            let e = read_metadata(m).unwrap_err();
            (e.field(), e.too_large(), e.to_string())
        };
        let too_many = (0..=MAX_METADATA_KEYS)
            .map(|i| (format!("k{i}"), String::new()))
            .collect();
        let (field, large, said) = fault(too_many);
        assert_eq!((field.as_str(), large), ("metadata", true));
        assert!(said.contains("33 keys"), "{said}");
        let too_big = (0..9)
            .map(|i| (format!("k{i}"), "v".repeat(MAX_METADATA_VALUE)))
            .collect();
        let (field, large, said) = fault(too_big);
        assert_eq!((field.as_str(), large), ("metadata", true));
        assert!(said.contains("4626 bytes"), "{said}");
        let long_value = meta(&[("job", &"x".repeat(MAX_METADATA_VALUE + 1))]);
        assert_eq!(fault(long_value).0, "metadata.job");
        assert_eq!(
            fault(meta(&[("job", "a\u{202e}b")])),
            (
                "metadata.job".into(),
                false,
                "must hold no control, invisible or direction-changing characters".into()
            )
        );
        for key in [
            "",
            "has space",
            "ключ",
            "a=b",
            &"k".repeat(MAX_METADATA_KEY + 1),
        ] {
            let (field, large, _) = fault(meta(&[(key, "v")]));
            assert_eq!((field.as_str(), large), ("metadata", false), "{key:?}");
        }
    }

    #[test]
    fn an_idempotency_key_is_visible_ascii_of_bounded_length() {
        assert_eq!(read_key(b"7f3c-retry:1").as_deref(), Ok("7f3c-retry:1"));
        assert!(read_key("k".repeat(MAX_KEY).as_bytes()).is_ok());
        for bad in [
            &b""[..],
            b"has space",
            b"tab\t",
            "ключ".as_bytes(),
            &[b'k'; MAX_KEY + 1],
        ] {
            let e = read_key(bad).unwrap_err();
            assert_eq!(e.field(), "Idempotency-Key", "{bad:?}");
        }
    }
}
