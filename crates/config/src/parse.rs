//! From TOML text to a checked [`Config`], walking the document by hand so
//! that every problem is found in one pass, each with its dotted path and
//! the line and column the path starts at.
//!
//! Here: the entry points, and the walk of the document's top level
//! (`pool-id`, the directories, the timings, the default readiness check),
//! which hands each section to the module that reads it and then resolves
//! slot labels' backing labels.

use std::path::Path;

use berth_core::config::{Config, LabelIx, LabelKind, Readiness, Timings};
use toml::Table;

use crate::locate::locate;
use crate::problem::{ConfigErrors, Location, Problem};
use crate::settings::{ApiSettings, Settings, StoreSettings};
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
            idempotency_ttl: timing(self, "idempotency-ttl", d.idempotency_ttl),
            reserve_after: timing(self, "reserve-after", d.reserve_after),
        };
        let ready = self
            .check(&mut s, "ready")
            .unwrap_or(Readiness::default().check);
        let providers_table = self.table(&mut s, "providers");
        let labels_table = self.table(&mut s, "labels");
        let (api, lease_ttl) = match self.table(&mut s, "api") {
            Some(t) => self.api(t, base),
            None => (ApiSettings::default(), Config::DEFAULT_LEASE_TTL),
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
                let (provider, driver) = self.provider(name, t, &plugins_dir, base);
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
        // A client token's cap is its requestor's.
        let requestor_caps = (api.tokens.iter())
            .filter_map(|t| Some((t.name.clone(), t.max_nodes?)))
            .collect();
        Settings {
            pool: Config {
                pool_id: pool_id.unwrap_or_default(),
                timings,
                providers,
                labels,
                requestor_lease_ttl: lease_ttl,
                requestor_caps,
            },
            state_dir,
            plugins_dir,
            drivers,
            api,
            store,
        }
    }
}
