"""One configuration of this process: its `Config`, its store, and the per-process memos of every floor.

`configure()` replaces the session, so nothing remembered under one configuration (content keys,
record texts, winners, lowered payloads) survives into the next: the floors keep their memos in it
(each a typed `SessionMemo` of its own module) instead of in module globals. `tuning` is set while
`cachectl tune` forces or records autotuned configs (nothing lowered is reused).

What stays module-level is a fact about this process's installed software or devices (the
toolchain fingerprint, keyed by the identity of the files it hashes; jaxlib's capabilities; a
device's architecture) or a pure function of its key (deflate runs by digest, Triton's parsed
options): true under any configuration, and costly to recompute (hashing libtriton takes 0.4 s).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from kernel_cache.settings.config import Config
from kernel_cache.store import Store

M = TypeVar("M")


class SessionMemo(Generic[M]):
    """One floor's per-session memo: a typed key into every session, made by `factory` at its first use."""

    __slots__ = ("factory", "name")

    def __init__(self, name: str, factory: Callable[[Session], M]) -> None:
        self.name = name  # the owner's name for it, for a reader of `Session.memos`
        self.factory = factory

    def of(self, session: Session) -> M:
        found: M | None = session.memos.get(self)
        return found if found is not None else session.made(self)

    def __repr__(self) -> str:
        return f"SessionMemo({self.name!r})"


class Session:
    def __init__(self, config: Config) -> None:
        self.store = Store(config)
        self.config = self.store.config  # with the bound stored in the cache directory, where that applies
        self.memos: dict[SessionMemo[Any], Any] = {}  # each floor's memos, by their declaration
        self.tuning: Any = None  # the tuning under way (the lowering's `Tuning`), or None
        self._lock = threading.Lock()

    def made(self, memo: SessionMemo[M]) -> M:
        with self._lock:
            found: M | None = self.memos.get(memo)
            if found is None:
                found = self.memos[memo] = memo.factory(self)
        return found

    def forget(self) -> None:
        """Drop every memo, keep the store: what a new process with this configuration would know
        (benchmarks time a fresh process's lowering this way)."""
        with self._lock:
            self.memos.clear()

    def close(self) -> None:
        self.store.close()
        self.memos.clear()
