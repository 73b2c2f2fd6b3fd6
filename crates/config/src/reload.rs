//! What reading the config file again would change in a running berth: each
//! difference between the running settings and the new file's, by its
//! dotted key, and whether it can change while berth runs. What cannot
//! (the pool's id, the store, where the API listens) makes a reload refused
//! as a whole. Secrets are never shown: a driver's config and credentials
//! and an API token are said to have changed, never what they hold.

use std::fmt;
use std::time::Duration;

use berth_core::config::{Config, Label, LabelIx, LabelKind, Provider, ProviderIx, Readiness};

use crate::settings::{DriverSettings, Settings};
use crate::walker::join;

/// One difference between the running settings and a new file's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Difference {
    /// The dotted key (`labels.small.min-ready`), or the table added or
    /// removed (`providers.sim`).
    pub key: String,
    /// What changed: `2 → 4`, `added`, `removed`, `changed`.
    pub what: String,
    /// Whether a running berth takes it without a restart.
    pub live: bool,
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.what)?;
        if !self.live {
            f.write_str(" (cannot change while berth runs: restart it)")?;
        }
        Ok(())
    }
}

/// Every difference a reload from `running` to `new` would make, in the
/// file's order: top level, `[api]`, `[store]`, providers, labels.
pub fn differences(running: &Settings, new: &Settings) -> Vec<Difference> {
    let mut d = Diff(Vec::new());
    let (a, b) = (&running.pool, &new.pool);
    d.field("pool-id", &a.pool_id, &b.pool_id, false);
    d.field("state-dir", &running.state_dir, &new.state_dir, false);
    // Where every driver file is found: not yet taken live.
    d.field("plugins-dir", &running.plugins_dir, &new.plugins_dir, false);
    let (t, u) = (&a.timings, &b.timings);
    d.field("sync-interval", &t.sync_interval, &u.sync_interval, true);
    d.field(
        "boot-poll-interval",
        &t.boot_poll_interval,
        &u.boot_poll_interval,
        true,
    );
    d.field("leak-grace", &t.leak_grace, &u.leak_grace, true);
    d.field("delete-retry", &t.delete_retry, &u.delete_retry, true);
    d.field(
        "missing-confirm",
        &t.missing_confirm,
        &u.missing_confirm,
        true,
    );
    d.field("quota-pause", &t.quota_pause, &u.quota_pause, true);
    d.field("capacity-pause", &t.capacity_pause, &u.capacity_pause, true);
    d.field("history", &t.history, &u.history, true);
    d.field(
        "idempotency-ttl",
        &t.idempotency_ttl,
        &u.idempotency_ttl,
        true,
    );
    d.field("reserve-after", &t.reserve_after, &u.reserve_after, true);

    let (x, y) = (&running.api, &new.api);
    d.field("api.listen", &x.listen, &y.listen, false);
    d.field("api.advertise", &x.advertise, &y.advertise, false);
    // The files' contents are read again whenever they change, with no
    // reload; which files, and whether there is TLS at all, is the
    // listener's.
    let (t, u) = (x.tls.as_ref(), y.tls.as_ref());
    d.field(
        "api.tls-cert",
        &t.map(|t| &t.cert),
        &u.map(|u| &u.cert),
        false,
    );
    d.field("api.tls-key", &t.map(|t| &t.key), &u.map(|u| &u.key), false);
    let peer_ca = |t: Option<&crate::TlsFiles>| t.and_then(|t| t.peer_ca.clone());
    d.field("api.tls-peer-ca", &peer_ca(t), &peer_ca(u), false);
    d.field(
        "api.allow-plain-http",
        &x.allow_plain_http,
        &y.allow_plain_http,
        false,
    );
    d.field(
        "api.max-connections",
        &x.max_connections,
        &y.max_connections,
        false,
    );
    d.field(
        "api.header-timeout",
        &x.header_timeout,
        &y.header_timeout,
        false,
    );
    d.field("api.body-timeout", &x.body_timeout, &y.body_timeout, false);
    d.field(
        "api.lease-ttl",
        &a.requestor_lease_ttl,
        &b.requestor_lease_ttl,
        true,
    );
    let tokens = |s: &Settings| -> Vec<(String, String, String, Option<u32>)> {
        (s.api.tokens.iter())
            .map(|t| {
                let role = format!("{:?}", t.role);
                (t.name.clone(), role, t.secret.clone(), t.max_nodes)
            })
            .collect()
    };
    d.secret("api.tokens", tokens(running) != tokens(new), true);

    let (s, r) = (&running.store, &new.store);
    d.field(
        "store.sync",
        &format!("{:?}", s.sync),
        &format!("{:?}", r.sync),
        false,
    );
    let url = |p: &Option<crate::Postgres>| p.as_ref().map(|p| p.url.clone());
    d.field("store.url", &url(&s.postgres), &url(&r.postgres), false);
    let ttl = |p: &Option<crate::Postgres>| p.as_ref().map(|p| p.pool_lease_ttl);
    d.field(
        "store.pool-lease-ttl",
        &ttl(&s.postgres),
        &ttl(&r.postgres),
        false,
    );
    let ca = |p: &Option<crate::Postgres>| p.as_ref().and_then(|p| p.ca_file.clone());
    d.field("store.ca-file", &ca(&s.postgres), &ca(&r.postgres), false);

    // A provider removed by an earlier reload is no longer running.
    for (p, driver) in (a.providers.iter().zip(&running.drivers)).filter(|(p, _)| !p.retired) {
        let key = join("providers", &p.name);
        match b.provider(&p.name) {
            None => d.table(
                key,
                "removed: no label offers it, and its nodes are drained (deleted once idle)",
            ),
            Some(ix) => d.provider(&key, (p, driver), (&b.providers[ix.0 as usize], &new[ix])),
        }
    }
    for p in (b.providers.iter()).filter(|p| a.provider(&p.name).is_none_or(|ix| a[ix].retired)) {
        d.table(join("providers", &p.name), "added");
    }
    // A label removed by an earlier reload is no longer running.
    for l in a.labels.iter().filter(|l| !l.retired) {
        let key = join("labels", &l.name);
        match b.label(&l.name) {
            None => d.table(
                key,
                "removed: it is asked for no more, and its nodes are drained (deleted once idle)",
            ),
            Some(ix) => d.label(&key, (running, l), (new, &b.labels[ix.0 as usize])),
        }
    }
    for l in b
        .labels
        .iter()
        .filter(|l| running_label(a, &l.name).is_none())
    {
        d.table(join("labels", &l.name), "added");
    }
    d.0
}

