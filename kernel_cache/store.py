"""The store: a chain of levels (memory, local disk, shared directory, remote), read in order, behind
one get-or-create, single-flight per key across threads, processes and nodes.

A cache failure never fails the caller: an unusable level is dropped with one warning; a corrupt
entry is a miss, removed, and rebuilt; an entry rejected for who wrote it is a miss, counted, and
never copied into a faster level. It is long because the chain, its counters and the single-flight
lock are one place: what a lookup costs and what a compile waits for read together here.
"""

from __future__ import annotations

import contextlib
import errno
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from logging import DEBUG
from typing import Any

from kernel_cache import levels as backends
from kernel_cache.entries import entry as entry_format
from kernel_cache.entries.entry import CorruptEntry, Entry, InvalidKey, check_key, key_ok
from kernel_cache.entries.summary import compile_seconds
from kernel_cache.errors import ReentrantBuild, RejectedEntry
from kernel_cache.levels.memory import MemoryLevel
from kernel_cache.levels.protocols import FrontLevel, KeptLevel, Level, holds
from kernel_cache.settings import cache_settings
from kernel_cache.settings.config import Config
from kernel_cache.telemetry import lookup_log
from kernel_cache.telemetry.stats import ERROR, MISS, REJECTED, Stats
from kernel_cache.telemetry.warnings_once import warn_once
from kernel_cache.trust.safefs import Owners

# build() -> (metadata, blobs, compile_seconds)
Builder = Callable[[], "tuple[dict[str, Any], dict[str, bytes], float]"]


