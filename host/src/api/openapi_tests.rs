//! Keeps `openapi.json` true to the router in `api.rs` and the bodies in
//! `types.rs`: the routes are read out of the router's source, the schemas'
//! fields out of serialized values, so neither list is kept twice.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::types::*;
use super::{Idle, MAX_WAIT};

const DOC: &str = include_str!("openapi.json");
const API_RS: &str = include_str!("../api.rs");
const AUTH_RS: &str = include_str!("auth.rs");
const VIEWS_RS: &str = include_str!("views.rs");

const METHODS: [&str; 8] = [
    "get", "post", "put", "delete", "patch", "head", "options", "trace",
];

fn doc() -> Value {
    serde_json::from_str(DOC).expect("openapi.json is not valid JSON")
}

// ---- reading the router's source -----------------------------------------

/// One `(method, path)` the router serves and the handler serving it.
#[derive(Debug)]
struct Route {
    method: String,
    path: String,
    handler: String,
}

/// The index of the `)` closing the `(` at `s[0]`, skipping string literals.
fn closing_paren(s: &str) -> usize {
    assert!(s.starts_with('('), "expected `(` at {:?}", head(s));
    let mut depth = 0usize;
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => {
                while let Some((_, c)) = chars.next() {
                    match c {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
            }
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced parentheses at {:?}", head(s));
}

fn head(s: &str) -> &str {
    &s[..s.char_indices().nth(60).map_or(s.len(), |(i, _)| i)]
}

/// A string literal at the start of `s` (no escapes needed for paths) and
/// what follows it.
fn literal(s: &str) -> (&str, &str) {
    let s = s
        .strip_prefix('"')
        .unwrap_or_else(|| panic!("expected a string literal at {:?}", head(s)));
    let end = s.find('"').expect("unterminated string literal");
    (&s[..end], &s[end + 1..])
}

/// A path of identifiers (`get`, `axum::routing::get`) at the start of `s`.
fn ident_path(s: &str) -> (&str, &str) {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(s.len());
    (&s[..end], &s[end..])
}

/// The method-router expression of one `.route`, e.g.
/// `get(get_request).delete(cancel_request)`, as (method, handler) pairs.
fn method_chain(mut s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    loop {
        s = s.trim_start_matches(|c: char| c.is_whitespace() || c == '.' || c == ',');
        if s.is_empty() {
            return out;
        }
        let (name, rest) = ident_path(s);
        let method = name.rsplit("::").next().unwrap_or(name);
        assert!(
            METHODS.contains(&method),
            "`.route` with `{name}(…)`: openapi_tests only knows axum's per-method \
             routers ({METHODS:?}); teach it the new form"
        );
        let rest = rest.trim_start();
        let close = closing_paren(rest);
        let handler = rest[1..close].trim();
        assert!(
            !handler.is_empty()
                && handler
                    .chars()
                    .all(|c| c.is_alphanumeric() || c == '_' || c == ':'),
            "handler `{handler}` of `{method}` is not a plain function name"
        );
        out.push((method.to_owned(), handler.to_owned()));
        s = &rest[close + 1..];
    }
}

/// Every route `Api::router` defines, read from its source.
fn routes() -> Vec<Route> {
    let start = API_RS
        .find("fn router(")
        .expect("api.rs has no `fn router(`");
    let body = &API_RS[start..];
    let body = &body[..body
        .find(".with_state(")
        .expect("the router ends with `.with_state(`")];
    for unknown in [".nest", ".merge", ".route_service"] {
        assert!(
            !body.contains(unknown),
            "the router uses `{unknown}`; teach openapi_tests to read it"
        );
    }
    let mut out = Vec::new();
    let mut rest = body;
    while let Some(i) = rest.find(".route(") {
        rest = &rest[i + ".route".len()..];
        let close = closing_paren(rest);
        let (path, methods) = literal(rest[1..close].trim_start());
        let methods = methods
            .trim_start()
            .strip_prefix(',')
            .unwrap_or_else(|| panic!("`.route(\"{path}\"` has no method router"));
        for (method, handler) in method_chain(methods) {
            out.push(Route {
                method,
                path: path.to_owned(),
                handler,
            });
        }
        rest = &rest[close + 1..];
    }
    assert!(out.len() >= 5, "read too few routes from api.rs: {out:?}");
    out
}

/// The source of `async fn name(…) { … }` in api.rs.
fn handler_source(name: &str) -> &'static str {
    let start = API_RS
        .find(&format!("async fn {name}("))
        .unwrap_or_else(|| panic!("no `async fn {name}(` in api.rs"));
    let body = &API_RS[start..];
    &body[..body.find("\n}\n").map_or(body.len(), |i| i + 2)]
}

/// The parameter names passed to the first `no_other_params(…, &[…])` in `s`.
fn known_params(s: &str) -> Option<BTreeSet<String>> {
    let i = s.find("no_other_params(")?;
    let s = &s[i..];
    let open = s.find("&[").expect("no_other_params without a `&[…]` list");
    let close = open + s[open..].find(']').expect("unterminated list");
    let mut names = BTreeSet::new();
    let mut list = &s[open + 2..close];
    while let Some(q) = list.find('"') {
        let (name, rest) = literal(&list[q..]);
        names.insert(name.to_owned());
        list = rest;
    }
    Some(names)
}

/// The query parameters a handler accepts: its own `no_other_params` list,
/// or that of the `views::Filter::parse` it calls; none without `Query(`.
fn query_params_of(handler: &str) -> BTreeSet<String> {
    let src = handler_source(handler);
    if !src.contains("Query(") {
        return BTreeSet::new();
    }
    if let Some(names) = known_params(src) {
        return names;
    }
    let i = src.find("views::").unwrap_or_else(|| {
        panic!("{handler} takes a query but neither checks it nor calls a views filter")
    });
    let (filter, _) = ident_path(&src[i + "views::".len()..]);
    let filter = filter.split("::").next().unwrap();
    let imp = VIEWS_RS
        .find(&format!("impl {filter} {{"))
        .unwrap_or_else(|| panic!("no `impl {filter}` in views.rs"));
    known_params(&VIEWS_RS[imp..])
        .unwrap_or_else(|| panic!("{filter}::parse does not call no_other_params"))
}

/// The source of `impl Filter` in views.rs for the filter `handler` parses
/// its query with, or nothing.
fn filter_source(handler: &str) -> &'static str {
    let src = handler_source(handler);
    let Some(i) = src.find("views::") else {
        return "";
    };
    let (path, _) = ident_path(&src[i + "views::".len()..]);
    let Some(filter) = path.strip_suffix("::parse") else {
        return "";
    };
    let imp = VIEWS_RS
        .find(&format!("impl {filter} {{"))
        .unwrap_or_else(|| panic!("no `impl {filter}` in views.rs"));
    let body = &VIEWS_RS[imp..];
    &body[..body.find("\n}\n").map_or(body.len(), |i| i + 2)]
}

