"""Bundles: many entries in one compressed file, to move a warm cache where no shared dir reaches
(another cluster, a container image).

A bundle is a gzip'd tar holding `manifest.json` and one `entries/<key>.kce` per entry, each in the
ordinary entry format. Import never extracts to disk and never trusts the archive: every member
name is checked, every entry is decoded (format, checksum, key) and, when the caller can tell,
compared with the installed toolchain before it lands.

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

import contextlib
import gzip
import io
import json
import os
import re
import tempfile
import time
import zlib
from array import array
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator

from . import entry as entry_format
from .entry import CorruptEntry

BUNDLE_FORMAT = "kernel-cache-bundle"
BUNDLE_VERSION = 1
MANIFEST = "manifest.json"
_MEMBER = re.compile(r"^entries/([0-9a-f]{32})\.kce$")

# Caps on what reading one bundle may cost (each overridable per call, see read_bundle).
MAX_MEMBERS = 100_000  # tar members, the manifest included
MAX_ENTRY_BYTES = 256 << 20  # one member: Config.max_entry_bytes' default (real entries: 10 KiB - a few MiB)
MAX_TOTAL_BYTES = 16 << 30  # everything the decompressor produces
MAX_MANIFEST_BYTES = 16 << 20
MAX_JSON_DEPTH = 32  # a manifest is 3 levels deep

_BLOCK = 512
_CHUNK = 1 << 20  # the most the decompressor is asked for at once
_MAX_EXTENSION_BYTES = 64 << 10  # one pax or GNU long-name header
_MAX_EXTENSIONS = 16  # extension headers in a row before one member
_REGULAR = (b"0", b"\0", b"7")
_NO_DATA = (b"1", b"2", b"3", b"4", b"5", b"6")  # links, devices, directories, FIFOs: a header only


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


@dataclass(frozen=True)
class Caps:
    """What reading one bundle may cost; the module constants unless a caller passes others."""

    members: int
    entry_bytes: int
    total_bytes: int
    manifest_bytes: int
    json_depth: int


# Export --------------------------------------------------------------------------------------
def export_bundle(path: Path, entries: Iterable[tuple[str, bytes, dict]]) -> ExportResult:
    """Write (key, entry bytes, manifest row) triples to `path` atomically, manifest first."""
    import tarfile

    path = Path(path)
    entries = list(entries)
    rows = [{"key": key, **row} for key, _, row in entries]
    manifest = {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "created": time.time(), "entries": rows}
    total = 0
    fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=".bundle-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as raw_file, tarfile.open(fileobj=raw_file, mode="w:gz") as tar:
            _add(tar, MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
            for key, data, _ in entries:
                _add(tar, f"entries/{key}.kce", data)
                total += len(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return ExportResult(entries=len(entries), bytes=total, file_bytes=path.stat().st_size)


def _add(tar, name: str, data: bytes) -> None:
    import tarfile

    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(time.time())
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


# Bounded reading -------------------------------------------------------------------------------
def _human(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.4g} {unit}"
        n /= 1024
    return str(n)


def _shown(name: str, limit: int = 200) -> str:
    """A member name fit to print: control characters escaped, long names cut."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in name[:limit])
    return text + ("…" if len(name) > limit else "")


class _Decompressed:
    """The decompressed bytes of a gzip file, read in bounded chunks and counted as produced."""

    def __init__(self, raw: BinaryIO, path: Path, caps: Caps):
        self._gz = gzip.GzipFile(fileobj=raw, mode="rb")
        self._path, self._limit = path, caps.total_bytes
        self.produced = 0

    def read(self, n: int) -> bytes:
        """Up to n bytes (fewer only at the end of the stream)."""
        out, wanted = io.BytesIO(), n  # grows in place: no second copy of a large member
        while wanted > 0:
            try:
                data = self._gz.read(min(wanted, _CHUNK))
            except (OSError, EOFError, zlib.error) as exc:
                raise BundleError(f"{self._path} is damaged: {exc}") from None
            if not data:
                break
            self.produced += len(data)
            if self.produced > self._limit:
                raise BundleError(
                    f"{self._path}: stopped reading: the bundle expands to more than {_human(self._limit)} "
                    f"(the total-size cap); a real bundle that large should be exported in parts "
                    f"(cachectl export --arch/--kernel)")
            out.write(data)
            wanted -= len(data)
        return out.getvalue()

    def skip(self, n: int) -> int:
        """Read and drop n bytes; how many there were."""
        done = 0
        while done < n:
            data = self.read(min(n - done, _CHUNK))
            if not data:
                break
            done += len(data)
        return done


@dataclass
class _Member:
    name: str
    type: bytes
    size: int  # bytes of data that follow the header (0 for links, devices, directories)
    index: int

    @property
    def isfile(self) -> bool:
        return self.type in _REGULAR


