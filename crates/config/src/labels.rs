//! A label (`[labels.NAME]`): a machine label with its offers
//! (`[labels.NAME.providers.PROVIDER]`), or a slot label on a backing
//! label; and a label's readiness check.

use berth_core::config::{Check, Label, LabelIx, LabelKind, Offer, ProviderIx, Readiness, Window};
use toml::{Table, Value};

use crate::walker::{Section, Walker, join};

impl Walker<'_> {
    /// A label, and for a slot label the name of its backing label (resolved
    /// once every label is read). `ready` is the file's default check.
    pub(crate) fn label(
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
        let max_nodes = self.max_nodes(&mut s);
        let burst_extra = self.int(&mut s, "burst-extra", "0 or more").unwrap_or(0);
        let schedule = self.schedule(&mut s);
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
            max_nodes,
            schedule,
            burst_extra,
            kind,
            retired: false,
        };
        (label, backing)
    }

    /// A label's `[[labels.NAME.schedule]]` windows: `days` (default
    /// every day), `from` and `to` (`HH:MM` or `HH:MM:SS`, UTC; a `to` not
    /// after `from` ends the next day) and `min-ready`.
    fn schedule(&mut self, s: &mut Section<'_>) -> Vec<Window> {
        let at = s.at("schedule");
        let list = match s.get("schedule") {
            None => return Vec::new(),
            Some(Value::Array(a)) => a,
            Some(v) => {
                self.wrong_type(at, "an array of tables ([[labels.NAME.schedule]])", v);
                return Vec::new();
            }
        };
        let mut windows = Vec::new();
        for (i, v) in list.iter().enumerate() {
            let at = format!("{at}[{i}]");
            let Value::Table(t) = v else {
                self.wrong_type(at, "a table", v);
                continue;
            };
            let mut w = Section::new(at.clone(), t);
            let days = match w.get("days") {
                None => Some(0b111_1111),
                Some(Value::Array(days)) => {
                    let mut bits = 0u8;
                    for d in days {
                        let name = d.as_str().unwrap_or_default().to_ascii_lowercase();
                        match Window::DAYS.iter().position(|&n| n == name) {
                            Some(i) => bits |= 1 << i,
                            None => self.problem(
                                w.at("days"),
                                format!("`{d}` is not a day; expected {}", Window::DAYS.join(", ")),
                            ),
                        }
                    }
                    Some(bits)
                }
                Some(v) => {
                    self.wrong_type(w.at("days"), "an array of days, e.g. [\"mon\", \"tue\"]", v);
                    None
                }
            };
            let time = |walker: &mut Self, w: &mut Section<'_>, key: &'static str| {
                let text = walker.required_string(w, key)?;
                match time_of_day(&text) {
                    Some(secs) => Some(secs),
                    None => {
                        walker.problem(
                            w.at(key),
                            format!("`{text}` is not a time of day: HH:MM or HH:MM:SS, UTC"),
                        );
                        None
                    }
                }
            };
            let from = time(self, &mut w, "from");
            let to = time(self, &mut w, "to");
            let min_ready = self.int::<u32>(&mut w, "min-ready", "0 or more");
            if min_ready.is_none() && !t.contains_key("min-ready") {
                self.problem(
                    w.at("min-ready"),
                    "missing; a window sets its own min-ready",
                );
            }
            if let (Some(f), Some(t)) = (from, to)
                && f == t
            {
                self.problem(at.clone(), "`from` and `to` are the same time");
            }
            self.finish(w);
            if let (Some(days), Some(from), Some(to), Some(min_ready)) = (days, from, to, min_ready)
            {
                windows.push(Window {
                    days,
                    from,
                    to,
                    min_ready,
                });
            }
        }
        windows
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

/// `HH:MM` or `HH:MM:SS` as seconds into the day.
fn time_of_day(text: &str) -> Option<u32> {
    let parts: Vec<&str> = text.split(':').collect();
    if !(2..=3).contains(&parts.len()) || parts.iter().any(|p| p.len() != 2) {
        return None;
    }
    let n: Vec<u32> = parts
        .iter()
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    let (h, m, s) = (n[0], n[1], n.get(2).copied().unwrap_or(0));
    (h < 24 && m < 60 && s < 60).then_some(h * 3600 + m * 60 + s)
}