class Store:
    def __init__(self, config: Config | None = None, *, read_only: bool = False):
        """`read_only`: open the local level without writing (an operator's look at a full, damaged or
        read-only cache). A default bound gives way to the one stored in the cache directory."""
        config = config or Config()
        self.owners = Owners.current(config.trusted_gid)
        self.config = cache_settings.with_stored_bound(config, self.owners)  # read once, here
        self.memory = MemoryLevel(self.config.memory_bytes, self.config.memory_items)
        self.signer = self.config.signer()
        self.unavailable: dict[str, Exception] = {}  # level name -> why it is not used
        self.kept_levels: list[KeptLevel] = []  # the configured ones: all but the transient
        if not self.config.disabled:
            for backend in backends.BACKENDS:
                where = getattr(self.config, backend.field)
                if where is None:
                    continue
                try:
                    self.kept_levels.append(backend.module.open_from_config(self.config, self.owners, self.signer,
                                                                            read_only))
                except Exception as exc:
                    self.unavailable[backend.name] = exc
                    tail = "caching in memory only" if backend.name == "disk" else "skipping it"
                    warn_once(f"{backend.name}-unavailable:{where}", f"{exc}; {tail}")  # (a key, never shown)
        self.levels: list[Level] = [self.memory, *self.kept_levels]  # fastest first: read in order, hits backfilled upwards
        self.cluster_levels: list[Level] = [t for t in self.kept_levels if t.name != "disk"]  # kept, not asked per use
        self.stats = Stats(self.config.dir if self.disk is not None else None, read_only=read_only)
        self._key_locks = KeyLocks()
        self.wait_budget = WaitBudget(self.config.lock_timeout)  # for other processes' compiles, all keys
        self.front: FrontLevel | None = None  # the program's warm set, read before every level (`front_level`)

    # Public API ---------------------------------------------------------------------------
    @property
    def persistent_levels(self) -> list[Level]:
        return self.levels[1:]

    def level(self, name: str) -> Level | None:
        return next((t for t in self.levels if t.name == name), None)

    def add_transient(self, level: Level) -> None:
        """Add `level`, which no configuration names (a job's key-value store), right after the local
        level: read after this node's own levels and before the cluster's, locked between them."""
        if self.config.disabled:
            return
        at = self.levels.index(self.disk) + 1 if self.disk is not None else 1
        self.levels = [*self.levels[:at], level, *self.levels[at:]]
        self.cluster_levels = [level, *self.cluster_levels]

    @property
    def disk(self) -> Level | None:
        return self.level("disk")

    @property
    def shared(self) -> Level | None:
        return self.level("shared")

    def get(self, key: str) -> tuple[Entry, str] | None:
        """(entry, level name) or None. A hit is copied into every faster level as the bytes it was
        stored as (never encoded or signed again)."""
        if self.config.disabled:
            return None
        front = self.front
        if front is not None:  # the program's warm set: members of its local level, held in memory
            entry = front.front_get(key)
            if entry is not None:
                return entry, front.level
        counts = self.stats.levels
        for depth, level in enumerate(self.levels):
            entry = self._level_get(level, key)
            if entry is not None:
                if depth:
                    data = entry.stored if entry.stored is not None else self.encode(entry)
                    for upper in self.levels[:depth]:
                        counts[f"backfills.{upper.name}"] += 1
                        self._level_put(upper, entry, data)
                return entry, level.name
            counts[f"misses.{level.name}"] += 1
        return None

    def front_level(self, warm: FrontLevel) -> None:
        """Put `warm` (a session's warm set) in front of the levels, before memory; a later session's
        set takes its place."""
        self.front = warm

    def put(self, entry: Entry) -> None:
        """Keep `entry` in every level, encoded (and signed) once for all of them."""
        self._put_in(self.levels, entry)

    def get_shared(self, key: str) -> Entry | None:
        """The entry from the levels shared across nodes alone, copied nowhere: for what a node keeps
        in a memo of its own (the toolchain fingerprint) and asks the cluster for only on a miss."""
        return next((e for level in self.cluster_levels if (e := self._level_get(level, key)) is not None), None)

    def put_shared(self, entry: Entry) -> None:
        """Keep `entry` (signed) in the levels shared across nodes alone (see `get_shared`)."""
        self._put_in(self.cluster_levels, entry)

    def get_local(self, key: str) -> Entry | None:
        """The entry from the local level alone, copied nowhere (a warm set)."""
        disk = self.disk  # (none where caching is disabled)
        return None if disk is None else self._level_get(disk, key)

    def put_local(self, entry: Entry) -> None:
        """Keep `entry` in the local level alone (see `get_local`)."""
        disk = self.disk
        self._put_in([disk] if disk is not None else [], entry)

    def held_locally(self, keys: Sequence[str]) -> set[str]:
        """Which of `keys` the local level holds; an empty set where it cannot tell."""
        disk = self.disk
        if disk is None:
            return set()
        try:
            return {k for k in keys if k in disk}
        except Exception as exc:
            _read_failed(disk, exc)
            return set()

    def _put_in(self, levels: list[Level], entry: Entry) -> None:
        if self.config.disabled or not levels:
            return
        key_ok(entry.key) or check_key(entry.key)
        data = self.encode(entry) if levels != [self.memory] else b""
        for level in levels:
            self._level_put(level, entry, data)

    def encode(self, entry: Entry) -> bytes:
        """The entry's bytes as this store writes them: signed when a signing key is configured."""
        data = entry_format.encode(entry)
        return self.signer.sign(data) if self.signer is not None else data

    def lookup(self, key: str, label: lookup_log.Label = "") -> tuple[dict[str, Any], dict[str, bytes]] | None:
        """(metadata, blobs) when some level holds `key`, counted as a hit; else None. Never builds:
        for callers that batch their misses."""
        start = time.perf_counter()
        found = self.get(key)
        if found is None:
            if lookup_log.log.isEnabledFor(DEBUG):  # asked here: a miss nobody logs costs no call
                lookup_log.lookup(key, label, "miss", start, DEBUG)
            return None
        return self._hit(found, key, label, start)

    def get_or_create(self, key: str, build: Builder, label: lookup_log.Label = "", *,
                      known_missing: bool = False) -> tuple[dict[str, Any], dict[str, bytes]]:
        """The entry for `key`, built at most once across threads and processes on a miss.
        `known_missing`: the caller has just missed it. Under the lock a presence probe (a stat,
        EXISTS) tells whether a neighbour built it meanwhile; only then is it read."""
        start = time.perf_counter()
        found = None if known_missing else self.get(key)
        if found is not None:
            return self._hit(found, key, label, start)
        key_ok(key) or check_key(key)
        with self._single_flight(key, label) as unserved:
            if key in self.memory or any(holds(level, key) for level in self.persistent_levels):
                found = self.get(key)  # built by another thread or process meanwhile
            if found is not None:
                return self._hit(found, key, label, start)
            self.wait_budget.spend(unserved)  # a wait for a publication that served nothing
            self.stats.count(MISS)
            meta, blobs, seconds = build()
            entry = Entry(key=key, meta={**meta, "created": time.time()}, blobs=dict(blobs))
            self.put(entry)
            self.stats.compiled(seconds)
        lookup_log.lookup(key, label, "compile", start)
        return entry.meta, entry.blobs

    def touch(self, keys: Iterable[str]) -> None:
        """A use of these entries, unread (a lowered-call record served them), for the levels' LRU order."""
        for level in self.kept_levels:
            with contextlib.suppress(Exception):  # best effort: recency never fails a lowering
                level.touch(keys)

    def delete(self, key: str) -> None:
        self.memory.delete(key)
        for level in self.kept_levels:
            with contextlib.suppress(Exception):
                level.delete(key)

    def close(self) -> None:
        self.stats.close()
        if self.disk is not None:
            self.disk.close()

    # Internals ----------------------------------------------------------------------------
    def _hit(self, found: tuple[Entry, str], key: str, label: lookup_log.Label,
             start: float) -> tuple[dict[str, Any], dict[str, bytes]]:
        entry, level = found
        self.stats.hit(level, key, compile_seconds(entry.meta))
        lookup_log.lookup(key, label, level, start)
        return entry.meta, entry.blobs

    def _level_get(self, level: Level, key: str) -> Entry | None:
        try:
            return level.get(key)
        except InvalidKey:
            raise  # the caller's mistake, not the level's: never swallowed as a cache failure
        except RejectedEntry as exc:
            self.stats.count(REJECTED, level.name)
            warn_once(f"rejected:{level.name}",
                      f"rejected {exc} (counted in 'cachectl stats'; rebuilt here, never copied to a "
                      f"faster level). Further rejections are counted, not printed")
        except CorruptEntry as exc:
            self.stats.count(ERROR)
            warn_once(f"corrupt:{level.name}:{key}",
                      f"dropped a corrupt {level.name} entry {key[:12]} ({exc}); it will be rebuilt")
        except Exception as exc:
            self.stats.count(ERROR)
            _read_failed(level, exc)
        return None

    def _level_put(self, level: Level, entry: Entry, data: bytes) -> None:
        try:
            if level.writable:
                level.keep(entry, data)
            else:
                return  # read-only or cooling down after a busy timeout: said once already
            self.stats.levels[f"writes.{level.name}"] += 1
        except Exception as exc:
            self.stats.levels[f"write_failures.{level.name}"] += 1
            self.stats.count(ERROR)
            warn_once(f"write:{level.name}:{_cause(exc)}",
                      f"writing to the {level.name} level failed ({exc}); the kernel stays in memory")

    @contextlib.contextmanager
    def _single_flight(self, key: str, label: lookup_log.Label = "") -> Iterator[float]:
        """Hold `key` across threads and processes. Every wait for another process is taken from the
        waiting budget unless it ends in an entry served: one ending in a publication is yielded, for
        the caller to charge if what was published cannot be served."""
        start = time.perf_counter()
        unserved = 0.0
        with self._key_locks.hold(key, label):
            levels = self._lock_levels()
            threads_done = time.perf_counter()
            deadline = threads_done + self.wait_budget.left()  # one wait for this key, whatever the levels
            with contextlib.ExitStack() as held:
                outcome = "acquired"
                for level in levels:  # this node's first: a cluster level then sees one contender per node
                    began = time.perf_counter()
                    try:
                        acquired = held.enter_context(level.lock(key, max(0.0, deadline - began)))
                    except Exception as exc:
                        warn_once(f"lock:{level.name}:{_cause(exc)}",
                                  f"cannot lock in the {level.name} level ({exc}); compiling without its lock")
                        continue
                    waited = time.perf_counter() - began
                    if acquired is None or acquired:  # None: it could not be taken and nobody holds it
                        if waited > UNCONTENDED:  # a takeover, a holder gone without publishing, or a fault
                            self.wait_budget.spend(waited)
                        continue
                    outcome = self._lock_lost(level, key, label, waited)
                    if outcome == PUBLISHED:
                        unserved = waited
                    break
                if lookup_log.log.isEnabledFor(DEBUG):
                    lookup_log.wait(key, label, start, threads_done, f"{levels[-1].name} lock ({outcome})" if levels else "")
                yield unserved

    def _lock_lost(self, level: Level, key: str, label: lookup_log.Label, waited: float) -> str:
        """Why a wait for `level`'s lock ended without it; a wait not ended by a publication is
        taken from the waiting budget."""
        if holds(level, key):
            return PUBLISHED
        self.wait_budget.spend(waited)
        if not level.writable:
            return "the level is being skipped"  # its own warning said why
        spent = self.wait_budget.left() <= 0.0
        warn_once(f"lock-timeout:{level.name}:{spent}",
                  f"waited {waited:.1f} s for another process to compile "
                  f"{lookup_log.label_text(label, 'a kernel')} ({key[:12]}); compiling here instead"
                  + (f". This process's budget for such waits (KERNEL_CACHE_LOCK_TIMEOUT="
                     f"{self.wait_budget.total:.0f}s, {self.wait_budget.spent:.1f} s spent) is used up: it "
                     f"compiles without waiting for the rest of its run" if spent else ""))
        return "timed out"

    def _lock_levels(self) -> list[Level]:
        """Who serializes a compile: this node's local level, a job's key-value store (one contender
        per job for the next), then the slowest writable level shared across nodes (the remote, else
        the shared directory). A read-only level holds no locks."""
        local = self.disk if self.disk is not None and self.disk.writable else None
        shared = [t for t in self.persistent_levels if t is not self.disk and t.writable]
        job = [t for t in shared if t not in self.kept_levels]  # added by `add_transient`
        cluster = next((t for t in reversed(shared) if t not in job), None)
        return [t for t in (local, *job, cluster) if t is not None]


