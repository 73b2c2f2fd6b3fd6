//! [`Client`]: the HTTP API's operations as typed calls, over `reqwest` with
//! rustls, so that `https://` servers work as well as `http://` ones.

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use url::Url;

use crate::MAX_WAIT;
use crate::types::{self, Node, Request};
use berth_core::pool::Idle;
use berth_core::text::causes;

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest pause a long-poll's `Retry-After` makes the client take.
const MAX_RETRY_AFTER: u64 = 5;

/// How long a call may take, beyond any wait it asks the server for.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// A failed call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The service answered with an error body (or a status without one).
    #[error("{message} ({code})")]
    Api {
        status: u16,
        /// The API's error code (`not_found`, `forbidden`, …), or `HTTP n`
        /// when the answer carried no error body.
        code: String,
        message: String,
    },
    /// No answer from the service: it refused, timed out, or the
    /// connection (or its TLS) failed.
    #[error("cannot reach berth at {server}: {detail}; is it running there?")]
    Unreachable { server: String, detail: String },
    /// An answer that is not what this client expects.
    #[error("berth at {server} sent an answer this client cannot read: {detail}")]
    Answer { server: String, detail: String },
    /// The server URL or the token cannot be used.
    #[error("{0}")]
    Setup(String),
}

/// Which nodes `GET /v1/nodes` answers with; `None` is any.
#[derive(Clone, Debug, Default)]
pub struct NodeFilter {
    pub label: Option<String>,
    pub provider: Option<String>,
    pub state: Option<String>,
    pub requestor: Option<String>,
    /// Metadata keys with the value each must have (`?meta.KEY=VALUE`):
    /// only nodes handed out to (or set aside for) a request made with
    /// them, whose requestor is the caller (or any, for an admin).
    pub meta: Vec<(String, String)>,
}

/// Which requests `GET /v1/requests` answers with; `None` is any.
#[derive(Clone, Debug, Default)]
pub struct RequestFilter {
    pub state: Option<String>,
    pub requestor: Option<String>,
    /// Metadata keys with the value each must have (`?meta.KEY=VALUE`).
    pub meta: Vec<(String, String)>,
}

/// `meta` as the query's `meta.KEY` parameters.
fn meta_params(meta: &[(String, String)]) -> Vec<(String, String)> {
    meta.iter()
        .map(|(k, v)| (format!("meta.{k}"), v.clone()))
        .collect()
}

/// A berth service. Cheap to clone; calls share one connection pool.
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    base: Url,
    /// The URL for messages, without any user info.
    shown: String,
    token: Option<String>,
}

impl Client {
    /// A client of the service at `server` (`http://` or `https://`),
    /// sending `token` as a bearer token. HTTPS servers are checked against
    /// the system's trusted roots.
    pub fn new(server: &str, token: Option<String>) -> Result<Client, Error> {
        Self::build(server, token, Vec::new())
    }

