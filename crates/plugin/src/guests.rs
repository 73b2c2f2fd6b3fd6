//! Where guest code runs: a tokio runtime of its own, on threads that run at
//! a lower CPU priority than the rest of berth, and the epoch ticker that
//! interrupts guests.
//!
//! Both are held (through an `Arc<Guests>`) by everything that can call into
//! a guest: the plugin [`Engine`](super::Engine), every loaded
//! [`Driver`](super::Driver), every [`Sandbox`](super::Sandbox) and every
//! [`DriverInstance`](super::DriverInstance) an embedder holds. So the ticker
//! cannot stop while a guest may still run: a call deadline is enforced for
//! as long as a guest exists, whoever built the runtime and however long they
//! kept it. (It once lived as long as the `Engine` value, which the service
//! dropped after start: no guest was ever interrupted again.)
//!
//! Guest calls run on this runtime rather than the caller's, so that guests
//! spinning on every core do not stand in the way of the HTTP API or the
//! pool's own task: the OS schedules berth's threads first.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use wasmtime::Engine;

/// The nice value of guest threads: berth's own threads (API, pool) go first.
const GUEST_NICENESS: i32 = 10;

/// The guests' runtime and ticker. See the module docs.
pub(crate) struct Guests {
    runtime: Option<tokio::runtime::Runtime>,
    ticker: Arc<TickerState>,
}

struct TickerState {
    /// Set once nothing holds the runtime any more.
    stop: AtomicBool,
    /// Threads of the guests' runtime that are alive. The ticker keeps
    /// ticking until they are all gone, so a guest still spinning on one of
    /// them while the runtime shuts down is interrupted too.
    threads: AtomicUsize,
}

impl Guests {
    /// Starts `threads` guest threads and the ticker, which advances
    /// `engine`'s epoch every `tick`.
    pub fn start(engine: &Engine, tick: Duration, threads: usize) -> std::io::Result<Arc<Guests>> {
        let ticker = Arc::new(TickerState {
            stop: AtomicBool::new(false),
            threads: AtomicUsize::new(0),
        });
        let (started, stopped) = (ticker.clone(), ticker.clone());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("berth-guest")
            .enable_all()
            .on_thread_start(move || {
                started.threads.fetch_add(1, Ordering::SeqCst);
                lower_priority();
            })
            .on_thread_stop(move || {
                stopped.threads.fetch_sub(1, Ordering::SeqCst);
            })
            .build()?;
        {
            let engine = engine.clone();
            let ticker = ticker.clone();
            std::thread::Builder::new()
                .name("berth-epoch".into())
                .spawn(move || {
                    while !(ticker.stop.load(Ordering::SeqCst)
                        && ticker.threads.load(Ordering::SeqCst) == 0)
                    {
                        std::thread::sleep(tick);
                        engine.increment_epoch();
                    }
                })?;
        }
        Ok(Arc::new(Guests {
            runtime: Some(runtime),
            ticker,
        }))
    }

    /// Runs `future` on a guest thread, in the caller's tracing span and
    /// with its subscriber. Dropping the returned task cancels it.
    pub fn spawn<F>(&self, future: F) -> Task<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        use tracing::Instrument;
        use tracing::instrument::WithSubscriber;
        let runtime = self
            .runtime
            .as_ref()
            .expect("the guests' runtime lives until Guests is dropped");
        let dispatch = tracing::dispatcher::get_default(|d| d.clone());
        let future = future
            .instrument(tracing::Span::current())
            .with_subscriber(dispatch);
        Task(runtime.spawn(future))
    }
}

impl Drop for Guests {
    fn drop(&mut self) {
        self.ticker.stop.store(true, Ordering::SeqCst);
        // Without waiting: this may be dropped on any thread, an async one
        // included. Guests still running are cancelled at their next yield,
        // which the ticker, still going until their threads are gone, forces.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// A future running on a guest thread; cancelled when dropped.
pub(crate) struct Task<T>(tokio::task::JoinHandle<T>);

/// Why a guest task gave no output.
pub(crate) enum TaskLost {
    /// The guests' runtime was shutting down.
    Cancelled,
    /// Host code panicked while running the guest; the message says where.
    Panicked(String),
}

impl<T> Future for Task<T> {
    type Output = Result<T, TaskLost>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map(|joined| {
            joined.map_err(|e| match e.try_into_panic() {
                Ok(payload) => TaskLost::Panicked(berth_core::text::panic_message(&*payload)),
                Err(_) => TaskLost::Cancelled,
            })
        })
    }
}

impl<T> Drop for Task<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Lowers the calling thread's CPU priority (Linux: per thread).
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        let tid = rustix::thread::gettid();
        if rustix::process::setpriority_process(Some(tid), GUEST_NICENESS).is_err() {
            tracing::debug!("could not lower the priority of a guest thread");
        }
    }
}
