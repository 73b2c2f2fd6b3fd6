//! The thin async runtime around the pool core: one task owns the [`Pool`]
//! and the store, takes commands and driver outcomes as one closed
//! [`Event`] stream, and after each batch of events writes the core's changes
//! to the store *before* it starts the driver calls the core asked for
//! (intent before act). Driver calls run on their own tasks and report back
//! as events.
//!
//! Clients talk to it through a cloneable [`Handle`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::config::{Config, ProviderIx};
use crate::driver::{Instance, POOL_TAG, Tags};
use crate::plugin::{self, CallError, CallErrorKind, Provider, ProviderConfig};
use crate::pool::{
    Conflict, Effect, Failure, Idle, NewRequest, NodeId, Notice, Pool, Refused, Request, RequestId,
    RequestState, Time,
};
use crate::store::{SqliteStore, Store};

/// Wall-clock time as the core sees it, advanced by tokio's clock so that
/// tests with paused time control it.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    base: Time,
    start: tokio::time::Instant,
}

impl Clock {
    /// A clock reading the system's wall-clock time now.
    pub fn system() -> Clock {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Clock::starting_at(Time(ms))
    }

    /// A clock reading `base` now.
    pub fn starting_at(base: Time) -> Clock {
        Clock {
            base,
            start: tokio::time::Instant::now(),
        }
    }

    pub fn now(&self) -> Time {
        self.base + self.start.elapsed()
    }

    fn instant(&self, t: Time) -> tokio::time::Instant {
        self.start + t.since(self.base)
    }
}

/// Why the pool could not do what a client asked.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Refused(#[from] Refused),
    #[error(transparent)]
    Conflict(#[from] Conflict),
    #[error("the pool has stopped")]
    Stopped,
}

type Reply<T> = oneshot::Sender<Result<T, ServiceError>>;

/// Everything the pool's task reacts to.
enum Event {
    Submit(NewRequest, Reply<RequestId>),
    Cancel(RequestId, Reply<()>),
    Release(NodeId, Reply<()>),
    SetIdle(NodeId, Idle, Reply<()>),
    Delete(NodeId, Reply<()>),
    /// Answer once the request is no longer pending.
    Wait(RequestId, oneshot::Sender<Option<Request>>),
    Inspect(Box<dyn FnOnce(&Pool) + Send>),
    Created(NodeId, Result<Instance, Failure>),
    Deleted(ProviderIx, Option<NodeId>, String, Result<(), Failure>),
    Listed(ProviderIx, Time, Result<Vec<Instance>, Failure>),
    Tagged(NodeId, Result<(), Failure>),
}

/// A client's way in to a running pool. Cheap to clone.
#[derive(Clone)]
pub struct Handle {
    tx: mpsc::UnboundedSender<Event>,
    config: Arc<Config>,
}

impl Handle {
    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Event) -> Result<T, ServiceError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(make(tx)).map_err(|_| ServiceError::Stopped)?;
        rx.await.map_err(|_| ServiceError::Stopped)?
    }

    /// Takes a request; see [`Handle::wait`] for its outcome.
    pub async fn submit(&self, new: NewRequest) -> Result<RequestId, ServiceError> {
        self.ask(|r| Event::Submit(new, r)).await
    }

    pub async fn cancel(&self, id: RequestId) -> Result<(), ServiceError> {
        self.ask(|r| Event::Cancel(id, r)).await
    }

    pub async fn release(&self, id: NodeId) -> Result<(), ServiceError> {
        self.ask(|r| Event::Release(id, r)).await
    }

    pub async fn set_idle(&self, id: NodeId, idle: Idle) -> Result<(), ServiceError> {
        self.ask(|r| Event::SetIdle(id, idle, r)).await
    }

    pub async fn delete(&self, id: NodeId) -> Result<(), ServiceError> {
        self.ask(|r| Event::Delete(id, r)).await
    }

    /// Waits until a request is fulfilled, failed or cancelled; `None` if
    /// there is no such request.
    pub async fn wait(&self, id: RequestId) -> Result<Option<Request>, ServiceError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Event::Wait(id, tx))
            .map_err(|_| ServiceError::Stopped)?;
        rx.await.map_err(|_| ServiceError::Stopped)
    }

    /// Reads the pool's state on its own task.
    pub async fn inspect<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Pool) -> R + Send + 'static,
    ) -> Result<R, ServiceError> {
        let (tx, rx) = oneshot::channel();
        let event = Event::Inspect(Box::new(move |pool| {
            let _ = tx.send(f(pool));
        }));
        self.tx.send(event).map_err(|_| ServiceError::Stopped)?;
        rx.await.map_err(|_| ServiceError::Stopped)
    }
}

