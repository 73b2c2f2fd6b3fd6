// The sim's wire format (docs/sim-cloud.md) and its conversion to the
// contract's types. Responses are read leniently (unknown fields ignored,
// absent optional ones defaulted) so a newer sim does not break an older
// driver; a field of the wrong type is a `transient` error, as a body that is
// not the sim's JSON at all (the response's `json()` throws that one).

import { error, statusError } from 'berth-driver-sdk';

const STATES = new Set(['pending', 'running', 'stopping', 'terminated']);

/**
 * The sim's `state` as the contract's variant: `{tag}`, or `{tag: 'failed',
 * val}` with the sim's `fault`, why the instance will never run.
 */
export function readState(i) {
  const state = string(i.state, 'state');
  if (state === 'failed') return { tag: 'failed', val: optional(i.fault, 'fault', string) ?? '' };
  return { tag: STATES.has(state) ? state : 'unknown' };
}

/** One instance as the sim reports it, as the contract's `instance`. */
export function readInstance(json) {
  const i = object(json, 'instance');
  const tags = optional(i.tags, 'tags', (t) => object(t, 'tags')) ?? {};
  const entries = Object.entries(tags).map(([k, v]) => [k, string(v, `tags.${k}`)]);
  // Sorted by key, as the Rust driver's map returns them.
  entries.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return {
    id: string(i.id, 'id'),
    state: readState(i),
    instanceType: string(i.instance_type, 'instance_type'),
    tags: entries,
    addresses: {
      publicIpv4: optional(i.public_ipv4, 'public_ipv4', string),
      privateIpv4: optional(i.private_ipv4, 'private_ipv4', string),
      ipv6: undefined,
      hostname: optional(i.hostname, 'hostname', string),
    },
    createdAtMs: optional(i.created_at_ms, 'created_at_ms', (n, what) =>
      BigInt(integer(n, what, Number.MAX_SAFE_INTEGER)),
    ),
    connection: {
      username: optional(i.username, 'username', string),
      port: optional(i.ssh_port, 'ssh_port', (n, what) => integer(n, what, 65535)),
      hostKeys: [],
    },
  };
}

/** `GET /v1/instances`: `{instances, nextPageToken}`. */
export function readPage(json) {
  const page = object(json, 'page');
  if (!Array.isArray(page.instances)) throw bad('instances', 'an array');
  return {
    instances: page.instances.map(readInstance),
    nextPageToken: optional(page.next_page_token, 'next_page_token', string),
  };
}

/** `GET /v1/limits`, as the contract's `account-limits`. */
export function readLimits(json) {
  const body = object(json, 'limits');
  const u32 = (n, what) => integer(n, what, 0xffffffff);
  return {
    maxInstances: optional(body.max_instances, 'max_instances', u32),
    usedInstances: optional(body.used_instances, 'used_instances', u32),
    maxCores: undefined,
    usedCores: undefined,
    maxRamMib: undefined,
    usedRamMib: undefined,
  };
}

/**
 * Turns a failed sim response (`{status, header(name), text}`) into the
 * contract's error: the one place the sim's statuses and codes are mapped.
 * `instanceType` is the type a create asked for, when the call was a create.
 */
export function apiError(resp, instanceType) {
  let body = {};
  try {
    const parsed = JSON.parse(resp.text);
    if (parsed !== null && typeof parsed === 'object') body = parsed;
  } catch {
    // Not the sim's JSON (a proxy's error page, say): status alone decides.
  }
  const detail = body.error !== null && typeof body.error === 'object' ? body.error : {};
  const code = typeof detail.code === 'string' ? detail.code : '';
  const message =
    typeof detail.message === 'string' && detail.message !== ''
      ? detail.message
      : `sim answered ${resp.status}: ${[...resp.text].slice(0, 200).join('')}`;
  const status = resp.status;
  // The sim says how long to wait in its body; else the SDK's mapping reads
  // the `Retry-After` header.
  if (status === 429 && Number.isSafeInteger(body.retry_after_ms) && body.retry_after_ms >= 0) {
    return error.rateLimited(body.retry_after_ms, message);
  }
  if (status === 403 && code === 'quota_exceeded') return error.quotaExceeded(message);
  if (status === 503 && code === 'insufficient_capacity') {
    const type = typeof body.instance_type === 'string' ? body.instance_type : instanceType;
    return type === undefined
      ? error.capacityGeneral(message)
      : error.capacityForType(type, message);
  }
  // 429 waits as `Retry-After` says (else 1 s), 401 and 403 are
  // unauthorized, 404 not-found, 5xx transient, anything else permanent.
  return statusError(status, message, { retryAfter: resp.header('retry-after') });
}

function bad(what, expected) {
  return error.transient(`response: ${what}: expected ${expected}`);
}

function object(value, what) {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw bad(what, 'an object');
  }
  return value;
}

function string(value, what) {
  if (typeof value !== 'string') throw bad(what, 'a string');
  return value;
}

function integer(value, what, max) {
  if (!Number.isInteger(value) || value < 0 || value > max) {
    throw bad(what, `an integer from 0 to ${max}`);
  }
  return value;
}

/** `read(value, what)` unless the field is absent or null. */
function optional(value, what, read) {
  return value === undefined || value === null ? undefined : read(value, what);
}
