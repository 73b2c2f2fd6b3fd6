//! A provider (`[providers.NAME]`): what the pool core decides with (rate,
//! burst, priority, limits) and how its driver runs (the driver file, its
//! config, the allow-list, credentials and sandbox limits).

use std::path::{Path, PathBuf};

use berth_core::config::{Provider, ProviderLimits};
use toml::{Table, Value};

use crate::inside::name_problem;
use crate::sandbox::{AllowedHost, SandboxLimits};
use crate::settings::DriverSettings;
use crate::walker::{Section, Walker, join};

impl Walker<'_> {
    pub(crate) fn provider(
        &mut self,
        name: String,
        t: &Table,
        plugins_dir: &Path,
        base: &Path,
    ) -> (Provider, DriverSettings) {
        let mut s = Section::new(join("providers", &name), t);
        let driver_name = self.required_string(&mut s, "driver").map(PathBuf::from);
        if let Some(d) = &driver_name
            && let Some(why) = name_problem(d)
        {
            self.problem(
                s.at("driver"),
                format!(
                    "`{}` {why}: a driver is named by its path relative to plugins-dir ({}), \
                     a file inside it, without `..`; put the file there",
                    d.display(),
                    plugins_dir.display()
                ),
            );
        }
        let driver_name = driver_name.unwrap_or_default();
        let driver = plugins_dir.join(&driver_name);
        let driver_sha256 = self.string(&mut s, "driver-sha256").and_then(|d| {
            let lower = d.trim().to_ascii_lowercase();
            if lower.len() == 64 && lower.bytes().all(|b| b.is_ascii_hexdigit()) {
                Some(lower)
            } else {
                self.problem(
                    s.at("driver-sha256"),
                    "must be the driver file's sha256: 64 hex digits (`sha256sum FILE`)",
                );
                None
            }
        });
        let priority = self
            .int::<i32>(&mut s, "priority", "a 32-bit integer")
            .unwrap_or(0);
        let rate = self.number(&mut s, "rate");
        if let Some(r) = rate
            && !(r.is_finite() && r > 0.0)
        {
            self.problem(s.at("rate"), "must be a number of calls per second above 0");
        }
        let burst = self.int::<u32>(&mut s, "burst", "1 or more");
        if burst == Some(0) {
            self.problem(s.at("burst"), "must be 1 or more");
        }
        let burst = burst
            .unwrap_or_else(|| rate.map_or(1, |r| r.ceil().clamp(1.0, f64::from(u32::MAX)) as u32))
            .max(1);
        let mut sandbox = SandboxLimits::default();
        if let Some(n) = self.int::<usize>(&mut s, "max-concurrent-calls", "1 or more") {
            if n == 0 {
                self.problem(s.at("max-concurrent-calls"), "must be 1 or more");
            }
            sandbox.max_instances = n.max(1);
        }
        let mut allowed_hosts = Vec::new();
        match s.get("allow-hosts") {
            None => {}
            Some(Value::Array(a)) => {
                for (i, v) in a.iter().enumerate() {
                    let at = format!("{}[{i}]", s.at("allow-hosts"));
                    match v {
                        Value::String(h) => match AllowedHost::parse(h) {
                            Ok(h) => allowed_hosts.push(h),
                            Err(e) => self.problem(at, e),
                        },
                        v => self.wrong_type(at, "a string", v),
                    }
                }
            }
            Some(v) => self.wrong_type(s.at("allow-hosts"), "an array of hosts", v),
        }
        let credentials = match s.get("credentials") {
            None => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .enumerate()
                .filter_map(|(i, v)| {
                    let at = format!("{}[{i}]", s.at("credentials"));
                    match v {
                        Value::Table(t) => self.credential(at, t, &allowed_hosts, base),
                        v => {
                            self.wrong_type(at, "a table", v);
                            None
                        }
                    }
                })
                .collect(),
            Some(v) => {
                self.wrong_type(
                    s.at("credentials"),
                    "an array of tables ([[providers.NAME.credentials]])",
                    v,
                );
                Vec::new()
            }
        };
        let driver_config = match self.table(&mut s, "config") {
            Some(c) => self.json(&s.at("config"), c, true),
            None => "{}".to_owned(),
        };
        if let Some(t) = self.table(&mut s, "sandbox") {
            let mut b = Section::new(s.at("sandbox"), t);
            if let Some(m) = self.size(&mut b, "memory") {
                sandbox.memory_bytes = m;
            }
            if let Some(d) = self.duration(&mut b, "call-deadline") {
                sandbox.call_deadline = d;
            }
            if let Some(m) = self.size(&mut b, "max-response") {
                sandbox.max_response_bytes = m;
            }
            if let Some(n) = self.int::<usize>(&mut b, "max-outbound", "1 or more") {
                if n == 0 {
                    self.problem(b.at("max-outbound"), "must be 1 or more");
                }
                sandbox.max_outbound = n.max(1);
            }
            if let Some(n) = self.int::<usize>(&mut b, "max-outbound-per-instance", "1 or more") {
                if n == 0 {
                    self.problem(b.at("max-outbound-per-instance"), "must be 1 or more");
                }
                sandbox.max_outbound_per_instance = n.max(1);
            }
            if let Some(m) = self.size(&mut b, "host-memory") {
                if m < 1 << 20 {
                    self.problem(b.at("host-memory"), "must be at least 1MiB");
                }
                sandbox.host_memory_bytes = m.max(1 << 20);
            }
            if let Some(n) = self.int::<u32>(&mut b, "log-rate", "1 or more") {
                if n == 0 {
                    self.problem(b.at("log-rate"), "must be 1 or more");
                }
                sandbox.log_rate = n.max(1);
            }
            if let Some(n) = self.size(&mut b, "max-driver-size") {
                if n == 0 {
                    self.problem(b.at("max-driver-size"), "must be more than 0");
                }
                sandbox.max_driver_bytes = n;
            }
            if let Some(d) = self.duration(&mut b, "compile-deadline") {
                if d.is_zero() {
                    self.problem(b.at("compile-deadline"), "must be more than 0");
                }
                sandbox.compile_deadline = d;
            }
            if let Some(n) = self.size(&mut b, "log-bytes") {
                if n < 1 << 10 {
                    self.problem(b.at("log-bytes"), "must be at least 1KiB (a second)");
                }
                sandbox.log_bytes = n.max(1 << 10);
            }
            self.finish(b);
        }
        let mut limits = ProviderLimits::default();
        if let Some(t) = self.table(&mut s, "limits") {
            let mut l = Section::new(s.at("limits"), t);
            limits.max_instances = self.int(&mut l, "max-instances", "0 or more");
            limits.max_cores = self.int(&mut l, "max-cores", "0 or more");
            limits.max_ram_mib = self.size(&mut l, "max-ram").map(|b| b >> 20);
            self.finish(l);
        }
        self.finish(s);
        let provider = Provider {
            name,
            rate,
            burst,
            priority,
            max_calls: u32::try_from(sandbox.max_instances.max(1)).unwrap_or(u32::MAX),
            limits,
            retired: false,
        };
        let driver = DriverSettings {
            driver,
            driver_name,
            plugins_dir: plugins_dir.to_path_buf(),
            driver_sha256,
            driver_config,
            allowed_hosts,
            credentials,
            sandbox,
        };
        (provider, driver)
    }
}
