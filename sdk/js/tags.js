// berth's tag conventions, the rules of `list` and `set-tags`, and the label
// encoding for clouds that restrict label values.
//
// Tags are a list of `[key, value]` pairs, as componentize-js passes the
// contract's `list<tuple<string, string>>`. berth's own keys all start with
// `BERTH_PREFIX`; a driver stores every tag verbatim and returns it verbatim,
// because after a restart the cloud's tags are the only record of which
// instances belong to which pool.

/** The prefix of every tag key berth owns. */
export const BERTH_PREFIX = 'berth-';
/** The tag naming the pool an instance belongs to; its value is the pool id. */
export const POOL_TAG = 'berth-pool';
/** The tag naming the berth node an instance serves. */
export const NODE_TAG = 'berth-node';
/** The tag naming the label an instance was created for. */
export const LABEL_TAG = 'berth-label';
/** The tag holding a node's idle behaviour (`run`, `hold`, `drain`). */
export const IDLE_TAG = 'berth-idle';
/** The tag on a backing instance: how many slots it has. */
export const SLOTS_TAG = 'berth-slots';
/** The tag on a backing instance: the slot label its slots serve. */
export const SLOT_LABEL_TAG = 'berth-slot-label';

/** The value of the first tag named `key`, or `undefined`. */
export function tag(tags, key) {
  return tags.find(([k]) => k === key)?.[1];
}

/** Whether `key` is one of berth's own tag keys. */
export function isBerthTag(key) {
  return key.startsWith(BERTH_PREFIX);
}

/**
 * Whether `tags` carries every `[key, value]` pair of `filter` (the rule of
 * `list`). An empty filter matches everything.
 */
export function hasAll(tags, filter) {
  return filter.every(([fk, fv]) => tags.some(([k, v]) => k === fk && v === fv));
}

/**
 * The tags an instance ends up with after `set-tags(next)` on an instance
 * tagged `existing`: every berth tag of `existing` is dropped, every other
 * tag is kept in place, then the berth tags of `next` are appended in order.
 * Entries of `next` that are not berth tags are ignored, since `set-tags`
 * leaves the cloud's other tags alone; when `next` names a key twice, the
 * last value wins. Returns new pairs; the arguments are not changed.
 */
export function replaceBerthTags(existing, next) {
  const out = existing.filter(([k]) => !isBerthTag(k)).map(([k, v]) => [k, v]);
  const kept = out.length;
  for (const [k, v] of next) {
    if (!isBerthTag(k)) continue;
    const slot = out.slice(kept).find(([ok]) => ok === k);
    if (slot) slot[1] = v;
    else out.push([k, v]);
  }
  return out;
}

// The label encoding. Some clouds restrict label values (GCP, Hetzner and
// Kubernetes labels: lowercase letters, digits, `-` and `_`, at most 63
// characters, alphanumeric at both ends), while berth's tag values are any
// text. `encodeLabel` maps any text into that alphabet and `decodeLabel` back,
// the same in every berth SDK:
//
// for each character c (Unicode code point) at index i of n characters:
// `a`-`y` and `0`-`9` are kept; `-` and `_` are kept when 0 < i < n-1;
// anything else (`z` too) becomes, for each byte b of c's UTF-8 encoding,
// `z` followed by b as two lowercase hex digits.
//
// Text that is already a valid label without `z` is unchanged. The length
// limit is the caller's: each character becomes at most 12 (a 4-byte UTF-8
// character), so check `encodeLabel(value).length <= 63` before writing it.

const utf8 = new TextEncoder();

/** Whether code point `c` (a one-character string) is kept as it is at `i` of `n`. */
function kept(c, i, n) {
  if ((c >= 'a' && c <= 'y') || (c >= '0' && c <= '9')) return true;
  return (c === '-' || c === '_') && i > 0 && i < n - 1;
}

/**
 * `value` in the label alphabet (see above): lowercase letters, digits, `-`
 * and `_`, alphanumeric at both ends (or empty). Throws a `TypeError` for a
 * string with a lone surrogate, which is not Unicode text.
 */
export function encodeLabel(value) {
  const chars = [...value];
  let out = '';
  chars.forEach((c, i) => {
    if (kept(c, i, chars.length)) {
      out += c;
      return;
    }
    const cp = c.codePointAt(0);
    if (cp >= 0xd800 && cp <= 0xdfff) {
      throw new TypeError(`encodeLabel: lone surrogate at character ${i}`);
    }
    for (const b of utf8.encode(c)) out += `z${b.toString(16).padStart(2, '0')}`;
  });
  return out;
}

/**
 * The text `encodeLabel` turned into `label`. Accepts only what `encodeLabel`
 * can produce and throws a `RangeError` naming the first problem otherwise:
 * a character outside `a-z 0-9 - _`, a `z` not followed by two lowercase hex
 * digits, an escape of a byte that would have been kept as it is, `-` or `_`
 * at either end, or escapes that are not UTF-8.
 */
export function decodeLabel(label) {
  const bad = (why) => new RangeError(`invalid encoded label ${JSON.stringify(label)}: ${why}`);
  const bytes = [];
  for (let at = 0; at < label.length; ) {
    const c = label[at];
    if (c === 'z') {
      const hex = label.slice(at + 1, at + 3);
      if (!/^[0-9a-f]{2}$/.test(hex)) {
        throw bad(`"z" at ${at} is not followed by two lowercase hex digits`);
      }
      bytes.push(parseInt(hex, 16));
      at += 3;
    } else if (/^[a-y0-9_-]$/.test(c)) {
      bytes.push(c.charCodeAt(0));
      at += 1;
    } else {
      throw bad(`${JSON.stringify(c)} at ${at} is not a label character`);
    }
  }
  let text;
  try {
    text = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(
      new Uint8Array(bytes),
    );
  } catch {
    throw bad('the escapes are not UTF-8');
  }
  // Every string has one encoding: anything else (an escaped `a`, a literal
  // `-` at an end, an escaped `-` in the middle) is refused.
  if (encodeLabel(text) !== label) {
    const first = [...label][0];
    const last = [...label].at(-1);
    if (first === '-' || first === '_' || last === '-' || last === '_') {
      throw bad('"-" and "_" are escaped at either end');
    }
    throw bad('escapes a character that is written as it is');
  }
  return text;
}
