"""Reading a bundle as a bounded stream: gzip decompressed through a counting reader and the tar
format parsed one 512-byte header at a time, under the caps `bundle_file` describes.

Nothing here extracts, looks a member up by name, or follows a link: a member is a name, a size
and (for regular files) data read only when asked, never more than the caps allow.

A read that stops (damage, a cap) raises NotABundle until a member has shown the file to be a
bundle (a member named like a bundle's manifest or entry), BundleError after: "not a bundle" and
"a damaged bundle" are different answers (cachectl exits 2 for one, 1 for the other). A BundleError
raised by the stream says where it stopped, in its message and as `at_entry` (the first entry
member, counting from 1, not read whole). The gzip stream is read to its end, so a file cut short
or whose trailer does not match is damaged even where the tar archive looks complete.

This module is long because it parses the tar format itself (ustar headers, pax and GNU
extensions) instead of handing a hostile stream to tarfile.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import re
import zlib
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from cachectl.render import shown
from kernel_cache.errors import KernelCacheError

_BLOCK = 512
_CHUNK = 1 << 20  # the most the decompressor is asked for at once
_MAX_EXTENSION_BYTES = 64 << 10  # one pax or GNU long-name header
_MAX_EXTENSIONS = 16  # extension headers in a row before one member
_REGULAR = (b"0", b"\0", b"7")
_NO_DATA = (b"1", b"2", b"3", b"4", b"5", b"6")  # links, devices, directories, FIFOs: a header only

MANIFEST = "manifest.json"
ENTRY_MEMBER = re.compile(r"^entries/([0-9a-f]{32})\.kce$")


class BundleError(KernelCacheError, ValueError):
    """The file is not a readable kernel-cache bundle."""

    at_entry: int | None = None  # the first entry member (from 1) not read whole when the stream stopped
    expected: int | None = None  # entries the bundle's manifest lists, when it was read before the stop


class NotABundle(BundleError):
    """The file is no kernel-cache bundle at all (another format, unreadable): nothing was read from it."""


@dataclass(frozen=True)
class Caps:
    """What reading one bundle may cost; the module constants unless a caller passes others."""

    members: int
    entry_bytes: int
    total_bytes: int
    manifest_bytes: int
    json_depth: int


def human(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.4g} {unit}"
        n /= 1024
    return str(n)


class _Decompressed:
    """The decompressed bytes of a gzip file, read in bounded chunks and counted as produced."""

    # how a stop is reported: set by TarStream, which knows where in the bundle the read is
    damaged: Callable[[str], BundleError]
    capped: Callable[[str], BundleError]

    def __init__(self, raw: BinaryIO, caps: Caps):
        self._gz = gzip.GzipFile(fileobj=raw, mode="rb")
        self._limit, self.produced = caps.total_bytes, 0

    def read(self, n: int) -> bytes:
        """Up to n bytes (fewer only at the end of the stream)."""
        out, wanted = io.BytesIO(), n  # grows in place: no second copy of a large member
        while wanted > 0:
            try:
                data = self._gz.read(min(wanted, _CHUNK))
            except EOFError:
                raise self.damaged("the file is truncated (its compressed stream ends early)") from None
            except (OSError, zlib.error) as exc:
                raise self.damaged(str(exc)) from None
            if not data:
                break
            self.produced += len(data)
            if self.produced > self._limit:
                raise self.capped(
                    f"the bundle expands to more than {human(self._limit)} (the total-size cap); a real "
                    f"bundle that large should be exported in parts (cachectl export --arch/--kernel)")
            out.write(data)
            wanted -= len(data)
        return out.getvalue()

    def drain(self) -> None:
        """Read to the end of the gzip stream (under the total-size cap): a file cut short, or one whose
        trailer does not match what was decompressed, is damaged even when the tar archive looked whole."""
        while self.read(_CHUNK):
            pass

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


class TarStream:
    """Tar members one header at a time; a member's data must be read or skipped before the next."""

    def __init__(self, stream: _Decompressed, path: Path, caps: Caps):
        self._s, self._path, self._caps = stream, path, caps
        self._pending = 0  # data and padding of the last member not read yet
        self._count = 0
        self._entries = 0  # entry members whose header was read
        self._in_entry = False  # the last header read was an entry's, its data not all read yet
        self._in_manifest = False
        self.recognised = False  # a member has shown this to be a kernel-cache bundle
        stream.damaged, stream.capped = self._damaged, self._capped

    def __iter__(self) -> Iterator[_Member]:
        while True:
            member = self._next()
            if member is None:
                return
            yield member

    def read(self, member: _Member) -> bytes:
        data = self._s.read(member.size)
        if len(data) != member.size:
            raise self._damaged(f"member {shown(member.name, 200)} is truncated")
        self._pending -= member.size
        return data

    def _where(self) -> str:
        if self._in_manifest:
            return f"in its {MANIFEST}"
        if self._in_entry:
            return f"at entry {self._entries}"
        return f"after entry {self._entries}" if self._entries else "before its first entry"

    def _positioned(self, error: BundleError) -> BundleError:
        error.at_entry = self._entries if self._in_entry else self._entries + 1  # the first not read whole
        return error

    def _damaged(self, what: str) -> BundleError:
        """The stream is broken here: a damaged bundle once a member showed it is one, else no bundle."""
        if not self.recognised:
            return NotABundle(f"{self._path} is not a kernel-cache bundle: {what}")
        return self._positioned(BundleError(f"{self._path} is damaged {self._where()}: {what}"))

    def _capped(self, what: str) -> BundleError:
        if not self.recognised:
            return NotABundle(f"{self._path} is not a kernel-cache bundle: stopped reading: {what}")
        return self._positioned(BundleError(f"{self._path}: stopped reading {self._where()}: {what}"))

    def _next(self) -> _Member | None:
        if self._pending and self._s.skip(self._pending) != self._pending:
            raise self._damaged("the last member is truncated")
        self._pending = 0
        self._in_entry = self._in_manifest = False
        name = size = None
        for _ in range(_MAX_EXTENSIONS + 1):
            block = self._s.read(_BLOCK)
            if not block or block == bytes(_BLOCK):
                self._s.drain()  # to the gzip trailer, whose checksum and length are verified there
                return None  # end of the archive (or of a stream without end blocks)
            if len(block) < _BLOCK:
                raise self._damaged("truncated tar header")
            h_name, h_size, kind = self._header(block)
            if kind not in (b"x", b"g", b"L", b"K"):
                break
            if h_size > _MAX_EXTENSION_BYTES:
                raise self._damaged(f"a tar extension header of {h_size} bytes is over the "
                                    f"{human(_MAX_EXTENSION_BYTES)} cap")
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
            raise self._capped(f"more than {self._caps.members} members (the member-count cap); a real bundle "
                               f"that large should be exported in parts (cachectl export --arch/--kernel)")
        name = h_name if name is None else name
        size = h_size if size is None else size
        if kind in _NO_DATA:
            size = 0
        self._in_manifest, self._in_entry = name == MANIFEST, bool(ENTRY_MEMBER.match(name))
        self.recognised = self.recognised or self._in_manifest or self._in_entry
        self._entries += self._in_entry
        if name == MANIFEST and size > self._caps.manifest_bytes:
            raise manifest_too_large(self._path, size, self._caps)
        if name != MANIFEST and size > self._caps.entry_bytes:
            raise self._capped(f"member {shown(name, 200)} holds {human(size)}, over the {human(self._caps.entry_bytes)} "
                               f"per-entry cap; no kernel entry is that large, so the bundle is damaged or not "
                               f"a kernel-cache bundle")
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


def _pax_int(text: str, damaged: Callable[[str], BundleError]) -> int:
    if not text.isdigit() or not text.isascii():
        raise damaged("malformed pax size")
    return int(text)


def _padded(size: int) -> int:
    return -(-size // _BLOCK) * _BLOCK


@contextlib.contextmanager
def open_stream(path: Path, caps: Caps) -> Iterator[TarStream]:
    try:
        raw = open(path, "rb")
    except OSError as exc:
        raise NotABundle(f"{path} is not a kernel-cache bundle: {exc}") from None
    with raw:
        if raw.read(2) != b"\x1f\x8b":
            raise NotABundle(f"{path} is not a kernel-cache bundle (not gzip-compressed)")
        raw.seek(0)
        yield TarStream(_Decompressed(raw, caps), path, caps)


def manifest_too_large(path: Path, size: int, caps: Caps) -> BundleError:
    return BundleError(f"{path}: stopped reading: {MANIFEST} holds {human(size)}, over the "
                       f"{human(caps.manifest_bytes)} manifest cap; a real bundle that large should be "
                       f"exported in parts (cachectl export --arch/--kernel)")
