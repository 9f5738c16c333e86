"""How cachectl shows things: sizes, times, tables, a progress display, one JSON emitter."""

from __future__ import annotations

import shutil
import sys
import time

from cachectl.context import BOUND_ENVIRONMENT, BOUND_STORED, Context
from cachectl.outcomes import Lowered, Outcome, Planned
from kernel_cache.sanitize import escaped


# Formatting ------------------------------------------------------------------------------
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


class Progress:
    """A progress bar on a terminal; otherwise one line per kernel (to stderr under --json).

    It counts the units of work done against a total: recipe builds (each reported outcome is one,
    those of planning included),
    or in program mode the programs lowered (each lowering says how many it has, then each program
    it lowered), the total staying unknown (None) until every lowering has said."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.outcomes: list[Outcome] = []
        self.total: int | None = None
        self.done = 0
        self.unit = "builds"
        self.bar = sys.stderr.isatty() and not ctx.json and not ctx.quiet
        self._unplanned = 0  # program mode: lowerings that have not said how many programs they have
        self._planned = 0

    def expect(self, total: int) -> None:
        """`total` builds are still to do. What planning found (present, skipped, failing recipes) is
        done already: every count of the summary adds up to the total."""
        self.total = self.done + total

    def expect_programs(self, lowerings: int) -> None:
        """Program mode: count programs lowered; `lowerings` (one per arch) each say how many they have."""
        self.unit, self._unplanned = "programs", lowerings

    def __call__(self, event: Outcome | Planned | Lowered) -> None:
        if isinstance(event, Planned):
            self._planned += event.count
            self._unplanned -= 1
            self.total = self._planned if self._unplanned <= 0 else None
            return
        if isinstance(event, Lowered):
            self.done += 1
            self._show("lowered", event.label, event.arch)
            return
        outcome = event
        self.outcomes.append(outcome)
        if self.unit == "builds":
            self.done += 1
        if self.bar:
            self._show(outcome.status, outcome.label, outcome.arch)
            return
        if self.ctx.quiet or (outcome.status in ("present", "skipped") and not self.ctx.verbose):
            return
        line = (f"{outcome.status:<8} {outcome.arch:<7} {outcome.label:<28} {outcome.key[:12]:<12} "
                f"{outcome.seconds:6.2f} s")  # errors are listed once, at the end
        print(line.rstrip(), file=sys.stderr if self.ctx.json else sys.stdout, flush=True)

    def _show(self, status: str, label: str, arch: str) -> None:
        if not self.bar:
            return
        if self.total:
            filled = int(30 * min(self.done / self.total, 1.0))
            head = f"[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total}"
        else:
            head = f"[{self.done} done]"
        width = max(20, shutil.get_terminal_size((100, 24)).columns - 1)  # the terminal's, not a fixed 100
        sys.stderr.write(f"\r{head} {status} {label} {arch}".ljust(width)[:width])
        sys.stderr.flush()

    def so_far(self) -> str:
        """'12 of 96 builds' ('3 of ? programs' while a total is unknown)."""
        return f"{self.done} of {self.total if self.total is not None else '?'} {self.unit}"

    def finish(self) -> None:
        if self.bar:
            sys.stderr.write("\n")
            self.bar = False
