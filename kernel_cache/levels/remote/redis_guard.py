"""Guarded connections for the remote level: every Redis call gets one total deadline and one byte
budget, however the server sends its reply.

redis-py's socket timeout bounds each read, not a call: a server trickling a byte every 0.1 s keeps
a call alive forever, and a 400 MB reply is read whole before its size is looked at. So each call
runs in `budget(seconds, max_bytes)`, and our connections hand redis-py a socket armed with what is
left of both. It works below redis-py's parsers (Python or hiredis), for every version we support;
redis-py drops the connection on the error, so no half-read reply is parsed.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from kernel_cache.errors import KernelCacheError
from kernel_cache.settings.remote_url import RemoteUrl


class ReplyTooLarge(KernelCacheError, OSError):
    """The server sent more than the call's byte budget: a reply no entry of ours can be."""


class CallBudget:
    """One call's deadline (monotonic seconds) and the bytes it may still receive."""

    def __init__(self, seconds: float, max_bytes: int):
        self.deadline = time.monotonic() + seconds
        self.bytes_left = max_bytes
        self.max_bytes = max_bytes
        self.overflowed = False


_current = threading.local()


def current() -> CallBudget | None:
    budget: CallBudget | None = getattr(_current, "budget", None)
    return budget


@contextlib.contextmanager
def budget(seconds: float, max_bytes: int) -> Iterator[CallBudget]:
    """Every Redis call this thread makes inside shares one deadline and one byte budget."""
    outer = current()
    _current.budget = inner = CallBudget(seconds, max_bytes)
    try:
        yield inner
    finally:
        _current.budget = outer


class GuardedSocket:
    """A socket whose reads and writes obey the calling thread's CallBudget (a plain socket where
    none is set: redis-py's own per-read timeout applies)."""

    def __init__(self, sock: Any):
        self._sock = sock
        self._timeout: float | None = sock.gettimeout()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    def settimeout(self, value: float | None) -> None:
        self._timeout = value
        self._sock.settimeout(value)

    def gettimeout(self) -> float | None:
        return self._timeout

    def _arm(self) -> CallBudget | None:
        call = current()
        if call is None:
            return None
        left = call.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the call's deadline passed")
        # 0 is redis-py asking without blocking (can_read): kept; otherwise never past the deadline
        self._sock.settimeout(left if self._timeout is None else min(self._timeout, left))
        return call

    def _clip(self, call: CallBudget | None, wanted: int) -> int:
        if call is None:
            return wanted
        if call.bytes_left <= 0:
            call.overflowed = True
            raise ReplyTooLarge(f"the server sent more than {call.max_bytes} bytes for one call")
        return min(wanted, call.bytes_left) if wanted > 0 else call.bytes_left

    def recv(self, size: int, *flags: int) -> bytes:
        call = self._arm()
        data: bytes = self._sock.recv(self._clip(call, size), *flags)
        if call is not None:
            call.bytes_left -= len(data)
        return data

    def recv_into(self, buffer: Any, nbytes: int = 0, *flags: int) -> int:
        call = self._arm()
        wanted = self._clip(call, nbytes or len(buffer))
        got: int = self._sock.recv_into(buffer, wanted, *flags)
        if call is not None:
            call.bytes_left -= got
        return got

    def sendall(self, data: Any, *flags: int) -> None:
        self._arm()
        self._sock.sendall(data, *flags)


class _Guarded:
    """Mixin for redis-py connection classes: connect within the call's deadline, then hand the
    parser a GuardedSocket."""

    socket_connect_timeout: float | None

    def _connect(self) -> Any:
        call, configured = current(), self.socket_connect_timeout
        if call is not None:
            left = call.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the call's deadline passed before connecting")
            self.socket_connect_timeout = left if configured is None else min(configured, left)
        try:
            return GuardedSocket(super()._connect())  # type: ignore[misc]
        finally:
            self.socket_connect_timeout = configured


def connection_class(url: str) -> type:
    """The guarded redis-py connection class for `url`'s scheme (unix://, rediss://, redis://)."""
    import redis

    scheme = RemoteUrl(url).scheme
    base: type = (redis.UnixDomainSocketConnection if scheme == "unix"
                  else redis.SSLConnection if scheme == "rediss" else redis.Connection)
    return type(f"Guarded{base.__name__}", (_Guarded, base), {})
