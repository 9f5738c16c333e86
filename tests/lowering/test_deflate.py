"""lowering.payload.deflate: a zlib stream spliced from stored runs inflates to exactly the payload."""

from __future__ import annotations

import os
import zlib

from compiler.artifact import deflate_run
from kernel_cache.bounded_memo import SizedLRU
from lowering.payload import deflate

PTX = (b".version 8.4\n.target sm_90\n" + b"ld.global.f32 %f1, [%rd1];\n" * 3000)
CUBIN = os.urandom(20000) + b"\x00" * 9000


def _runs(*parts: bytes) -> list[tuple[bytes, bytes]]:
    return [(p, deflate_run(p)) for p in parts]


def test_spliced_streams_inflate_to_the_payload():
    payloads = [b"head" + PTX + b"mid" * 7 + CUBIN + b"tail", PTX + CUBIN, PTX, b"", b"x" * 10,
                CUBIN + b"between" + PTX]
    for payload in payloads:
        out = deflate.compress(payload, _runs(PTX, CUBIN))
        assert zlib.decompress(out) == payload
    # the stored runs are used, not recomputed: the spliced stream contains them verbatim
    assert deflate_run(PTX) in deflate.compress(b"a" + PTX + b"b", _runs(PTX))


def test_parts_missing_repeated_or_overlapping_are_deflated_as_usual():
    payload = b"<" + PTX + b">" + PTX + b"|"
    assert zlib.decompress(deflate.compress(payload, _runs(PTX, PTX[100:9000], b"not there" * 600))) == payload
    # a part whose run does not match its bytes would corrupt the stream: runs come only from
    # deflated(), keyed by a digest of the bytes
    assert deflate.deflated(CUBIN, None) == deflate_run(CUBIN) == deflate.deflated(CUBIN, None)


def test_a_bytes_lru_keeps_its_byte_budget():
    memo = SizedLRU.of_bytes(max_bytes=1000)
    for i in range(10):
        memo.put(i, b"x" * 200)
    kept = [i for i in range(10) if memo.get(i) is not None]
    assert kept == [5, 6, 7, 8, 9]
    memo.put("big", b"y" * 600)  # over a quarter of the budget: not kept
    assert memo.get("big") is None
