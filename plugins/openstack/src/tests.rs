//! The driver's calls against a stand-in host ([`Fake`]): its records in a
//! map, a clock it moves itself, and a small Nova of its own that answers
//! the requests the driver sends, as Nova does, and remembers them.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};

use berth_sdk::http::HttpError;
use berth_sdk::types::Error;
use serde_json::json;

use super::*;

const ENDPOINT: &str = "http://nova.test:8774/v2.1";
const HOST: &str = "nova.test:8774";
const NODE: &str = "n-00000000000000ab";
const TOKEN: &str = "3f2c1a4e-7b6d-8e9f-a0b1-c2d3e4f5a6b7";

#[derive(Clone, Debug)]
struct FakeServer {
    id: String,
    name: String,
    metadata: BTreeMap<String, String>,
    status: &'static str,
    deleting: bool,
    /// Hidden from lists until the clock reaches this.
    listed_from: u64,
}

#[derive(Default)]
struct Fake {
    servers: RefCell<Vec<FakeServer>>,
    records: RefCell<BTreeMap<String, String>>,
    now: Cell<u64>,
    sent: RefCell<Vec<Outgoing>>,
    /// Answers given instead of the fake Nova's, in order.
    scripted: RefCell<VecDeque<Response>>,
    /// How long a new server is left out of lists.
    lag_ms: Cell<u64>,
    /// The next create makes its server, then its answer is lost.
    lose_next_answer: Cell<bool>,
    /// The next create is lost before it reaches Nova.
    drop_next_create: Cell<bool>,
    info: RefCell<Option<String>>,
    next_id: Cell<u32>,
}

fn answer(status: u16, body: serde_json::Value) -> Response {
    Response {
        status,
        headers: vec![("content-type".into(), "application/json".into())],
        body: if body.is_null() {
            Vec::new()
        } else {
            body.to_string().into_bytes()
        },
    }
}

fn keystone_info(url: &str) -> String {
    json!({
        "kind": "keystone",
        "catalog": [{"type": "compute", "endpoints": [
            {"interface": "public", "region": "RegionOne", "region_id": "RegionOne", "url": url},
        ]}],
    })
    .to_string()
}

impl Fake {
    fn new() -> Fake {
        let fake = Fake::default();
        *fake.info.borrow_mut() = Some(keystone_info(ENDPOINT));
        fake.now.set(1_000_000);
        fake
    }

    fn view(&self, s: &FakeServer) -> serde_json::Value {
        json!({
            "id": s.id,
            "name": s.name,
            "status": s.status,
            "OS-EXT-STS:task_state": if s.deleting { json!("deleting") } else { json!(null) },
            "flavor": {"id": "2", "links": []},
            "metadata": s.metadata,
            "created": "2026-02-14T19:23:58Z",
            "addresses": {},
        })
    }

    /// Puts a server in the fake Nova directly.
    fn add(&self, id: &str, name: &str, metadata: &[(&str, &str)], status: &'static str) {
        self.servers.borrow_mut().push(FakeServer {
            id: id.into(),
            name: name.into(),
            metadata: metadata
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            status,
            deleting: false,
            listed_from: 0,
        });
    }

    /// Requests sent, as `METHOD path?query` below the endpoint.
    fn requests(&self) -> Vec<String> {
        self.sent
            .borrow()
            .iter()
            .map(|r| {
                let path = r.url.strip_prefix(ENDPOINT).unwrap_or(&r.url);
                format!("{:?} {path}", r.method).to_uppercase()
            })
            .collect()
    }

