//! A request as a client or the store's inbox states it, by label name,
//! read into a [`NewRequest`]: the one place that says what a stated
//! request must be. [`super::servable`] then says whether the pool could ever
//! serve it.

use crate::config::Config;
use crate::text::{is_requestor, is_unsafe, printable};

use super::NewRequest;

/// The most nodes of one label a request may ask for.
pub const MAX_COUNT: u32 = 10_000;

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
        }
    }
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
}
