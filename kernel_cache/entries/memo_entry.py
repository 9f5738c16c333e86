"""Memo records: a text derived from an identity, kept as an ordinary entry (kind "installed-memo").
Shared: one derived from installed files (a toolchain fingerprint, a plugin's layout), so a fresh
node need not rehash, rerun or rescan what every node with the same installation already derived (a
large part of its first lowering). Local: a warm set's lineage (`warm_set.LINEAGE`).

Its key is the digest of the memo's name and the identity of the files the text is derived from, as
the writer's node saw them (path, size, mtime, ctime and inode of each: a reinstall or an edit is
another identity). The record repeats name and identity, and a reader takes its text only where they
are its own (`text_for`), never by the key alone.
"""

from __future__ import annotations

import time
from typing import Any

from kernel_cache.entries.canonical import digest
from kernel_cache.entries.entry import Entry
from kernel_cache.entries.summary import META_CREATED, META_KIND, META_NAME

KIND = "installed-memo"
FORMAT = 1
TEXT_BLOB = "text"
MAX_TEXT_BYTES = 1 << 20  # a memo's text is a fingerprint or a small layout: more is no memo of ours


def memo_key(name: str, identity: Any) -> str:
    return digest({"kind": KIND, "format": FORMAT, "name": name, "identity": identity})


def to_entry(name: str, identity: Any, text: str) -> Entry:
    meta = {META_KIND: KIND, "format": FORMAT, META_NAME: name, "identity": identity, META_CREATED: time.time()}
    return Entry(key=memo_key(name, identity), meta=meta, blobs={TEXT_BLOB: text.encode()})


def text_for(entry: Entry, name: str, identity: Any) -> str | None:
    """The memo's text where `entry` is a well-formed record of `name` for exactly `identity`
    (compared as JSON documents: what the key was made of); None otherwise."""
    if problem(entry) is not None:
        return None
    if entry.meta[META_NAME] != name or digest(entry.meta["identity"]) != digest(identity):
        return None
    return entry.blobs[TEXT_BLOB].decode()


def problem(entry: Entry) -> str | None:
    """Why `entry` is not a usable memo record, or None."""
    meta = entry.meta
    if meta.get(META_KIND) != KIND or meta.get("format") != FORMAT:
        return f"not an installed-memo record (kind={meta.get(META_KIND)!r}, format={meta.get('format')!r})"
    name = meta.get(META_NAME)
    if not isinstance(name, str) or "identity" not in meta:
        return "installed-memo record without a name or an identity"
    if memo_key(name, meta["identity"]) != entry.key:
        return "installed-memo record filed under a key its name and identity do not give"
    text = entry.blobs.get(TEXT_BLOB)
    if set(entry.blobs) != {TEXT_BLOB} or text is None or len(text) > MAX_TEXT_BYTES:
        return "installed-memo record without exactly one text blob within the size bound"
    try:
        text.decode()
    except UnicodeDecodeError:
        return "installed-memo text is not UTF-8"
    return None


def summary(meta: dict[str, Any]) -> dict[str, Any] | None:
    """What list/show print for a memo record (None for other entries); tolerates anything."""
    if meta.get(META_KIND) != KIND:
        return None
    identity = meta.get("identity")
    return {"memo": str(meta.get(META_NAME, "")), "files": len(identity) if isinstance(identity, list) else 0}
