// berth's page: the API under /v1, followed live through GET /v1/events.
// Everything from the API is set as text (never as HTML): node, request and
// provider fields come from drivers, clouds and clients.
"use strict";

const $ = (id) => document.getElementById(id);
const state = {
  session: null,
  labels: [],
  nodes: new Map(),
  requests: new Map(),
  providers: [],
  drivers: [],
  prices: new Map(),
  events: null,
};

// ---- the API ---------------------------------------------------------------

class Refused extends Error {
  constructor(status, body) {
    super(body && body.error ? body.error.message : `HTTP ${status}`);
    this.status = status;
    this.code = body && body.error ? body.error.code : "";
  }
}

async function api(method, path, body) {
  const headers = {};
  if (body !== undefined) headers["content-type"] = "application/json";
  if (method !== "GET" && state.session && state.session.csrf) {
    headers["x-berth-csrf"] = state.session.csrf;
  }
  const r = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "same-origin",
  });
  const text = await r.text();
  let parsed = null;
  try { parsed = text ? JSON.parse(text) : null; } catch (_) { parsed = null; }
  if (!r.ok) throw new Refused(r.status, parsed);
  return parsed;
}

// ---- small helpers ---------------------------------------------------------

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "data") for (const [d, dv] of Object.entries(v)) e.dataset[d] = dv;
    // Through the CSSOM: the page's policy allows no inline style.
    else if (k === "style") Object.assign(e.style, v);
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

function age(rfc3339) {
  if (!rfc3339) return "";
  const s = Math.max(0, (Date.now() - Date.parse(rfc3339)) / 1000);
  if (s < 90) return `${Math.round(s)}s`;
  if (s < 5400) return `${Math.round(s / 60)}m`;
  if (s < 172800) return `${Math.round(s / 3600)}h`;
  return `${Math.round(s / 86400)}d`;
}

function until(rfc3339) {
  if (!rfc3339) return "";
  const s = Math.max(0, (Date.parse(rfc3339) - Date.now()) / 1000);
  return `for ${Math.ceil(s)}s more`;
}

