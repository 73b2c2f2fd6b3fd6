// A fake host for unit tests under node (`node --test`), outside any
// component: an HTTP transport that answers from recorded responses and
// keeps every request and log record, and answers `auth.info`, so a
// driver's modules, `send` and all, run unchanged.
//
//   import { installFakeHost } from 'berth-driver-sdk/testing';
//
//   test('create posts the pool tag', (t) => {
//     const fake = installFakeHost(t); // uninstalled when the test ends
//     fake.route('POST', 'http://sim/v1/instances', { status: 201, body: { id: 'i-1' } });
//     driver.create(spec);
//     assert.equal(fake.requests[0].json().tags['berth-pool'], 'p1');
//   });
//
// Only for node: inside a component, requests go over wasi:http and this
// module cannot be bundled (`#host` there has no `setHost`).

import { setHost } from '#host';

import { error, isDriverError } from './errors.js';

const encoder = new TextEncoder();

/** One request `send` made, as the fake host saw it. */
class RecordedRequest {
  constructor({ method, url, headers, body }) {
    /** The method as the driver gave it (`'GET'`, …). */
    this.method = method;
    /** The whole URL. */
    this.url = url;
    /** `[lowercase name, value]` pairs, as they would be sent. */
    this.headers = headers;
    /** The body's bytes. */
    this.body = body;
    /** The body as UTF-8 text. */
    this.text = new TextDecoder().decode(body);
  }

  /** The first value of header `name`, or `null`. */
  header(name) {
    const wanted = name.toLowerCase();
    return this.headers.find(([k]) => k === wanted)?.[1] ?? null;
  }

  /** The body parsed as JSON. */
  json() {
    return JSON.parse(this.text);
  }
}

/** The host's `{status, headers, body}` for a route's response. */
function answer(spec, req) {
  const got = typeof spec === 'function' ? spec(req) : spec;
  if (got?.failure !== undefined) {
    // As the wasi:http host reports a request that got no response.
    throw error.transient(`request failed: ${got.failure}`);
  }
  const status = got?.status ?? 200;
  const headers = (Array.isArray(got?.headers) ? got.headers : Object.entries(got?.headers ?? {}))
    .map(([k, v]) => [String(k).toLowerCase(), String(v)]);
  let body = got?.body;
  if (body === undefined || body === null) {
    body = new Uint8Array(0);
  } else if (typeof body === 'string') {
    body = encoder.encode(body);
  } else if (!(body instanceof Uint8Array)) {
    body = encoder.encode(JSON.stringify(body));
    if (!headers.some(([k]) => k === 'content-type')) {
      headers.push(['content-type', 'application/json']);
    }
  }
  return { status, headers, body };
}

/**
 * A fake host: routes, the requests it received, the log records written,
 * and the answers of `auth.info`. Make one with `installFakeHost`.
 */
export class FakeHost {
  constructor() {
    /** Every request, in order, as `RecordedRequest`s (`method`, `url`, `headers`, `body`, `text`, `json()`, `header(name)`). */
    this.requests = [];
    /** Every log record, in order: `{level, message, fields}`. */
    this.logs = [];
    /** Every host `auth.info` asked about, in order. */
    this.authAsked = [];
    this.routes = [];
    this.auths = new Map();
    this.previous = undefined;
    this.installed = false;
  }

  /**
   * Answers requests with `method` (any case) to `url` (the whole URL as
   * sent, or a `RegExp` tested against it) with `responses`, in order; the
   * last one keeps answering. Calling it again for the same method and URL
   * adds to that route's responses. Each response is
   * `{status = 200, headers = {}, body}` (a string or `Uint8Array` as it is;
   * any other value as JSON), `{failure: 'ConnectionRefused'}` for a request
   * that gets no response (it throws `transient`, as in a component), or a
   * function of the `RecordedRequest` returning one of those. Returns this
   * host, for chaining.
   */
  route(method, url, ...responses) {
    if (responses.length === 0) throw new TypeError('route: no response given');
    const m = method.toUpperCase();
    const same = (r) => r.method === m && String(r.url) === String(url) && typeof r.url === typeof url;
    const existing = this.routes.find(same);
    if (existing) existing.responses.push(...responses);
    else this.routes.push({ method: m, url, responses: [...responses] });
    return this;
  }

  /**
   * Answers `auth.info(host)` with `answer`: the JSON text the host's
   * credential exchange returned, `undefined`, or a `DriverError` (an
   * `error.*`) to throw, as the host's `auth` import fails. A host given no
   * answer has no credential exchanged for a token: `undefined`. Returns
   * this host, for chaining.
   */
  auth(host, answer) {
    if (answer !== undefined && typeof answer !== 'string' && !isDriverError(answer)) {
      throw new TypeError('auth: the answer is JSON text, undefined or a DriverError');
    }
    this.auths.set(host, answer);
    return this;
  }

  /** `auth.info(host)`: records `host` and answers it. */
  authInfo(host) {
    this.authAsked.push(host);
    const answer = this.auths.get(host);
    if (isDriverError(answer)) throw answer;
    return answer;
  }

  /** The requests made with `method` (any case), to `url` when given (a string or a `RegExp`). */
  requestsTo(method, url) {
    return this.requests.filter(
      (r) => r.method.toUpperCase() === method.toUpperCase() && (url === undefined || matches(url, r.url)),
    );
  }

  /** Makes this the host `send` and the log use; the one before comes back with `uninstall`. */
  install() {
    if (!this.installed) {
      this.previous = setHost({
        request: (req) => this.request(req),
        log: (level, message, fields) => this.logs.push({ level, message, fields }),
        authInfo: (host) => this.authInfo(host),
      });
      this.installed = true;
    }
    return this;
  }

  /** Puts back the host this one replaced. */
  uninstall() {
    if (this.installed) {
      setHost(this.previous);
      this.previous = undefined;
      this.installed = false;
    }
  }

  /** The transport: records `req` and answers it from the routes. */
  request(req) {
    const recorded = new RecordedRequest(req);
    this.requests.push(recorded);
    const route = this.routes.find((r) => r.method === req.method.toUpperCase() && matches(r.url, req.url));
    if (route === undefined) {
      const known = this.routes.map((r) => `  ${r.method} ${r.url}`).join('\n') || '  (none)';
      throw new Error(`fake host: no route for ${req.method} ${req.url}; routes:\n${known}`);
    }
    const spec = route.responses.length > 1 ? route.responses.shift() : route.responses[0];
    return answer(spec, recorded);
  }
}

function matches(pattern, url) {
  if (!(pattern instanceof RegExp)) return pattern === url;
  pattern.lastIndex = 0;
  return pattern.test(url);
}

/**
 * A new `FakeHost`, installed. Given node:test's test context `t`, it is
 * uninstalled when the test ends; otherwise call `uninstall()` yourself.
 */
export function installFakeHost(t) {
  const fake = new FakeHost().install();
  t?.after(() => fake.uninstall());
  return fake;
}
