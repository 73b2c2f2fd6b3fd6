//! The berth driver for the simulated cloud (`berth sim`, docs/sim-cloud.md).
//!
//! It talks to the sim's instance API over `wasi:http` exactly as a driver for
//! a real cloud talks to its API, so it exercises the whole plugin path. It
//! sends no credentials: when the sim requires a token, the host adds it.

#![forbid(unsafe_code)]

mod api;

use berth_sdk::http::{Request, Response, Url, encode_component};
use berth_sdk::pages;
use berth_sdk::tags::{self, POOL_TAG, is_berth_tag};
use berth_sdk::types::{
    AccountLimits, Capabilities, ConfigField, CreateSpec, DriverInfo, Error, FieldType, Instance,
    Page,
};
use berth_sdk::{Driver, error};
use serde::Deserialize;

use api::{
    ApiInstance, BatchCreateBody, BatchDeleteBody, BatchResults, CreateBody, ErrorBody,
    InstancePage, LimitsBody, SetTagsBody,
};

/// The sim's largest page.
const MAX_PAGE_SIZE: u32 = 1000;

/// The provider config as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    endpoint: String,
    #[serde(default)]
    page_size: Option<u32>,
}

/// The configured driver.
struct Sim {
    pool_id: String,
    /// `http(s)://host:port[/base]` without a trailing `/`.
    endpoint: String,
    page_size: Option<u32>,
}

impl Sim {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.endpoint)
    }

    fn instance_url(&self, id: &str) -> String {
        self.url(&format!("/v1/instances/{}", encode_component(id)))
    }
}

impl Sim {
    /// What `POST /v1/instances` (alone or in a batch) sends for `spec`.
    fn create_body<'a>(&self, spec: &'a CreateSpec) -> Result<CreateBody<'a>, Error> {
        check_label_options(&spec.options)?;
        let mut tags: Vec<(String, String)> = (spec.tags.iter())
            .filter(|(k, _)| k != POOL_TAG)
            .cloned()
            .collect();
        // Never create outside this pool, whatever the spec says.
        tags.push((POOL_TAG.to_owned(), self.pool_id.clone()));
        Ok(CreateBody {
            instance_type: &spec.instance_type,
            image: &spec.image,
            tags: tags.into_iter().collect(),
            client_token: &spec.token,
            user_data: spec.user_data.as_deref(),
            ssh_public_key: spec.ssh_public_key.as_deref(),
        })
    }

    /// Makes a batch call of `count` items: one result each, in order;
    /// a call that failed, or answered another number of results, gives
    /// every item its error.
    fn batch(
        &self,
        path: &str,
        body: &impl serde::Serialize,
        count: usize,
    ) -> Vec<Result<api::BatchResult, Error>> {
        let failed = |e: Error| (0..count).map(|_| Err(e.clone())).collect();
        let resp = match Request::post(&self.url(path)).json(body).send() {
            Ok(resp) => resp,
            Err(e) => return failed(e.into()),
        };
        if resp.status != 200 {
            return failed(api_error(&resp, None));
        }
        match resp.json::<BatchResults>() {
            Ok(r) if r.results.len() == count => r.results.into_iter().map(Ok).collect(),
            Ok(r) => failed(error::transient(format!(
                "the sim answered {} results to {count} items",
                r.results.len()
            ))),
            Err(e) => failed(e.into()),
        }
    }
}

impl Driver for Sim {
    fn describe() -> DriverInfo {
        DriverInfo {
            name: "sim".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Machines on berth's simulated cloud (`berth sim`), for tests, \
                          benchmarks and trying berth without a cloud account."
                .into(),
            config: vec![
                ConfigField {
                    name: "endpoint".into(),
                    field_type: FieldType::String,
                    required: true,
                    default: None,
                    doc: "Base URL of the sim, for example `http://127.0.0.1:8600`. Its host \
                          must also be in the provider's allowed hosts."
                        .into(),
                },
                ConfigField {
                    name: "page_size".into(),
                    field_type: FieldType::Integer,
                    required: false,
                    default: None,
                    doc: "Instances per list page, 1 to 1000; absent uses the sim's default (100)."
                        .into(),
                },
            ],
            label_options: vec![],
            capabilities: Capabilities::ACCOUNT_LIMITS
                | Capabilities::IDEMPOTENT_CREATE
                | Capabilities::USER_DATA
                | Capabilities::SSH_KEYS
                | Capabilities::CREATE_MANY
                | Capabilities::DELETE_MANY,
        }
    }