    fn posts(&self) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.starts_with("POST /SERVERS"))
            .count()
    }

    fn nova(&self, r: &Outgoing) -> Response {
        let path = r.url.strip_prefix(ENDPOINT).unwrap_or("?");
        let (path, query) = path.split_once('?').unwrap_or((path, ""));
        let body: serde_json::Value = r
            .body
            .as_deref()
            .and_then(|b| serde_json::from_slice(b).ok())
            .unwrap_or_default();
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let now = self.now.get();
        let gone = || {
            answer(
                404,
                json!({"itemNotFound": {"code": 404, "message": "Instance could not be found."}}),
            )
        };
        match (r.method, segments.as_slice()) {
            (Method::Post, ["servers"]) => {
                let n = self.next_id.get() + 1;
                self.next_id.set(n);
                let id = format!("00000000-0000-4000-8000-{n:012}");
                let s = &body["server"];
                let metadata = s["metadata"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                            .collect()
                    })
                    .unwrap_or_default();
                self.servers.borrow_mut().push(FakeServer {
                    id: id.clone(),
                    name: s["name"].as_str().unwrap_or_default().to_owned(),
                    metadata,
                    status: "BUILD",
                    deleting: false,
                    listed_from: now + self.lag_ms.get(),
                });
                answer(
                    202,
                    json!({"server": {"id": id, "links": [], "adminPass": "secret"}}),
                )
            }
            (Method::Get, ["servers", "detail"]) => {
                let params: BTreeMap<String, String> = query
                    .split('&')
                    .filter_map(|p| p.split_once('='))
                    .map(|(k, v)| (k.to_owned(), percent_decode(v)))
                    .collect();
                let names: Option<Vec<String>> = params.get("name").map(|p| {
                    p.trim_start_matches("^(")
                        .trim_start_matches('^')
                        .trim_end_matches(")$")
                        .trim_end_matches('$')
                        .split('|')
                        .map(|n| n.replace('\\', ""))
                        .collect()
                });
                let limit: usize = params
                    .get("limit")
                    .and_then(|l| l.parse().ok())
                    .unwrap_or(1000);
                let servers = self.servers.borrow();
                let mut visible: Vec<&FakeServer> = servers
                    .iter()
                    .filter(|s| s.listed_from <= now)
                    .filter(|s| names.as_ref().is_none_or(|n| n.contains(&s.name)))
                    .collect();
                if let Some(m) = params.get("marker") {
                    let Some(at) = visible.iter().position(|s| &s.id == m) else {
                        return answer(
                            400,
                            json!({"badRequest": {"code": 400, "message": format!("marker [{m}] not found")}}),
                        );
                    };
                    visible = visible.split_off(at + 1);
                }
                let page: Vec<serde_json::Value> =
                    visible.iter().take(limit).map(|s| self.view(s)).collect();
                let mut body = json!({ "servers": page });
                if page.len() == limit {
                    let last = page[limit - 1]["id"].as_str().unwrap_or_default();
                    body["servers_links"] = json!([{"rel": "next",
                        "href": format!("{ENDPOINT}/servers/detail?limit={limit}&marker={last}")}]);
                }
                answer(200, body)
            }
            (Method::Get, ["servers", id]) => {
                match self.servers.borrow().iter().find(|s| s.id == *id) {
                    Some(s) => answer(200, json!({"server": self.view(s)})),
                    None => gone(),
                }
            }
            (Method::Delete, ["servers", id]) => {
                match self.servers.borrow_mut().iter_mut().find(|s| s.id == *id) {
                    Some(s) => {
                        s.deleting = true;
                        answer(204, json!(null))
                    }
                    None => gone(),
                }
            }
            (Method::Put, ["servers", id, "metadata"]) => {
                let mut servers = self.servers.borrow_mut();
                let Some(s) = servers.iter_mut().find(|s| s.id == *id) else {
                    return gone();
                };
                s.metadata = body["metadata"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                            .collect()
                    })
                    .unwrap_or_default();
                answer(200, json!({"metadata": s.metadata}))
            }
            (Method::Get, ["limits"]) => answer(
                200,
                json!({"limits": {"rate": [], "absolute": {
                    "maxTotalInstances": 10, "maxTotalCores": -1, "maxTotalRAMSize": 51200,
                    "totalInstancesUsed": 2, "totalCoresUsed": 4, "totalRAMUsed": 4096,
                }}}),
            ),
            _ => answer(
                404,
                json!({"itemNotFound": {"code": 404, "message": "no route"}}),
            ),
        }
    }
}