/// Codes given to `ApiError::new(StatusCode::…, "code", …)` in `src`.
fn error_codes(src: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = src;
    while let Some(i) = rest.find("ApiError::new(") {
        rest = &rest[i + "ApiError::new(".len()..];
        let s = rest.trim_start();
        let Some(s) = s.strip_prefix("StatusCode::") else {
            continue;
        };
        let (_, s) = ident_path(s);
        let Some(s) = s.trim_start().strip_prefix(',') else {
            continue;
        };
        let s = s.trim_start();
        if s.starts_with('"') {
            out.insert(literal(s).0.to_owned());
        }
    }
    out
}

// ---- reading the document --------------------------------------------------

/// Every (method, path) operation of the document.
fn operations(doc: &Value) -> BTreeMap<(String, String), &Value> {
    let mut out = BTreeMap::new();
    for (path, item) in doc["paths"].as_object().expect("paths is an object") {
        for (method, op) in item.as_object().expect("a path item is an object") {
            if METHODS.contains(&method.as_str()) {
                out.insert((method.clone(), path.clone()), op);
            }
        }
    }
    out
}

fn strings(v: &Value) -> BTreeSet<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|s| s.as_str().expect("a string").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn collect_refs<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                if k == "$ref" {
                    out.push(v.as_str().expect("$ref is a string"));
                } else {
                    collect_refs(v, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| collect_refs(v, out)),
        _ => {}
    }
}

