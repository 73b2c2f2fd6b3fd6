// Unit tests of the driver under node, run by `npm test` and by `./build`.
// HTTP goes to the SDK's fake host, which answers what a test routed and
// keeps every request; `berth driver test` tests the built component against
// a real endpoint.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { DriverError } from 'berth-driver-sdk';
import { installFakeHost } from 'berth-driver-sdk/testing';

import { apiError, driver, parseConfig, toInstance } from '../src/driver.js';

const CLOUD = 'http://cloud';

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

/** An instance as the cloud's JSON. */
function instance(id, tags, state = 'pending', more = {}) {
  return { id, state, instance_type: 'small', tags, ...more };
}

const TOKEN = '6f1c2a4e-9b7d-4c3e-8a5f-0d2b1e3c4a5b';

/** A fake host, and the driver configured for pool `p1`. */
function configured(t, extra = {}) {
  const fake = installFakeHost(t);
  driver.configure('p1', JSON.stringify({ endpoint: `${CLOUD}/`, ...extra }));
  return fake;
}

test('configure accepts a config and names every wrong field', () => {
  assert.deepEqual(parseConfig('p1', '{"endpoint": "http://127.0.0.1:8181/", "page_size": 5}'), {
    poolId: 'p1',
    endpoint: 'http://127.0.0.1:8181',
    pageSize: 5,
  });
  for (const [config, needles] of [
    ['not json', ['provider config']],
    ['{}', ['endpoint']],
    ['{"endpoint": "ftp://h"}', ['endpoint']],
    ['{"endpoint": "http://h", "page_size": 0}', ['page_size']],
    ['{"colour": 1, "page_size": true}', ['colour', 'endpoint', 'page_size']],
  ]) {
    const e = thrown(() => parseConfig('p1', config));
    assert.equal(e.tag, 'invalid-config', config);
    for (const needle of needles) assert.ok(e.val.includes(needle), `${config}: ${e.val}`);
  }
});

test('create forces the pool tag and sends the token', (t) => {
  const fake = configured(t);
  fake.route('POST', `${CLOUD}/v1/instances`, { status: 201, body: instance('i-1', { 'berth-pool': 'p1' }) });
  const made = driver.create({
    nodeId: 'n-1',
    token: TOKEN,
    instanceType: 'small',
    image: 'img',
    tags: [['berth-pool', 'other'], ['berth-node', 'n-1']],
    userData: undefined,
    sshPublicKey: undefined,
    options: '{}',
  });
  assert.equal(made.id, 'i-1');
  assert.deepEqual(fake.requests[0].json(), {
    instance_type: 'small',
    image: 'img',
    tags: { 'berth-pool': 'p1', 'berth-node': 'n-1' },
    client_token: TOKEN,
  });
});

test('list answers one page and its cursor, and filters', (t) => {
  const fake = configured(t, { page_size: 1 });
  const url = `${CLOUD}/v1/instances?tag:berth-pool=p1&tag:berth-label=a%20b&page_size=1`;
  const mine = (id) => instance(id, { 'berth-pool': 'p1', 'berth-label': 'a b' });
  const filter = [['berth-pool', 'p1'], ['berth-label', 'a b']];
  fake.route('GET', url, { body: { instances: [mine('i-1')], next_page_token: 't/1' } });
  fake.route('GET', `${url}&page_token=t%2F1`, {
    // The cloud filters already; an instance that slips through is dropped.
    body: { instances: [instance('i-2', { 'berth-pool': 'p2' }), mine('i-3')], next_page_token: null },
  });
  const first = driver.list(filter, undefined);
  assert.deepEqual([first.instances.map((i) => i.id), first.next], [['i-1'], 't/1']);
  // One request per call: the host asks for the next page.
  assert.equal(fake.requests.length, 1);
  const last = driver.list(filter, first.next);
  assert.deepEqual([last.instances.map((i) => i.id), last.next], [['i-3'], undefined]);
  assert.equal(fake.requests.length, 2);
  // Another pool: nothing, and no request.
  assert.deepEqual(driver.list([['berth-pool', 'p2']], undefined), { instances: [], next: undefined });
  assert.equal(fake.requests.length, 2);
});

test('list refuses a page token that does not move', (t) => {
  const fake = configured(t);
  fake.route('GET', `${CLOUD}/v1/instances?tag:berth-pool=p1&page_token=x`, {
    body: { instances: [], next_page_token: 'x' },
  });
  assert.equal(thrown(() => driver.list([], 'x')).tag, 'transient');
});

