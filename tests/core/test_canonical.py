"""The one canonical encoding (kernel_cache.entries.canonical): every value tagged with its type, one text for
equal documents, and the one-pass text writer equal to the tagged form's text for every kind of value
(content keys hash the tagged form; record fingerprints, encoded on every lowering, the one-pass text)."""

from __future__ import annotations

import enum
from typing import NamedTuple

import numpy as np
import pytest

import compiler
from compiler.examples import add_kernel
from compiler.spec import triton_value
from kernel_cache.entries.canonical import canonical, canonical_text, digest, digest_text, items_text, spliced_digest, text
from lowering.records.call_key import lowering_value as _lowering_value


class Color(enum.IntEnum):
    RED = 1


class Pair(NamedTuple):
    a: int
    b: str


class Name(str):
    pass


VALUES = [
    None, True, False, 0, -7, 1 << 80, 1.0, -0.0, float("inf"), float("nan"), 1e-300, "", "a\"b\\c\n\t", "ünï ✓",
    b"", b"\x00\xff", [], (), [1, [2, (3, "x")]], {"b": 1, "a": 2.0}, {1: "int key", "1": "str key", (2, 3): None},
    {"nested": {"k": [True, None, b"z"]}}, Pair(1, "x"), Color.RED, np.float64(0.5), Name("subclass"),
    [{"BLOCK": 1024, "SCALE": 0.5}, 4, 3, 1, (4, 1, 1), [], "default", ["BLOCK", "SCALE"]],
]


@pytest.mark.parametrize("value", VALUES, ids=[repr(v)[:30] for v in VALUES])
def test_the_one_pass_text_is_the_tagged_forms_text(value):
    assert canonical_text(value) == text(canonical(value))


def test_values_a_floor_above_knows_go_through_its_extension():
    values = [compiler.Scalar("i32", 4096), [compiler.Scalar("fp32", 0.5), "*fp32"], {"fn": add_kernel}]
    for value in values:
        assert canonical_text(value, _lowering_value) == text(canonical(value, _lowering_value))
    assert canonical(add_kernel, triton_value) == {"jit": compiler.triton_compat.kernel_fingerprint(add_kernel)}
    for encode in (canonical, canonical_text):
        with pytest.raises(TypeError, match="cannot build a cache key from object"):
            encode([1, object()])


def test_types_never_collide():
    forms = [1, 1.0, True, "1", b"1", [1], (1,), Pair(1, "1"), {1: 1}, {"1": 1}, None, "null"]
    assert len({digest(canonical(v)) for v in forms}) == len(forms)
    assert len({canonical_text(v) for v in forms}) == len(forms)


def test_equal_documents_have_one_text():
    assert canonical_text({"a": 1, "b": 2}) == canonical_text({"b": 2, "a": 1})
    assert canonical(Color.RED) == canonical(1)  # an IntEnum is the int it stands for


def test_a_spliced_document_has_the_whole_documents_digest():
    """A record key is spliced from memoized texts (the installation's, the function's, the module's):
    the digest is that of the whole document."""
    head, first, rest = ["kernel", 1, {"a": 2.0}], [[["TRITON_X", "1"]], (0, 12)], [None, ["*fp32", 7], b"m"]
    whole = digest_text("[" + canonical_text(head) + "," + canonical_text([first, *rest]) + "]")
    assert spliced_digest(canonical_text(head), [first, *rest]) == whole
    assert spliced_digest(canonical_text(head), rest, rest_head=canonical_text(first)) == whole
    assert "{\"list\":[" + items_text(rest) + "]}" == canonical_text(rest)