// ---- (a) ---------------------------------------------------------------------

#[test]
fn the_document_is_openapi_3_1() {
    let doc = doc();
    let version = doc["openapi"].as_str().expect("`openapi` is a string");
    assert!(
        version.starts_with("3.1."),
        "openapi is {version}, not 3.1.x"
    );
    assert_eq!(doc["info"]["title"], "berth");
    assert_eq!(doc["info"]["version"], "0.1.0");
    assert_eq!(
        doc["components"]["securitySchemes"]["bearerAuth"]["scheme"],
        "bearer"
    );
}

// ---- (b) ---------------------------------------------------------------------

#[test]
fn the_route_scan_reads_chained_methods() {
    let chain = method_chain("get(get_request)\n    .delete(cancel_request),\n");
    assert_eq!(
        chain,
        [
            ("get".to_owned(), "get_request".to_owned()),
            ("delete".to_owned(), "cancel_request".to_owned()),
        ]
    );
    let r = routes();
    assert!(
        r.iter()
            .any(|r| r.method == "delete" && r.path == "/v1/requests/{id}"),
        "{r:?}"
    );
}

#[test]
fn the_document_has_exactly_the_routes_the_router_serves() {
    let doc = doc();
    let served: BTreeSet<(String, String)> =
        routes().into_iter().map(|r| (r.method, r.path)).collect();
    let documented: BTreeSet<(String, String)> = operations(&doc).into_keys().collect();
    let missing: Vec<_> = served.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&served).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "served but not documented: {missing:?}; documented but not served: {extra:?}"
    );
}

