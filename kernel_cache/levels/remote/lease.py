"""The remote level's compile leases, made so that nobody can hold a key hostage.

A lease is `kcl1:<token>:<taken at, epoch ms>:<tag>` at the key's lease name; with a signing key
the tag is an HMAC over name, token and time, so a peer without the key cannot make others wait (an
untagged lease is taken over). A lease is honoured only until `max_seconds` after it was taken,
whatever its heartbeat says.
"""

from __future__ import annotations

import hmac
import re
import secrets
import time
from dataclasses import dataclass

from kernel_cache.trust.signing import Signer

_LABEL = b"remote lease v1"
_FORM = re.compile(rb"kcl1:([0-9a-f]{32}):([0-9]{1,15}):([0-9a-f]{64}|-)")
CLOCK_SKEW_MS = 5_000  # nodes' clocks may disagree this much on when a lease was taken
MAX_LEASE_BYTES = 128  # a lease value is ~120 bytes; anything longer is not ours


@dataclass(frozen=True)
class Lease:
    taken_ms: int
    value: bytes

    @classmethod
    def new(cls, name: str, signer: Signer | None, taken_ms: int | None = None) -> Lease:
        """A lease on `name`, taken now (or at `taken_ms`, epoch ms)."""
        taken = int(time.time() * 1000) if taken_ms is None else taken_ms
        body = f"kcl1:{secrets.token_hex(16)}:{taken}".encode()
        tag = signer.tag(_LABEL, name.encode() + b"\x00" + body).hex() if signer is not None else "-"
        return cls(taken, body + b":" + tag.encode())

    def expired(self, max_seconds: float) -> bool:
        """Past its maximum lifetime: the holder stops refreshing it, waiters stop honouring it."""
        return time.time() * 1000 - self.taken_ms > max_seconds * 1000


def why_not_honoured(value: bytes, name: str, signer: Signer | None, max_seconds: float) -> str | None:
    """None when the lease `value` found at `name` makes a waiter wait; else why it does not."""
    match = _FORM.fullmatch(value)
    if match is None:
        return "not a lease of ours"
    taken, tag = int(match.group(2)), match.group(3)
    if signer is not None:
        body = value[:match.start(3) - 1]
        mine = signer.tag(_LABEL, name.encode() + b"\x00" + body)
        if tag == b"-" or not hmac.compare_digest(mine, bytes.fromhex(tag.decode())):
            return "not signed with our key"
    now = int(time.time() * 1000)
    if taken > now + CLOCK_SKEW_MS:
        return "taken in the future"
    if Lease(taken, value).expired(max_seconds):
        return f"older than its maximum lifetime ({max_seconds:.0f} s)"
    return None
