// Unit tests of the driver under node: config validation, label options, the
// sim's wire format and its error mapping, and the calls themselves
// against the SDK's fake host (recorded sim answers, every request kept).
// `npm test` runs them with node's test runner; the whole driver is tested
// against a running sim with `berth driver test` (see README.md).

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { DriverError } from 'berth-driver-sdk';
import { installFakeHost } from 'berth-driver-sdk/testing';

import { checkLabelOptions, parseConfig } from '../src/config.js';
import { driver } from '../src/driver.js';
import { apiError, readInstance, readLimits, readPage } from '../src/sim-api.js';

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

function resp(status, headers, text) {
  return { status, header: (name) => headers[name] ?? null, text };
}

function errBody(code, extra = '') {
  return `{"error": {"code": "${code}", "message": "m"}${extra}}`;
}

test('configure accepts an endpoint and drops its trailing slash', () => {
  assert.deepEqual(parseConfig('p1', '{"endpoint": "http://127.0.0.1:8600/"}'), {
    poolId: 'p1',
    endpoint: 'http://127.0.0.1:8600',
    pageSize: undefined,
  });
  assert.equal(
    parseConfig('p1', '{"endpoint": "https://[::1]:8600/base", "page_size": 1000}').pageSize,
    1000,
  );
});

test('configure names every wrong field', () => {
  for (const [config, needles] of [
    ['{}', ['endpoint']],
    ['{"endpoint": "ftp://x"}', ['endpoint', 'scheme']],
    ['{"endpoint": "127.0.0.1:80"}', ['endpoint']],
    ['{"endpoint": "http://user@h"}', ['endpoint', 'user info']],
    ['{"endpoint": "http://h:99999"}', ['endpoint', 'bad port']],
    ['{"endpoint": "http://h/?x=1"}', ['endpoint', 'query']],
    ['{"endpoint": "http://h/#x"}', ['endpoint', 'fragment']],
    ['{"endpoint": 7}', ['endpoint']],
    ['{"endpoint": "http://h", "page_size": 0}', ['page_size']],
    ['{"endpoint": "http://h", "page_size": 2.5}', ['page_size']],
    ['{"endpoint": "http://h", "colour": 1}', ['colour']],
    ['{"colour": 1, "page_size": -1}', ['colour', 'page_size', 'endpoint']],
    ['[]', ['JSON object']],
    ['not json', ['provider config']],
  ]) {
    const e = thrown(() => parseConfig('p1', config));
    assert.equal(e.tag, 'invalid-config', config);
    for (const needle of needles) assert.ok(e.val.includes(needle), `${config}: ${e.val}`);
  }
  assert.match(thrown(() => parseConfig('', '{"endpoint": "http://h"}')).val, /pool id/);
});

test('label options: {} only, any key named back', () => {
  checkLabelOptions('{}');
  const e = thrown(() => checkLabelOptions('{"zone": "a"}'));
  assert.equal(e.tag, 'invalid-config');
  assert.match(e.val, /"zone"/);
  assert.equal(thrown(() => checkLabelOptions('[]')).tag, 'invalid-config');
  assert.equal(thrown(() => checkLabelOptions('{')).tag, 'invalid-config');
});

