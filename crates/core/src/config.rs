//! The pool's config: what the pool core decides with. Labels, offers,
//! quotas, rates and timings; no driver files, driver config, credentials or
//! API tokens (those are `berth-config`'s settings for the parts that use
//! them).

use std::time::Duration;

/// Index of a provider in [`Config::providers`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProviderIx(pub u16);

/// Index of a label in [`Config::labels`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LabelIx(pub u16);

/// The pool's config.
#[derive(Clone, Debug)]
pub struct Config {
    /// The ownership tag value: every instance berth creates carries it.
    pub pool_id: String,
    /// Pool-wide timings.
    pub timings: Timings,
    /// Providers, in the order the file names them.
    pub providers: Vec<Provider>,
    /// Labels, in the order the file names them.
    pub labels: Vec<Label>,
    /// How long a requestor's lease lasts after its last call or heartbeat
    /// (`api.lease-ttl`).
    pub requestor_lease_ttl: Duration,
    /// The most nodes each named requestor may hold or have set aside at
    /// once, over every label (`api.tokens.NAME.max-nodes`).
    pub requestor_caps: std::collections::BTreeMap<String, u32>,
}

impl Config {
    pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(600);
}

/// Pool-wide timings, each with a named default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timings {
    /// How often each provider is listed and reconciled (`sync-interval`).
    pub sync_interval: Duration,
    /// How often a provider with booting nodes is listed (`boot-poll-interval`).
    pub boot_poll_interval: Duration,
    /// How long an owned instance no node accounts for is left alone before it
    /// is deleted as leaked (`leak-grace`).
    pub leak_grace: Duration,
    /// How long after a delete an instance still listed is deleted again
    /// (`delete-retry`).
    pub delete_retry: Duration,
    /// How long a node's instance must stay missing from complete lists (two
    /// at least) before berth believes it is gone (`missing-confirm`).
    pub missing_confirm: Duration,
    /// How long creates stay paused after quota-exceeded if no instance goes
    /// away first (`quota-pause`).
    pub quota_pause: Duration,
    /// How long an instance type stays paused on a provider after a capacity
    /// error (`capacity-pause`).
    pub capacity_pause: Duration,
    /// How long a failed or cancelled request, or a gone node, is kept for
    /// clients to read before it is forgotten (`history`).
    pub history: Duration,
    /// How long a request made with an idempotency key is kept at least,
    /// and its key with it (`idempotency-ttl`).
    pub idempotency_ttl: Duration,
    /// How long a pending request waits before it keeps what it needs:
    /// the free nodes of its labels set aside, and room under the limits
    /// for what it still launches, which requests behind it may not take
    /// (`reserve-after`).
    pub reserve_after: Duration,
}

impl Timings {
    pub const DEFAULT_SYNC_INTERVAL: Duration = Duration::from_secs(60);
    pub const DEFAULT_BOOT_POLL_INTERVAL: Duration = Duration::from_secs(5);
    pub const DEFAULT_LEAK_GRACE: Duration = Duration::from_secs(120);
    pub const DEFAULT_DELETE_RETRY: Duration = Duration::from_secs(60);
    pub const DEFAULT_MISSING_CONFIRM: Duration = Duration::from_secs(60);
    pub const DEFAULT_QUOTA_PAUSE: Duration = Duration::from_secs(60);
    pub const DEFAULT_CAPACITY_PAUSE: Duration = Duration::from_secs(300);
    pub const DEFAULT_HISTORY: Duration = Duration::from_secs(3600);
    pub const DEFAULT_IDEMPOTENCY_TTL: Duration = Duration::from_secs(24 * 3600);
    pub const DEFAULT_RESERVE_AFTER: Duration = Duration::from_secs(30);
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            sync_interval: Self::DEFAULT_SYNC_INTERVAL,
            boot_poll_interval: Self::DEFAULT_BOOT_POLL_INTERVAL,
            leak_grace: Self::DEFAULT_LEAK_GRACE,
            delete_retry: Self::DEFAULT_DELETE_RETRY,
            missing_confirm: Self::DEFAULT_MISSING_CONFIRM,
            quota_pause: Self::DEFAULT_QUOTA_PAUSE,
            capacity_pause: Self::DEFAULT_CAPACITY_PAUSE,
            history: Self::DEFAULT_HISTORY,
            idempotency_ttl: Self::DEFAULT_IDEMPOTENCY_TTL,
            reserve_after: Self::DEFAULT_RESERVE_AFTER,
        }
    }
}

/// What the pool knows of a provider: its name and the limits it is kept in.
#[derive(Clone, Debug, PartialEq)]
pub struct Provider {
    pub name: String,
    /// Host-side call rate limit in calls per second (`rate`); `None` is none.
    pub rate: Option<f64>,
    /// Burst size of the rate limiter (`burst`, default: one second's worth).
    pub burst: u32,
    /// Lower is preferred when several providers serve a label (`priority`).
    pub priority: i32,
    /// Driver calls in flight at once (`max-concurrent-calls`), at least 1.
    pub max_calls: u32,
    /// What berth may have on this provider at once.
    pub limits: ProviderLimits,
    /// Removed from the config file while berth ran: no label offers it,
    /// and its nodes are drained (deleted once idle); its instances are
    /// still listed, so that none is lost or leaked. It keeps its index
    /// until berth stops; the next start has no such provider.
    pub retired: bool,
}