    /// As [`Client::new`], trusting as well the CA certificates (PEM) in
    /// `ca_file`: a server whose certificate a private CA signed.
    pub fn with_ca(
        server: &str,
        token: Option<String>,
        ca_file: &std::path::Path,
    ) -> Result<Client, Error> {
        let shown = ca_file.display();
        let pem = std::fs::read(ca_file)
            .map_err(|e| Error::Setup(format!("the CA file {shown}: cannot read it: {e}")))?;
        let roots = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| Error::Setup(format!("the CA file {shown}: {}", causes(&e))))?;
        if roots.is_empty() {
            return Err(Error::Setup(format!(
                "the CA file {shown}: no certificate (a PEM `BEGIN CERTIFICATE` block) in it"
            )));
        }
        Self::build(server, token, roots)
    }

    fn build(
        server: &str,
        token: Option<String>,
        roots: Vec<reqwest::Certificate>,
    ) -> Result<Client, Error> {
        let base = Url::parse(server)
            .map_err(|e| Error::Setup(format!("the server `{server}` is not a URL: {e}")))?;
        if !matches!(base.scheme(), "http" | "https") || base.host_str().is_none() {
            return Err(Error::Setup(format!(
                "the server {server} is not an http:// or https:// URL with a host"
            )));
        }
        if let Some(t) = &token
            && reqwest::header::HeaderValue::from_str(&format!("Bearer {t}")).is_err()
        {
            return Err(Error::Setup(
                "the token has characters a header cannot carry".into(),
            ));
        }
        // The one crypto provider this client is built with; a program that
        // installed its own keeps it.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .user_agent(concat!("berth/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(CONNECT_TIMEOUT)
            .tls_certs_merge(roots)
            .build()
            .map_err(|e| Error::Setup(format!("starting the HTTP client: {}", causes(&e))))?;
        let port = base.port().map(|p| format!(":{p}")).unwrap_or_default();
        let shown = format!(
            "{}://{}{port}{}",
            base.scheme(),
            base.host_str().unwrap_or_default(),
            base.path().trim_end_matches('/')
        );
        Ok(Client {
            http,
            base,
            shown,
            token,
        })
    }

    /// The server, as messages show it.
    pub fn server(&self) -> &str {
        &self.shown
    }

    /// `GET /v1/nodes`.
    pub async fn nodes(&self, f: &NodeFilter) -> Result<Vec<Node>, Error> {
        let meta = meta_params(&f.meta);
        let mut q = vec![
            ("label", f.label.as_deref()),
            ("provider", f.provider.as_deref()),
            ("state", f.state.as_deref()),
            ("requestor", f.requestor.as_deref()),
        ];
        q.extend(meta.iter().map(|(k, v)| (k.as_str(), Some(v.as_str()))));
        self.call(reqwest::Method::GET, &["nodes"], &q, None::<&()>)
            .await
    }

    /// `GET /v1/nodes/{id}`.
    pub async fn node(&self, id: &str) -> Result<Node, Error> {
        self.call(reqwest::Method::GET, &["nodes", id], &[], None::<&()>)
            .await
    }

    /// `POST /v1/nodes/{id}/release`: gives a node back.
    pub async fn release(&self, id: &str) -> Result<Node, Error> {
        let path = ["nodes", id, "release"];
        self.call(reqwest::Method::POST, &path, &[], None::<&()>)
            .await
    }

    /// `PUT /v1/nodes/{id}/idle` (admin).
    pub async fn set_idle(&self, id: &str, idle: Idle) -> Result<Node, Error> {
        let body = types::SetIdle {
            idle: idle.as_str().to_owned(),
        };
        let path = ["nodes", id, "idle"];
        self.call(reqwest::Method::PUT, &path, &[], Some(&body))
            .await
    }

    /// `DELETE /v1/nodes/{id}` (admin).
    pub async fn delete_node(&self, id: &str) -> Result<Node, Error> {
        self.call(reqwest::Method::DELETE, &["nodes", id], &[], None::<&()>)
            .await
    }

    /// `GET /v1/requests`.
    pub async fn requests(&self, f: &RequestFilter) -> Result<Vec<Request>, Error> {
        let meta = meta_params(&f.meta);
        let mut q = vec![
            ("state", f.state.as_deref()),
            ("requestor", f.requestor.as_deref()),
        ];
        q.extend(meta.iter().map(|(k, v)| (k.as_str(), Some(v.as_str()))));
        self.call(reqwest::Method::GET, &["requests"], &q, None::<&()>)
            .await
    }

    /// `POST /v1/requests`.
    pub async fn create_request(&self, new: &types::NewRequest) -> Result<Request, Error> {
        self.call(reqwest::Method::POST, &["requests"], &[], Some(new))
            .await
    }

    /// `POST /v1/requests` with an `Idempotency-Key`: sent again with the
    /// same key and body (after a timeout, say), it answers the request
    /// the first call made instead of making another; with another body,
    /// it is refused (`idempotency_key_reused`).
    pub async fn create_request_keyed(
        &self,
        new: &types::NewRequest,
        key: &str,
    ) -> Result<Request, Error> {
        let headers = [("idempotency-key", key)];
        self.call_with(
            reqwest::Method::POST,
            &["requests"],
            &[],
            Some(new),
            &headers,
        )
        .await
    }

    /// `GET /v1/requests/{id}`; with `wait`, held by the server until the
    /// request is no longer pending or `wait` (at most [`MAX_WAIT`]) is over.
    /// A server with no room for another long-poll answers at once with
    /// `Retry-After`; the call then returns after that pause, so that a
    /// loop of waits does not spin.
    pub async fn request(&self, id: &str, wait: Option<Duration>) -> Result<Request, Error> {
        let wait = wait.map(|w| format!("{}ms", w.min(MAX_WAIT).as_millis().max(1)));
        let q = [("wait", wait.as_deref())];
        self.call(reqwest::Method::GET, &["requests", id], &q, None::<&()>)
            .await
    }

    /// `DELETE /v1/requests/{id}`: withdraws a request, releasing what it
    /// was handed.
    pub async fn cancel(&self, id: &str) -> Result<Request, Error> {
        let path = ["requests", id];
        self.call(reqwest::Method::DELETE, &path, &[], None::<&()>)
            .await
    }

    /// `POST /v1/lease`: renews the lease of the caller's requestor (or of
    /// `requestor`, for an admin).
    pub async fn renew(&self, requestor: Option<&str>) -> Result<types::Lease, Error> {
        let q = [("requestor", requestor)];
        self.call(reqwest::Method::POST, &["lease"], &q, None::<&()>)
            .await
    }

    /// `GET /v1/providers`.
    pub async fn providers(&self) -> Result<Vec<types::Provider>, Error> {
        self.call(reqwest::Method::GET, &["providers"], &[], None::<&()>)
            .await
    }

    /// `GET /v1/drivers`.
    pub async fn drivers(&self) -> Result<Vec<types::Driver>, Error> {
        self.call(reqwest::Method::GET, &["drivers"], &[], None::<&()>)
            .await
    }

    /// `POST /v1/drivers/reload` (admin): every provider's driver file read
    /// again, and what each provider did.
    pub async fn reload_drivers(&self) -> Result<Vec<types::DriverReload>, Error> {
        self.call(
            reqwest::Method::POST,
            &["drivers", "reload"],
            &[],
            None::<&()>,
        )
        .await
    }

    /// `POST /v1/drivers/{provider}/rollback` (admin): the provider back on
    /// the driver it ran before.
    pub async fn rollback_driver(&self, provider: &str) -> Result<types::DriverReload, Error> {
        let path = ["drivers", provider, "rollback"];
        self.call(reqwest::Method::POST, &path, &[], None::<&()>)
            .await
    }

    /// `POST /v1/config/check` (admin): what reading `text` as the config
    /// file would change in the running berth.
    /// `POST /v1/config/reload` (admin): the config file read again, and
    /// applied unless refused.
    pub async fn reload_config(&self) -> Result<types::ConfigReload, Error> {
        self.call(
            reqwest::Method::POST,
            &["config", "reload"],
            &[],
            None::<&()>,
        )
        .await
    }

    pub async fn check_config(&self, text: String) -> Result<types::ConfigCheck, Error> {
        let body = types::ConfigText { text };
        self.call(
            reqwest::Method::POST,
            &["config", "check"],
            &[],
            Some(&body),
        )
        .await
    }

    /// `GET /v1/labels`.
    pub async fn labels(&self) -> Result<Vec<types::Label>, Error> {
        self.call(reqwest::Method::GET, &["labels"], &[], None::<&()>)
            .await
    }

    /// One call: `path` segments under `/v1` (each escaped), the query's set
    /// parameters, an optional JSON body; the answer's JSON as `T`.
    async fn call<T: DeserializeOwned, B: Serialize + ?Sized>(
        &self,
        method: reqwest::Method,
        path: &[&str],
        query: &[(&str, Option<&str>)],
        body: Option<&B>,
    ) -> Result<T, Error> {
        self.call_with(method, path, query, body, &[]).await
    }

    /// [`Client::call`] with `headers` added.
    async fn call_with<T: DeserializeOwned, B: Serialize + ?Sized>(
        &self,
        method: reqwest::Method,
        path: &[&str],
        query: &[(&str, Option<&str>)],
        body: Option<&B>,
        headers: &[(&str, &str)],
    ) -> Result<T, Error> {
        let mut url = self.base.clone();
        url.set_query(None);
        url.set_fragment(None);
        url.path_segments_mut()
            .map_err(|()| Error::Setup(format!("{} cannot have a path", self.shown)))?
            .pop_if_empty()
            .push("v1")
            .extend(path);
        let set: Vec<(&str, &str)> = query
            .iter()
            .filter_map(|(k, v)| Some((*k, (*v)?)))
            .collect();
        if !set.is_empty() {
            url.query_pairs_mut().extend_pairs(set);
        }
        // A long-poll is held up to MAX_WAIT by the server.
        let waits = query.iter().any(|(k, v)| *k == "wait" && v.is_some());
        let timeout = CALL_TIMEOUT + if waits { MAX_WAIT } else { Duration::ZERO };
        let mut req = self.http.request(method, url).timeout(timeout);
        if let Some(token) = &self.token {
            req = req.bearer_auth(token);
        }
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        if let Some(body) = body {
            req = req.json(body);
        }
        let unreachable = |e: reqwest::Error| Error::Unreachable {
            server: self.shown.clone(),
            detail: if e.is_timeout() {
                format!("no answer in {timeout:?}")
            } else {
                causes(&e)
            },
        };
        let answer = req.send().await.map_err(unreachable)?;
        let status = answer.status();
        let pause = (answer.headers().get(reqwest::header::RETRY_AFTER))
            .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
            .filter(|_| waits && status.is_success())
            .map(|s| Duration::from_secs(s.min(MAX_RETRY_AFTER)));
        let bytes = answer.bytes().await.map_err(unreachable)?;
        if !status.is_success() {
            return Err(api_error(status, &bytes));
        }
        if let Some(pause) = pause {
            tokio::time::sleep(pause).await;
        }
        serde_json::from_slice(&bytes).map_err(|e| Error::Answer {
            server: self.shown.clone(),
            detail: e.to_string(),
        })
    }
}

/// The server's error body, or what there is of one.
fn api_error(status: reqwest::StatusCode, body: &[u8]) -> Error {
    let (code, message) = match serde_json::from_slice::<types::ErrorBody>(body) {
        Ok(b) => (b.error.code, b.error.message),
        Err(_) => {
            let text = String::from_utf8_lossy(body);
            let reason = status.canonical_reason().unwrap_or("no reason given");
            let text = Some(text.trim())
                .filter(|t| !t.is_empty())
                .unwrap_or(reason);
            (
                format!("HTTP {}", status.as_u16()),
                text.chars().take(200).collect(),
            )
        }
    };
    Error::Api {
        status: status.as_u16(),
        code,
        message,
    }
}
