"""Bundles: many entries in one compressed file, to move a warm cache where no shared dir reaches
(another cluster, a container image).

A bundle is a gzip'd tar holding `manifest.json` and one `entries/<key>.kce` per entry, each in the
ordinary entry format. Import never extracts to disk and never trusts the archive: every member
name is checked, every entry is decoded (format, checksum, key), a winner's or lowered call's
record is checked as `verify` checks it, and, when the caller can tell, the entry is compared with
the installed toolchain before it lands.

Reading is a bounded stream, so a hostile bundle (a gzip bomb, a million members, a manifest of
100k nested brackets) costs at most one member plus the manifest in memory:
- The gzip stream is decompressed in chunks of at most `_CHUNK` bytes, through a reader that counts
  every byte the decompressor produces (tar headers, padding, skipped members: everything, not
  what the tar headers claim) and stops past `MAX_TOTAL_BYTES`.
- The tar format is parsed here, one 512-byte header at a time (ustar, with pax and GNU long-name
  extension headers of at most `_MAX_EXTENSION_BYTES`). Nothing is looked up by name, nothing is
  extracted, links and devices are only names to reject.
- Caps on the member count (`MAX_MEMBERS`), each member's size (`MAX_ENTRY_BYTES`, checked before
  its data is read), the manifest's size (`MAX_MANIFEST_BYTES`) and its JSON nesting depth
  (`MAX_JSON_DEPTH`, checked before `json.loads`). The first cap exceeded stops the read with a
  BundleError that names the cap. Each cap is a keyword argument of `read_bundle`/`import_bundle`.

Order of members: the manifest must be checked before any entry lands, and a stream cannot seek
back to it. `export_bundle` writes `manifest.json` first, so a current bundle is read in one pass.
Bundles written before that hold it last (or anywhere); for those the file is read twice: a first
pass, under the same caps, only looks for the manifest and checks it (skipping other members'
data without keeping it), the second hands out the entries. Nothing is buffered across members in
either case.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import entry as entry_format
from . import record_checks
from .bundle_stream import (
    MANIFEST,
    BundleError,
    Caps,
    NotABundle,
    TarStream,
    manifest_too_large,
    open_stream,
    shown,
)
from .entry import DEFAULT_MAX_ENTRY_BYTES, CorruptEntry, json_depth
from .safefs import atomic_file
from .summary import EntrySummary
from .tier import Tier

BUNDLE_FORMAT = "kernel-cache-bundle"
BUNDLE_VERSION = 1
_MEMBER = re.compile(r"^entries/([0-9a-f]{32})\.kce$")

# Caps on what reading one bundle may cost (each overridable per call, see read_bundle).
MAX_MEMBERS = 100_000  # tar members, the manifest included
MAX_ENTRY_BYTES = DEFAULT_MAX_ENTRY_BYTES  # one member: the same default cap as every tier
MAX_TOTAL_BYTES = 16 << 30  # everything the decompressor produces
MAX_MANIFEST_BYTES = 16 << 20
MAX_JSON_DEPTH = 32  # a manifest is 3 levels deep


@dataclass
class ExportResult:
    entries: int
    bytes: int  # uncompressed entry bytes
    file_bytes: int


@dataclass
class ImportResult:
    imported: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)  # already in the tier: left alone
    stale: list[str] = field(default_factory=list)  # built by another toolchain: skipped
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (member, reason)
    bytes: int = 0


# Export --------------------------------------------------------------------------------------
def export_bundle(path: Path, entries: Iterable[tuple[str, bytes, dict[str, Any]]]) -> ExportResult:
    """Write (key, entry bytes, manifest row) triples to `path` atomically, manifest first."""
    path = Path(path)
    entries = list(entries)
    rows = [{"key": key, **row} for key, _, row in entries]
    manifest = {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "created": time.time(), "entries": rows}
    total = 0
    with atomic_file(path) as raw_file, tarfile.open(fileobj=raw_file, mode="w:gz") as tar:
        _add(tar, MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
        for key, data, _ in entries:
            _add(tar, f"entries/{key}.kce", data)
            total += len(data)
    return ExportResult(entries=len(entries), bytes=total, file_bytes=path.stat().st_size)


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(time.time())
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


# Bounded reading -------------------------------------------------------------------------------


# JSON nesting ------------------------------------------------------------------------------------


# Reading ------------------------------------------------------------------------------------------
def read_bundle(path: Path, *, max_members: int | None = None, max_entry_bytes: int | None = None,
                max_total_bytes: int | None = None, max_manifest_bytes: int | None = None,
                max_json_depth: int | None = None) -> Iterator[tuple[str, bytes | None, str]]:
    """(key, bytes, "") per well-formed entry member, (member name, None, reason) per bad one.

    Nothing is handed out before the manifest is checked. A cap exceeded (the module constants,
    unless given here) stops the read with BundleError; entries handed out before stay handed out.
    """
    caps = _caps(max_members, max_entry_bytes, max_total_bytes, max_manifest_bytes, max_json_depth)
    path = Path(path)
    with open_stream(path, caps) as tar:
        for member in tar:
            if member.name == MANIFEST and member.isfile:
                _check_manifest(tar.read(member), path, caps)
                if member.index == 0:  # a current bundle: go on in this pass
                    yield from _entries(tar, manifest_seen=True)
                    return
                break
        else:
            raise NotABundle(f"{path} has no {MANIFEST}: not a kernel-cache bundle")
    with open_stream(path, caps) as tar:  # manifest not first (written before it was): read again
        yield from _entries(tar, manifest_seen=False)


def _entries(tar: TarStream, manifest_seen: bool) -> Iterator[tuple[str, bytes | None, str]]:
    for member in tar:
        if member.name == MANIFEST and member.isfile:
            if not manifest_seen:
                manifest_seen = True  # the one checked by the first pass
                continue
            yield shown(member.name), None, "a second manifest"
            continue
        match = _MEMBER.match(member.name)
        if not member.isfile or match is None:
            yield shown(member.name), None, "not an entry of a kernel-cache bundle"
            continue
        yield match.group(1), tar.read(member), ""


def _caps(members: int | None, entry_bytes: int | None, total_bytes: int | None, manifest_bytes: int | None,
          json_depth_: int | None) -> Caps:
    given = {"members": members, "entry_bytes": entry_bytes, "total_bytes": total_bytes,
             "manifest_bytes": manifest_bytes, "json_depth": json_depth_}
    defaults = {"members": MAX_MEMBERS, "entry_bytes": MAX_ENTRY_BYTES, "total_bytes": MAX_TOTAL_BYTES,
                "manifest_bytes": MAX_MANIFEST_BYTES, "json_depth": MAX_JSON_DEPTH}  # read now: patchable
    return Caps(**{k: defaults[k] if v is None else int(v) for k, v in given.items()})


def _check_manifest(raw: bytes, path: Path, caps: Caps) -> None:
    if len(raw) > caps.manifest_bytes:
        raise manifest_too_large(path, len(raw), caps)
    if json_depth(raw) > caps.json_depth:
        raise BundleError(f"{path}: {MANIFEST} nests deeper than {caps.json_depth} levels (the JSON depth "
                          f"cap): not a kernel-cache bundle")
    try:
        manifest = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise BundleError(f"{path}: {MANIFEST} is not JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        raise NotABundle(f"{path} is not a kernel-cache bundle")
    if manifest.get("version") != BUNDLE_VERSION:
        raise BundleError(f"{path}: bundle version {manifest.get('version')!r}, this kernel-cache reads "
                          f"{BUNDLE_VERSION}")


def import_bundle(path: Path, tier: Tier, installed: Callable[[dict[str, Any]], "str | None"] | None = None,
                  allow_stale: bool = False, *, accept: Callable[[bytes], "str | None"] | None = None,
                  max_members: int | None = None, max_entry_bytes: int | None = None,
                  max_total_bytes: int | None = None, max_manifest_bytes: int | None = None,
                  max_json_depth: int | None = None) -> ImportResult:
    """Validate every entry of the bundle at `path` and put the good ones into `tier`.

    `installed(target)` gives the installed toolchain's summary for a target; entries built by a
    different toolchain are skipped (their keys could never be looked up here) unless `allow_stale`.
    `accept(raw)`, when given, sees each entry's bytes once they decode; a string it returns is a
    reason to reject the entry (a missing or wrong signature, say).
    A bundle without a valid manifest lands nothing; a damaged archive, or one past a cap (see
    read_bundle), raises BundleError after the entries read before have landed.
    """
    result = ImportResult()
    members = read_bundle(path, max_members=max_members, max_entry_bytes=max_entry_bytes,
                          max_total_bytes=max_total_bytes, max_manifest_bytes=max_manifest_bytes,
                          max_json_depth=max_json_depth)
    for key, data, reason in members:
        if data is None:
            result.rejected.append((key, reason))
            continue
        try:
            entry = entry_format.decode(data, expected_key=key)
        except CorruptEntry as exc:
            result.rejected.append((key, str(exc)))
            continue
        except RecursionError:
            result.rejected.append((key, "entry metadata is nested too deeply"))
            continue
        problem = record_checks.problem(entry)
        if problem is not None:  # a winner or lowered-call record that verify would refuse
            result.rejected.append((key, problem))
            continue
        if accept is not None:
            refusal = accept(data)
            if refusal is not None:
                result.rejected.append((key, refusal))
                continue
        summary = EntrySummary.from_meta(entry.meta)
        if installed is not None and (summary.target is None or not summary.toolchain):
            result.rejected.append((key, "entry names no target or toolchain"))
            continue
        if installed is not None and not allow_stale and summary.target is not None:
            current = installed(summary.target)
            if current is not None and summary.toolchain != current:
                result.stale.append(key)
                continue
        if key in tier:
            result.present.append(key)
            continue
        tier.put_raw(key, data)
        result.imported.append(key)
        result.bytes += len(data)
    return result