impl Provider {
    /// A provider with no rate limit, priority 0, no limits and the default
    /// concurrency.
    pub fn new(name: &str) -> Provider {
        Provider {
            name: name.into(),
            rate: None,
            burst: 1,
            priority: 0,
            max_calls: Provider::DEFAULT_MAX_CALLS,
            limits: ProviderLimits::default(),
            retired: false,
        }
    }

    pub const DEFAULT_MAX_CALLS: u32 = 4;
}

/// Per-provider limits; `None` is unlimited. Creating, booting and deleting
/// nodes count, so concurrent launches never overshoot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProviderLimits {
    pub max_instances: Option<u32>,
    pub max_cores: Option<u32>,
    pub max_ram_mib: Option<u64>,
}

/// A label: what clients ask for.
#[derive(Clone, Debug, PartialEq)]
pub struct Label {
    pub name: String,
    /// Ready nodes kept waiting (`min-ready`).
    pub min_ready: u32,
    /// A ready node older than this is recycled (`max-ready-age`).
    pub max_ready_age: Option<Duration>,
    /// A node not running this long after its create is deleted and
    /// relaunched (`boot-timeout`).
    pub boot_timeout: Duration,
    /// Failed launches tried again before a request fails (`launch-retries`).
    pub launch_retries: u32,
    /// A ready node beyond `min-ready` idle this long is deleted
    /// (`idle-timeout`); `None` keeps it until it is used or too old.
    pub idle_timeout: Option<Duration>,
    /// A node a client returns goes back to ready instead of being deleted
    /// (`reuse`, default false: single use).
    pub reuse: bool,
    /// When a node whose instance runs may be handed out (`ready`). A slot
    /// label's nodes are ready when their backing node is, by its label's.
    pub ready: Readiness,
    /// The most nodes of the label handed out or set aside at once, over
    /// every requestor (`max-nodes`); `None` is no cap.
    pub max_nodes: Option<u32>,
    /// Windows of the week, in UTC, with a `min-ready` of their own
    /// (`[[labels.NAME.schedule]]`); [`Label::min_ready_at`].
    pub schedule: Vec<Window>,
    /// When a request takes the label's last ready node, this many more
    /// are launched beyond `min-ready` (`burst-extra`).
    pub burst_extra: u32,
    /// Machines or slots.
    pub kind: LabelKind,
    /// Removed from the config file while berth ran: asked for no more,
    /// never prewarmed, and its nodes drained (deleted once idle). It keeps
    /// its index until berth stops; the next start has no such label.
    pub retired: bool,
}

/// What shows that a running instance is usable (`ready`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr, strum::EnumString)]
#[strum(serialize_all = "lowercase")]
pub enum Check {
    /// The cloud says it runs; nothing more is asked.
    Running,
    /// Its port accepts a TCP connection.
    Tcp,
    /// An SSH key exchange on its port completes; its host keys are kept.
    Ssh,
}

impl Check {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// How a label's nodes are found ready once their instance runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Readiness {
    pub check: Check,
    /// The port probed (`ready-port`); `None` for the port the instance
    /// reports for logins, or 22 when it reports none.
    pub port: Option<u16>,
    /// How long one probe may take (`ready-timeout`). A failed probe is
    /// tried again until the label's `boot-timeout` runs out.
    pub timeout: Duration,
}

impl Readiness {
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
    /// The port probed when neither the label nor the instance names one.
    pub const DEFAULT_PORT: u16 = 22;

    /// Ready as soon as the cloud says the instance runs.
    pub const RUNNING: Readiness = Readiness {
        check: Check::Running,
        port: None,
        timeout: Readiness::DEFAULT_TIMEOUT,
    };

    /// The default: an SSH key exchange on the instance's login port.
    pub const SSH: Readiness = Readiness {
        check: Check::Ssh,
        port: None,
        timeout: Readiness::DEFAULT_TIMEOUT,
    };
}

impl Default for Readiness {
    fn default() -> Self {
        Readiness::SSH
    }
}

impl Label {
    pub const DEFAULT_BOOT_TIMEOUT: Duration = Duration::from_secs(600);
    pub const DEFAULT_LAUNCH_RETRIES: u32 = 3;
    pub const DEFAULT_GRACE_TIME: Duration = Duration::from_secs(60);

