"""The contract's typed errors: one constructor per case, `fail` to return
one, and the usual mapping of an HTTP status to a case.

The host acts on the error *case*, never on the message, so pick the case
with care: `transient` is retried, `permanent` and `invalid-config` are not,
`rate-limited` pauses calls, `quota-exceeded` and `capacity` pause creates,
and `not-found` from `delete` counts as success.

A call returns an error by raising componentize-py's `Err(error)`; `fail`
does that. Any other exception traps, and the host replaces the instance.

This module imports the bindings componentize-py generates for the world:
inside the component they are real, and in unit tests they are the stubs
`componentize-py bindings` writes.
"""

import datetime
import time
from typing import NoReturn, Optional

from componentize_py_types import Err

from berth_driver.http import Response

try:
    from wit_world.imports import berth_driver_types as t
except ImportError:
    # The contract's interface is `types`; componentize-py qualifies the
    # name only when the world has another `types` (wasi:http's).
    from wit_world.imports import types as t  # type: ignore[attr-defined, no-redef]

Error = t.Error

U64_MAX = 2**64 - 1
# The wait of a `rate-limited` error when the cloud names none.
DEFAULT_RETRY_AFTER_MS = 1000


def fail(error: Error) -> NoReturn:
    """Returns `error` to the host as the call's result."""
    raise Err(error)


def transient(message: str) -> Error:
    """A fault that may go away on retry (network error, 5xx)."""
    return t.Error_Transient(message)


def permanent(message: str) -> Error:
    """A fault that will not go away on retry."""
    return t.Error_Permanent(message)


def rate_limited(retry_after_ms: int, message: str) -> Error:
    """The cloud is throttling calls; the host waits `retry_after_ms` before
    the next call of this kind. The wait is clamped to the contract's u64."""
    wait = min(max(int(retry_after_ms), 0), U64_MAX)
    return t.Error_RateLimited(t.RateLimit(retry_after_ms=wait, message=message))


def quota_exceeded(message: str) -> Error:
    """An account quota was hit; the host makes no creates until an instance
    goes away."""
    return t.Error_QuotaExceeded(message)


def capacity_for_type(instance_type: str, message: str) -> Error:
    """The cloud has no capacity for `instance_type`; other types may still work."""
    scope = t.CapacityScope_InstanceType(instance_type)
    return t.Error_Capacity(t.Capacity(scope=scope, message=message))


def capacity_general(message: str) -> Error:
    """Nothing can be launched on this provider right now."""
    return t.Error_Capacity(t.Capacity(scope=t.CapacityScope_General(), message=message))


def not_found(message: str) -> Error:
    """The instance does not exist. From `delete`, the host treats it as success."""
    return t.Error_NotFound(message)


def unauthorized(message: str) -> Error:
    """Credentials were rejected or lack a permission: an operator must fix
    access."""
    return t.Error_Unauthorized(message)


def invalid_config(message: str) -> Error:
    """The provider config or label options are wrong; name the field in
    `message`."""
    return t.Error_InvalidConfig(message)


def from_status(
    status: int, message: str, retry_after: Optional[str] = None, now: Optional[float] = None
) -> Error:
    """The usual case for a failed response with HTTP `status`:

    - 429: `rate-limited`, waiting as long as `retry_after` (the
      Retry-After header) says, else `DEFAULT_RETRY_AFTER_MS`;
    - 401 and 403: `unauthorized` (the host adds the credentials, so they
      are the operator's to fix);
    - 404: `not-found`;
    - 5xx: `transient`;
    - anything else: `permanent`.

    Clouds say more in their bodies (a quota, no capacity, a 403 that is a
    quota): check those first and call this for the rest. `now` (seconds
    since the Unix epoch, default the wall clock) dates an HTTP-date."""
    if status == 429:
        wait = retry_after_ms(retry_after, now)
        return rate_limited(DEFAULT_RETRY_AFTER_MS if wait is None else wait, message)
    if status in (401, 403):
        return unauthorized(message)
    if status == 404:
        return not_found(message)
    if 500 <= status <= 599:
        return transient(message)
    return permanent(message)


def from_response(response: Response, message: Optional[str] = None) -> Error:
    """`from_status` for a `berth_driver.http.Response`: its status and its
    Retry-After header. `message` defaults to the status and the start of
    the body."""
    if message is None:
        message = f"HTTP {response.status}: {response.text()[:200]}"
    return from_status(response.status, message, response.header("retry-after"))


def retry_after_ms(value: Optional[str], now: Optional[float] = None) -> Optional[int]:
    """A Retry-After header's wait in milliseconds: a number of seconds
    (`120`), or an HTTP-date (`Sun, 06 Nov 1994 08:49:37 GMT`) counted from
    `now` (seconds since the Unix epoch, default the wall clock), 0 if it
    has passed. `None` when absent or neither."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return min(int(value) * 1000, U64_MAX)
    at = _http_date(value)
    if at is None:
        return None
    if now is None:
        now = time.time()
    return max(0, round((at - now) * 1000))


_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_DAYS = ("Mon,", "Tue,", "Wed,", "Thu,", "Fri,", "Sat,", "Sun,")


def _http_date(text: str) -> Optional[float]:
    """An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`, the form HTTP
    senders use) as seconds since the Unix epoch, else `None`."""
    parts = text.split(" ")
    if len(parts) != 6 or parts[0] not in _DAYS or parts[5] != "GMT" or parts[2] not in _MONTHS:
        return None
    clock = parts[4].split(":")
    numbers = [parts[3], parts[1], *clock]
    if len(clock) != 3 or not all(n.isascii() and n.isdigit() for n in numbers):
        return None
    year, day, hour, minute, second = (int(n) for n in numbers)
    month = _MONTHS.index(parts[2]) + 1
    try:
        at = datetime.datetime(year, month, day, hour, minute, second, tzinfo=datetime.timezone.utc)
    except ValueError:
        return None
    return at.timestamp()
