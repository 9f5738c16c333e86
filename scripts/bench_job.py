"""The job level, side by side in one run on this machine: N processes of one `jax.distributed` job on
loopback (CPU, cross-lowering lowering.examples' 9 programs / 14 kernels for sm_90), each with its own
new, empty local cache directory and no shared or remote level, with the job's key-value store as a
level (the default) and with KERNEL_CACHE_JOB=0, beside one process alone.

Prints per row: compiles between the processes, the slowest process's lowering seconds and whole
seconds (imports and `jax.distributed.initialize` included), and the slowest lowering's ratio to the
process alone. The processes are tests/support/job_child.py's.

With --gpu the processes run on this host's GPUs and also run the programs on seeded inputs; each
process's outputs are compared with the lone process's.

    python scripts/bench_job.py [--processes 4] [--rounds 1] [--gpu]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHILD = ROOT / "tests" / "support" / "job_child.py"


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("KERNEL_CACHE_")}
    out.update(PYTHONPATH=str(ROOT) + os.pathsep + out.get("PYTHONPATH", ""), JAX_PLATFORMS="cpu")
    out.update(extra)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def job(tmp: Path, tag: str, processes: int, gpus: int = 0, **extra: str) -> list[dict[str, Any]]:
    """One job of `processes` (1: a process alone) lowering the programs; each process's report.
    `gpus`: the processes run on this host's GPUs (spread over them) and run the programs too."""
    port = free_port()
    procs = []
    for i in range(processes):
        on_gpu = {"JAX_PLATFORMS": "", "CUDA_VISIBLE_DEVICES": str(i % gpus), "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                  "JOB_CHILD_OUTPUTS": str(tmp / f"{tag}{i}-outputs")} if gpus else {}
        procs.append(subprocess.Popen([sys.executable, str(CHILD), "lower", str(tmp / f"{tag}{i}.json"), str(port),
                                       str(i), str(processes)], cwd=ROOT, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True,
                                      env=env(KERNEL_CACHE_DIR=str(tmp / f"{tag}{i}-cache"),
                                              XDG_CACHE_HOME=str(tmp / "xdg"), **extra, **on_gpu)))
    errs = [p.communicate(timeout=900)[1] for p in procs]
    failed = [err[-3000:] for p, err in zip(procs, errs, strict=True) if p.returncode != 0]
    if failed:
        raise SystemExit("a process of the job failed:\n" + failed[0])
    return [json.loads((tmp / f"{tag}{i}.json").read_text()) for i in range(processes)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1, help="rounds of each row (the median is printed)")
    parser.add_argument("--gpu", action="store_true", help="on this host's GPUs (one process per GPU, round "
                        "robin): the programs also run, and each process's outputs are compared with the lone one's")
    args = parser.parse_args()
    gpus = _gpus() if args.gpu else 0
    tmp = Path(tempfile.mkdtemp(prefix="kc-bench-job-"))
    try:
        rows: dict[str, list[tuple[int, float, float]]] = {}
        for n in range(args.rounds):
            for label, processes, extra in (("one process alone", 1, {}),
                                            (f"{args.processes} processes, job level", args.processes, {}),
                                            (f"{args.processes} processes, KERNEL_CACHE_JOB=0", args.processes,
                                             {"KERNEL_CACHE_JOB": "0"})):
                tag = f"r{n}-{processes}-{bool(extra)}-"
                ran = job(tmp, tag, processes, gpus, **extra)
                if gpus:
                    _compare(tmp, tag, processes)
                rows.setdefault(label, []).append((sum(r["stats"]["compiles"] for r in ran),
                                                   max(r["lowering"] for r in ran), max(r["wall"] for r in ran)))
        alone = statistics.median(low for _, low, _ in rows["one process alone"])
        print(f"{'row':<36} {'compiles':>8} {'slowest lowering':>17} {'slowest process':>16} {'vs alone':>9}")
        for label, got in rows.items():
            compiles = statistics.median(c for c, _, _ in got)
            low, wall = statistics.median(x for _, x, _ in got), statistics.median(w for _, _, w in got)
            print(f"{label:<36} {compiles:>8.0f} {low:>16.2f}s {wall:>15.2f}s {low / alone:>8.2f}x")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _gpus() -> int:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return max(1, out.stdout.count("GPU "))


def _compare(tmp: Path, tag: str, processes: int) -> None:
    """Each process's outputs against the lone process's: bitwise equal, else the largest difference."""
    import numpy as np

    alone = sorted((tmp / "r0-1-False-0-outputs").glob("*.npy"))
    for i in range(processes):
        same, worst = 0, 0.0
        for path in alone:
            a, b = np.load(path), np.load(tmp / f"{tag}{i}-outputs" / path.name)
            same += int(np.array_equal(a, b))
            worst = max(worst, float(np.max(np.abs(a - b))))
        print(f"  {tag}{i}: {same} of {len(alone)} programs' outputs bitwise equal to the lone process's"
              + (f" (largest difference {worst:g})" if same < len(alone) else ""))


if __name__ == "__main__":
    main()
