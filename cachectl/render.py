"""How cachectl shows things: sizes, times, tables, cache content fit to print."""

from __future__ import annotations

import time

from cachectl.context import BOUND_ENVIRONMENT, BOUND_STORED, Context
from kernel_cache.sanitize import escaped


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_time(t: float | None, seconds: bool = False) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M", time.localtime(t)) if t else "-"


def bound_source(ctx: Context) -> str:
    """Where the local level's bound comes from, as stats and prune say it."""
    if ctx.bound_source == BOUND_STORED:
        return "stored in the cache directory by 'cachectl config max-size'"
    if ctx.bound_source == BOUND_ENVIRONMENT:
        stored = ctx.stored.max_bytes
        return "KERNEL_CACHE_MAX_BYTES" + (f", overriding the {human_size(stored)} stored in the cache directory"
                                           if stored is not None else "")
    return "the default; 'cachectl config max-size SIZE' stores another"


def table(rows: list[list[str]], right: set[int]) -> list[str]:
    rows = [[escaped(c) for c in r] for r in rows]  # a cell may hold a name found on disk
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


def shown(text: str, limit: int = 120) -> str:
    """Cache content fit to print: control characters escaped, long text cut."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return out + ("…" if len(text) > limit else "")


def milliseconds(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms"
