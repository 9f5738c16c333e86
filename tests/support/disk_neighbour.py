"""A neighbour holding the local index's lock (as one rebuilding or upgrading the index holds it),
and a store opened meanwhile: what a process starting beside that neighbour does."""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from kernel_cache import Store
from kernel_cache.coordination import locks
from kernel_cache.levels.disk.index import INDEX_LOCK, LOCKS_DIR, open_tree
from kernel_cache.settings.config import Config


@contextlib.contextmanager
def store_opened_while_the_index_is_held(directory: Path) -> Iterator[tuple[Store, list[warnings.WarningMessage]]]:
    """(a store opened on `directory` while a neighbour holds the index lock, the warnings its opening
    gave); it must open within 5 s (its wait is bounded by a 0.5 s lock timeout). The lock is held
    until the block ends; the store is the caller's to close."""
    tree = open_tree(directory, None, create=False)
    try:
        with locks.hold(tree, (LOCKS_DIR, INDEX_LOCK), "flock", 1.0) as held:
            assert held
            start = time.monotonic()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                store = Store(Config(dir=directory, lock_timeout=0.5))
            assert time.monotonic() - start < 5
            yield store, caught
    finally:
        tree.close()
