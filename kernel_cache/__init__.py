"""kernel-cache's store: bytes + metadata by content key, in memory, on local disk, and shared.

Knows nothing of Triton or JAX. Configured from KERNEL_CACHE_* environment variables, or from
code with `configure(Config(...))`.

Logging: to the `kernel_cache` logger, as any library: INFO is one line per lookup, DEBUG adds each
compile's content-key summary and single-flight waits. KERNEL_CACHE_LOG=info or debug is for
programs that configure no logging: kernel-cache then adds its own stderr handler and stops
propagation (so a root handler does not print each line twice); off or unset changes nothing.
Warnings (`KernelCacheWarning`) go through the `warnings` module.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading

from kernel_cache import at_exit, front_level
from kernel_cache.entries.entry import CorruptEntry, Entry
from kernel_cache.errors import KernelCacheError
from kernel_cache.interception import InterceptError, intercept
from kernel_cache.session import Session
from kernel_cache.settings.config import Config, ConfigError, parse_duration, parse_size
from kernel_cache.store import Store
from kernel_cache.telemetry.warnings_once import KernelCacheWarning, info_once

__all__ = ["Config", "ConfigError", "CorruptEntry", "Entry", "InterceptError", "KernelCacheError", "KernelCacheWarning",
           "Session", "Store",
           "configure", "current_config", "current_session", "default_store", "intercept", "parse_duration", "parse_size"]

_default: Session | None = None
_guard = threading.Lock()
_creating = threading.Lock()


MEMORY_ONLY = ("no KERNEL_CACHE_DIR: caching in memory only (kernels are compiled again in every new "
               "process)")


def _setup_logging(config: Config) -> None:
    """Our stderr handler only when KERNEL_CACHE_LOG asks for one; otherwise undo what an earlier
    configure() set, and leave the logger to the application."""
    logger = logging.getLogger("kernel_cache")
    ours = [h for h in logger.handlers if getattr(h, "_kernel_cache", False)]
    if config.log not in ("info", "debug"):
        if ours:
            for handler in ours:
                logger.removeHandler(handler)
            logger.setLevel(logging.NOTSET)
            logger.propagate = True
        return
    logger.setLevel(logging.DEBUG if config.log == "debug" else logging.INFO)
    logger.propagate = False  # a root handler (basicConfig) would print every line a second time
    if not ours:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("kernel-cache %(message)s"))  # the app's format names the logger
        handler._kernel_cache = True  # type: ignore[attr-defined]
        logger.addHandler(handler)


def configure(config: Config | None = None) -> Store:
    """Replace the process-wide session (default: from the environment) and return its store. Every
    per-process memo of the old session goes with it."""
    global _default
    config = config if config is not None else Config.from_env()
    _setup_logging(config)  # first: what opening the levels says goes where KERNEL_CACHE_LOG asked
    with _guard:
        session = Session(config)
        old, _default = _default, session
    if old is not None:
        old.close()
    at_exit.add("warm sets", front_level.save_all)  # here, before any is used; each also does on its own
    at_exit.add("counters", _flush_at_exit)
    store = session.store
    if config.dir is None and not config.disabled and not store.persistent_levels:
        info_once("memory-only", MEMORY_ONLY)
    return store


def current_session() -> Session:
    """The process-wide session, created from the environment on first use."""
    session = _default
    if session is None:
        with _creating:
            if _default is None:
                configure()
            assert _default is not None
            session = _default
    return session


def current_config() -> Config:
    """The session's configuration: what every floor reads instead of the environment."""
    return current_session().config


def default_store() -> Store:
    return current_session().store


def _flush_at_exit() -> None:
    """The counters and the uses kept for the levels' LRU order: the exit sequence's last step."""
    if _default is not None:  # (a failure here is the exit sequence's to swallow)
        _default.store.stats.flush()
        for level in _default.store.kept_levels:
            with contextlib.suppress(Exception):
                level.flush_touches()
