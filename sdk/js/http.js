// A small blocking HTTP client, the JavaScript counterpart of the Rust SDK's
// `berth_sdk::http`: `send` one request and get the whole response back.
//
// Inside a component the request goes over the world's
// `wasi:http/outgoing-handler` import (host/wasi.js); under node it goes to
// the fake host of testing.js, so a driver's modules run in unit tests
// unchanged. The host decides where a request may go (the provider's allowed
// hosts, never link-local or metadata addresses), adds the provider's
// credentials itself, and bounds the whole call with a deadline, so the
// client sets no timeouts and sends no credentials of its own.

import { log, request } from '#host';

import { error } from './errors.js';

const encoder = new TextEncoder();

/**
 * Sends one request and reads the whole response.
 *
 * - `method`: `'GET'`, `'POST'`, `'PUT'`, `'DELETE'`, `'PATCH'`, …
 * - `url`: an absolute `http` or `https` URL (see `parseUrl`); build path
 *   segments and query values with `encodeComponent`.
 * - `body`: `undefined` for none; a `Uint8Array` is sent as it is; anything
 *   else is sent as JSON (`content-type: application/json`).
 * - `options.headers`: more headers, as `[name, value]` pairs or an object;
 *   they replace the defaults of the same name (`accept: application/json`,
 *   and `content-type` for a body). `content-length` is always set.
 *
 * Returns `{status, headers, header(name), body, text, ok, json(), request}`:
 * `headers` as `[lowercase name, value]` pairs, `header(name)` the first
 * value of a header or `null`, `body` the bytes, `text` the body as UTF-8,
 * `ok` whether the status is 2xx, `json()` the body parsed (throwing
 * `transient` when it is not JSON), `request` `{method, url}`.
 *
 * An HTTP error status is a normal response (see `responseError` in
 * errors.js to map it). A request that got no response (refused by the
 * sandbox, connection refused, name not found) throws `transient` named
 * after the wasi:http error code, as the Rust SDK names it:
 * `request failed: HttpRequestDenied`. Requests block, so a driver's calls
 * are synchronous.
 */
export function send(method, url, body, options = {}) {
  const target = parseUrl(url);
  if (target.why) throw error.transient(`invalid url: ${target.why}`);
  let bytes;
  let contentType;
  if (body === undefined) {
    bytes = new Uint8Array(0);
  } else if (body instanceof Uint8Array) {
    bytes = body;
    contentType = 'application/octet-stream';
  } else {
    bytes = encoder.encode(JSON.stringify(body));
    contentType = 'application/json';
  }
  const headers = [['accept', 'application/json']];
  if (contentType !== undefined) headers.push(['content-type', contentType]);
  const extra = Array.isArray(options.headers)
    ? options.headers
    : Object.entries(options.headers ?? {});
  for (const [name, value] of extra) {
    const lower = String(name).toLowerCase();
    if (lower === 'content-length') continue;
    const at = headers.findIndex(([k]) => k === lower);
    if (at >= 0) headers.splice(at, 1);
    headers.push([lower, String(value)]);
  }
  // A declared length makes the request one complete message. Without it
  // the host streams a chunked body, and a server that answers before the
  // body's end (a 404 to a DELETE, say) may close the connection mid-request.
  headers.push(['content-length', String(bytes.length)]);

  const got = request({ method, url, ...target.url, headers, body: bytes });
  const response = makeResponse(method, url, got);
  log('debug', 'http request', [
    ['method', method],
    ['url', url],
    ['status', String(response.status)],
  ]);
  return response;
}

/** The response object of `send` from the host's `{status, headers, body}`. */
function makeResponse(method, url, { status, headers, body }) {
  const text = new TextDecoder().decode(body);
  return {
    status,
    headers,
    header(name) {
      const wanted = name.toLowerCase();
      return headers.find(([k]) => k === wanted)?.[1] ?? null;
    },
    body,
    text,
    ok: status >= 200 && status <= 299,
    json() {
      try {
        return JSON.parse(text);
      } catch (e) {
        throw error.transient(`response: ${e.message}`);
      }
    },
    request: { method, url },
  };
}

// URLs as wasi:http wants them: scheme, authority and path apart. The rules
// are those of the Rust SDK's `Url::parse`, so the Rust and the JavaScript
// drivers accept the same endpoints.

/**
 * Splits `scheme://authority[/path][?query][#fragment]`: `{url: {https,
 * authority, pathAndQuery}}`, or `{why}` when `text` is not an absolute
 * `http` or `https` URL. User info is refused (credentials are the host's
 * business); the fragment is dropped.
 */
export function parseUrl(text) {
  const bad = (why) => ({ why: `${JSON.stringify(text)}: ${why}` });
  if (/[\s\u0000-\u001f\u007f-\u009f]/.test(text)) {
    return bad('contains whitespace or control characters');
  }
  const sep = text.indexOf('://');
  if (sep < 0) return bad('not an absolute url');
  const scheme = text.slice(0, sep).toLowerCase();
  if (scheme !== 'http' && scheme !== 'https') return bad('scheme must be http or https');
  const rest = text.slice(sep + 3);
  const end = rest.search(/[/?#]/);
  const authority = end < 0 ? rest : rest.slice(0, end);
  if (authority === '') return bad('no host');
  const why = checkAuthority(authority);
  if (why) return bad(why);
  const tail = (end < 0 ? '' : rest.slice(end)).split('#')[0];
  const pathAndQuery = tail === '' ? '/' : tail.startsWith('?') ? `/${tail}` : tail;
  return { url: { https: scheme === 'https', authority, pathAndQuery } };
}

/** Why `host`, `host:port`, `[v6]` or `[v6]:port` is malformed, if it is. */
function checkAuthority(authority) {
  if (authority.includes('@')) return 'user info is not supported; the host adds credentials';
  let host;
  let port;
  if (authority.startsWith('[')) {
    const close = authority.indexOf(']');
    if (close < 0) return 'unclosed [';
    host = authority.slice(1, close);
    const after = authority.slice(close + 1);
    if (after.startsWith(':')) port = after.slice(1);
    else if (after !== '') return 'junk after ]';
  } else {
    const colon = authority.indexOf(':');
    if (colon >= 0) {
      host = authority.slice(0, colon);
      port = authority.slice(colon + 1);
      if (port.includes(':')) return 'ipv6 addresses must be in brackets';
    } else {
      host = authority;
    }
  }
  if (host === '') return 'no host';
  if (port !== undefined && !(/^\+?[0-9]+$/.test(port) && Number(port) <= 65535)) {
    return 'bad port';
  }
  return undefined;
}

/**
 * Percent-encodes `text` for use as one path segment or query key or value:
 * every UTF-8 byte but `A-Z a-z 0-9 - . _ ~` is encoded (`encodeURIComponent`
 * leaves `!'()*` alone, which the Rust SDK encodes).
 */
export function encodeComponent(text) {
  let out = '';
  for (const b of encoder.encode(text)) {
    const c = String.fromCharCode(b);
    out += /[A-Za-z0-9\-._~]/.test(c) ? c : `%${b.toString(16).toUpperCase().padStart(2, '0')}`;
  }
  return out;
}