/// The running providers whose driver settings `aligned` (arranged by
/// [`align`]) changes: `driver`, `driver-sha256`, `config`, `allow-hosts`,
/// `credentials` or `sandbox`, or all of them for a provider removed by an
/// earlier reload that the file has again. Each starts its driver afresh
/// with them. By name, in the running order.
pub fn drivers_changed(running: &Settings, aligned: &Settings) -> Vec<String> {
    let settings = |s: &Settings, i: usize| {
        let d = &s.drivers[i];
        (
            d.driver_name.clone(),
            d.driver_sha256.clone(),
            d.driver_config.clone(),
            format!("{:?}", d.allowed_hosts),
            format!("{:?}", d.credentials),
            format!("{:?}", d.sandbox),
        )
    };
    (running.pool.providers.iter().enumerate())
        .filter(|&(i, p)| {
            let Some(q) = aligned.pool.providers.get(i) else {
                return false;
            };
            (p.retired && !q.retired) || settings(running, i) != settings(aligned, i)
        })
        .map(|(_, p)| p.name.clone())
        .collect()
}

/// A label of the running config by name, unless an earlier reload
/// removed it.
fn running_label(c: &Config, name: &str) -> Option<LabelIx> {
    c.label(name).filter(|&ix| !c[ix].retired)
}

