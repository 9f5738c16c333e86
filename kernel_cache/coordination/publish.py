"""Atomic publish of one file on a (possibly network) filesystem.

A reader must see either no file or the whole file, never a partial one, even when the writer is
killed mid-write or the disk fills up: write a uniquely named temp file in the target directory,
fsync it, rename it over the final name (atomic on POSIX local filesystems and on NFS). A writer
killed before the rename leaves only a hidden temp file, which `is_temp` recognises for pruning.
"""

from __future__ import annotations

import os
import re
import secrets
import socket

from kernel_cache.trust.safefs import Tree

TEMP_SUFFIX = ".tmp"


def host_tag() -> str:
    """This host's name, safe inside a file name (tells operators which node left a file)."""
    return re.sub(r"[^A-Za-z0-9-]", "_", socket.gethostname())[:40] or "host"


def temp_name(final_name: str) -> str:
    """A hidden name beside `final_name`, unique across hosts and processes (host + pid + random)."""
    return f".{final_name}.{host_tag()}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}"


def is_temp(name: str) -> bool:
    return name.startswith(".") and name.endswith(TEMP_SUFFIX)


def publish(tree: Tree, parts: tuple[str, ...], data: bytes, *, durable: bool = True) -> None:
    """Write `data` to root/parts atomically (temp file, fsync, rename; see safefs.Tree.publish;
    `durable=False`: no fsync, for a file whose loss after a power cut costs nothing).
    File modes follow the umask (0666 & ~umask), so a group-shared directory stays shareable."""
    tree.publish(*parts, data=data, temp_name=temp_name(parts[-1]), durable=durable)
