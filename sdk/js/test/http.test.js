// `send` through the fake host: what it sends, the response it returns, how
// failures surface; URL splitting and encoding; and the fake host itself.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import * as sdk from '../index.js';
import { DriverError, responseError } from '../errors.js';
import { encodeComponent, parseUrl, send } from '../http.js';
import { info, log } from '../log.js';
import { FakeHost, installFakeHost } from '../testing.js';

/** The contract error `f()` throws: `{tag, val}`. */
function thrown(f) {
  try {
    f();
  } catch (e) {
    assert.ok(e instanceof DriverError, `not a DriverError: ${e}`);
    return e.payload;
  }
  assert.fail('did not throw');
}

test('without a fake host, send fails loudly and log goes nowhere', () => {
  assert.throws(() => send('GET', 'http://h/x'), /no HTTP outside a component.*installFakeHost/s);
  info('nobody hears this');
});

test('send: JSON bodies, default and extra headers, the response', (t) => {
  const fake = installFakeHost(t);
  fake.route('POST', 'http://sim:8600/v1/instances', {
    status: 201,
    headers: { 'Retry-After': '3', 'X-Id': 'i-1' },
    body: { id: 'i-1' },
  });
  const resp = send('POST', 'http://sim:8600/v1/instances', { tags: { 'berth-pool': 'p1' } }, {
    headers: { 'X-Trace': 'abc', Accept: 'text/plain', 'content-length': '999' },
  });
  assert.equal(resp.status, 201);
  assert.ok(resp.ok);
  assert.equal(resp.header('x-id'), 'i-1');
  assert.equal(resp.header('RETRY-AFTER'), '3');
  assert.equal(resp.header('missing'), null);
  assert.deepEqual(resp.json(), { id: 'i-1' });
  assert.equal(resp.text, '{"id":"i-1"}');
  assert.deepEqual(resp.request, { method: 'POST', url: 'http://sim:8600/v1/instances' });

  assert.equal(fake.requests.length, 1);
  const [req] = fake.requests;
  assert.equal(req.method, 'POST');
  assert.equal(req.url, 'http://sim:8600/v1/instances');
  assert.deepEqual(req.json(), { tags: { 'berth-pool': 'p1' } });
  assert.deepEqual(req.headers, [
    ['content-type', 'application/json'],
    ['x-trace', 'abc'],
    ['accept', 'text/plain'],
    ['content-length', String(req.body.length)],
  ]);
  assert.equal(req.header('Content-Length'), String(req.text.length));
  // The host sees the URL split as wasi:http wants it.
  assert.deepEqual(fake.logs, [
    {
      level: 'debug',
      message: 'http request',
      fields: [
        ['method', 'POST'],
        ['url', 'http://sim:8600/v1/instances'],
        ['status', '201'],
      ],
    },
  ]);
});

test('send: no body, raw bytes, and an error status is a response', (t) => {
  const fake = installFakeHost(t);
  fake.route('DELETE', 'http://h/v1/instances/i-1', { status: 404, body: 'gone' });
  fake.route('PUT', 'http://h/blob', { status: 204 });
  const resp = send('DELETE', 'http://h/v1/instances/i-1');
  assert.equal(resp.status, 404);
  assert.ok(!resp.ok);
  assert.deepEqual(fake.requests[0].headers, [
    ['accept', 'application/json'],
    ['content-length', '0'],
  ]);
  assert.deepEqual(responseError(resp).payload, {
    tag: 'not-found',
    val: 'DELETE http://h/v1/instances/i-1 answered 404: gone',
  });
  send('PUT', 'http://h/blob', new Uint8Array([1, 2, 3]));
  assert.deepEqual([...fake.requests[1].body], [1, 2, 3]);
  assert.equal(fake.requests[1].header('content-type'), 'application/octet-stream');
});

test('send: a body that is not JSON, a bad URL, a request that got no response', (t) => {
  const fake = installFakeHost(t);
  fake.route('GET', 'http://h/page', { body: '<html>' });
  fake.route('GET', 'http://h/down', { failure: 'ConnectionRefused' });
  const resp = send('GET', 'http://h/page');
  assert.equal(resp.status, 200);
  const e = thrown(() => resp.json());
  assert.equal(e.tag, 'transient');
  assert.match(e.val, /^response: /);
  assert.deepEqual(thrown(() => send('GET', 'http://h/down')), {
    tag: 'transient',
    val: 'request failed: ConnectionRefused',
  });
  assert.match(thrown(() => send('GET', 'ftp://h/')).val, /^invalid url: "ftp:\/\/h\/": scheme/);
  // A bad URL never reaches the host.
  assert.equal(fake.requests.length, 2);
});

