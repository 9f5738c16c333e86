"""A misbehaving Redis for the remote level's tests and scripts/bench_remote.py: a RESP server on a
free loopback port that answers the connection handshake (CLIENT, SELECT, AUTH, PING) as Redis does,
then every other command the way `behaviour` says (scaffolding: the product never imports it):

- "trickle": a valid bulk reply, one byte every `interval` seconds;
- "huge": a bulk reply announcing `size` bytes, then that many bytes as fast as the client reads;
- "error": an error reply of `text` (escape codes and a bare CR by default);
- "hang": nothing at all;
- "reply": the raw reply `replies` holds for the command's first word (CLUSTER, EVALSHA…; a
  callable is asked each time), the handshake answered as Redis does, `default` for any other
  (an unknown-command error unless given);
- "echo": every command, the handshake's included (AUTH, HELLO), refused with an error that quotes
  its arguments, as a server without that command does.
"""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from typing import Any

HANDSHAKE = {b"HELLO": b"%1\r\n$5\r\nproto\r\n:3\r\n", b"CLIENT": b"+OK\r\n", b"SELECT": b"+OK\r\n",
             b"AUTH": b"+OK\r\n"}  # what a connection's first commands get from Redis
ESCAPES = "ERR \x1b[31mred\x1b[0m\rforged line \x07"


class FakeRedis:
    def __init__(self, behaviour: str, *, interval: float = 0.1, size: int = 400_000_000, text: str = ESCAPES,
                 replies: dict[bytes, Any] | None = None, default: Any = b"-ERR unknown command\r\n"):
        self.behaviour, self.interval, self.size, self.text = behaviour, interval, size, text
        self.replies = replies or {}
        self.default = default
        self._connection = threading.local()  # each connection is served on a thread of its own
        self.commands: list[list[bytes]] = []
        self.bytes_sent = 0
        fake = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                fake._serve(self.request)

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True, name="fake-resp").start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeRedis:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def nil(self) -> bytes:
        """A null reply as this connection's protocol writes it (RESP3 after HELLO 3, else RESP2)."""
        return b"_\r\n" if getattr(self._connection, "resp3", False) else b"$-1\r\n"

    # One connection -----------------------------------------------------------------------
    def _serve(self, sock: socket.socket) -> None:
        reader = sock.makefile("rb")
        try:
            while True:
                command = _read_command(reader)
                if command is None:
                    return
                self.commands.append(command)
                verb = command[0].upper() if command else b""
                if verb == b"HELLO":
                    self._connection.resp3 = command[1:2] == [b"3"]
                if self.behaviour == "echo":
                    quoted = b" ".join(b"'" + word + b"'" for word in command[1:])
                    sock.sendall(b"-ERR unknown command '" + verb + b"', with args beginning with: " + quoted + b"\r\n")
                elif self.behaviour == "reply":
                    reply = self.replies.get(verb) or HANDSHAKE.get(verb) or self.default
                    sock.sendall(reply() if callable(reply) else reply)
                elif verb in (b"CLIENT", b"SELECT", b"AUTH"):
                    sock.sendall(b"+OK\r\n")
                elif verb == b"PING":
                    sock.sendall(b"+PONG\r\n")
                else:
                    self._misbehave(sock)
        except OSError:
            return

    def _misbehave(self, sock: socket.socket) -> None:
        if self.behaviour == "trickle":
            for byte in b"$5\r\nhello\r\n":
                time.sleep(self.interval)
                sock.sendall(bytes([byte]))
        elif self.behaviour == "huge":
            sock.sendall(b"$%d\r\n" % self.size)
            chunk = bytes(1 << 16)
            left = self.size
            while left > 0:
                sent = sock.send(chunk[:left])
                self.bytes_sent += sent
                left -= sent
            sock.sendall(b"\r\n")
        elif self.behaviour == "error":
            sock.sendall(b"-" + self.text.encode() + b"\r\n")
        elif self.behaviour == "hang":
            time.sleep(3600)
        else:
            raise ValueError(f"unknown behaviour {self.behaviour!r}")


def _read_command(reader: object) -> list[bytes] | None:
    """One RESP array of bulk strings (what redis-py sends), or None at the end of the stream."""
    readline = reader.readline  # type: ignore[attr-defined]
    read = reader.read  # type: ignore[attr-defined]
    head = readline()
    if not head:
        return None
    if not head.startswith(b"*"):  # an inline command
        words: list[bytes] = head.split()
        return words
    args = []
    for _ in range(int(head[1:])):
        length = int(readline()[1:])
        args.append(read(length + 2)[:-2])
    return args


def slot_map_reply(primaries: int, replicas: int = 0, port: int = 7000) -> bytes:
    """A CLUSTER SLOTS reply of `primaries` ranges (one slot each, cycling over 16,384), each with
    its own primary and `replicas` replicas, as a node of a huge or hostile cluster sends it."""
    def node(n: int) -> bytes:
        ident = b"%040x" % n
        return b"*3\r\n$9\r\n127.0.0.1\r\n:%d\r\n$40\r\n%s\r\n" % (port + n % 50000, ident)
    parts = [b"*%d\r\n" % primaries]
    for i in range(primaries):
        slot = i % 16384
        parts.append(b"*%d\r\n:%d\r\n:%d\r\n" % (3 + replicas, slot, slot))
        parts += [node(i * (replicas + 1) + r) for r in range(replicas + 1)]
    return b"".join(parts)
