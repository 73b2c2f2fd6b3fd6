// The contract's `error` variant (wit/berth-driver@0.2.0/driver.wit) as JavaScript exceptions,
// and the usual mapping of an HTTP status to its case.
//
// componentize-js turns an exception thrown by an exported function into the
// `err` case of its `result` when the exception has an own `payload`
// property, and the payload is the variant (`{tag, val}`). Any other
// exception traps the call, like a panic in Rust: the host discards the
// instance and starts a fresh one. So every expected failure is thrown as a
// `DriverError`, made by one of the constructors in `error`.

/** The largest `u64`, the type of `retry-after-ms`. */
const U64_MAX = 0xffffffffffffffffn;

/** How long a 429 without a usable `Retry-After` asks to wait. */
export const DEFAULT_RETRY_AFTER_MS = 1000;

/** A failure the host receives as the contract's `error` variant. */
export class DriverError extends Error {
  /**
   * `tag` is the case's name as in the WIT (`'rate-limited'`, …), `val` its
   * payload as componentize-js passes it, `message` what people read.
   */
  constructor(tag, val, message) {
    super(`${tag}: ${message}`);
    this.name = 'DriverError';
    this.payload = { tag, val };
  }
}

/** Whether `e` is an error the host receives as the contract's `error`. */
export function isDriverError(e) {
  return e instanceof DriverError;
}

/** The message of a contract `error` value: its text, or its payload's `message`. */
function messageOf(value) {
  const val = value?.val;
  if (typeof val === 'string') return val;
  if (typeof val?.message === 'string') return val.message;
  return JSON.stringify(val ?? null, (_k, v) => (typeof v === 'bigint' ? v.toString() : v));
}

/**
 * The `DriverError` of a contract `error` value (`{tag, val}`), as an
 * import of the world fails with it (the `auth` import does): throwing it
 * returns the same error from the driver's call.
 */
export function fromError(value) {
  if (value === null || typeof value !== 'object' || typeof value.tag !== 'string') {
    throw new TypeError(`not a contract error: ${value}`);
  }
  return new DriverError(value.tag, value.val, messageOf(value));
}

/** `ms` as a `u64` (a `BigInt`), saturated; throws on a negative or fraction. */
function u64(ms) {
  const big = typeof ms === 'bigint' ? ms : Number.isInteger(ms) ? BigInt(ms) : undefined;
  if (big === undefined || big < 0n) {
    throw new RangeError(`retry-after must be a whole number of milliseconds, not ${ms}`);
  }
  return big > U64_MAX ? U64_MAX : big;
}

// One constructor per case of the contract's `error`, named as in the WIT in
// camelCase. Each returns the `DriverError` to throw.
export const error = Object.freeze({
  /**
   * The cloud throttles; the host makes no call of this kind for
   * `retryAfterMs` (a number or a `BigInt`).
   */
  rateLimited: (retryAfterMs, message) =>
    new DriverError('rate-limited', { retryAfterMs: u64(retryAfterMs), message }, message),
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
  /** Credentials were rejected or lack a permission: an operator must fix access. */
  unauthorized: (message) => new DriverError('unauthorized', message, message),
  /** The config or label options are wrong; the message names the field. */
  invalidConfig: (message) => new DriverError('invalid-config', message, message),
  /** May go away on retry (network errors, 5xx). */
  transient: (message) => new DriverError('transient', message, message),
  /** Will not go away on retry. */
  permanent: (message) => new DriverError('permanent', message, message),
});

const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];
const DAY = '(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)';
const MON = `(${MONTHS.join('|')})`;
const TIME = '(\\d{2}):(\\d{2}):(\\d{2})';
// The three forms of an HTTP-date (RFC 9110, section 5.6.7).
const IMF_FIXDATE = new RegExp(`^${DAY}, (\\d{2}) ${MON} (\\d{4}) ${TIME} GMT$`);
const RFC_850 = new RegExp(
  `^(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday), (\\d{2})-${MON}-(\\d{2}) ${TIME} GMT$`,
);
const ASCTIME = new RegExp(`^${DAY} ${MON} ([ \\d]\\d) ${TIME} (\\d{4})$`);

