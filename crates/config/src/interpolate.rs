//! `${ENV}` interpolation: strings that read the environment, secrets that
//! must, and a TOML table turned into the JSON text a driver is given.

use toml::{Table, Value};

use crate::problem::ConfigErrors;
use crate::sandbox::Secret;
use crate::walker::{Section, Walker, join};

/// `value` (a driver's config given as JSON, as `berth driver test`'s
/// `provider.json` has it) with `${ENV}` substituted in every string, as
/// `berth.toml` does for `[providers.NAME.config]`.
pub fn interpolate_json(
    value: &serde_json::Value,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<serde_json::Value, ConfigErrors> {
    fn walk(w: &mut Walker<'_>, path: &str, v: &serde_json::Value) -> serde_json::Value {
        use serde_json::Value as J;
        match v {
            J::String(s) => J::String(w.interpolate(path, s)),
            J::Array(a) => J::Array(
                a.iter()
                    .enumerate()
                    .map(|(i, v)| walk(w, &format!("{path}[{i}]"), v))
                    .collect(),
            ),
            J::Object(o) => J::Object(
                o.iter()
                    .map(|(k, v)| (k.clone(), walk(w, &join(path, k), v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
    let mut w = Walker {
        problems: Vec::new(),
        env,
    };
    let out = walk(&mut w, "config", value);
    if w.problems.is_empty() {
        Ok(out)
    } else {
        Err(ConfigErrors {
            problems: w.problems,
        })
    }
}

impl Walker<'_> {
    /// A TOML table as JSON text, `${ENV}` substituted in strings when
    /// `interpolate`.
    pub(crate) fn json(&mut self, path: &str, t: &Table, interpolate: bool) -> String {
        let v = self.json_value(path, &Value::Table(t.clone()), interpolate);
        v.to_string()
    }

    fn json_value(&mut self, path: &str, v: &Value, interpolate: bool) -> serde_json::Value {
        use serde_json::Value as J;
        match v {
            Value::String(s) if interpolate => J::String(self.interpolate(path, s)),
            Value::String(s) => J::String(s.clone()),
            Value::Integer(i) => J::from(*i),
            Value::Float(f) => match serde_json::Number::from_f64(*f) {
                Some(n) => J::Number(n),
                None => {
                    // JSON has no nan or inf; passing null instead would
                    // hand the driver something the file never said.
                    self.problem(
                        path,
                        "nan and inf cannot be passed to a driver (JSON has neither)",
                    );
                    J::Null
                }
            },
            Value::Boolean(b) => J::Bool(*b),
            Value::Datetime(d) => J::String(d.to_string()),
            Value::Array(a) => J::Array(
                a.iter()
                    .enumerate()
                    .map(|(i, v)| self.json_value(&format!("{path}[{i}]"), v, interpolate))
                    .collect(),
            ),
            Value::Table(t) => J::Object(
                t.iter()
                    .map(|(k, v)| (k.clone(), self.json_value(&join(path, k), v, interpolate)))
                    .collect(),
            ),
        }
    }

    /// `${NAME}` from the environment, `$${` for a literal `${`. The value
    /// never appears in a message.
    pub(crate) fn interpolate(&mut self, path: &str, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(i) = rest.find('$') {
            out.push_str(&rest[..i]);
            let after = &rest[i..];
            if let Some(tail) = after.strip_prefix("$${") {
                out.push_str("${");
                rest = tail;
            } else if let Some(tail) = after.strip_prefix("${") {
                match tail.find('}') {
                    Some(end) => {
                        let name = &tail[..end];
                        if name.is_empty() {
                            self.problem(path, "`${}` names no environment variable");
                        } else {
                            match (self.env)(name) {
                                Some(v) => out.push_str(&v),
                                None => self.problem(
                                    path,
                                    format!("environment variable {name} is not set"),
                                ),
                            }
                        }
                        rest = &tail[end + 1..];
                    }
                    None => {
                        self.problem(path, "`${` without a closing `}`");
                        rest = "";
                    }
                }
            } else {
                out.push('$');
                rest = &after[1..];
            }
        }
        out.push_str(rest);
        out
    }

    /// A secret: a string that must come from the environment (`${NAME}`),
    /// since a config file is read by more people than a process's
    /// environment.
    pub(crate) fn secret(
        &mut self,
        s: &mut Section<'_>,
        key: &'static str,
        required: bool,
    ) -> Option<Secret> {
        let v = if required {
            self.required_string(s, key)
        } else {
            self.string(s, key)
        }?;
        if !v.contains("${") {
            self.problem(
                s.at(key),
                "must come from the environment, e.g. \"${NAME}\", not be written in the file",
            );
            return None;
        }
        Some(Secret::new(self.interpolate(&s.at(key), &v)))
    }
}
