//! The `filter` of `instances.list` and `aggregatedList`, in the AIP-160
//! form the Compute Engine reference describes: `FIELD OP VALUE`
//! comparisons (`=`, `!=`, `:`; `:*` tests that a field is set), each
//! optionally in parentheses, joined by `AND` (or by juxtaposition, which
//! means `AND`) and `OR`, `OR` binding tighter than `AND` as AIP-160 says;
//! `NOT` before a term. Values are quoted (`"…"`, `\"` and `\\` escaped) or
//! bare words. The regular-expression form (`eq`, `ne`) is left out: a
//! filter that uses it is refused as invalid, as is any field this fake
//! does not know.

use std::collections::BTreeMap;

/// What a filter is matched against: the fields it may name.
pub(super) struct Fields<'a> {
    pub name: &'a str,
    pub id: &'a str,
    pub status: &'a str,
    /// The machine type's short name (`e2-small`).
    pub machine_type: &'a str,
    /// The zone's short name.
    pub zone: &'a str,
    pub labels: &'a BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Filter {
    All,
    Cmp {
        field: String,
        op: Op,
        value: String,
    },
    Not(Box<Filter>),
    And(Vec<Filter>),
    Or(Vec<Filter>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Op {
    Eq,
    Ne,
    Has,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Open,
    Close,
    Op(Op),
    /// A bare word (a field, `AND`, `OR`, `NOT`, or an unquoted value).
    Word(String),
    Quoted(String),
}

fn tokens(text: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(&c) = chars.peek() {
        match c {
            c if c.is_whitespace() => {
                chars.next();
            }
            '(' => {
                chars.next();
                out.push(Token::Open);
            }
            ')' => {
                chars.next();
                out.push(Token::Close);
            }
            '=' => {
                chars.next();
                out.push(Token::Op(Op::Eq));
            }
            ':' => {
                chars.next();
                out.push(Token::Op(Op::Has));
            }
            '!' => {
                chars.next();
                if chars.next() != Some('=') {
                    return Err("`!` must be followed by `=`".into());
                }
                out.push(Token::Op(Op::Ne));
            }
            '<' | '>' => return Err("ordering comparisons are not supported here".into()),
            '"' | '\'' => {
                let quote = c;
                chars.next();
                let mut value = String::new();
                loop {
                    match chars.next() {
                        None => return Err("unterminated quoted value".into()),
                        Some('\\') => match chars.next() {
                            Some(e) => value.push(e),
                            None => return Err("unterminated quoted value".into()),
                        },
                        Some(q) if q == quote => break,
                        Some(other) => value.push(other),
                    }
                }
                out.push(Token::Quoted(value));
            }
            _ => {
                let mut word = String::new();
                while let Some(&w) = chars.peek() {
                    if w.is_whitespace() || matches!(w, '(' | ')' | '=' | '!' | ':' | '<' | '>') {
                        break;
                    }
                    word.push(w);
                    chars.next();
                }
                out.push(Token::Word(word));
            }
        }
    }
    Ok(out)
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn next(&mut self) -> Option<Token> {
        let t = self.tokens.get(self.at).cloned();
        self.at += 1;
        t
    }

    fn is_word(&self, word: &str) -> bool {
        matches!(self.peek(), Some(Token::Word(w)) if w == word)
    }

    /// `or_expr ( ["AND"] or_expr )*`
    fn and_expr(&mut self) -> Result<Filter, String> {
        let mut terms = vec![self.or_expr()?];
        loop {
            if self.is_word("AND") {
                self.next();
                terms.push(self.or_expr()?);
            } else if matches!(self.peek(), None | Some(Token::Close)) {
                break;
            } else {
                terms.push(self.or_expr()?);
            }
        }
        Ok(if terms.len() == 1 {
            terms.remove(0)
        } else {
            Filter::And(terms)
        })
    }

    /// `term ( "OR" term )*`
    fn or_expr(&mut self) -> Result<Filter, String> {
        let mut terms = vec![self.term()?];
        while self.is_word("OR") {
            self.next();
            terms.push(self.term()?);
        }
        Ok(if terms.len() == 1 {
            terms.remove(0)
        } else {
            Filter::Or(terms)
        })
    }

    fn term(&mut self) -> Result<Filter, String> {
        match self.next() {
            Some(Token::Open) => {
                let inner = self.and_expr()?;
                match self.next() {
                    Some(Token::Close) => Ok(inner),
                    _ => Err("unbalanced parentheses".into()),
                }
            }
            Some(Token::Word(w)) if w == "NOT" => Ok(Filter::Not(Box::new(self.term()?))),
            Some(Token::Word(w)) if w == "AND" || w == "OR" => {
                Err(format!("`{w}` where a comparison was expected"))
            }
            Some(Token::Word(field)) => {
                let op = match self.next() {
                    Some(Token::Op(op)) => op,
                    Some(Token::Word(w)) if w == "eq" || w == "ne" => {
                        return Err("the regular-expression form (eq, ne) is not supported".into());
                    }
                    _ => return Err(format!("no operator after `{field}`")),
                };
                let value = match self.next() {
                    Some(Token::Word(v)) | Some(Token::Quoted(v)) => v,
                    _ => return Err(format!("no value after `{field}`")),
                };
                check_field(&field)?;
                Ok(Filter::Cmp { field, op, value })
            }
            _ => Err("a comparison was expected".into()),
        }
    }
}

fn check_field(field: &str) -> Result<(), String> {
    match field {
        "name" | "id" | "status" | "machineType" | "zone" => Ok(()),
        _ => match field.strip_prefix("labels.") {
            Some(key) if !key.is_empty() => Ok(()),
            _ => Err(format!("unknown field `{field}`")),
        },
    }
}

/// Parses a filter; an empty one matches everything.
pub(super) fn parse(text: &str) -> Result<Filter, String> {
    if text.trim().is_empty() {
        return Ok(Filter::All);
    }
    let mut p = Parser {
        tokens: tokens(text)?,
        at: 0,
    };
    let f = p.and_expr()?;
    if p.at < p.tokens.len() {
        return Err("unbalanced parentheses".into());
    }
    Ok(f)
}

impl Filter {
    pub(super) fn matches(&self, f: &Fields<'_>) -> bool {
        match self {
            Filter::All => true,
            Filter::Not(inner) => !inner.matches(f),
            Filter::And(all) => all.iter().all(|t| t.matches(f)),
            Filter::Or(any) => any.iter().any(|t| t.matches(f)),
            Filter::Cmp { field, op, value } => {
                let got: Option<&str> = match field.as_str() {
                    "name" => Some(f.name),
                    "id" => Some(f.id),
                    "status" => Some(f.status),
                    "machineType" => Some(f.machine_type),
                    "zone" => Some(f.zone),
                    other => other
                        .strip_prefix("labels.")
                        .and_then(|k| f.labels.get(k).map(String::as_str)),
                };
                match op {
                    Op::Eq => got == Some(value.as_str()),
                    Op::Ne => got != Some(value.as_str()),
                    Op::Has if value == "*" => got.is_some(),
                    Op::Has => got.is_some_and(|g| g.contains(value.as_str())),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields<'a>(name: &'a str, labels: &'a BTreeMap<String, String>) -> Fields<'a> {
        Fields {
            name,
            id: "1",
            status: "RUNNING",
            machine_type: "e2-small",
            zone: "us-central1-a",
            labels,
        }
    }

    #[test]
    fn comparisons_joined_as_the_reference_says() {
        let labels: BTreeMap<String, String> = [("berth-pool", "p"), ("env", "ci")]
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect();
        let f = fields("vm-1", &labels);
        for (text, want) in [
            ("", true),
            ("labels.berth-pool = \"p\"", true),
            ("labels.berth-pool = p", true),
            ("labels.berth-pool = \"q\"", false),
            ("(labels.berth-pool = \"p\") (labels.env = \"ci\")", true),
            (
                "(labels.berth-pool = \"p\") AND (labels.env = \"cd\")",
                false,
            ),
            ("labels.berth-pool = \"p\" AND labels.env = \"ci\"", true),
            ("(name = \"vm-2\") OR (name = \"vm-1\")", true),
            ("name = \"vm-2\" OR name = \"vm-3\"", false),
            // OR binds tighter than AND.
            (
                "labels.env = \"x\" AND name = \"vm-2\" OR name = \"vm-1\"",
                false,
            ),
            (
                "labels.env = \"ci\" AND name = \"vm-2\" OR name = \"vm-1\"",
                true,
            ),
            ("labels.owner:*", false),
            ("labels.env:*", true),
            ("NOT labels.env:*", false),
            ("name != \"vm-1\"", false),
            ("status = RUNNING", true),
        ] {
            let parsed = parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(parsed.matches(&f), want, "{text}");
        }
    }

    #[test]
    fn bad_filters_are_refused() {
        for text in [
            "labels.env =",
            "(name = \"a\"",
            "name = \"a\")",
            "name eq a.*",
            "cpuPlatform = x",
            "name < b",
            "\"unterminated",
            "AND name = a",
        ] {
            assert!(parse(text).is_err(), "{text}");
        }
    }
}