    fn configure(pool_id: &str, config: &str) -> Result<Self, Error> {
        let raw: RawConfig = serde_json::from_str(config)
            .map_err(|e| error::invalid_config(format!("provider config: {e}")))?;
        let mut problems = Vec::new();
        let endpoint = raw.endpoint.trim_end_matches('/').to_owned();
        match Url::parse(&endpoint) {
            Ok(url) if url.path_and_query().contains('?') => {
                problems.push("endpoint: must not have a query".to_owned());
            }
            Ok(_) => {}
            Err(e) => problems.push(format!("endpoint: {e}")),
        }
        if raw
            .page_size
            .is_some_and(|n| !(1..=MAX_PAGE_SIZE).contains(&n))
        {
            problems.push(format!("page_size: must be between 1 and {MAX_PAGE_SIZE}"));
        }
        if pool_id.is_empty() {
            problems.push("pool id: must not be empty".to_owned());
        }
        if !problems.is_empty() {
            return Err(error::invalid_config(problems.join("; ")));
        }
        Ok(Sim {
            pool_id: pool_id.to_owned(),
            endpoint,
            page_size: raw.page_size,
        })
    }

    fn create(&mut self, spec: CreateSpec) -> Result<Instance, Error> {
        let body = self.create_body(&spec)?;
        let resp = Request::post(&self.url("/v1/instances"))
            .json(&body)
            .send()?;
        match resp.status {
            200 | 201 => Ok(resp.json::<ApiInstance>()?.into()),
            _ => Err(api_error(&resp, Some(&spec.instance_type))),
        }
    }

    fn get(&mut self, ids: &[String]) -> Result<Vec<Instance>, Error> {
        if ids.is_empty() {
            return Ok(vec![]);
        }
        // One list of these ids: the host asks for at most 100, which one
        // page of the largest size holds.
        let mut query = format!(
            "tag:{POOL_TAG}={}&page_size={MAX_PAGE_SIZE}",
            encode_component(&self.pool_id)
        );
        for id in ids {
            query.push_str(&format!("&id={}", encode_component(id)));
        }
        let resp = Request::get(&self.url(&format!("/v1/instances?{query}"))).send()?;
        if resp.status != 200 {
            return Err(api_error(&resp, None));
        }
        let page: InstancePage = resp.json()?;
        let found = page.instances.into_iter().map(Instance::from);
        Ok(pages::only_ids(found, ids, &self.pool_id))
    }

    fn list(&mut self, filter: &[(String, String)], cursor: Option<&str>) -> Result<Page, Error> {
        // A filter naming another pool matches nothing this driver may see.
        if filter
            .iter()
            .any(|(k, v)| k == POOL_TAG && *v != self.pool_id)
        {
            return Ok(Page {
                instances: vec![],
                next: None,
            });
        }
        let mut query = format!("tag:{POOL_TAG}={}", encode_component(&self.pool_id));
        for (k, v) in filter.iter().filter(|(k, _)| k != POOL_TAG) {
            query.push_str(&format!(
                "&tag:{}={}",
                encode_component(k),
                encode_component(v)
            ));
        }
        if let Some(n) = self.page_size {
            query.push_str(&format!("&page_size={n}"));
        }
        if let Some(token) = cursor {
            query.push_str(&format!("&page_token={}", encode_component(token)));
        }
        let resp = Request::get(&self.url(&format!("/v1/instances?{query}"))).send()?;
        if resp.status != 200 {
            return Err(api_error(&resp, None));
        }
        let page: InstancePage = resp.json()?;
        let mut instances: Vec<Instance> = page.instances.into_iter().map(Instance::from).collect();
        // The sim filters already; checking again costs nothing and keeps
        // the rule that only this pool's instances are ever shown.
        let mut wanted = filter.to_vec();
        wanted.push((POOL_TAG.to_owned(), self.pool_id.clone()));
        instances.retain(|i| tags::has_all(&i.tags, &wanted));
        // A token that does not move would have the host loop.
        if let (Some(next), Some(given)) = (&page.next_page_token, cursor)
            && next == given
        {
            return Err(error::transient(format!(
                "sim repeated page token {next:?}"
            )));
        }
        Ok(Page {
            instances,
            next: page.next_page_token,
        })
    }