#[test]
fn each_operation_matches_its_handler() {
    let doc = doc();
    let ops = operations(&doc);
    for r in routes() {
        let op = ops[&(r.method.clone(), r.path.clone())];
        let what = format!("{} {} ({})", r.method.to_uppercase(), r.path, r.handler);
        assert_eq!(op["operationId"], r.handler.as_str(), "{what}: operationId");
        // The handler and the `views` filter it parses its query with.
        let src = format!(
            "{}{}",
            handler_source(&r.handler),
            filter_source(&r.handler)
        );
        let src = src.as_str();
        let statuses: BTreeSet<&str> = op["responses"]
            .as_object()
            .unwrap_or_else(|| panic!("{what}: no responses"))
            .keys()
            .map(String::as_str)
            .collect();

        // Who may call it.
        let authenticated = src.contains("api.caller(");
        let admin_only = ["Change::SetIdle", "Change::Delete"]
            .iter()
            .any(|c| src.contains(c));
        let roles = strings(&op["x-berth-roles"]);
        let security = &op["security"];
        if !authenticated {
            assert!(roles.is_empty(), "{what}: needs no token, roles {roles:?}");
            assert_eq!(security, &Value::Array(vec![]), "{what}: security");
        } else if admin_only {
            assert_eq!(roles, strings(&serde_json::json!(["admin"])), "{what}");
            assert_eq!(
                security[0]["bearerAuth"],
                serde_json::json!(["admin"]),
                "{what}"
            );
        } else {
            assert_eq!(
                roles,
                strings(&serde_json::json!(["admin", "client"])),
                "{what}"
            );
            assert_eq!(security[0]["bearerAuth"], serde_json::json!([]), "{what}");
        }

        // Statuses that the handler's own code can plainly produce.
        let expect = |status: &str, produced: bool| {
            assert_eq!(
                statuses.contains(status),
                produced,
                "{what}: status {status} {} documented",
                if produced { "is not" } else { "is wrongly" }
            );
        };
        expect("401", authenticated);
        expect("201", src.contains("StatusCode::CREATED"));
        expect("200", !src.contains("StatusCode::CREATED"));
        expect(
            "403",
            admin_only
                || src.contains("forbidden(")
                || src.contains("may_act_for")
                || src.contains("owned_request")
                || src.contains("Change::Release")
                || src.contains("Change::Submit")
                || src.contains("Change::Renew"),
        );
        expect(
            "409",
            [
                "Change::Cancel",
                "Change::Release",
                "Change::SetIdle",
                "Change::Delete",
            ]
            .iter()
            .any(|c| src.contains(c)),
        );
        expect("422", src.contains("UNPROCESSABLE_ENTITY"));
        if src.contains("refuse_if_stopping")
            || src.contains(".await?")
            || src.contains("stopping()")
        {
            expect("503", true);
        }
        if ["not_found(", "node_change(", "node_by_id", "owned_request"]
            .iter()
            .any(|c| src.contains(c))
        {
            expect("404", true);
        }
        if [
            "self::body(&body)",
            "_id(&id)",
            "no_other_params",
            "::parse(&q",
        ]
        .iter()
        .any(|c| src.contains(c))
        {
            expect("400", true);
        }

        // Parameters.
        let params: Vec<&Value> = op["parameters"]
            .as_array()
            .map(|a| a.iter().collect())
            .unwrap_or_default();
        let named = |place: &str| -> BTreeSet<String> {
            params
                .iter()
                .filter(|p| p["in"] == place)
                .map(|p| p["name"].as_str().unwrap().to_owned())
                .collect()
        };
        let in_path: BTreeSet<String> = r
            .path
            .split('/')
            .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(str::to_owned)
            .collect();
        assert_eq!(named("path"), in_path, "{what}: path parameters");
        for p in params.iter().filter(|p| p["in"] == "path") {
            assert_eq!(p["required"], true, "{what}: path parameters are required");
        }
        assert_eq!(
            named("query"),
            query_params_of(&r.handler),
            "{what}: query parameters"
        );
        let has_body = src.contains("self::body(&body)");
        assert_eq!(
            op.get("requestBody").is_some(),
            has_body,
            "{what}: request body"
        );
    }
}

#[test]
fn documented_values_are_the_ones_the_code_accepts() {
    let doc = doc();
    let ops = operations(&doc);
    let param = |method: &str, path: &str, name: &str| -> Value {
        ops[&(method.to_owned(), path.to_owned())]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("{method} {path} has no parameter {name}"))["schema"]
            .clone()
    };
    // Node states: views.rs's NODE_STATES, the filter and the schema.
    let i = VIEWS_RS
        .find("const NODE_STATES")
        .expect("views.rs NODE_STATES");
    let list = &VIEWS_RS[i..];
    let list = &list[list.find("= [").unwrap() + 3..list.find("];").unwrap()];
    let node_states: Vec<Value> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| Value::from(literal(s).0))
        .collect();
    assert_eq!(
        param("get", "/v1/nodes", "state")["enum"],
        Value::from(node_states.clone())
    );
    let schemas = &doc["components"]["schemas"];
    assert_eq!(
        schemas["Node"]["properties"]["state"]["enum"],
        Value::from(node_states)
    );
    // Idle values all parse.
    for schema in [
        &schemas["Node"]["properties"]["idle"],
        &schemas["SetIdle"]["properties"]["idle"],
    ] {
        for v in schema["enum"].as_array().expect("idle enum") {
            let v = v.as_str().unwrap();
            assert_eq!(Idle::parse(v).map(Idle::as_str), Some(v), "idle `{v}`");
        }
    }
    // Request states: the filter and the schema agree.
    assert_eq!(
        param("get", "/v1/requests", "state")["enum"],
        schemas["Request"]["properties"]["state"]["enum"]
    );
    // The wait cap.
    let wait = ops[&("get".to_owned(), "/v1/requests/{id}".to_owned())]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "wait")
        .expect("wait parameter")["description"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        wait.contains(&format!("{} s", MAX_WAIT.as_secs())),
        "the wait description does not give the cap of {MAX_WAIT:?}: {wait}"
    );
    // Error codes: exactly those the code gives.
    let mut codes = error_codes(API_RS);
    codes.extend(error_codes(AUTH_RS));
    codes.extend(error_codes(VIEWS_RS));
    assert!(
        codes.contains("not_ready") && codes.contains("unauthorized"),
        "{codes:?}"
    );
    assert_eq!(
        strings(&schemas["ErrorDetail"]["properties"]["code"]["enum"]),
        codes,
        "ErrorDetail.code"
    );
}