class _TarStream:
    """Tar members one header at a time; a member's data must be read or skipped before the next."""

    def __init__(self, stream: _Decompressed, path: Path, caps: Caps):
        self._s, self._path, self._caps = stream, path, caps
        self._pending = 0  # data and padding of the last member not read yet
        self._count = 0

    def __iter__(self) -> Iterator[_Member]:
        while True:
            member = self._next()
            if member is None:
                return
            yield member

    def read(self, member: _Member) -> bytes:
        data = self._s.read(member.size)
        if len(data) != member.size:
            raise BundleError(f"{self._path} is damaged: member {_shown(member.name)} is truncated")
        self._pending -= member.size
        return data

    def _damaged(self, what: str) -> BundleError:
        if self._count == 0:
            return BundleError(f"{self._path} is not a kernel-cache bundle: {what}")
        return BundleError(f"{self._path} is damaged: {what}")

    def _next(self) -> _Member | None:
        if self._pending and self._s.skip(self._pending) != self._pending:
            raise self._damaged("the last member is truncated")
        self._pending = 0
        name = size = None
        for _ in range(_MAX_EXTENSIONS + 1):
            block = self._s.read(_BLOCK)
            if not block or block == bytes(_BLOCK):
                return None  # end of the archive (or of a stream without end blocks)
            if len(block) < _BLOCK:
                raise self._damaged("truncated tar header")
            h_name, h_size, kind = self._header(block)
            if kind not in (b"x", b"g", b"L", b"K"):
                break
            if h_size > _MAX_EXTENSION_BYTES:
                raise BundleError(f"{self._path}: a tar extension header of {h_size} bytes is over the "
                                  f"{_human(_MAX_EXTENSION_BYTES)} cap: not a kernel-cache bundle")
            data = self._s.read(_padded(h_size))
            if len(data) != _padded(h_size):
                raise self._damaged("truncated tar extension header")
            data = data[:h_size]
            if kind == b"x":
                pax = self._pax(data)
                name = pax.get("path", name)
                if "size" in pax:
                    size = _pax_int(pax["size"], self._damaged)
            elif kind == b"L":
                name = data.split(b"\0", 1)[0].decode("utf-8", "replace")
        else:
            raise self._damaged(f"more than {_MAX_EXTENSIONS} tar extension headers in a row")
        self._count += 1
        if self._count > self._caps.members:
            raise BundleError(f"{self._path}: stopped reading: more than {self._caps.members} members (the "
                              f"member-count cap); a real bundle that large should be exported in parts "
                              f"(cachectl export --arch/--kernel)")
        name = h_name if name is None else name
        size = h_size if size is None else size
        if kind in _NO_DATA:
            size = 0
        if name == MANIFEST and size > self._caps.manifest_bytes:
            raise _manifest_too_large(self._path, size, self._caps)
        if name != MANIFEST and size > self._caps.entry_bytes:
            raise BundleError(f"{self._path}: stopped reading: member {_shown(name)} holds {_human(size)}, over "
                              f"the {_human(self._caps.entry_bytes)} per-entry cap; no kernel entry is that "
                              f"large, so the bundle is damaged or not a kernel-cache bundle")
        self._pending = _padded(size)
        return _Member(name=name, type=kind, size=size, index=self._count - 1)

    def _header(self, block: bytes) -> tuple[str, int, bytes]:
        """(name, size, type flag) of a ustar/GNU/v7 header, its checksum verified."""
        try:
            stored = _octal(block[148:156])
        except ValueError:
            raise self._damaged("not a tar header") from None
        unsigned = sum(block[:148]) + 8 * 32 + sum(block[156:])
        signed = sum(array("b", block[:148])) + 8 * 32 + sum(array("b", block[156:]))
        if stored not in (unsigned, signed):
            raise self._damaged("tar header checksum mismatch")
        name = block[:100].split(b"\0", 1)[0]
        if block[257:263] == b"ustar\0":  # POSIX: a name may be split into prefix/name
            prefix = block[345:500].split(b"\0", 1)[0]
            if prefix:
                name = prefix + b"/" + name
        size_field = block[124:136]
        try:
            if size_field[0] == 0x80:  # GNU base-256
                size = int.from_bytes(size_field[1:], "big")
            else:
                size = _octal(size_field)
        except ValueError:
            raise self._damaged("bad size in a tar header") from None
        if size < 0 or size_field[0] == 0xFF:
            raise self._damaged("negative size in a tar header")
        return name.decode("utf-8", "replace"), size, block[156:157]

    def _pax(self, data: bytes) -> dict[str, str]:
        records, pos = {}, 0
        while pos < len(data):
            space = data.find(b" ", pos)
            digits = data[pos:space]
            if space < 0 or not digits.isdigit():
                raise self._damaged("malformed pax header")
            length = int(digits)
            record = data[space + 1:pos + length]
            if length <= 0 or not record.endswith(b"\n") or b"=" not in record:
                raise self._damaged("malformed pax header")
            key, _, value = record[:-1].partition(b"=")
            records[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
            pos += length
        return records


def _octal(field: bytes) -> int:
    text = field.split(b"\0", 1)[0].strip(b" ")
    if text.strip(b"01234567"):  # int() alone would take '-1', '0o7', '1_0'
        raise ValueError(f"not an octal number: {text!r}")
    return int(text, 8) if text else 0


def _pax_int(text: str, damaged) -> int:
    if not text.isdigit() or not text.isascii():
        raise damaged("malformed pax size")
    return int(text)


def _padded(size: int) -> int:
    return -(-size // _BLOCK) * _BLOCK


@contextlib.contextmanager
def _open(path: Path, caps: Caps) -> Iterator[_TarStream]:
    try:
        raw = open(path, "rb")
    except OSError as exc:
        raise BundleError(f"{path} is not a kernel-cache bundle: {exc}") from None
    with raw:
        if raw.read(2) != b"\x1f\x8b":
            raise BundleError(f"{path} is not a kernel-cache bundle (not gzip-compressed)")
        raw.seek(0)
        yield _TarStream(_Decompressed(raw, path, caps), path, caps)


# JSON nesting ------------------------------------------------------------------------------------
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_BRACKETS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def json_depth(raw: bytes) -> int:
    """How deeply the arrays and objects of the JSON text `raw` nest, without parsing it (so without
    recursion): strings are dropped, brackets counted +1/-1 (in C, as signed bytes)."""
    skeleton = _JSON_STRING.sub(b"", raw).translate(_BRACKETS, _NOT_BRACKETS)
    return max(accumulate(array("b", skeleton)), default=0)


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
    with _open(path, caps) as tar:
        for member in tar:
            if member.name == MANIFEST and member.isfile:
                _check_manifest(tar.read(member), path, caps)
                if member.index == 0:  # a current bundle: go on in this pass
                    yield from _entries(tar, manifest_seen=True)
                    return
                break
        else:
            raise BundleError(f"{path} has no {MANIFEST}: not a kernel-cache bundle")
    with _open(path, caps) as tar:  # manifest not first (written before it was): read again
        yield from _entries(tar, manifest_seen=False)


def _entries(tar: _TarStream, manifest_seen: bool) -> Iterator[tuple[str, bytes | None, str]]:
    for member in tar:
        if member.name == MANIFEST and member.isfile:
            if not manifest_seen:
                manifest_seen = True  # the one checked by the first pass
                continue
            yield _shown(member.name), None, "a second manifest"
            continue
        match = _MEMBER.match(member.name)
        if not member.isfile or match is None:
            yield _shown(member.name), None, "not an entry of a kernel-cache bundle"
            continue
        yield match.group(1), tar.read(member), ""


def _caps(members, entry_bytes, total_bytes, manifest_bytes, json_depth_) -> Caps:
    given = {"members": members, "entry_bytes": entry_bytes, "total_bytes": total_bytes,
             "manifest_bytes": manifest_bytes, "json_depth": json_depth_}
    defaults = {"members": MAX_MEMBERS, "entry_bytes": MAX_ENTRY_BYTES, "total_bytes": MAX_TOTAL_BYTES,
                "manifest_bytes": MAX_MANIFEST_BYTES, "json_depth": MAX_JSON_DEPTH}  # read now: patchable
    return Caps(**{k: defaults[k] if v is None else int(v) for k, v in given.items()})


def _manifest_too_large(path: Path, size: int, caps: Caps) -> BundleError:
    return BundleError(f"{path}: stopped reading: {MANIFEST} holds {_human(size)}, over the "
                       f"{_human(caps.manifest_bytes)} manifest cap; a real bundle that large should be "
                       f"exported in parts (cachectl export --arch/--kernel)")


def _check_manifest(raw: bytes, path: Path, caps: Caps) -> None:
    if len(raw) > caps.manifest_bytes:
        raise _manifest_too_large(path, len(raw), caps)
    if json_depth(raw) > caps.json_depth:
        raise BundleError(f"{path}: {MANIFEST} nests deeper than {caps.json_depth} levels (the JSON depth "
                          f"cap): not a kernel-cache bundle")
    try:
        manifest = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise BundleError(f"{path}: {MANIFEST} is not JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"{path} is not a kernel-cache bundle")
    if manifest.get("version") != BUNDLE_VERSION:
        raise BundleError(f"{path}: bundle version {manifest.get('version')!r}, this kernel-cache reads "
                          f"{BUNDLE_VERSION}")


def import_bundle(path: Path, tier, installed: Callable[[dict], "str | None"] | None = None,
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
        if accept is not None:
            refusal = accept(data)
            if refusal is not None:
                result.rejected.append((key, refusal))
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