/// The new file's settings arranged for the berth running `running`, or
/// every reason the reload is refused as a whole.
///
/// A running pool, its store and its nodes know labels and providers by
/// index, so the arranged settings keep the running ones' indexes: labels
/// the running file has keep their places, and labels added follow, in the
/// new file's order (a slot label's `backing-label` follows its label);
/// providers are put in the running order, with every offer following its
/// provider; labels and providers added follow the running ones. A label
/// or provider the new file no longer has stays at its index, retired
/// ([`Label::retired`], [`Provider::retired`]), until berth stops.
/// Refused: anything that cannot change while berth runs (see
/// [`differences`]), and, not yet taken live, a label's kind or backing
/// label changed.
pub fn align(running: &Settings, new: Settings) -> Result<Settings, Vec<String>> {
    let mut refused: Vec<String> = (differences(running, &new).iter())
        .filter(|d| !d.live)
        .map(ToString::to_string)
        .collect();
    let (a, b) = (&running.pool, &new.pool);
    for l in &a.labels {
        let key = join("labels", &l.name);
        let Some(m) = b.label(&l.name).map(|ix| &b[ix]) else {
            continue;
        };
        let backing = |c: &Config, l: &Label| match &l.kind {
            LabelKind::Machine { .. } => None,
            LabelKind::Slots { backing, .. } => Some(c[*backing].name.clone()),
        };
        if backing(a, l) != backing(b, m) {
            refused.push(format!(
                "{key}: its kind or backing label changed: not yet while berth runs: restart it"
            ));
        }
    }
    if !refused.is_empty() {
        return Err(refused);
    }
    // Each running provider's place: the new file's provider of its name,
    // or, with none, itself retired; then the providers added. The same
    // for labels.
    let mut provider_order: Vec<Result<usize, usize>> = (a.providers.iter().enumerate())
        .map(|(i, p)| b.provider(&p.name).map(|ix| ix.0 as usize).ok_or(i))
        .collect();
    provider_order.extend(
        (0..b.providers.len())
            .filter(|&i| a.provider(&b.providers[i].name).is_none())
            .map(Ok),
    );
    let mut provider_at = vec![ProviderIx(0); b.providers.len()];
    for (to, from) in provider_order.iter().enumerate() {
        if let Ok(from) = from {
            provider_at[*from] = ProviderIx(u16::try_from(to).expect("providers fit their index"));
        }
    }
    let mut label_order: Vec<Result<usize, &Label>> = (a.labels.iter())
        .map(|l| b.label(&l.name).map(|ix| ix.0 as usize).ok_or(l))
        .collect();
    label_order.extend(
        (0..b.labels.len())
            .filter(|&i| a.label(&b.labels[i].name).is_none())
            .map(Ok),
    );
    let mut label_at = vec![LabelIx(0); b.labels.len()];
    for (to, from) in label_order.iter().enumerate() {
        if let Ok(from) = from {
            label_at[*from] = LabelIx(u16::try_from(to).expect("labels fit their index"));
        }
    }

    let Settings {
        pool,
        state_dir,
        plugins_dir,
        drivers,
        api,
        store,
    } = new;
    let mut given: Vec<Option<(Provider, DriverSettings)>> =
        pool.providers.into_iter().zip(drivers).map(Some).collect();
    let (providers, drivers): (Vec<Provider>, Vec<DriverSettings>) = (provider_order.iter())
        .map(|from| match *from {
            Ok(from) => given[from].take().expect("each provider once"),
            Err(removed) => (
                Provider {
                    retired: true,
                    ..a.providers[removed].clone()
                },
                running.drivers[removed].clone(),
            ),
        })
        .unzip();
    let mut labels: Vec<Option<Label>> = pool.labels.into_iter().map(Some).collect();
    let labels = (label_order.iter())
        .map(|from| {
            let from = match from {
                Ok(from) => *from,
                Err(removed) => {
                    return Label {
                        retired: true,
                        ..(*removed).clone()
                    };
                }
            };
            let mut l = labels[from].take().expect("each label once");
            match &mut l.kind {
                LabelKind::Machine { offers } => {
                    for o in offers {
                        o.provider = provider_at[o.provider.0 as usize];
                    }
                }
                LabelKind::Slots { backing, .. } => *backing = label_at[backing.0 as usize],
            }
            l
        })
        .collect();
    Ok(Settings {
        pool: Config {
            providers,
            labels,
            ..pool
        },
        state_dir,
        plugins_dir,
        drivers,
        api,
        store,
    })
}

