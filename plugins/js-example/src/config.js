// The provider config and the label options: parsed and checked once, with
// every problem reported at once and named by its field.

import { error, parseUrl } from 'berth-driver-sdk';

/** The sim's largest page. */
export const MAX_PAGE_SIZE = 1000;

const CONFIG_FIELDS = ['endpoint', 'page_size'];

/**
 * The configured driver from `configure`'s arguments:
 * `{poolId, endpoint, pageSize}`, with `endpoint` lacking a trailing `/` and
 * `pageSize` `undefined` when the sim's default applies. Throws
 * `invalid-config` naming every wrong field.
 */
export function parseConfig(poolId, text) {
  let raw;
  try {
    raw = JSON.parse(text);
  } catch (e) {
    throw error.invalidConfig(`provider config: ${e.message}`);
  }
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) {
    throw error.invalidConfig('provider config: must be a JSON object');
  }
  const problems = [];
  for (const key of Object.keys(raw)) {
    if (!CONFIG_FIELDS.includes(key)) {
      problems.push(`${key}: unknown field, expected one of ${CONFIG_FIELDS.join(', ')}`);
    }
  }
  let endpoint;
  if (raw.endpoint === undefined) {
    problems.push('endpoint: missing');
  } else if (typeof raw.endpoint !== 'string') {
    problems.push('endpoint: must be a string');
  } else {
    endpoint = raw.endpoint.replace(/\/+$/, '');
    const why = checkEndpoint(endpoint);
    if (why) problems.push(`endpoint: ${why}`);
  }
  let pageSize;
  if (raw.page_size !== undefined && raw.page_size !== null) {
    if (
      !Number.isInteger(raw.page_size) ||
      raw.page_size < 1 ||
      raw.page_size > MAX_PAGE_SIZE
    ) {
      problems.push(`page_size: must be an integer between 1 and ${MAX_PAGE_SIZE}`);
    } else {
      pageSize = raw.page_size;
    }
  }
  if (poolId === '') {
    problems.push('pool id: must not be empty');
  }
  if (problems.length > 0) {
    throw error.invalidConfig(problems.join('; '));
  }
  return { poolId, endpoint, pageSize };
}

/**
 * Why `text` is not a usable base URL, or `undefined` when it is:
 * `http(s)://host[:port][/base]` with no user info, query or fragment.
 */
function checkEndpoint(text) {
  const parsed = parseUrl(text);
  if (parsed.why) return `invalid url: ${parsed.why}`;
  // The driver appends paths to the endpoint, so a query or fragment would
  // end up in the middle of every URL.
  if (parsed.url.pathAndQuery.includes('?')) return 'must not have a query';
  if (text.includes('#')) return 'must not have a fragment';
  return undefined;
}

/**
 * Checks a create's label options (JSON text). The sim takes none: `{}`
 * only, and any key is named back.
 */
export function checkLabelOptions(options) {
  let value;
  try {
    value = JSON.parse(options);
  } catch (e) {
    throw error.invalidConfig(`label options: ${e.message}`);
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw error.invalidConfig('label options: must be a JSON object');
  }
  const [key] = Object.keys(value);
  if (key !== undefined) {
    throw error.invalidConfig(`label options: unknown option ${JSON.stringify(key)}`);
  }
}
