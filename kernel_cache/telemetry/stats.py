"""Counters that survive the process: hits per level, misses, compiles, compile seconds saved.

A lookup only bumps an in-memory counter; `flush` adds the deltas to `counters` after a compile, at
most once a second otherwise, and at exit. Each event also goes to listeners (public as
`kernel_cache.telemetry.events`) and recorders (jax.monitoring's, called directly); what one raises
is warned about once. Counters are best effort: every wait on their table is bounded by
STATS_TIMEOUT, and a busy, full or read-only table only loses counts. The counters and their events
are one place: a hit is counted and sent without leaving it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from kernel_cache.telemetry import counters
from kernel_cache.telemetry.warnings_once import warn_once

STATS_DIR = "stats"  # in the local cache directory (its level makes it: levels/cache_marker.py names it)
STATS_TIMEOUT = 1.0
SKIP_AFTER_FAILURE = 60.0
_MICRO = 1_000_000
LEVELS = ("memory", "disk", "job", "shared", "remote")  # hits are counted per level
# Per level, what the store counts as it walks the chain (`Stats.levels`, bumped inline).
LEVEL_COUNTS = ("misses", "writes", "write_failures", "backfills")
COUNTERS = (*(f"hits.{level}" for level in LEVELS), *(f"record_hits.{level}" for level in LEVELS),
            *(f"{what}.{level}" for what in LEVEL_COUNTS for level in LEVELS),
            "misses", "compiles", "errors", "rejected", "compile_us", "saved_us")


HIT, RECORD_HIT, MISS, COMPILE, REJECTED, ERROR = "hit", "record_hit", "miss", "compile", "rejected", "error"
KINDS = (HIT, RECORD_HIT, MISS, COMPILE, REJECTED, ERROR)


class Event(NamedTuple):
    kind: str  # HIT, MISS, COMPILE, REJECTED or ERROR
    level: str = ""  # HIT and REJECTED: the level ('memory', 'disk', 'job', 'shared', 'remote'); else ""
    seconds: float = 0.0  # HIT: compile seconds saved; COMPILE: seconds spent compiling; else 0


Listener = Callable[[Event], None]
_listeners: tuple[Listener, ...] = ()  # replaced whole (copy on write): emit reads it without a lock
_listeners_lock = threading.Lock()


def add_listener(listener: Listener) -> None:
    """Call `listener(event)` for every event from now on (once, however often it is added)."""
    global _listeners
    with _listeners_lock:
        if listener not in _listeners:
            _listeners = (*_listeners, listener)


def remove_listener(listener: Listener) -> None:
    global _listeners
    with _listeners_lock:
        _listeners = tuple(x for x in _listeners if x != listener)


# What a recorder (jax.monitoring's `record_event`, `record_event_duration_secs`) is called with.
PREFIX = "/kernel_cache/"
EVENT_NAMES = {HIT: f"{PREFIX}hits", RECORD_HIT: f"{PREFIX}record_hits", MISS: f"{PREFIX}misses",
               COMPILE: f"{PREFIX}compiles", REJECTED: f"{PREFIX}rejected", ERROR: f"{PREFIX}errors"}
DURATION_NAMES = {HIT: f"{PREFIX}compile_time_saved_sec", RECORD_HIT: f"{PREFIX}compile_time_saved_sec",
                  COMPILE: f"{PREFIX}compile_time_sec"}
Recorder = tuple[Callable[..., object], Callable[..., object]]  # (record_event, record_event_duration_secs)
_recorders: tuple[Recorder, ...] = ()


def add_recorder(record_event: Callable[..., object], record_duration: Callable[..., object]) -> None:
    """Call `record_event(name, **kw)` and `record_duration(name, seconds, **kw)` for every event from
    now on, with jax.monitoring's names, directly (no function of ours between)."""
    global _recorders
    with _listeners_lock:
        if (record_event, record_duration) not in _recorders:
            _recorders = (*_recorders, (record_event, record_duration))


def recorders() -> tuple[Recorder, ...]:
    return _recorders


def emit(kind: str, level: str = "", seconds: float = 0.0) -> None:
    """Hand one event to every listener and recorder; an exception one raises is warned about once
    and dropped (even with warnings turned into errors: it stays out of the lookup)."""
    if not (_listeners or _recorders):
        return
    event = Event(kind, level, seconds)
    for listener in _listeners:
        try:
            listener(event)
        except Exception as exc:
            _listener_failed(listener, exc)
    for record_event, record_duration in _recorders:
        try:
            keywords = {"level": level or "unknown"} if kind in (HIT, RECORD_HIT, REJECTED) else {}
            record_event(EVENT_NAMES[kind], **keywords)
            if kind in DURATION_NAMES:
                record_duration(DURATION_NAMES[kind], seconds, **keywords)
        except Exception as exc:
            _listener_failed(record_event, exc)


def _listener_failed(listener: object, exc: Exception) -> None:
    name = getattr(listener, "__qualname__", None) or type(listener).__qualname__
    with contextlib.suppress(Exception):
        warn_once(f"event-listener:{getattr(listener, '__module__', '')}.{name}",
                  f"a kernel-cache event listener ({name}) raised {type(exc).__name__}: {exc}; "
                  f"ignored (further failures of it are not reported)")


