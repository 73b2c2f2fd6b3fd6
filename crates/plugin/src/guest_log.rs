//! What a driver writes to the host's log: records of the `log` import and
//! lines of its stdout and stderr.
//!
//! All of it is untrusted. Each provider has two budgets shared by its
//! instances, one of records and one of bytes (records beyond either are
//! dropped and counted, and a record let through says, at most every ten
//! seconds, how many records and bytes were); messages and fields are cut
//! to a size; control, invisible and bidirectional characters are escaped,
//! so a driver cannot forge a log line of the host's or hide what it
//! wrote.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use wasmtime_wasi::cli::{IsTerminal, StdoutStream};

use super::bindings;
use berth_core::pool::{Bucket, Time};
use berth_core::text::{printable, truncated};

/// Longest message (or stdio line) kept, in bytes.
const MAX_MESSAGE: usize = 4096;
/// Most fields of one record kept.
const MAX_FIELDS: usize = 32;
/// Longest field key and value kept, in bytes.
const MAX_KEY: usize = 64;
const MAX_VALUE: usize = 1024;

/// What one record costs of the byte budget besides its message and
/// fields: about the line the host's log makes of it (time, level, target,
/// provider).
pub(crate) const RECORD_OVERHEAD: u64 = 128;

/// One provider's gate for driver log records.
pub(crate) struct LogBudget {
    provider: Arc<str>,
    started: Instant,
    /// Plain mutex: held only to take a token, never across an await.
    bucket: Mutex<Gate>,
    dropped_total: AtomicU64,
    dropped_bytes_total: AtomicU64,
}

struct Gate {
    /// Records.
    bucket: Bucket,
    /// Bytes. A record gets through whenever this is not in debt and is
    /// charged in full ([`Bucket::charge`]), so that a record larger than
    /// the burst is not refused for ever; over any span of time what gets
    /// through stays within `burst + rate × span` and one record.
    bytes: Bucket,
    /// Dropped and not yet said: records and their bytes.
    dropped: Dropped,
    /// When the last summary was written.
    said: Option<Time>,
}

/// Records dropped, and their bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Dropped {
    pub records: u64,
    pub bytes: u64,
}

/// How often at most a provider's dropped records are summed up in the log.
const SUMMARY_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Seconds' worth of a budget a provider may spend at once.
const BURST_SECONDS: u32 = 5;

impl LogBudget {
    /// `rate` records and `bytes` bytes per second, up to
    /// [`BURST_SECONDS`]' worth of each at once.
    pub fn new(provider: Arc<str>, rate: u32, bytes: u64) -> LogBudget {
        let records = f64::from(rate.max(1));
        let bytes = bytes.max(1);
        LogBudget {
            provider,
            started: Instant::now(),
            bucket: Mutex::new(Gate {
                bucket: Bucket::new(records, rate.max(1).saturating_mul(BURST_SECONDS)),
                bytes: Bucket::new(
                    bytes as f64,
                    u32::try_from(bytes.saturating_mul(u64::from(BURST_SECONDS)))
                        .unwrap_or(u32::MAX),
                ),
                dropped: Dropped::default(),
                said: None,
            }),
            dropped_total: AtomicU64::new(0),
            dropped_bytes_total: AtomicU64::new(0),
        }
    }

    /// Whether a record of `bytes` (message and fields as they would be
    /// written) may be written now; `Some(d)`: yes, and say first that `d`
    /// were dropped (at most once per [`SUMMARY_EVERY`]).
    fn admit(&self, bytes: usize) -> Option<Dropped> {
        self.admit_at(bytes, Time(self.started.elapsed().as_millis() as u64))
    }

    /// [`LogBudget::admit`] at `now`.
    fn admit_at(&self, bytes: usize, now: Time) -> Option<Dropped> {
        let cost = bytes as u64 + RECORD_OVERHEAD;
        let mut gate = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        // The record token is taken only once the bytes are known to be
        // there: a record the bytes refuse costs no record.
        if gate.bytes.available(now) > 0.0 && gate.bucket.try_take(now) {
            gate.bytes.charge(cost as f64);
            let due = gate.said.is_none_or(|t| now.since(t) >= SUMMARY_EVERY);
            if gate.dropped.records > 0 && due {
                gate.said = Some(now);
                Some(std::mem::take(&mut gate.dropped))
            } else {
                Some(Dropped::default())
            }
        } else {
            gate.dropped.records += 1;
            gate.dropped.bytes += cost;
            self.dropped_total.fetch_add(1, Ordering::Relaxed);
            self.dropped_bytes_total.fetch_add(cost, Ordering::Relaxed);
            None
        }
    }

    /// Records dropped so far, and their bytes.
    pub fn dropped(&self) -> Dropped {
        Dropped {
            records: self.dropped_total.load(Ordering::Relaxed),
            bytes: self.dropped_bytes_total.load(Ordering::Relaxed),
        }
    }

    /// Says, once a record gets through again, how many did not.
    fn say_dropped(&self, d: Dropped) {
        if d.records > 0 {
            tracing::warn!(
                provider = %self.provider,
                dropped = d.records,
                dropped_bytes = d.bytes,
                "driver log over its rate or byte limit: records dropped"
            );
        }
    }
}

