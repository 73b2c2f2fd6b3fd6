// The error constructors, their payloads as componentize-js wants them, and
// the mapping of HTTP statuses (with Retry-After) to the contract's cases.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  DEFAULT_RETRY_AFTER_MS,
  DriverError,
  error,
  fromError,
  isDriverError,
  parseRetryAfter,
  responseError,
  statusError,
} from '../errors.js';

test('one constructor per case of the contract error, with its payload', () => {
  const cases = [
    [error.rateLimited(2500, 'slow'), { tag: 'rate-limited', val: { retryAfterMs: 2500n, message: 'slow' } }],
    [error.rateLimited(7n, 'slow'), { tag: 'rate-limited', val: { retryAfterMs: 7n, message: 'slow' } }],
    [error.quotaExceeded('q'), { tag: 'quota-exceeded', val: 'q' }],
    [
      error.capacityForType('gpu', 'c'),
      { tag: 'capacity', val: { scope: { tag: 'instance-type', val: 'gpu' }, message: 'c' } },
    ],
    [error.capacityGeneral('c'), { tag: 'capacity', val: { scope: { tag: 'general' }, message: 'c' } }],
    [error.notFound('n'), { tag: 'not-found', val: 'n' }],
    [error.unauthorized('u'), { tag: 'unauthorized', val: 'u' }],
    [error.invalidConfig('i'), { tag: 'invalid-config', val: 'i' }],
    [error.transient('t'), { tag: 'transient', val: 't' }],
    [error.permanent('p'), { tag: 'permanent', val: 'p' }],
  ];
  for (const [e, payload] of cases) {
    assert.ok(e instanceof DriverError && e instanceof Error && isDriverError(e));
    // An own property: componentize-js reads `payload` off the exception.
    assert.ok(Object.hasOwn(e, 'payload'));
    assert.deepEqual(e.payload, payload);
    assert.equal(e.message, `${payload.tag}: ${typeof payload.val === 'string' ? payload.val : payload.val.message}`);
  }
  // Every case of the WIT variant has a constructor.
  const tags = new Set(cases.map(([e]) => e.payload.tag));
  assert.deepEqual(
    [...tags].sort(),
    ['capacity', 'invalid-config', 'not-found', 'permanent', 'quota-exceeded', 'rate-limited', 'transient', 'unauthorized'],
  );
  assert.ok(!isDriverError(new Error('x')));
});

test('retry-after is a u64 of milliseconds', () => {
  assert.equal(error.rateLimited(2n ** 70n, 'm').payload.val.retryAfterMs, 2n ** 64n - 1n);
  assert.throws(() => error.rateLimited(-1, 'm'), RangeError);
  assert.throws(() => error.rateLimited(1.5, 'm'), RangeError);
  assert.throws(() => error.rateLimited('5', 'm'), RangeError);
});

test('Retry-After in seconds or as an HTTP-date', () => {
  const now = Date.UTC(2015, 9, 21, 7, 28, 0);
  for (const [value, want] of [
    ['3', 3000n],
    [' 3 ', 3000n],
    ['+3', 3000n],
    ['0', 0n],
    [120, 120000n],
    ['18446744073709551615', 2n ** 64n - 1n],
    ['18446744073709551616', undefined],
    ['Wed, 21 Oct 2015 07:28:30 GMT', 30000n],
    ['Wed, 21 Oct 2015 07:27:00 GMT', 0n],
    ['Wednesday, 21-Oct-15 07:29:00 GMT', 60000n],
    ['Wed Oct 21 07:28:05 2015', 5000n],
    ['Wed Oct  1 07:28:05 2015', 0n],
    ['Thu, 22 Oct 2015 07:28:00 GMT', 86400000n],
    ['Wed, 31 Feb 2015 07:28:00 GMT', undefined],
    ['Wed, 21 Oct 2015 25:28:00 GMT', undefined],
    ['Wed, 21 Oct 2015 07:28:00 UTC', undefined],
    ['-3', undefined],
    ['1.5', undefined],
    ['soon', undefined],
    ['', undefined],
    [null, undefined],
    [undefined, undefined],
  ]) {
    assert.equal(parseRetryAfter(value, now), want, JSON.stringify(value));
  }
});