function mib(n) {
  return n >= 1024 ? `${(n / 1024).toFixed(n % 1024 ? 1 : 0)} GiB` : `${n} MiB`;
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

const timers = new Map();
// Runs `f` once, `ms` after the first of several calls for `key` (not after
// the last: a steady stream of changes must not put it off for ever).
function soon(key, ms, f) {
  if (timers.has(key)) return;
  timers.set(key, setTimeout(() => { timers.delete(key); f(); }, ms));
}

function notice(text) {
  const n = $("notice");
  n.textContent = text || "";
  n.hidden = !text;
}

// ---- labels ----------------------------------------------------------------

const BOOTING = ["creating", "booting"];

function renderLabels() {
  const rows = state.labels.map((l) => {
    const n = l.nodes || {};
    const count = (s) => n[s] || 0;
    const ready = l.ready;
    // In use, or ready and set aside for a request that waits for others.
    const inUse = count("in-use") + Math.max(0, count("ready") - ready);
    const booting = BOOTING.reduce((a, s) => a + count(s), 0);
    const deleting = count("deleting") + count("used");
    const missing = Math.max(0, l.min_ready - ready - booting);
    const total = Math.max(1, ready + inUse + booting + deleting + missing, l.min_ready);
    const seg = (cls, k) => el("span", { class: cls, style: { width: `${(100 * k) / total}%` }, title: `${cls} ${k}` });
    const bar = el("div", { class: "bar", title: `min-ready ${l.min_ready}` },
      seg("ready", ready), seg("in-use", inUse), seg("booting", booting),
      seg("deleting", deleting), seg("missing", missing));
    if (l.min_ready > 0) bar.append(el("span", { class: "min", style: { left: `${(100 * l.min_ready) / total}%` } }));
    const ttr = l.time_to_ready
      ? `${l.time_to_ready.p50_s.toFixed(1)}s / ${l.time_to_ready.p95_s.toFixed(1)}s (${l.time_to_ready.nodes})`
      : "–";
    const kind = l.kind === "slots" ? ` (${l.slots} slots on ${l.backing_label})` : "";
    return el("tr", { data: { label: l.name } },
      el("td", {}, l.name, kind, l.removed ? " (removed)" : ""),
      el("td", {}, bar),
      el("td", { class: "num" }, `${ready} / ${l.min_ready}`),
      el("td", { class: "num" }, inUse),
      el("td", { class: "num" }, booting),
      el("td", { class: "num" }, deleting),
      el("td", { class: "num" }, missing),
      el("td", { class: "num" }, ttr));
  });
  fill($("labels").tBodies[0], rows);
  state.prices = new Map();
  for (const l of state.labels) {
    for (const o of l.offers || []) state.prices.set(`${o.provider}/${o.instance_type}`, o.price);
  }
}

async function loadLabels() {
  state.labels = await api("GET", "/v1/labels");
  renderLabels();
}

// ---- nodes -----------------------------------------------------------------

function address(n) {
  const a = n.addresses;
  if (!a) return "";
  return a.public_ipv4 || a.private_ipv4 || a.ipv6 || a.hostname || "";
}

async function act(button, method, path, body) {
  button.disabled = true;
  try {
    const node = await api(method, path, body);
    notice("");
    if (node && node.id) putNode(node);
  } catch (e) {
    notice(`${button.textContent}: ${e.message}`);
  } finally {
    button.disabled = false;
  }
}

function actions(n) {
  const id = encodeURIComponent(n.id);
  const idle = (to, label) => el("button", {
    type: "button", data: { action: to },
    onclick: (ev) => act(ev.target, "PUT", `/v1/nodes/${id}/idle`, { idle: to }),
  }, label);
  const td = el("td", { class: "admin" });
  if (n.state === "gone" || n.state === "deleting") return td;
  if (n.idle !== "hold") td.append(idle("hold", "Hold"));
  if (n.idle !== "drain") td.append(idle("drain", "Drain"));
  if (n.idle !== "run") td.append(idle("run", "Run"));
  td.append(el("button", {
    type: "button", data: { action: "delete" },
    onclick: (ev) => act(ev.target, "DELETE", `/v1/nodes/${id}`),
  }, "Delete"));
  return td;
}

function nodeRow(n) {
  const price = state.prices.get(`${n.provider}/${n.instance_type}`);
  return el("tr", { data: { node: n.id, state: n.state, idle: n.idle } },
    el("td", { class: "id" }, n.id),
    el("td", {}, n.label),
    el("td", {}, n.provider),
    el("td", {}, el("span", { class: `state ${n.state}` }, n.state)),
    el("td", {}, n.idle),
    el("td", { class: "num" }, age(n.created)),
    el("td", {}, n.requestor || ""),
    el("td", { class: "num" }, price === undefined ? "" : price.toFixed(3)),
    el("td", { class: "id" }, address(n)),
    actions(n));
}

function renderNodes() {
  const live = [...state.nodes.values()].filter((n) => n.state !== "gone");
  live.sort((a, b) => (a.label + a.id).localeCompare(b.label + b.id));
  fill($("nodes").tBodies[0], live.map(nodeRow));
}

function putNode(n) {
  if (n.state === "gone") state.nodes.delete(n.id);
  else state.nodes.set(n.id, n);
  soon("nodes", 30, renderNodes);
}

async function loadNodes() {
  const all = await api("GET", "/v1/nodes");
  state.nodes = new Map(all.map((n) => [n.id, n]));
  renderNodes();
}

// A node event: shown at once from the event itself, then read whole.
function nodeChanged(e) {
  const known = state.nodes.get(e.id);
  putNode(Object.assign({}, known || { created: new Date().toISOString() }, e));
  soon(`node:${e.id}`, 150, async () => {
    try {
      putNode(await api("GET", `/v1/nodes/${encodeURIComponent(e.id)}`));
    } catch (err) {
      if (err.status === 404) { state.nodes.delete(e.id); soon("nodes", 30, renderNodes); }
    }
  });
  soon("labels", 200, () => loadLabels().catch(() => {}));
  soon("providers", 300, () => loadProviders().catch(() => {}));
  if (e.request) soon("requests", 30, renderRequests);
}

// ---- requests --------------------------------------------------------------

function waits(r) {
  const td = el("td");
  for (const w of r.waiting || []) {
    const where = w.provider ? ` on ${w.provider}` : "";
    td.append(el("span", { class: "wait", data: { reason: w.reason } },
      el("b", {}, w.reason), ` ${w.label} ×${w.nodes}${where}: ${w.detail}`));
  }
  if (r.state === "failed" && r.reason) td.append(el("span", { class: "wait error" }, r.reason));
  return td;
}

function requestRow(r) {
  const nodes = el("td");
  for (const n of r.nodes || []) {
    // As the node's own events last said, if they came after the request's.
    const now = (state.nodes.get(n.id) || n).state;
    nodes.append(el("span", { class: "wait" }, el("span", { class: "id" }, n.id), ` ${n.label} `,
      el("span", { class: `state ${now}` }, now)));
  }
  const asked = Object.entries(r.labels || {}).map(([l, k]) => `${l}=${k}`).join(" ");
  return el("tr", { data: { request: r.id, state: r.state } },
    el("td", { class: "id" }, r.id, el("br"), asked),
    el("td", {}, r.requestor),
    el("td", {}, el("span", { class: `state ${r.state}` }, r.state)),
    el("td", { class: "num" }, age(r.created)),
    nodes,
    waits(r));
}

function renderRequests() {
  const shown = [...state.requests.values()];
  shown.sort((a, b) => (a.state === "pending" ? 0 : 1) - (b.state === "pending" ? 0 : 1)
    || Date.parse(b.created) - Date.parse(a.created));
  fill($("requests").tBodies[0], shown.slice(0, 200).map(requestRow));
}

async function loadRequests() {
  const all = await api("GET", "/v1/requests");
  state.requests = new Map(all.map((r) => [r.id, r]));
  renderRequests();
}

async function loadRequest(id) {
  try {
    state.requests.set(id, await api("GET", `/v1/requests/${encodeURIComponent(id)}`));
  } catch (err) {
    if (err.status === 404) state.requests.delete(id);
  }
  soon("requests", 30, renderRequests);
}

// ---- providers and drivers -------------------------------------------------

function renderProviders() {
  const rows = state.providers.map((p) => {
    const lim = p.limits || {};
    const of = (used, max, f) => (max === null || max === undefined ? f(used) : `${f(used)} / ${f(max)}`);
    const paused = [];
    if (p.quota_paused_until) paused.push(`quota ${until(p.quota_paused_until)}`);
    if (p.rate_limited_until) paused.push(`rate limit ${until(p.rate_limited_until)}`);
    for (const [type, t] of Object.entries(p.capacity_paused || {})) paused.push(`capacity of ${type} ${until(t)}`);
    const lists = p.list_error ? p.list_error : p.last_listed ? `listed ${age(p.last_listed)} ago` : "not listed yet";
    const c = p.calls || {};
    const ms = (v) => (v === null || v === undefined ? "–" : `${Math.round(v)} ms`);
    const errors = (c.last_errors || []).map((e) => `${e.call}: ${e.error}`).join("; ");
    return el("tr", { data: { provider: p.name, status: p.status } },
      el("td", {}, p.name),
      el("td", {}, el("span", { class: `state ${p.status}` }, p.status), p.start_error ? ` ${p.start_error}` : ""),
      el("td", { class: "num" }, of(p.usage.instances, lim.max_instances, String)),
      el("td", { class: "num" }, of(p.usage.vcpus, lim.max_cores, String)),
      el("td", { class: "num" }, of(p.usage.ram_mib, lim.max_ram_mib, mib)),
      el("td", {}, paused.join("; ")),
      el("td", {}, lists),
      el("td", { class: "num" }, `${ms(c.p50_ms)} / ${ms(c.p99_ms)}`),
      el("td", {}, `${c.errors || 0} of ${c.recent || 0}`, errors ? el("br") : null, errors));
  });
  fill($("providers").tBodies[0], rows);
}

async function loadProviders() {
  state.providers = await api("GET", "/v1/providers");
  renderProviders();
}

function renderDrivers() {
  const rows = state.drivers.map((d) => el("tr", { data: { driver: d.file } },
    el("td", {}, d.name, " ", el("span", { class: "id" }, d.file)),
    el("td", {}, (d.providers || []).join(", ")),
    el("td", {}, d.version),
    el("td", {}, d.contract),
    el("td", { class: "id", title: d.sha256 }, (d.sha256 || "").slice(0, 16)),
    el("td", { class: d.reload_error ? "error" : "" }, d.reload_error ? d.reload_error.error : "")));
  fill($("drivers").tBodies[0], rows);
}

async function loadDrivers() {
  state.drivers = await api("GET", "/v1/drivers");
  renderDrivers();
}

// ---- the event stream ------------------------------------------------------

function tail(kind, data) {
  const text = kind === "node" ? `${data.id} ${data.label} ${data.state}${data.requestor ? " " + data.requestor : ""}`
    : kind === "request" ? `${data.id} ${data.requestor} ${data.state}${data.reason ? ": " + data.reason : ""}`
    : kind === "provider" ? `${data.provider} list ${data.list}${data.quota_paused_until ? " quota-paused" : ""}`
    : kind === "driver" ? `${data.provider} ${data.state}${data.error ? ": " + data.error : ""}`
    : kind;
  const list = $("events");
  list.prepend(el("li", { data: { kind } }, el("span", { class: "kind" }, kind),
    new Date().toLocaleTimeString(), " ", text));
  while (list.children.length > 200) list.lastChild.remove();
}

function link(s, text) {
  const l = $("link");
  l.dataset.state = s;
  l.textContent = text;
}

function follow() {
  if (state.events) state.events.close();
  const es = new EventSource("/v1/events");
  state.events = es;
  es.onopen = () => link("live", "live");
  es.onerror = () => {
    link("reconnecting", "reconnecting…");
    // The browser tries again by itself after a network error; after an
    // answer that is not a stream (berth stopping, busy, or signed out) it
    // gives up, and this tries again.
    if (es.readyState === EventSource.CLOSED && state.events === es) {
      setTimeout(() => { if (state.events === es) start(); }, 1000);
    }
  };
  const on = (kind, f) => es.addEventListener(kind, (m) => {
    let data = {};
    try { data = JSON.parse(m.data); } catch (_) { return; }
    tail(kind, data);
    f(data);
  });
  on("node", nodeChanged);
  on("request", (r) => {
    loadRequest(r.id);
    for (const id of r.nodes || []) if (state.nodes.has(id)) soon(`node:${id}`, 150, () => api("GET", `/v1/nodes/${encodeURIComponent(id)}`).then(putNode, () => {}));
  });
  on("provider", () => {
    soon("providers", 100, () => loadProviders().catch(() => {}));
    soon("pending", 200, refreshPending);
  });
  on("driver", () => {
    soon("drivers", 100, () => loadDrivers().catch(() => {}));
    soon("providers", 100, () => loadProviders().catch(() => {}));
  });
  es.addEventListener("reset", () => { tail("reset", {}); loadAll(); });
}

// What a pending request waits for changes with time and the clouds, not
// only with its own events: read again every few seconds.
function refreshPending() {
  for (const r of state.requests.values()) if (r.state === "pending") loadRequest(r.id);
}

// ---- signing in ------------------------------------------------------------

async function loadAll() {
  try {
    await loadLabels();
    await Promise.all([loadNodes(), loadRequests(), loadProviders(), loadDrivers()]);
    notice("");
  } catch (e) {
    if (e.status === 401) return signIn();
    notice(`berth: ${e.message}`);
  }
}

function signIn() {
  if (state.events) { state.events.close(); state.events = null; }
  state.session = null;
  $("board").hidden = true;
  $("signin").hidden = false;
  $("logout").hidden = true;
  $("who").textContent = "";
  link("connecting", "signed out");
  $("token").focus();
}

async function start() {
  let session;
  try {
    session = await api("GET", "/ui/session");
  } catch (e) {
    link("reconnecting", "reconnecting…");
    setTimeout(start, 1000);
    return;
  }
  if (!session.signed_in) return signIn();
  state.session = session;
  document.body.classList.toggle("admin", session.role === "admin");
  $("who").textContent = session.open ? "open (no tokens configured)" : `${session.name} (${session.role})`;
  $("logout").hidden = session.open;
  $("signin").hidden = true;
  $("board").hidden = false;
  follow();
  await loadAll();
}

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    $("login-error").textContent = "";
    try {
      await api("POST", "/ui/login", { token: $("token").value });
      $("token").value = "";
      await start();
    } catch (e) {
      $("login-error").textContent = e.message;
    }
  });
  $("logout").addEventListener("click", async () => {
    await api("POST", "/ui/logout").catch(() => {});
    signIn();
  });
  setInterval(() => {
    if (!state.session) return;
    refreshPending();
    // A client's stream carries its own requests and nodes only, while the
    // API shows it every node: the rest is read again every few seconds.
    if (state.session.role !== "admin") {
      loadLabels().then(loadNodes).catch(() => {});
    }
  }, 5000);
  start();
});