    fn create_many(&mut self, specs: Vec<CreateSpec>) -> Vec<Result<Instance, Error>> {
        // Specs the driver refuses itself get their error; the rest go in
        // one call.
        let bodies: Vec<Result<CreateBody<'_>, Error>> =
            specs.iter().map(|s| self.create_body(s)).collect();
        let sent: Vec<CreateBody<'_>> = bodies
            .iter()
            .filter_map(|b| b.as_ref().ok().cloned())
            .collect();
        let count = sent.len();
        let mut answers = match sent.is_empty() {
            true => Vec::new(),
            false => self.batch(
                "/v1/batch/create",
                &BatchCreateBody { instances: sent },
                count,
            ),
        }
        .into_iter();
        (bodies.into_iter().zip(&specs))
            .map(|(body, spec)| {
                body?;
                match answers.next() {
                    Some(Ok(r)) => match r.instance {
                        Some(i) => Ok(i.into()),
                        None => Err(item_error(r.status, r.error, Some(&spec.instance_type))),
                    },
                    Some(Err(e)) => Err(e),
                    None => Err(error::transient(
                        "the sim answered fewer results than asked",
                    )),
                }
            })
            .collect()
    }

    fn delete_many(&mut self, instance_ids: &[String]) -> Vec<Result<(), Error>> {
        let body = BatchDeleteBody { ids: instance_ids };
        (self
            .batch("/v1/batch/delete", &body, instance_ids.len())
            .into_iter())
        .map(|r| match r? {
            r if r.status.is_none() && r.error.error.code.is_empty() => Ok(()),
            r => Err(item_error(r.status, r.error, None)),
        })
        .collect()
    }

    fn delete(&mut self, instance_id: &str) -> Result<(), Error> {
        // The host only deletes ids it listed through this driver, so they
        // carry the pool tag; the sim has no conditional delete to check it.
        let resp = Request::delete(&self.instance_url(instance_id)).send()?;
        match resp.status {
            200 | 202 | 204 => Ok(()),
            _ => Err(api_error(&resp, None)),
        }
    }

    fn set_tags(&mut self, instance_id: &str, new: &[(String, String)]) -> Result<(), Error> {
        if new.iter().any(|(k, v)| k == POOL_TAG && *v != self.pool_id) {
            return Err(error::permanent(
                "set-tags cannot move an instance to another pool",
            ));
        }
        // Only berth tags are replaced; the pool tag always stays.
        let mut tags: Vec<(String, String)> = new
            .iter()
            .filter(|(k, _)| is_berth_tag(k) && k != POOL_TAG)
            .cloned()
            .collect();
        tags.push((POOL_TAG.to_owned(), self.pool_id.clone()));
        let body = SetTagsBody {
            tags: tags.into_iter().collect(),
        };
        let url = format!("{}/tags", self.instance_url(instance_id));
        let resp = Request::put(&url).json(&body).send()?;
        match resp.status {
            200 | 204 => Ok(()),
            _ => Err(api_error(&resp, None)),
        }
    }

    fn limits(&mut self) -> Result<AccountLimits, Error> {
        let resp = Request::get(&self.url("/v1/limits")).send()?;
        if resp.status != 200 {
            return Err(api_error(&resp, None));
        }
        let body: LimitsBody = resp.json()?;
        Ok(AccountLimits {
            max_instances: body.max_instances,
            used_instances: body.used_instances,
            max_cores: None,
            used_cores: None,
            max_ram_mib: None,
            used_ram_mib: None,
        })
    }
}

/// The sim takes no label options: `{}` only, and any key is named back.
fn check_label_options(options: &str) -> Result<(), Error> {
    let value: serde_json::Value = serde_json::from_str(options)
        .map_err(|e| error::invalid_config(format!("label options: {e}")))?;
    match value {
        serde_json::Value::Object(map) => match map.keys().next() {
            None => Ok(()),
            Some(key) => Err(error::invalid_config(format!(
                "label options: unknown option {key:?}"
            ))),
        },
        _ => Err(error::invalid_config(
            "label options: must be a JSON object",
        )),
    }
}