/// A message or field as it may be logged: cut, then escaped.
fn clean(text: &str, max: usize) -> String {
    printable(&truncated(text, max)).into_owned()
}

/// What the `log` import needs: whose records they are and the provider's
/// gate for them.
pub(crate) struct LogCtx {
    pub provider: Arc<str>,
    pub budget: Arc<LogBudget>,
}

impl bindings::v0_1::log::Host for LogCtx {
    async fn log(
        &mut self,
        level: bindings::v0_1::log::Level,
        message: String,
        fields: Vec<(String, String)>,
    ) -> wasmtime::Result<()> {
        use bindings::v0_1::log::Level;
        let message = clean(&message, MAX_MESSAGE);
        let mut fields: Vec<String> = fields
            .iter()
            .take(MAX_FIELDS)
            .map(|(k, v)| format!("{}={}", clean(k, MAX_KEY), clean(v, MAX_VALUE)))
            .collect();
        if fields.len() == MAX_FIELDS {
            fields.push("…".into());
        }
        let fields = fields.join(" ");
        let Some(dropped) = self.budget.admit(message.len() + fields.len()) else {
            return Ok(());
        };
        self.budget.say_dropped(dropped);
        let p = &self.provider;
        match level {
            Level::Trace => tracing::trace!(provider = %p, %fields, "driver: {message}"),
            Level::Debug => tracing::debug!(provider = %p, %fields, "driver: {message}"),
            Level::Info => tracing::info!(provider = %p, %fields, "driver: {message}"),
            Level::Warn => tracing::warn!(provider = %p, %fields, "driver: {message}"),
            Level::Error => tracing::error!(provider = %p, %fields, "driver: {message}"),
        }
        Ok(())
    }
}

/// A guest's stdout or stderr: each complete line becomes a log record.
#[derive(Clone)]
pub(crate) struct GuestOutput {
    pub provider: Arc<str>,
    pub stream: &'static str,
    pub gate: Arc<LogBudget>,
    /// Where the instance's caller logs (stdio is written from a task of
    /// its own).
    pub dispatch: tracing::Dispatch,
    /// Keeps the last line, for trap messages. Plain mutex: never held across
    /// an await.
    pub last: Option<Arc<Mutex<String>>>,
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(LineLogger {
            out: self.clone(),
            line: Vec::new(),
        })
    }
}

struct LineLogger {
    out: GuestOutput,
    line: Vec<u8>,
}

impl LineLogger {
    fn emit(&mut self) {
        let text = String::from_utf8_lossy(&self.line);
        let text = text.trim_end();
        // The last line is kept whether or not it is logged: it is what a
        // panic message says.
        if let Some(last) = &self.out.last
            && let Ok(mut last) = last.lock()
            && !text.is_empty()
        {
            *last = clean(text, MAX_MESSAGE);
        }
        let text = clean(text, MAX_MESSAGE);
        if let Some(dropped) = self.out.gate.admit(text.len()) {
            tracing::dispatcher::with_default(&self.out.dispatch, || {
                self.out.gate.say_dropped(dropped);
                tracing::info!(provider = %self.out.provider, stream = self.out.stream, "driver: {text}");
            });
        }
        self.line.clear();
    }
}

impl tokio::io::AsyncWrite for LineLogger {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        for &b in buf {
            if b == b'\n' {
                self.emit();
            } else if self.line.len() < MAX_MESSAGE {
                self.line.push(b);
            }
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if !self.line.is_empty() {
            self.emit();
        }
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admit_at(gate: &LogBudget, bytes: usize, now: Time) -> bool {
        gate.admit_at(bytes, now).is_some()
    }

    #[test]
    fn bytes_are_budgeted_as_well_as_records() {
        // 1,000 records a second, 10,000 bytes: the bytes decide.
        let gate = LogBudget::new("p".into(), 1000, 10_000);
        let record = 4096 - RECORD_OVERHEAD as usize;
        let mut written = 0u64;
        // Ten seconds of a driver writing as fast as it can.
        for ms in 0..10_000u64 {
            for _ in 0..10 {
                if admit_at(&gate, record, Time(ms)) {
                    written += 4096;
                }
            }
        }
        // At most the burst (five seconds' worth), ten seconds of the rate
        // and one record.
        let most = 50_000 + 10 * 10_000 + 4096;
        assert!(written <= most, "{written} bytes written, at most {most}");
        assert!(written >= 100_000, "{written} bytes written");
    }

    #[test]
    fn a_record_larger_than_the_burst_still_gets_through() {
        let gate = LogBudget::new("p".into(), 100, 1000);
        assert!(admit_at(&gate, 40_000, Time(0)));
        // Then the debt is paid back before the next.
        assert!(!admit_at(&gate, 10, Time(1000)));
        assert!(admit_at(&gate, 10, Time(40_000)));
    }

    #[test]
    fn what_is_dropped_is_counted_in_records_and_bytes() {
        let gate = LogBudget::new("p".into(), 1, 1_000_000);
        let mut dropped = 0;
        for _ in 0..20 {
            if gate.admit(100).is_none() {
                dropped += 1;
            }
        }
        assert!(dropped >= 10, "{dropped}");
        assert_eq!(
            gate.dropped(),
            Dropped {
                records: dropped,
                bytes: dropped * (100 + RECORD_OVERHEAD)
            }
        );
    }
}