impl Env for &Fake {
    fn send(&self, r: &Outgoing) -> Result<Response, HttpError> {
        self.sent.borrow_mut().push(r.clone());
        let lost = HttpError::Request {
            code: "ConnectionTimeout".into(),
            detail: None,
        };
        if r.method == Method::Post && self.drop_next_create.replace(false) {
            return Err(lost);
        }
        if let Some(answer) = self.scripted.borrow_mut().pop_front() {
            return Ok(answer);
        }
        let answer = self.nova(r);
        if r.method == Method::Post && self.lose_next_answer.replace(false) {
            return Err(lost);
        }
        Ok(answer)
    }

    fn auth_info(&self, host: &str) -> Result<Option<String>, Error> {
        Ok(if host == HOST {
            self.info.borrow().clone()
        } else {
            None
        })
    }

    fn get(&self, key: &str) -> Result<Option<String>, Error> {
        Ok(self.records.borrow().get(key).cloned())
    }

    fn scan(&self, prefix: &str) -> Result<Vec<(String, String)>, Error> {
        Ok(self
            .records
            .borrow()
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn compare_and_swap(
        &self,
        key: &str,
        expected: Option<&str>,
        value: Option<&str>,
    ) -> Result<bool, Error> {
        let mut records = self.records.borrow_mut();
        if records.get(key).map(String::as_str) != expected {
            return Ok(false);
        }
        match value {
            Some(v) => records.insert(key.to_owned(), v.to_owned()),
            None => records.remove(key),
        };
        Ok(true)
    }

    fn now_ms(&self) -> u64 {
        self.now.get()
    }

    fn sleep_ms(&self, ms: u64) {
        self.now.set(self.now.get() + ms);
    }

    fn warn(&self, _: &str, _: &[(&str, &str)]) {}
}

fn t(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).into(), (*v).into()))
        .collect()
}

fn driver(fake: &Fake) -> OpenStack<&Fake> {
    driver_with(
        fake,
        r#"{"credential-host": "nova.test:8774", "list-lag": "5s"}"#,
    )
}

fn driver_with<'a>(fake: &'a Fake, config: &str) -> OpenStack<&'a Fake> {
    OpenStack::new("p1", config, fake).unwrap_or_else(|e| panic!("configure: {e:?}"))
}

fn spec(node: &str) -> CreateSpec {
    CreateSpec {
        node_id: node.into(),
        token: TOKEN.into(),
        instance_type: "2".into(),
        image: "70a599e0-31e7-49b7-b260-868f441e862b".into(),
        tags: t(&[
            ("berth-pool", "someone-else"),
            ("berth-node", node),
            ("berth-label", "ci"),
        ]),
        user_data: None,
        ssh_public_key: None,
        options: "{}".into(),
    }
}

/// The body of the last create sent.
fn last_create(fake: &Fake) -> serde_json::Value {
    let sent = fake.sent.borrow();
    let post = sent
        .iter()
        .rev()
        .find(|r| r.method == Method::Post)
        .expect("a create was sent");
    serde_json::from_slice(post.body.as_deref().unwrap_or_default()).expect("JSON")
}

fn case(e: &Error) -> &'static str {
    match e {
        Error::RateLimited(_) => "rate-limited",
        Error::QuotaExceeded(_) => "quota-exceeded",
        Error::Capacity(_) => "capacity",
        Error::NotFound(_) => "not-found",
        Error::Unauthorized(_) => "unauthorized",
        Error::InvalidConfig(_) => "invalid-config",
        Error::Transient(_) => "transient",
        Error::Permanent(_) => "permanent",
    }
}

