// Helpers for the answers of `get` and `list` (contract 0.2), as the Rust
// SDK's `pages` module has them.
//
// The host follows a list's pages itself, one call per page, so a driver
// fetches one page of its cloud's per call and hands back the cloud's cursor
// in the page's `next`. `pageOf` pages an answer the cloud gives whole (a
// cloud without pages). `onlyIds` keeps a cloud's answer to what `get` may
// return.
//
// Instances and pages are the contract's records as componentize-js passes
// them: `{id, state, tags, ...}` and `{instances, next}`, `next` a string or
// `undefined`.

import { POOL_TAG, tag } from './tags.js';

/** Orders two instances by id, as `<` compares strings (and cursors below). */
function byId(a, b) {
  return a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
}

/**
 * Page `cursor` (`undefined`: the first) of `all`, `size` instances a page
 * (at least 1), in id order: `{instances, next}`. The cursor is the id of
 * the last instance of the page before (a marker, as OpenStack's), not an
 * offset: an instance that goes away between two pages moves no other from
 * one page to the next, so none is skipped. `next` is `undefined` on the
 * last page. `all` is not changed.
 */
export function pageOf(all, cursor, size) {
  const n = Math.max(Math.trunc(Number(size)) || 0, 1);
  const rest = [...all]
    .sort(byId)
    .filter((i) => cursor === undefined || cursor === null || i.id > cursor);
  const instances = rest.slice(0, n);
  const next = rest.length > n ? instances[instances.length - 1].id : undefined;
  return { instances, next };
}

/**
 * The instances of `found` whose id is one of `ids` and that carry pool
 * `poolId`'s tag: what `get` answers, from a cloud's answer that may hold
 * more (a filter the cloud applies loosely, a lookup that also finds other
 * pools' instances).
 */
export function onlyIds(found, ids, poolId) {
  const wanted = new Set(ids);
  return found.filter((i) => wanted.has(i.id) && tag(i.tags, POOL_TAG) === poolId);
}
