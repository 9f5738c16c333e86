"""Bundles: many entries in one compressed file, to move a warm cache where no shared dir reaches
(another cluster, a container image). This module is long because it is the bundle format's one
reader and writer: the manifest checks, the two orders of members, and an import that stages the
whole bundle before anything lands.

A bundle is a gzip'd tar: `manifest.json` and one `entries/<key>.kce` per entry in the ordinary entry
format. Import never extracts to disk and never trusts the archive: it reads a bounded stream
(`tar_stream`: a hostile bundle costs at most one member plus the manifest in memory) and checks
every entry as `verify` does and, when the caller can tell, against the installed toolchain (a memo
names none and need not: `EntryKind.toolchain_bound`). The manifest must be checked before any entry
lands and a stream cannot seek back to it: a bundle holding it elsewhere than first is read twice.

Import is all or nothing per bundle: `stage_bundle` reads and checks the whole stream into a private
spool (memory, then an unnamed file in TMPDIR), and only a bundle read to its end, every entry its
manifest lists found, is published (`StagedBundle.publish` reports every entry's fate).
"""

from __future__ import annotations

import io
import json
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachectl import entry_kinds
from cachectl.move.tar_stream import ENTRY_MEMBER, MANIFEST, BundleError, NotABundle, TarStream, open_stream
from cachectl.render import shown
from kernel_cache.entries import entry as entry_format
from kernel_cache.entries.entry import DEFAULT_MAX_ENTRY_BYTES, CorruptEntry, json_depth
from kernel_cache.entries.summary import EntrySummary
from kernel_cache.errors import KernelCacheError
from kernel_cache.levels.protocols import KeptLevel, holds
from kernel_cache.trust.safefs import atomic_file

BUNDLE_FORMAT = "kernel-cache-bundle"
BUNDLE_VERSION = 1
MAX_JSON_DEPTH = 32  # a manifest is 3 levels deep; checked before json.loads (the stream's caps: tar_stream)
STAGING_MEMORY_BYTES = 64 << 20  # staged entries beyond this go to an unnamed temporary file

# What happened to one entry of a bundle (ImportResult.fates)
IMPORTED, PRESENT, STALE, REJECTED, FAILED, NOT_REACHED, EVICTED = (
    "imported", "present", "stale", "rejected", "failed", "not reached", "evicted")


@dataclass
class ExportResult:
    entries: int
    bytes: int  # uncompressed entry bytes
    file_bytes: int


class StagingError(KernelCacheError, OSError):
    """The bundle's entries could not be staged (no room in TMPDIR): nothing was imported."""

    expected: int | None = None  # entries the bundle's manifest lists


class NoRoom(KernelCacheError, ValueError):
    """The entries to import take more than the level's size bound: importing them would evict the
    cache's own entries and then each other, so nothing was imported."""

    def __init__(self, needed: int, room: int, expected: int | None):
        super().__init__(f"the entries to import take {needed} bytes, more than the level's bound of {room} bytes")
        self.needed, self.room, self.expected = needed, room, expected


@dataclass(frozen=True)
class Fate:
    member: str  # the entry's key, or the name (fit to print) of a member that is no entry
    fate: str  # IMPORTED, PRESENT, STALE, REJECTED, FAILED, NOT_REACHED or EVICTED
    reason: str = ""  # why, for REJECTED, FAILED and EVICTED (NOT_REACHED: what stopped the import)


@dataclass
class ImportResult:
    imported: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)  # already in the level: left alone
    stale: list[str] = field(default_factory=list)  # built by another toolchain: skipped
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (member, reason): bad, never stored
    failed: list[tuple[str, str]] = field(default_factory=list)  # (key, reason): good, but the level refused it
    not_reached: list[str] = field(default_factory=list)  # good, not stored: publishing stopped before it
    evicted: list[str] = field(default_factory=list)  # written, then evicted by the level's bound during the import
    bytes: int = 0
    expected: int | None = None  # entries the manifest lists (None: it lists none)
    fates: list[Fate] = field(default_factory=list)  # every member but the manifest, in bundle order

    @property
    def complete(self) -> bool:
        """Whether every good entry is now in the level (imported or already there)."""
        return not self.failed and not self.not_reached and not self.evicted

    def note(self, member: str, fate: str, reason: str = "") -> None:
        self.fates.append(Fate(member, fate, reason))
        if fate in (REJECTED, FAILED):
            (self.rejected if fate == REJECTED else self.failed).append((member, reason))
        else:
            {IMPORTED: self.imported, PRESENT: self.present, STALE: self.stale,
             NOT_REACHED: self.not_reached, EVICTED: self.evicted}[fate].append(member)

    def evict(self, gone: dict[str, int], reason: str) -> None:
        """Entries noted IMPORTED (key -> size) that turned out gone when the import ended: one pass
        over the fates, however many."""
        self.imported = [member for member in self.imported if member not in gone]
        self.evicted.extend(gone)
        self.bytes -= sum(gone.values())
        self.fates = [Fate(f.member, EVICTED, reason) if f.fate == IMPORTED and f.member in gone else f
                      for f in self.fates]


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


