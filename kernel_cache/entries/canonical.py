"""The one canonical encoding of a keyed value: JSON where every value carries its type.

Content keys (`compiler.key`), autotune winner keys (`kernel_cache.entries.winner_entry`) and lowered-call record
fingerprints (`lowering.records.call_records`) are all `digest`s of documents encoded here, so the int 1,
the float 1.0, True and the string "1" never collide in any of them. A floor above adds the values
only it knows (a Triton @jit function, a `compiler.Scalar`) through `extend`, which returns their
tagged form or raises TypeError; what nothing knows is a TypeError naming the value.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import xxhash

from kernel_cache.sanitize import echo

Extension = Callable[[Any], Any]  # a value this floor knows -> its tagged form; TypeError otherwise


def canonical(value: Any, extend: Extension | None = None) -> Any:
    """A JSON-able, type-tagged form of `value`: None and strings as themselves, other scalars as
    {type: text} (bytes as hex), a list or tuple as {type name: items}, a dict as {"dict": [[key, value], ...]} in
    the order of the keys' reprs. Raises TypeError for what cannot be keyed."""
    kind = type(value)
    if value is None or kind is str:
        return value
    if kind is bool:
        return {"bool": value}
    if kind is int:
        return {"int": str(value)}
    if kind is bytes:
        return {"bytes": value.hex()}
    if isinstance(value, (list, tuple)):
        return {kind.__name__: [canonical(v, extend) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[canonical(k, extend), canonical(v, extend)]
                         for k, v in sorted(value.items(), key=lambda kv: repr(kv[0]))]}
    return _scalar(value, extend)


def _scalar(value: Any, extend: Extension | None) -> Any:
    """Floats, and subclasses of the plain scalars (an IntEnum, numpy's float64) as their base type
    encodes them; then `extend`."""
    if isinstance(value, str):
        return value
    if isinstance(value, int):  # bool has no subclasses: an int here is an int's
        return {"int": str(value)}
    if isinstance(value, float):
        return {"float": value.hex()}
    if extend is not None:
        return extend(value)
    raise TypeError(f"cannot build a cache key from {type(value).__name__}: {echo(value)}")


_string = json.encoder.encode_basestring_ascii  # as json.dumps writes a string (ensure_ascii)


def _leaf(value: Any) -> str | None:
    """The text of a plain leaf (the common case), or None."""
    kind = type(value)
    if kind is str:
        return _string(value)
    if kind is int:
        return '{"int":"' + str(value) + '"}'
    if value is None:
        return "null"
    if kind is bool:
        return '{"bool":true}' if value else '{"bool":false}'
    if kind is float:
        return '{"float":"' + str(value.hex()) + '"}'
    if kind is bytes:
        return '{"bytes":"' + str(value.hex()) + '"}'
    return None


_OPEN: dict[type, str] = {list: '{"list":[', tuple: '{"tuple":['}  # a plain list's or tuple's opening


def canonical_text(value: Any, extend: Extension | None = None) -> str:
    """`text(canonical(value, extend))` in one pass, without building the tagged form (a test keeps
    the two equal): a lowered call's key is encoded on every lowering, so a list's strings and ints
    are written inline (no call per leaf) and each container's items are joined once."""
    kind = type(value)
    if kind is list or kind is tuple:
        return _OPEN[kind] + ",".join([_string(item) if type(item) is str else
                                       '{"int":"' + str(item) + '"}' if type(item) is int else
                                       canonical_text(item, extend) for item in value]) + "]}"
    if kind is dict:
        return _dict_text(value, extend)
    leaf = _leaf(value)
    if leaf is not None:
        return leaf
    if isinstance(value, (list, tuple)):
        return "{" + _string(kind.__name__) + ":[" + ",".join([canonical_text(item, extend) for item in value]) + "]}"
    if isinstance(value, dict):
        return _dict_text(value, extend)
    return text(_scalar(value, extend))


def _dict_text(value: dict[Any, Any], extend: Extension | None) -> str:
    return '{"dict":[' + ",".join(["[" + (_string(k) if type(k) is str else canonical_text(k, extend)) + "," +
                                   (_string(v) if type(v) is str else canonical_text(v, extend)) + "]"
                                   for k, v in sorted(value.items(), key=lambda kv: repr(kv[0]))]) + "]}"


# The one hash of a document (content keys, winner keys, lowered-call keys, the toolchain summary):
# xxh3-128, here, so no floor keeps a copy of its own.


def text(document: Any) -> str:
    """The canonical text of a JSON document: what `digest` hashes."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


def digest_text(document_text: str) -> str:
    return str(xxhash.xxh3_128_hexdigest(document_text.encode()))


def digest(document: Any) -> str:
    return digest_text(text(document))


def spliced_digest(head_text: str, rest: Any, extend: Extension | None = None, rest_head: str = "") -> str:
    """`digest([head, rest])` where `head_text` is the caller's memoized canonical text of `head` (JSON
    text is compositional); `rest_head`, where given, the memoized text of `rest`'s list's first item."""
    if not rest_head:
        return digest_text("[" + head_text + "," + canonical_text(rest, extend) + "]")
    return digest_text("[" + head_text + ',{"list":[' + rest_head + "," + items_text(rest, extend) + "]}]")


def items_text(values: list[Any], extend: Extension | None = None) -> str:
    """`canonical_text(values)` without the list's own brackets, to join with memoized items."""
    whole = canonical_text(values, extend)
    return whole[len(_OPEN[list]):-2]
