// {{name}}: a berth driver written in JavaScript.
//
// As generated, it drives the instance API of berth's simulated cloud
// (`berth sim`), so it builds, passes `berth driver check` and passes
// `berth driver test` against a running sim before you change a line. Every
// place that speaks the sim's API is marked `CLOUD:`; replace those with your
// cloud's calls and JSON, and keep the rest.
//
// componentize-js binds the world's exported interface `berth:driver/driver`
// to the object this module exports as `driver`; WIT names become camelCase
// (`set-tags` is `setTags`). A returned value is the `ok` case of a result, a
// thrown `DriverError` (the SDK's `error.*`) the `err` case; any other
// exception traps, and the host replaces the instance. Requests block (the
// SDK's `send`), so every function is synchronous. The SDK's `defaults`
// answer the batch calls (`createMany`, `deleteMany`) as not supported,
// which is right for a driver that does not declare them.

import {
  POOL_TAG,
  defaults,
  encodeComponent,
  error,
  hasAll,
  isBerthTag,
  onlyIds,
  parseUrl,
  responseError,
  send,
} from 'berth-driver-sdk';

/** Keep it equal to package.json's `version`. */
const VERSION = '0.1.0';

/** CLOUD: the largest page your cloud's list call returns. */
const MAX_PAGE_SIZE = 1000;

/**
 * What `configure` accepted: `{poolId, endpoint, pageSize}`. It is the one
 * thing kept between calls: the host may run several instances of the driver
 * side by side, so whatever a call needs is asked of the cloud again.
 */
let config;

function configured() {
  if (config === undefined) throw error.invalidConfig('driver not configured');
  return config;
}

