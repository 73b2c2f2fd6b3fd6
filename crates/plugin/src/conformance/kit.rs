//! One conformance run against a configured provider, step by step:
//! create, list, set-tags, the foreign pool, error mapping, delete, the
//! batches, paging, and the cleanup of whatever the run made.

use std::time::{Duration, Instant};

use crate::sandbox::Recorded;
use crate::{CallError, CallErrorKind, Contract, Deletion, Sandbox};
use berth_core::driver::{
    Capabilities, CreateSpec, DriverError, Instance, InstanceState, LABEL_TAG, NODE_TAG, POOL_TAG,
    Tags,
};

use super::config::{TestConfig, has_all};
use super::faults::{FaultCall, Outcome};
use super::report::{Report, Step};

/// Longest a run waits out `rate-limited` answers for one call.
pub(super) const RATE_LIMIT_PATIENCE: Duration = Duration::from_secs(120);

/// One conformance run against a configured provider: what it asked the
/// cloud for, so that the cleanup can delete all of it.
pub(super) struct Kit<'a> {
    pub(super) provider: &'a Sandbox,
    pub(super) pool_id: String,
    /// The contract version the driver speaks.
    pub(super) contract: Contract,
    pub(super) config: &'a TestConfig,
    /// Every node id the run sent a create for, noted before the create
    /// went out: the cleanup also finds an instance whose create answer
    /// never arrived.
    pub(super) nodes: Vec<String>,
    /// Instance ids creates returned.
    pub(super) created: Vec<String>,
    /// Instance ids a step deleted.
    pub(super) deleted: Vec<String>,
    /// Time spent waiting out `rate-limited` answers.
    pub(super) waited: Duration,
}

