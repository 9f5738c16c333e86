"""kernel-cache's store: bytes + metadata by content key, in memory, on local disk, and shared.

Knows nothing of Triton or JAX. Configured from KERNEL_CACHE_* environment variables, or from
code with `configure(Config(...))`.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading

from .config import Config, ConfigError, parse_duration, parse_size
from .entry import CorruptEntry, Entry
from .store import Store
from .warnings_once import KernelCacheWarning

__all__ = ["Config", "ConfigError", "CorruptEntry", "Entry", "KernelCacheWarning", "Store", "configure",
           "current_config", "default_store", "parse_duration", "parse_size"]

_default: Store | None = None
_guard = threading.Lock()
_creating = threading.Lock()


def _setup_logging(config: Config) -> None:
    if not config.log or config.log == "off":
        return
    logger = logging.getLogger("kernel_cache")
    logger.setLevel(logging.DEBUG if config.log == "debug" else logging.INFO)
    if not any(getattr(h, "_kernel_cache", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._kernel_cache = True  # type: ignore[attr-defined]
        logger.addHandler(handler)


def configure(config: Config | None = None) -> Store:
    """Replace the process-wide store (default: from the environment) and return it."""
    global _default
    config = config if config is not None else Config.from_env()
    with _guard:
        old, _default = _default, Store(config)
    if old is not None:
        old.close()
    _setup_logging(config)
    return _default


def current_config() -> Config:
    """The process-wide configuration (the default store's): what every floor above reads instead
    of the environment, so `configure()` reaches all of them."""
    return default_store().config


def default_store() -> Store:
    """The process-wide store, created from the environment on first use."""
    store = _default
    if store is None:
        with _creating:
            store = _default if _default is not None else configure()
    return store


@atexit.register
def _flush_at_exit() -> None:
    if _default is not None:
        try:
            _default.stats.flush()
        except Exception:
            pass
