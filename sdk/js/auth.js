// What the host's credentials learned that a driver may know.
//
// Some clouds take a credential that is first exchanged for a token
// (OpenStack Keystone, OAuth2). The host makes the exchange and adds the
// token to the driver's requests; the driver never sees it. What else the
// exchange returned, and is not secret (a Keystone service catalog, a
// project id), the driver reads here, to find its endpoints.
//
// Inside a component it calls the world's `berth:driver/auth` import; in
// tests, the fake host of testing.js answers (`fake.auth(host, answer)`).

import { authInfo } from '#host';

/**
 * The non-secret part of the latest exchange of the credential the host
 * holds for `host` (a host name as in the provider's allowed hosts), as
 * JSON text whose shape the credential's kind documents; `undefined` when no
 * credential for `host` is exchanged for a token. The host makes the
 * exchange first if it has not yet. Its errors are thrown as they are, as
 * `DriverError`s (`unauthorized` when the credential was refused,
 * `transient` when its issuer could not be reached): left uncaught, they
 * are the driver call's error.
 */
export function info(host) {
  return authInfo(String(host));
}
