"""A compile worker process (`main`), started by `compile_processes`: a fresh interpreter that imports
Triton once, then compiles one spec per request until its input closes.

A request is a spec's recipe; a reply is the entry (checksummed, no pickle) under the key computed
here, which the parent compares with its own. The session is configured, never read from the
environment: memory only, with the parent's memo directory. Frames travel on pipes moved off fds 0
and 1, so that whatever a compile or a kernel's module prints cannot corrupt a frame.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import struct
import sys
import time
from pathlib import Path
from typing import Any

import kernel_cache
from kernel_cache.entries.entry import Entry, encode
from kernel_cache.errors import KernelCacheError
from kernel_cache.settings.config import Config

from . import compile as compiling
from . import examples, recipe
from . import key as content
from .spec import make_spec

# Frame kinds. Parent -> worker: HELLO (once: its sys.path, a target to warm up for), REQUEST (a
# recipe). Worker -> parent: READY (imports done), ENTRY (an encoded entry), ERROR (why not: the
# parent then compiles it), LOADING (the kernel's module is not imported here yet: the parent compiles
# this one while the worker imports it, then READY again).
HELLO, REQUEST, READY, ENTRY, ERROR, LOADING = 1, 2, 3, 4, 5, 6
HEADER = struct.Struct("<BQ")  # kind, payload length
MAX_FRAME = 1 << 30  # far above any entry (`entry.DEFAULT_MAX_ENTRY_BYTES` is 256 MiB)


class FrameError(KernelCacheError, OSError):
    """The other end closed the pipe mid-frame or announced a frame no reply can be."""


def write_frame(fd: int, kind: int, payload: bytes) -> None:
    """One frame on a blocking pipe (os.write may write part of it: the rest follows)."""
    view = memoryview(HEADER.pack(kind, len(payload)) + payload)
    while view:
        view = view[os.write(fd, view):]


def read_exactly(fd: int, size: int, deadline: float | None = None) -> bytes:
    """`size` bytes from a blocking pipe (b"" where it closed before the first byte), by `deadline`."""
    parts: list[bytes] = []
    left = size
    while left:
        if deadline is not None:
            poller = select.poll()  # not select(): a process with many files has descriptors past FD_SETSIZE
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
            if not poller.poll(max(0, int((deadline - time.monotonic()) * 1000))):
                raise FrameError("no answer in time")
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            if left == size:
                return b""
            raise FrameError(f"pipe closed {left} bytes before the end of a frame")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def read_frame(fd: int, deadline: float | None = None) -> tuple[int, bytes] | None:
    """The next frame, or None when the other end closed the pipe between frames."""
    header = read_exactly(fd, HEADER.size, deadline)
    if not header:
        return None
    kind, size = HEADER.unpack(header)
    if size > MAX_FRAME:
        raise FrameError(f"frame of {size} bytes announced (at most {MAX_FRAME})")
    payload = read_exactly(fd, size, deadline)
    if len(payload) != size:
        raise FrameError("pipe closed after a frame header")
    return kind, payload


def use_memo(memo_dir: str | None, first: bool = False) -> None:
    """This process's session: memory only, never from the environment, the toolchain memo in `memo_dir`."""
    wanted = None if memo_dir is None else Path(memo_dir)
    if first or kernel_cache.current_session().config.memo_dir != wanted:
        kernel_cache.configure(Config(toolchain_memo_dir=wanted))


def module_to_load(payload: bytes) -> str | None:
    """The module of a request's kernel where not imported yet: it may import a framework (seconds),
    which the parent's compile must not wait for."""
    try:
        module = json.loads(payload)["recipe"]["kernel"].partition(":")[0]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return module if isinstance(module, str) and module and module not in sys.modules else None


def compile_request(payload: bytes) -> tuple[int, bytes]:
    """(ENTRY, the entry) for a request, or (ERROR, why): any failure is the parent's to redo."""
    try:
        request: dict[str, Any] = json.loads(payload)
        use_memo(request["memo_dir"])
        spec = recipe.from_recipe(request["recipe"])
        key = content.content_key(spec)
        meta, blobs = compiling.compile_spec(spec).to_entry()
        return ENTRY, encode(Entry(key=key, meta=meta, blobs=blobs))
    except Exception as exc:  # reported, never fatal: the worker serves the next request
        return ERROR, json.dumps({"error": type(exc).__name__, "message": str(exc)[-4000:]}).encode()


def serve(fd_in: int, fd_out: int) -> None:
    """HELLO, then READY, then a reply per request until the parent closes the pipe."""
    hello = read_frame(fd_in)
    if hello is None or hello[0] != HELLO:
        return
    setup = json.loads(hello[1])
    paths = [p for p in setup.get("path", []) if isinstance(p, str)]
    sys.path[:] = paths + [p for p in sys.path if p not in paths]  # the parent's modules, as it imports them
    use_memo(setup.get("memo_dir"), first=True)
    if isinstance(setup.get("warm"), str):  # one small compile sets up Triton's context, dialects and LLVM's
        with contextlib.suppress(Exception):  # target before READY, not at the first kernel sent (best effort)
            compiling.compile_spec(make_spec(examples.add_kernel, ["*fp32", "*fp32", 4096, "*fp32"], {"BLOCK": 64},
                                             target=setup["warm"]))
    ready = json.dumps({"pid": os.getpid()}).encode()
    write_frame(fd_out, READY, ready)
    while (frame := read_frame(fd_in)) is not None:
        kind, payload = frame
        if kind != REQUEST:
            continue
        module = module_to_load(payload)
        if module is None:
            write_frame(fd_out, *compile_request(payload))
        else:  # answered at once: the parent compiles this kernel while its module is imported here
            write_frame(fd_out, LOADING, json.dumps({"module": module}).encode())
            with contextlib.suppress(Exception):  # a failure is the next request's to meet
                importlib.import_module(module)
            write_frame(fd_out, READY, ready)


def main() -> None:
    fd_in, fd_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    try:
        serve(fd_in, fd_out)
    except (FrameError, BrokenPipeError):
        pass  # the parent went away or broke the protocol: nothing to answer