/// Turns a failed sim response into the contract's error: the one place the
/// sim's statuses and codes are mapped.
fn api_error(resp: &Response, instance_type: Option<&str>) -> Error {
    let body: ErrorBody = resp.json().unwrap_or_default();
    let message = if body.error.message.is_empty() {
        format!(
            "sim answered {}: {}",
            resp.status,
            resp.text().chars().take(200).collect::<String>()
        )
    } else {
        body.error.message.clone()
    };
    let retry_after = || {
        let secs = resp.header("retry-after")?.trim().parse::<u64>().ok()?;
        Some(secs.saturating_mul(1000))
    };
    error_of(resp.status, &body, message, retry_after(), instance_type)
}

/// One item's error in a batch's answer.
fn item_error(status: Option<u16>, body: ErrorBody, instance_type: Option<&str>) -> Error {
    let status = status.unwrap_or(500);
    let message = match body.error.message.is_empty() {
        true => format!("sim answered {status} for this item"),
        false => body.error.message.clone(),
    };
    error_of(status, &body, message, None, instance_type)
}

/// The contract's error for what the sim answered: its status, its error
/// body, and `Retry-After` in milliseconds if a header gave one.
fn error_of(
    status: u16,
    body: &ErrorBody,
    message: String,
    retry_after: Option<u64>,
    instance_type: Option<&str>,
) -> Error {
    let code = body.error.code.as_str();
    match (status, code) {
        (429, _) => {
            let retry_after_ms = body.retry_after_ms.or(retry_after).unwrap_or(1000);
            error::rate_limited(retry_after_ms, message)
        }
        (403, "quota_exceeded") => error::quota_exceeded(message),
        (503, "insufficient_capacity") => match body.instance_type.as_deref().or(instance_type) {
            Some(t) => error::capacity_for_type(t, message),
            None => error::capacity_general(message),
        },
        (404, _) => error::not_found(message),
        (401 | 403, _) => error::unauthorized(message),
        (500..=599, _) => error::transient(message),
        _ => error::permanent(message),
    }
}

berth_sdk::export_driver!(Sim);

#[cfg(test)]
mod tests {
    use super::*;
    use berth_sdk::types::{CapacityScope, RateLimit};

    fn resp(status: u16, headers: &[(&str, &str)], body: &str) -> Response {
        Response {
            status,
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            body: body.as_bytes().to_vec(),
        }
    }

