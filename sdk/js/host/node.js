// The host outside a component (node, for unit tests): there is no wasi:http,
// no host log and no `auth` import, so requests and auth questions go to
// whatever host `testing.js` installed, and fail loudly when there is none.
//
// `http.js` and `log.js` import the host as `#host`; package.json resolves it
// to this module under node (the `node` condition) and to `wasi.js` anywhere
// else, which is where a bundle for componentize-js gets it.

let installed;

/**
 * Installs `host` (`{request(req), log(level, message, fields),
 * authInfo(host)}`, see `wasi.js` for the shapes) or removes it with
 * `undefined`; returns the one it replaces.
 */
export function setHost(host) {
  const previous = installed;
  installed = host;
  return previous;
}

/** Sends one request through the installed host. */
export function request(req) {
  if (installed === undefined) {
    throw new Error(
      `berth-driver-sdk: no HTTP outside a component (${req.method} ${req.url}); ` +
        "in tests, install a fake host: installFakeHost() from 'berth-driver-sdk/testing'",
    );
  }
  return installed.request(req);
}

/** Asks the installed host what its credential for `host` learned. */
export function authInfo(host) {
  if (installed?.authInfo === undefined) {
    throw new Error(
      `berth-driver-sdk: no auth import outside a component (${host}); ` +
        "in tests, install a fake host: installFakeHost() from 'berth-driver-sdk/testing'",
    );
  }
  return installed.authInfo(host);
}

/** Writes one log record to the installed host, or nowhere. */
export function log(level, message, fields) {
  installed?.log?.(level, message, fields);
}
