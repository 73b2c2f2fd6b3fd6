"""berth_driver.auth: what the host's credentials learned, read through the
world's `auth` import, answered in tests by `testing.fake_auth`."""

import unittest

import stub_bindings  # noqa: F401  (the SDK and the bindings on the path)
from componentize_py_types import Err
from wit_world.imports import berth_driver_types as t

from berth_driver import auth, errors
from berth_driver.testing import error_of, fake_auth


class Info(unittest.TestCase):
    def test_answers_and_none(self):
        catalog = '{"project_id": "p-1", "catalog": []}'
        with fake_auth({"keystone.example": catalog}) as asked:
            self.assertEqual(auth.info("keystone.example"), catalog)
            self.assertIsNone(auth.info("api.example"))
        self.assertEqual(asked, ["keystone.example", "api.example"])

    def test_an_exchange_that_failed_is_the_calls_error(self):
        refused = errors.unauthorized("keystone refused the credential")
        with fake_auth({"keystone.example": refused}):
            self.assertEqual(error_of(auth.info, "keystone.example"), refused)
            # Uncaught, it is what a driver call returns.
            with self.assertRaises(Err) as caught:
                auth.info("keystone.example")
        self.assertEqual(caught.exception.value, t.Error_Unauthorized("keystone refused the credential"))

    def test_goes_to_the_host_outside_a_fake(self):
        # The stubs' host functions raise NotImplementedError: the call
        # reached the world's import.
        with self.assertRaises(NotImplementedError):
            auth.info("keystone.example")

    def test_a_world_without_the_import_says_so(self):
        original = auth._auth
        auth._auth = None
        try:
            with self.assertRaisesRegex(ImportError, "berth:driver/auth"):
                auth.info("h")
        finally:
            auth._auth = original


if __name__ == "__main__":
    unittest.main()