test('sim errors map to the contract errors', () => {
  const check = (r, instanceType, want) => assert.deepEqual(apiError(r, instanceType).payload, want);
  check(resp(429, { 'retry-after': '3' }, errBody('rate_limited', ', "retry_after_ms": 2500')), undefined, {
    tag: 'rate-limited',
    val: { retryAfterMs: 2500n, message: 'm' },
  });
  check(resp(429, { 'retry-after': '3' }, errBody('rate_limited')), undefined, {
    tag: 'rate-limited',
    val: { retryAfterMs: 3000n, message: 'm' },
  });
  check(resp(429, {}, 'not json'), undefined, {
    tag: 'rate-limited',
    val: { retryAfterMs: 1000n, message: 'sim answered 429: not json' },
  });
  check(resp(403, {}, errBody('quota_exceeded')), undefined, { tag: 'quota-exceeded', val: 'm' });
  check(resp(503, {}, errBody('insufficient_capacity', ', "instance_type": "gpu"')), 'small', {
    tag: 'capacity',
    val: { scope: { tag: 'instance-type', val: 'gpu' }, message: 'm' },
  });
  check(resp(503, {}, errBody('insufficient_capacity')), 'small', {
    tag: 'capacity',
    val: { scope: { tag: 'instance-type', val: 'small' }, message: 'm' },
  });
  check(resp(503, {}, errBody('insufficient_capacity')), undefined, {
    tag: 'capacity',
    val: { scope: { tag: 'general' }, message: 'm' },
  });
  check(resp(503, {}, 'down'), undefined, { tag: 'transient', val: 'sim answered 503: down' });
  check(resp(404, {}, errBody('not_found')), undefined, { tag: 'not-found', val: 'm' });
  check(resp(401, {}, errBody('unauthorized')), undefined, { tag: 'unauthorized', val: 'm' });
  check(resp(403, {}, errBody('forbidden')), undefined, { tag: 'unauthorized', val: 'm' });
  check(resp(400, {}, errBody('invalid_request')), undefined, { tag: 'permanent', val: 'm' });
  check(resp(500, {}, errBody('internal_error')), undefined, { tag: 'transient', val: 'm' });
});

test('an instance from the sim JSON', () => {
  const i = readInstance(
    JSON.parse(`{
      "id": "i-000000000000002a", "state": "pending", "instance_type": "small",
      "image": "ubuntu-24.04", "tags": {"berth-pool": "p1", "berth-node": "n-1"},
      "created_at_ms": 1790000000000, "private_ipv4": "10.0.0.42", "public_ipv4": null,
      "hostname": "i-000000000000002a.sim.internal", "ssh_port": 22, "username": "berth",
      "client_token": "n-1"
    }`),
  );
  assert.deepEqual(i, {
    id: 'i-000000000000002a',
    state: { tag: 'pending' },
    instanceType: 'small',
    tags: [
      ['berth-node', 'n-1'],
      ['berth-pool', 'p1'],
    ],
    addresses: {
      publicIpv4: undefined,
      privateIpv4: '10.0.0.42',
      ipv6: undefined,
      hostname: 'i-000000000000002a.sim.internal',
    },
    createdAtMs: 1790000000000n,
    connection: { username: 'berth', port: 22, hostKeys: [] },
  });
});

test('instance states, and bodies that are not the sim JSON', () => {
  for (const [text, want] of [
    ['pending', { tag: 'pending' }],
    ['running', { tag: 'running' }],
    ['stopping', { tag: 'stopping' }],
    ['terminated', { tag: 'terminated' }],
    ['failed', { tag: 'failed', val: '' }],
    ['exploded', { tag: 'unknown' }],
  ]) {
    assert.deepEqual(readInstance({ id: 'i-1', state: text, instance_type: 't' }).state, want, text);
  }
  // A failed instance carries the sim's fault.
  const failed = { id: 'i-1', state: 'failed', instance_type: 't', fault: 'the instance failed to boot' };
  assert.deepEqual(readInstance(failed).state, { tag: 'failed', val: 'the instance failed to boot' });
  for (const body of [
    { ...failed, fault: 7 },
    { state: 'running', instance_type: 't' },
    { id: 'i-1', state: 'running', instance_type: 't', tags: { k: 1 } },
    { id: 'i-1', state: 'running', instance_type: 't', ssh_port: 70000 },
    [],
  ]) {
    assert.equal(thrown(() => readInstance(body)).tag, 'transient', JSON.stringify(body));
  }
  assert.equal(thrown(() => readPage({ next_page_token: null })).tag, 'transient');
  assert.deepEqual(readPage({ instances: [], next_page_token: null }), {
    instances: [],
    nextPageToken: undefined,
  });
});

test('account limits', () => {
  const none = { maxCores: undefined, usedCores: undefined, maxRamMib: undefined, usedRamMib: undefined };
  assert.deepEqual(readLimits({ max_instances: 50, used_instances: 3 }), {
    maxInstances: 50,
    usedInstances: 3,
    ...none,
  });
  assert.deepEqual(readLimits({ max_instances: null, used_instances: 0 }), {
    maxInstances: undefined,
    usedInstances: 0,
    ...none,
  });
  assert.equal(thrown(() => readLimits({ max_instances: -1 })).tag, 'transient');
});


