"""Counters that survive the process: hits per tier, misses, compiles, compile seconds saved.

A lookup only bumps an in-memory counter; `flush` adds the deltas to a small diskcache (atomic
increments across processes) after a compile, at most once a second otherwise, and at exit. Each
counted event is also handed to `kernel_cache.events`' listeners (jax.monitoring, via lowering).
Counters are best effort: the index is opened without pickle (RawOnlyDisk), every wait on it is
bounded by STATS_TIMEOUT, and a busy, full or read-only index only loses counts.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from diskcache.core import MODE_RAW

from . import events
from .disk_index import INDEX, RawOnlyDisk, open_index
from .disk_sql import open_read_only, raw_rows

STATS_DIR = "stats"
STATS_TIMEOUT = 1.0
SKIP_AFTER_FAILURE = 60.0
_MICRO = 1_000_000
LEVELS = ("memory", "disk", "shared", "remote")  # hits are counted per level
COUNTERS = (*(f"hits.{level}" for level in LEVELS), "misses", "compiles", "errors", "rejected",
            "compile_us", "saved_us")


class Stats:
    def __init__(self, directory: Path | None = None, read_only: bool = False):
        """`read_only`: read persisted counters without opening the index for writing (an
        operator's look at a full, read-only or busy cache); nothing is flushed."""
        self._lock = threading.Lock()
        self._open_lock = threading.Lock()
        self._pending: Counter[str] = Counter()
        self._entry_hits: Counter[str] = Counter()
        self._session: Counter[str] = Counter()
        self._last_flush = time.monotonic()
        self._db: Any = None
        self._directory = None if directory is None or read_only else Path(directory)
        self._skip_until = 0.0
        self._unavailable = ""  # why persistent counters cannot be read or written, if so
        self._persisted: dict[str, Any] | None = None  # read-only mode: the counters as read at open
        if directory is not None and read_only:
            try:
                with contextlib.closing(open_read_only(Path(directory) / STATS_DIR / INDEX, STATS_TIMEOUT)) as con:
                    rows = list(raw_rows(con))
                self._persisted = {k: v for k, mode, v in rows
                                   if mode == MODE_RAW and isinstance(k, str) and isinstance(v, int)}
            except Exception as exc:
                self._unavailable = f"{type(exc).__name__}: {exc}"

    def _index(self) -> Any:
        """The counters' index, opened at its first use (the first flush: after a compile, a second
        into a run of hits, or at exit), not when the store is created; None if it cannot be."""
        if self._directory is None:
            return self._db
        with self._open_lock:
            if self._directory is None:
                return self._db
            directory = self._directory
            try:
                self._db = open_index(directory / STATS_DIR, STATS_TIMEOUT, disk=RawOnlyDisk, eviction_policy="none")
            except Exception as exc:
                self._db, self._unavailable = None, f"{type(exc).__name__}: {exc}"
            self._directory = None
        return self._db

    @property
    def unavailable(self) -> str:
        self._index()
        return self._unavailable

    def hit(self, tier: str, key: str, compile_seconds: float) -> None:
        with self._lock:
            self._bump(f"hits.{tier}", 1)
            self._bump("saved_us", int(compile_seconds * _MICRO))
            self._entry_hits[key] += 1
        events.emit(events.HIT, tier, compile_seconds)
        self._maybe_flush()

    def miss(self) -> None:
        with self._lock:
            self._bump("misses", 1)
        events.emit(events.MISS)

    def compiled(self, seconds: float) -> None:
        with self._lock:
            self._bump("compiles", 1)
            self._bump("compile_us", int(seconds * _MICRO))
        events.emit(events.COMPILE, seconds=seconds)
        self.flush()

    def error(self) -> None:
        with self._lock:
            self._bump("errors", 1)
        events.emit(events.ERROR)

    def rejected(self, tier: str = "") -> None:
        """An entry refused for who wrote it (unsigned, foreign key, untrusted owner), read from `tier`
        (the counter is one total; the tier reaches event listeners)."""
        with self._lock:
            self._bump("rejected", 1)
        events.emit(events.REJECTED, tier)

    def _bump(self, name: str, amount: int) -> None:
        self._pending[name] += amount
        self._session[name] += amount

    def session(self) -> dict[str, Any]:
        """This process's counters (not yet or already flushed)."""
        with self._lock:
            return self._render(self._session)

    def _maybe_flush(self) -> None:
        if time.monotonic() - self._last_flush > 1.0:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            pending, hits = self._pending, self._entry_hits
            self._pending, self._entry_hits = Counter(), Counter()
            self._last_flush = time.monotonic()
        db = None if time.monotonic() < self._skip_until else self._index()
        if db is None:
            return
        try:
            for name, amount in pending.items():
                if amount:
                    db.incr(name, amount, default=0, retry=False)
            for key, amount in hits.items():
                db.incr(f"entry_hits.{key}", amount, default=0, retry=False)
        except Exception:  # best effort: a full disk or a stuck neighbour must not slow every compile
            self._skip_until = time.monotonic() + SKIP_AFTER_FAILURE

    def totals(self) -> dict[str, Any]:
        """Counters over all processes that used this directory (including unflushed ones here)."""
        self.flush()
        raw: Counter[str] = Counter()
        if self._persisted is not None:
            return self._render(Counter({n: self._persisted.get(n, 0) for n in COUNTERS}) + Counter(self._session))
        try:
            db = self._index()
            if db is None:
                raise LookupError
            for name in COUNTERS:
                value = db.get(name, 0, retry=False)
                raw[name] = value if isinstance(value, int) else 0
        except Exception:
            raw = Counter(self._session)
        return self._render(raw)

    def entry_hits(self, key: str) -> int:
        if self._persisted is not None:
            return int(self._persisted.get(f"entry_hits.{key}", 0)) + self._session_entry(key)
        try:
            db = self._index()
            value = db.get(f"entry_hits.{key}", 0, retry=False) if db is not None else 0
        except Exception:
            value = 0
        return (value if isinstance(value, int) else 0) + self._session_entry(key)

    def _session_entry(self, key: str) -> int:
        with self._lock:
            return self._entry_hits.get(key, 0)

    def forget_entry(self, key: str) -> None:
        db = self._index()
        if db is not None:
            with contextlib.suppress(Exception):
                db.delete(f"entry_hits.{key}", retry=False)

    def zero(self) -> None:
        with self._lock:
            self._pending.clear()
            self._entry_hits.clear()
            self._session.clear()
        db = self._index()
        if db is not None:
            for name in COUNTERS:
                db.delete(name, retry=False)

    @staticmethod
    def _render(raw: Counter[str]) -> dict[str, Any]:
        return {
            "hits": {t: int(raw.get(f"hits.{t}", 0)) for t in LEVELS},
            "misses": int(raw.get("misses", 0)),
            "compiles": int(raw.get("compiles", 0)),
            "errors": int(raw.get("errors", 0)),
            "rejected": int(raw.get("rejected", 0)),
            "compile_seconds": raw.get("compile_us", 0) / _MICRO,
            "compile_seconds_saved": raw.get("saved_us", 0) / _MICRO,
        }

    def close(self) -> None:
        self.flush()
        if self._db is not None:
            with contextlib.suppress(Exception):
                self._db.close()
