"""One budget of waiting for other processes' compiles, per process, across every key.

A lock timeout per key lets a model of 14 kernels whose holders are stuck wait 14 timeouts; one
budget (KERNEL_CACHE_LOCK_TIMEOUT) for all waits is spent once, then the process compiles without
waiting.
"""

from __future__ import annotations

import threading


class WaitBudget:
    def __init__(self, seconds: float):
        self.total = seconds
        self._spent = 0.0
        self._lock = threading.Lock()

    def left(self) -> float:
        with self._lock:
            return max(0.0, self.total - self._spent)

    @property
    def spent(self) -> float:
        with self._lock:
            return self._spent

    def spend(self, seconds: float) -> None:
        with self._lock:
            self._spent += max(0.0, seconds)

    @property
    def exhausted(self) -> bool:
        return self.left() <= 0.0
