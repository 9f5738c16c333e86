"""What the fresh-process benchmarks share: running one child that prints a JSON report as its last
line, asking (in a child, so the parent holds no GPU memory) whether JAX sees a CUDA GPU, and timing
a child's programs phase by phase. Imports nothing of ours: a jax.numpy side uses it too."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

Program = tuple[str, Callable[..., Any], Sequence[Any]]  # (label, function, its arguments' shapes or values)


def run_json_child(argv: list[str], env: dict[str, str], cwd: str) -> tuple[dict[str, Any], float, str]:
    """(the report the child printed last, its wall seconds, its stderr); SystemExit with its output
    when it fails."""
    t = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-6000:]}")
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report, wall, proc.stderr


def has_gpu() -> bool:
    """Asked in a child, so this process holds no GPU memory while the children run."""
    code = "import jax\ntry: print(bool(jax.devices('cuda')))\nexcept Exception: print(False)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    return proc.stdout.strip().endswith("True")


def time_programs(programs: Sequence[Program], inputs_of: Callable[[Sequence[Any]], Sequence[Any]], *, run: bool,
                  **lower_options: Any) -> list[tuple[str, float, float, float]]:
    """Per program, (label, lower, xla_compile, first_run) seconds: jitted, traced and lowered with
    `lower_options`, and where `run`, compiled and called once on `inputs_of(its shapes)`, made
    ready before the clock starts (0.0 for what did not run)."""
    import jax

    times = []
    for label, fn, shapes in programs:
        t = time.perf_counter()
        lowered = jax.jit(fn).trace(*shapes).lower(**lower_options)
        lower = time.perf_counter() - t
        if not run:
            times.append((label, lower, 0.0, 0.0))
            continue
        t = time.perf_counter()
        compiled = lowered.compile()
        xla_compile = time.perf_counter() - t
        inputs = inputs_of(shapes)
        jax.block_until_ready(inputs)  # type: ignore[no-untyped-call]  # unannotated in jax
        t = time.perf_counter()
        jax.block_until_ready(compiled(*inputs))  # type: ignore[no-untyped-call]  # (as above)
        times.append((label, lower, xla_compile, time.perf_counter() - t))
    return times