class Stats:
    def __init__(self, directory: Path | None = None, read_only: bool = False):
        """`read_only`: read persisted counters, flush nothing (an operator's look at a read-only cache)."""
        self._lock = threading.Lock()
        self._flushed: Counter[str] = Counter()  # what of `_session` is persisted (or given up on)
        self._entry_hits: Counter[str] = Counter()
        self._session: Counter[str] = Counter()
        # "<what>.<level>" (LEVEL_COUNTS): bumped by the store without a call or a lock; taken at each flush
        self.levels: Counter[str] = Counter()
        self._last_flush = time.monotonic()
        self._read_dir = None if directory is None else Path(directory) / STATS_DIR
        self._stats_dir = None if read_only else self._read_dir  # where counts are flushed
        self._skip_until = 0.0
        self._unavailable = ""  # why persistent counters cannot be read or written, if so

    @property
    def unavailable(self) -> str:
        if self._read_dir is not None and not self._unavailable:
            self._read(())
        return self._unavailable

    def _read(self, names: tuple[str, ...] | None) -> Counter[str]:
        """The persisted counters named (all for None); none where they cannot be read (said in `unavailable`)."""
        try:
            return Counter(counters.read(self._read_dir, STATS_TIMEOUT, names) if self._read_dir else {})
        except Exception as exc:
            self._unavailable = f"{type(exc).__name__}: {exc}"
            return Counter()

    def hit(self, level: str, key: str, compile_seconds: float) -> None:
        self._served(HIT, "hits", level, key, compile_seconds)

    def record_hit(self, level: str, key: str, compile_seconds: float) -> None:
        """A lowered-call record (`key`) served a whole call from `level` (its kernels, unread, are no hits)."""
        self._served(RECORD_HIT, "record_hits", level, key, compile_seconds)

    def _served(self, kind: str, counter: str, level: str, key: str, compile_seconds: float) -> None:
        with self._lock:
            self._session[f"{counter}.{level}"] += 1
            self._session["saved_us"] += int(compile_seconds * _MICRO)
            self._entry_hits[key] += 1
        emit(kind, level, compile_seconds)
        if time.monotonic() - self._last_flush > 1.0:
            self.flush()

    def compiled(self, seconds: float) -> None:
        with self._lock:
            self._session["compiles"] += 1
            self._session["compile_us"] += int(seconds * _MICRO)
        emit(COMPILE, seconds=seconds)
        self.flush(walked=False)  # a compile's counters persist at once; the levels' at the next flush

    def count(self, kind: str, level: str = "") -> None:
        """A MISS, an ERROR or a REJECTED entry (refused for who wrote it: one total, the level told
        to event listeners): counted under its event's name."""
        with self._lock:
            self._session[EVENT_NAMES[kind].removeprefix(PREFIX)] += 1
        emit(kind, level)

    def session(self) -> dict[str, Any]:
        """This process's counters (not yet or already flushed)."""
        with self._lock:
            return self._render(self._session + self.levels)

    def flush(self, walked: bool = True) -> None:
        """Add this process's new counts to the persisted ones; `walked`: the levels' counts too (not at
        a compile's flush, which keeps a cold lowering's writes few)."""
        with self._lock:
            if walked:
                counts, self.levels = self.levels, Counter()
                self._session.update(counts)
            pending, hits = self._session - self._flushed, self._entry_hits
            self._flushed, self._entry_hits = Counter(self._session), Counter()
            self._last_flush = time.monotonic()
        if time.monotonic() < self._skip_until:
            return
        amounts = {name: amount for name, amount in pending.items() if amount}
        amounts.update((f"entry_hits.{key}", amount) for key, amount in hits.items())
        if self._stats_dir is None or not amounts:
            return
        try:
            counters.add(self._stats_dir, amounts, STATS_TIMEOUT)  # one write transaction, not one per counter
        except Exception as exc:  # best effort: a full disk or a stuck neighbour must not slow every compile
            self._unavailable = f"{type(exc).__name__}: {exc}"
            self._skip_until = time.monotonic() + SKIP_AFTER_FAILURE

    def totals(self) -> dict[str, Any]:
        """Counters over all processes that used this directory (including unflushed ones here)."""
        self.flush()  # this process's counts are persisted ones now, unless nothing is written
        unflushed = Counter(self._session) if self._stats_dir is None else Counter()
        return self._render(self._read(COUNTERS) + unflushed)

    def entry_hits(self, key: str) -> int:
        name = f"entry_hits.{key}"
        with self._lock:
            unflushed = self._entry_hits.get(key, 0)
        return self._read((name,))[name] + unflushed

    def forget_entry(self, key: str) -> None:
        if self._stats_dir is not None:
            with contextlib.suppress(Exception):
                counters.delete(self._stats_dir, (f"entry_hits.{key}",), STATS_TIMEOUT)

    def zero(self) -> None:
        with self._lock:
            self._flushed.clear()
            self._entry_hits.clear()
            self._session.clear()
        if self._stats_dir is not None:
            counters.delete(self._stats_dir, COUNTERS, STATS_TIMEOUT)

    @staticmethod
    def _render(raw: Counter[str]) -> dict[str, Any]:
        return {
            "hits": {t: int(raw.get(f"hits.{t}", 0)) for t in LEVELS},
            "record_hits": {t: int(raw.get(f"record_hits.{t}", 0)) for t in LEVELS},
            "level_counts": {t: {what: int(raw.get(f"{what}.{t}", 0))
                                 for what in ("hits", "record_hits", *LEVEL_COUNTS)} for t in LEVELS},
            "misses": int(raw.get("misses", 0)),
            "compiles": int(raw.get("compiles", 0)),
            "errors": int(raw.get("errors", 0)),
            "rejected": int(raw.get("rejected", 0)),
            "compile_seconds": raw.get("compile_us", 0) / _MICRO,
            "compile_seconds_saved": raw.get("saved_us", 0) / _MICRO,
        }

    def close(self) -> None:
        self.flush()