/// A running pool: its handle and its task.
pub struct Service {
    pub handle: Handle,
    task: JoinHandle<anyhow::Result<()>>,
    shutdown: Option<oneshot::Sender<()>>,
}

impl Service {
    /// Starts the pool's task on `pool` with its providers (one per
    /// configured provider, same order) and store.
    pub fn spawn(
        pool: Pool,
        providers: Vec<Arc<Provider>>,
        store: Box<dyn Store>,
        clock: Clock,
    ) -> Service {
        let (tx, rx) = mpsc::unbounded_channel();
        let (stop_tx, stop_rx) = oneshot::channel();
        let config = pool.config().clone();
        let run = Loop {
            pool,
            providers,
            store,
            clock,
            events: tx.clone(),
            waiters: HashMap::new(),
            effects: Vec::new(),
            replies: Vec::new(),
        };
        let task = tokio::spawn(run.run(rx, stop_rx));
        Service {
            handle: Handle { tx, config },
            task,
            shutdown: Some(stop_tx),
        }
    }

    /// Stops taking events, writes what is pending, and returns the task's
    /// outcome. Driver calls still in flight are abandoned; their intents are
    /// stored, so the next start resolves them.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        self.task.await.context("pool task panicked")?
    }
}

/// Options for [`start`] beyond the config file.
#[derive(Clone, Debug, Default)]
pub struct StartOptions {
    /// Seed for node and request ids; random when `None`.
    pub seed: Option<u64>,
}

/// Loads the configured drivers, opens the store in the state directory,
/// restores the pool from it, and starts it.
pub async fn start(config: Config, options: StartOptions) -> anyhow::Result<Service> {
    let config = Arc::new(config);
    std::fs::create_dir_all(&config.state_dir).with_context(|| {
        format!(
            "creating the state directory {}",
            config.state_dir.display()
        )
    })?;
    let runtime = plugin::Runtime::new(plugin::RuntimeConfig {
        cache_dir: Some(config.state_dir.join("cache")),
        ..Default::default()
    })?;
    let mut drivers: HashMap<PathBuf, plugin::Driver> = HashMap::new();
    let mut providers = Vec::new();
    for p in &config.providers {
        if !drivers.contains_key(&p.driver) {
            let driver = runtime
                .load_file(&p.driver)
                .await
                .with_context(|| format!("provider `{}`: loading its driver", p.name))?;
            drivers.insert(p.driver.clone(), driver);
        }
        let provider = Provider::start(
            &drivers[&p.driver],
            ProviderConfig {
                name: p.name.clone(),
                pool_id: config.pool_id.clone(),
                driver_config: p.driver_config.clone(),
                allowed_hosts: p.allowed_hosts.clone(),
                limits: p.sandbox.clone(),
            },
        );
        provider
            .warm()
            .await
            .with_context(|| format!("provider `{}`: starting its driver", p.name))?;
        providers.push(Arc::new(provider));
    }
    let path = config.state_dir.join("berth.db");
    let mut store = SqliteStore::open(&path, config.clone())
        .with_context(|| format!("opening the store {}", path.display()))?;
    let loaded = store.load(&config).context("loading the store")?;
    for note in &loaded.dropped {
        tracing::warn!("store: {note}");
    }
    let clock = Clock::system();
    let seed = options.seed.unwrap_or_else(rand::random);
    let pool = Pool::restore(config.clone(), seed, loaded.snapshot, clock.now());
    tracing::info!(
        providers = config.providers.len(),
        labels = config.labels.len(),
        nodes = pool.nodes().count(),
        "pool started"
    );
    Ok(Service::spawn(pool, providers, Box::new(store), clock))
}

