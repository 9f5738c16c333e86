"""A small RESP2 client for the two calls a warm node sends (the peek that reads an entry, and TTL
refreshes), so a node served from Redis does not import redis-py (and asyncio with it, a large part
of a warm start) before its first kernel. Everything else goes through redis-py (`redis_link`).

The guarantees are redis_guard's: one deadline for a whole call and one byte budget counted as
bytes arrive (a reply announcing 400 MB is refused unread); arrays are bounded in depth and length.
Any failure ends the reader for the process: redis-py takes over, and its breaker judges the fault.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from kernel_cache.errors import KernelCacheError
from kernel_cache.settings.remote_url import BadRemoteUrl, RemoteUrl

MAX_LINE = 64 << 10  # a status, error or length line (Redis's own are a few dozen bytes)
MAX_DEPTH = 4  # nested arrays in a reply (the peek script's is one level)
MAX_ITEMS = 1 << 16  # elements of one array
CHUNK = 1 << 16


class RespError(KernelCacheError):
    """The server answered with an error reply (NOSCRIPT, MOVED, NOAUTH, ...): its text."""


class RespUnusable(KernelCacheError):
    """A URL this reader does not serve (TLS, options beyond a database number): redis-py serves it."""


class RespFault(KernelCacheError, OSError):
    """The server broke the protocol (`kind` "protocol"), went past the call's deadline ("timeout")
    or byte budget ("overflow"), or could not be reached or closed ("connection")."""

    def __init__(self, message: str, kind: str = "protocol"):
        super().__init__(message)
        self.kind = kind


class RespReader:
    """One connection, opened at the first call and kept; threads take turns."""

    def __init__(self, url: str, *, password: str | None, timeout: float, max_reply_bytes: int):
        try:
            self.where = where = RemoteUrl(url)
        except BadRemoteUrl:
            raise RespUnusable("a URL redis-py says what is wrong with") from None
        if where.scheme == "rediss" or {name for name, _ in where.options} - {"db"} or where.parts.fragment:
            raise RespUnusable(f"{where.scheme}:// URL or options left to redis-py")
        self.password = password if password is not None else where.password
        self.timeout = timeout
        self.max_reply_bytes = max_reply_bytes
        self.usable = True
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._buffer = bytearray()
        self._deadline = 0.0
        self._bytes_left = 0

    def call(self, *args: bytes | str | int) -> Any:
        """One command's reply: bytes, int, None, a list of them, or RespError raised. Any other
        failure raises RespFault and ends the reader."""
        reply = self.pipeline([args])[0]
        if isinstance(reply, RespError):
            raise reply
        return reply

    def pipeline(self, commands: list[tuple[bytes | str | int, ...]]) -> list[Any]:
        """Several commands sent at once, their replies in order (an error reply is returned as a
        RespError, not raised), within one deadline and byte budget."""
        with self._lock:
            if not self.usable:
                raise RespFault("the reader was given up", "connection")
            self._deadline = time.monotonic() + self.timeout
            self._bytes_left = self.max_reply_bytes
            try:
                sock = self._connected()
                self._send(sock, b"".join(_encode(command) for command in commands))
                replies = [self._reply(sock, 0) for _ in commands]
            except Exception as exc:  # the connection is in an unknown state: this reader is done
                self.give_up()
                if isinstance(exc, (RespError, RespFault)):
                    raise
                kind = "timeout" if isinstance(exc, TimeoutError) else "connection" if isinstance(exc, OSError) else "protocol"
                raise RespFault(f"{type(exc).__name__}: {exc}", kind) from exc
        return replies

    def give_up(self) -> None:
        self.usable = False
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
                self._buffer.clear()

    # Internals ------------------------------------------------------------------------------
    def _left(self) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise RespFault(f"no whole reply within {self.timeout:g} s", "timeout")
        return left

    def _connected(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        where = self.where
        if where.path is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self._left())
            sock.connect(where.path)
        else:
            sock = socket.create_connection((where.host, where.port), timeout=self._left())
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        setup: list[tuple[bytes | str | int, ...]] = []
        if self.password is not None:
            setup.append(("AUTH", where.username, self.password) if where.username else ("AUTH", self.password))
        if where.db:
            setup.append(("SELECT", where.db))
        if setup:
            self._send(sock, b"".join(_encode(command) for command in setup))
            for _ in setup:
                reply = self._reply(sock, 0)
                if isinstance(reply, RespError):
                    raise reply
        return sock

    def _send(self, sock: socket.socket, data: bytes) -> None:
        sock.settimeout(self._left())
        sock.sendall(data)

    def _fill(self, sock: socket.socket) -> None:
        if self._bytes_left <= 0:
            raise RespFault(f"the server sent more than {self.max_reply_bytes} bytes for one call", "overflow")
        sock.settimeout(self._left())
        data = sock.recv(min(CHUNK, self._bytes_left))
        if not data:
            raise RespFault("the server closed the connection", "connection")
        self._bytes_left -= len(data)
        self._buffer += data

    def _line(self, sock: socket.socket) -> bytes:
        while True:
            end = self._buffer.find(b"\r\n")
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[:end + 2]
                return line
            if len(self._buffer) > MAX_LINE:
                raise RespFault("a reply line without an end")
            self._fill(sock)

    def _exact(self, sock: socket.socket, size: int) -> bytes:
        if size + 2 - len(self._buffer) > self._bytes_left:
            raise RespFault(f"the server announced {size} bytes, more than {self.max_reply_bytes} for one call",
                            "overflow")
        while len(self._buffer) < size + 2:
            self._fill(sock)
        if self._buffer[size:size + 2] != b"\r\n":
            raise RespFault("a bulk reply of the wrong length")
        data = bytes(self._buffer[:size])
        del self._buffer[:size + 2]
        return data

    def _reply(self, sock: socket.socket, depth: int) -> Any:
        line = self._line(sock)
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b"-":
            return RespError(rest.decode(errors="replace"))
        try:
            number = int(rest)
        except ValueError:
            raise RespFault(f"a reply of type {kind!r} without a number") from None
        if kind == b":":
            return number
        if kind == b"$":
            return None if number < 0 else self._exact(sock, number)
        if kind == b"*":
            if number < 0:
                return None
            if depth >= MAX_DEPTH or number > MAX_ITEMS:
                raise RespFault("an array nested or long past any reply the level asks for")
            return [self._reply(sock, depth + 1) for _ in range(number)]
        raise RespFault(f"a reply of unknown type {kind!r}")


def _encode(command: tuple[bytes | str | int | None, ...]) -> bytes:
    parts = [arg if isinstance(arg, bytes) else str(arg).encode() for arg in command if arg is not None]
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(part), part) for part in parts)
