"""The session at first use: importing `lowering` does nothing; the first Triton call bound or
lowered under a session opens its store and then, once per session, joins a multi-process job's
key-value store (`join_job`: docs/job.md), applies KERNEL_CACHE_XLA (`lowering.xla_cache`) and,
where compiles run at once, starts the toolchain fingerprint in the background and the compile
worker processes at a cold process's second distinct call (docs/design.md, "Threads first,
processes where they pay", says why the second).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import kernel_cache
from compiler.target import Target, parse_target
from compiler.toolchain import prime_in_background
from kernel_cache.lazy import later
from kernel_cache.session import SessionMemo
from kernel_cache.store import Store

from . import jax_compat, xla_cache
from .planning.plan import target_of

if TYPE_CHECKING:
    from compiler import compile_processes
    from kernel_cache.levels import job as job_level
else:
    compile_processes = later("compiler.compile_processes")  # imported only by a process about to compile
    job_level = later("kernel_cache.levels.job")  # only in a process of a multi-process job


class _Started:
    """The set-up importing leaves to the first call, done once per session as its memo is made."""

    def __init__(self, current: kernel_cache.Session) -> None:
        join_job(current.store)
        xla_cache.apply(current.store)
        self.cold_start: _ColdStart | None = None  # told of each binding while `waiting`
        if current.config.compile_threads > 1:  # compiles on threads, maybe on worker processes
            self.cold_start = _ColdStart(current.config)
            prime_in_background(on_cold=self.cold_start.cold)


STARTED = SessionMemo("lowering.first_use", _Started)  # present once what first use does has been done


def join_job(store: Store) -> None:
    """Add the job's key-value store to `store` where this process is one of a job's."""
    config = store.config
    found = None if config.disabled or not config.job else jax_compat.job_store()
    if found is None:
        return
    client, process, processes = found
    store.add_transient(job_level.JobLevel(
        client, process, processes, signer=store.signer, max_bytes=config.job_max_bytes,
        max_entry_bytes=config.max_entry_bytes, lease_max_seconds=config.lock_timeout))


class _ColdStart:
    """Starts the compile workers once the process is cold (`cold`, from the fingerprint's thread) and
    has bound two distinct calls (`bound`), in either order; bindings stop reporting after the second."""

    def __init__(self, config: kernel_cache.Config) -> None:
        self._config = config
        self.waiting = True  # for a second distinct call: bindings report here until one is seen
        self._lock = threading.Lock()
        self._is_cold = False
        self._started = False
        self._calls: set[object] = set()

    def cold(self) -> None:
        with self._lock:
            self._is_cold = True
        self._start_if_due()

    def bound(self, call: object) -> None:
        """A call bound (its identity; None where it has none: counted as distinct)."""
        with self._lock:
            self._calls.add(object() if call is None else call)
            self.waiting = len(self._calls) < 2
        self._start_if_due()

    def _start_if_due(self) -> None:
        with self._lock:
            due = self._is_cold and len(self._calls) >= 2 and not self._started
            self._started = self._started or due
        if due:
            compile_processes.start_cold(self._config, _likely_target(self._config))


def _likely_target(config: kernel_cache.Config) -> Target | None:
    """What this process will most likely compile for: the configured arch, else the CUDA device's,
    only where JAX has already started its backends (never started from this thread); None where
    neither says (workers then set Triton up at their first compile instead)."""
    try:
        if config.target_arch is not None:
            return parse_target(config.target_arch)
        return target_of("cuda", None, None) if jax_compat.backends_started() else None
    except Exception:  # a guess: any doubt means no warm-up
        return None
