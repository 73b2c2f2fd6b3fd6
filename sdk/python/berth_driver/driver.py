"""What a driver's exported class gets for the calls it need not make its
own, as the Rust SDK's `Driver` trait has default methods.

componentize-py exports the class named after the WIT interface, `Driver`,
subclassing the generated `exports.Driver`, and refuses to instantiate it
while any of the contract's functions is missing. Put `Defaults` first
among its bases and it answers the optional ones:

    from berth_driver.driver import Defaults
    from wit_world import exports

    class Driver(Defaults, exports.Driver):
        def describe(self): ...
        # configure, create, get, list, delete, set_tags

- `create_many` and `delete_many`: the host calls them only when
  `describe` declares the `CREATE_MANY` or `DELETE_MANY` capability; the
  defaults say they are not supported, one `permanent` error per item;
- `limits`: called only with the `ACCOUNT_LIMITS` capability; the default
  fails with `permanent`.

A method the class defines itself wins over the default.

This module imports the bindings componentize-py generates for the world
(through `berth_driver.errors`).
"""

from typing import Any, List, NoReturn, Sequence

from componentize_py_types import Err

from berth_driver.errors import fail, permanent


def not_supported(items: Sequence[Any], message: str) -> List[Any]:
    """One `Err(permanent(message))` per item of `items`: the answer of a
    batch call the driver does not make."""
    return [Err(permanent(message)) for _ in items]


class Defaults:
    """The contract's optional calls, answered as not supported."""

    def create_many(self, specs: Sequence[Any]) -> List[Any]:
        """Creates each of `specs` in as few calls to the cloud as it allows,
        one `Ok(instance)` or `Err(error)` per spec, in order. Only called
        when `describe` declares `CREATE_MANY`; this default says it is not
        supported, for each spec."""
        return not_supported(specs, "create-many is not supported by this driver")

    def delete_many(self, instance_ids: Sequence[str]) -> List[Any]:
        """Deletes each of `instance_ids` in as few calls to the cloud as it
        allows, with one check for the batch that they carry the pool's tag:
        one `Ok(None)` or `Err(error)` per id, in order. Only called when
        `describe` declares `DELETE_MANY`; this default says it is not
        supported, for each id."""
        return not_supported(instance_ids, "delete-many is not supported by this driver")

    def limits(self) -> NoReturn:
        """The account's quota and usage. Only called when `describe`
        declares `ACCOUNT_LIMITS`; this default says it is not supported."""
        fail(permanent("account limits are not supported by this driver"))
