"""What a prewarm reports per build or lowering, and how it is shown as it runs."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cachectl.context import Context
from kernel_cache.errors import KernelCacheError


class PrewarmError(KernelCacheError, RuntimeError):
    """The prewarm cannot start at all (program not importable, bad target name)."""


@dataclass
class Outcome:
    """What happened to one kernel (or one program lowering) during a prewarm."""

    label: str
    arch: str
    status: str  # "built", "present", "failed", "skipped" (module not allowed, malformed recipe)
    key: str = ""
    seconds: float = 0.0
    error: str = ""
    module: str = ""  # recipes: the module the kernel comes from (for a skip: the one not allowed)


@dataclass
class Planned:
    """Program mode: one lowering (one arch) has `count` programs to lower."""

    count: int


@dataclass
class Lowered:
    """Program mode: one program lowered, whatever it built (its outcomes came before)."""

    label: str
    arch: str


Report = Callable[[Any], None]  # takes an Outcome (or, in program mode, a Planned or Lowered)


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
        self.out = sys.stderr if ctx.json else sys.stdout  # this stdout: the compiles' own goes to stderr
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
        print(line.rstrip(), file=self.out, flush=True)

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
