// pageOf: a whole answer paged by id marker; onlyIds: what `get` keeps of a
// cloud's answer.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { onlyIds, pageOf } from '../pages.js';

function inst(id, pool = 'p') {
  return {
    id,
    state: { tag: 'running' },
    instanceType: 'small',
    tags: [['berth-pool', pool]],
    addresses: {},
    createdAtMs: undefined,
    connection: { hostKeys: [] },
  };
}

const ids = (instances) => instances.map((i) => i.id);

test('pages cover the whole answer once, in id order', () => {
  const all = [6, 5, 4, 3, 2, 1, 0].map((n) => inst(`i-${n}`));
  const seen = [];
  let cursor;
  let pages = 0;
  for (;;) {
    const page = pageOf(all, cursor, 3);
    assert.ok(page.instances.length <= 3);
    seen.push(...ids(page.instances));
    pages += 1;
    if (page.next === undefined) break;
    cursor = page.next;
  }
  assert.deepEqual(seen, ['i-0', 'i-1', 'i-2', 'i-3', 'i-4', 'i-5', 'i-6']);
  assert.equal(pages, 3);
  // The argument is not reordered.
  assert.deepEqual(ids(all), ['i-6', 'i-5', 'i-4', 'i-3', 'i-2', 'i-1', 'i-0']);
});

test('the cursor is the last id of the page', () => {
  assert.deepEqual(pageOf([inst('b'), inst('a'), inst('c')], undefined, 2), {
    instances: [inst('a'), inst('b')],
    next: 'b',
  });
});

test('edges: empty, exact, a size below 1, a cursor past the end', () => {
  assert.deepEqual(pageOf([], undefined, 3), { instances: [], next: undefined });
  const exact = pageOf([inst('a'), inst('b'), inst('c')], undefined, 3);
  assert.deepEqual([exact.instances.length, exact.next], [3, undefined]);
  const one = pageOf([inst('a'), inst('b')], undefined, 0);
  assert.deepEqual([ids(one.instances), one.next], [['a'], 'a']);
  assert.deepEqual(pageOf([inst('a')], 'z', 5), { instances: [], next: undefined });
});

test('an instance gone between pages moves no other', () => {
  const all = [0, 1, 2, 3, 4, 5].map((n) => inst(`i-${n}`));
  const first = pageOf(all, undefined, 3);
  // `i-1`, on the first page, went away before the second was asked.
  const second = pageOf(all.filter((i) => i.id !== 'i-1'), first.next, 3);
  assert.deepEqual(ids(second.instances), ['i-3', 'i-4', 'i-5']);
  assert.equal(second.next, undefined);
});

test('onlyIds keeps the ids asked, of the pool', () => {
  const found = [inst('i-1'), inst('i-2', 'other'), inst('i-3'), inst('i-4')];
  assert.deepEqual(ids(onlyIds(found, ['i-2', 'i-3', 'i-9'], 'p')), ['i-3']);
  const bare = { ...inst('i-1'), tags: [['name', 'x']] };
  assert.deepEqual(onlyIds([bare], ['i-1'], 'p'), []);
  assert.deepEqual(onlyIds([inst('i-1')], [], 'p'), []);
});
