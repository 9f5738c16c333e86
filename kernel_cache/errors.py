"""The error family: KernelCacheError and the store's typed failures."""

from __future__ import annotations


class KernelCacheError(Exception):
    """The base of every exception kernel-cache raises on purpose; each keeps its builtin base too
    (OSError, ValueError, RuntimeError), so a handler written for that still matches."""


class LevelUnavailable(KernelCacheError, OSError):
    """The level cannot be used at all (directory missing and not creatable, not a cache directory)."""


class LevelUntrusted(LevelUnavailable):
    """The level's directory could have been written by users you did not agree to trust."""


class RejectedEntry(KernelCacheError):
    """An entry refused for who wrote it (unsigned, another key, bad signature), not for damage:
    it is a miss, counted, never copied into a faster level, and left in place."""


class ReentrantBuild(KernelCacheError, RuntimeError):
    """A builder asked the store for the very key it is building: it would wait on itself."""

