"""One configuration of this process: its `Config`, its store, and the per-process memos of every floor.

`configure()` replaces the session, so nothing remembered under one configuration (content keys,
record texts, winners read from the old store, kernels touched in it, lowered payloads) survives
into the next; the lowering takes the session once per call and passes it (or its store and
config) down, and the floors keep their memos here by name instead of in module globals.

What stays module-level is a fact about this process's installed software or devices (the
toolchain fingerprint, keyed by the identity of the files it hashes; jaxlib's capabilities; a
device's architecture) or a pure function of its key (deflate runs by digest, Triton's parsed
options): true under any configuration, and costly to recompute (hashing libtriton takes 0.4 s).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from kernel_cache.settings.config import Config
from kernel_cache.store import Store

M = TypeVar("M")


class Session:
    def __init__(self, config: Config) -> None:
        self.store = Store(config)
        self.config = self.store.config  # with the bound stored in the cache directory, where that applies
        # name -> memo; read directly on a hot path (`session.memos.get(name)`), made through `memo()`
        self.memos: dict[str, Any] = {}
        self._lock = threading.Lock()

    def memo(self, name: str, factory: Callable[[], M]) -> M:
        """The memo called `name` (made by `factory` on first use): a per-process cache that lives as
        long as this configuration. Names are the owning module's, e.g. "compiler.key.keys"."""
        found = self.memos.get(name)
        if found is None:
            with self._lock:
                found = self.memos.get(name)
                if found is None:
                    found = self.memos[name] = factory()
        return found

    def forget(self) -> None:
        """Drop every memo, keep the store: what a new process with this configuration would know
        (benchmarks time a fresh process's lowering this way)."""
        with self._lock:
            self.memos.clear()

    def close(self) -> None:
        self.store.close()
        self.memos.clear()