# Reading ------------------------------------------------------------------------------------------
def _members(path: Path, entry_bytes: int, manifest: dict[str, Any]) -> Iterator[tuple[str, bytes | None, str]]:
    """(key, bytes, "") per well-formed entry member, (member name, None, reason) per bad one;
    `manifest` receives the checked manifest before the first is handed out."""
    with open_stream(path, entry_bytes) as tar:
        for member in tar:
            if member.name == MANIFEST and member.isfile:
                manifest.update(_check_manifest(tar.read(member), path))
                if tar.count == 1:  # a current bundle: go on in this pass
                    yield from _entries(tar, manifest_seen=True)
                    return
                break
        else:
            raise NotABundle(f"{path} has no {MANIFEST}: not a kernel-cache bundle")
    with open_stream(path, entry_bytes) as tar:  # manifest not first (written before it was): read again
        yield from _entries(tar, manifest_seen=False)


def _entries(tar: TarStream, manifest_seen: bool) -> Iterator[tuple[str, bytes | None, str]]:
    for member in tar:
        if member.name == MANIFEST and member.isfile:
            if not manifest_seen:
                manifest_seen = True  # the one checked by the first pass
                continue
            yield shown(member.name, 200), None, "a second manifest"
            continue
        match = ENTRY_MEMBER.match(member.name)
        if not member.isfile or match is None:
            yield shown(member.name, 200), None, "not an entry of a kernel-cache bundle"
            continue
        yield match.group(1), tar.read(member), ""