struct Diff(Vec<Difference>);

impl Diff {
    fn field<T: Shown + PartialEq + ?Sized>(&mut self, key: &str, old: &T, new: &T, live: bool) {
        if old != new {
            self.0.push(Difference {
                key: key.to_owned(),
                what: format!("{} → {}", old.shown(), new.shown()),
                live,
            });
        }
    }

    /// A value that may hold a secret: only whether it changed.
    fn secret(&mut self, key: &str, changed: bool, live: bool) {
        if changed {
            self.0.push(Difference {
                key: key.to_owned(),
                what: "changed".into(),
                live,
            });
        }
    }

    fn table(&mut self, key: String, what: &str) {
        self.0.push(Difference {
            key,
            what: what.into(),
            live: true,
        });
    }

    fn provider(
        &mut self,
        key: &str,
        (p, d): (&Provider, &DriverSettings),
        (q, e): (&Provider, &DriverSettings),
    ) {
        let k = |name: &str| join(key, name);
        self.field(&k("driver"), &d.driver_name, &e.driver_name, true);
        self.field(
            &k("driver-sha256"),
            &d.driver_sha256,
            &e.driver_sha256,
            true,
        );
        self.field(&k("priority"), &p.priority, &q.priority, true);
        self.field(&k("rate"), &p.rate, &q.rate, true);
        self.field(&k("burst"), &p.burst, &q.burst, true);
        self.field(&k("max-concurrent-calls"), &p.max_calls, &q.max_calls, true);
        let (l, m) = (&p.limits, &q.limits);
        self.field(
            &k("limits.max-instances"),
            &l.max_instances,
            &m.max_instances,
            true,
        );
        self.field(&k("limits.max-cores"), &l.max_cores, &m.max_cores, true);
        self.field(&k("limits.max-ram"), &l.max_ram_mib, &m.max_ram_mib, true);
        self.secret(&k("config"), d.driver_config != e.driver_config, true);
        let hosts = |d: &DriverSettings| format!("{:?}", d.allowed_hosts);
        self.field(&k("allow-hosts"), &hosts(d), &hosts(e), true);
        let credentials = |d: &DriverSettings| format!("{:?}", d.credentials);
        self.secret(&k("credentials"), credentials(d) != credentials(e), true);
        let sandbox = |d: &DriverSettings| format!("{:?}", d.sandbox);
        self.secret(&k("sandbox"), sandbox(d) != sandbox(e), true);
    }

