"""berth_driver.pages: a whole answer paged by id marker, and what `get`
keeps of a cloud's answer."""

import unittest

import stub_bindings  # noqa: F401  (the SDK and the bindings on the path)
from wit_world.imports import berth_driver_types as t

from berth_driver.pages import only_ids, page_of


def inst(id: str, pool: str = "p") -> t.Instance:
    return t.Instance(
        id=id,
        state=t.InstanceState_Running(),
        instance_type="small",
        tags=[("berth-pool", pool)],
        addresses=t.Addresses(None, None, None, None),
        created_at_ms=None,
        connection=t.Connection(None, None, []),
    )


def ids(instances) -> list:
    return [i.id for i in instances]


class PageOf(unittest.TestCase):
    def test_pages_cover_the_whole_answer_once(self):
        everything = [inst(f"i-{n}") for n in reversed(range(7))]
        seen, cursor, pages = [], None, 0
        while True:
            page = page_of(everything, cursor, 3)
            self.assertIsInstance(page, t.Page)
            self.assertLessEqual(len(page.instances), 3)
            seen.extend(ids(page.instances))
            pages += 1
            if page.next is None:
                break
            cursor = page.next
        self.assertEqual(seen, [f"i-{n}" for n in range(7)])
        self.assertEqual(pages, 3)

    def test_the_cursor_is_the_last_id_of_the_page(self):
        first = page_of([inst("b"), inst("a"), inst("c")], None, 2)
        self.assertEqual((ids(first.instances), first.next), (["a", "b"], "b"))

    def test_edges(self):
        empty = page_of([], None, 3)
        self.assertEqual((empty.instances, empty.next), ([], None))
        exact = page_of([inst(f"i-{n}") for n in range(3)], None, 3)
        self.assertEqual((len(exact.instances), exact.next), (3, None))
        # A size below 1 is 1.
        one = page_of([inst("a"), inst("b")], None, 0)
        self.assertEqual((ids(one.instances), one.next), (["a"], "a"))
        # A cursor past the end is an empty last page.
        past = page_of([inst("a")], "z", 5)
        self.assertEqual((past.instances, past.next), ([], None))

    def test_an_instance_gone_between_pages_moves_no_other(self):
        everything = [inst(f"i-{n}") for n in range(6)]
        first = page_of(everything, None, 3)
        # `i-1`, on the first page, went away before the second was asked.
        fewer = [i for i in everything if i.id != "i-1"]
        second = page_of(fewer, first.next, 3)
        self.assertEqual(ids(second.instances), ["i-3", "i-4", "i-5"])
        self.assertIsNone(second.next)

    def test_leaves_its_argument_alone(self):
        everything = [inst("b"), inst("a")]
        page_of(everything, None, 1)
        self.assertEqual(ids(everything), ["b", "a"])


class OnlyIds(unittest.TestCase):
    def test_keeps_the_ids_asked_of_the_pool(self):
        found = [inst("i-1"), inst("i-2", "other"), inst("i-3"), inst("i-4")]
        self.assertEqual(ids(only_ids(found, ["i-2", "i-3", "i-9"], "p")), ["i-3"])

    def test_an_instance_without_the_pool_tag_is_not_the_pools(self):
        bare = inst("i-1")
        bare.tags = [("name", "x")]
        self.assertEqual(only_ids([bare], ["i-1"], "p"), [])
        self.assertEqual(only_ids([inst("i-1")], [], "p"), [])


if __name__ == "__main__":
    unittest.main()