test('HTTP statuses map to the contract cases', () => {
  const now = Date.UTC(2015, 9, 21, 7, 28, 0);
  const check = (status, options, want) =>
    assert.deepEqual(statusError(status, 'm', { now, ...options }).payload, want, `${status}`);
  const limited = (ms) => ({ tag: 'rate-limited', val: { retryAfterMs: ms, message: 'm' } });
  check(429, { retryAfter: '2' }, limited(2000n));
  check(429, { retryAfter: 'Wed, 21 Oct 2015 07:28:02 GMT' }, limited(2000n));
  check(429, {}, limited(BigInt(DEFAULT_RETRY_AFTER_MS)));
  check(429, { retryAfter: 'soon' }, limited(1000n));
  check(429, { defaultRetryAfterMs: 5000 }, limited(5000n));
  check(401, {}, { tag: 'unauthorized', val: 'm' });
  check(403, {}, { tag: 'unauthorized', val: 'm' });
  check(404, {}, { tag: 'not-found', val: 'm' });
  for (const status of [500, 502, 503, 504, 599]) check(status, {}, { tag: 'transient', val: 'm' });
  for (const status of [400, 405, 409, 410, 413, 422, 499]) check(status, {}, { tag: 'permanent', val: 'm' });
  for (const status of [200, 302, 600]) check(status, {}, { tag: 'permanent', val: 'm' });
});

test('authors override the mapping per status', () => {
  const overrides = {
    403: (message) => error.quotaExceeded(message),
    409: (message, status) => (message.includes('busy') ? error.transient(`${status} ${message}`) : undefined),
  };
  assert.equal(statusError(403, 'm', { overrides }).payload.tag, 'quota-exceeded');
  assert.deepEqual(statusError(409, 'busy', { overrides }).payload, { tag: 'transient', val: '409 busy' });
  // `undefined` falls through to the usual mapping.
  assert.equal(statusError(409, 'conflict', { overrides }).payload.tag, 'permanent');
  assert.equal(statusError(401, 'm', { overrides }).payload.tag, 'unauthorized');
});

test('a response maps with its Retry-After header and a message of its own', () => {
  const resp = (status, headers, text, request) => ({
    status,
    header: (name) => headers[name] ?? null,
    text,
    request,
  });
  assert.deepEqual(responseError(resp(429, { 'retry-after': '4' }, 'slow down')).payload, {
    tag: 'rate-limited',
    val: { retryAfterMs: 4000n, message: 'answered 429: slow down' },
  });
  assert.deepEqual(
    responseError(resp(404, {}, 'x'.repeat(300), { method: 'GET', url: 'http://h/v1/i' })).payload,
    { tag: 'not-found', val: `GET http://h/v1/i answered 404: ${'x'.repeat(200)}` },
  );
  assert.deepEqual(responseError(resp(503, {}, ''), { message: 'down' }).payload, { tag: 'transient', val: 'down' });
  assert.deepEqual(
    responseError(resp(429, { 'retry-after': '4' }, ''), { retryAfter: '9', message: 'm' }).payload.val,
    { retryAfterMs: 9000n, message: 'm' },
  );
});

test('fromError: a contract error value as the DriverError that returns it', () => {
  for (const value of [
    { tag: 'unauthorized', val: 'refused' },
    { tag: 'rate-limited', val: { retryAfterMs: 5n, message: 'slow' } },
    { tag: 'capacity', val: { scope: { tag: 'general' }, message: 'full' } },
  ]) {
    const e = fromError(value);
    assert.ok(isDriverError(e));
    assert.deepEqual(e.payload, value);
  }
  assert.equal(fromError({ tag: 'transient', val: 'down' }).message, 'transient: down');
  assert.equal(fromError({ tag: 'rate-limited', val: { retryAfterMs: 5n, message: 'slow' } }).message, 'rate-limited: slow');
  assert.throws(() => fromError('transient'), TypeError);
});
