"""The store: memory -> local disk (-> shared) tiers behind one get-or-create, single-flight per key.

A cache failure never fails the caller: an unusable tier is dropped with one warning and the
store keeps working from memory; a corrupt entry is a miss, removed, and rebuilt.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import threading
import time
from typing import Callable, Iterator

from .config import Config
from .disk import DiskTier, TierUnavailable
from .entry import CorruptEntry, Entry
from .memory import MemoryTier
from .stats import Stats
from .warnings_once import warn_once

log = logging.getLogger("kernel_cache")

# build() -> (metadata, blobs, compile_seconds)
Builder = Callable[[], "tuple[dict, dict[str, bytes], float]"]


class Store:
    def __init__(self, config: Config | None = None):
        self.config = config or Config()
        self.memory = MemoryTier(self.config.memory_bytes, self.config.memory_items)
        self.disk: DiskTier | None = None
        self.shared = None  # a SharedTier once configured (see kernel_cache.shared)
        if not self.config.disabled and self.config.dir is not None:
            try:
                self.disk = DiskTier(self.config.dir, self.config.max_bytes)
            except TierUnavailable as exc:
                warn_once(f"disk-unavailable:{self.config.dir}", f"{exc}; caching in memory only")
        if not self.config.disabled and self.config.shared_dir is not None:
            self.shared = _open_shared_tier(self.config)
        self.stats = Stats(self.config.dir if self.disk is not None else None)
        self._key_locks: dict[str, threading.Lock] = {}
        self._key_locks_guard = threading.Lock()

    # Public API ---------------------------------------------------------------------------
    @property
    def persistent_tiers(self) -> list:
        return [t for t in (self.disk, self.shared) if t is not None]

    def get(self, key: str) -> tuple[Entry, str] | None:
        """(entry, tier name) or None. Promotes hits into the faster tiers."""
        if self.config.disabled:
            return None
        entry = self.memory.get(key)
        if entry is not None:
            return entry, "memory"
        faster = []
        for tier in self.persistent_tiers:
            entry = self._tier_get(tier, key)
            if entry is not None:
                for upper in faster:
                    self._tier_put(upper, entry)
                self.memory.put(entry)
                return entry, tier.name
            faster.append(tier)
        return None

    def put(self, entry: Entry) -> None:
        if self.config.disabled:
            return
        self.memory.put(entry)
        for tier in self.persistent_tiers:
            self._tier_put(tier, entry)

    def lookup(self, key: str, label: str = "") -> tuple[dict, dict[str, bytes]] | None:
        """(metadata, blobs) when some tier holds `key`, counted and logged as a hit; else None.
        Never builds: callers that can batch their misses use this first."""
        start = time.perf_counter()
        found = self.get(key)
        return None if found is None else self._hit(found, key, label, start)

    def get_or_create(self, key: str, build: Builder, label: str = "") -> tuple[dict, dict[str, bytes]]:
        """The entry for `key`, built at most once across threads and processes on a miss."""
        start = time.perf_counter()
        found = self.get(key)
        if found is not None:
            return self._hit(found, key, label, start)
        with self._single_flight(key):
            found = self.get(key)  # another thread or process may have built it meanwhile
            if found is not None:
                return self._hit(found, key, label, start)
            self.stats.miss()
            meta, blobs, seconds = build()
            entry = Entry(key=key, meta={**meta, "created": time.time()}, blobs=dict(blobs))
            self.put(entry)
            self.stats.compiled(seconds)
        self._log(key, label, "compile", start)
        return entry.meta, entry.blobs

    def delete(self, key: str) -> None:
        self.memory.delete(key)
        for tier in self.persistent_tiers:
            with contextlib.suppress(Exception):
                tier.delete(key)

    def close(self) -> None:
        self.stats.close()
        if self.disk is not None:
            self.disk.close()

    # Internals ----------------------------------------------------------------------------
    def _hit(self, found, key, label, start):
        entry, tier = found
        self.stats.hit(tier, key, float(entry.meta.get("compile_seconds", 0.0)))
        self._log(key, label, tier, start)
        return entry.meta, entry.blobs

    def _log(self, key: str, label: str, tier: str, start: float) -> None:
        if self.config.log in ("info", "debug"):
            ms = (time.perf_counter() - start) * 1000
            log.info("kernel-cache %s %-24s %-8s %.2f ms", key[:12], label or "-", tier, ms)

    def _tier_get(self, tier, key: str) -> Entry | None:
        try:
            return tier.get(key)
        except CorruptEntry as exc:
            self.stats.error()
            warn_once(f"corrupt:{tier.name}:{key}",
                      f"dropped a corrupt {tier.name} entry {key[:12]} ({exc}); it will be rebuilt")
        except Exception as exc:
            self.stats.error()
            warn_once(f"read:{tier.name}:{_cause(exc)}",
                      f"reading the {tier.name} tier failed ({exc}); continuing without it")
        return None

    def _tier_put(self, tier, entry: Entry) -> None:
        try:
            tier.put(entry)
        except Exception as exc:
            self.stats.error()
            warn_once(f"write:{tier.name}:{_cause(exc)}",
                      f"writing to the {tier.name} tier failed ({exc}); the kernel stays in memory")

    @contextlib.contextmanager
    def _single_flight(self, key: str) -> Iterator[None]:
        with self._key_locks_guard:
            thread_lock = self._key_locks.setdefault(key, threading.Lock())
        with thread_lock:
            # a read-only shared dir cannot hold locks: single-flight falls back to this node
            shared_locks = self.shared is not None and getattr(self.shared, "writable", True)
            lock_tier = self.shared if shared_locks else self.disk
            if lock_tier is None:
                yield
                return
            try:
                cm = lock_tier.lock(key, self.config.lock_timeout)
                acquired = cm.__enter__()
            except Exception as exc:
                warn_once(f"lock:{lock_tier.name}:{_cause(exc)}",
                          f"cannot lock in the {lock_tier.name} tier ({exc}); compiling without a lock")
                yield
                return
            if not acquired and not _published(lock_tier, key):
                warn_once(f"lock-timeout:{lock_tier.name}",
                          f"waited {self.config.lock_timeout:.0f}s for another process to compile; "
                          f"compiling here instead")
            try:
                yield
            finally:
                cm.__exit__(None, None, None)


def _published(tier, key: str) -> bool:
    """Whether a lock wait ended because the holder published `key` (not a timeout)."""
    try:
        return key in tier
    except Exception:
        return False


def _cause(exc: Exception) -> str:
    """One warning per cause: ENOSPC and EIO are both OSError but deserve a line each."""
    code = getattr(exc, "errno", None)
    name = errno.errorcode.get(code, "") if isinstance(code, int) else ""
    return f"{type(exc).__name__}:{name}" if name else type(exc).__name__


def _open_shared_tier(config: Config):
    try:
        from .shared import SharedTier
    except ImportError:
        warn_once("shared-missing", "KERNEL_CACHE_SHARED_DIR is set but this build has no shared tier")
        return None
    try:
        return SharedTier(config.shared_dir, lock_mode=config.lock, stale_after=config.soft_lock_stale)
    except Exception as exc:
        warn_once(f"shared-unavailable:{config.shared_dir}", f"shared cache unusable ({exc}); skipping it")
        return None
