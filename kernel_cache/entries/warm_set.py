"""Warm sets: the entries one program read, kept together so its next process reads them in one go.

A warm process lowering a model reads one record per Triton call: each read is a safe open of
an entry file and its read, about a third of a warm lowering's time per kernel. A warm
set is one ordinary entry (kind "warm-set") holding every entry a process read or wrote through it,
in order: each one's key, metadata and blob sizes in the set's metadata, the blobs back to back in
its one blob, so one checksum and one metadata parse cover them all. The next process whose first
ask is the same key reads the set instead, and keeps only the members the local level still holds
(an entry pruned or evicted since is never served from a set). The set is as trusted as the local
level's own entries; `cachectl verify` checks each member as the kind it says it is.

Its key is the digest of the first key (or signature) asked: the same program starts with the same
call. At exit a set is written to the local level alone, and only where this process read or wrote
keys it did not hold, or some of its members are gone: a warm process repeating its last run
writes nothing. Members are this process's keys first, then the set's others still held, within
MAX_MEMBERS and MAX_BYTES.

A memo record (`memo_entry`, name `LINEAGE`) beside the set points from the first ask's lineage
(the same call under any toolchain, environment or target) to the set last written for it: a
process whose first ask finds no set of its own (an upgrade) reads what the program needed last
time (`predecessor`), for the caller to compile ahead.

A set also keeps the caller's signatures (a digest computed before an entry's key is known) -> a
member's key; the caller vouches that a signature names one key.

This module is the codec; what a session loads, notes and saves is `kernel_cache.front_level`.
"""

from __future__ import annotations

import time
from typing import Any

from kernel_cache.entries.canonical import digest
from kernel_cache.entries.entry import MAX_BLOBS, Entry, is_key
from kernel_cache.entries.summary import META_ARCH, META_CREATED, META_KIND, META_NAME

KIND = "warm-set"
LINEAGE = "warm-set lineage"  # the memo record naming, for a first ask's lineage, the set last written for it
FORMAT = 2  # 2: the signatures of its members ("signed")
MEMBERS_BLOB = "members"
MAX_MEMBERS = 4096  # a model's Triton calls; more are served from the store, one by one
MAX_BYTES = 64 << 20  # read whole at the first record read: past this, one by one is no slower


def set_key(first_key: str) -> str:
    """Where the warm set of the programs whose first ask (a key or a signature) is `first_key` lives."""
    return digest({"kind": KIND, "format": FORMAT, "first": first_key})


def to_entry(first_key: str, members: list[Entry], signed: dict[str, str] | None = None) -> Entry:
    """The set of `members`, in this order, and the `signed` signature -> key pairs whose key is a member."""
    count = len(members)
    blobs = [sorted(m.blobs.items()) for m in members]
    listed = [[m.key, m.meta, [[name, len(data)] for name, data in own]] for m, own in zip(members, blobs)]
    keys = {m.key for m in members}
    pairs = sorted([sig, key] for sig, key in (signed or {}).items() if key in keys)
    meta = {META_KIND: KIND, "format": FORMAT, "first": first_key, META_NAME: f"{count} entr{'y' if count == 1 else 'ies'}",
            "members": listed, "signed": pairs, META_CREATED: time.time()}
    arches = sorted({str(m.meta[META_ARCH]) for m in members if m.meta.get(META_ARCH)})
    if arches:  # what `cachectl list` shows in ARCH: its members' targets
        meta[META_ARCH] = ",".join(arches)
    blob = b"".join(data for own in blobs for _, data in own)
    return Entry(key=set_key(first_key), meta=meta, blobs={MEMBERS_BLOB: blob})


def signed_of(entry: Entry) -> dict[str, str]:
    """{signature: member key} of a well-formed set (`members_of` checks them)."""
    return {sig: key for sig, key in entry.meta["signed"]}


def members_of(entry: Entry) -> dict[str, Entry]:
    """{key: entry} of a well-formed set, in its order; ValueError for anything else."""
    why = _shape_problem(entry)
    if why is not None:
        raise ValueError(why)
    blob, pos, out = memoryview(entry.blobs[MEMBERS_BLOB]), 0, {}
    for key, meta, sizes in entry.meta["members"]:
        blobs = {}
        for name, size in sizes:
            blobs[name] = bytes(blob[pos:pos + size])
            pos += size
        out[key] = Entry(key=key, meta=meta, blobs=blobs)
    return out


def _shape_problem(entry: Entry) -> str | None:
    meta = entry.meta
    if meta.get(META_KIND) != KIND or meta.get("format") != FORMAT:
        return f"not a warm set (kind={meta.get(META_KIND)!r}, format={meta.get('format')!r})"
    first, members = meta.get("first"), meta.get("members")
    if not isinstance(first, str) or not is_key(first) or set_key(first) != entry.key:
        return "warm set filed under a key its first member does not give"
    if not isinstance(members, list) or len(members) > MAX_MEMBERS or set(entry.blobs) != {MEMBERS_BLOB}:
        return f"warm set without a member list of at most {MAX_MEMBERS} and one members blob"
    total = 0
    for member in members:
        why = _member_problem(member)
        if why is not None:
            return why
        total += sum(size for _, size in member[2])
    keys = {member[0] for member in members}
    if len(keys) != len(members):
        return "warm set naming one member twice"
    signed = meta.get("signed")
    if (not isinstance(signed, list) or len(signed) > MAX_MEMBERS
            or not all(isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str) and is_key(pair[0])
                       and isinstance(pair[1], str) and pair[1] in keys for pair in signed)
            or len({pair[0] for pair in signed}) != len(signed)):
        return "warm set whose signatures are not [signature, member key], each signature once"
    if total != len(entry.blobs[MEMBERS_BLOB]):
        return "warm set members' sizes do not add up to its members blob"
    return None


def _member_problem(member: Any) -> str | None:
    if (not isinstance(member, list) or len(member) != 3 or not isinstance(member[0], str) or not is_key(member[0])
            or not isinstance(member[1], dict) or not isinstance(member[2], list) or len(member[2]) > MAX_BLOBS):
        return "warm set member that is not [key, metadata, blob sizes]"
    names = [blob[0] for blob in member[2] if isinstance(blob, list) and len(blob) == 2]
    if (len(names) != len(member[2]) or len(set(names)) != len(names)
            or not all(isinstance(name, str) for name in names)
            or not all(type(size) is int and size >= 0 for _, size in member[2])):
        return f"warm set member {member[0][:12]} with blob sizes that are not [name, size], names once"
    return None


def problem(entry: Entry) -> str | None:
    """Why `entry` is not a usable warm set, or None: its shape. The kind's check in `entry_kinds`,
    which also checks each member as the kind it says it is."""
    try:
        members_of(entry)
    except ValueError as exc:
        return str(exc)
    return None


def summary(meta: dict[str, Any]) -> dict[str, Any] | None:
    """What list/show print for a warm set (None for other entries); tolerates anything."""
    if meta.get(META_KIND) != KIND:
        return None
    members = meta.get("members")
    return {"first": str(meta.get("first", "")), "members": len(members) if isinstance(members, list) else 0}
