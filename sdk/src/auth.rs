//! What the host's credentials learned that a driver may know.
//!
//! Some clouds take a credential that is first exchanged for a token
//! (OpenStack Keystone, OAuth2). The host makes the exchange and adds the
//! token to the driver's requests; the driver never sees it. What else the
//! exchange returned, and is not secret (a Keystone service catalog, a
//! project id), the driver reads here, to find its endpoints.

use crate::bindings::berth::driver::auth as wit;
use crate::types::Error;

/// The non-secret part of the latest exchange of the credential the host
/// holds for `host`, as JSON text whose shape the credential's kind
/// documents; `None` when no credential for `host` is exchanged for a
/// token. The host makes the exchange first if it has not yet; its errors
/// come back as they are (`unauthorized`, `transient`).
pub fn info(host: &str) -> Result<Option<String>, Error> {
    wit::auth_info(host)
}
