"""A zlib stream assembled from pieces, so a call's large fixed parts are deflated once, not per call.

jaxlib takes a Triton call as one zlib stream; most of its bytes are a kernel's PTX and cubin, the
same for every call of that kernel. Each piece is an independent raw-deflate run (fresh dictionary)
ending on a byte boundary (Z_FULL_FLUSH), and such runs concatenate: the stream is the zlib header,
the runs in order (all level 1: jaxlib inflates any level), an empty final block and the Adler-32 of
all the raw bytes. Fixed parts come deflated with their entry or from a per-process memo.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

import xxhash

from compiler.artifact import deflate_run
from kernel_cache.bounded_memo import SizedLRU

_HEADER = b"\x78\x01"  # deflate, 32K window, level hint "fastest"
_FINAL = b"\x03\x00"  # an empty final block (fixed Huffman, end-of-block code only)


_runs = SizedLRU.of_bytes(max_bytes=128 << 20)  # raw part digest -> its run, for entries stored without runs


def deflated(raw: bytes, stored: bytes | None) -> bytes:
    """The run for a fixed part: `stored` when the entry carried it, else from the memo or made now."""
    if stored is not None:
        return stored
    digest = xxhash.xxh3_128_digest(raw) + len(raw).to_bytes(8, "little")
    run = _runs.get(digest)
    if run is None:
        run = deflate_run(raw)
        _runs.put(digest, run)
    return run


def compress(payload: bytes, fixed: Iterable[tuple[bytes, bytes]]) -> bytes:
    """zlib.compress(payload), equivalent for any inflater, reusing the runs of `fixed` parts
    (raw bytes, their run) wherever they occur in `payload`; parts not found are deflated as usual."""
    spans = []
    for raw, run in fixed:
        if len(raw) < 4096:  # not worth a separate run
            continue
        at = _find(payload, raw)
        if at >= 0:
            spans.append((at, at + len(raw), run))
    spans.sort()
    out = [_HEADER]
    pos = 0
    for start, end, run in spans:
        if start < pos:  # overlapping parts (the same bytes twice): deflate the later one normally
            continue
        if start > pos:
            out.append(deflate_run(payload[pos:start]))
        out.append(run)
        pos = end
    if pos < len(payload):
        out.append(deflate_run(payload[pos:]))
    out.append(_FINAL)
    out.append(zlib.adler32(payload).to_bytes(4, "big"))
    return b"".join(out)


def _find(payload: bytes, raw: bytes) -> int:
    """Where `raw` starts in `payload` (-1: nowhere): a short prefix search, then one comparison
    (a search for the whole of a large part would scan it byte by byte)."""
    prefix = raw[:64]
    at = payload.find(prefix)
    while at >= 0:
        if payload[at:at + len(raw)] == raw:
            return at
        at = payload.find(prefix, at + 1)
    return -1
