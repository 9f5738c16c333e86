"""The main job: a JAX program set calling Triton kernels through `lowering.triton_call`, run cold
(empty cache) and then warm, each in a fresh process, as consecutive training jobs would.

On a host without a GPU the programs are cross-lowered for CUDA (`--arch`, default sm_90): the
lowering is where jax-triton runs Triton and where kernel-cache serves kernels from its store.
With a GPU they are also compiled by XLA, run, and checked against jax.numpy references.
Usage: demo.py [--dir DIR] [--arch sm_90] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def phase() -> None:
    """In a child process: lower (and on a GPU, run) every program; print one JSON line."""
    t0 = time.perf_counter()
    sys.path.insert(0, str(ROOT))
    import jax
    import numpy as np

    import kernel_cache
    from scripts import example_programs as ep

    gpu = any(d.platform == "gpu" for d in jax.devices())
    store = kernel_cache.default_store()
    refs = ep.references() if gpu else {}
    rows = []
    for label, fn, shapes in ep.programs():
        before = store.stats.session()
        start = time.perf_counter()
        lowered = jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",))
        seconds = time.perf_counter() - start
        after = store.stats.session()
        row = {"program": label, "lower": seconds, "compiles": after["compiles"] - before["compiles"],
               "hits": {t: after["hits"][t] - before["hits"][t] for t in after["hits"]}}
        if gpu:
            inputs = ep.random_inputs(shapes)
            out = lowered.compile()(*inputs)
            want = refs[label](*inputs)
            row["max_err"] = float(np.max(np.abs(np.asarray(out, np.float32) - np.asarray(want, np.float32))))
        rows.append(row)
    print(json.dumps({"rows": rows, "wall": time.perf_counter() - t0, "gpu": gpu}))


def run_phase(env: dict) -> dict:
    out = subprocess.run([sys.executable, __file__, "--phase"], env=env, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"demo phase failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _served_by(row: dict) -> str:
    if row["compiles"]:
        return f"compiled {row['compiles']}"
    tiers = [f"{t} {n}" for t, n in row["hits"].items() if n]
    return ", ".join(tiers) or "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=os.environ.get("KERNEL_CACHE_DIR") or str(ROOT / ".kernel-cache" / "demo"))
    ap.add_argument("--arch", default=os.environ.get("KERNEL_CACHE_TARGET_ARCH", "sm_90"),
                    help="GPU target when no GPU is visible (default sm_90)")
    ap.add_argument("--keep", action="store_true", help="do not empty the cache dir first")
    ap.add_argument("--phase", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phase:
        return phase()
    cache = Path(args.dir)
    if not args.keep and cache.exists():
        shutil.rmtree(cache)
    env = {**os.environ, "KERNEL_CACHE_DIR": str(cache), "KERNEL_CACHE_TARGET_ARCH": args.arch,
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    print(f"kernel-cache demo: 9 JAX programs / 14 Triton kernels, cache dir {cache}")
    cold = run_phase(env)
    warm = run_phase(env)
    where = "on the GPU" if cold["gpu"] else f"cross-lowered for {args.arch} (no GPU here)"
    print(f"lowering {where}; each phase is a fresh process\n")
    print(f"{'program':<22}{'cold lower s':>13}{'warm lower s':>13}{'speed-up':>10}  {'cold':<13}{'warm':<14}"
          + ("max |err|" if cold["gpu"] else ""))
    for c, w in zip(cold["rows"], warm["rows"]):
        ratio = c["lower"] / w["lower"] if w["lower"] else float("inf")
        err = f"{w['max_err']:.2e}" if "max_err" in w else ""
        print(f"{c['program']:<22}{c['lower']:>13.4f}{w['lower']:>13.4f}{ratio:>9.1f}x  {_served_by(c):<13}"
              f"{_served_by(w):<14}{err}")
    cold_sum = sum(r["lower"] for r in cold["rows"])
    warm_sum = sum(r["lower"] for r in warm["rows"])
    print(f"{'total':<22}{cold_sum:>13.4f}{warm_sum:>13.4f}{cold_sum / warm_sum:>9.1f}x  "
          f"{'compiled ' + str(sum(r['compiles'] for r in cold['rows'])):<13}"
          f"{'compiled ' + str(sum(r['compiles'] for r in warm['rows'])):<14}")
    print(f"\nprocess wall (imports included): cold {cold['wall']:.2f} s, warm {warm['wall']:.2f} s")
    print(f"inspect the cache: cachectl --dir {cache} list")


if __name__ == "__main__":
    main()
