// berth's tag keys and the rules of `list` and `set-tags`, with the cases of
// the Rust SDK's tests.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  BERTH_PREFIX,
  IDLE_TAG,
  LABEL_TAG,
  NODE_TAG,
  POOL_TAG,
  SLOTS_TAG,
  SLOT_LABEL_TAG,
  hasAll,
  isBerthTag,
  replaceBerthTags,
  tag,
} from '../tags.js';

test('the tag keys', () => {
  assert.equal(BERTH_PREFIX, 'berth-');
  assert.deepEqual(
    [POOL_TAG, NODE_TAG, LABEL_TAG, IDLE_TAG, SLOTS_TAG, SLOT_LABEL_TAG],
    ['berth-pool', 'berth-node', 'berth-label', 'berth-idle', 'berth-slots', 'berth-slot-label'],
  );
});

test('tag finds the first value', () => {
  const tags = [['a', '1'], ['berth-pool', 'p1'], ['a', '2']];
  assert.equal(tag(tags, 'a'), '1');
  assert.equal(tag(tags, POOL_TAG), 'p1');
  assert.equal(tag(tags, 'missing'), undefined);
});

test('hasAll is the rule of list', () => {
  for (const [tags, filter, want] of [
    [[], [], true],
    [[['berth-pool', 'p1']], [], true],
    [[['berth-pool', 'p1'], ['x', 'y']], [['berth-pool', 'p1']], true],
    [[['berth-pool', 'p1']], [['berth-pool', 'p2']], false],
    [[['berth-pool', 'p1']], [['berth-pool', 'p1'], ['berth-node', 'n']], false],
    // A key present with another value does not match.
    [[['berth-node', 'n-1']], [['berth-node', 'n-2']], false],
    // Duplicate keys: any matching pair counts.
    [[['k', '1'], ['k', '2']], [['k', '2']], true],
  ]) {
    assert.equal(hasAll(tags, filter), want, JSON.stringify({ tags, filter }));
  }
});

test('isBerthTag is the prefix, case and all', () => {
  for (const key of [POOL_TAG, NODE_TAG, LABEL_TAG, IDLE_TAG, SLOTS_TAG, SLOT_LABEL_TAG, 'berth-anything']) {
    assert.ok(isBerthTag(key), key);
  }
  for (const key of ['berth', 'Berth-pool', 'name', '']) assert.ok(!isBerthTag(key), key);
});

test('replaceBerthTags replaces berth tags only', () => {
  for (const [existing, next, want] of [
    // Berth tags absent from `next` are removed; others are kept.
    [
      [['Name', 'web'], ['berth-pool', 'p1'], ['berth-node', 'n-1']],
      [['berth-pool', 'p1']],
      [['Name', 'web'], ['berth-pool', 'p1']],
    ],
    // Berth tags in `next` are set, added or changed; others keep their place.
    [
      [['berth-pool', 'p1'], ['env', 'prod'], ['berth-label', 'old']],
      [['berth-pool', 'p1'], ['berth-label', 'new'], ['berth-extra', 'x']],
      [['env', 'prod'], ['berth-pool', 'p1'], ['berth-label', 'new'], ['berth-extra', 'x']],
    ],
    // Non-berth keys in `next` are ignored; existing ones are left alone.
    [[['env', 'prod']], [['env', 'dev'], ['berth-pool', 'p']], [['env', 'prod'], ['berth-pool', 'p']]],
    // An empty `next` removes every berth tag.
    [[['berth-pool', 'p'], ['a', 'b']], [], [['a', 'b']]],
    // The last value of a duplicated key wins.
    [[], [['berth-node', '1'], ['berth-node', '2']], [['berth-node', '2']]],
    // A non-berth key that repeats a berth key's name in `existing` stays.
    [[['a', '1'], ['a', '2']], [['berth-a', '3']], [['a', '1'], ['a', '2'], ['berth-a', '3']]],
  ]) {
    const before = JSON.stringify([existing, next]);
    assert.deepEqual(replaceBerthTags(existing, next), want, before);
    // The arguments are left as they were.
    assert.equal(JSON.stringify([existing, next]), before);
  }
});
