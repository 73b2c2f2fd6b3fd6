//! What a driver writes to the host's log: records of the `log` import and
//! lines of its stdout and stderr.
//!
//! All of it is untrusted. Each provider has a rate limit shared by its
//! instances (records beyond it are dropped and counted, and the next record
//! let through says how many were); messages and fields are cut to a size;
//! control and bidirectional characters are escaped, so a driver cannot
//! forge a log line of the host's or hide what it wrote.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use wasmtime_wasi::cli::{IsTerminal, StdoutStream};

use super::bindings;
use super::sandbox::StoreState;
use berth_core::pool::{Bucket, Time};
use berth_core::text::{printable, truncated};

/// Longest message (or stdio line) kept, in bytes.
const MAX_MESSAGE: usize = 4096;
/// Most fields of one record kept.
const MAX_FIELDS: usize = 32;
/// Longest field key and value kept, in bytes.
const MAX_KEY: usize = 64;
const MAX_VALUE: usize = 1024;

/// One provider's gate for driver log records.
pub(crate) struct LogGate {
    provider: Arc<str>,
    started: Instant,
    /// Plain mutex: held only to take a token, never across an await.
    bucket: Mutex<Gate>,
    dropped_total: AtomicU64,
}

struct Gate {
    bucket: Bucket,
    /// Dropped and not yet said.
    dropped: u64,
    /// When the last summary was written.
    said: Option<Time>,
}

/// How often at most a provider's dropped records are summed up in the log.
const SUMMARY_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

impl LogGate {
    /// `rate` records per second, up to five seconds' worth at once.
    pub fn new(provider: Arc<str>, rate: u32) -> LogGate {
        let rate = f64::from(rate.max(1));
        LogGate {
            provider,
            started: Instant::now(),
            bucket: Mutex::new(Gate {
                bucket: Bucket::new(rate, (rate * 5.0).ceil() as u32),
                dropped: 0,
                said: None,
            }),
            dropped_total: AtomicU64::new(0),
        }
    }

    /// Whether one more record may be written now; `Some(n)`: yes, and say
    /// first that `n` were dropped (at most once per [`SUMMARY_EVERY`]).
    fn admit(&self) -> Option<u64> {
        let now = Time(self.started.elapsed().as_millis() as u64);
        let mut gate = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        if gate.bucket.try_take(now) {
            let due = gate.said.is_none_or(|t| now.since(t) >= SUMMARY_EVERY);
            if gate.dropped > 0 && due {
                gate.said = Some(now);
                Some(std::mem::take(&mut gate.dropped))
            } else {
                Some(0)
            }
        } else {
            gate.dropped += 1;
            self.dropped_total.fetch_add(1, Ordering::Relaxed);
            None
        }
    }

    /// Records dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped_total.load(Ordering::Relaxed)
    }

    /// Says, once a record gets through again, how many did not.
    fn say_dropped(&self, n: u64) {
        if n > 0 {
            tracing::warn!(
                provider = %self.provider,
                dropped = n,
                "driver log over its rate limit: records dropped"
            );
        }
    }
}

/// A message or field as it may be logged: cut, then escaped.
fn clean(text: &str, max: usize) -> String {
    printable(&truncated(text, max)).into_owned()
}

impl bindings::berth::driver::log::Host for StoreState {
    async fn log(
        &mut self,
        level: bindings::berth::driver::log::Level,
        message: String,
        fields: Vec<(String, String)>,
    ) -> wasmtime::Result<()> {
        use bindings::berth::driver::log::Level;
        let Some(dropped) = self.log.admit() else {
            return Ok(());
        };
        self.log.say_dropped(dropped);
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
    pub gate: Arc<LogGate>,
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
        if let Some(dropped) = self.out.gate.admit() {
            let text = clean(text, MAX_MESSAGE);
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
