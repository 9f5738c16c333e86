"""Compile-worker slots: one bound on the workers of all the processes of a node that share a cache.

The ranks of a job on one node start cold together, and each would start its own pool (8 ranks on a
16-core node: 64 interpreters importing Triton at once, ~8 GiB) just when they all trace. A slot is a
lock file, `<memo dir>/locks/compile-workers/<host>/<i>`; a parent takes a free one (a non-blocking
`flock`) for each worker it starts and hands the locked descriptor to the worker, which holds it for
its life, so whatever ends a worker (even kill -9) frees its slot: no count goes stale. The host's
name keeps a directory on a network filesystem from bounding several nodes as one. Where the
directory cannot hold lock files, slots bound nothing: each pool's own bound stays.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from kernel_cache.errors import KernelCacheError
from kernel_cache.levels.cache_marker import LOCKS_DIR
from kernel_cache.trust.safefs import Owners, Tree, host_tag

SUBDIR = "compile-workers"
UNBOUNDED = -1  # `take`'s answer where slots cannot be kept: start the worker without one


def take(memo_dir: Path, capacity: int) -> int | None:
    """A locked descriptor of a free slot among `capacity` (the caller passes it to one worker and
    closes its own copy), None when every slot is held, or UNBOUNDED where slots cannot be kept."""
    try:
        tree = Tree(memo_dir, Owners.current(), create=True)
    except (OSError, KernelCacheError):
        return UNBOUNDED
    try:
        for index in range(capacity):
            try:
                with tree.open_lock_file(LOCKS_DIR, SUBDIR, host_tag(), str(index)) as fd:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        continue  # held: by a worker of this process or of a neighbour
                    return os.dup(fd)  # the lock lives on with the duplicate (one open file)
            except (OSError, KernelCacheError):
                return UNBOUNDED
        return None
    finally:
        tree.close()


def release(slot: int | None) -> None:
    """Close the caller's copy of a slot's descriptor (its worker's copy keeps it held)."""
    if slot is not None and slot != UNBOUNDED:
        with contextlib.suppress(OSError):
            os.close(slot)
