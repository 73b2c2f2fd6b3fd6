// The label encoding: the vectors every berth SDK shares, what decoding
// refuses, and a randomized round trip.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { decodeLabel, encodeLabel } from '../tags.js';

/** The shared vectors: text and its encoding. */
const VECTORS = [
  ['', ''],
  ['ci-pool', 'ci-pool'],
  ['n-00000000000000ab', 'n-00000000000000ab'],
  ['zuul', 'z7auul'],
  ['My.pool', 'z4dyz2epool'],
  ['My.Pool', 'z4dyz2ez50ool'],
  ['-edge_', 'z2dedgez5f'],
  ['é', 'zc3za9'],
  // More of the rules.
  ['a', 'a'],
  ['-', 'z2d'],
  ['a-', 'az2d'],
  ['a_b', 'a_b'],
  ['a--b', 'a--b'],
  ['z', 'z7a'],
  ['A', 'z41'],
  [' ', 'z20'],
  ['🚀', 'zf0z9fz9az80'],
  ['\u0000', 'z00'],
  ['\ufeff', 'zefzbbzbf'],
];

/** What a cloud accepts: the label alphabet, alphanumeric at both ends. */
const LABEL = /^(?:[a-z0-9](?:[a-z0-9_-]*[a-z0-9])?)?$/;

test('the shared vectors encode and decode', () => {
  for (const [text, encoded] of VECTORS) {
    assert.equal(encodeLabel(text), encoded, JSON.stringify(text));
    assert.equal(decodeLabel(encoded), text, encoded);
    assert.match(encoded, LABEL);
  }
});

test('decoding refuses what encoding cannot produce', () => {
  for (const [label, why] of [
    ['Abc', 'not a label character'],
    ['a.b', 'not a label character'],
    ['a b', 'not a label character'],
    ['é', 'not a label character'],
    ['z', 'two lowercase hex digits'],
    ['z4', 'two lowercase hex digits'],
    ['z4D', 'two lowercase hex digits'],
    ['zg0', 'two lowercase hex digits'],
    ['az', 'two lowercase hex digits'],
    // An escape of a byte written as it is.
    ['z61', 'written as it is'],
    ['z30', 'written as it is'],
    ['az2db', 'written as it is'],
    ['az5fb', 'written as it is'],
    // "-" and "_" at either end are escaped.
    ['-a', 'either end'],
    ['a_', 'either end'],
    ['_', 'either end'],
    // Not UTF-8: a lone continuation byte, a cut sequence, an overlong
    // form, a surrogate, a lead byte followed by a literal.
    ['z80', 'not UTF-8'],
    ['zc3', 'not UTF-8'],
    ['zc0zaf', 'not UTF-8'],
    ['zedza0z80', 'not UTF-8'],
    ['zc3a', 'not UTF-8'],
  ]) {
    assert.throws(() => decodeLabel(label), (e) => e instanceof RangeError && e.message.includes(why), label);
  }
});

test('a lone surrogate is not text', () => {
  assert.throws(() => encodeLabel('a\ud800b'), TypeError);
});

/** A small seeded generator (mulberry32), so a failure can be replayed. */
function random(seed) {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

test('random text round-trips and always encodes to a label', () => {
  const seed = Number(process.env.LABEL_SEED ?? Date.now() % 1000000);
  const next = random(seed);
  const pools = [
    'abcdefghijklmnopqrstuvwxyz0123456789',
    '-_z',
    'ABCXYZ .:/@+=',
    'éüßñ€中文',
    ['🚀', '😀', '\u{10ffff}', '\u{1f600}'],
    ['\u0000', '\u007f', '\u0080', '\ufeff', '\uffff'],
  ];
  for (let round = 0; round < 2000; round += 1) {
    let text = '';
    const len = Math.floor(next() * 12);
    for (let i = 0; i < len; i += 1) {
      const pool = [...pools[Math.floor(next() * pools.length)]];
      text += pool[Math.floor(next() * pool.length)];
    }
    const encoded = encodeLabel(text);
    const where = `seed ${seed} (LABEL_SEED=${seed} replays it), text ${JSON.stringify(text)}`;
    assert.match(encoded, LABEL, where);
    assert.equal(decodeLabel(encoded), text, where);
  }
});