// The calls, against recorded sim answers.

const SIM = 'http://sim:8600';

/** A sim instance as JSON. */
function simInstance(id, tags = {}) {
  return { id, state: 'running', instance_type: 'small', tags: { 'berth-pool': 'p1', ...tags } };
}

/** A fake host and the driver configured for pool `p1` at `SIM`. */
function configured(t, config = {}) {
  const fake = installFakeHost(t);
  driver.configure('p1', JSON.stringify({ endpoint: `${SIM}/`, ...config }));
  return fake;
}

const TOKEN = '0b3c5d7e-1f2a-4b6c-8d9e-a1b2c3d4e5f6';

/** A create as the host asks for it. */
function spec(more = {}) {
  return {
    nodeId: 'n-1',
    token: TOKEN,
    instanceType: 'small',
    image: 'u',
    tags: [],
    userData: undefined,
    sshPublicKey: undefined,
    options: '{}',
    ...more,
  };
}

test('create forces the pool tag and passes the token as the client token', (t) => {
  const fake = configured(t);
  fake.route('POST', `${SIM}/v1/instances`, { status: 201, body: simInstance('i-1', { 'berth-node': 'n-1' }) });
  const made = driver.create(
    spec({
      image: 'ubuntu',
      tags: [['berth-pool', 'other'], ['berth-node', 'n-1'], ['env', 'ci']],
      userData: 'echo hi',
    }),
  );
  assert.equal(made.id, 'i-1');
  assert.deepEqual(fake.requests[0].json(), {
    instance_type: 'small',
    image: 'ubuntu',
    tags: { 'berth-node': 'n-1', env: 'ci', 'berth-pool': 'p1' },
    client_token: TOKEN,
    user_data: 'echo hi',
  });
  // Refused label options make no request.
  const e = thrown(() => driver.create(spec({ nodeId: 'n-2', options: '{"zone": "a"}' })));
  assert.equal(e.tag, 'invalid-config');
  assert.equal(fake.requests.length, 1);
});

test('create maps the sim failures', (t) => {
  const fake = configured(t);
  const create = spec();
  fake.route(
    'POST',
    `${SIM}/v1/instances`,
    { status: 503, body: { error: { code: 'insufficient_capacity', message: 'full' } } },
    { status: 429, headers: { 'retry-after': '2' }, body: { error: { code: 'rate_limited', message: 'slow' } } },
    { status: 201, body: '{not json' },
    { failure: 'ConnectionRefused' },
  );
  assert.deepEqual(thrown(() => driver.create(create)), {
    tag: 'capacity',
    val: { scope: { tag: 'instance-type', val: 'small' }, message: 'full' },
  });
  assert.deepEqual(thrown(() => driver.create(create)), {
    tag: 'rate-limited',
    val: { retryAfterMs: 2000n, message: 'slow' },
  });
  assert.equal(thrown(() => driver.create(create)).tag, 'transient');
  assert.deepEqual(thrown(() => driver.create(create)), { tag: 'transient', val: 'request failed: ConnectionRefused' });
});

test('list answers one page of the sim and its cursor, the filtered pool only', (t) => {
  const fake = configured(t, { page_size: 2 });
  const base = `${SIM}/v1/instances?tag:berth-pool=p1&tag:berth-label=a%20b&page_size=2`;
  const filter = [['berth-pool', 'p1'], ['berth-label', 'a b']];
  fake.route('GET', base, { body: { instances: [simInstance('i-1', { 'berth-label': 'a b' }), simInstance('i-2', { 'berth-label': 'a b' })], next_page_token: 't/1' } });
  fake.route('GET', `${base}&page_token=t%2F1`, {
    // The sim filters already; an instance that slipped through is dropped.
    body: { instances: [simInstance('i-3', { 'berth-label': 'a b' }), simInstance('i-4')], next_page_token: null },
  });
  const first = driver.list(filter, undefined);
  assert.deepEqual([first.instances.map((i) => i.id), first.next], [['i-1', 'i-2'], 't/1']);
  // One request a call, whatever the sim has after it.
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
  fake.route('GET', `${SIM}/v1/instances?tag:berth-pool=p1&page_token=x`, { body: { instances: [], next_page_token: 'x' } });
  assert.deepEqual(thrown(() => driver.list([], 'x')), { tag: 'transient', val: 'sim repeated page token "x"' });
});

