// The contract's shapes as componentize-js passes them between JavaScript and
// the host (wit/driver.wit): error constructors, berth's tag rules and the
// conversion to `result` errors. Nothing here talks to the network, so node
// runs it in the unit tests.

/** The prefix of every tag key berth owns. */
export const BERTH_PREFIX = 'berth-';
/** The tag naming the pool an instance belongs to; its value is the pool id. */
export const POOL_TAG = 'berth-pool';

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
 * A failure the host receives as the contract's `error` variant.
 *
 * componentize-js turns an exception thrown by an exported function into the
 * `err` case of its `result` when the exception has an own `payload`
 * property, and the payload is the variant (`{tag, val}`). Any other
 * exception traps the call, like a panic in Rust: the host discards the
 * instance and starts a fresh one. So every expected failure is thrown as a
 * `DriverError`.
 */
export class DriverError extends Error {
  constructor(tag, val, message) {
    super(`${tag}: ${message}`);
    this.name = 'DriverError';
    this.payload = { tag, val };
  }
}

// One constructor per case of the contract's `error`, named as in the WIT.
export const error = {
  /** The cloud throttles; make no call of this kind for `retryAfterMs`. */
  rateLimited: (retryAfterMs, message) =>
    new DriverError('rate-limited', { retryAfterMs: BigInt(retryAfterMs), message }, message),
  /** An account quota was hit; no creates until an instance goes away. */
  quotaExceeded: (message) => new DriverError('quota-exceeded', message, message),
  /** The cloud has no capacity for this instance type; others may work. */
  capacityForType: (instanceType, message) =>
    new DriverError(
      'capacity',
      { scope: { tag: 'instance-type', val: instanceType }, message },
      message,
    ),
  /** The cloud can launch nothing right now. */
  capacityGeneral: (message) =>
    new DriverError('capacity', { scope: { tag: 'general' }, message }, message),
  /** The instance does not exist (for `delete`, the host counts it as success). */
  notFound: (message) => new DriverError('not-found', message, message),
  /** Credentials were rejected or lack a permission. */
  unauthorized: (message) => new DriverError('unauthorized', message, message),
  /** The config or label options are wrong; the message names the field. */
  invalidConfig: (message) => new DriverError('invalid-config', message, message),
  /** May go away on retry (network errors, 5xx). */
  transient: (message) => new DriverError('transient', message, message),
  /** Will not go away on retry. */
  permanent: (message) => new DriverError('permanent', message, message),
};
