// defaults: the contract's optional calls answered as not supported, as the
// Rust SDK's default methods answer them; ok and err: a batch's answers.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { defaults, err, notSupported, ok } from '../driver.js';
import { DriverError, error } from '../errors.js';

const permanent = (message) => ({ tag: 'err', val: { tag: 'permanent', val: message } });

test('batches: one permanent failure per item, in order', () => {
  assert.deepEqual(defaults.createMany([{}, {}, {}]), [
    permanent('create-many is not supported by this driver'),
    permanent('create-many is not supported by this driver'),
    permanent('create-many is not supported by this driver'),
  ]);
  assert.deepEqual(defaults.deleteMany(['i-1']), [permanent('delete-many is not supported by this driver')]);
  assert.deepEqual(defaults.deleteMany([]), []);
  assert.deepEqual(notSupported([1, 2], 'm'), [permanent('m'), permanent('m')]);
});

test('limits: not supported', () => {
  assert.throws(
    () => defaults.limits(),
    (e) => e instanceof DriverError && e.payload.tag === 'permanent',
  );
});

test("a driver's own functions win over the defaults", () => {
  const driver = { ...defaults, limits: () => 'its own' };
  assert.equal(driver.limits(), 'its own');
  assert.equal(driver.createMany([{}]).length, 1);
  assert.ok(Object.isFrozen(defaults));
});

test('ok and err are the result values componentize-js takes', () => {
  assert.deepEqual(ok({ id: 'i-1' }), { tag: 'ok', val: { id: 'i-1' } });
  assert.deepEqual(ok(), { tag: 'ok', val: undefined });
  assert.deepEqual(err(error.notFound('gone')), { tag: 'err', val: { tag: 'not-found', val: 'gone' } });
  assert.deepEqual(err({ tag: 'transient', val: 't' }), { tag: 'err', val: { tag: 'transient', val: 't' } });
});