impl Kit<'_> {
    pub(super) fn pool_filter(&self) -> Tags {
        [(POOL_TAG.to_string(), self.pool_id.clone())].into()
    }

    /// A create spec for a fresh node id of this run.
    pub(super) fn spec(&mut self, purpose: &str) -> CreateSpec {
        let node_id = format!("conformance-node-{:08x}", rand::random::<u32>());
        self.nodes.push(node_id.clone());
        CreateSpec {
            node_id: node_id.clone(),
            token: berth_core::driver::create_token(rand::random(), 4),
            instance_type: self.config.create.instance_type.clone(),
            image: self.config.create.image.clone(),
            tags: [
                (POOL_TAG.to_string(), self.pool_id.clone()),
                (NODE_TAG.to_string(), node_id),
                (LABEL_TAG.to_string(), "conformance".to_string()),
                ("berth-conformance".to_string(), purpose.to_string()),
            ]
            .into(),
            user_data: None,
            ssh_public_key: None,
            options: self.config.create.options.to_string(),
        }
    }

    /// Makes a call again after each `rate-limited` answer, never before
    /// its `retry-after` has passed, and at least twice as long after as
    /// the time before (a call of several requests, a list of many pages,
    /// needs the cloud's budget to build up again); gives up when waiting
    /// would pass [`RATE_LIMIT_PATIENCE`] for the call.
    pub(super) async fn patiently<T, F, Fut>(&mut self, mut call: F) -> Result<T, CallError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, CallError>>,
    {
        let mut waited = Duration::ZERO;
        let mut last = Duration::ZERO;
        loop {
            match call().await {
                Err(e) => match rate_limited(&e).map(|after| after.max(last * 2)) {
                    Some(wait) if waited + wait <= RATE_LIMIT_PATIENCE => {
                        tokio::time::sleep(wait).await;
                        waited += wait;
                        last = wait;
                        self.waited += wait;
                    }
                    _ => return Err(e),
                },
                done => return done,
            }
        }
    }

    /// [`Kit::patiently`] for a batch call: made again for the items
    /// answered `rate-limited` alone (after the longest `retry-after` among
    /// them), the others' answers kept; one answer per item, in order. A
    /// call that fails, or answers another number of results than items,
    /// fails the batch.
    pub(super) async fn patient_batch<I, T, F, Fut>(
        &mut self,
        items: Vec<I>,
        mut call: F,
    ) -> Result<Vec<Result<T, DriverError>>, String>
    where
        I: Clone,
        F: FnMut(Vec<I>) -> Fut,
        Fut: Future<Output = Result<Vec<Result<T, DriverError>>, CallError>>,
    {
        let mut answers: Vec<Option<Result<T, DriverError>>> = items.iter().map(|_| None).collect();
        let mut pending: Vec<usize> = (0..items.len()).collect();
        let (mut waited, mut last) = (Duration::ZERO, Duration::ZERO);
        while !pending.is_empty() {
            let asked: Vec<I> = pending.iter().map(|&i| items[i].clone()).collect();
            let got = (self.patiently(|| call(asked.clone())).await).map_err(|e| e.to_string())?;
            if got.len() != asked.len() {
                return Err(format!(
                    "answered {} results for {} items",
                    got.len(),
                    asked.len()
                ));
            }
            let mut wait = Duration::ZERO;
            let mut limited = Vec::new();
            for (&i, answer) in pending.iter().zip(got) {
                if let Err(DriverError::RateLimited { retry_after, .. }) = &answer {
                    wait = wait.max(*retry_after);
                    limited.push(i);
                }
                answers[i] = Some(answer);
            }
            let wait = wait.max(last * 2).max(Duration::from_millis(10));
            if limited.is_empty() || waited + wait > RATE_LIMIT_PATIENCE {
                break;
            }
            tokio::time::sleep(wait).await;
            waited += wait;
            last = wait;
            self.waited += wait;
            pending = limited;
        }
        let unanswered = || {
            Err(DriverError::Permanent(
                "the batch answered no result for this item".into(),
            ))
        };
        Ok(answers
            .into_iter()
            .map(|a| a.unwrap_or_else(unanswered))
            .collect())
    }

    pub(super) async fn create(&mut self, spec: CreateSpec) -> Result<Instance, CallError> {
        let provider = self.provider;
        let made = self.patiently(|| provider.create(spec.clone())).await;
        if let Ok(i) = &made {
            self.created.push(i.id.clone());
        }
        made
    }

    pub(super) async fn list(&mut self, filter: Tags) -> Result<Vec<Instance>, CallError> {
        let provider = self.provider;
        self.patiently(|| provider.list(filter.clone())).await
    }

    pub(super) async fn get(&mut self, ids: Vec<String>) -> Result<Vec<Instance>, CallError> {
        let provider = self.provider;
        self.patiently(|| provider.get(ids.clone())).await
    }

    pub(super) async fn delete(&mut self, id: &str) -> Result<Deletion, CallError> {
        let provider = self.provider;
        let done = self.patiently(|| provider.delete(id)).await;
        if done.is_ok() {
            self.deleted.push(id.to_string());
        }
        done
    }

    pub(super) async fn run(&mut self, report: &mut Report) {
        if let Some(id) = self.cycle(report).await {
            self.faults(&id, report).await;
            self.removal(&id, report).await;
            self.batches(Some(&id), report).await;
        } else {
            self.batches(None, report).await;
        }
        self.paging(report).await;
    }

    /// `create-many` and `delete-many`, where the driver declares them:
    /// one answer per item, in order, each instance as its spec asked; a
    /// batch delete that also names `gone` (deleted before) takes it as
    /// gone, not as an error.
    pub(super) async fn batches(&mut self, gone: Option<&str>, report: &mut Report) {
        let caps = self.provider.driver().info().capabilities;
        if !caps.create_many && !caps.delete_many {
            report.skip(
                "batches",
                "the driver declares neither create-many nor delete-many",
            );
            return;
        }
        let started = Instant::now();
        let result = self.batch_round(&caps, gone).await;
        report.record("batches", started, result);
    }

    async fn batch_round(
        &mut self,
        caps: &Capabilities,
        gone: Option<&str>,
    ) -> Result<String, String> {
        let specs = vec![self.spec("batch"), self.spec("batch")];
        let mut said = Vec::new();
        let mut ids = Vec::new();
        if caps.create_many {
            let provider = self.provider;
            let answers = (self
                .patient_batch(specs.clone(), |s| provider.create_many(s))
                .await)
                .map_err(|e| format!("create-many: {e}"))?;
            for (spec, answer) in specs.iter().zip(answers) {
                let i = answer.map_err(|e| format!("create-many answered {e}"))?;
                self.created.push(i.id.clone());
                has_all(&i.tags, &spec.tags).map_err(|e| format!("{}: {e}", i.id))?;
                ids.push(i.id);
            }
            if ids[0] == ids[1] {
                return Err(format!("create-many answered {} for two specs", ids[0]));
            }
            said.push(format!("create-many made {}", ids.join(" and ")));
        } else {
            for spec in specs {
                let made = self.create(spec).await;
                ids.push(made.map_err(|e| format!("create: {e}"))?.id);
            }
        }
        if !caps.delete_many {
            for id in &ids {
                self.delete(id).await.map_err(|e| format!("delete: {e}"))?;
            }
            return Ok(said.join("; "));
        }
        let mut asked = ids.clone();
        asked.extend(gone.map(str::to_owned));
        let provider = self.provider;
        let answers = (self
            .patient_batch(asked.clone(), |ids| provider.delete_many(ids))
            .await)
            .map_err(|e| format!("delete-many: {e}"))?;
        for (id, answer) in asked.iter().zip(&answers) {
            if let Err(e) = answer {
                return Err(format!("delete-many answered {e} for {id}"));
            }
        }
        self.deleted.extend(ids.iter().cloned());
        let found = self.get(ids.clone()).await.map_err(|e| e.to_string())?;
        let live =
            |i: &&Instance| !matches!(i.state, InstanceState::Terminated | InstanceState::Stopping);
        if let Some(i) = found.iter().find(live) {
            return Err(format!("{} is still {} after delete-many", i.id, i.state));
        }
        said.push(match gone {
            Some(g) => format!("delete-many deleted them, and took {g} as already gone"),
            None => "delete-many deleted them".to_owned(),
        });
        Ok(said.join("; "))
    }

    /// Create, list, another instance's list, set-tags, foreign pool; the
    /// id of the instance created.
    pub(super) async fn cycle(&mut self, report: &mut Report) -> Option<String> {
        let spec = self.spec("created");
        let tags = spec.tags.clone();
        let started = Instant::now();
        let instance = match self.create(spec.clone()).await {
            Ok(i) => {
                let checked = has_all(&i.tags, &tags).map(|()| format!("{} ({})", i.id, i.state));
                report.record("create with tags", started, checked);
                i
            }
            Err(e) => {
                report.record("create with tags", started, Err(e.to_string()));
                return None;
            }
        };
        let id = instance.id.clone();

        let started = Instant::now();
        let shown = self
            .list(self.pool_filter())
            .await
            .map_err(|e| e.to_string())
            .and_then(|all| {
                has_all(&listed(&all, &id)?.tags, &tags)
                    .map(|()| format!("{id} listed with its tags ({} in pool)", all.len()))
            });
        report.record("listed with tags", started, shown);

        // `get` answers the ids asked, and only those.
        let started = Instant::now();
        let got = self
            .get(vec![id.clone()])
            .await
            .map_err(|e| e.to_string())
            .and_then(|found| {
                if let Some(other) = found.iter().find(|i| i.id != id) {
                    return Err(format!("a get of {id} also answered {}", other.id));
                }
                let it = (found.iter().find(|i| i.id == id))
                    .ok_or_else(|| format!("a get of {id} did not answer it"))?;
                has_all(&it.tags, &tags).map(|()| format!("{id} got by id with its tags"))
            });
        report.record("get by id", started, got);

        // A create sent again with the same token (as after a restart)
        // makes no second instance.
        if self.provider.driver().info().capabilities.idempotent_create {
            let started = Instant::now();
            let again = match self.create(spec).await {
                Ok(i) if i.id == id => Ok(format!("the same instance, {id}")),
                Ok(i) => Err(format!(
                    "a second instance, {}, for the token that made {id}",
                    i.id
                )),
                Err(e) => Err(format!("the create sent again failed: {e}")),
            };
            report.record("one token, one instance", started, again);
        } else {
            report.skip(
                "one token, one instance",
                "the driver does not declare idempotent-create",
            );
        }

        // The host runs several instances of a driver side by side, so
        // nothing that matters may live in one instance's memory.
        let started = Instant::now();
        let mut other = self.provider.instance();
        let filter = self.pool_filter();
        let (mut waited, mut last) = (Duration::ZERO, Duration::ZERO);
        let seen = loop {
            match other.list(filter.clone()).await {
                Err(e) => match rate_limited(&e).map(|after| after.max(last * 2)) {
                    Some(wait) if waited + wait <= RATE_LIMIT_PATIENCE => {
                        tokio::time::sleep(wait).await;
                        waited += wait;
                        last = wait;
                    }
                    _ => break Err(e),
                },
                listed => break listed,
            }
        };
        self.waited += waited;
        let seen = seen
            .map_err(|e| e.to_string())
            .and_then(|all| {
                if all.iter().any(|i| i.id == id) {
                    Ok("a second driver instance lists it".to_string())
                } else {
                    Err(format!("a second driver instance does not list {id}: the driver keeps state in memory, but the host runs several instances side by side"))
                }
            });
        report.record("seen by another instance", started, seen);

        let mut new_tags = tags.clone();
        new_tags.remove("berth-conformance");
        new_tags.insert("berth-idle".to_string(), "hold".to_string());
        let started = Instant::now();
        let provider = self.provider;
        let set = match self
            .patiently(|| provider.set_tags(&id, new_tags.clone()))
            .await
        {
            Err(e) => Err(e.to_string()),
            Ok(()) => self
                .list(self.pool_filter())
                .await
                .map_err(|e| e.to_string())
                .and_then(|all| {
                    let found = listed(&all, &id)?;
                    has_all(&found.tags, &new_tags)?;
                    if found.tags.contains_key("berth-conformance") {
                        return Err("removed tag berth-conformance still present".into());
                    }
                    Ok("replaced tags visible in list".to_string())
                }),
        };
        report.record("set-tags visible", started, set);

        let started = Instant::now();
        let foreign: Tags = [(POOL_TAG.to_string(), format!("{}-foreign", self.pool_id))].into();
        let isolated = self
            .list(foreign)
            .await
            .map_err(|e| e.to_string())
            .and_then(|all| {
                if all.iter().any(|i| i.id == id) {
                    Err(format!("{id} shown to a foreign pool id"))
                } else {
                    Ok(format!("not shown ({} instances listed)", all.len()))
                }
            });
        report.record("foreign pool isolation", started, isolated);
        Some(id)
    }

    /// Delete, gone after delete, delete again.
    pub(super) async fn removal(&mut self, id: &str, report: &mut Report) {
        let started = Instant::now();
        let deleted = self
            .delete(id)
            .await
            .map_err(|e| e.to_string())
            .and_then(|d| match d {
                Deletion::Deleted => Ok("deleted".to_string()),
                Deletion::AlreadyGone => Err("first delete said not-found".to_string()),
            });
        report.record("delete", started, deleted);

        let started = Instant::now();
        let gone = self
            .list(self.pool_filter())
            .await
            .map_err(|e| e.to_string())
            .and_then(|all| match all.iter().find(|i| i.id == id) {
                None => Ok("gone".to_string()),
                Some(i)
                    if matches!(i.state, InstanceState::Terminated | InstanceState::Stopping) =>
                {
                    Ok(format!("listed as {}", i.state))
                }
                Some(i) => Err(format!("still listed as {}", i.state)),
            });
        report.record("gone after delete", started, gone);

        let started = Instant::now();
        let got = self
            .get(vec![id.to_owned()])
            .await
            .map_err(|e| e.to_string())
            .and_then(|found| match found.iter().find(|i| i.id == id) {
                None => Ok("not answered: gone".to_string()),
                Some(i)
                    if matches!(i.state, InstanceState::Terminated | InstanceState::Stopping) =>
                {
                    Ok(format!("answered as {}", i.state))
                }
                Some(i) => Err(format!("a get still answers it as {}", i.state)),
            });
        report.record("get after delete", started, got);

        let started = Instant::now();
        let again = self
            .delete(id)
            .await
            .map(|d| format!("{d:?}"))
            .map_err(|e| e.to_string());
        report.record("delete again", started, again);
    }

    /// Creates more than one page's worth of instances and checks that one
    /// list shows every one of them, once.
    pub(super) async fn paging(&mut self, report: &mut Report) {
        let wanted = match self.config.instances {
            Some(n) => n,
            None => match page_size(&self.config.config) {
                Some(page) => page.saturating_add(1),
                None => {
                    report.skip(
                        "paging",
                        "the driver config names no page size (page_size); \
                         --instances N creates N instances to check that list follows every page",
                    );
                    return;
                }
            },
        };
        if wanted == 0 {
            report.skip("paging", "--instances 0");
            return;
        }
        let started = Instant::now();
        let mut ids = Vec::new();
        for n in 0..wanted {
            let spec = self.spec("paging");
            match self.create(spec).await {
                Ok(i) => ids.push(i.id),
                Err(e) => {
                    report.record(
                        "paging",
                        started,
                        Err(format!("create {} of {wanted}: {e}", n + 1)),
                    );
                    return;
                }
            }
        }
        let checked = self
            .list(self.pool_filter())
            .await
            .map_err(|e| e.to_string())
            .and_then(|all| {
                let mut missing = ids.clone();
                missing.retain(|id| !all.iter().any(|i| &i.id == id));
                let mut seen = std::collections::BTreeSet::new();
                let twice: Vec<&str> = all
                    .iter()
                    .filter(|i| !seen.insert(i.id.as_str()))
                    .map(|i| i.id.as_str())
                    .collect();
                if !missing.is_empty() {
                    Err(format!(
                        "one list shows {} of the {wanted} instances created ({} listed in all): \
                         the driver does not follow every page; missing {}",
                        wanted as usize - missing.len(),
                        all.len(),
                        sample(&missing)
                    ))
                } else if !twice.is_empty() {
                    Err(format!("one list shows {} twice", sample(&twice)))
                } else {
                    Ok(format!(
                        "one list shows all {wanted} instances created ({} listed in all)",
                        all.len()
                    ))
                }
            });
        report.record("paging", started, checked);
    }

    /// Each recorded response in turn: the driver's answer to it must be
    /// the error case the author expects.
    pub(super) async fn faults(&mut self, id: &str, report: &mut Report) {
        if self.config.faults.is_empty() {
            report.skip(
                "error mapping",
                "no --faults file: recorded cloud responses check how the driver maps each one",
            );
            return;
        }
        for fault in self.config.faults.clone() {
            let started = Instant::now();
            if fault.expect == "failed" && self.contract == Contract::V0_1 {
                report.skip(
                    "error mapping",
                    &format!(
                        "{}: contract 0.1 has no failed state (0.2 has)",
                        fault.title()
                    ),
                );
                continue;
            }
            let before = self.provider.answered_requests();
            self.provider.answer_with(Some(Recorded {
                status: fault.status,
                headers: fault.headers.clone().into_iter().collect(),
                body: fault.body_for(&self.pool_id, id),
            }));
            let answer = match fault.call {
                FaultCall::Create => {
                    let spec = self.spec("fault");
                    let created = self.provider.create(spec).await;
                    created.map(|i| Outcome::of(&[i]))
                }
                FaultCall::List => {
                    let listed = self.provider.list(self.pool_filter()).await;
                    listed.map(|all| Outcome::of(&all))
                }
                FaultCall::Get => {
                    let got = self.provider.get(vec![id.to_owned()]).await;
                    got.map(|all| Outcome::of(&all))
                }
                FaultCall::Delete => self.provider.delete(id).await.map(|d| match d {
                    Deletion::Deleted => Outcome::case("ok"),
                    Deletion::AlreadyGone => Outcome::case("not-found"),
                }),
                FaultCall::SetTags => {
                    let tags = self.pool_filter();
                    let set = self.provider.set_tags(id, tags).await;
                    set.map(|()| Outcome::case("ok"))
                }
            };
            self.provider.answer_with(None);
            let answered = self.provider.answered_requests() - before;
            let verdict = fault.judge(answered, answer);
            report.steps.push(Step {
                name: "error mapping",
                passed: verdict.is_ok(),
                skipped: false,
                duration: started.elapsed(),
                detail: format!("{}: {}", fault.title(), verdict.unwrap_or_else(|e| e)),
            });
        }
    }

    /// Deletes whatever the run created that is still there: every id a
    /// create returned and not deleted since, and every instance the
    /// cloud lists with one of the run's node ids.
    pub(super) async fn cleanup(&mut self, report: &mut Report) {
        let started = Instant::now();
        let mut left: Vec<String> = self
            .created
            .iter()
            .filter(|id| !self.deleted.contains(id))
            .cloned()
            .collect();
        let mut unlisted = None;
        if !self.nodes.is_empty() {
            match self.list(self.pool_filter()).await {
                Ok(all) => {
                    for i in all {
                        let ours = i.tags.get(NODE_TAG).is_some_and(|n| self.nodes.contains(n));
                        if ours && i.state != InstanceState::Terminated && !left.contains(&i.id) {
                            left.push(i.id);
                        }
                    }
                }
                Err(e) => unlisted = Some(e.to_string()),
            }
        }
        let mut deleted = Vec::new();
        let mut failed = Vec::new();
        for id in left {
            match self.delete(&id).await {
                Ok(Deletion::Deleted) => deleted.push(id),
                Ok(Deletion::AlreadyGone) => {}
                Err(e) => failed.push(format!("{id} ({e})")),
            }
        }
        let mut detail = match deleted.len() {
            0 => "nothing left to delete".to_string(),
            n => format!(
                "deleted {n} instance{} the run created: {}",
                if n == 1 { "" } else { "s" },
                deleted.join(", ")
            ),
        };
        if !self.waited.is_zero() {
            detail.push_str(&format!(
                "; waited {:.1}s in all for rate limits",
                self.waited.as_secs_f64()
            ));
        }
        let result = match (failed.is_empty(), unlisted) {
            (true, None) => Ok(detail),
            (true, Some(why)) => Err(format!(
                "{detail}; could not list the pool to find instances whose create did not answer: {why}"
            )),
            (false, _) => Err(format!(
                "{detail}; NOT deleted, delete by hand: {}",
                failed.join(", ")
            )),
        };
        report.record("cleanup", started, result);
    }
}

