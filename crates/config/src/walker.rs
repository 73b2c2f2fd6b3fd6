//! The walker: reads a TOML table key by key into typed values, and
//! collects every problem with its dotted path instead of stopping at the
//! first.
//!
//! Why a walker and not serde derive: a derived `Deserialize` stops at the
//! first problem, and `berth config check` names them all. The reading
//! helpers here are short; most of the walk is checks serde would not make
//! (ranges, cross-references, secrets from the environment only), in the
//! module of each section.

use std::time::Duration;

use berth_core::config::Check;
use toml::{Table, Value};

use crate::problem::Problem;

pub(crate) struct Walker<'a> {
    pub(crate) problems: Vec<Problem>,
    pub(crate) env: &'a dyn Fn(&str) -> Option<String>,
}

/// A table being read: remembers the keys taken so the rest can be named as
/// unknown.
pub(crate) struct Section<'t> {
    pub(crate) path: String,
    pub(crate) table: &'t Table,
    pub(crate) known: Vec<&'static str>,
}

/// `path.key`, the key quoted as TOML would write it when it is not a bare
/// key, so that a name with a dot (`providers."a.b".driver`) stays unambiguous.
pub(crate) fn join(path: &str, key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'));
    let key = if bare {
        key.to_owned()
    } else {
        format!("{key:?}")
    };
    if path.is_empty() {
        key
    } else {
        format!("{path}.{key}")
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::String(_) => "a string",
        Value::Integer(_) => "an integer",
        Value::Float(_) => "a number",
        Value::Boolean(_) => "a boolean",
        Value::Datetime(_) => "a date",
        Value::Array(_) => "an array",
        Value::Table(_) => "a table",
    }
}

pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

impl<'t> Section<'t> {
    pub(crate) fn new(path: String, table: &'t Table) -> Self {
        Section {
            path,
            table,
            known: Vec::new(),
        }
    }

    pub(crate) fn get(&mut self, key: &'static str) -> Option<&'t Value> {
        self.known.push(key);
        self.table.get(key)
    }

    pub(crate) fn at(&self, key: &str) -> String {
        join(&self.path, key)
    }
}

impl Walker<'_> {
    pub(crate) fn problem(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem {
            path: path.into(),
            message: message.into(),
            location: None,
        });
    }

    pub(crate) fn wrong_type(&mut self, path: String, want: &str, v: &Value) {
        self.problem(path, format!("expected {want}, found {}", type_name(v)));
    }

    /// Names every key of `s` that was never asked for.
    pub(crate) fn finish(&mut self, s: Section<'_>) {
        for key in s.table.keys() {
            if !s.known.contains(&key.as_str()) {
                let mut known = s.known.clone();
                known.sort_unstable();
                self.problem(
                    s.at(key),
                    format!("unknown key; expected one of {}", known.join(", ")),
                );
            }
        }
    }

    pub(crate) fn string(&mut self, s: &mut Section<'_>, key: &'static str) -> Option<String> {
        match s.get(key)? {
            Value::String(v) => Some(v.clone()),
            v => {
                self.wrong_type(s.at(key), "a string", v);
                None
            }
        }
    }

    pub(crate) fn required_string(
        &mut self,
        s: &mut Section<'_>,
        key: &'static str,
    ) -> Option<String> {
        if s.table.get(key).is_none() {
            s.known.push(key);
            self.problem(s.at(key), "missing; it is required");
            return None;
        }
        self.string(s, key)
    }

    pub(crate) fn bool(&mut self, s: &mut Section<'_>, key: &'static str) -> Option<bool> {
        match s.get(key)? {
            Value::Boolean(v) => Some(*v),
            v => {
                self.wrong_type(s.at(key), "true or false", v);
                None
            }
        }
    }

    pub(crate) fn int<T: TryFrom<i64>>(
        &mut self,
        s: &mut Section<'_>,
        key: &'static str,
        range: &str,
    ) -> Option<T> {
        match s.get(key)? {
            Value::Integer(v) => match T::try_from(*v) {
                Ok(v) => Some(v),
                Err(_) => {
                    self.problem(s.at(key), format!("{v} is out of range; expected {range}"));
                    None
                }
            },
            v => {
                self.wrong_type(s.at(key), "an integer", v);
                None
            }
        }
    }

    /// `max-nodes`: a cap of 1 or more nodes.
    pub(crate) fn max_nodes(&mut self, s: &mut Section<'_>) -> Option<u32> {
        let max = self.int::<u32>(s, "max-nodes", "1 or more")?;
        if max == 0 {
            self.problem(
                s.at("max-nodes"),
                "must be 1 or more (leave it out for no cap)",
            );
            return None;
        }
        Some(max)
    }

    pub(crate) fn number(&mut self, s: &mut Section<'_>, key: &'static str) -> Option<f64> {
        match s.get(key)? {
            Value::Integer(v) => Some(*v as f64),
            Value::Float(v) => Some(*v),
            v => {
                self.wrong_type(s.at(key), "a number", v);
                None
            }
        }
    }

    /// A readiness check: `running`, `tcp` or `ssh`.
    pub(crate) fn check(&mut self, s: &mut Section<'_>, key: &'static str) -> Option<Check> {
        let text = self.string(s, key)?;
        match text.parse::<Check>() {
            Ok(c) => Some(c),
            Err(_) => {
                self.problem(s.at(key), format!("`{text}` is not running, tcp or ssh"));
                None
            }
        }
    }

    pub(crate) fn duration(&mut self, s: &mut Section<'_>, key: &'static str) -> Option<Duration> {
        let text = self.string(s, key)?;
        match berth_core::duration::parse(&text) {
            Ok(d) => Some(d),
            Err(e) => {
                self.problem(s.at(key), e.to_string());
                None
            }
        }
    }

    pub(crate) fn size(&mut self, s: &mut Section<'_>, key: &'static str) -> Option<u64> {
        let text = self.string(s, key)?;
        match parse_size(&text) {
            Ok(b) => Some(b),
            Err(e) => {
                self.problem(s.at(key), e);
                None
            }
        }
    }

    pub(crate) fn table<'t>(
        &mut self,
        s: &mut Section<'t>,
        key: &'static str,
    ) -> Option<&'t Table> {
        match s.get(key)? {
            Value::Table(t) => Some(t),
            v => {
                self.wrong_type(s.at(key), "a table", v);
                None
            }
        }
    }

    /// The sub-tables of a table of named tables (`[providers.NAME]`).
    pub(crate) fn named<'t>(&mut self, path: &str, t: &'t Table) -> Vec<(String, &'t Table)> {
        let mut out = Vec::new();
        for (name, v) in t {
            let at = join(path, name);
            if !valid_name(name) {
                self.problem(
                    at.clone(),
                    "names are 1 to 64 of A-Z, a-z, 0-9, `.`, `_`, `-`",
                );
            }
            match v {
                Value::Table(t) => out.push((name.clone(), t)),
                v => self.wrong_type(at, "a table", v),
            }
        }
        out
    }
}

/// `512MiB`, `4GiB`, `64KiB`, `1TiB`, `100B`.
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("size `{text}` does not start with a whole number"))?;
    let shift = match unit {
        "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        "TiB" => 40,
        "" => {
            return Err(format!(
                "size `{text}` has no unit; use B, KiB, MiB, GiB or TiB"
            ));
        }
        _ => {
            return Err(format!(
                "size `{text}` has an unknown unit; use B, KiB, MiB, GiB or TiB"
            ));
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size `{text}` is too large"))
}
