"""berth's tag conventions, the `list` and `set-tags` rules, and a label
encoding for clouds that restrict tag values.

Tags are an ordered list of `(key, value)` pairs. berth's own keys all start
with `BERTH_PREFIX`; a driver stores every tag verbatim and returns it
verbatim, because after a restart the cloud's tags are the only record of
which instances belong to which pool.

Some clouds only take label values of lowercase letters, digits, `-` and
`_` (GCP, Hetzner and Kubernetes labels, for example). `encode_label` writes
any text in that alphabet and `decode_label` reads it back, so such a driver
can still return every tag verbatim.

Nothing here needs the component's bindings.
"""

from typing import Dict, List, Optional, Sequence, Tuple

Tags = List[Tuple[str, str]]

# The prefix of every tag key berth owns.
BERTH_PREFIX = "berth-"
# The pool an instance belongs to; its value is the pool id.
POOL_TAG = "berth-pool"
# The berth node an instance serves.
NODE_TAG = "berth-node"
# The label an instance was created for.
LABEL_TAG = "berth-label"
# The node's idle behaviour (`run`, `hold`, `drain`).
IDLE_TAG = "berth-idle"
# On a backing instance: how many slots it has.
SLOTS_TAG = "berth-slots"
# On a backing instance: the slot label its slots serve.
SLOT_LABEL_TAG = "berth-slot-label"


def tag(tags: Sequence[Tuple[str, str]], key: str) -> Optional[str]:
    """The value of the first tag named `key`, if any."""
    return next((v for k, v in tags if k == key), None)


def has_all(tags: Sequence[Tuple[str, str]], filter: Sequence[Tuple[str, str]]) -> bool:
    """Whether `tags` carries every `(key, value)` pair of `filter` (the rule
    of `list`). An empty filter matches everything."""
    return all((k, v) in tags for k, v in filter)


def is_berth_tag(key: str) -> bool:
    """Whether `key` is one of berth's own tag keys."""
    return key.startswith(BERTH_PREFIX)


def replace_berth_tags(
    existing: Sequence[Tuple[str, str]], new: Sequence[Tuple[str, str]]
) -> Tags:
    """The tags an instance ends up with after `set-tags(new)` on an instance
    tagged `existing`: every berth tag of `existing` is dropped, every other
    tag is kept in place, then the berth tags of `new` are appended in order.

    Entries of `new` that are not berth tags are ignored, since `set-tags`
    leaves the cloud's other tags alone. When `new` names a key twice, the
    last value wins, in the place of the first."""
    out: Tags = [(k, v) for k, v in existing if not is_berth_tag(k)]
    placed: Dict[str, int] = {}
    for k, v in new:
        if not is_berth_tag(k):
            continue
        if k in placed:
            out[placed[k]] = (k, v)
        else:
            placed[k] = len(out)
            out.append((k, v))
    return out


_LITERAL = frozenset("abcdefghijklmnopqrstuvwxy0123456789")
_INNER = frozenset("-_")
_HEX = frozenset("0123456789abcdef")


def encode_label(value: str) -> str:
    """`value` in the alphabet of restricted label values: lowercase letters,
    digits, `-` and `_`, with a letter or digit at both ends.

    `a`-`y` and `0`-`9` are kept, and so are `-` and `_` except as the first
    or last character. Every other character is written as its UTF-8 bytes,
    each as `z` and two lowercase hex digits (`z` itself is `z7a`, `.` is
    `z2e`, `é` is `zc3za9`). Text that is already a plain label without `z`
    comes out unchanged.

    An escaped character takes 3 to 12 characters; a cloud's length limit
    (63 for the clouds above) is the caller's to check."""
    n = len(value)
    out = []
    for i, c in enumerate(value):
        if c in _LITERAL or (c in _INNER and 0 < i < n - 1):
            out.append(c)
        else:
            out.extend(f"z{b:02x}" for b in c.encode("utf-8"))
    return "".join(out)


def decode_label(text: str) -> str:
    """The value `encode_label` wrote as `text`. Raises `ValueError` for any
    text it cannot have written: an uppercase letter or other character
    outside the alphabet, a `z` without two lowercase hex digits after it, an
    escaped character that would have been kept, `-` or `_` at either end,
    or escapes that are not UTF-8."""
    raw = bytearray()
    i = 0
    while i < len(text):
        c = text[i]
        if c == "z":
            pair = text[i + 1 : i + 3]
            if len(pair) != 2 or not _HEX.issuperset(pair):
                raise ValueError(f"label {text!r}: `z` at {i} is not followed by two hex digits")
            raw.append(int(pair, 16))
            i += 3
        elif c in _LITERAL or c in _INNER:
            raw.append(ord(c))
            i += 1
        else:
            raise ValueError(f"label {text!r}: {c!r} at {i} is not a label character")
    try:
        value = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"label {text!r}: escapes are not UTF-8: {e.reason}") from None
    # Each value has one encoding; any other spelling is refused.
    canonical = encode_label(value)
    if canonical != text:
        raise ValueError(f"label {text!r}: {value!r} encodes as {canonical!r}")
    return value