    fn label(&mut self, key: &str, (s, l): (&Settings, &Label), (t, m): (&Settings, &Label)) {
        let k = |name: &str| join(key, name);
        self.field(&k("min-ready"), &l.min_ready, &m.min_ready, true);
        self.field(
            &k("max-ready-age"),
            &l.max_ready_age,
            &m.max_ready_age,
            true,
        );
        self.field(&k("boot-timeout"), &l.boot_timeout, &m.boot_timeout, true);
        self.field(
            &k("launch-retries"),
            &l.launch_retries,
            &m.launch_retries,
            true,
        );
        self.field(&k("idle-timeout"), &l.idle_timeout, &m.idle_timeout, true);
        self.field(&k("reuse"), &l.reuse, &m.reuse, true);
        self.field(&k("max-nodes"), &l.max_nodes, &m.max_nodes, true);
        self.field(&k("burst-extra"), &l.burst_extra, &m.burst_extra, true);
        self.field(&k("schedule"), &l.schedule, &m.schedule, true);
        self.field(&k("ready"), &l.ready, &m.ready, true);
        match (&l.kind, &m.kind) {
            (LabelKind::Machine { offers: o }, LabelKind::Machine { offers: n }) => {
                // Offers by provider name: indexes differ between files.
                let by_name = |s: &Settings, offers: &[berth_core::config::Offer]| {
                    let mut v: Vec<(String, String)> = (offers.iter())
                        .map(|o| {
                            let name = s.pool.providers[o.provider.0 as usize].name.clone();
                            let shown = format!(
                                "{} {} {} {} {} {}",
                                o.instance_type, o.image, o.options, o.vcpus, o.ram_mib, o.price
                            );
                            (name, shown)
                        })
                        .collect();
                    v.sort();
                    v
                };
                let (o, n) = (by_name(s, o), by_name(t, n));
                for (provider, offer) in &o {
                    let key = join(&k("providers"), provider);
                    match n.iter().find(|(p, _)| p == provider) {
                        None => self.table(key, "removed"),
                        Some((_, new)) if new != offer => self.table(key, "changed"),
                        Some(_) => {}
                    }
                }
                for (provider, _) in n.iter().filter(|(p, _)| !o.iter().any(|(q, _)| q == p)) {
                    self.table(join(&k("providers"), provider), "added");
                }
            }
            (
                LabelKind::Slots {
                    slots,
                    backing,
                    grace_time,
                },
                LabelKind::Slots {
                    slots: slots2,
                    backing: backing2,
                    grace_time: grace2,
                },
            ) => {
                self.field(&k("slots"), slots, slots2, true);
                let (b, c) = (
                    &s.pool.labels[backing.0 as usize].name,
                    &t.pool.labels[backing2.0 as usize].name,
                );
                self.field(&k("backing-label"), b, c, true);
                self.field(&k("grace-time"), grace_time, grace2, true);
            }
            _ => self.table(
                k("slots"),
                "a machine label became a slot label, or the other way",
            ),
        }
    }
}

/// A value as a difference shows it.
trait Shown {
    fn shown(&self) -> String;
}

macro_rules! shown_by_display {
    ($($t:ty),*) => {$(
        impl Shown for $t {
            fn shown(&self) -> String {
                self.to_string()
            }
        }
    )*};
}
shown_by_display!(
    u16,
    u32,
    u64,
    i32,
    usize,
    f64,
    bool,
    String,
    str,
    std::net::SocketAddr
);

impl Shown for Vec<berth_core::config::Window> {
    /// Each window as it reads (`mon,tue 08:00:00-12:00:00 min-ready 4`),
    /// `; ` between them, or `none`.
    fn shown(&self) -> String {
        if self.is_empty() {
            return "none".into();
        }
        let windows: Vec<String> = self.iter().map(ToString::to_string).collect();
        windows.join("; ")
    }
}

impl Shown for Duration {
    /// As the file writes it: `90s`, `1500ms`.
    fn shown(&self) -> String {
        if self.subsec_millis() == 0 {
            format!("{}s", self.as_secs())
        } else {
            format!("{}ms", self.as_millis())
        }
    }
}

impl Shown for std::path::PathBuf {
    fn shown(&self) -> String {
        self.display().to_string()
    }
}

impl Shown for Readiness {
    fn shown(&self) -> String {
        format!("{self:?}")
    }
}

impl<T: Shown + ?Sized> Shown for &T {
    fn shown(&self) -> String {
        (**self).shown()
    }
}

impl<T: Shown> Shown for Option<T> {
    fn shown(&self) -> String {
        self.as_ref()
            .map_or_else(|| "none".to_owned(), Shown::shown)
    }
}