export const driver = {
  // createMany, deleteMany: not supported, a `permanent` error for each item.
  // The host calls them only when `describe` declares the capability.
  ...defaults,

  describe() {
    return {
      name: '{{name}}',
      version: VERSION,
      // CLOUD: say which cloud this driver manages.
      description: "Machines on berth's simulated cloud (`berth sim`).",
      config: [
        {
          name: 'endpoint',
          fieldType: 'string',
          required: true,
          default: undefined,
          doc:
            "Base URL of the cloud's API, for example `http://127.0.0.1:8181`. " +
            "Its host must also be in the provider's allowed hosts.",
        },
        {
          name: 'page_size',
          fieldType: 'integer',
          required: false,
          default: undefined,
          doc: `Instances per list page, 1 to ${MAX_PAGE_SIZE}; absent: the cloud's default.`,
        },
      ],
      labelOptions: [],
      // Set userData and sshKeys too once `create` passes them on.
      capabilities: { idempotentCreate: true, accountLimits: true },
    };
  },

  configure(poolId, text) {
    config = parseConfig(poolId, text);
  },

  create(spec) {
    const c = configured();
    // `describe` declares no label options, so `{}` is all it accepts.
    if (JSON.stringify(parseJson(spec.options, 'label options')) !== '{}') {
      throw error.invalidConfig(`label options: this driver takes none, got ${spec.options}`);
    }
    const tags = Object.fromEntries(spec.tags);
    tags[POOL_TAG] = c.poolId; // never create outside this pool
    // CLOUD: your cloud's create call.
    const resp = send('POST', `${c.endpoint}/v1/instances`, {
      instance_type: spec.instanceType,
      image: spec.image,
      tags,
      // berth's create token is the idempotency key: a create tried twice
      // makes one instance.
      client_token: spec.token,
    });
    if (resp.status !== 200 && resp.status !== 201) throw apiError(resp, spec.instanceType);
    return toInstance(resp.json());
  },

  get(ids) {
    const c = configured();
    if (ids.length === 0) return [];
    // CLOUD: a lookup of just these ids (a filter by id, or one call each),
    // never a list of everything. The host asks for at most 100, which one
    // page of the largest size holds.
    let query = `tag:${POOL_TAG}=${encodeComponent(c.poolId)}&page_size=${MAX_PAGE_SIZE}`;
    for (const id of ids) query += `&id=${encodeComponent(id)}`;
    const resp = send('GET', `${c.endpoint}/v1/instances?${query}`);
    if (resp.status !== 200) throw apiError(resp);
    // Only the ids asked, and only this pool's.
    return onlyIds(toPage(resp.json()).instances, ids, c.poolId);
  },

  list(filter, cursor) {
    const c = configured();
    // A filter naming another pool matches nothing this driver may see.
    if (filter.some(([k, v]) => k === POOL_TAG && v !== c.poolId)) {
      return { instances: [], next: undefined };
    }
    const wanted = [[POOL_TAG, c.poolId], ...filter.filter(([k]) => k !== POOL_TAG)];
    // CLOUD: your cloud's list call, filtered by tag on the cloud's side
    // where it can. One page per call: the host asks for the next one with
    // the cursor given back in `next`.
    let query = wanted.map(([k, v]) => `tag:${encodeComponent(k)}=${encodeComponent(v)}`).join('&');
    if (c.pageSize !== undefined) query += `&page_size=${c.pageSize}`;
    if (cursor !== undefined) query += `&page_token=${encodeComponent(cursor)}`;
    const resp = send('GET', `${c.endpoint}/v1/instances?${query}`);
    if (resp.status !== 200) throw apiError(resp);
    const page = toPage(resp.json());
    if (page.next !== undefined && page.next === cursor) {
      // The host would loop until the call's deadline.
      throw error.transient(`list: the cloud repeated page token ${JSON.stringify(cursor)}`);
    }
    // Only this pool's instances, and only those with every filter tag.
    return { instances: page.instances.filter((i) => hasAll(i.tags, wanted)), next: page.next };
  },

  delete(instanceId) {
    const c = configured();
    // CLOUD: your cloud's delete call.
    const resp = send('DELETE', instanceUrl(c, instanceId));
    // 404 becomes not-found, which the host counts as already gone.
    if (!resp.ok) throw apiError(resp);
  },

  setTags(instanceId, tags) {
    const c = configured();
    if (tags.some(([k, v]) => k === POOL_TAG && v !== c.poolId)) {
      throw error.permanent('set-tags cannot move an instance to another pool');
    }
    // Only berth's tags are replaced, and the pool tag always stays.
    const next = Object.fromEntries(tags.filter(([k]) => isBerthTag(k)));
    next[POOL_TAG] = c.poolId;
    // CLOUD: the sim replaces every `berth-` tag and keeps the others. On a
    // cloud that only adds and removes tags, read the instance's tags and
    // compute the result with the SDK's `replaceBerthTags`.
    const resp = send('PUT', `${instanceUrl(c, instanceId)}/tags`, { tags: next });
    if (!resp.ok) throw apiError(resp);
  },

  limits() {
    const c = configured();
    // CLOUD: your cloud's quota and usage call.
    const resp = send('GET', `${c.endpoint}/v1/limits`);
    if (resp.status !== 200) throw apiError(resp);
    const body = resp.json();
    return {
      maxInstances: field(body, 'max_instances', 'integer', true),
      usedInstances: field(body, 'used_instances', 'integer', true),
      maxCores: undefined,
      usedCores: undefined,
      maxRamMib: undefined,
      usedRamMib: undefined,
    };
  },
};

/**
 * The provider config, checked: `invalid-config` names every wrong field at
 * once.
 */
export function parseConfig(poolId, text) {
  const raw = parseJson(text, 'provider config');
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) {
    throw error.invalidConfig('provider config: must be a JSON object');
  }
  const problems = Object.keys(raw)
    .filter((key) => key !== 'endpoint' && key !== 'page_size')
    .map((key) => `${key}: unknown field`);
  let endpoint = '';
  if (typeof raw.endpoint !== 'string') {
    problems.push('endpoint: required, a URL');
  } else {
    endpoint = raw.endpoint.replace(/\/+$/, '');
    const parsed = parseUrl(endpoint);
    if (parsed.why) problems.push(`endpoint: ${parsed.why}`);
    else if (parsed.url.pathAndQuery.includes('?')) problems.push('endpoint: must not have a query');
  }
  const pageSize = raw.page_size ?? undefined;
  if (pageSize !== undefined && !(Number.isInteger(pageSize) && pageSize >= 1 && pageSize <= MAX_PAGE_SIZE)) {
    problems.push(`page_size: must be an integer from 1 to ${MAX_PAGE_SIZE}`);
  }
  if (poolId === '') problems.push('pool id: must not be empty');
  if (problems.length > 0) throw error.invalidConfig(problems.join('; '));
  return { poolId, endpoint, pageSize };
}

