// berth-driver-sdk: what a berth driver written in JavaScript needs besides
// its cloud's API. See README.md.
//
// The fake host for tests is not here but in 'berth-driver-sdk/testing', so
// it never ends up in a driver's bundle.

export * as auth from './auth.js';
export { defaults, err, notSupported, ok } from './driver.js';
export {
  DEFAULT_RETRY_AFTER_MS,
  DriverError,
  error,
  fromError,
  isDriverError,
  parseRetryAfter,
  responseError,
  statusError,
} from './errors.js';
export { encodeComponent, parseUrl, send } from './http.js';
export * as log from './log.js';
export { onlyIds, pageOf } from './pages.js';
export {
  BERTH_PREFIX,
  IDLE_TAG,
  LABEL_TAG,
  NODE_TAG,
  POOL_TAG,
  SLOTS_TAG,
  SLOT_LABEL_TAG,
  decodeLabel,
  encodeLabel,
  hasAll,
  isBerthTag,
  replaceBerthTags,
  tag,
} from './tags.js';