    /// A label with every setting at its default (no ready nodes kept, no
    /// ageing, single use).
    pub fn new(name: &str, kind: LabelKind) -> Label {
        Label {
            name: name.into(),
            min_ready: 0,
            max_ready_age: None,
            boot_timeout: Label::DEFAULT_BOOT_TIMEOUT,
            launch_retries: Label::DEFAULT_LAUNCH_RETRIES,
            idle_timeout: None,
            reuse: false,
            ready: Readiness::default(),
            max_nodes: None,
            schedule: Vec::new(),
            burst_extra: 0,
            kind,
            retired: false,
        }
    }

    /// The `min-ready` in force at `now`: the largest of the schedule's
    /// windows open then, or the label's own outside every window.
    pub fn min_ready_at(&self, now: u64) -> u32 {
        (self.schedule.iter())
            .filter(|w| w.contains(now))
            .map(|w| w.min_ready)
            .max()
            .unwrap_or(self.min_ready)
    }

    /// The next time after `now` (milliseconds since the epoch) at which a
    /// window of the schedule opens or closes, if it has any.
    pub fn next_window_edge(&self, now: u64) -> Option<u64> {
        (self.schedule.iter())
            .flat_map(|w| [w.from, w.to])
            .map(|secs| next_time_of_day(now, secs))
            .min()
    }
}

/// A window of the week, in UTC, with its own `min-ready`: from `from` to
/// `to` (seconds of the day; a `to` not after `from` ends on the next day)
/// on each of `days` (the day it opens).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    /// Bit `d` set: opens on day `d`, Monday 0 to Sunday 6.
    pub days: u8,
    pub from: u32,
    pub to: u32,
    pub min_ready: u32,
}

const DAY_MS: u64 = 86_400_000;

impl Window {
    /// The days a window opens on, as the config file names them, Monday
    /// first (bit 0).
    pub const DAYS: [&'static str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

    /// Whether the window is open at `now` (milliseconds since the epoch,
    /// UTC).
    pub fn contains(&self, now: u64) -> bool {
        let day = now / DAY_MS;
        // 1970-01-01 was a Thursday (3, counting from Monday 0).
        let weekday = |day: u64| ((day + 3) % 7) as u8;
        let opens_on = |day: u64| self.days & (1 << weekday(day)) != 0;
        let secs = ((now % DAY_MS) / 1000) as u32;
        if self.from < self.to {
            opens_on(day) && (self.from..self.to).contains(&secs)
        } else {
            // Past midnight: opened today, or yesterday and not closed yet.
            (opens_on(day) && secs >= self.from) || (day > 0 && opens_on(day - 1) && secs < self.to)
        }
    }
}

/// As a reload's difference shows it: `mon,fri 08:00:00-12:00:00
/// min-ready 6`.
impl std::fmt::Display for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let days: Vec<&str> = (0..7)
            .filter(|d| self.days & (1 << d) != 0)
            .map(|d| Window::DAYS[d])
            .collect();
        let hms = |s: u32| format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
        write!(
            f,
            "{} {}-{} min-ready {}",
            days.join(","),
            hms(self.from),
            hms(self.to),
            self.min_ready
        )
    }
}

/// The first time after `now` (ms since the epoch) that is `secs` seconds
/// into a UTC day.
fn next_time_of_day(now: u64, secs: u32) -> u64 {
    let at = now - now % DAY_MS + u64::from(secs) * 1000;
    if at > now { at } else { at + DAY_MS }
}

/// What a label's nodes are.
#[derive(Clone, Debug, PartialEq)]
pub enum LabelKind {
    /// Each node is one cloud instance from one of these offers.
    Machine { offers: Vec<Offer> },
    /// Up to `slots` nodes share one instance of the backing label.
    Slots {
        slots: u16,
        backing: LabelIx,
        /// A backing instance with every slot free this long is deleted.
        grace_time: Duration,
    },
}

/// How one provider serves a machine label.
#[derive(Clone, Debug, PartialEq)]
pub struct Offer {
    pub provider: ProviderIx,
    pub instance_type: String,
    pub image: String,
    /// Driver-specific label options, JSON text.
    pub options: String,
    pub vcpus: u32,
    pub ram_mib: u64,
    /// Hourly price, in whatever currency the operator uses.
    pub price: f64,
}

impl Config {
    /// Finds a provider by name.
    pub fn provider(&self, name: &str) -> Option<ProviderIx> {
        self.providers
            .iter()
            .position(|p| p.name == name)
            .map(|i| ProviderIx(i as u16))
    }

    /// Finds a label by name.
    pub fn label(&self, name: &str) -> Option<LabelIx> {
        self.labels
            .iter()
            .position(|l| l.name == name)
            .map(|i| LabelIx(i as u16))
    }
}

impl std::ops::Index<ProviderIx> for Config {
    type Output = Provider;
    fn index(&self, ix: ProviderIx) -> &Provider {
        &self.providers[ix.0 as usize]
    }
}

impl std::ops::Index<LabelIx> for Config {
    type Output = Label;
    fn index(&self, ix: LabelIx) -> &Label {
        &self.labels[ix.0 as usize]
    }
}