#[test]
fn describe_declares_what_it_does() {
    let info = <OpenStack as Driver>::describe();
    assert_eq!(info.name, "openstack");
    let names: Vec<&str> = info.config.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "credential-host",
            "compute-endpoint",
            "interface",
            "region",
            "networks",
            "page-size",
            "list-lag",
            "build-wait"
        ]
    );
    let options: Vec<&str> = info.label_options.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        options,
        [
            "networks",
            "key-name",
            "security-groups",
            "availability-zone",
            "config-drive"
        ]
    );
    for field in info.config.iter().chain(&info.label_options) {
        if let Some(default) = &field.default {
            assert!(
                serde_json::from_str::<serde_json::Value>(default).is_ok(),
                "{}",
                field.name
            );
        }
    }
    let caps = info.capabilities;
    assert!(caps.contains(
        Capabilities::IDEMPOTENT_CREATE
            | Capabilities::USER_DATA
            | Capabilities::SSH_KEYS
            | Capabilities::ACCOUNT_LIMITS
    ));
    assert!(!caps.contains(Capabilities::CREATE_MANY) && !caps.contains(Capabilities::DELETE_MANY));
}

#[test]
fn configure_refuses_bad_config_and_an_empty_pool() {
    let fake = Fake::new();
    assert!(matches!(
        OpenStack::new("", r#"{"credential-host": "h"}"#, &fake),
        Err(Error::InvalidConfig(m)) if m.contains("pool id")
    ));
    assert!(matches!(
        OpenStack::new("p", "{}", &fake),
        Err(Error::InvalidConfig(m)) if m.contains("credential-host: missing")
    ));
}

#[test]
fn the_endpoint_comes_from_the_credentials_catalog() {
    let fake = Fake::new();
    let mut d = driver(&fake);
    d.do_list(&t(&[("berth-pool", "p1")]), None).expect("lists");
    assert_eq!(fake.requests(), ["GET /SERVERS/DETAIL?LIMIT=1000"]);
    // No credential for the host named.
    let mut d = driver_with(&fake, r#"{"credential-host": "elsewhere:1"}"#);
    let e = d.do_list(&[], None).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidConfig(m) if m.contains("no keystone credential for host \"elsewhere:1\"")),
        "{e:?}"
    );
    // A catalog whose Nova is not on the credential's host.
    *fake.info.borrow_mut() = Some(keystone_info("https://other.example.com/v2.1"));
    let mut d = driver(&fake);
    let e = d.do_list(&[], None).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidConfig(m) if m.contains("would carry no token")),
        "{e:?}"
    );
    // An explicit endpoint asks nothing of the credential.
    let fake = Fake::new();
    *fake.info.borrow_mut() = None;
    let mut d = driver_with(&fake, &format!(r#"{{"compute-endpoint": "{ENDPOINT}"}}"#));
    assert!(d.do_list(&[], None).is_ok());
}

#[test]
fn a_create_posts_once_with_its_tags_as_metadata() {
    let fake = Fake::new();
    let mut d = driver(&fake);
    let mut s = spec(NODE);
    s.ssh_public_key = Some("ssh-ed25519 AAAAC3Nza ops@example".into());
    s.options =
        r#"{"key-name": "ops", "security-groups": ["default", "ssh"], "availability-zone": "az1"}"#
            .into();
    let i = d.do_create(s.clone()).expect("creates");
    assert_eq!(i.state, InstanceState::Pending);
    assert_eq!(i.instance_type, "2");
    assert_eq!(
        tags::tag(&i.tags, POOL_TAG),
        Some("p1"),
        "the pool is forced"
    );
    assert_eq!(tags::tag(&i.tags, TOKEN_KEY), Some(TOKEN));
    let body = last_create(&fake);
    let server = &body["server"];
    assert_eq!(server["name"], NODE);
    assert_eq!(server["flavorRef"], "2");
    assert_eq!(server["imageRef"], "70a599e0-31e7-49b7-b260-868f441e862b");
    assert_eq!(server["networks"], "auto");
    assert_eq!(server["metadata"]["berth-pool"], "p1");
    assert_eq!(server["metadata"]["berth-label"], "ci");
    assert_eq!(server["metadata"][TOKEN_KEY], TOKEN);
    assert_eq!(server["key_name"], "ops");
    assert_eq!(
        server["security_groups"],
        json!([{"name": "default"}, {"name": "ssh"}])
    );
    assert_eq!(server["availability_zone"], "az1");
    let user_data = server["user_data"].as_str().expect("user data");
    assert!(
        user_data.starts_with("I2Nsb3VkLWNvbmZpZw"),
        "#cloud-config: {user_data}"
    );
    let sent = fake.sent.borrow();
    assert!(
        sent[0]
            .headers
            .contains(&("openstack-api-version".into(), "compute 2.38".into()))
    );
    drop(sent);
    // The same create again (a restart's): the server it made, no second.
    let again = d.do_create(s).expect("the same");
    assert_eq!(again.id, i.id);
    assert_eq!(fake.posts(), 1);
    assert_eq!(
        fake.requests().last().map(String::as_str),
        Some(format!("GET /SERVERS/{}", i.id.to_uppercase()).as_str())
    );
}

#[test]
fn a_create_whose_answer_was_lost_is_found_once_the_list_shows_it() {
    let fake = Fake::new();
    let mut d = driver(&fake);
    fake.lag_ms.set(3000);
    fake.lose_next_answer.set(true);
    let lost = d.do_create(spec(NODE)).unwrap_err();
    assert_eq!(case(&lost), "transient");
    assert_eq!(fake.servers.borrow().len(), 1, "Nova made it");
    // berth sends the create again at once: the list leaves the server
    // out for 3 s; the driver waits out its list-lag (5 s) and finds it.
    let start = fake.now.get();
    let found = d.do_create(spec(NODE)).expect("found");
    assert_eq!(found.id, fake.servers.borrow()[0].id);
    assert_eq!(fake.posts(), 1, "{:?}", fake.requests());
    assert_eq!(fake.now.get() - start, 5000, "waited for the list");
    assert_eq!(tags::tag(&found.tags, NODE_TAG), Some(NODE));
    // And a third try finds it by its recorded id, without waiting.
    let start = fake.now.get();
    assert_eq!(d.do_create(spec(NODE)).expect("again").id, found.id);
    assert_eq!(fake.now.get(), start);
    assert_eq!(fake.posts(), 1);
}

#[test]
fn a_create_lost_before_nova_is_made_again_after_the_lag() {
    let fake = Fake::new();
    let mut d = driver(&fake);
    fake.drop_next_create.set(true);
    assert_eq!(case(&d.do_create(spec(NODE)).unwrap_err()), "transient");
    assert!(fake.servers.borrow().is_empty());
    // Sent again a second later: nothing to find, after waiting the rest
    // of the lag, so the driver makes it.
    fake.now.set(fake.now.get() + 1000);
    let made = d.do_create(spec(NODE)).expect("made");
    assert_eq!(fake.servers.borrow().len(), 1);
    assert_eq!(fake.posts(), 2);
    // Sent again long after a lost create: no wait at all.
    let fake = Fake::new();
    let mut d = driver(&fake);
    fake.drop_next_create.set(true);
    let _ = d.do_create(spec(NODE));
    fake.now.set(fake.now.get() + 60_000);
    let start = fake.now.get();
    d.do_create(spec(NODE)).expect("made");
    assert_eq!(fake.now.get(), start);
    assert!(!made.id.is_empty());
}

#[test]
fn a_create_nova_refused_leaves_nothing_to_look_for() {
    let fake = Fake::new();
    let mut d = driver(&fake);
    fake.scripted.borrow_mut().push_back(answer(
        403,
        json!({"forbidden": {"code": 403, "message": "Quota exceeded for instances: Requested 1, but already used 10 of 10 instances"}}),
    ));
    let e = d.do_create(spec(NODE)).unwrap_err();
    assert_eq!(case(&e), "quota-exceeded");
    assert!(
        fake.records.borrow().is_empty(),
        "{:?}",
        fake.records.borrow()
    );
    // The next try (berth's, with a new token) posts at once.
    let mut s = spec(NODE);
    s.token = "another".into();
    d.do_create(s).expect("made");
    assert_eq!(fake.requests(), ["POST /SERVERS", "POST /SERVERS"]);
    // A 5xx may have made it: the record stays.
    let fake = Fake::new();
    let mut d = driver(&fake);
    fake.scripted.borrow_mut().push_back(answer(
        500,
        json!({"computeFault": {"code": 500, "message": "Unexpected API Error."}}),
    ));
    assert_eq!(case(&d.do_create(spec(NODE)).unwrap_err()), "transient");
    assert_eq!(fake.records.borrow().len(), 1);
}

#[test]
fn a_create_refuses_what_nova_would_before_any_request() {
    let fake = Fake::new();
    let mut d = driver(&fake);
    for (options, needle) in [
        (r#"{"flavor": "x"}"#, "flavor"),
        (r#"{"networks": ["private"]}"#, "network UUID"),
        ("[]", "JSON object"),
    ] {
        let mut s = spec(NODE);
        s.options = options.into();
        match d.do_create(s) {
            Err(Error::InvalidConfig(m)) => assert!(m.contains(needle), "{options}: {m}"),
            other => panic!("{options}: {other:?}"),
        }
    }
    let mut s = spec(NODE);
    s.tags.push(("berth-long".into(), "v".repeat(256)));
    assert!(matches!(d.do_create(s), Err(Error::Permanent(m)) if m.contains("berth-long")));
    let mut s = spec(NODE);
    s.user_data = Some("x".repeat(50_000));
    assert!(matches!(d.do_create(s), Err(Error::Permanent(m)) if m.contains("65535")));
    let mut s = spec(NODE);
    s.image = " ".into();
    assert!(matches!(d.do_create(s), Err(Error::InvalidConfig(m)) if m.contains("image")));
    assert!(fake.sent.borrow().is_empty());
    assert!(fake.records.borrow().is_empty());
    // A node id Nova would not take as a name: a name of the token.
    let mut s = spec(" odd ");
    s.tags = t(&[("berth-node", " odd ")]);
    d.do_create(s).expect("made");
    assert_eq!(
        last_create(&fake)["server"]["name"],
        format!("berth-{TOKEN}")
    );
    // The provider's networks.
    let fake = Fake::new();
    let net = "3cb9bc59-5699-4588-a4b1-b87f96708bc6";
    let mut d = driver_with(
        &fake,
        &format!(r#"{{"credential-host": "{HOST}", "networks": ["{net}"]}}"#),
    );
    d.do_create(spec(NODE)).expect("made");
    assert_eq!(
        last_create(&fake)["server"]["networks"],
        json!([{"uuid": net}])
    );
}

#[test]
fn a_list_is_one_page_of_the_pools_servers() {
    let fake = Fake::new();
    let mut d = driver_with(
        &fake,
        &format!(r#"{{"credential-host": "{HOST}", "page-size": 2}}"#),
    );
    fake.add(
        "a",
        "n-a",
        &[("berth-pool", "p1"), ("berth-node", "n-a")],
        "ACTIVE",
    );
    fake.add("b", "x", &[("berth-pool", "other")], "ACTIVE");
    fake.add(
        "c",
        "n-c",
        &[("berth-pool", "p1"), ("long", &"v".repeat(600))],
        "BUILD",
    );
    let first = d
        .do_list(&t(&[("berth-pool", "p1")]), None)
        .expect("page 1");
    let ids: Vec<&str> = first.instances.iter().map(|i| i.id.as_str()).collect();
    assert_eq!((ids, first.next.as_deref()), (vec!["a"], Some("b")));
    let second = d
        .do_list(&t(&[("berth-pool", "p1")]), first.next.as_deref())
        .expect("page 2");
    assert_eq!(second.instances.len(), 1);
    assert_eq!(second.instances[0].state, InstanceState::Pending);
    assert!(
        tags::tag(&second.instances[0].tags, "long").is_none(),
        "too long for berth"
    );
    assert_eq!(second.next, None);
    assert_eq!(
        fake.requests(),
        [
            "GET /SERVERS/DETAIL?LIMIT=2",
            "GET /SERVERS/DETAIL?LIMIT=2&MARKER=B"
        ]
    );
    // Another pool's filter: nothing, and no request.
    let foreign = d
        .do_list(&t(&[("berth-pool", "other")]), None)
        .expect("nothing");
    assert!(foreign.instances.is_empty() && foreign.next.is_none());
    assert_eq!(fake.sent.borrow().len(), 2);
    // A marker Nova no longer takes: list again.
    fake.scripted.borrow_mut().push_back(answer(
        400,
        json!({"badRequest": {"code": 400, "message": "marker [b] not found"}}),
    ));
    assert_eq!(case(&d.do_list(&[], Some("b")).unwrap_err()), "transient");
}

#[test]
fn a_get_of_a_few_looks_each_up_and_of_more_lists_them_by_name() {
    let fake = Fake::new();
    let mut d = driver(&fake);
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(d.do_create(spec(&format!("n-{n}"))).expect("made").id);
    }
    fake.add("foreign", "n-9", &[("berth-pool", "other")], "ACTIVE");
    fake.sent.borrow_mut().clear();
    let got = d.do_get(&ids[..1]).expect("one");
    assert_eq!(got.len(), 1);
    assert_eq!(
        fake.requests(),
        [format!("GET /SERVERS/{}", ids[0].to_uppercase())]
    );
    // Three at once: one list by their names; one the list left out (it
    // lags) is looked up by id.
    fake.servers.borrow_mut()[2].listed_from = u64::MAX;
    fake.sent.borrow_mut().clear();
    let mut asked = ids.clone();
    asked.push("foreign".into());
    let got = d.do_get(&asked).expect("three");
    let mut got: Vec<String> = got.into_iter().map(|i| i.id).collect();
    got.sort();
    assert_eq!(got, ids);
    let requests = fake.requests();
    assert_eq!(requests.len(), 3, "{requests:?}");
    assert!(
        requests[0].starts_with("GET /SERVERS/DETAIL?NAME=%5E%28N%5C-0%7CN%5C-1%7CN%5C-2%29%24"),
        "{requests:?}"
    );
    assert_eq!(
        requests[1],
        format!("GET /SERVERS/{}", ids[2].to_uppercase())
    );
    assert_eq!(requests[2], "GET /SERVERS/FOREIGN");
}

#[test]
fn a_delete_touches_only_the_pools_servers() {
    let fake = Fake::new();
    let mut d = driver(&fake);
    let made = d.do_create(spec(NODE)).expect("made");
    fake.sent.borrow_mut().clear();
    d.do_delete(&made.id).expect("deleted");
    assert_eq!(
        fake.requests(),
        [format!("DELETE /SERVERS/{}", made.id.to_uppercase())]
    );
    assert!(
        fake.records.borrow().is_empty(),
        "{:?}",
        fake.records.borrow()
    );
    // Again: no record now, so it is looked at; being deleted, it is gone.
    let e = d.do_delete(&made.id).unwrap_err();
    assert_eq!(case(&e), "not-found");
    // Another pool's server is left alone, unasked.
    fake.add("foreign", "x", &[("berth-pool", "other")], "ACTIVE");
    fake.sent.borrow_mut().clear();
    assert_eq!(case(&d.do_delete("foreign").unwrap_err()), "not-found");
    assert_eq!(fake.requests(), ["GET /SERVERS/FOREIGN"]);
    assert!(
        !fake
            .servers
            .borrow()
            .iter()
            .any(|s| s.id == "foreign" && s.deleting)
    );
    assert_eq!(case(&d.do_delete("missing").unwrap_err()), "not-found");
    // One of the pool's made elsewhere (adopted): looked at, then deleted.
    fake.add(
        "adopted",
        "n-x",
        &[("berth-pool", "p1"), ("berth-node", "n-x")],
        "ACTIVE",
    );
    d.do_delete("adopted").expect("deleted");
    assert!(
        fake.servers
            .borrow()
            .iter()
            .any(|s| s.id == "adopted" && s.deleting)
    );
}

#[test]
fn set_tags_replaces_berths_metadata_once_the_server_is_built() {
    let fake = Fake::new();
    let mut d = driver(&fake);
    fake.add(
        "s",
        NODE,
        &[
            ("berth-pool", "p1"),
            ("berth-node", NODE),
            ("berth-idle", "run"),
            ("owner", "ops"),
        ],
        "BUILD",
    );
    let new = t(&[("berth-node", NODE), ("berth-request", "r-1")]);
    // Still building after build-wait (10 s): looked at again at 0.25,
    // 0.75, 1.75, 3.75 and 7.75 s and at 10 s, then given back to berth.
    let start = fake.now.get();
    assert_eq!(case(&d.do_set_tags("s", &new).unwrap_err()), "transient");
    assert_eq!(fake.now.get() - start, 10_000);
    assert_eq!(
        fake.requests(),
        ["GET /SERVERS/S"; 7],
        "no write while building"
    );
    fake.servers.borrow_mut()[0].status = "ACTIVE";
    fake.sent.borrow_mut().clear();
    d.do_set_tags("s", &new).expect("set");
    assert_eq!(
        fake.requests(),
        ["GET /SERVERS/S", "PUT /SERVERS/S/METADATA"]
    );
    let metadata = fake.servers.borrow()[0].metadata.clone();
    let want: BTreeMap<String, String> = t(&[
        ("berth-pool", "p1"),
        ("berth-node", NODE),
        ("berth-request", "r-1"),
        ("owner", "ops"),
    ])
    .into_iter()
    .collect();
    assert_eq!(metadata, want);
    // Nothing to change: no write.
    fake.sent.borrow_mut().clear();
    d.do_set_tags("s", &new).expect("set");
    assert_eq!(fake.requests(), ["GET /SERVERS/S"]);
    assert!(matches!(
        d.do_set_tags("s", &t(&[("berth-pool", "other")])),
        Err(Error::Permanent(_))
    ));
    fake.add("foreign", "x", &[("berth-pool", "other")], "ACTIVE");
    assert_eq!(
        case(&d.do_set_tags("foreign", &new).unwrap_err()),
        "not-found"
    );
    assert_eq!(
        case(&d.do_set_tags("missing", &new).unwrap_err()),
        "not-found"
    );
    fake.add("failed", NODE, &[("berth-pool", "p1")], "ERROR");
    assert_eq!(
        case(&d.do_set_tags("failed", &new).unwrap_err()),
        "permanent"
    );
}

#[test]
fn limits_read_novas_absolute_limits() {
    let fake = Fake::new();
    let mut d = driver(&fake);
    let l = d.do_limits().expect("limits");
    assert_eq!(l.max_instances, Some(10));
    assert_eq!(l.max_cores, None, "-1 is unlimited");
    assert_eq!(l.max_ram_mib, Some(51_200));
    assert_eq!(
        (l.used_instances, l.used_cores, l.used_ram_mib),
        (Some(2), Some(4), Some(4096))
    );
}

#[test]
fn next_links_give_their_marker() {
    assert_eq!(
        marker_of("http://h/v2.1/servers/detail?limit=2&marker=abc-1").as_deref(),
        Some("abc-1")
    );
    assert_eq!(
        marker_of("http://h/v2.1/servers/detail?marker=a%2Fb&x=1").as_deref(),
        Some("a/b")
    );
    assert_eq!(marker_of("http://h/v2.1/servers/detail?limit=2"), None);
    assert_eq!(percent_decode("a%zzb%4"), "a%zzb%4");
}
