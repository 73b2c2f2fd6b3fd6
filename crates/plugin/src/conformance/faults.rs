//! The error-mapping step's recorded answers: which call a recorded
//! response is given to, and the contract's error case each should come
//! back as.

use std::path::Path;

use serde::Deserialize;

use crate::{CallError, CallErrorKind};
use berth_core::driver::DriverError;

/// The contract's name of an error case.
pub(super) fn case(e: &DriverError) -> &'static str {
    match e {
        DriverError::RateLimited { .. } => "rate-limited",
        DriverError::QuotaExceeded(_) => "quota-exceeded",
        DriverError::Capacity { .. } => "capacity",
        DriverError::NotFound(_) => "not-found",
        DriverError::Unauthorized(_) => "unauthorized",
        DriverError::InvalidConfig(_) => "invalid-config",
        DriverError::Transient(_) => "transient",
        DriverError::Permanent(_) => "permanent",
    }
}

/// The answers a fault may expect.
pub(super) const CASES: [&str; 9] = [
    "ok",
    "rate-limited",
    "quota-exceeded",
    "capacity",
    "not-found",
    "unauthorized",
    "invalid-config",
    "transient",
    "permanent",
];

/// The call a recorded response is given to.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, strum::Display)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum FaultCall {
    Create,
    List,
    Delete,
    SetTags,
}

/// One entry of a `--faults` file: a response the cloud gives, and the
/// error case the driver must turn it into.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    /// The call to make while every request is answered with this.
    pub call: FaultCall,
    /// The response's status, headers and body, as the cloud sends them.
    pub status: u16,
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub body: String,
    /// What the driver must answer: an error case of the contract
    /// (`rate-limited`, `not-found`, …) or `ok`.
    pub expect: String,
    /// With `rate-limited`: the `retry-after` the driver must report.
    #[serde(default)]
    pub retry_after_ms: Option<u64>,
    /// A name for the report; `CALL STATUS` by default.
    #[serde(default)]
    pub name: Option<String>,
}

impl Fault {
    /// Reads a `--faults` file: a JSON array of entries.
    pub fn from_file(path: &Path) -> anyhow::Result<Vec<Fault>> {
        let at = |e: &dyn std::fmt::Display| anyhow::anyhow!("{}: {e}", path.display());
        let text = std::fs::read_to_string(path).map_err(|e| at(&e))?;
        let faults: Vec<Fault> = serde_json::from_str(&text).map_err(|e| at(&e))?;
        for (n, f) in faults.iter().enumerate() {
            if !CASES.contains(&f.expect.as_str()) {
                return Err(at(&format!(
                    "entry {n}: expect {:?} is not one of {}",
                    f.expect,
                    CASES.join(", ")
                )));
            }
            if !(100..=599).contains(&f.status) {
                return Err(at(&format!(
                    "entry {n}: status {} is not 100 to 599",
                    f.status
                )));
            }
            if f.retry_after_ms.is_some() && f.expect != "rate-limited" {
                return Err(at(&format!(
                    "entry {n}: retry_after_ms goes with expect \"rate-limited\" only"
                )));
            }
        }
        Ok(faults)
    }

    pub(super) fn title(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| format!("{} {}", self.call, self.status))
    }

    /// Whether the driver's `answer`, after `answered` recorded responses,
    /// is what the entry expects.
    pub(super) fn judge(
        &self,
        answered: u64,
        answer: Result<&str, CallError>,
    ) -> Result<String, String> {
        if answered == 0 {
            return Err(format!(
                "the driver sent no request to be answered ({})",
                match &answer {
                    Ok(a) => (*a).to_string(),
                    Err(e) => e.kind.to_string(),
                }
            ));
        }
        let (got, retry_after) = match &answer {
            Ok(a) => (*a, None),
            Err(CallError {
                kind: CallErrorKind::Driver(e),
                ..
            }) => (
                case(e),
                match e {
                    DriverError::RateLimited { retry_after, .. } => Some(*retry_after),
                    _ => None,
                },
            ),
            Err(e) => return Err(format!("expected {}, got {}", self.expect, e.kind)),
        };
        if got != self.expect {
            let said = match &answer {
                Err(e) => format!(" ({})", e.kind),
                Ok(_) => String::new(),
            };
            return Err(format!("expected {}, got {got}{said}", self.expect));
        }
        match (self.retry_after_ms, retry_after) {
            (Some(want), Some(got)) if got.as_millis() != u128::from(want) => Err(format!(
                "rate-limited with retry-after {}ms, expected {want}ms",
                got.as_millis()
            )),
            (_, Some(after)) => Ok(format!("{got}, retry after {}ms", after.as_millis())),
            _ => Ok(got.to_string()),
        }
    }
}
