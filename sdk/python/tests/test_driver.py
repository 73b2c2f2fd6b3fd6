"""berth_driver.driver: the optional calls of the contract, answered as not
supported, as the Rust SDK's default methods answer them."""

import unittest

import stub_bindings  # noqa: F401  (the SDK and the bindings on the path)
from componentize_py_types import Err
from wit_world.imports import berth_driver_types as t

from berth_driver.driver import Defaults, not_supported
from berth_driver.testing import error_of


class Cloud(Defaults):
    """A driver that makes only `create` its own."""

    def limits(self):
        return "its own"


class NotSupported(unittest.TestCase):
    def test_one_permanent_error_per_item_in_order(self):
        made = Defaults().create_many(["spec-1", "spec-2", "spec-3"])
        self.assertEqual(
            made, [Err(t.Error_Permanent("create-many is not supported by this driver"))] * 3
        )
        gone = Defaults().delete_many(["i-1"])
        self.assertEqual(gone, [Err(t.Error_Permanent("delete-many is not supported by this driver"))])
        self.assertEqual(Defaults().delete_many([]), [])
        self.assertEqual(not_supported(range(2), "m"), [Err(t.Error_Permanent("m"))] * 2)

    def test_limits(self):
        self.assertEqual(
            error_of(Defaults().limits),
            t.Error_Permanent("account limits are not supported by this driver"),
        )

    def test_a_drivers_own_method_wins(self):
        self.assertEqual(Cloud().limits(), "its own")
        self.assertEqual(len(Cloud().create_many(["spec"])), 1)


if __name__ == "__main__":
    unittest.main()