struct Loop {
    pool: Pool,
    providers: Vec<Arc<Provider>>,
    store: Box<dyn Store>,
    clock: Clock,
    events: mpsc::UnboundedSender<Event>,
    waiters: HashMap<RequestId, Vec<oneshot::Sender<Option<Request>>>>,
    effects: Vec<Effect>,
    /// Answers to commands, sent after the step's changes are stored.
    replies: Vec<Box<dyn FnOnce() + Send>>,
}

fn answer<T: Send + 'static, E: Into<ServiceError> + Send + 'static>(
    reply: Reply<T>,
    result: Result<T, E>,
) -> Box<dyn FnOnce() + Send> {
    Box::new(move || {
        let _ = reply.send(result.map_err(Into::into));
    })
}

/// Events taken in one batch before the store is written: enough to
/// amortise a commit under load, few enough to keep latency low.
const BATCH: usize = 256;

impl Loop {
    async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<Event>,
        mut stop: oneshot::Receiver<()>,
    ) -> anyhow::Result<()> {
        loop {
            let wake = self.pool.next_wakeup().map(|t| self.clock.instant(t));
            let event = tokio::select! {
                biased;
                _ = &mut stop => break,
                e = rx.recv() => match e {
                    Some(e) => Some(e),
                    None => break,
                },
                _ = sleep_until(wake) => None,
            };
            if let Some(e) = event {
                self.handle(e);
                for _ in 1..BATCH {
                    match rx.try_recv() {
                        Ok(e) => self.handle(e),
                        Err(_) => break,
                    }
                }
            }
            self.step()?;
        }
        // Write whatever the last events changed, then answer for it.
        let changes = self.pool.take_changes();
        if !changes.is_empty() {
            self.store.commit(&changes).context("writing the store")?;
        }
        for reply in self.replies.drain(..) {
            reply();
        }
        Ok(())
    }

    fn handle(&mut self, event: Event) {
        let now = self.clock.now();
        let pool = &mut self.pool;
        let replies = &mut self.replies;
        match event {
            Event::Submit(new, reply) => replies.push(answer(reply, pool.submit(now, new))),
            Event::Cancel(id, reply) => replies.push(answer(reply, pool.cancel(now, id))),
            Event::Release(id, reply) => replies.push(answer(reply, pool.release(now, id))),
            Event::SetIdle(id, idle, reply) => {
                replies.push(answer(reply, pool.set_idle(now, id, idle)))
            }
            Event::Delete(id, reply) => replies.push(answer(reply, pool.delete(now, id))),
            Event::Wait(id, reply) => match pool.request(id) {
                None => {
                    let _ = reply.send(None);
                }
                Some(r) if r.state != RequestState::Pending => {
                    let _ = reply.send(Some(r.clone()));
                }
                Some(_) => self.waiters.entry(id).or_default().push(reply),
            },
            Event::Inspect(f) => f(pool),
            Event::Created(id, r) => pool.created(now, id, r),
            Event::Deleted(p, node, instance, r) => pool.deleted(now, p, node, &instance, r),
            Event::Listed(p, started, r) => pool.listed(now, p, started, r),
            Event::Tagged(id, r) => pool.tagged(now, id, r),
        }
    }

    /// Decide, store, then act.
    fn step(&mut self) -> anyhow::Result<()> {
        let now = self.clock.now();
        self.pool.tick(now, &mut self.effects);
        let changes = self.pool.take_changes();
        if !changes.is_empty() {
            // A store that cannot be written stops the pool: acting on the
            // cloud without a stored intent is how machines leak.
            self.store.commit(&changes).context("writing the store")?;
        }
        // Clients hear of what they asked only once it is stored: a request
        // id a client holds survives a crash.
        for reply in self.replies.drain(..) {
            reply();
        }
        for notice in self.pool.take_notices() {
            self.log(notice);
        }
        if !self.waiters.is_empty() {
            let pool = &self.pool;
            self.waiters.retain(|id, waiters| match pool.request(*id) {
                Some(r) if r.state == RequestState::Pending => true,
                r => {
                    for w in waiters.drain(..) {
                        let _ = w.send(r.cloned());
                    }
                    false
                }
            });
        }
        for effect in self.effects.drain(..) {
            call(
                effect,
                &self.providers,
                &self.pool.config().pool_id,
                self.clock,
                self.events.clone(),
            );
        }
        Ok(())
    }

    fn log(&self, notice: Notice) {
        let config = self.pool.config();
        let pname = |p: ProviderIx| config[p].name.as_str();
        match notice {
            Notice::Foreign { provider, count } => tracing::info!(
                provider = pname(provider),
                count,
                "instances without this pool's id are listed; berth leaves them alone"
            ),
            Notice::LeakDeleted { provider, instance } => tracing::warn!(
                provider = pname(provider),
                %instance,
                "deleted a leaked instance (owned by this pool, no node accounts for it)"
            ),
            Notice::Adopted { node, instance } => {
                tracing::info!(%node, %instance, "adopted an instance from its tags")
            }
            Notice::Vanished { node } => {
                tracing::warn!(%node, "the node's instance disappeared")
            }
            Notice::RequestFailed { request, reason } => {
                tracing::warn!(%request, %reason, "request failed")
            }
            Notice::QuotaPaused { provider, until } => tracing::warn!(
                provider = pname(provider),
                until_ms = until.as_millis(),
                "quota exceeded; creates paused"
            ),
            Notice::RateLimited { provider, until } => tracing::warn!(
                provider = pname(provider),
                until_ms = until.as_millis(),
                "rate limited; every call held"
            ),
            Notice::CapacityPaused {
                provider,
                instance_type,
                until,
            } => tracing::warn!(
                provider = pname(provider),
                instance_type = instance_type.as_deref().unwrap_or("all"),
                until_ms = until.as_millis(),
                "no capacity; instance type paused"
            ),
            Notice::LeaseExpired {
                requestor,
                failed,
                reclaimed,
            } => tracing::warn!(
                %requestor,
                failed,
                reclaimed,
                "a requestor stopped renewing its lease; its pending requests failed and its nodes were taken back"
            ),
        }
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn failure(e: CallError) -> Failure {
    match e.kind {
        CallErrorKind::Driver(d) => Failure::Driver(d),
        _ => Failure::Host(e.to_string()),
    }
}

/// Carries out one effect on its own task; the outcome comes back as an event.
fn call(
    effect: Effect,
    providers: &[Arc<Provider>],
    pool_id: &str,
    clock: Clock,
    events: mpsc::UnboundedSender<Event>,
) {
    let p = match &effect {
        Effect::Create { provider, .. }
        | Effect::Delete { provider, .. }
        | Effect::List { provider }
        | Effect::SetTags { provider, .. } => *provider,
    };
    let provider = providers[p.0 as usize].clone();
    let pool_id = pool_id.to_owned();
    tokio::spawn(async move {
        let event = match effect {
            Effect::Create { node, spec, .. } => {
                Event::Created(node, provider.create(spec).await.map_err(failure))
            }
            Effect::Delete { node, instance, .. } => {
                let r = provider
                    .delete(&instance)
                    .await
                    .map(|_| ())
                    .map_err(failure);
                Event::Deleted(p, node, instance, r)
            }
            Effect::List { .. } => {
                let started = clock.now();
                let filter: Tags = [(POOL_TAG.to_owned(), pool_id)].into();
                Event::Listed(p, started, provider.list(filter).await.map_err(failure))
            }
            Effect::SetTags {
                node,
                instance,
                tags,
                ..
            } => Event::Tagged(
                node,
                provider.set_tags(&instance, tags).await.map_err(failure),
            ),
        };
        // The pool may have stopped; its stored intents cover the outcome.
        let _ = events.send(event);
    });
}
