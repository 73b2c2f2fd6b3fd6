//! A problem in a config file, where in the text it is, and the list of
//! them that a failed check returns.

use std::fmt;

/// One problem in a config file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Dotted path of the key (`labels.small.min-ready`); empty for the file.
    pub path: String,
    pub message: String,
    /// Where in the text: the key itself, or for a missing key the table it
    /// is missing from. `None` when the problem has no place in the text.
    pub location: Option<Location>,
}

/// A line and column in config text, both from 1; the column counts
/// characters, not bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    pub line: usize,
    pub column: usize,
}

impl Location {
    pub(crate) fn of(text: &str, offset: usize) -> Self {
        let before = text.get(..offset).unwrap_or(text);
        Location {
            line: before.matches('\n').count() + 1,
            column: before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1,
        }
    }
}

/// `line:column: path: message`, the shape editors and terminals jump from
/// when a file name is put in front.
impl Problem {
    /// A problem of the key at `path` that has no place in the text: what
    /// a file it names holds, say.
    pub fn at(path: impl Into<String>, message: impl Into<String>) -> Problem {
        Problem {
            path: path.into(),
            message: message.into(),
            location: None,
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(Location { line, column }) = self.location {
            write!(f, "{line}:{column}: ")?;
        }
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Every problem found in a config file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigErrors {
    pub problems: Vec<Problem>,
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}
