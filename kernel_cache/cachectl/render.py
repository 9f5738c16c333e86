"""How cachectl shows things: sizes, times, tables, a progress display, one JSON emitter."""

from __future__ import annotations

import shutil
import sys
import time

from ..display import escaped
from .context import Context
from .outcomes import Outcome


# Formatting ------------------------------------------------------------------------------
def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_time(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "-"


def table(rows: list[list[str]], right: set[int]) -> list[str]:
    rows = [[escaped(c) for c in r] for r in rows]  # a cell may hold a name found on disk
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


class Progress:
    """A progress bar on a terminal; otherwise one line per kernel (to stderr under --json)."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.outcomes: list[Outcome] = []
        self.total: int | None = 0
        self.done = 0
        self.counting = False  # outcomes of planning (present, unimportable) come before and don't count
        self.bar = sys.stderr.isatty() and not ctx.json and not ctx.quiet

    def expect(self, total: int | None) -> None:
        """Start counting builds; `total` None when unknown (a program decides what it compiles)."""
        self.counting, self.total = True, total

    def __call__(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        if self.counting:
            self.done += 1
        if self.bar:
            if self.total:
                filled = int(30 * min(self.done / self.total, 1.0))
                head = f"[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total}"
            else:
                head = f"[{self.done} done]"
            width = max(20, shutil.get_terminal_size((100, 24)).columns - 1)  # the terminal's, not a fixed 100
            sys.stderr.write(f"\r{head} {outcome.status} {outcome.label} {outcome.arch}".ljust(width)[:width])
            sys.stderr.flush()
            return
        if self.ctx.quiet or (outcome.status in ("present", "skipped") and not self.ctx.verbose):
            return
        line = (f"{outcome.status:<8} {outcome.arch:<7} {outcome.label:<28} {outcome.key[:12]:<12} "
                f"{outcome.seconds:6.2f} s")  # errors are listed once, at the end
        print(line.rstrip(), file=sys.stderr if self.ctx.json else sys.stdout, flush=True)

    def finish(self) -> None:
        if self.bar:
            sys.stderr.write("\n")
            self.bar = False