test("get asks for the ids alone and keeps the pool's", (t) => {
  const fake = configured(t);
  const url = `${CLOUD}/v1/instances?tag:berth-pool=p1&page_size=1000&id=i-1&id=i%2F2&id=i-3`;
  fake.route('GET', url, {
    body: {
      instances: [
        instance('i-1', { 'berth-pool': 'p1' }),
        // Another pool's, and one not asked for: both dropped.
        instance('i/2', { 'berth-pool': 'p2' }),
        instance('i-4', { 'berth-pool': 'p1' }),
      ],
      next_page_token: null,
    },
  });
  assert.deepEqual(driver.get(['i-1', 'i/2', 'i-3']).map((i) => i.id), ['i-1']);
  assert.deepEqual(driver.get([]), []);
  assert.equal(fake.requests.length, 1);
});

test('states, and the reason of a failed instance', () => {
  for (const [state, more, want] of [
    ['pending', {}, { tag: 'pending' }],
    ['running', {}, { tag: 'running' }],
    ['stopping', {}, { tag: 'stopping' }],
    ['terminated', {}, { tag: 'terminated' }],
    ['failed', { fault: 'no host' }, { tag: 'failed', val: 'no host' }],
    ['failed', {}, { tag: 'failed', val: '' }],
    ['exploded', {}, { tag: 'unknown' }],
  ]) {
    assert.deepEqual(toInstance(instance('i-1', {}, state, more)).state, want, state);
  }
});

test('batches are not supported', () => {
  const caps = driver.describe().capabilities;
  assert.ok(!caps.createMany && !caps.deleteMany);
  const permanent = (what) => ({ tag: 'err', val: { tag: 'permanent', val: `${what} is not supported by this driver` } });
  assert.deepEqual(driver.createMany([{}, {}]), [permanent('create-many'), permanent('create-many')]);
  assert.deepEqual(driver.deleteMany(['i-1']), [permanent('delete-many')]);
});

test('delete of a gone instance is not-found', (t) => {
  const fake = configured(t);
  fake.route('DELETE', `${CLOUD}/v1/instances/i%2F1`, { status: 404, body: { error: { code: 'not_found', message: 'gone' } } });
  assert.deepEqual(thrown(() => driver.delete('i/1')), { tag: 'not-found', val: 'gone' });
});

test('set-tags sends berth tags only and keeps the pool tag', (t) => {
  const fake = configured(t);
  fake.route('PUT', `${CLOUD}/v1/instances/i-1/tags`, { status: 204 });
  driver.setTags('i-1', [['berth-node', 'n-2'], ['name', 'x']]);
  assert.deepEqual(fake.requests[0].json(), { tags: { 'berth-node': 'n-2', 'berth-pool': 'p1' } });
});

test('limits', (t) => {
  const fake = configured(t);
  fake.route('GET', `${CLOUD}/v1/limits`, { body: { max_instances: 10, used_instances: 3 } }, { body: { max_instances: 'many' } });
  assert.equal(driver.limits().maxInstances, 10);
  assert.equal(thrown(() => driver.limits()).tag, 'transient');
});

test('failed responses map to the contract errors', (t) => {
  const resp = (status, body, headers = {}) => ({ status, text: JSON.stringify(body), header: (h) => headers[h] ?? null });
  const body = (code) => ({ error: { code, message: 'm' } });
  assert.deepEqual(apiError(resp(403, body('quota_exceeded'))).payload, { tag: 'quota-exceeded', val: 'm' });
  assert.deepEqual(apiError(resp(403, body('forbidden'))).payload, { tag: 'unauthorized', val: 'm' });
  assert.deepEqual(apiError(resp(503, body('insufficient_capacity')), 'small').payload, {
    tag: 'capacity',
    val: { scope: { tag: 'instance-type', val: 'small' }, message: 'm' },
  });
  assert.deepEqual(apiError(resp(429, body('rate_limited'), { 'retry-after': '3' })).payload, {
    tag: 'rate-limited',
    val: { retryAfterMs: 3000n, message: 'm' },
  });
  assert.equal(apiError(resp(500, 'oops')).payload.tag, 'transient');
  assert.equal(apiError(resp(400, body('invalid_request'))).payload.tag, 'permanent');
  // No response at all is transient too.
  const fake = configured(t);
  fake.route('GET', `${CLOUD}/v1/limits`, { failure: 'ConnectionRefused' });
  assert.deepEqual(thrown(() => driver.limits()), { tag: 'transient', val: 'request failed: ConnectionRefused' });
});
