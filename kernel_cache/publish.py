"""Atomic publish of one file on a (possibly network) filesystem.

A reader must see either no file or the whole file, never a partial one, even when the writer is
killed mid-write or the disk fills up: write a uniquely named temp file in the target directory,
fsync it, rename it over the final name (atomic on POSIX local filesystems and on NFS). A writer
killed before the rename leaves only a hidden temp file, which `is_temp` recognises for pruning.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import socket
from pathlib import Path
from typing import Callable

TEMP_SUFFIX = ".tmp"

# Test hook: called with the temp path after the data is written and fsynced, before the rename.
# Tests use it to pause a writer (then SIGKILL it) or to inject a fault such as ENOSPC.
before_rename: Callable[[Path], None] | None = None


def host_tag() -> str:
    """This host's name, safe inside a file name (tells operators which node left a file)."""
    return re.sub(r"[^A-Za-z0-9-]", "_", socket.gethostname())[:40] or "host"


def temp_path(final: Path) -> Path:
    """A hidden name beside `final`, unique across hosts and processes (host + pid + random)."""
    return final.with_name(f".{final.name}.{host_tag()}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}")


def is_temp(name: str) -> bool:
    return name.startswith(".") and name.endswith(TEMP_SUFFIX)


def publish(final: Path, data: bytes) -> None:
    """Write `data` to `final` atomically. File modes follow the umask (0666 & ~umask), so a
    group-shared directory stays shareable. On any failure the temp file is removed and the
    error propagates; `final` is untouched."""
    tmp = temp_path(final)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        if before_rename is not None:
            before_rename(tmp)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_directory(final.parent)


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable; best effort (some network filesystems refuse O_DIRECTORY fsync)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
