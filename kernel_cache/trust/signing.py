"""Authenticated entries: an HMAC-SHA256 signature trailer that only holders of the key can make.

The entry checksum (xxh3) is public arithmetic: a group member can replace a published cubin and
recompute it. With a signing key configured (KERNEL_CACHE_SIGNING_KEY_FILE, or
KERNEL_CACHE_SIGNING_KEY), every entry this process writes carries
`magic | key id | HMAC-SHA256(key, everything before the trailer)`, and entries read from the
shared level or a bundle must carry a valid one for the same key, or they are rejected.

The MAC covers the whole entry, not only its checksum: xxh3 is not collision-resistant, so a MAC
over the checksum alone would let a forger swap in a colliding payload. Cost: one SHA-256 pass over
the entry per shared hit (scripts/bench_store.py measures it). The key id (a SHA-256 of the key under
a fixed label, cut to 8 bytes) names the key without revealing it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from kernel_cache.entries.entry import SIGNATURE_MAGIC, SIGNATURE_SIZE, split_signature
from kernel_cache.errors import KernelCacheError
from kernel_cache.sanitize import escaped

MIN_KEY_BYTES = 16
_LABEL = b"kernel-cache entry signature v1\x00"


class SigningKeyError(KernelCacheError, ValueError):
    """The configured signing key cannot be used (too short, unreadable, readable by others)."""


def _too_short(length: int) -> str:
    return (f"a signing key needs at least {MIN_KEY_BYTES} bytes (got {length}); make one with: "
            f"head -c 32 /dev/urandom | base64 > KEYFILE")


class Signer:
    def __init__(self, key: bytes):
        if len(key) < MIN_KEY_BYTES:
            raise SigningKeyError(_too_short(len(key)))
        self._key = bytes(key)
        self.key_id = hashlib.sha256(_LABEL + self._key).digest()[:8]

    def __repr__(self) -> str:  # never print the key
        return f"Signer(key_id={self.key_id.hex()})"

    def _mac(self, chunks: Iterable[bytes]) -> bytes:
        h = hmac.new(self._key, _LABEL, hashlib.sha256)
        for chunk in chunks:
            h.update(chunk)
        return h.digest()

    def sign(self, data: bytes) -> bytes:
        """The entry with this key's trailer (any earlier trailer replaced)."""
        body, _ = split_signature(data)
        return body + SIGNATURE_MAGIC + self.key_id + self._mac([body])

    def problem(self, data: bytes) -> str | None:
        """Why `data` is not an entry signed with this key, or None when it is."""
        body, trailer = split_signature(data)
        return "unsigned" if trailer is None else self.streamed_problem([body], trailer)

    def trailer_problem(self, trailer: bytes) -> str | None:
        """What the last SIGNATURE_SIZE bytes of an entry say against it before its body is read."""
        if len(trailer) != SIGNATURE_SIZE or not trailer.startswith(SIGNATURE_MAGIC):
            return "unsigned"
        key_id = trailer[len(SIGNATURE_MAGIC):len(SIGNATURE_MAGIC) + 8]
        if key_id != self.key_id:
            return f"signed with another key ({key_id.hex()}, ours is {self.key_id.hex()})"
        return None

    def streamed_problem(self, body_chunks: Iterable[bytes], trailer: bytes) -> str | None:
        """`problem` for an entry read piece by piece (a large remote value), no chunk kept."""
        problem = self.trailer_problem(trailer)
        if problem is None and not hmac.compare_digest(trailer[len(SIGNATURE_MAGIC) + 8:], self._mac(body_chunks)):
            problem = "signature does not match its content"
        return problem

    def tag(self, label: bytes, data: bytes) -> bytes:
        """A MAC over `data` under a purpose `label` other than an entry's (a remote lease, say), so
        a tag made for one purpose is never valid for another."""
        return hmac.new(self._key, b"kernel-cache " + label + b"\x00" + data, hashlib.sha256).digest()


def load_key_file(path: Path) -> bytes:
    """The key in `path` (see `read_private_file`), of at least MIN_KEY_BYTES."""
    key = read_private_file(path, "KERNEL_CACHE_SIGNING_KEY_FILE", "key")
    if len(key) < MIN_KEY_BYTES:
        raise SigningKeyError(f"KERNEL_CACHE_SIGNING_KEY_FILE={escaped(path)}: {_too_short(len(key))}")
    return key


def read_private_file(path: Path, what: str, kind: str) -> bytes:
    """A small secret from `path`, stripped (`echo KEY > file` works): a regular file of this user or
    root that nobody else may read or change (like ssh private keys), opened without following a link
    or blocking on a FIFO. SigningKeyError naming `what` otherwise."""
    shown = escaped(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise SigningKeyError(f"{what}={shown}: cannot open ({exc.strerror}; a symbolic link is refused)") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SigningKeyError(f"{what}={shown}: not a regular file")
        if st.st_uid not in (os.geteuid(), 0):
            raise SigningKeyError(f"{what}={shown}: owned by another user")
        if st.st_mode & 0o077:
            raise SigningKeyError(f"{what}={shown}: mode {stat.S_IMODE(st.st_mode):04o} lets other users read or "
                                  f"change the {kind}; chmod 600 {shown}")
        if st.st_size > 4096:
            raise SigningKeyError(f"{what}={shown}: {st.st_size} bytes is not a {kind}")
        return os.read(fd, 4096).strip()
    finally:
        os.close(fd)