test('get asks the sim for those ids in one list', (t) => {
  const fake = configured(t);
  const url = `${SIM}/v1/instances?tag:berth-pool=p1&page_size=1000&id=i-1&id=i-2&id=i%2F3`;
  fake.route('GET', url, {
    body: {
      instances: [
        { ...simInstance('i-1'), state: 'failed', fault: 'no host' },
        // Another pool's, and one not asked for: neither is answered.
        simInstance('i-2', { 'berth-pool': 'p2' }),
        simInstance('i-9'),
      ],
      next_page_token: null,
    },
  });
  const got = driver.get(['i-1', 'i-2', 'i/3']);
  assert.deepEqual(got.map((i) => [i.id, i.state]), [['i-1', { tag: 'failed', val: 'no host' }]]);
  // Nothing asked, nothing sent.
  assert.deepEqual(driver.get([]), []);
  assert.equal(fake.requests.length, 1);
});

test('get maps the sim failures', (t) => {
  const fake = configured(t);
  fake.route('GET', `${SIM}/v1/instances?tag:berth-pool=p1&page_size=1000&id=nope`, {
    status: 400,
    body: { error: { code: 'invalid_request', message: 'bad id' } },
  });
  assert.deepEqual(thrown(() => driver.get(['nope'])), { tag: 'permanent', val: 'bad id' });
});

test('batches are not supported', () => {
  const caps = driver.describe().capabilities;
  assert.ok(!caps.createMany && !caps.deleteMany);
  const permanent = (what) => ({ tag: 'err', val: { tag: 'permanent', val: `${what} is not supported by this driver` } });
  assert.deepEqual(driver.createMany([spec(), spec()]), [permanent('create-many'), permanent('create-many')]);
  assert.deepEqual(driver.deleteMany(['i-1']), [permanent('delete-many')]);
});

test('delete: done, already gone, or an error', (t) => {
  const fake = configured(t);
  fake.route('DELETE', `${SIM}/v1/instances/i-1`, { status: 204 });
  fake.route('DELETE', `${SIM}/v1/instances/i%2F2`, { status: 404, body: { error: { code: 'not_found', message: 'no i/2' } } });
  fake.route('DELETE', `${SIM}/v1/instances/i-3`, { status: 401, body: {} });
  driver.delete('i-1');
  assert.deepEqual(thrown(() => driver.delete('i/2')), { tag: 'not-found', val: 'no i/2' });
  assert.equal(thrown(() => driver.delete('i-3')).tag, 'unauthorized');
});

test('set-tags sends berth tags only and keeps the pool tag', (t) => {
  const fake = configured(t);
  fake.route('PUT', `${SIM}/v1/instances/i-1/tags`, { status: 204 });
  driver.setTags('i-1', [['berth-node', 'n-1'], ['env', 'x'], ['berth-pool', 'p1']]);
  assert.deepEqual(fake.requests[0].json(), { tags: { 'berth-node': 'n-1', 'berth-pool': 'p1' } });
  driver.setTags('i-1', []);
  assert.deepEqual(fake.requests[1].json(), { tags: { 'berth-pool': 'p1' } });
  const e = thrown(() => driver.setTags('i-1', [['berth-pool', 'p2']]));
  assert.equal(e.tag, 'permanent');
  assert.equal(fake.requests.length, 2);
});

test('limits', (t) => {
  const fake = configured(t);
  fake.route('GET', `${SIM}/v1/limits`, { body: { max_instances: 10, used_instances: 4 } }, { status: 500, body: 'boom' });
  assert.equal(driver.limits().maxInstances, 10);
  assert.deepEqual(thrown(() => driver.limits()), { tag: 'transient', val: 'sim answered 500: boom' });
});
