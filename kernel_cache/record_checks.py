"""What is wrong with an entry that is not a kernel, beyond format and checksum.

Winners and lowered-call records carry a record of their own: a winner must give its own key, a
lowered-call record must be well-formed and its payload a complete zlib stream. `verify` and
bundle import both ask here, so an entry refused by one is refused by the other.
"""

from __future__ import annotations

from collections.abc import Callable

from . import call_records, winners
from .entry import Entry

_CHECKS: dict[str, Callable[[Entry], "str | None"]] = {
    winners.KIND: winners.problem, call_records.KIND: call_records.problem}


def problem(entry: Entry) -> str | None:
    """Why `entry`'s record is unusable, or None (kernels and unknown kinds: nothing to check here)."""
    check = _CHECKS.get(str(entry.meta.get("kind", "")))
    return check(entry) if check is not None else None
