"""berth_driver.errors: one constructor per case of the contract's `error`,
`fail`, and the mapping of HTTP statuses."""

import datetime
import unittest

import stub_bindings  # noqa: F401  (the SDK and the bindings on the path)
from componentize_py_types import Err
from wit_world.imports import berth_driver_types as t

from berth_driver import errors
from berth_driver.testing import response

# 2026-01-01T00:00:00Z, a Thursday.
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc).timestamp()


def rate(ms: int, message: str = "m") -> t.Error:
    return t.Error_RateLimited(t.RateLimit(retry_after_ms=ms, message=message))


class Constructors(unittest.TestCase):
    def test_every_case(self):
        for made, want in [
            (errors.transient("m"), t.Error_Transient("m")),
            (errors.permanent("m"), t.Error_Permanent("m")),
            (errors.rate_limited(1500, "m"), rate(1500)),
            (errors.quota_exceeded("m"), t.Error_QuotaExceeded("m")),
            (
                errors.capacity_for_type("gpu", "m"),
                t.Error_Capacity(t.Capacity(t.CapacityScope_InstanceType("gpu"), "m")),
            ),
            (
                errors.capacity_general("m"),
                t.Error_Capacity(t.Capacity(t.CapacityScope_General(), "m")),
            ),
            (errors.not_found("m"), t.Error_NotFound("m")),
            (errors.unauthorized("m"), t.Error_Unauthorized("m")),
            (errors.invalid_config("m"), t.Error_InvalidConfig("m")),
        ]:
            self.assertEqual(made, want)

    def test_rate_limited_wait_fits_u64(self):
        self.assertEqual(errors.rate_limited(-5, "m"), rate(0))
        self.assertEqual(errors.rate_limited(2**70, "m"), rate(2**64 - 1))

    def test_fail_raises_err(self):
        with self.assertRaises(Err) as caught:
            errors.fail(errors.not_found("i-1 is gone"))
        self.assertEqual(caught.exception.value, t.Error_NotFound("i-1 is gone"))


class FromStatus(unittest.TestCase):
    def test_statuses(self):
        for status, want in [
            (429, rate(1000)),
            (401, t.Error_Unauthorized("m")),
            (403, t.Error_Unauthorized("m")),
            (404, t.Error_NotFound("m")),
            (500, t.Error_Transient("m")),
            (502, t.Error_Transient("m")),
            (503, t.Error_Transient("m")),
            (599, t.Error_Transient("m")),
            (400, t.Error_Permanent("m")),
            (409, t.Error_Permanent("m")),
            (422, t.Error_Permanent("m")),
            (302, t.Error_Permanent("m")),
            (200, t.Error_Permanent("m")),
            (600, t.Error_Permanent("m")),
        ]:
            self.assertEqual(errors.from_status(status, "m"), want, status)

    def test_retry_after(self):
        for header, want in [
            (None, 1000),
            ("3", 3000),
            (" 120 ", 120_000),
            ("0", 0),
            ("-2", 1000),
            ("1.5", 1000),
            ("soon", 1000),
            ("Thu, 01 Jan 2026 00:00:07 GMT", 7000),
            ("Wed, 31 Dec 2025 23:59:00 GMT", 0),
            ("Thu, 01 Jan 2026 00:00:07 UTC", 1000),
            ("Thu, 32 Jan 2026 00:00:07 GMT", 1000),
            ("Thursday, 01-Jan-26 00:00:07 GMT", 1000),
        ]:
            self.assertEqual(errors.from_status(429, "m", header, now=NOW), rate(want), header)

    def test_retry_after_ms(self):
        self.assertEqual(errors.retry_after_ms("Thu, 01 Jan 2026 00:01:00 GMT", NOW + 0.5), 59_500)
        self.assertEqual(errors.retry_after_ms("99999999999999999999999"), 2**64 - 1)
        self.assertIsNone(errors.retry_after_ms(None))
        self.assertIsNone(errors.retry_after_ms(""))
        # Without `now`, the wall clock: a date long past waits nothing.
        self.assertEqual(errors.retry_after_ms("Sun, 06 Nov 1994 08:49:37 GMT"), 0)

    def test_from_response(self):
        slow = response(429, body=b"slow down", headers=[("Retry-After", "2")])
        self.assertEqual(errors.from_response(slow), rate(2000, "HTTP 429: slow down"))
        self.assertEqual(errors.from_response(slow, "throttled"), rate(2000, "throttled"))
        long = response(500, body=b"x" * 500)
        self.assertEqual(errors.from_response(long), t.Error_Transient("HTTP 500: " + "x" * 200))

    def test_an_author_overrides_some_statuses(self):
        # The usual shape: the cloud's own codes first, the default after.
        def api_error(resp) -> t.Error:
            if resp.status == 403 and b"quota" in resp.body:
                return errors.quota_exceeded("quota")
            return errors.from_response(resp, "other")

        self.assertEqual(api_error(response(403, body=b"quota")), t.Error_QuotaExceeded("quota"))
        self.assertEqual(api_error(response(403, body=b"denied")), t.Error_Unauthorized("other"))


if __name__ == "__main__":
    unittest.main()