// ---- (c) ---------------------------------------------------------------------

#[test]
fn every_ref_resolves_and_every_schema_is_used() {
    let doc = doc();
    let schemas = doc["components"]["schemas"]
        .as_object()
        .expect("components.schemas");
    let mut refs = Vec::new();
    collect_refs(&doc, &mut refs);
    assert!(!refs.is_empty(), "no $ref at all");
    let mut used = BTreeSet::new();
    for r in refs {
        let name = r
            .strip_prefix("#/components/schemas/")
            .unwrap_or_else(|| panic!("$ref {r} is not to components.schemas"));
        assert!(schemas.contains_key(name), "$ref {r} names no schema");
        used.insert(name);
    }
    let unused: Vec<&String> = schemas
        .keys()
        .filter(|k| !used.contains(k.as_str()))
        .collect();
    assert!(unused.is_empty(), "schemas nothing refers to: {unused:?}");
}

// ---- (d) ---------------------------------------------------------------------

fn s(text: &str) -> String {
    text.to_owned()
}

const AT: &str = "2026-11-23T11:04:05.123Z";

fn full_node() -> Node {
    Node {
        id: s("n-00000000000000a1"),
        label: s("small"),
        provider: s("sim"),
        state: s("in-use"),
        reason: Some(s("admin")),
        idle: s("run"),
        instance_type: s("s1"),
        instance: Some(s("i-1")),
        request: Some(s("r-000000000000002c")),
        requestor: Some(s("ci")),
        since: s(AT),
        created: s(AT),
        slot: Some(Slot {
            backing: s("n-00000000000000a0"),
            index: 1,
        }),
        hosting: Some(Hosting {
            label: s("shared"),
            used: 2,
            slots: 4,
        }),
        missing: Some(MissingInstance {
            since: s(AT),
            state: s("suspected"),
        }),
        addresses: Some(full_addresses()),
        connection: Some(full_connection()),
    }
}

fn full_addresses() -> Addresses {
    Addresses {
        public_ipv4: Some(s("203.0.113.1")),
        private_ipv4: Some(s("10.0.0.1")),
        ipv6: Some(s("2001:db8::1")),
        hostname: Some(s("node-1")),
    }
}

fn full_connection() -> Connection {
    Connection {
        username: Some(s("berth")),
        port: Some(22),
        host_keys: vec![s("ssh-ed25519 AAAA")],
    }
}

fn full_request() -> Request {
    Request {
        id: s("r-000000000000002c"),
        requestor: s("ci"),
        priority: 0,
        state: s("failed"),
        reason: Some(s("no capacity")),
        labels: BTreeMap::from([(s("small"), 2)]),
        created: s(AT),
        finished: Some(s(AT)),
        nodes: vec![full_node()],
    }
}

fn full_offer() -> Offer {
    Offer {
        provider: s("sim"),
        instance_type: s("s1"),
        vcpus: 2,
        ram_mib: 4096,
        price: 0.5,
    }
}

