"""The on-disk entry format: one self-describing, checksummed byte string per cache entry.

Layout (little-endian):
    magic      8 bytes   b"KCACHE\\x00\\x01"
    version    u16       ENTRY_FORMAT_VERSION
    reserved   u16
    meta_len   u32       length of the JSON metadata
    n_blobs    u32
    payload    u64       length of everything after the header
    checksum   16 bytes  xxh3-128 of the header fields above and the payload
  payload:
    metadata   meta_len bytes of UTF-8 JSON (includes the entry's own key)
    n_blobs x  [u16 name_len][name][u64 size][bytes]
  optional signature trailer (see kernel_cache.trust.signing), outside the checksum:
    magic      8 bytes   b"KCSIG\x00\x01\x00"
    key id     8 bytes   which signing key
    mac       32 bytes   HMAC-SHA256 over everything before the trailer

The xxh3 checksum catches accidents (flipped bits, truncation); anyone can recompute it, so it
proves nothing about who wrote an entry: that is the signature's job. Nothing here is ever executed
or unpickled; `decode` raises `CorruptEntry`, which every level turns into a miss and a removal.
"""

from __future__ import annotations

import json
import re
import struct
from array import array
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import xxhash

from kernel_cache.errors import KernelCacheError

MAGIC = b"KCACHE\x00\x01"
ENTRY_FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sHHIIQ16s")
_FIELDS = struct.Struct("<8sHHIIQ")  # the header without its checksum
_BLOB_NAME = struct.Struct("<H")
_BLOB_SIZE = struct.Struct("<Q")
MAX_BLOBS = 64
DEFAULT_MAX_ENTRY_BYTES = 256 << 20  # real entries are KiB to a few MiB; a larger file is refused unread
MAX_META_DEPTH = 32  # our metadata nests 3 levels; deeper JSON is hostile (RecursionError bait)
KEY_LENGTH = 32  # xxh3-128 as lower-case hex
_KEY = KEY_PATTERN = re.compile(r"[0-9a-f]{32}")  # a key, whole: `KEY_PATTERN.fullmatch(name)`
SIGNATURE_MAGIC = b"KCSIG\x00\x01\x00"
SIGNATURE_SIZE = len(SIGNATURE_MAGIC) + 8 + 32


class InvalidKey(KernelCacheError, ValueError):
    """Not a content key: keys become file names, so only lower-case hex of one length passes."""


def check_key(key: object) -> str:
    if not isinstance(key, str) or _KEY.fullmatch(key) is None:
        raise InvalidKey(f"not a content key (expected {KEY_LENGTH} lower-case hex digits): {str(key)[:80]!r}")
    return key


# A str key tested without a Python frame (a C call: the hot paths' `key_ok(key) or check_key(key)`);
# check_key raises with the key shown, for anything that is not one.
key_ok = _KEY.fullmatch


def is_key(name: str) -> bool:
    return _KEY.fullmatch(name) is not None


def split_signature(data: bytes) -> tuple[bytes, bytes | None]:
    """(entry without trailer, trailer or None); a trailer whose position or magic does not fit is left
    for `read_header` to reject."""
    if len(data) >= _HEADER.size + SIGNATURE_SIZE:
        start = len(data) - SIGNATURE_SIZE
        if data[start:start + len(SIGNATURE_MAGIC)] == SIGNATURE_MAGIC:
            (payload_len,) = struct.unpack_from("<Q", data, _FIELDS.size - 8)
            if _HEADER.size + payload_len == start:
                return data[:start], data[start:]
    return data, None


class CorruptEntry(KernelCacheError, ValueError):
    """The bytes are not a valid entry (truncated, flipped, foreign, or for another key)."""


@dataclass
class Entry:
    key: str
    meta: dict[str, Any]
    blobs: dict[str, bytes] = field(default_factory=dict)
    # The bytes a persistent level read it from (signed where they were), so a hit is copied into the
    # faster levels as it is stored, never encoded or signed again; None for an entry built here.
    stored: bytes | None = field(default=None, repr=False, compare=False)

    @property
    def size(self) -> int:
        return sum(len(b) for b in self.blobs.values())


def encode(entry: Entry) -> bytes:
    meta = dict(entry.meta)
    meta["key"] = entry.key
    meta_bytes = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
    parts = [meta_bytes]
    if len(entry.blobs) > MAX_BLOBS:
        raise ValueError(f"an entry holds at most {MAX_BLOBS} blobs")
    for name, data in sorted(entry.blobs.items()):
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError(f"blob '{name}' must be bytes, got {type(data).__name__}")
        raw = name.encode()
        parts += [_BLOB_NAME.pack(len(raw)), raw, _BLOB_SIZE.pack(len(data)), bytes(data)]
    payload = b"".join(parts)
    fields = _FIELDS.pack(MAGIC, ENTRY_FORMAT_VERSION, 0, len(meta_bytes), len(entry.blobs), len(payload))
    return fields + _checksum(fields, payload) + payload