    fn err_body(code: &str, extra: &str) -> String {
        format!(r#"{{"error": {{"code": "{code}", "message": "m"}}{extra}}}"#)
    }

    #[test]
    fn maps_sim_errors() {
        let e = api_error(
            &resp(
                429,
                &[("retry-after", "3")],
                &err_body("rate_limited", r#", "retry_after_ms": 2500"#),
            ),
            None,
        );
        assert!(
            matches!(
                e,
                Error::RateLimited(RateLimit {
                    retry_after_ms: 2500,
                    ..
                })
            ),
            "{e:?}"
        );
        let e = api_error(
            &resp(429, &[("retry-after", "3")], &err_body("rate_limited", "")),
            None,
        );
        assert!(
            matches!(
                e,
                Error::RateLimited(RateLimit {
                    retry_after_ms: 3000,
                    ..
                })
            ),
            "{e:?}"
        );
        let e = api_error(&resp(429, &[], "not json"), None);
        assert!(
            matches!(
                e,
                Error::RateLimited(RateLimit {
                    retry_after_ms: 1000,
                    ..
                })
            ),
            "{e:?}"
        );
        let e = api_error(&resp(403, &[], &err_body("quota_exceeded", "")), None);
        assert!(
            matches!(e, Error::QuotaExceeded(ref m) if m == "m"),
            "{e:?}"
        );
        let e = api_error(
            &resp(
                503,
                &[],
                &err_body("insufficient_capacity", r#", "instance_type": "gpu""#),
            ),
            Some("small"),
        );
        assert!(
            matches!(e, Error::Capacity(ref c) if matches!(c.scope, CapacityScope::InstanceType(ref t) if t == "gpu")),
            "{e:?}"
        );
        let e = api_error(
            &resp(503, &[], &err_body("insufficient_capacity", "")),
            Some("small"),
        );
        assert!(
            matches!(e, Error::Capacity(ref c) if matches!(c.scope, CapacityScope::InstanceType(ref t) if t == "small")),
            "{e:?}"
        );
        let e = api_error(&resp(503, &[], "down"), None);
        assert!(matches!(e, Error::Transient(_)), "{e:?}");
        let e = api_error(&resp(404, &[], &err_body("not_found", "")), None);
        assert!(matches!(e, Error::NotFound(_)), "{e:?}");
        let e = api_error(&resp(401, &[], &err_body("unauthorized", "")), None);
        assert!(matches!(e, Error::Unauthorized(_)), "{e:?}");
        let e = api_error(&resp(400, &[], &err_body("invalid_request", "")), None);
        assert!(matches!(e, Error::Permanent(_)), "{e:?}");
        let e = api_error(&resp(500, &[], &err_body("internal_error", "")), None);
        assert!(matches!(e, Error::Transient(_)), "{e:?}");
    }

    /// A batch item's error maps as the call alone would have, from the
    /// status it carries.
    #[test]
    fn maps_batch_item_errors() {
        let item = |json: &str| -> api::BatchResult { serde_json::from_str(json).unwrap() };
        let r = item(r#"{"status": 403, "error": {"code": "quota_exceeded", "message": "m"}}"#);
        assert!(r.instance.is_none());
        let e = item_error(r.status, r.error, None);
        assert!(
            matches!(e, Error::QuotaExceeded(ref m) if m == "m"),
            "{e:?}"
        );
        let r = item(
            r#"{"status": 429, "error": {"code": "rate_limited", "message": "m"}, "retry_after_ms": 700}"#,
        );
        let e = item_error(r.status, r.error, None);
        assert!(
            matches!(
                e,
                Error::RateLimited(RateLimit {
                    retry_after_ms: 700,
                    ..
                })
            ),
            "{e:?}"
        );
        let r =
            item(r#"{"status": 503, "error": {"code": "insufficient_capacity", "message": "m"}}"#);
        let e = item_error(r.status, r.error, Some("small"));
        assert!(
            matches!(e, Error::Capacity(ref c) if matches!(c.scope, CapacityScope::InstanceType(ref t) if t == "small")),
            "{e:?}"
        );
        // An error without a status is the sim's fault: worth a retry.
        let r = item(r#"{"error": {"code": "x", "message": ""}}"#);
        let e = item_error(r.status, r.error, None);
        assert!(matches!(e, Error::Transient(_)), "{e:?}");
        let r = item(r#"{}"#);
        assert!(r.instance.is_none() && r.status.is_none());
    }

    #[test]
    fn configure_validates() {
        assert!(
            Sim::configure("p1", r#"{"endpoint": "http://127.0.0.1:8600/"}"#)
                .is_ok_and(|s| s.endpoint == "http://127.0.0.1:8600")
        );
        for (config, needle) in [
            (r#"{}"#, "endpoint"),
            (r#"{"endpoint": "ftp://x"}"#, "endpoint"),
            (r#"{"endpoint": "127.0.0.1:80"}"#, "endpoint"),
            (r#"{"endpoint": "http://h", "page_size": 0}"#, "page_size"),
            (r#"{"endpoint": "http://h", "colour": 1}"#, "colour"),
        ] {
            match Sim::configure("p1", config) {
                Err(Error::InvalidConfig(m)) => assert!(m.contains(needle), "{config}: {m}"),
                Err(e) => panic!("{config}: {e:?}"),
                Ok(_) => panic!("{config}: accepted"),
            }
        }
    }

    #[test]
    fn label_options() {
        assert!(check_label_options("{}").is_ok());
        assert!(
            matches!(check_label_options(r#"{"zone": "a"}"#), Err(Error::InvalidConfig(m)) if m.contains("zone"))
        );
        assert!(matches!(
            check_label_options("[]"),
            Err(Error::InvalidConfig(_))
        ));
    }
}