fn full_label() -> Label {
    Label {
        name: s("small"),
        kind: s("slots"),
        min_ready: 1,
        ready: 1,
        nodes: BTreeMap::from([(s("ready"), 1)]),
        slots: Some(4),
        backing_label: Some(s("big")),
        offers: vec![full_offer()],
    }
}

fn full_limits() -> Limits {
    Limits {
        max_instances: Some(10),
        max_cores: Some(40),
        max_ram_mib: Some(65536),
    }
}

fn full_usage() -> Usage {
    Usage {
        instances: 1,
        vcpus: 2,
        ram_mib: 4096,
    }
}

fn full_call_error() -> CallError {
    CallError {
        at: s(AT),
        call: s("create"),
        error: s("quota exceeded"),
    }
}

fn full_call_stats() -> CallStats {
    CallStats {
        recent: 10,
        errors: 1,
        p50_ms: Some(1.5),
        p99_ms: Some(9.5),
        last_errors: vec![full_call_error()],
    }
}

fn full_provider() -> Provider {
    Provider {
        name: s("sim"),
        driver: s("sim.wasm"),
        priority: 0,
        status: s("ok"),
        limits: full_limits(),
        usage: full_usage(),
        listed: true,
        quota_paused_until: Some(s(AT)),
        rate_limited_until: Some(s(AT)),
        capacity_paused: BTreeMap::from([(s("*"), s(AT))]),
        leaks_pending: 0,
        leaks_deleted: 0,
        calls: full_call_stats(),
        start_error: Some(s("loading its driver: describe failed")),
        list_error: Some(s("lists fail since 2026-11-23T11:04:05.123Z: transient")),
        last_listed: Some(s(AT)),
        missing: 1,
    }
}

fn full_driver() -> Driver {
    Driver {
        file: s("sim"),
        path: s("/drivers/sim.wasm"),
        name: s("sim"),
        version: s("0.1.0"),
        sha256: s("00"),
        loaded_from: s("cache"),
        load_ms: 1.25,
        providers: vec![s("sim")],
    }
}

fn full_lease() -> Lease {
    Lease {
        requestor: s("ci"),
        expires: s(AT),
        ttl_seconds: 600,
    }
}

fn full_error_detail() -> ErrorDetail {
    ErrorDetail {
        code: s("bad_request"),
        message: s("labels: missing"),
        field: Some(s("labels")),
    }
}

fn full_error() -> ErrorBody {
    ErrorBody {
        error: full_error_detail(),
    }
}

fn full_new_request() -> NewRequest {
    NewRequest {
        labels: BTreeMap::from([(s("small"), 2)]),
        requestor: Some(s("ci")),
        priority: 1,
    }
}

fn full_set_idle() -> SetIdle {
    SetIdle { idle: s("hold") }
}

/// Whether `v` is of the kind `schema` says (following one `$ref`), and
/// among its `enum` if it has one.
fn fits(schema: &Value, v: &Value) -> bool {
    if let Some(r) = schema.get("$ref") {
        return r.as_str().is_some() && v.is_object();
    }
    if let Some(values) = schema.get("enum").and_then(Value::as_array)
        && !values.contains(v)
    {
        return false;
    }
    match schema["type"].as_str() {
        Some("string") => v.is_string(),
        Some("integer") => v.is_i64() || v.is_u64(),
        Some("number") => v.is_number(),
        Some("boolean") => v.is_boolean(),
        Some("array") => v.is_array(),
        Some("object") => v.is_object(),
        other => panic!("property schema without a known type: {other:?} in {schema}"),
    }
}

