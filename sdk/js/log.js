// Structured records in the host's log, attributed to the driver: the
// `berth:driver/log` import inside a component, the fake host's list in tests
// (see testing.js), nowhere otherwise. The host rate-limits and truncates
// records and never fails the call. Never log secrets; a driver should not
// have any to log.

import { log as hostLog } from '#host';

/** The contract's log levels, least severe first. */
export const LEVELS = Object.freeze(['trace', 'debug', 'info', 'warn', 'error']);

/** `fields` as `[key, value]` string pairs, from pairs or an object. */
function pairs(fields) {
  const list = Array.isArray(fields) ? fields : Object.entries(fields ?? {});
  return list.map(([k, v]) => [String(k), String(v)]);
}

/**
 * Writes one record at `level` (one of `LEVELS`); `fields` are shown beside
 * the message, as `[key, value]` pairs or an object.
 */
export function log(level, message, fields = []) {
  if (!LEVELS.includes(level)) throw new TypeError(`log: unknown level ${JSON.stringify(level)}`);
  hostLog(level, String(message), pairs(fields));
}

/** A record at `trace`. */
export const trace = (message, fields) => log('trace', message, fields);
/** A record at `debug`. */
export const debug = (message, fields) => log('debug', message, fields);
/** A record at `info`. */
export const info = (message, fields) => log('info', message, fields);
/** A record at `warn`. */
export const warn = (message, fields) => log('warn', message, fields);
/** A record at `error`. */
export const error = (message, fields) => log('error', message, fields);