test('the fake host: responses in order, the last repeats; functions; RegExp routes', (t) => {
  const fake = installFakeHost(t);
  fake
    .route('get', 'http://h/p', { status: 500 }, { status: 503 })
    .route('GET', 'http://h/p', { status: 200, body: [1] })
    .route('PUT', /^http:\/\/h\/v1\/instances\/[^/]+\/tags$/, (req) => ({
      status: 200,
      body: { echoed: req.json() },
    }));
  assert.deepEqual(
    [1, 2, 3, 4].map(() => send('GET', 'http://h/p').status),
    [500, 503, 200, 200],
  );
  assert.deepEqual(send('PUT', 'http://h/v1/instances/i-9/tags', { a: 1 }).json(), { echoed: { a: 1 } });
  assert.equal(fake.requestsTo('GET').length, 4);
  assert.equal(fake.requestsTo('put', /i-9/).length, 1);
  assert.equal(fake.requestsTo('GET', 'http://h/other').length, 0);
  // An unrouted request is a bug in the test, not a cloud error.
  assert.throws(() => send('GET', 'http://h/nowhere'), (e) => !(e instanceof DriverError) && /no route for GET http:\/\/h\/nowhere/.test(e.message));
  assert.throws(() => fake.route('GET', 'http://h/x'), TypeError);
});

test('fake hosts nest and uninstall', () => {
  const outer = new FakeHost().install().route('GET', 'http://h/', { status: 201 });
  const inner = installFakeHost().route('GET', 'http://h/', { status: 202 });
  log('info', 'hello', { k: 1 });
  assert.equal(send('GET', 'http://h/').status, 202);
  inner.uninstall();
  assert.equal(send('GET', 'http://h/').status, 201);
  outer.uninstall();
  assert.throws(() => send('GET', 'http://h/'), /no HTTP outside a component/);
  assert.deepEqual(inner.logs[0], { level: 'info', message: 'hello', fields: [['k', '1']] });
  assert.deepEqual(inner.logs.map((r) => r.message), ['hello', 'http request']);
  assert.deepEqual(outer.logs.map((r) => r.message), ['http request']);
  assert.throws(() => log('loud', 'x'), TypeError);
});

test('URLs split as wasi:http wants them', () => {
  assert.deepEqual(parseUrl('http://127.0.0.1:8600/v1/instances?tag:a=b#frag'), {
    url: { https: false, authority: '127.0.0.1:8600', pathAndQuery: '/v1/instances?tag:a=b' },
  });
  assert.deepEqual(parseUrl('HTTPS://[::1]?x'), {
    url: { https: true, authority: '[::1]', pathAndQuery: '/?x' },
  });
  assert.deepEqual(parseUrl('http://h'), { url: { https: false, authority: 'h', pathAndQuery: '/' } });
  assert.deepEqual(parseUrl('https://[::1]:443/a'), {
    url: { https: true, authority: '[::1]:443', pathAndQuery: '/a' },
  });
  for (const [text, why] of [
    ['h:80', 'not an absolute url'],
    ['ftp://h', 'scheme'],
    ['http://', 'no host'],
    ['http://:80', 'no host'],
    ['http://u:p@h', 'user info'],
    ['http://[::1', 'unclosed'],
    ['http://[::1]x', 'junk after'],
    ['http://::1/', 'brackets'],
    ['http://h:x', 'bad port'],
    ['http://h:65536', 'bad port'],
    ['http://h /', 'whitespace'],
    ['http://h/\u0007', 'control'],
  ]) {
    assert.match(parseUrl(text).why, new RegExp(why), text);
  }
});

test('encodeComponent encodes as the Rust SDK does', () => {
  assert.equal(encodeComponent("a-z_0.9~ /?&=!'()*é"), 'a-z_0.9~%20%2F%3F%26%3D%21%27%28%29%2A%C3%A9');
  assert.equal(encodeComponent(''), '');
  assert.equal(encodeComponent('🚀'), '%F0%9F%9A%80');
});

test('index re-exports every module', () => {
  for (const name of [
    'send', 'parseUrl', 'encodeComponent',
    'DriverError', 'error', 'isDriverError', 'statusError', 'responseError', 'parseRetryAfter', 'DEFAULT_RETRY_AFTER_MS',
    'BERTH_PREFIX', 'POOL_TAG', 'NODE_TAG', 'LABEL_TAG', 'IDLE_TAG', 'SLOTS_TAG', 'SLOT_LABEL_TAG',
    'tag', 'hasAll', 'isBerthTag', 'replaceBerthTags', 'encodeLabel', 'decodeLabel',
  ]) {
    assert.ok(sdk[name] !== undefined, name);
  }
  assert.equal(typeof sdk.log.info, 'function');
  assert.equal(sdk.error.notFound('x').payload.tag, 'not-found');
});