/** The time an HTTP-date names, in milliseconds since the epoch, if it is one. */
function httpDate(text, now) {
  let m = IMF_FIXDATE.exec(text);
  let day;
  let month;
  let year;
  let clock;
  if (m) {
    [day, month, year, clock] = [m[1], m[2], Number(m[3]), m.slice(4, 7)];
  } else if ((m = RFC_850.exec(text))) {
    [day, month, clock] = [m[1], m[2], m.slice(4, 7)];
    // A two-digit year more than 50 years ahead is in the past century.
    const thisYear = new Date(now).getUTCFullYear();
    year = 2000 + Number(m[3]);
    while (year > thisYear + 50) year -= 100;
  } else if ((m = ASCTIME.exec(text))) {
    [month, day, clock, year] = [m[1], m[2].trim(), m.slice(3, 6), Number(m[6])];
  } else {
    return undefined;
  }
  const [h, min, s] = clock.map(Number);
  const mon = MONTHS.indexOf(month);
  const d = Number(day);
  if (h > 23 || min > 59 || s > 60) return undefined;
  const at = Date.UTC(year, mon, d, h, min, Math.min(s, 59));
  // Date.UTC rolls 31 Feb over into March; such a date is not one.
  if (new Date(at).getUTCDate() !== d) return undefined;
  return at;
}

/**
 * How long a `Retry-After` header value asks to wait, in milliseconds as a
 * `BigInt` (a `u64`, saturated): whole seconds (`"120"`), or an HTTP-date
 * (`"Wed, 21 Oct 2015 07:28:00 GMT"`) minus `now` (milliseconds since the
 * epoch; `Date.now()` by default), never below zero. `undefined` when the
 * value is absent or neither form.
 */
export function parseRetryAfter(value, now = Date.now()) {
  if (value === undefined || value === null) return undefined;
  const text = String(value).trim();
  // Whole seconds, with the optional `+` the Rust drivers' `u64` parse takes.
  if (/^\+?[0-9]+$/.test(text)) {
    const secs = BigInt(text);
    if (secs > U64_MAX) return undefined;
    const ms = secs * 1000n;
    return ms > U64_MAX ? U64_MAX : ms;
  }
  const at = httpDate(text, now);
  if (at === undefined) return undefined;
  return at > now ? BigInt(Math.ceil(at - now)) : 0n;
}

/**
 * The contract error for an HTTP error status, the usual mapping:
 *
 * | status | case |
 * | --- | --- |
 * | 429 | `rate-limited`, waiting as `retryAfter` asks (else one second) |
 * | 401, 403 | `unauthorized` (the host adds the credentials, so the operator's are wrong or lack a permission) |
 * | 404 | `not-found` (for `delete`: already gone) |
 * | 500–599 | `transient` |
 * | anything else | `permanent` |
 *
 * `options`:
 * - `retryAfter`: the response's `Retry-After` header (seconds or an
 *   HTTP-date), or `undefined`;
 * - `now`: the time in milliseconds since the epoch, for an HTTP-date
 *   (`Date.now()` by default);
 * - `defaultRetryAfterMs`: the wait when `retryAfter` gives none (1000);
 * - `overrides`: `{[status]: (message, status) => DriverError | undefined}`,
 *   consulted first, for a cloud whose statuses mean something else (a 403
 *   for a quota, a 409 that is worth a retry); `undefined` falls through to
 *   the mapping above.
 */
export function statusError(status, message, options = {}) {
  const override = options.overrides?.[status];
  if (override !== undefined) {
    const mapped = override(message, status);
    if (mapped !== undefined) return mapped;
  }
  if (status === 429) {
    const wait = parseRetryAfter(options.retryAfter, options.now ?? Date.now());
    return error.rateLimited(wait ?? options.defaultRetryAfterMs ?? DEFAULT_RETRY_AFTER_MS, message);
  }
  if (status === 401 || status === 403) return error.unauthorized(message);
  if (status === 404) return error.notFound(message);
  if (status >= 500 && status <= 599) return error.transient(message);
  return error.permanent(message);
}

/**
 * `statusError` for a response from `send`: its status, its `Retry-After`
 * header, and as the message `options.message` or
 * `"<METHOD> <url> answered <status>: <first 200 characters of the body>"`
 * when the response knows its request, else `"answered <status>: …"`.
 */
export function responseError(resp, options = {}) {
  const excerpt = [...(resp.text ?? '')].slice(0, 200).join('');
  const what = resp.request ? `${resp.request.method} ${resp.request.url} answered` : 'answered';
  const message = options.message ?? `${what} ${resp.status}: ${excerpt}`;
  return statusError(resp.status, message, {
    ...options,
    retryAfter: options.retryAfter ?? resp.header?.('retry-after') ?? undefined,
  });
}
