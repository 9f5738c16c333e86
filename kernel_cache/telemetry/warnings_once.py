"""Warn once per cause: a cache problem is worth one line, not one line per kernel.

Warnings say they come from "kernel-cache" (module `kernel_cache`, no source line), not from the
internal line that noticed: Python prints `kernel-cache:0: KernelCacheWarning: MESSAGE`, and a
filter on `module="kernel_cache"` or the category selects them.
"""

from __future__ import annotations

import logging
import threading
import warnings

log = logging.getLogger("kernel_cache")
WARNING_SOURCE = "kernel-cache"  # where warnings say they come from (there is no such file: no source shown)
_seen: set[str] = set()
_lock = threading.Lock()


class KernelCacheWarning(RuntimeWarning):
    """The cache degraded (unwritable dir, full disk, bad entry): the program keeps running."""


def _first(cause: str) -> bool:
    with _lock:
        first = cause not in _seen
        _seen.add(cause)
    return first


def warn_once(cause: str, message: str) -> bool:
    """Emit `message` the first time `cause` is seen in this process; returns whether it did."""
    if not _first(cause):
        return False
    warnings.warn_explicit(message, KernelCacheWarning, filename=WARNING_SOURCE, lineno=0, module="kernel_cache")
    return True


def info_once(cause: str, message: str) -> None:
    if _first(cause):
        log.info("%s", message)


def reset() -> None:
    """Forget what was warned (tests)."""
    with _lock:
        _seen.clear()
