//! The config file berth runs, read while it runs: `POST /v1/config/check`
//! compares a text with it, and `POST /v1/config/reload` (and `SIGHUP`)
//! read it again and apply what changed, or refuse the whole with every
//! reason, changing nothing.

use std::path::{Path as FsPath, PathBuf};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use berth_config::{ConfigErrors, Difference, Settings, Token};
use berth_types::{self as types, ErrorCode};

use super::edge::json;
use super::error::{ApiError, Result};
use super::pool::admin;
use super::state::Api;
use crate::runtime::Mode;
use crate::runtime::shards::Shards;

/// The config file berth runs, and its settings as last applied.
pub(super) struct RunningConfig {
    pub(super) file: PathBuf,
    /// Plain mutex: held only to read or swap the `Arc`.
    running: Mutex<Arc<Settings>>,
    /// One reload at a time.
    reloading: tokio::sync::Mutex<()>,
}

impl RunningConfig {
    pub(super) fn new(file: PathBuf, settings: Arc<Settings>) -> RunningConfig {
        RunningConfig {
            file,
            running: Mutex::new(settings),
            reloading: tokio::sync::Mutex::new(()),
        }
    }

    pub(super) fn running(&self) -> Arc<Settings> {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// What a reload of a file would do.
struct Judged {
    differences: Vec<Difference>,
    problems: Vec<String>,
    reasons: Vec<String>,
    /// The file's settings arranged for the running pool, unless refused.
    aligned: Option<Settings>,
    /// What the processes on a shared store must run alike, in the file
    /// ([`berth_config::fleet_digest`]), if it is valid.
    digest: Option<String>,
}

/// Judges `parsed` against the `running` settings: its differences, and
/// every reason a reload of it is refused.
fn judge(running: &Settings, parsed: std::result::Result<Settings, ConfigErrors>) -> Judged {
    let new = match parsed {
        Ok(new) => new,
        Err(e) => {
            return Judged {
                differences: Vec::new(),
                problems: e.problems.iter().map(ToString::to_string).collect(),
                reasons: Vec::new(),
                aligned: None,
                digest: None,
            };
        }
    };
    let digest = Some(berth_config::fleet_digest(&new));
    let problems: Vec<String> = (berth_config::check_files(&new).iter())
        .map(ToString::to_string)
        .collect();
    let differences = berth_config::differences(running, &new);
    let mut reasons = Vec::new();
    if !running.api.tokens.is_empty() && new.api.tokens.is_empty() {
        reasons.push(
            "api.tokens: every token removed: a reload does not open the API to every \
             caller; restart berth to run without tokens"
                .to_owned(),
        );
    }
    let aligned = match berth_config::align(running, new) {
        Ok(aligned) => Some(aligned),
        Err(why) => {
            reasons.extend(why);
            None
        }
    };
    let aligned = aligned.filter(|_| problems.is_empty() && reasons.is_empty());
    Judged {
        differences,
        problems,
        reasons,
        aligned,
        digest,
    }
}

fn shown(differences: &[Difference]) -> Vec<types::ConfigDifference> {
    (differences.iter())
        .map(|d| types::ConfigDifference {
            key: d.key.clone(),
            what: d.what.clone(),
            live: d.live,
        })
        .collect()
}

impl Api {
    /// The config file berth runs and its settings as last applied; unset
    /// for the embedded default and for embedders that give none.
    fn running_config(&self) -> Result<&RunningConfig> {
        self.inner.config.get().ok_or_else(|| {
            ApiError::new(
                StatusCode::CONFLICT,
                ErrorCode::Conflict,
                "berth runs its embedded default: there is no config file to read again",
            )
        })
    }

    /// Reads the config file berth runs again and applies what changed,
    /// between two steps of the pool; or, if anything in it is wrong,
    /// cannot change while berth runs, or is not yet taken live, changes
    /// nothing and says every reason. `None`: berth runs no config file.
    pub async fn reload_config(&self) -> Option<types::ConfigReload> {
        let config = self.inner.config.get()?;
        Some(self.reload(config).await)
    }

    /// Judges `parsed` against the running config, and, with a shared
    /// store, against what the other processes run.
    async fn judge(
        &self,
        running: &Settings,
        parsed: std::result::Result<Settings, ConfigErrors>,
    ) -> Judged {
        let mut judged = judge(running, parsed);
        if let (Some(shards), Some(digest)) = (self.handle().shards(), &judged.digest) {
            let differing = self.fleet_differs(shards, digest).await;
            if !differing.is_empty() {
                judged.reasons.extend(differing);
                judged.aligned = None;
            }
        }
        judged
    }

    /// On the pool's holder, every reason the fleet is not ready for the
    /// config of `digest`: each other live process that does not run it
    /// yet. A process standing by is reloaded first, with nothing to wait
    /// for: the pool is decided by its holder's config until the holder is
    /// reloaded, last.
    async fn fleet_differs(&self, shards: &Shards, digest: &str) -> Vec<String> {
        if !matches!(self.handle().mode(), Mode::Holding) {
            return Vec::new();
        }
        let Some(fleet) = shards.fleet_now().await else {
            return vec![
                "could not read which config each berth process on the store runs (the \
                 database did not answer)"
                    .to_owned(),
            ];
        };
        (fleet.iter())
            .filter(|m| m.holder != shards.me() && m.config != digest)
            .map(|m| {
                format!(
                    "berth process {} does not run this config yet: reload each process \
                     standing by with the same file first, and the pool's holder (this one) last",
                    m.holder
                )
            })
            .collect()
    }

    /// [`Api::reload_config`] of `config`.
    async fn reload(&self, config: &RunningConfig) -> types::ConfigReload {
        let _one = config.reloading.lock().await;
        let running = config.running();
        let file = &config.file;
        let judged = self.judge(&running, berth_config::load(file)).await;
        let mut reasons = judged.reasons;
        let mut applied = false;
        if let Some(aligned) = judged.aligned {
            match self.apply(&running, aligned, &judged.differences).await {
                Ok(aligned) => {
                    *config.running.lock().unwrap_or_else(|e| e.into_inner()) = aligned;
                    applied = true;
                }
                Err(why) => reasons.extend(why),
            }
        }
        if let (true, Some(shards), Some(digest)) = (applied, self.handle().shards(), judged.digest)
        {
            // Recorded before this answers, so that the pool's holder,
            // reloaded next, finds it.
            shards.set_config(digest);
            if shards.fleet_now().await.is_none() {
                tracing::warn!(
                    "the config this process now runs is not recorded yet (the database did \
                     not answer): the pool's holder refuses its own reload until it is"
                );
            }
        }
        let reload = types::ConfigReload {
            file: file.display().to_string(),
            applied,
            differences: shown(&judged.differences),
            problems: judged.problems,
            reasons,
        };
        log(&reload);
        self.inner.telemetry.config_reloaded(applied);
        reload
    }

    /// Applies `aligned` whole, or none of it: the providers whose driver
    /// settings changed start on them next to what they run, then the pool
    /// takes its config, then the providers switch and the tokens are
    /// swapped.
    async fn apply(
        &self,
        running: &Settings,
        aligned: Settings,
        differences: &[Difference],
    ) -> std::result::Result<Arc<Settings>, Vec<String>> {
        if differences.is_empty() {
            return Ok(Arc::new(aligned));
        }
        let providers = self.handle().providers().clone();
        let changed = berth_config::drivers_changed(running, &aligned);
        let prepared = providers.prepare(&aligned, &changed).await?;
        let pool = Arc::new(aligned.pool.clone());
        // Dropping what was prepared changes nothing.
        self.handle()
            .reconfigure(pool)
            .await
            .map_err(|e| vec![e.to_string()])?;
        let added = providers.commit(prepared);
        if let Some(shards) = self.handle().shards() {
            shards.add(added);
        }
        self.set_tokens(aligned.api.tokens.clone());
        Ok(Arc::new(aligned))
    }

    fn set_tokens(&self, tokens: Vec<Token>) {
        *self.inner.tokens.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(tokens);
    }
}

/// Says in the log what a reload did, one line per difference or reason.
fn log(r: &types::ConfigReload) {
    if r.applied {
        for d in &r.differences {
            tracing::info!(file = %r.file, key = %d.key, "config reloaded: {}", d.what);
        }
        tracing::info!(
            file = %r.file,
            changes = r.differences.len(),
            "config read again and applied"
        );
    } else {
        for why in r.problems.iter().chain(&r.reasons) {
            tracing::warn!(file = %r.file, "config reload refused: {why}");
        }
        tracing::warn!(
            file = %r.file,
            "config reload refused: berth goes on with the config it runs"
        );
    }
}

#[utoipa::path(
    post,
    path = "/v1/config/check",
    operation_id = "check_config",
    tag = "config",
    summary = "Compare a config file with the running one (admin)",
    description = "Checks the text of a config file as this process would read it (its relative paths against the directory of the file berth runs, `${ENV}` from berth's environment, its driver files on this machine) and answers every difference from the config berth runs, each with whether it can change while berth runs, the problems that make the text invalid, and every reason a reload of it would be refused: on the pool's holder with a store shared by several processes, every other live process that does not run the text's config yet. Never relayed: a process standing by compares with its own config. Changes nothing. `berth config check FILE --against URL` calls it. Admin only.",
    security(("bearerAuth" = ["admin"])),
    extensions(("x-berth-roles" = json!(["admin"]))),
    request_body(content = types::ConfigText),
    responses(
        (status = 200, description = "The differences, or the text's problems.", body = types::ConfigCheck),
        (status = 400, description = "A malformed body (code `bad_request`, `field` `body`, `text` or an unknown field's name).", body = types::ErrorBody),
        (status = 401, response = super::responses::Unauthorized),
        (status = 403, description = "Not an admin token (code `forbidden`).", body = types::ErrorBody),
        (status = 409, description = "berth runs its embedded default, with no config file to compare with (code `conflict`).", body = types::ErrorBody),
        (status = 503, response = super::responses::Unavailable)
    )
)]
pub(super) async fn check_config(
    State(api): State<Api>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    admin(&api, &headers)?;
    let asked: types::ConfigText = super::edge::body(&body)?;
    let config = api.running_config()?;
    let env = |name: &str| std::env::var(name).ok();
    let base: &FsPath = berth_config::base_dir(&config.file);
    let judged = api
        .judge(
            &config.running(),
            berth_config::parse(&asked.text, base, &env),
        )
        .await;
    let refused = !judged.problems.is_empty() || !judged.reasons.is_empty();
    Ok(json(
        StatusCode::OK,
        types::ConfigCheck {
            file: config.file.display().to_string(),
            differences: shown(&judged.differences),
            problems: judged.problems,
            reasons: judged.reasons,
            refused,
        },
    ))
}

