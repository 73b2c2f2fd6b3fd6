//! From TOML text to a checked [`Config`], walking the document by hand so
//! that every problem is found in one pass, each with its dotted path and
//! the line and column the path starts at.

use std::path::Path;

use toml::Table;

use super::*;
use crate::locate::locate;
use crate::problem::{ConfigErrors, Location, Problem};
use crate::walker::{Section, Walker, join, valid_name};

/// The size reader, where the tests have always named it.
#[cfg(test)]
pub(crate) use crate::walker::parse_size;

/// Reads and checks a config file. Relative paths in it are relative to the
/// file's directory; `${ENV}` comes from the process environment.
pub fn load(path: &Path) -> Result<Settings, ConfigErrors> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigErrors {
        problems: vec![Problem {
            path: String::new(),
            message: format!("reading {}: {e}", path.display()),
            location: None,
        }],
    })?;
    parse(&text, base_dir(path), &|name| std::env::var(name).ok())
}

/// The directory a config file's relative paths are relative to.
pub fn base_dir(file: &Path) -> &Path {
    file.parent().unwrap_or(Path::new("."))
}

/// Checks config text. `base_dir` anchors relative paths; `env` answers
/// `${NAME}` in driver config.
pub fn parse(
    text: &str,
    base_dir: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Settings, ConfigErrors> {
    let doc: Table = toml::from_str(text).map_err(|e| ConfigErrors {
        problems: vec![syntax_problem(text, &e)],
    })?;
    let mut w = Walker {
        problems: Vec::new(),
        env,
    };
    let config = w.config(&doc, base_dir);
    if w.problems.is_empty() {
        Ok(config)
    } else {
        locate(text, &mut w.problems);
        Err(ConfigErrors {
            problems: w.problems,
        })
    }
}

/// A TOML syntax error as one line. The crate's own rendering spans several
/// (source line and caret), which would break "one line per problem".
fn syntax_problem(text: &str, e: &toml::de::Error) -> Problem {
    Problem {
        path: String::new(),
        message: format!("not valid TOML: {}", e.message().trim().replace('\n', "; ")),
        location: e.span().map(|span| Location::of(text, span.start)),
    }
}

impl Walker<'_> {
    fn config(&mut self, doc: &Table, base: &Path) -> Settings {
        let mut s = Section::new(String::new(), doc);
        let pool_id = self.required_string(&mut s, "pool-id");
        if pool_id.as_deref().is_some_and(|p| !valid_name(p)) {
            self.problem("pool-id", "must be 1 to 64 of A-Z, a-z, 0-9, `.`, `_`, `-`");
        }
        let dir = |w: &mut Self, s: &mut Section<'_>, key, default: &str| {
            base.join(w.string(s, key).unwrap_or_else(|| default.to_owned()))
        };
        let state_dir = dir(self, &mut s, "state-dir", "berth-data");
        let plugins_dir = dir(self, &mut s, "plugins-dir", "plugins");
        let d = Timings::default();
        let mut timing = |w: &mut Self, key, default| w.duration(&mut s, key).unwrap_or(default);
        let timings = Timings {
            sync_interval: timing(self, "sync-interval", d.sync_interval),
            boot_poll_interval: timing(self, "boot-poll-interval", d.boot_poll_interval),
            leak_grace: timing(self, "leak-grace", d.leak_grace),
            delete_retry: timing(self, "delete-retry", d.delete_retry),
            missing_confirm: timing(self, "missing-confirm", d.missing_confirm),
            quota_pause: timing(self, "quota-pause", d.quota_pause),
            capacity_pause: timing(self, "capacity-pause", d.capacity_pause),
            history: timing(self, "history", d.history),
        };
        let ready = self
            .check(&mut s, "ready")
            .unwrap_or(Readiness::default().check);
        let providers_table = self.table(&mut s, "providers");
        let labels_table = self.table(&mut s, "labels");
        let (api, lease_ttl) = match self.table(&mut s, "api") {
            Some(t) => self.api(t),
            None => (Api::default(), Config::DEFAULT_LEASE_TTL),
        };
        let store = match self.table(&mut s, "store") {
            Some(t) => self.store(t, base),
            None => StoreSettings::default(),
        };
        self.finish(s);

        let mut providers = Vec::new();
        let mut drivers = Vec::new();
        if let Some(t) = providers_table {
            for (name, t) in self.named("providers", t) {
                let (provider, driver) = self.provider(name, t, &plugins_dir);
                providers.push(provider);
                drivers.push(driver);
            }
        }
        let provider_names: Vec<String> = providers.iter().map(|p| p.name.clone()).collect();
        let mut labels = Vec::new();
        let mut backing_names = Vec::new();
        if let Some(t) = labels_table {
            let named = self.named("labels", t);
            for (name, t) in named {
                let (label, backing) = self.label(name, t, &provider_names, ready);
                labels.push(label);
                backing_names.push(backing);
            }
        }
        // Backing labels, now that every label's kind is known.
        for i in 0..labels.len() {
            let Some(backing) = backing_names[i].take() else {
                continue;
            };
            let at = join(&join("labels", &labels[i].name), "backing-label");
            match labels.iter().position(|l| l.name == backing) {
                None => {
                    let known: Vec<&str> = labels.iter().map(|l| l.name.as_str()).collect();
                    self.problem(
                        at,
                        format!("no label `{backing}`; labels are {}", known.join(", ")),
                    );
                }
                Some(j) if j == i => self.problem(at, "a slot label cannot back itself"),
                Some(j) if !matches!(labels[j].kind, LabelKind::Machine { .. }) => self.problem(
                    at,
                    format!("`{backing}` is a slot label; it must be a machine label"),
                ),
                Some(j) => {
                    if let LabelKind::Slots { backing, .. } = &mut labels[i].kind {
                        *backing = LabelIx(j as u16);
                    }
                }
            }
        }
        Settings {
            pool: Config {
                pool_id: pool_id.unwrap_or_default(),
                timings,
                providers,
                labels,
                lease_ttl,
            },
            state_dir,
            plugins_dir,
            drivers,
            api,
            store,
        }
    }

    /// A label, and for a slot label the name of its backing label (resolved
    /// once every label is read). `ready` is the file's default check.
    fn label(
        &mut self,
        name: String,
        t: &Table,
        providers: &[String],
        ready: Check,
    ) -> (Label, Option<String>) {
        let mut s = Section::new(join("labels", &name), t);
        let min_ready = self.int(&mut s, "min-ready", "0 or more").unwrap_or(0);
        let max_ready_age = self.duration(&mut s, "max-ready-age");
        let boot_timeout = self
            .duration(&mut s, "boot-timeout")
            .unwrap_or(Label::DEFAULT_BOOT_TIMEOUT);
        let launch_retries = self
            .int(&mut s, "launch-retries", "0 or more")
            .unwrap_or(Label::DEFAULT_LAUNCH_RETRIES);
        let idle_timeout = self.duration(&mut s, "idle-timeout");
        let reuse = self.bool(&mut s, "reuse").unwrap_or(false);
        let is_slots = t.contains_key("slots") || t.contains_key("backing-label");
        let ready = self.readiness(&mut s, ready, is_slots);
        let mut backing = None;
        let kind = if is_slots {
            let slots = self.int::<u16>(&mut s, "slots", "1 to 1024");
            if s.table.get("slots").is_none() {
                self.problem(s.at("slots"), "missing; a slot label needs it");
            }
            if slots.is_some_and(|n| !(1..=1024).contains(&n)) {
                self.problem(s.at("slots"), "must be 1 to 1024");
            }
            backing = self.required_string(&mut s, "backing-label");
            let grace_time = self
                .duration(&mut s, "grace-time")
                .unwrap_or(Label::DEFAULT_GRACE_TIME);
            if t.contains_key("providers") {
                s.known.push("providers");
                self.problem(
                    s.at("providers"),
                    "a slot label runs on its backing label's providers; remove this table",
                );
            }
            LabelKind::Slots {
                slots: slots.unwrap_or(1).max(1),
                backing: LabelIx(0),
                grace_time,
            }
        } else {
            let mut offers = Vec::new();
            match self.table(&mut s, "providers") {
                None => self.problem(
                    s.at("providers"),
                    "missing; a machine label needs at least one [labels.NAME.providers.PROVIDER] table",
                ),
                Some(t) => {
                    for (pname, t) in self.named(&s.at("providers"), t) {
                        let at = join(&s.at("providers"), &pname);
                        match providers.iter().position(|p| *p == pname) {
                            Some(i) => {
                                if let Some(o) = self.offer(at, t, ProviderIx(i as u16)) {
                                    offers.push(o);
                                }
                            }
                            None => self.problem(
                                at,
                                format!(
                                    "no provider `{pname}`; providers are {}",
                                    if providers.is_empty() {
                                        "none".to_owned()
                                    } else {
                                        providers.join(", ")
                                    }
                                ),
                            ),
                        }
                    }
                    if t.is_empty() {
                        self.problem(s.at("providers"), "names no provider");
                    }
                }
            }
            LabelKind::Machine { offers }
        };
        self.finish(s);
        let label = Label {
            name,
            min_ready,
            max_ready_age,
            boot_timeout,
            launch_retries,
            idle_timeout,
            reuse,
            ready,
            kind,
        };
        (label, backing)
    }

    /// A label's `ready`, `ready-port` and `ready-timeout`; none of them on a
    /// slot label, whose nodes are ready when their backing node is.
    fn readiness(&mut self, s: &mut Section<'_>, default: Check, is_slots: bool) -> Readiness {
        if is_slots {
            for key in ["ready", "ready-port", "ready-timeout"] {
                if s.table.contains_key(key) {
                    s.known.push(key);
                    self.problem(
                        s.at(key),
                        "a slot label's nodes are ready when their backing node is; set this on the backing label",
                    );
                }
            }
            return Readiness::RUNNING;
        }
        let check = self.check(s, "ready").unwrap_or(default);
        let port = self.int::<u16>(s, "ready-port", "1 to 65535");
        if port == Some(0) {
            self.problem(s.at("ready-port"), "must be 1 to 65535");
        }
        let timeout = self
            .duration(s, "ready-timeout")
            .unwrap_or(Readiness::DEFAULT_TIMEOUT);
        if timeout.is_zero() {
            self.problem(s.at("ready-timeout"), "must be more than 0");
        }
        if check == Check::Running {
            for key in ["ready-port", "ready-timeout"] {
                if s.table.contains_key(key) {
                    self.problem(
                        s.at(key),
                        "means nothing with ready = \"running\"; nothing is probed",
                    );
                }
            }
        }
        Readiness {
            check,
            port: port.filter(|p| *p != 0),
            timeout,
        }
    }

    fn offer(&mut self, path: String, t: &Table, provider: ProviderIx) -> Option<Offer> {
        let mut s = Section::new(path, t);
        let instance_type = self.required_string(&mut s, "instance-type");
        let image = self.required_string(&mut s, "image");
        let options = match self.table(&mut s, "options") {
            Some(o) => self.json(&s.at("options"), o, false),
            None => "{}".to_owned(),
        };
        if s.table.get("vcpus").is_none() {
            s.known.push("vcpus");
            self.problem(s.at("vcpus"), "missing; it is required");
        }
        let vcpus = self.int::<u32>(&mut s, "vcpus", "1 or more");
        if vcpus == Some(0) {
            self.problem(s.at("vcpus"), "must be 1 or more");
        }
        if s.table.get("ram").is_none() {
            s.known.push("ram");
            self.problem(s.at("ram"), "missing; it is required");
        }
        let ram = self.size(&mut s, "ram");
        if let Some(b) = ram
            && b % (1 << 20) != 0
        {
            self.problem(s.at("ram"), "must be a whole number of MiB");
        }
        let price = self.number(&mut s, "price").unwrap_or(0.0);
        if !(price.is_finite() && price >= 0.0) {
            self.problem(s.at("price"), "must be 0 or more");
        }
        self.finish(s);
        Some(Offer {
            provider,
            instance_type: instance_type?,
            image: image?,
            options,
            vcpus: vcpus?,
            ram_mib: ram? >> 20,
            price,
        })
    }
}
