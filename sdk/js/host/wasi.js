// The host inside a component: requests over the world's
// `wasi:http/outgoing-handler` import, log records through
// `berth:driver/log`, what the host's credentials learned through
// `berth:driver/auth`. Only a bundle built for componentize-js reaches this
// module (package.json's `#host` resolves to `node.js` under node), because
// these imports exist only inside the component.
//
// It does not use `fetch`: componentize-js's `fetch` also runs over wasi:http,
// but when the host answers a request with an error at once (a destination
// outside the allowed hosts, a refused connection) its event loop aborts and
// the call traps, where a driver must return a `transient` error. It also
// loses the wasi:http error code, which this client reports by name
// (`request failed: HttpRequestDenied`), as the Rust SDK does.
//
// The host decides where a request may go (the provider's allowed hosts, never
// link-local or metadata addresses) and bounds the whole call with a deadline,
// so the client sets no timeouts of its own.

import { authInfo as hostAuthInfo } from 'berth:driver/auth@0.2.0';
import { log as hostLog } from 'berth:driver/log@0.2.0';
import { handle } from 'wasi:http/outgoing-handler@0.2.12';
import {
  Fields,
  IncomingBody,
  OutgoingBody,
  OutgoingRequest,
  httpErrorCode,
} from 'wasi:http/types@0.2.12';

import { error, fromError } from '../errors.js';

// componentize-js gives every WIT resource a dispose method under this key
// (the same expression its bindings use). Resources are dropped explicitly
// and in order: a child (a stream, a pollable, a header list) before its
// parent, as wasi:http requires.
const dispose = Symbol.dispose || Symbol.for('dispose');

const encoder = new TextEncoder();

/** The most `blocking-write-and-flush` takes at once. */
const WRITE_CHUNK = 4096;

/** The wasi:http `method` cases; anything else is `other`. */
const METHODS = ['get', 'head', 'post', 'put', 'delete', 'connect', 'options', 'trace', 'patch'];

/** Writes one record to the host's log. */
export function log(level, message, fields) {
  hostLog(level, message, fields);
}

/**
 * The non-secret part of the latest exchange of the credential the host
 * holds for `host`, JSON text, or `undefined` when none is exchanged. The
 * import fails with the contract's `error`, thrown here as the SDK's
 * `DriverError`.
 */
export function authInfo(host) {
  try {
    return hostAuthInfo(host);
  } catch (e) {
    throw fromError(payload(e));
  }
}

/**
 * Sends one request and reads the whole response.
 *
 * `req`: `{method, url, https, authority, pathAndQuery, headers, body}`, with
 * `headers` a list of `[name, value]` strings and `body` a `Uint8Array`.
 * Returns `{status, headers, body}`, `headers` as `[lowercase name, value]`
 * and `body` a `Uint8Array`. A request that got no response (refused by the
 * sandbox, connection refused, name not found) or whose body could not be
 * read throws `transient`.
 */
export function request(req) {
  const { method, url, https, authority, pathAndQuery, headers, body: bytes } = req;
  let fields;
  try {
    fields = Fields.fromList(headers.map(([k, v]) => [k, encoder.encode(v)]));
  } catch (e) {
    throw error.transient(`invalid header: ${payload(e)?.tag ?? e}`);
  }
  // The request owns `fields` from here on.
  const request = new OutgoingRequest(fields);
  const lower = method.toLowerCase();
  const wasiMethod = METHODS.includes(lower) ? { tag: lower } : { tag: 'other', val: method };
  for (const [what, set] of [
    ['method', () => request.setMethod(wasiMethod)],
    ['scheme', () => request.setScheme({ tag: https ? 'HTTPS' : 'HTTP' })],
    ['authority', () => request.setAuthority(authority)],
    ['path', () => request.setPathWithQuery(pathAndQuery)],
  ]) {
    try {
      set();
    } catch (e) {
      request[dispose]();
      payload(e);
      throw error.transient(`invalid url: ${JSON.stringify(url)}: ${what} refused`);
    }
  }
  // The first `body()` of a request cannot fail.
  const outgoing = request.body();

  // Hand the request over first and stream the body after: the host reads the
  // body while it sends, so a large body written before `handle` could fill
  // the pipe and block forever.
  let future;
  try {
    future = handle(request, undefined);
  } catch (e) {
    outgoing[dispose]();
    throw requestError(payload(e));
  }
  let writeFailure;
  try {
    writeBody(outgoing, bytes);
  } catch (e) {
    writeFailure = e;
  }

  const pollable = future.subscribe();
  pollable.block();
  pollable[dispose]();
  const got = future.get();
  future[dispose]();
  // none: not ready after `block`; err: already taken. Both are host bugs.
  if (got === undefined || got.tag === 'err') {
    throw writeFailure ?? error.transient('response: response future yielded nothing');
  }
  // The host's reason beats a body write failure it caused.
  if (got.val.tag === 'err') throw requestError(got.val.val);
  // A response arrived, so it is the truth about the request even if writing
  // the body failed (a server may answer before reading it all, as with 413).
  return readResponse(got.val.val);
}

