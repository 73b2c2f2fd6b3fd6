"""What the host's credentials learned that a driver may know.

Some clouds take a credential that is first exchanged for a token
(OpenStack Keystone, OAuth2). The host makes the exchange and adds the
token to the driver's requests; the driver never sees it. What else the
exchange returned, and is not secret (a Keystone service catalog, a
project id), the driver reads here, to find its endpoints.

It calls the world's `berth:driver/auth` import. A driver built with
`--intersect-world` (as the templates and the example are) imports only
what its own world lists: add `import berth:driver/auth@0.2.0;` there to
use this module. In unit tests, `berth_driver.testing.fake_auth` answers
in the host's place.
"""

from typing import Optional

try:
    from wit_world.imports import auth as _auth
except ImportError:
    _auth = None  # type: ignore[assignment]


def info(host: str) -> Optional[str]:
    """The non-secret part of the latest exchange of the credential the host
    holds for `host` (a host name as in the provider's allowed hosts), as
    JSON text whose shape the credential's kind documents; `None` when no
    credential for `host` is exchanged for a token. The host makes the
    exchange first if it has not yet. Its errors come back as they are,
    raised as componentize-py's `Err(error)` (`unauthorized` when the
    credential was refused, `transient` when its issuer could not be
    reached): left uncaught, they are the driver call's error."""
    if _auth is None:
        raise ImportError(
            "berth_driver.auth: the component's world does not import "
            "berth:driver/auth; add `import berth:driver/auth@0.2.0;` to it"
        )
    return _auth.auth_info(host)
