"""Lowered-call records: a whole Triton call's launch payload, kept under a fingerprint of the call.

Serving a call kernel by kernel costs a content key, a store read and a proto per config; a record
turns a call seen before (in any process) into one store read: the zlib-compressed proto jaxlib
launches. It is an ordinary entry (kind "lowered-call"), keyed by a fingerprint the lowering computes
from everything the payload is built from (`lowering.records.call_records`). It holds a second copy
of its kernels' binaries, so it still serves when they are pruned.

An autotuned call lowered where persisted winners apply also names its winner key: a reader that
finds a winner stored since then goes to that winner's own record instead (`redirect`).
"""

from __future__ import annotations

import time
import zlib
from typing import Any

from kernel_cache.entries.canonical import digest
from kernel_cache.entries.entry import KEY_PATTERN, Entry
from kernel_cache.entries.summary import (
    META_ARCH,
    META_COMPILE_SECONDS,
    META_CREATED,
    META_KIND,
    META_NAME,
    META_TARGET,
    META_TOOLCHAIN,
)
from kernel_cache.value_class import FrozenValue

KIND = "lowered-call"
FORMAT = 1
WINNER_FORMAT = 2  # the call key's format (lowering.records.call_key.FORMAT) when winner records moved here
PAYLOAD_BLOB = "payload"
# A payload inflates to the proto jaxlib parses; verify inflates at most this much of it.
_MAX_PROTO_BYTES = 1 << 30


class CallRecord(FrozenValue):
    """One lowered call: what it launches (its kernels' content keys) and the payload, if kept."""

    key: str  # the call's fingerprint
    kernel: str  # the kernel function's name
    call_name: str  # the call's own name (jax-triton's `name=`)
    platform: str  # cuda / rocm
    arch: str
    target: dict[str, Any]
    toolchain: str  # the toolchain summary of its kernels
    config_keys: tuple[str, ...]  # content keys of the kernels the payload launches, in order
    compile_seconds: float  # what compiling those kernels cost (hits count it as saved)
    payload: bytes | None  # None: only the winner key is kept (the call lowers as its winner)
    winner_key: str  # set where persisted winners applied when it was lowered
    created: float

    def __init__(self, key: str, kernel: str, call_name: str, platform: str, arch: str, target: dict[str, Any],
                 toolchain: str, config_keys: tuple[str, ...], compile_seconds: float, payload: bytes | None,
                 winner_key: str = "", created: float = 0.0) -> None:
        self.__dict__.update(key=key, kernel=kernel, call_name=call_name, platform=platform, arch=arch, target=target,
                             toolchain=toolchain, config_keys=config_keys, compile_seconds=compile_seconds,
                             payload=payload, winner_key=winner_key, created=created)

    @property
    def autotuned(self) -> bool:
        return len(self.config_keys) > 1

    def serves(self, chosen: str | None) -> bool:
        """Whether this record's payload is what its call lowers to, given the winner stored now under
        its winner key (`chosen`, as in `redirect`)."""
        if not self.winner_key:
            return True
        if self.autotuned:
            return self.redirect(chosen) is None
        return chosen is not None and chosen == self.config_keys[0]

    def redirect(self, chosen: str | None) -> str | None:
        """The key of the winner's own record, where the winner stored now under this record's winner key
        (`chosen`: its content key, or None) is one of this call's configs; else None (this one)."""
        if not self.winner_key or chosen is None or chosen not in self.config_keys:
            return None
        return winner_record_key(self.key, chosen)

    def to_entry(self) -> Entry:
        meta = {META_KIND: KIND, "format": FORMAT, META_NAME: self.kernel, META_ARCH: self.arch,
                META_TARGET: self.target, META_TOOLCHAIN: {"summary": self.toolchain},
                META_COMPILE_SECONDS: self.compile_seconds, META_CREATED: self.created or time.time(),
                "call_name": self.call_name, "platform": self.platform, "config_keys": list(self.config_keys),
                "winner_key": self.winner_key}
        blobs = {PAYLOAD_BLOB: self.payload} if self.payload is not None else {}
        return Entry(key=self.key, meta=meta, blobs=blobs)

    @classmethod
    def from_entry(cls, entry: Entry) -> "CallRecord":
        """The record in `entry`; ValueError for anything that is not a well-formed one."""
        meta = entry.meta
        if meta.get(META_KIND) != KIND or meta.get("format") != FORMAT:
            raise ValueError(f"not a lowered-call record (kind={meta.get(META_KIND)!r}, format={meta.get('format')!r})")
        try:
            config_keys = tuple(meta["config_keys"])
            record = cls(key=entry.key, kernel=expect_text(meta[META_NAME]), call_name=expect_text(meta["call_name"]),
                         platform=expect_text(meta["platform"]), arch=expect_text(meta[META_ARCH]),
                         target=dict(meta[META_TARGET]), toolchain=expect_text(meta[META_TOOLCHAIN]["summary"]),
                         config_keys=config_keys,
                         compile_seconds=float(meta[META_COMPILE_SECONDS]), payload=entry.blobs.get(PAYLOAD_BLOB),
                         winner_key=expect_text(meta.get("winner_key", "")), created=float(meta[META_CREATED]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed lowered-call record: {type(exc).__name__}: {exc}") from None
        if not config_keys or not all(isinstance(k, str) and KEY_PATTERN.fullmatch(k) for k in config_keys):
            raise ValueError("lowered-call record lists no kernels, or a kernel key that is no content key")
        if record.winner_key and not KEY_PATTERN.fullmatch(record.winner_key):
            raise ValueError("lowered-call record names a winner key that is no key")
        if record.payload is None and not record.winner_key:
            raise ValueError("lowered-call record holds neither a payload nor a winner key")
        return record


def expect_text(value: Any) -> str:
    """`value` where it is text (a record's field); TypeError otherwise."""
    if not isinstance(value, str):
        raise TypeError(f"expected text, got {type(value).__name__}")
    return value


def winner_record_key(call_key: str, chosen: str) -> str:
    """Where the record of the call keyed `call_key`, lowered as its winner `chosen` alone, lives."""
    return digest(["kernel-cache lowered call", WINNER_FORMAT, call_key, "winner", chosen])


def problem(entry: Entry) -> str | None:
    """Why `entry` is not a usable record (malformed, or its payload no complete zlib stream), or None."""
    try:
        record = CallRecord.from_entry(entry)
    except ValueError as exc:
        return str(exc)
    if record.payload is not None:
        inflater = zlib.decompressobj()
        try:
            inflater.decompress(record.payload, _MAX_PROTO_BYTES)
        except zlib.error as exc:
            return f"lowered-call payload is not a zlib stream: {exc}"
        if not inflater.eof or inflater.unconsumed_tail or inflater.unused_data:
            return "lowered-call payload is truncated, too large, or followed by other bytes"
    return None


def summary(meta: dict[str, Any]) -> dict[str, Any] | None:
    """What list/show print for a record (None for other entries); tolerates anything."""
    if meta.get(META_KIND) != KIND:
        return None
    keys = meta.get("config_keys")
    return {"call_name": str(meta.get("call_name", "")), "platform": str(meta.get("platform", "")),
            "kernels": [str(k) for k in keys] if isinstance(keys, list) else [],
            "winner_key": str(meta.get("winner_key", ""))}