/** Writes `bytes` into an outgoing body and finishes it. */
function writeBody(outgoing, bytes) {
  if (bytes.length > 0) {
    let stream;
    try {
      stream = outgoing.write();
      for (let at = 0; at < bytes.length; at += WRITE_CHUNK) {
        stream.blockingWriteAndFlush(bytes.subarray(at, at + WRITE_CHUNK));
      }
    } catch (e) {
      const p = payload(e);
      const why = p === undefined ? 'body stream already taken' : streamError(p);
      // The stream is a child of the body: it must go first.
      stream?.[dispose]();
      outgoing[dispose]();
      throw error.transient(`request body: ${why}`);
    }
    stream[dispose]();
  }
  try {
    OutgoingBody.finish(outgoing, undefined);
  } catch (e) {
    throw requestError(payload(e));
  }
}

/** Status, headers and the whole body of a response. */
function readResponse(incoming) {
  try {
    const status = incoming.status();
    const fields = incoming.headers();
    const headers = fields.entries().map(([k, v]) => [k.toLowerCase(), new TextDecoder().decode(v)]);
    fields[dispose]();
    let body;
    try {
      body = incoming.consume();
    } catch (e) {
      payload(e);
      throw error.transient('response: body already consumed');
    }
    const chunks = [];
    const stream = body.stream();
    try {
      for (;;) {
        try {
          chunks.push(stream.blockingRead(64 * 1024));
        } catch (e) {
          const p = payload(e);
          if (p?.tag === 'closed') break;
          throw error.transient(`response: ${streamError(p)}`);
        }
      }
    } finally {
      // The stream is a child of the body: it must go first.
      stream[dispose]();
    }
    IncomingBody.finish(body)[dispose]();
    return { status, headers, body: concat(chunks) };
  } finally {
    incoming[dispose]();
  }
}

function concat(chunks) {
  const out = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0));
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.length;
  }
  return out;
}

/**
 * The `err` value of a failed import call: componentize-js throws a
 * `ComponentError` whose `payload` is the WIT error value.
 */
function payload(e) {
  if (e !== null && typeof e === 'object' && 'payload' in e) return e.payload;
  throw e;
}

/** A wasi:http `stream-error` as text. */
function streamError(p) {
  if (p?.tag === 'closed') return 'stream closed';
  const code = httpErrorCode(p.val);
  const text = code === undefined ? p.val.toDebugString() : requestError(code).payload.val;
  p.val[dispose]();
  return text;
}

/**
 * A wasi:http `error-code` as a `transient` error named after its case, as the
 * Rust SDK names it: `request failed: HttpRequestDenied`,
 * `request failed: DnsError: ...`.
 */
function requestError(code) {
  const name = code.tag
    .split('-')
    .map((w) => w.charAt(0).toUpperCase() + w.slice(1).toLowerCase())
    .join('');
  const detail =
    code.val === undefined || code.val === null
      ? ''
      : `: ${typeof code.val === 'object' ? JSON.stringify(code.val, jsonSafe) : code.val}`;
  return error.transient(`request failed: ${name}${detail}`);
}

function jsonSafe(_key, value) {
  return typeof value === 'bigint' ? value.toString() : value;
}
