"""Reading a bundle as a bounded stream: gzip decompressed in counted chunks and the tar format
parsed one 512-byte header at a time, under the caps below.

Nothing here extracts, looks a member up by name, or follows a link: a member is a name, a size
and (for regular files) data read only when asked. The tar format is parsed here, not by tarfile,
which reads an extension header whole however large and takes a damaged header mid-stream for
the end of the archive.

A read that stops (damage, a cap) raises NotABundle until a member has shown the file to be a
bundle (a member named like a bundle's manifest or entry), BundleError after, with `at_entry`
(the first entry member, from 1, not read whole): cachectl exits 2 for one, 1 for the other. The
gzip stream is read to its end, so a file cut short or whose trailer does not match is damaged
even where the tar archive looks complete.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import re
import zlib
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from cachectl.render import shown
from kernel_cache.errors import KernelCacheError

MAX_MEMBERS = 100_000  # tar members, the manifest included
MAX_TOTAL_BYTES = 16 << 30  # everything the decompressor produces: headers, padding, skipped members
MAX_MANIFEST_BYTES = 16 << 20
_MAX_EXTENSION_BYTES = 64 << 10  # one pax or GNU long-name header
_MAX_EXTENSIONS = 16  # extension headers in a row before one member
_BLOCK = 512
_CHUNK = 1 << 20  # the most the decompressor is asked for at once
_REGULAR = (b"0", b"\0", b"7")
_NO_DATA = (b"1", b"2", b"3", b"4", b"5", b"6")  # links, devices, directories, FIFOs: a header only
_IN_PARTS = "a real bundle that large should be exported in parts (cachectl export --arch/--kernel)"

MANIFEST = "manifest.json"
ENTRY_MEMBER = re.compile(r"^entries/([0-9a-f]{32})\.kce$")


class BundleError(KernelCacheError, ValueError):
    """The file is not a readable kernel-cache bundle."""

    at_entry: int | None = None  # the first entry member (from 1) not read whole when the stream stopped
    expected: int | None = None  # entries the bundle's manifest lists, when it was read before the stop


class NotABundle(BundleError):
    """The file is no kernel-cache bundle at all (another format, unreadable): nothing was read from it."""


def human(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.4g} {unit}"
        n /= 1024
    return str(n)


class Member(NamedTuple):
    name: str
    size: int  # bytes of data that follow the header (0 for links, devices, directories)
    isfile: bool


class TarStream:
    """Tar members one header at a time; a member's data must be read or skipped before the next."""

    def __init__(self, raw: io.BufferedReader, path: Path, entry_bytes: int):
        self._gz = gzip.GzipFile(fileobj=raw, mode="rb")
        self._path, self._entry_bytes = path, entry_bytes
        self._produced = 0
        self._pending = 0  # data and padding of the last member not read yet
        self.count = 0  # members whose header was read
        self._entries = 0  # entry members whose header was read
        self._in_entry = False  # the last header read was an entry's, its data not all read yet
        self._in_manifest = False
        self.recognised = False  # a member has shown this to be a kernel-cache bundle

    def __iter__(self) -> Iterator[Member]:
        while (member := self._next()) is not None:
            yield member

    def read(self, member: Member) -> bytes:
        data = self._read(member.size)
        if len(data) != member.size:
            raise self._stopped(f"member {shown(member.name, 200)} is truncated")
        self._pending -= member.size
        return data

    def _read(self, n: int) -> bytes:
        """Up to n decompressed bytes (fewer only at the end of the stream), each counted."""
        out = io.BytesIO()  # grows in place: no second copy of a large member
        while n > 0:
            try:
                data = self._gz.read(min(n, _CHUNK))
            except EOFError:
                raise self._stopped("the file is truncated (its compressed stream ends early)") from None
            except (OSError, zlib.error) as exc:
                raise self._stopped(str(exc)) from None
            if not data:
                break
            self._produced += len(data)
            if self._produced > MAX_TOTAL_BYTES:
                raise self._stopped(f"the bundle expands to more than {human(MAX_TOTAL_BYTES)} (the total-size cap); "
                                    f"{_IN_PARTS}", capped=True)
            out.write(data)
            n -= len(data)
        return out.getvalue()

    def _where(self) -> str:
        if self._in_manifest:
            return f"in its {MANIFEST}"
        if self._in_entry:
            return f"at entry {self._entries}"
        return f"after entry {self._entries}" if self._entries else "before its first entry"

    def _stopped(self, what: str, capped: bool = False) -> BundleError:
        """The read stops here: no bundle until a member showed it is one, a damaged one (or one past a
        cap) after, positioned."""
        if not self.recognised:
            return NotABundle(f"{self._path} is not a kernel-cache bundle: {'stopped reading: ' * capped}{what}")
        error = BundleError(f"{self._path}: stopped reading {self._where()}: {what}" if capped
                            else f"{self._path} is damaged {self._where()}: {what}")
        error.at_entry = self._entries if self._in_entry else self._entries + 1  # the first not read whole
        return error

    def _next(self) -> Member | None:
        while self._pending:  # the last member's data and padding, read and dropped
            data = self._read(min(self._pending, _CHUNK))
            if not data:
                raise self._stopped("the last member is truncated")
            self._pending -= len(data)
        self._in_entry = self._in_manifest = False
        name = size = None
        for _ in range(_MAX_EXTENSIONS + 1):
            block = self._read(_BLOCK)
            if not block or block == bytes(_BLOCK):  # the end of the archive (or of a stream without end blocks)
                while self._read(_CHUNK):  # to the gzip trailer, whose checksum and length are verified there
                    pass
                return None
            if len(block) < _BLOCK:
                raise self._stopped("truncated tar header")
            h_name, h_size, kind = self._header(block)
            if kind not in (b"x", b"g", b"L", b"K"):
                break
            if h_size > _MAX_EXTENSION_BYTES:
                raise self._stopped(f"a tar extension header of {h_size} bytes is over the "
                                    f"{human(_MAX_EXTENSION_BYTES)} cap")
            data = self._read(_padded(h_size))
            if len(data) != _padded(h_size):
                raise self._stopped("truncated tar extension header")
            if kind == b"x":
                pax = self._pax(data[:h_size])
                name = pax.get("path", name)
                size = int(pax["size"]) if "size" in pax else size
            elif kind == b"L":
                name = data[:h_size].split(b"\0", 1)[0].decode("utf-8", "replace")
        else:
            raise self._stopped(f"more than {_MAX_EXTENSIONS} tar extension headers in a row")
        self.count += 1
        if self.count > MAX_MEMBERS:
            raise self._stopped(f"more than {MAX_MEMBERS} members (the member-count cap); {_IN_PARTS}", capped=True)
        name = h_name if name is None else name
        size = 0 if kind in _NO_DATA else h_size if size is None else size
        self._in_manifest, self._in_entry = name == MANIFEST, bool(ENTRY_MEMBER.match(name))
        self.recognised = self.recognised or self._in_manifest or self._in_entry
        self._entries += self._in_entry
        if name == MANIFEST and size > MAX_MANIFEST_BYTES:
            raise BundleError(f"{self._path}: stopped reading: {MANIFEST} holds {human(size)}, over the "
                              f"{human(MAX_MANIFEST_BYTES)} manifest cap; {_IN_PARTS}")
        if name != MANIFEST and size > self._entry_bytes:
            raise self._stopped(f"member {shown(name, 200)} holds {human(size)}, over the {human(self._entry_bytes)} "
                                f"per-entry cap; no kernel entry is that large, so the bundle is damaged or not "
                                f"a kernel-cache bundle", capped=True)
        self._pending = _padded(size)
        return Member(name, size, kind in _REGULAR)

    def _header(self, block: bytes) -> tuple[str, int, bytes]:
        """(name, size, type flag) of a ustar/GNU/v7 header, its checksum verified."""
        try:
            stored = _octal(block[148:156])
        except ValueError:
            raise self._stopped("not a tar header") from None
        unsigned = sum(block[:148]) + 8 * 32 + sum(block[156:])
        signed = sum(array("b", block[:148])) + 8 * 32 + sum(array("b", block[156:]))
        if stored not in (unsigned, signed):
            raise self._stopped("tar header checksum mismatch")
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
            raise self._stopped("bad size in a tar header") from None
        if size < 0 or size_field[0] == 0xFF:
            raise self._stopped("negative size in a tar header")
        return name.decode("utf-8", "replace"), size, block[156:157]

    def _pax(self, data: bytes) -> dict[str, str]:
        records, pos = {}, 0
        while pos < len(data):
            space = data.find(b" ", pos)
            digits = data[pos:space]
            if space < 0 or not digits.isdigit():
                raise self._stopped("malformed pax header")
            length = int(digits)
            record = data[space + 1:pos + length]
            if length <= 0 or not record.endswith(b"\n") or b"=" not in record:
                raise self._stopped("malformed pax header")
            key, _, value = record[:-1].partition(b"=")
            records[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
            pos += length
        if not records.get("size", "0").isdigit() or not records.get("size", "0").isascii():
            raise self._stopped("malformed pax size")
        return records


def _octal(field: bytes) -> int:
    text = field.split(b"\0", 1)[0].strip(b" ")
    if text.strip(b"01234567"):  # int() alone would take '-1', '0o7', '1_0'
        raise ValueError(f"not an octal number: {text!r}")
    return int(text, 8) if text else 0


def _padded(size: int) -> int:
    return -(-size // _BLOCK) * _BLOCK


@contextlib.contextmanager
def open_stream(path: Path, entry_bytes: int) -> Iterator[TarStream]:
    try:
        raw = open(path, "rb")
    except OSError as exc:
        raise NotABundle(f"{path} is not a kernel-cache bundle: {exc}") from None
    with raw:
        if raw.read(2) != b"\x1f\x8b":
            raise NotABundle(f"{path} is not a kernel-cache bundle (not gzip-compressed)")
        raw.seek(0)
        yield TarStream(raw, path, entry_bytes)