#[utoipa::path(
    post,
    path = "/v1/config/reload",
    operation_id = "reload_config",
    tag = "config",
    summary = "Read the config file again and apply it (admin)",
    description = "Reads the config file berth runs again, as `SIGHUP` does, and applies what changed between two steps of the pool: labels and providers added, changed or removed (a removed one is drained and listed as `removed` until berth stops), drivers' settings, limits, rates, readiness, timeouts, timings, the lease's length and API tokens. Nodes, requests and leases are kept. If the file has a problem, changes what cannot change while berth runs (the pool's id, the state and plugins directories, the store, where the API listens), or a provider's driver does not start on its new settings, nothing changes and every reason is answered, with `applied` false. With a store shared by several processes, each process reads its own file (this call is never relayed), and the pool's holder refuses a reload until every other live process runs the same config. `berth config reload` calls it. Admin only; no body.",
    security(("bearerAuth" = ["admin"])),
    extensions(("x-berth-roles" = json!(["admin"]))),
    responses(
        (status = 200, description = "What the reload did: `applied`, the differences, and if refused, why.", body = types::ConfigReload),
        (status = 400, response = super::responses::TakesNoQuery),
        (status = 401, response = super::responses::Unauthorized),
        (status = 403, description = "Not an admin token (code `forbidden`).", body = types::ErrorBody),
        (status = 409, description = "berth runs its embedded default, with no config file to read again (code `conflict`).", body = types::ErrorBody),
        (status = 503, response = super::responses::Unavailable)
    )
)]
pub(super) async fn reload_config(State(api): State<Api>, headers: HeaderMap) -> Result<Response> {
    admin(&api, &headers)?;
    let config = api.running_config()?;
    Ok(json(StatusCode::OK, api.reload(config).await))
}