def _checksum(fields: bytes, payload: bytes | memoryview) -> bytes:
    h = xxhash.xxh3_128()
    h.update(fields)
    h.update(payload)
    return bytes(h.digest())


def read_header(data: bytes, total_size: int | None = None) -> tuple[int, int, int, bytes]:
    """(meta_len, n_blobs, payload_len, checksum), checked against the entry's size (`total_size`, else `len(data)`)."""
    if len(data) < _HEADER.size:
        raise CorruptEntry(f"entry is truncated ({len(data)} bytes, header needs {_HEADER.size})")
    magic, version, _, meta_len, n_blobs, payload_len, checksum = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CorruptEntry("not a kernel-cache entry (bad magic)")
    if version != ENTRY_FORMAT_VERSION:
        raise CorruptEntry(f"entry format version {version}, this kernel-cache reads {ENTRY_FORMAT_VERSION}")
    size = len(data) if total_size is None else total_size
    if size - _HEADER.size == payload_len + SIGNATURE_SIZE and total_size is not None:
        size -= SIGNATURE_SIZE  # a signed entry read by its header only (peek_meta_head)
    if size - _HEADER.size != payload_len:
        raise CorruptEntry(f"entry is truncated or padded (payload {size - _HEADER.size} bytes, "
                           f"header says {payload_len})")
    return meta_len, n_blobs, payload_len, checksum


def _parse_meta(raw: bytes) -> dict[str, Any]:
    """The metadata, held to MAX_META_DEPTH, measured on the text before the parser recurses."""
    if raw.count(b"[") + raw.count(b"{") > MAX_META_DEPTH and json_depth(raw) > MAX_META_DEPTH:
        raise CorruptEntry(f"entry metadata nests deeper than {MAX_META_DEPTH} levels")
    try:
        meta = json.loads(raw)
    except ValueError as exc:
        raise CorruptEntry(f"entry metadata is not JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise CorruptEntry("entry metadata is not a JSON object")
    return meta


_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_BRACKETS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def json_depth(raw: bytes) -> int:
    """How deeply the arrays and objects of the JSON text `raw` nest, without parsing it (so without
    recursion): strings are dropped, brackets counted +1/-1 (in C, as signed bytes)."""
    skeleton = _JSON_STRING.sub(b"", raw).translate(_BRACKETS, _NOT_BRACKETS)
    return max(accumulate(array("b", skeleton)), default=0)


def decode(data: bytes, expected_key: str | None = None) -> Entry:
    """Parse and validate `data` (a signature trailer is the store's to check)."""
    raw = data if type(data) is bytes else bytes(data)
    data, _ = split_signature(raw)
    meta_len, n_blobs, _, checksum = read_header(data)
    payload = memoryview(data)[_HEADER.size:]
    if _checksum(data[:_FIELDS.size], payload) != checksum:
        raise CorruptEntry("entry checksum mismatch")
    if n_blobs > MAX_BLOBS or meta_len > len(payload):
        raise CorruptEntry("entry header is inconsistent")
    meta = _parse_meta(bytes(payload[:meta_len]))
    if not isinstance(meta.get("key"), str):
        raise CorruptEntry("entry metadata has no key")
    pos, blobs = meta_len, {}
    try:
        for _ in range(n_blobs):
            (name_len,) = _BLOB_NAME.unpack_from(payload, pos)
            pos += _BLOB_NAME.size
            name = bytes(payload[pos:pos + name_len]).decode()
            pos += name_len
            (size,) = _BLOB_SIZE.unpack_from(payload, pos)
            pos += _BLOB_SIZE.size
            if pos + size > len(payload):
                raise CorruptEntry(f"blob '{name}' runs past the end of the entry")
            blobs[name] = bytes(payload[pos:pos + size])
            pos += size
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptEntry(f"entry blob table is malformed: {exc}") from None
    if pos != len(payload):
        raise CorruptEntry("entry has trailing bytes")
    key = meta.pop("key")
    if expected_key is not None and key != expected_key:
        raise CorruptEntry(f"entry holds key {key[:12]}…, expected {expected_key[:12]}…")
    return Entry(key=key, meta=meta, blobs=blobs, stored=raw)


def peek_meta(data: bytes) -> dict[str, Any]:
    """The metadata without checksumming the blobs (for listings of large caches)."""
    return peek_meta_head(data, len(data))


def peek_meta_head(head: bytes, total_size: int) -> dict[str, Any]:
    """The metadata of an entry of `total_size` bytes from its first `META_PEEK_BYTES` bytes (or all of it)."""
    meta_len, _, _, _ = read_header(head, total_size=total_size)
    if len(head) < _HEADER.size + meta_len:
        raise CorruptEntry(f"entry metadata ({meta_len} bytes) is larger than listings read")
    return _parse_meta(head[_HEADER.size:_HEADER.size + meta_len])


META_PEEK_BYTES = 1 << 16