/// `components.schemas[name]` has exactly the fields `full` serializes to,
/// each of a fitting kind, and requires exactly those serde cannot do
/// without.
fn check_schema<T: Serialize + DeserializeOwned>(schemas: &Value, name: &str, full: &T) {
    let value = serde_json::to_value(full).unwrap();
    let fields = value.as_object().expect("a struct serializes to an object");
    serde_json::from_value::<T>(value.clone())
        .unwrap_or_else(|e| panic!("{name} does not read back: {e}"));
    let schema = &schemas[name];
    assert_eq!(schema["type"], "object", "{name}: type");
    let props = schema["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("{name}: no properties in openapi.json"));
    let documented: BTreeSet<&str> = props.keys().map(String::as_str).collect();
    let serialized: BTreeSet<&str> = fields.keys().map(String::as_str).collect();
    assert_eq!(
        documented, serialized,
        "{name}: properties in openapi.json vs fields of types::{name}"
    );
    let mut required = BTreeSet::new();
    for (field, v) in fields {
        assert!(
            fits(&props[field], v),
            "{name}.{field}: {v} does not fit {}",
            props[field]
        );
        let mut without = fields.clone();
        without.remove(field);
        if serde_json::from_value::<T>(Value::Object(without)).is_err() {
            required.insert(field.clone());
        }
    }
    assert_eq!(
        strings(&schema["required"]),
        required,
        "{name}: required in openapi.json vs fields serde needs"
    );
}

#[test]
fn schemas_mirror_the_types() {
    let doc = doc();
    let schemas = &doc["components"]["schemas"];
    let mut checked = BTreeSet::new();
    let mut check = |name: &'static str, f: &dyn Fn(&Value, &str)| {
        f(schemas, name);
        checked.insert(name);
    };
    check("Request", &|d, n| check_schema(d, n, &full_request()));
    check("Node", &|d, n| check_schema(d, n, &full_node()));
    check("Slot", &|d, n| {
        check_schema(d, n, &full_node().slot.unwrap())
    });
    check("Hosting", &|d, n| {
        check_schema(d, n, &full_node().hosting.unwrap())
    });
    check("MissingInstance", &|d, n| {
        check_schema(d, n, &full_node().missing.unwrap())
    });
    check("Addresses", &|d, n| check_schema(d, n, &full_addresses()));
    check("Connection", &|d, n| check_schema(d, n, &full_connection()));
    check("Label", &|d, n| check_schema(d, n, &full_label()));
    check("Offer", &|d, n| check_schema(d, n, &full_offer()));
    check("Provider", &|d, n| check_schema(d, n, &full_provider()));
    check("Limits", &|d, n| check_schema(d, n, &full_limits()));
    check("Usage", &|d, n| check_schema(d, n, &full_usage()));
    check("CallStats", &|d, n| check_schema(d, n, &full_call_stats()));
    check("CallError", &|d, n| check_schema(d, n, &full_call_error()));
    check("Driver", &|d, n| check_schema(d, n, &full_driver()));
    check("Lease", &|d, n| check_schema(d, n, &full_lease()));
    check("ErrorBody", &|d, n| check_schema(d, n, &full_error()));
    check("ErrorDetail", &|d, n| {
        check_schema(d, n, &full_error_detail())
    });
    check("NewRequest", &|d, n| {
        check_schema(d, n, &full_new_request())
    });
    check("SetIdle", &|d, n| check_schema(d, n, &full_set_idle()));
    let documented: BTreeSet<&str> = schemas
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        documented, checked,
        "schemas without a check against types.rs"
    );
}

#[test]
fn the_schema_check_can_fail() {
    let doc = doc();
    let mut schemas = doc["components"]["schemas"].clone();
    schemas["Lease"]["properties"]
        .as_object_mut()
        .unwrap()
        .remove("ttl_seconds");
    let r = std::panic::catch_unwind(|| check_schema(&schemas, "Lease", &full_lease()));
    assert!(r.is_err(), "a missing property went unnoticed");
    let mut schemas = doc["components"]["schemas"].clone();
    schemas["Node"]["required"] = serde_json::json!(["id"]);
    let r = std::panic::catch_unwind(|| check_schema(&schemas, "Node", &full_node()));
    assert!(r.is_err(), "a wrong required list went unnoticed");
}
