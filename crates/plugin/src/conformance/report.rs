//! What a conformance run found: one line per step, passed, failed or skipped.

use std::time::{Duration, Instant};

/// One line of a report.
#[derive(Clone, Debug)]
pub struct Step {
    pub name: &'static str,
    /// Also true for a step skipped.
    pub passed: bool,
    /// Not run, for want of what it needs (`detail` says what).
    pub skipped: bool,
    pub duration: Duration,
    pub detail: String,
}

/// What a conformance run found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub steps: Vec<Step>,
}

impl Report {
    /// Whether every step passed.
    pub fn passed(&self) -> bool {
        !self.steps.is_empty() && self.steps.iter().all(|s| s.passed)
    }

    pub(super) fn record(
        &mut self,
        name: &'static str,
        started: Instant,
        result: Result<String, String>,
    ) -> bool {
        let passed = result.is_ok();
        let detail = result.unwrap_or_else(|e| e);
        self.steps.push(Step {
            name,
            passed,
            skipped: false,
            duration: started.elapsed(),
            detail,
        });
        passed
    }

    pub(super) fn skip(&mut self, name: &'static str, why: &str) {
        self.steps.push(Step {
            name,
            passed: true,
            skipped: true,
            duration: Duration::ZERO,
            detail: why.to_string(),
        });
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for s in &self.steps {
            writeln!(
                f,
                "{}  {:<24} {:>9.1}ms  {}",
                match (s.passed, s.skipped) {
                    (_, true) => "SKIP",
                    (true, false) => "PASS",
                    (false, false) => "FAIL",
                },
                s.name,
                s.duration.as_secs_f64() * 1e3,
                s.detail
            )?;
        }
        let count = |f: fn(&Step) -> bool| self.steps.iter().filter(|s| f(s)).count();
        let skipped = count(|s| s.skipped);
        let failed = count(|s| !s.passed);
        let passed = self.steps.len() - skipped - failed;
        write!(f, "{passed} passed, {failed} failed")?;
        if skipped > 0 {
            write!(f, ", {skipped} skipped")?;
        }
        writeln!(f)
    }
}