def _check_manifest(raw: bytes, path: Path) -> dict[str, Any]:
    if json_depth(raw) > MAX_JSON_DEPTH:
        raise NotABundle(f"{path}: {MANIFEST} nests deeper than {MAX_JSON_DEPTH} levels (the JSON depth "
                         f"cap): not a kernel-cache bundle")
    try:
        manifest = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise BundleError(f"{path} is damaged: its {MANIFEST} is not JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        raise NotABundle(f"{path} is not a kernel-cache bundle")
    if manifest.get("version") != BUNDLE_VERSION:
        raise BundleError(f"{path}: bundle version {manifest.get('version')!r}, this kernel-cache reads "
                          f"{BUNDLE_VERSION}")
    return manifest


def _listed_keys(manifest: dict[str, Any]) -> list[str]:
    """The entry keys the manifest lists (rows that are not well formed are ignored)."""
    rows = manifest.get("entries")
    keys = [row.get("key") for row in rows if isinstance(row, dict)] if isinstance(rows, list) else []
    return list(dict.fromkeys(k for k in keys if isinstance(k, str) and ENTRY_MEMBER.match(f"entries/{k}.kce")))


# Importing ----------------------------------------------------------------------------------------
@dataclass
class _Staged:
    """One member of a staged bundle: a good entry (its bytes at `offset` in the spool) or a rejection."""

    member: str
    reason: str = ""  # non-empty: rejected while staging
    offset: int = 0
    size: int = 0
    target: dict[str, Any] | None = None
    toolchain: str = ""
    toolchain_bound: bool = True  # its kind names a target and toolchain (entry_kinds.EntryKind)


class StagedBundle:
    """A bundle read to its end and checked, its good entries held in a private spool (freed when
    the context ends) until published."""

    def __init__(self, path: Path, expected: int | None, items: list[_Staged],
                 spool: "tempfile.SpooledTemporaryFile[bytes]"):
        self.path, self.expected, self.items, self._spool = path, expected, items, spool

    def __enter__(self) -> "StagedBundle":
        return self

    def __exit__(self, *exc: object) -> None:
        self._spool.close()

    def publish(self, level: KeptLevel, installed: Callable[[dict[str, Any]], "str | None"] | None = None,
                allow_stale: bool = False, room: int | None = None) -> ImportResult:
        """Put the good entries into `level`, in bundle order; entries of another toolchain than
        `installed(target)` are stale (their keys are never looked up here). Past `room` (the level's
        bound) nothing is written: the entries would evict each other. The first entry the level
        does not keep stops the publishing."""
        result = ImportResult(expected=self.expected)
        plan = [(item, self._verdict(item, level, installed, allow_stale)) for item in self.items]
        if room is not None:
            needed = sum(item.size for item, verdict in plan if verdict is None)
            if needed > room:
                raise NoRoom(needed, room, self.expected)
        why_gone = "not writable?" if room is None else "not writable here, or its size bound evicted it at once"
        stopped: str | None = None
        written: dict[str, int] = {}
        for item, verdict in plan:
            if verdict is not None:
                result.note(item.member, *verdict)
                continue
            if stopped is not None:
                result.note(item.member, NOT_REACHED, stopped)
                continue
            try:
                self._spool.seek(item.offset)
                level.put_raw(item.member, self._spool.read(item.size))
                problem = None if item.member in level else f"the {level.name} level did not keep it ({why_gone})"
            except (OSError, ValueError) as exc:
                problem = str(exc) or type(exc).__name__
            if problem is not None:
                result.note(item.member, FAILED, problem)
                stopped = f"the import stopped at entry {item.member[:12]}, which failed: {problem}"
                continue
            result.note(item.member, IMPORTED)
            result.bytes += item.size
            written[item.member] = item.size
        gone = {member: size for member, size in written.items() if not holds(level, member)}
        if gone:
            result.evict(gone, f"the {level.name} level evicted it for a later entry of the bundle")
        return result

    @staticmethod
    def _verdict(item: _Staged, level: KeptLevel, installed: Callable[[dict[str, Any]], "str | None"] | None,
                 allow_stale: bool) -> tuple[str, str] | None:
        """(fate, reason) for an entry that is not to be written, None for one to write."""
        if item.reason:
            return REJECTED, item.reason
        if installed is not None and item.toolchain_bound and (item.target is None or not item.toolchain):
            return REJECTED, "entry names no target or toolchain"
        if installed is not None and not allow_stale and item.target is not None:
            current = installed(item.target)
            if current is not None and item.toolchain != current:
                return STALE, ""
        return (PRESENT, "") if holds(level, item.member) else None


def stage_bundle(path: Path, *, accept: Callable[[bytes], "str | None"] | None = None,
                 max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES) -> StagedBundle:
    """Read the whole bundle at `path`, check every entry (as `verify` does, and `accept(raw)`: a
    string it returns rejects the entry) and stage the good ones. NotABundle, BundleError (damaged,
    truncated, past a cap, a listed entry missing) or StagingError: nothing staged, nothing lands."""
    path = Path(path)
    manifest: dict[str, Any] = {}
    items: list[_Staged] = []
    seen: set[str] = set()
    spool: tempfile.SpooledTemporaryFile[bytes] = tempfile.SpooledTemporaryFile(max_size=STAGING_MEMORY_BYTES)
    try:
        for key, data, reason in _members(path, max_entry_bytes, manifest):
            if data is None:
                items.append(_Staged(key, reason))
                continue
            seen.add(key)
            item = _check_entry(key, data, accept)
            if not item.reason:
                item.offset = spool.tell()
                try:
                    spool.write(data)
                except OSError as exc:
                    raise StagingError(f"cannot stage the bundle's entries in {tempfile.gettempdir()} "
                                       f"({exc.strerror or exc}); set TMPDIR to a directory with room") from None
            items.append(item)
        listed = _listed_keys(manifest)
        missing = [k for k in listed if k not in seen]
        if missing:
            raise BundleError(f"{path} is damaged: {len(missing)} of the {len(listed)} entries its {MANIFEST} lists "
                              f"are missing (" + ", ".join(k[:12] for k in missing[:3])
                              + (", …" if len(missing) > 3 else "") + ")")
    except BaseException as exc:
        spool.close()
        if isinstance(exc, (BundleError, StagingError)) and manifest:
            exc.expected = len(_listed_keys(manifest)) or None
        raise
    return StagedBundle(path, len(listed) or None, items, spool)


def _check_entry(key: str, data: bytes, accept: Callable[[bytes], "str | None"] | None) -> _Staged:
    try:
        entry = entry_format.decode(data, expected_key=key)
    except CorruptEntry as exc:
        return _Staged(key, str(exc))
    except RecursionError:
        return _Staged(key, "entry metadata is nested too deeply")
    if (problem := entry_kinds.problem(entry)) is not None:  # what verify refuses (a malformed winner or call record)
        return _Staged(key, problem)
    if accept is not None and (refusal := accept(data)) is not None:
        return _Staged(key, refusal)
    summary = EntrySummary.from_meta(entry.meta)
    return _Staged(key, size=len(data), target=summary.target, toolchain=summary.toolchain,
                   toolchain_bound=entry_kinds.kind_of(entry.meta).toolchain_bound)

