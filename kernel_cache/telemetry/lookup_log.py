"""The lines kernel-cache logs per lookup, on the `kernel_cache` logger.

INFO: one line per lookup, `KEY LEVEL MS ms  LABEL` (the label: what the caller named the entry).
DEBUG adds misses of `Store.lookup` and how long single-flight waited. Each function first asks
`isEnabledFor`, so a hit nobody listens to pays one check and the label is built only for a line
that is written.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeAlias

log = logging.getLogger("kernel_cache")

# What a log line calls the entry: text, or a function giving it, called only when a line is written
# (a kernel's description is not free to build, and a memory hit must stay sub-microsecond).
Label: TypeAlias = str | Callable[[], str]


def label_text(label: Label, default: str = "-") -> str:
    return (label() if callable(label) else label) or default


def lookup(key: str, label: Label, level: str, start: float, severity: int = logging.INFO) -> None:
    """INFO: a hit or a compile (`level` says which); DEBUG: a miss of `Store.lookup` (level "miss")."""
    if log.isEnabledFor(severity):
        log.log(severity, "%s %-7s %9.2f ms  %s", key[:12], level, (time.perf_counter() - start) * 1000,
                label_text(label))


def wait(key: str, label: Label, start: float, threads_done: float, outcome: str = "") -> None:
    """DEBUG: how long single-flight waited, first behind this process's other threads building the
    same key, then (where it took one: `outcome`) for the lock shared with other processes."""
    if not log.isEnabledFor(logging.DEBUG):
        return
    now = time.perf_counter()
    what = f"{(threads_done - start) * 1000:.2f} ms behind other threads"
    if outcome:
        what += f", {(now - threads_done) * 1000:.2f} ms for the {outcome}"
    log.debug("%s %-7s %9.2f ms  %s (%s)", key[:12], "wait", (now - start) * 1000,
              label_text(label), what)
