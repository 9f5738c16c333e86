"""Typed failures of the store, each carrying what an operator needs to act on it."""

from __future__ import annotations


class TierUnavailable(OSError):
    """The tier cannot be used at all (directory missing and not creatable, damaged index)."""


class TierUntrusted(TierUnavailable):
    """The tier's directory could have been written by users you did not agree to trust."""


class TierReadOnly(OSError):
    """The tier serves hits but cannot take writes (read-only mount, full disk, busy index)."""


class RejectedEntry(Exception):
    """An entry refused for who wrote it (unsigned, another key, bad signature), not for damage:
    it is a miss, counted, never copied into a faster tier, and left in place."""


class ReentrantBuild(RuntimeError):
    """A builder asked the store for the very key it is building: it would wait on itself."""
