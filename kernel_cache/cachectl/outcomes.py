"""What a prewarm reports per kernel, and the worker pool both prewarm sources share."""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass


class PrewarmError(RuntimeError):
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

    def to_json(self) -> dict:
        return dict(self.__dict__)


Report = Callable[[Outcome], None]


def shown(text: str, limit: int = 120) -> str:
    """Cache content fit to print: control characters escaped, long text cut."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return out + ("…" if len(text) > limit else "")


def pool_context():
    """fork is cheapest (Triton already imported), but not once JAX has started its threads."""
    if sys.platform.startswith("linux") and "jax" not in sys.modules:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def run_in_pool(fn, tasks: list[tuple], labels: list[str], jobs: int, report: Report, context,
                 initializer=None, initargs=()) -> None:
    """Run fn(*task) per task (task[1] is the arch); report each result as it completes."""
    with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=context,
                             initializer=initializer, initargs=initargs) as pool:
        futures = {pool.submit(fn, *task): (task[1], label) for task, label in zip(tasks, labels)}
        for future in as_completed(futures):
            arch, label = futures[future]
            try:
                outcome = future.result()
            except BrokenProcessPool:
                outcome = Outcome(label, arch, "failed", error="the worker process died (crash or out of memory)")
            except Exception as exc:
                outcome = Outcome(label, arch, "failed", error=f"{type(exc).__name__}: {exc}")
            if isinstance(outcome, list):
                for item in outcome:
                    report(item)
            else:
                report(outcome)

