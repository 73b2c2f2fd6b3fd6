// auth.info: what the host's credentials learned, answered by the fake host
// under node as the `auth` import answers inside a component.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { info } from '../auth.js';
import { DriverError, error } from '../errors.js';
import { installFakeHost } from '../testing.js';

test('answers JSON text, and undefined for a host without a credential', (t) => {
  const fake = installFakeHost(t);
  const catalog = '{"project_id": "p-1", "catalog": []}';
  fake.auth('keystone.example', catalog);
  assert.equal(info('keystone.example'), catalog);
  assert.equal(info('api.example'), undefined);
  assert.deepEqual(fake.authAsked, ['keystone.example', 'api.example']);
});

test('an exchange that failed is thrown as the contract error', (t) => {
  const fake = installFakeHost(t);
  fake.auth('keystone.example', error.unauthorized('keystone refused the credential'));
  assert.throws(
    () => info('keystone.example'),
    (e) =>
      e instanceof DriverError &&
      e.payload.tag === 'unauthorized' &&
      e.payload.val === 'keystone refused the credential',
  );
  assert.throws(() => fake.auth('h', { project: 'p' }), TypeError);
});

test('without a fake host, it says how to get one', () => {
  assert.throws(() => info('keystone.example'), /no auth import outside a component/);
});