PUBLISHED = "the holder published it"
UNCONTENDED = 0.001  # a lock gained within this many seconds was free: no wait for another process


class KeyLocks:
    """Per-key thread locks: one build of a key at a time in this process. A key's lock lives while
    some thread holds or waits for it; a thread that asks for a key it is already building gets
    ReentrantBuild instead of waiting on itself forever."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, list[Any]] = {}  # key -> [lock, users, owning thread id]

    @contextlib.contextmanager
    def hold(self, key: str, label: lookup_log.Label = "") -> Iterator[None]:
        me = threading.get_ident()
        with self._guard:
            slot = self._locks.get(key)
            if slot is not None and slot[2] == me:
                raise ReentrantBuild(f"the builder of {lookup_log.label_text(label, 'kernel')} ({key[:12]}) asked "
                                     f"the store for the same key while building it; it would wait on itself "
                                     f"forever")
            if slot is None:
                slot = self._locks[key] = [threading.Lock(), 0, None]
            slot[1] += 1
        try:
            with slot[0]:
                slot[2] = me
                try:
                    yield
                finally:
                    slot[2] = None
        finally:
            with self._guard:
                slot[1] -= 1
                if slot[1] == 0:
                    del self._locks[key]


class WaitBudget:
    """One budget of waiting for other processes' compiles, per process, across every key: a lock
    timeout per key would let a model of 14 kernels whose holders are stuck wait 14 timeouts."""

    def __init__(self, seconds: float):
        self.total = seconds
        self.spent = 0.0
        self._lock = threading.Lock()

    def left(self) -> float:
        return max(0.0, self.total - self.spent)

    def spend(self, seconds: float) -> None:
        with self._lock:
            self.spent += max(0.0, seconds)


def _read_failed(level: Level, exc: Exception) -> None:
    warn_once(f"read:{level.name}:{_cause(exc)}", f"reading the {level.name} level failed ({exc}); continuing without it")


def _cause(exc: Exception) -> str:
    """One warning per cause: ENOSPC and EIO are both OSError but deserve a line each."""
    code = getattr(exc, "errno", None)
    name = errno.errorcode.get(code, "") if isinstance(code, int) else ""
    return f"{type(exc).__name__}:{name}" if name else type(exc).__name__
