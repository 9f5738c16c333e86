"""Bundles: many entries in one compressed file, to move a warm cache where no shared dir reaches
(another cluster, a container image).

A bundle is a gzip'd tar holding `manifest.json` and one `entries/<key>.kce` per entry, each in the
ordinary entry format. Import never extracts to disk and never trusts the archive: every member
name is checked, every entry is decoded (format, checksum, key) and, when the caller can tell,
compared with the installed toolchain before it lands.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from . import entry as entry_format
from .entry import CorruptEntry

BUNDLE_FORMAT = "kernel-cache-bundle"
BUNDLE_VERSION = 1
MANIFEST = "manifest.json"
_MEMBER = re.compile(r"^entries/([0-9a-f]{32})\.kce$")
MAX_ENTRY_BYTES = 1 << 30


class BundleError(ValueError):
    """The file is not a readable kernel-cache bundle."""


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


def export_bundle(path: Path, entries: Iterable[tuple[str, bytes, dict]]) -> ExportResult:
    """Write (key, entry bytes, manifest row) triples to `path` atomically."""
    path = Path(path)
    rows, count, total = [], 0, 0
    fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=".bundle-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as raw_file, tarfile.open(fileobj=raw_file, mode="w:gz") as tar:
            for key, data, row in entries:
                _add(tar, f"entries/{key}.kce", data)
                rows.append({"key": key, **row})
                count += 1
                total += len(data)
            manifest = {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "created": time.time(),
                        "entries": rows}
            _add(tar, MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return ExportResult(entries=count, bytes=total, file_bytes=path.stat().st_size)


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(time.time())
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def read_bundle(path: Path) -> Iterator[tuple[str, bytes | None, str]]:
    """(key, bytes, "") per well-formed entry member, (member name, None, reason) per bad one."""
    try:
        tar = tarfile.open(str(path), mode="r:*")
    except (tarfile.TarError, OSError) as exc:
        raise BundleError(f"{path} is not a kernel-cache bundle: {exc}") from None
    with tar:
        try:
            # The manifest is checked before any entry is handed out, wherever it sits in the archive.
            try:
                manifest = tar.getmember(MANIFEST)
            except KeyError:
                raise BundleError(f"{path} has no {MANIFEST}: not a kernel-cache bundle") from None
            _check_manifest(tar, manifest, path)
            for member in tar.getmembers():
                if member.name == MANIFEST:
                    continue
                match = _MEMBER.match(member.name)
                if not member.isfile() or match is None:
                    yield member.name, None, "not an entry of a kernel-cache bundle"
                    continue
                if member.size > MAX_ENTRY_BYTES:
                    yield member.name, None, f"entry of {member.size} bytes is implausibly large"
                    continue
                yield match.group(1), tar.extractfile(member).read(), ""
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise BundleError(f"{path} is damaged: {exc}") from None


def _check_manifest(tar: tarfile.TarFile, member: tarfile.TarInfo, path: Path) -> None:
    try:
        manifest = json.loads(tar.extractfile(member).read())
    except ValueError as exc:
        raise BundleError(f"{path}: {MANIFEST} is not JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"{path} is not a kernel-cache bundle")
    if manifest.get("version") != BUNDLE_VERSION:
        raise BundleError(f"{path}: bundle version {manifest.get('version')!r}, this kernel-cache reads "
                          f"{BUNDLE_VERSION}")


def import_bundle(path: Path, tier, installed: Callable[[dict], "str | None"] | None = None,
                  allow_stale: bool = False) -> ImportResult:
    """Validate every entry of the bundle at `path` and put the good ones into `tier`.

    `installed(target)` gives the installed toolchain's summary for a target; entries built by a
    different toolchain are skipped (their keys could never be looked up here) unless `allow_stale`.
    A bundle without a valid manifest lands nothing; a damaged archive raises BundleError after the
    entries read before the damage have landed.
    """
    result = ImportResult()
    for key, data, reason in read_bundle(path):
        if data is None:
            result.rejected.append((key, reason))
            continue
        try:
            entry = entry_format.decode(data, expected_key=key)
        except CorruptEntry as exc:
            result.rejected.append((key, str(exc)))
            continue
        target, toolchain = entry.meta.get("target"), entry.meta.get("toolchain")
        if installed is not None and not (isinstance(target, dict) and isinstance(toolchain, dict)):
            result.rejected.append((key, "entry names no target or toolchain"))
            continue
        if installed is not None and not allow_stale:
            current = installed(target)
            if current is not None and toolchain.get("summary") != current:
                result.stale.append(key)
                continue
        if key in tier:
            result.present.append(key)
            continue
        tier.put_raw(key, data)
        result.imported.append(key)
        result.bytes += len(data)
    return result


