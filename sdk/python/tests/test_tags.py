"""berth_driver.tags: the tag rules (as in the Rust SDK's `tags`) and the
label encoding, with the test vectors every SDK shares."""

import random
import re
import unittest

import stub_bindings  # noqa: F401  (the SDK on the path)
from berth_driver import tags
from berth_driver.tags import decode_label, encode_label, has_all, is_berth_tag, replace_berth_tags


class Keys(unittest.TestCase):
    def test_constants(self):
        self.assertEqual(
            [tags.POOL_TAG, tags.NODE_TAG, tags.LABEL_TAG],
            ["berth-pool", "berth-node", "berth-label"],
        )
        self.assertEqual(
            [tags.IDLE_TAG, tags.SLOTS_TAG, tags.SLOT_LABEL_TAG],
            ["berth-idle", "berth-slots", "berth-slot-label"],
        )
        self.assertEqual(tags.BERTH_PREFIX, "berth-")

    def test_tag_finds_first_value(self):
        t = [("a", "1"), ("berth-pool", "p1"), ("a", "2")]
        self.assertEqual(tags.tag(t, "a"), "1")
        self.assertEqual(tags.tag(t, tags.POOL_TAG), "p1")
        self.assertIsNone(tags.tag(t, "missing"))

    def test_berth_tag_prefix(self):
        for key in [tags.POOL_TAG, tags.NODE_TAG, tags.SLOT_LABEL_TAG, "berth-anything"]:
            self.assertTrue(is_berth_tag(key), key)
        for key in ["berth", "Berth-pool", "name", ""]:
            self.assertFalse(is_berth_tag(key), key)


class HasAll(unittest.TestCase):
    def test_cases(self):
        for t, filter, want in [
            ([], [], True),
            ([("berth-pool", "p1")], [], True),
            ([("berth-pool", "p1"), ("x", "y")], [("berth-pool", "p1")], True),
            ([("berth-pool", "p1")], [("berth-pool", "p2")], False),
            ([("berth-pool", "p1")], [("berth-pool", "p1"), ("berth-node", "n")], False),
            # A key present with another value does not match.
            ([("berth-node", "n-1")], [("berth-node", "n-2")], False),
            # Duplicate keys: any matching pair counts.
            ([("k", "1"), ("k", "2")], [("k", "2")], True),
        ]:
            self.assertEqual(has_all(t, filter), want, (t, filter))


class ReplaceBerthTags(unittest.TestCase):
    def test_cases(self):
        for existing, new, want in [
            # Berth tags absent from `new` are removed; others are kept.
            (
                [("Name", "web"), ("berth-pool", "p1"), ("berth-node", "n-1")],
                [("berth-pool", "p1")],
                [("Name", "web"), ("berth-pool", "p1")],
            ),
            # Berth tags in `new` are set, added or changed.
            (
                [("berth-pool", "p1"), ("env", "prod"), ("berth-label", "old")],
                [("berth-pool", "p1"), ("berth-label", "new"), ("berth-extra", "x")],
                [("env", "prod"), ("berth-pool", "p1"), ("berth-label", "new"), ("berth-extra", "x")],
            ),
            # Non-berth keys in `new` are ignored; existing ones are left alone.
            ([("env", "prod")], [("env", "dev"), ("berth-pool", "p")], [("env", "prod"), ("berth-pool", "p")]),
            # Empty `new` removes every berth tag.
            ([("berth-pool", "p"), ("a", "b")], [], [("a", "b")]),
            # The last value of a repeated key wins, in the place of the first.
            (
                [],
                [("berth-node", "1"), ("berth-label", "l"), ("berth-node", "2")],
                [("berth-node", "2"), ("berth-label", "l")],
            ),
        ]:
            self.assertEqual(replace_berth_tags(existing, new), want, (existing, new))

    def test_leaves_its_arguments_alone(self):
        existing = [("berth-pool", "p"), ("a", "b")]
        new = [("berth-node", "n")]
        replace_berth_tags(existing, new)
        self.assertEqual(existing, [("berth-pool", "p"), ("a", "b")])
        self.assertEqual(new, [("berth-node", "n")])


# Shared by every SDK: the same value encodes the same way in all of them.
VECTORS = [
    ("", ""),
    ("ci-pool", "ci-pool"),
    ("n-00000000000000ab", "n-00000000000000ab"),
    ("zuul", "z7auul"),
    ("My.pool", "z4dyz2epool"),
    ("My.Pool", "z4dyz2ez50ool"),
    ("-edge_", "z2dedgez5f"),
    ("é", "zc3za9"),
]

LABEL = re.compile(r"([a-z0-9]([a-z0-9_-]*[a-z0-9])?)?")


class Labels(unittest.TestCase):
    def test_vectors(self):
        for value, encoded in VECTORS:
            self.assertEqual(encode_label(value), encoded, value)
            self.assertEqual(decode_label(encoded), value, encoded)

    def test_edges(self):
        for value, encoded in [
            ("z", "z7a"),
            ("-", "z2d"),
            ("_", "z5f"),
            ("a-", "az2d"),
            ("_a", "z5fa"),
            ("--", "z2dz2d"),
            ("a--b", "a--b"),
            ("a_-_b", "a_-_b"),
            ("a b", "az20b"),
            ("€", "ze2z82zac"),
            ("😀", "zf0z9fz98z80"),
            ("\x00", "z00"),
        ]:
            self.assertEqual(encode_label(value), encoded, value)
            self.assertEqual(decode_label(encoded), value, encoded)

    def test_decode_refuses_what_encode_never_writes(self):
        for text in [
            "A",          # uppercase
            "Zz7a",
            "a.b",        # outside the alphabet
            "a b",
            "é",          # not escaped
            "z",          # `z` without two hex digits
            "z4",
            "az",
            "zz7a",
            "z4D",        # uppercase hex
            "zg0",
            "z+4",
            "z 4",
            "z61",        # `a`, which is kept
            "z30",        # `0`
            "az2db",      # an inner `-`, which is kept
            "az5fb",      # an inner `_`
            "-a",         # `-` or `_` at either end
            "a-",
            "_",
            "-",
            "zc3",        # escapes that are not UTF-8
            "zc3a9",
            "zff",
            "zedzbfzbf",  # an encoded surrogate
        ]:
            with self.assertRaises(ValueError, msg=text):
                decode_label(text)

    def test_round_trips_random_text(self):
        rng = random.Random(20240611)
        alphabet = "abcxyzAZ09-_. /:é€😀\x00\x7f"
        for n in range(3000):
            if n % 2:
                value = "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
            else:
                value = "".join(_any_char(rng) for _ in range(rng.randrange(8)))
            encoded = encode_label(value)
            self.assertTrue(LABEL.fullmatch(encoded), (value, encoded))
            self.assertEqual(decode_label(encoded), value, encoded)

    def test_decode_accepts_only_encodings(self):
        # Whatever decode accepts, encode writes back exactly.
        rng = random.Random(7)
        alphabet = "abyz09-_.Azcf2d5f"
        for _ in range(5000):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(10)))
            try:
                value = decode_label(text)
            except ValueError:
                continue
            self.assertEqual(encode_label(value), text)


def _any_char(rng: random.Random) -> str:
    """A random code point, surrogates excluded (they are not text)."""
    while True:
        c = rng.choice([rng.randrange(0x80), rng.randrange(0x800), rng.randrange(0x110000)])
        if not 0xD800 <= c <= 0xDFFF:
            return chr(c)


if __name__ == "__main__":
    unittest.main()
