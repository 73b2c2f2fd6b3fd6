//! Column values as every backend sees them, so that the rows
//! ([`super::rows`]), what a commit writes ([`super::write`]) and what a load
//! assembles ([`super::load`]) are written once, and a backend only moves
//! [`Val`]s in and out of its own driver.

use super::error::StoreError;

/// One column's value. Integers are 64-bit in every backend's schema.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Val {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
}

impl From<String> for Val {
    fn from(v: String) -> Val {
        Val::Text(v)
    }
}

impl From<&str> for Val {
    fn from(v: &str) -> Val {
        Val::Text(v.to_owned())
    }
}

impl From<i64> for Val {
    fn from(v: i64) -> Val {
        Val::Int(v)
    }
}

impl From<u32> for Val {
    fn from(v: u32) -> Val {
        Val::Int(i64::from(v))
    }
}

impl From<u16> for Val {
    fn from(v: u16) -> Val {
        Val::Int(i64::from(v))
    }
}

impl From<i32> for Val {
    fn from(v: i32) -> Val {
        Val::Int(i64::from(v))
    }
}

impl From<usize> for Val {
    fn from(v: usize) -> Val {
        Val::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}

impl From<f64> for Val {
    fn from(v: f64) -> Val {
        Val::Real(v)
    }
}

impl<T: Into<Val>> From<Option<T>> for Val {
    fn from(v: Option<T>) -> Val {
        v.map_or(Val::Null, Into::into)
    }
}

/// A `u64` (milliseconds, MiB) as a column: SQL integers are signed, and a
/// value past `i64::MAX` is refused rather than wrapped.
pub(super) fn big(v: u64, node: &str, what: &str) -> Result<Val, StoreError> {
    i64::try_from(v)
        .map(Val::Int)
        .map_err(|_| StoreError::Unstorable {
            node: node.to_owned(),
            what: format!("{what} {v} is past what a SQL integer holds"),
        })
}

/// A row as read, by column position, whatever the backend.
pub(super) trait Cells {
    fn int(&self, i: usize) -> Result<Option<i64>, StoreError>;
    fn real(&self, i: usize) -> Result<Option<f64>, StoreError>;
    fn text(&self, i: usize) -> Result<Option<String>, StoreError>;
}

/// Reads typed columns out of [`Cells`], naming the table, row and column of
/// anything that does not fit.
pub(super) struct Reader<'r, C: ?Sized> {
    cells: &'r C,
    table: &'static str,
    pub id: String,
}

impl<'r, C: Cells + ?Sized> Reader<'r, C> {
    /// A reader of `table`'s row `cells`, whose first column is the row's
    /// id (its key, named in every error).
    pub fn new(cells: &'r C, table: &'static str) -> Result<Reader<'r, C>, StoreError> {
        Ok(Reader {
            cells,
            table,
            id: cells.text(0)?.unwrap_or_default(),
        })
    }

    fn corrupt(&self, column: &'static str, what: &str) -> StoreError {
        StoreError::Corrupt {
            table: self.table,
            id: self.id.clone(),
            column,
            what: what.to_owned(),
        }
    }

    pub fn text(&self, i: usize, column: &'static str) -> Result<String, StoreError> {
        self.cells
            .text(i)?
            .ok_or_else(|| self.corrupt(column, "missing"))
    }

    pub fn opt_text(&self, i: usize) -> Result<Option<String>, StoreError> {
        self.cells.text(i)
    }

    pub fn num<T: TryFrom<i64>>(&self, i: usize, column: &'static str) -> Result<T, StoreError> {
        self.opt_num(i, column)?
            .ok_or_else(|| self.corrupt(column, "missing"))
    }

    pub fn opt_num<T: TryFrom<i64>>(
        &self,
        i: usize,
        column: &'static str,
    ) -> Result<Option<T>, StoreError> {
        match self.cells.int(i)? {
            None => Ok(None),
            Some(v) => T::try_from(v)
                .map(Some)
                .map_err(|_| self.corrupt(column, &format!("{v} is out of range"))),
        }
    }

    pub fn real(&self, i: usize, column: &'static str) -> Result<f64, StoreError> {
        self.cells
            .real(i)?
            .ok_or_else(|| self.corrupt(column, "missing"))
    }
}
