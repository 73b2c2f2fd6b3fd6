"""Helpers for the answers of `get` and `list` (contract 0.2).

The host follows a list's pages itself, one call per page, so a driver
fetches one page of its cloud's per call and hands back the cloud's cursor
in `Page.next`. `page_of` pages an answer the cloud gives whole (a cloud
without pages). `only_ids` keeps a cloud's answer to what `get` may return.

This module imports the bindings componentize-py generates for the world
(`Page` is the contract's record): inside the component they are real, and
in unit tests they are the stubs `componentize-py bindings` writes.
"""

from typing import Iterable, List, Optional, Sequence

from berth_driver.tags import POOL_TAG, tag

try:
    from wit_world.imports import berth_driver_types as t
except ImportError:
    # The contract's interface is `types`; componentize-py qualifies the
    # name only when the world has another `types` (wasi:http's).
    from wit_world.imports import types as t  # type: ignore[attr-defined, no-redef]


def page_of(all: Iterable[t.Instance], cursor: Optional[str], size: int) -> t.Page:
    """Page `cursor` (`None`: the first) of `all`, `size` instances a page
    (at least 1), in id order. The cursor is the id of the last instance of
    the page before (a marker, as OpenStack's), not an offset: an instance
    that goes away between two pages moves no other from one page to the
    next, so none is skipped. `next` is `None` on the last page."""
    size = max(int(size), 1)
    rest = sorted(all, key=lambda i: i.id)
    if cursor is not None:
        rest = [i for i in rest if i.id > cursor]
    instances = rest[:size]
    more = len(rest) > size
    return t.Page(instances=instances, next=instances[-1].id if more else None)


def only_ids(found: Iterable[t.Instance], ids: Sequence[str], pool_id: str) -> List[t.Instance]:
    """The instances of `found` whose id is one of `ids` and that carry pool
    `pool_id`'s tag: what `get` answers, from a cloud's answer that may hold
    more (a filter the cloud applies loosely, a lookup that also finds other
    pools' instances)."""
    wanted = set(ids)
    return [i for i in found if i.id in wanted and tag(i.tags, POOL_TAG) == pool_id]
