"""The toolchain memo shared through the cluster's levels (the shared directory, the remote): what a
fresh node (an empty cache directory, no memo of its own) reads instead of deriving Triton's build
key, `ptxas --version`'s hash and jaxlib's plugin layout again (a large part of its first lowering).

Never weaker than the node's own memo: a record is found by the memo's name and the identity of its
files as the node's memo has it (path, size, mtime) plus each file's inode and ctime here, which no
copy, reinstall or edit keeps (the kernel sets ctime), so another installation, or this one changed
in any byte since, is another key; the record must repeat that very name and identity
(`memo_entry.text_for`). It is an entry like a kernel: signed where a signing key is configured and
verified on every read (a forged, unsigned or damaged record is refused, counted, and the text
derived here). Nodes that see the same files (one host's pods, a site's shared installation) share
it; another host's copy of an image has other ctimes and derives the text itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from kernel_cache import Store
from kernel_cache.entries import memo_entry


def node_identity(identity: Any) -> Any:
    """`identity` (a memo's, nested lists holding [path, size, mtime_ns] per file) with each file's
    inode and ctime_ns added to its own list; [path, None] stays (a file that is not there)."""
    if not isinstance(identity, list):
        return identity
    if (len(identity) == 3 and isinstance(identity[0], str) and os.path.isabs(identity[0])
            and all(type(part) is int for part in identity[1:])):
        try:
            st = os.stat(identity[0])
        except OSError:
            return [*identity, None]
        return [*identity, st.st_ino, st.st_ctime_ns]
    return [node_identity(part) for part in identity]


def memoized(store: Store, name: str, identity: list[Any], compute: Callable[[], str]) -> str:
    """Memo `name` of files with `identity` (the node's memo's) from `store`'s cluster levels,
    verified, where a node that sees these very files derived it; else `compute()`d here and
    published there."""
    node = node_identity(identity)
    key = memo_entry.memo_key(name, node)
    entry = store.get_shared(key)
    text = None if entry is None else memo_entry.text_for(entry, name, node)
    if text is None:
        text = compute()
        if len(text.encode()) <= memo_entry.MAX_TEXT_BYTES:
            store.put_shared(memo_entry.to_entry(name, node, text))
    return text