/// The instance `id` in a list, or what the list shows instead.
pub(super) fn listed<'a>(all: &'a [Instance], id: &str) -> Result<&'a Instance, String> {
    all.iter()
        .find(|i| i.id == id)
        .ok_or_else(|| format!("{id} not in a list of {} instances", all.len()))
}

/// How long to wait before calling again, for a `rate-limited` answer.
pub(super) fn rate_limited(e: &CallError) -> Option<Duration> {
    match &e.kind {
        CallErrorKind::Driver(DriverError::RateLimited { retry_after, .. }) => {
            Some((*retry_after).max(Duration::from_millis(10)))
        }
        _ => None,
    }
}

/// The page size a driver config names, under the usual spellings.
pub(super) fn page_size(config: &serde_json::Value) -> Option<u32> {
    ["page_size", "page-size", "pageSize", "per_page"]
        .iter()
        .find_map(|k| config.get(k)?.as_u64())
        .and_then(|n| u32::try_from(n).ok())
}

/// Up to three ids, and how many more.
pub(super) fn sample<S: AsRef<str>>(ids: &[S]) -> String {
    let shown: Vec<&str> = ids.iter().take(3).map(AsRef::as_ref).collect();
    match ids.len() {
        n if n > 3 => format!("{} and {} more", shown.join(", "), n - 3),
        _ => shown.join(", "),
    }
}
