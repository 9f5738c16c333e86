"""What the fresh-process benchmarks share: running one child that prints a JSON report as its last
line, and asking (in a child, so the parent holds no GPU memory) whether JAX sees a CUDA GPU."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any


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