/**
 * How a failed response becomes the contract's error.
 *
 * CLOUD: the sim names its failures in the body, `{"error": {"code",
 * "message"}}`. Check your cloud's own codes first (a quota, no capacity, a
 * 403 that means a quota), then let the SDK map the status: 429 rate-limited
 * for as long as `Retry-After` says, 401 and 403 unauthorized, 404 not-found,
 * 5xx transient, the rest permanent.
 */
export function apiError(resp, instanceType) {
  let code = '';
  let message;
  try {
    const detail = JSON.parse(resp.text).error;
    if (typeof detail.code === 'string' && typeof detail.message === 'string') {
      ({ code, message } = detail);
    }
  } catch {
    // Not the cloud's JSON (a proxy's error page, say): the status decides.
  }
  if (resp.status === 403 && code === 'quota_exceeded') return error.quotaExceeded(message);
  if (resp.status === 503 && code === 'insufficient_capacity') {
    return instanceType === undefined
      ? error.capacityGeneral(message)
      : error.capacityForType(instanceType, message);
  }
  return responseError(resp, { message });
}

// CLOUD: your cloud's JSON, as the contract's types. A field of the wrong
// type is a `transient` error, as is a body that is not JSON at all.

const STATES = new Set(['pending', 'running', 'stopping', 'terminated']);

/** The cloud's state as the contract's variant, `{tag}` or `{tag: 'failed', val}`. */
export function toState(json) {
  const state = field(json, 'state', 'string');
  if (state === 'failed') {
    // The cloud gave up on it, and says why; berth replaces it at once.
    return { tag: 'failed', val: field(json, 'fault', 'string', true) ?? '' };
  }
  return { tag: STATES.has(state) ? state : 'unknown' };
}

/** One page of the cloud's list: `{instances, next}`, `next` undefined on the last. */
function toPage(json) {
  return {
    instances: field(json, 'instances', 'array').map(toInstance),
    next: field(json, 'next_page_token', 'string', true),
  };
}

export function toInstance(json) {
  const tags = field(json, 'tags', 'object', true) ?? {};
  const optional = (key) => field(json, key, 'string', true);
  const createdAt = field(json, 'created_at_ms', 'integer', true);
  return {
    id: field(json, 'id', 'string'),
    state: toState(json),
    instanceType: field(json, 'instance_type', 'string'),
    // Every tag, verbatim: after a restart they are berth's only record.
    tags: Object.keys(tags)
      .sort()
      .map((k) => [k, field(tags, k, 'string')]),
    addresses: {
      publicIpv4: optional('public_ipv4'),
      privateIpv4: optional('private_ipv4'),
      ipv6: undefined,
      hostname: optional('hostname'),
    },
    createdAtMs: createdAt === undefined ? undefined : BigInt(createdAt),
    connection: {
      username: optional('username'),
      port: field(json, 'ssh_port', 'integer', true),
      hostKeys: [],
    },
  };
}

/**
 * `obj[key]`, which must be of `kind` (`string`, `integer` (at least 0),
 * `object` or `array`), or absent or null when `optional` (then `undefined`).
 */
function field(obj, key, kind, optional = false) {
  const value = obj !== null && typeof obj === 'object' ? obj[key] : undefined;
  if ((value === undefined || value === null) && optional) return undefined;
  const ok = {
    string: typeof value === 'string',
    integer: Number.isSafeInteger(value) && value >= 0,
    object: value !== null && typeof value === 'object' && !Array.isArray(value),
    array: Array.isArray(value),
  }[kind];
  if (!ok) throw error.transient(`response: ${key}: expected ${kind}`);
  return value;
}

function parseJson(text, what) {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw error.invalidConfig(`${what}: ${e.message}`);
  }
}

function instanceUrl(c, id) {
  return `${c.endpoint}/v1/instances/${encodeComponent(id)}`;
}
