"""Helpers for berth drivers written in Python and built into a component
with componentize-py, the Python counterpart of the Rust SDK (`berth-sdk`).

- `berth_driver.http`: a blocking HTTP client over wasi:http;
- `berth_driver.errors`: the contract's error cases, `fail`, and the usual
  mapping of an HTTP status to a case;
- `berth_driver.tags`: berth's tag keys, the `list` and `set-tags` rules, and
  an encoding of any text into a cloud's restricted label values;
- `berth_driver.pages`: helpers for the answers of `get` and `list`: a whole
  answer paged by id marker (`page_of`), a cloud's answer kept to the ids
  asked and the pool (`only_ids`);
- `berth_driver.driver`: `Defaults`, a base for the exported `Driver` class
  that answers `create_many`, `delete_many` and `limits` as not supported;
- `berth_driver.auth`: what the host's credentials learned that a driver
  may know (the world's `auth` import);
- `berth_driver.testing`: a fake HTTP host and helpers for unit tests on
  plain CPython.

The modules are imported one by one; this package imports none of them.
`tags` and `http` need nothing else. `errors`, `pages`, `driver` and `auth`
import the bindings componentize-py generates for the world
(`componentize_py_types` and `wit_world`), which are present inside the
component and, for tests, in the stubs `componentize-py bindings` writes.
"""

__version__ = "0.1.0"
