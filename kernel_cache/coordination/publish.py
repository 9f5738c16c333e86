"""Atomic publish of one file on a (possibly network) filesystem: a uniquely named temp file, fsynced,
renamed over the final name, so a reader sees no file or the whole file even when the writer is
killed or the disk fills. A writer killed before the rename leaves a temp file `is_temp` recognises.
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
    """Write `data` to root/parts atomically (`durable=False`: no fsync, for a file whose loss after a
    power cut costs nothing); modes follow the umask, so a group-shared directory stays shareable."""
    tree.publish(*parts, data=data, temp_name=temp_name(parts[-1]), durable=durable)
