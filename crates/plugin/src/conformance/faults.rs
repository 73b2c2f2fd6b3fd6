//! The error-mapping step's recorded answers: which call a recorded
//! response is given to, and the contract's error case each should come
//! back as.

use std::path::Path;

use serde::Deserialize;

use crate::{CallError, CallErrorKind};
use berth_core::driver::{DriverError, Instance, InstanceState};

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
pub(super) const CASES: [&str; 10] = [
    "ok",
    "failed",
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
    Get,
    Delete,
    SetTags,
}

/// What a call answered when it did not fail: `ok`, `not-found` (a delete
/// of an instance already gone), or `failed` when an instance it returned
/// is in the failed state, with that instance's reason.
#[derive(Debug)]
pub(super) struct Outcome {
    case: &'static str,
    failure: Option<String>,
}

impl Outcome {
    pub(super) fn case(case: &'static str) -> Outcome {
        Outcome {
            case,
            failure: None,
        }
    }

    /// `failed` if any of `instances` is, else `ok`.
    pub(super) fn of(instances: &[Instance]) -> Outcome {
        match instances.iter().find(|i| i.state == InstanceState::Failed) {
            Some(i) => Outcome {
                case: "failed",
                failure: Some(i.failure.clone().unwrap_or_default()),
            },
            None => Outcome::case("ok"),
        }
    }
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
    /// (`rate-limited`, `not-found`, …), `ok`, or `failed` (an instance
    /// the call returned is in the failed state, with a reason).
    pub expect: String,
    /// With `rate-limited`: the `retry-after` the driver must report.
    #[serde(default)]
    pub retry_after_ms: Option<u64>,
    /// With `failed`: text the instance's reason must contain.
    #[serde(default)]
    pub reason: Option<String>,
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
            if f.reason.is_some() && f.expect != "failed" {
                return Err(at(&format!(
                    "entry {n}: reason goes with expect \"failed\" only"
                )));
            }
            let returns_instances =
                matches!(f.call, FaultCall::Create | FaultCall::List | FaultCall::Get);
            if f.expect == "failed" && !returns_instances {
                return Err(at(&format!(
                    "entry {n}: expect \"failed\" goes with a create, list or get, \
                     which return instances; not with {}",
                    f.call
                )));
            }
        }
        Ok(faults)
    }

    /// The recorded body with `{{pool-id}}` and `{{instance-id}}` replaced
    /// by the run's pool id and the id of the instance the cycle created,
    /// so that a recorded instance can be one the driver may return.
    pub(super) fn body_for(&self, pool_id: &str, instance_id: &str) -> String {
        (self.body)
            .replace("{{pool-id}}", pool_id)
            .replace("{{instance-id}}", instance_id)
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
        answer: Result<Outcome, CallError>,
    ) -> Result<String, String> {
        if answered == 0 {
            return Err(format!(
                "the driver sent no request to be answered ({})",
                match &answer {
                    Ok(a) => a.case.to_string(),
                    Err(e) => e.kind.to_string(),
                }
            ));
        }
        let (got, retry_after) = match &answer {
            Ok(a) => (a.case, None),
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
        if let Ok(Outcome {
            failure: Some(reason),
            ..
        }) = &answer
        {
            return match &self.reason {
                _ if reason.trim().is_empty() => {
                    Err("failed, with no reason: berth shows the cloud's reason".into())
                }
                Some(want) if !reason.contains(want.as_str()) => Err(format!(
                    "failed with reason {reason:?}, expected one containing {want:?}"
                )),
                _ => Ok(format!("failed: {reason}")),
            };
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `Fault::from_file` on a file holding `json`: its error, if any.
    fn refusal(json: &str) -> Option<String> {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), json).unwrap();
        Fault::from_file(file.path()).err().map(|e| e.to_string())
    }

    #[test]
    fn a_failed_instance_is_expected_of_calls_that_return_instances_only() {
        for call in ["create", "list", "get"] {
            let json = format!(
                r#"[{{"call": "{call}", "status": 200, "expect": "failed", "reason": "x"}}]"#
            );
            assert_eq!(refusal(&json), None, "{call}");
        }
        let json = r#"[{"call": "delete", "status": 200, "expect": "failed"}]"#;
        let why = refusal(json).unwrap();
        assert!(
            why.contains("entry 0: expect \"failed\" goes with a create"),
            "{why}"
        );
        let json = r#"[{"call": "get", "status": 200, "expect": "ok", "reason": "x"}]"#;
        let why = refusal(json).unwrap();
        assert!(
            why.contains("reason goes with expect \"failed\" only"),
            "{why}"
        );
    }

    #[test]
    fn placeholders_name_the_run_and_its_instance() {
        let fault: Fault = serde_json::from_str(
            r#"{"call": "get", "status": 200, "expect": "failed",
                "body": "{{instance-id}} in {{pool-id}}, {{instance-id}}"}"#,
        )
        .unwrap();
        assert_eq!(fault.body_for("p-1", "i-9"), "i-9 in p-1, i-9");
    }
}
