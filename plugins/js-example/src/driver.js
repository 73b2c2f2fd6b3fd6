// A berth driver for the instance API of the simulated cloud (`berth sim`,
// docs/sim-cloud.md), written in JavaScript and built into a component with
// componentize-js. It behaves as the Rust driver in plugins/sim does, for
// contract berth:driver@0.2.0: `get` asks the sim for the ids alone, `list`
// answers one page of the sim's a call, a create sends berth's token as the
// sim's client token, and an instance whose boot failed is reported
// `failed`, with the sim's fault.
//
// componentize-js binds the world's exported interface `berth:driver/driver`
// to the object this module exports as `driver`; WIT names become camelCase
// (`set-tags` is `setTags`). A returned value is the `ok` case of a `result`;
// a thrown `DriverError` is the `err` case (see the SDK's errors.js).
// Requests block (the SDK's `send`), so every function is synchronous. This
// example leaves the sim's batch calls to the Rust driver: the SDK's
// `defaults` answer `createMany` and `deleteMany` as not supported.

import {
  POOL_TAG,
  defaults,
  encodeComponent,
  error,
  hasAll,
  isBerthTag,
  onlyIds,
  send,
} from 'berth-driver-sdk';

import { MAX_PAGE_SIZE, checkLabelOptions, parseConfig } from './config.js';
import { apiError, readInstance, readLimits, readPage } from './sim-api.js';

/** This driver's version; keep it equal to package.json's. */
const VERSION = '0.1.0';

/**
 * What `configure` accepted: `{poolId, endpoint, pageSize}`. The host
 * configures every instance of the driver before any other call (and again
 * after a trap), so this is the one thing kept between calls; everything
 * about instances is asked of the sim each time, because the next call may
 * reach another instance of the driver.
 */
let config;

function configured() {
  if (config === undefined) throw error.invalidConfig('driver not configured');
  return config;
}

function instanceUrl(c, id) {
  return `${c.endpoint}/v1/instances/${encodeComponent(id)}`;
}

export const driver = {
  // createMany, deleteMany: a `permanent` error for each item. `describe`
  // declares neither capability, so the host never calls them.
  ...defaults,

  describe() {
    return {
      name: 'js-example',
      version: VERSION,
      description:
        "Machines on berth's simulated cloud (`berth sim`), from a driver written in " +
        'JavaScript: the example for writing drivers in languages other than Rust.',
      config: [
        {
          name: 'endpoint',
          fieldType: 'string',
          required: true,
          default: undefined,
          doc:
            'Base URL of the sim, for example `http://127.0.0.1:8600`. Its host must ' +
            "also be in the provider's allowed hosts.",
        },
        {
          name: 'page_size',
          fieldType: 'integer',
          required: false,
          default: undefined,
          doc: "Instances per list page, 1 to 1000; absent uses the sim's default (100).",
        },
      ],
      labelOptions: [],
      capabilities: {
        accountLimits: true,
        userData: true,
        sshKeys: true,
        idempotentCreate: true,
      },
    };
  },

  configure(poolId, text) {
    config = parseConfig(poolId, text);
  },

  create(spec) {
    const c = configured();
    checkLabelOptions(spec.options);
    // Never create outside this pool, whatever the spec says.
    const tags = Object.fromEntries(spec.tags.filter(([k]) => k !== POOL_TAG));
    tags[POOL_TAG] = c.poolId;
    const body = {
      instance_type: spec.instanceType,
      image: spec.image,
      tags,
      // berth's create token: a create tried twice returns the first
      // instance instead of making two.
      client_token: spec.token,
    };
    if (spec.userData !== undefined) body.user_data = spec.userData;
    if (spec.sshPublicKey !== undefined) body.ssh_public_key = spec.sshPublicKey;
    const resp = send('POST', `${c.endpoint}/v1/instances`, body);
    if (resp.status === 200 || resp.status === 201) return readInstance(resp.json());
    throw apiError(resp, spec.instanceType);
  },

  get(ids) {
    const c = configured();
    if (ids.length === 0) return [];
    // One list of these ids: the host asks for at most 100, which one page of
    // the largest size holds.
    let query = `tag:${POOL_TAG}=${encodeComponent(c.poolId)}&page_size=${MAX_PAGE_SIZE}`;
    for (const id of ids) query += `&id=${encodeComponent(id)}`;
    const resp = send('GET', `${c.endpoint}/v1/instances?${query}`);
    if (resp.status !== 200) throw apiError(resp);
    return onlyIds(readPage(resp.json()).instances, ids, c.poolId);
  },

  list(filter, cursor) {
    const c = configured();
    // A filter naming another pool matches nothing this driver may see.
    if (filter.some(([k, v]) => k === POOL_TAG && v !== c.poolId)) {
      return { instances: [], next: undefined };
    }
    let query = `tag:${POOL_TAG}=${encodeComponent(c.poolId)}`;
    for (const [k, v] of filter) {
      if (k !== POOL_TAG) query += `&tag:${encodeComponent(k)}=${encodeComponent(v)}`;
    }
    if (c.pageSize !== undefined) query += `&page_size=${c.pageSize}`;
    // One page a call: the host asks for the next with `next`.
    if (cursor !== undefined) query += `&page_token=${encodeComponent(cursor)}`;
    const resp = send('GET', `${c.endpoint}/v1/instances?${query}`);
    if (resp.status !== 200) throw apiError(resp);
    const page = readPage(resp.json());
    // A token that does not move would have the host loop.
    if (page.nextPageToken !== undefined && page.nextPageToken === cursor) {
      throw error.transient(`sim repeated page token ${JSON.stringify(cursor)}`);
    }
    // The sim filters already; checking again costs nothing and keeps the
    // rule that only this pool's instances are ever shown.
    const wanted = [...filter, [POOL_TAG, c.poolId]];
    return {
      instances: page.instances.filter((i) => hasAll(i.tags, wanted)),
      next: page.nextPageToken,
    };
  },

  delete(instanceId) {
    const c = configured();
    // The host only deletes ids it listed through this driver, so they carry
    // the pool tag; the sim has no conditional delete to check it.
    const resp = send('DELETE', instanceUrl(c, instanceId));
    if (resp.status === 200 || resp.status === 202 || resp.status === 204) return;
    // 404 becomes not-found, which the host counts as already deleted.
    throw apiError(resp);
  },

  setTags(instanceId, tags) {
    const c = configured();
    if (tags.some(([k, v]) => k === POOL_TAG && v !== c.poolId)) {
      throw error.permanent('set-tags cannot move an instance to another pool');
    }
    // Only berth tags are replaced (the sim keeps the others); the pool tag
    // always stays.
    const body = Object.fromEntries(tags.filter(([k]) => isBerthTag(k) && k !== POOL_TAG));
    body[POOL_TAG] = c.poolId;
    const resp = send('PUT', `${instanceUrl(c, instanceId)}/tags`, { tags: body });
    if (resp.status === 200 || resp.status === 204) return;
    throw apiError(resp);
  },

  limits() {
    const c = configured();
    const resp = send('GET', `${c.endpoint}/v1/limits`);
    if (resp.status !== 200) throw apiError(resp);
    return readLimits(resp.json());
  },
};
