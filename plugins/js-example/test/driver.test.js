// Unit tests of the parts that make no requests: config validation, label
// options, the sim's wire format and its error mapping. `npm test` runs them
// with node's test runner; the whole driver is tested against a running sim
// with `berth driver test` (see README.md).

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { DriverError, hasAll, isBerthTag } from '../src/contract.js';
import { checkLabelOptions, parseConfig } from '../src/config.js';
import { apiError, readInstance, readLimits, readPage } from '../src/sim-api.js';
import { encodeComponent, parseUrl } from '../src/url.js';

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
    state: 'pending',
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
    ['pending', 'pending'],
    ['running', 'running'],
    ['stopping', 'stopping'],
    ['terminated', 'terminated'],
    ['exploded', 'unknown'],
  ]) {
    assert.equal(readInstance({ id: 'i-1', state: text, instance_type: 't' }).state, want);
  }
  for (const body of [
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

test('tag rules and URL encoding', () => {
  assert.ok(hasAll([['berth-pool', 'p1'], ['x', 'y']], [['berth-pool', 'p1']]));
  assert.ok(!hasAll([['berth-pool', 'p1']], [['berth-pool', 'p2']]));
  assert.ok(hasAll([['k', '1'], ['k', '2']], [['k', '2']]));
  assert.ok(hasAll([], []));
  assert.ok(isBerthTag('berth-pool') && !isBerthTag('Berth-pool') && !isBerthTag('berth'));
  assert.equal(encodeComponent("a-z_0.9~ /?&=!'()*é"), 'a-z_0.9~%20%2F%3F%26%3D%21%27%28%29%2A%C3%A9');
});

test('URLs split as wasi:http wants them', () => {
  assert.deepEqual(parseUrl('http://127.0.0.1:8600/v1/instances?tag:a=b#frag'), {
    url: { https: false, authority: '127.0.0.1:8600', pathAndQuery: '/v1/instances?tag:a=b' },
  });
  assert.deepEqual(parseUrl('HTTPS://[::1]?x'), {
    url: { https: true, authority: '[::1]', pathAndQuery: '/?x' },
  });
  assert.deepEqual(parseUrl('http://h'), { url: { https: false, authority: 'h', pathAndQuery: '/' } });
  for (const [text, why] of [
    ['h:80', 'not an absolute url'],
    ['ftp://h', 'scheme'],
    ['http://', 'no host'],
    ['http://u:p@h', 'user info'],
    ['http://[::1', 'unclosed'],
    ['http://::1/', 'brackets'],
    ['http://h:x', 'bad port'],
    ['http://h /', 'whitespace'],
  ]) {
    assert.match(parseUrl(text).why, new RegExp(why), text);
  }
});
