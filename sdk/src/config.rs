//! Reading a driver's provider config and label options from their JSON
//! text so that every problem is reported at once, each naming its key, and
//! describing their fields for `describe`.

use std::time::Duration;

use serde_json::{Map, Value};

use crate::types::{ConfigField, FieldType};

/// One field of a config schema.
pub fn field(
    name: &str,
    field_type: FieldType,
    required: bool,
    default: Option<&str>,
    doc: &str,
) -> ConfigField {
    ConfigField {
        name: name.into(),
        field_type,
        required,
        default: default.map(Into::into),
        doc: doc.into(),
    }
}

/// A JSON object's keys taken one at a time, each problem kept with its path.
pub struct Reader<'a> {
    what: &'static str,
    map: &'a Map<String, Value>,
    known: Vec<String>,
    problems: Vec<String>,
}

impl<'a> Reader<'a> {
    /// A reader of `value` (`what` names it in problems, e.g. "provider
    /// config") for the keys of `fields`.
    pub fn new(
        what: &'static str,
        value: &'a Value,
        fields: &[ConfigField],
    ) -> Result<Self, String> {
        match value {
            Value::Object(map) => Ok(Reader {
                what,
                map,
                known: fields.iter().map(|f| f.name.clone()).collect(),
                problems: Vec::new(),
            }),
            _ => Err(format!("{what}: must be a JSON object")),
        }
    }

    /// Notes a problem with `key`.
    pub fn problem(&mut self, key: &str, why: impl std::fmt::Display) {
        self.problems.push(format!("{} {key}: {why}", self.what));
    }

    /// The non-empty string at `key`, if present.
    pub fn string(&mut self, key: &str) -> Option<String> {
        match self.map.get(key)? {
            Value::String(s) if s.trim().is_empty() => {
                self.problem(key, "must not be empty");
                None
            }
            Value::String(s) => Some(s.clone()),
            other => {
                self.problem(key, format_args!("must be a string, not {}", kind(other)));
                None
            }
        }
    }

    /// The integer at `key` within `range`, if present.
    pub fn integer(&mut self, key: &str, range: std::ops::RangeInclusive<u64>) -> Option<u64> {
        let value = self.map.get(key)?;
        match value.as_u64() {
            Some(n) if range.contains(&n) => Some(n),
            _ if value.is_number() => {
                self.problem(
                    key,
                    format_args!(
                        "must be a whole number from {} to {}",
                        range.start(),
                        range.end()
                    ),
                );
                None
            }
            _ => {
                self.problem(key, format_args!("must be an integer, not {}", kind(value)));
                None
            }
        }
    }

    /// The list of non-empty strings at `key`; empty if absent.
    pub fn strings(&mut self, key: &str) -> Vec<String> {
        match self.map.get(key) {
            None => vec![],
            Some(Value::Array(items)) => {
                let mut out = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    match item {
                        Value::String(s) if !s.trim().is_empty() => out.push(s.clone()),
                        Value::String(_) => self.problem(key, format_args!("item {i} is empty")),
                        other => self.problem(
                            key,
                            format_args!("item {i} must be a string, not {}", kind(other)),
                        ),
                    }
                }
                out
            }
            Some(other) => {
                self.problem(
                    key,
                    format_args!("must be a list of strings, not {}", kind(other)),
                );
                vec![]
            }
        }
    }

    /// The URL at `key` (`http(s)://host[:port][/path]`, no query), without
    /// a trailing `/`, if present.
    pub fn endpoint(&mut self, key: &str) -> Option<String> {
        let endpoint = self.string(key)?.trim_end_matches('/').to_owned();
        match crate::http::Url::parse(&endpoint) {
            Ok(url) if url.path_and_query().contains('?') => {
                self.problem(key, "must not have a query");
                None
            }
            Ok(_) => Some(endpoint),
            Err(e) => {
                self.problem(key, e);
                None
            }
        }
    }

    /// The duration at `key` (`"5s"`, `"500ms"`) of at most `max`, if
    /// present.
    pub fn duration(&mut self, key: &str, max: Duration) -> Option<Duration> {
        let text = self.string(key)?;
        match parse_duration(&text) {
            Some(d) if d <= max => Some(d),
            Some(_) => {
                self.problem(
                    key,
                    format_args!("{text:?} is more than {}s", max.as_secs()),
                );
                None
            }
            None => {
                self.problem(
                    key,
                    format_args!("{text:?} is not a duration like \"5s\" or \"500ms\""),
                );
                None
            }
        }
    }

    /// The boolean at `key`, if present.
    pub fn boolean(&mut self, key: &str) -> Option<bool> {
        match self.map.get(key)? {
            Value::Bool(b) => Some(*b),
            other => {
                self.problem(
                    key,
                    format_args!("must be true or false, not {}", kind(other)),
                );
                None
            }
        }
    }

    /// Whether `key` is present.
    pub fn has(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    /// Every problem found, unknown keys included.
    pub fn finish(mut self) -> Result<(), String> {
        let unknown: Vec<String> = self
            .map
            .keys()
            .filter(|k| !self.known.contains(k))
            .cloned()
            .collect();
        for key in unknown {
            let expected = self.known.join(", ");
            self.problem(
                &key,
                format_args!("unknown key; expected one of {expected}"),
            );
        }
        if self.problems.is_empty() {
            Ok(())
        } else {
            Err(self.problems.join("; "))
        }
    }
}

/// How a JSON value is named in a problem.
pub fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// A duration written `"5s"`, `"1500ms"` or `"0s"`.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let (digits, unit) = match text.strip_suffix("ms") {
        Some(d) => (d, 1),
        None => (text.strip_suffix('s')?, 1000),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(Duration::from_millis(n.checked_mul(unit)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("0s"), Some(Duration::ZERO));
        assert_eq!(parse_duration("20s"), Some(Duration::from_secs(20)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        for bad in ["", "s", "5", "-1s", "1.5s", "5 s", "1m"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_reader_names_every_bad_key() {
        let value = serde_json::json!({"a": 1, "b": "x", "c": ["", 2], "d": "9s", "e": "http://h/?q", "z": 0});
        let fields: Vec<ConfigField> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|n| field(n, FieldType::String, false, None, "doc"))
            .collect();
        let mut r = Reader::new("config", &value, &fields).expect("an object");
        assert_eq!(r.string("a"), None);
        assert_eq!(r.integer("b", 0..=5), None);
        assert!(r.strings("c").is_empty());
        assert_eq!(r.duration("d", Duration::from_secs(5)), None);
        assert_eq!(r.endpoint("e"), None);
        assert!(r.has("z") && !r.has("y"));
        let problems = r.finish().expect_err("problems");
        for needle in [
            "config a: must be a string",
            "config b: must be an integer",
            "item 0 is empty",
            "item 1 must be a string",
            "config d:",
            "config e: must not have a query",
            "config z: unknown key",
        ] {
            assert!(problems.contains(needle), "{needle}: {problems}");
        }
        assert!(Reader::new("config", &serde_json::json!([]), &fields).is_err());
    }
}
