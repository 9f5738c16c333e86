"""Counters that survive the process: hits per tier, misses, compiles, compile seconds saved.

A lookup only bumps an in-memory counter; `flush` adds the deltas to a small diskcache (atomic
increments across processes) after a compile, at most once a second otherwise, and at exit.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import diskcache

STATS_DIR = "stats"
_MICRO = 1_000_000
COUNTERS = ("hits.memory", "hits.disk", "hits.shared", "misses", "compiles", "errors",
            "compile_us", "saved_us")


class Stats:
    def __init__(self, directory: Path | None = None):
        self._lock = threading.Lock()
        self._pending: Counter = Counter()
        self._entry_hits: Counter = Counter()
        self._session: Counter = Counter()
        self._last_flush = time.monotonic()
        self._db = None
        if directory is not None:
            try:
                self._db = diskcache.Cache(str(Path(directory) / STATS_DIR), eviction_policy="none")
            except Exception:
                self._db = None

    def hit(self, tier: str, key: str, compile_seconds: float) -> None:
        with self._lock:
            self._bump(f"hits.{tier}", 1)
            self._bump("saved_us", int(compile_seconds * _MICRO))
            self._entry_hits[key] += 1
        self._maybe_flush()

    def miss(self) -> None:
        with self._lock:
            self._bump("misses", 1)

    def compiled(self, seconds: float) -> None:
        with self._lock:
            self._bump("compiles", 1)
            self._bump("compile_us", int(seconds * _MICRO))
        self.flush()

    def error(self) -> None:
        with self._lock:
            self._bump("errors", 1)

    def _bump(self, name: str, amount: int) -> None:
        self._pending[name] += amount
        self._session[name] += amount

    def session(self) -> dict:
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
        if self._db is None:
            return
        try:
            for name, amount in pending.items():
                if amount:
                    self._db.incr(name, amount, default=0, retry=True)
            for key, amount in hits.items():
                self._db.incr(f"entry_hits.{key}", amount, default=0, retry=True)
        except Exception:
            pass  # stats are best effort; a full disk must not fail the program

    def totals(self) -> dict:
        """Counters over all processes that used this directory (including unflushed ones here)."""
        self.flush()
        raw: Counter = Counter()
        if self._db is not None:
            for name in COUNTERS:
                raw[name] = int(self._db.get(name, 0, retry=True))
        else:
            raw = Counter(self._session)
        return self._render(raw)

    def entry_hits(self, key: str) -> int:
        if self._db is None:
            return self._session_entry(key)
        return int(self._db.get(f"entry_hits.{key}", 0, retry=True)) + self._session_entry(key)

    def _session_entry(self, key: str) -> int:
        with self._lock:
            return self._entry_hits.get(key, 0)

    def forget_entry(self, key: str) -> None:
        if self._db is not None:
            self._db.delete(f"entry_hits.{key}", retry=True)

    def zero(self) -> None:
        with self._lock:
            self._pending.clear()
            self._entry_hits.clear()
            self._session.clear()
        if self._db is not None:
            for name in list(self._db.iterkeys()):
                if not str(name).startswith("entry_hits."):
                    self._db.delete(name, retry=True)

    @staticmethod
    def _render(raw: Counter) -> dict:
        return {
            "hits": {t: int(raw.get(f"hits.{t}", 0)) for t in ("memory", "disk", "shared")},
            "misses": int(raw.get("misses", 0)),
            "compiles": int(raw.get("compiles", 0)),
            "errors": int(raw.get("errors", 0)),
            "compile_seconds": raw.get("compile_us", 0) / _MICRO,
            "compile_seconds_saved": raw.get("saved_us", 0) / _MICRO,
        }

    def close(self) -> None:
        self.flush()
        if self._db is not None:
            self._db.close()
