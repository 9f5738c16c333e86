"""The whole warm process, side by side: the example programs through kernel-cache
against the same computations in jax.numpy, each run in a fresh process, JAX's cache warm on both
sides.

  kernel-cache  the 9 programs of lowering/examples.py (14 Triton kernels) with a warm store and
                KERNEL_CACHE_XLA=1 (JAX's persistent cache in the store's xla/)
  jax.numpy     the same 9 computations in jax.numpy (lowering.examples.references(), restated
                here so that this side imports no kernel-cache), plus `import triton` (a program
                with Triton kernels imports Triton anyway), JAX's persistent cache in its own
                directory with the same thresholds

Per process: the imports (jax, jax.numpy, triton, and on the kernel-cache side the programs'
module, `lowering` with it), the lowering of the 9 programs (jit, trace, lower), and on a GPU
the XLA compile (from JAX's cache) and the first run; the process's wall time is timed from
outside (interpreter start and exit included). The first process of each side fills its caches
and is not counted; then the sides alternate, `--runs` each, and medians are printed with the
ratio kernel-cache : jax.numpy. Also listed: what the kernel-cache process has in sys.modules
beyond the jax.numpy process's (our modules counted, any other listed).

Without a GPU both sides cross-lower for cuda (KERNEL_CACHE_TARGET_ARCH, default sm_90; the jnp
side lowers for cuda too): XLA compile and the run are skipped and the table says so.

  python scripts/bench_process.py [--runs 7] [--arch sm_90] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as `python scripts/...`: the checkout's packages, `scripts` among them
    sys.path.insert(0, ROOT)

from scripts.bench_child import time_programs  # noqa: E402

SIDES = ("kernel-cache", "jax.numpy")
PHASES = ("imports", "lower", "xla_compile", "first_run", "wall")
EPS = 1e-5  # lowering.examples.EPS


def jnp_programs() -> list[tuple[str, Callable[..., Any], tuple[Any, ...]]]:
    """lowering.examples.programs()'s labels and shapes, each with its jnp reference."""
    import jax
    import jax.numpy as jnp

    def ln(x: Any, w: Any, b: Any) -> Any:
        mean = x.mean(-1, keepdims=True)
        return (x - mean) / jnp.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + EPS) * w + b

    def scaled(s: float) -> Callable[[Any, Any], Any]:
        return lambda x, y: x * s + y

    shape: Callable[..., Any] = jax.ShapeDtypeStruct  # its constructor is unannotated in jax
    vec = shape((1 << 20,), jnp.float32)
    rows = shape((4096, 1000), jnp.float32)
    lns = (shape((4096, 768), jnp.float32), shape((768,), jnp.float32), shape((768,), jnp.float32))
    mat = shape((1024, 1024), jnp.float16)
    out: list[tuple[str, Callable[..., Any], tuple[Any, ...]]] = [
        (f"add[BLOCK={b}]", lambda x, y: x + y, (vec, vec)) for b in (256, 512, 1024, 2048)]
    out += [(f"scaled_add[{s}]", scaled(s), (vec, vec)) for s in (0.5, 2.0)]
    out += [("softmax", lambda x: jax.nn.softmax(x, axis=-1), (rows,)), ("layernorm", ln, lns),
            ("matmul[autotuned x6]",
             lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype), (mat, mat))]
    return out


def child(side: str, gpu: bool) -> dict[str, Any]:
    """One fresh process of `side`: its phases in seconds and its sys.modules."""
    start = time.perf_counter()
    sys.path.insert(0, ROOT)
    import jax
    import jax.numpy as jnp  # noqa: F401  (the programs' own import, timed with the others)
    import numpy as np
    import triton  # noqa: F401  (the user's kernels import Triton anyway)

    if side == "kernel-cache":
        from lowering import examples

        progs = examples.programs()
    else:
        jax.config.update("jax_compilation_cache_dir", os.environ["BENCH_JAX_CACHE"])  # type: ignore[no-untyped-call]  # unannotated in jax
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # type: ignore[no-untyped-call]  # (as above)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)  # type: ignore[no-untyped-call]  # (as above)
        progs = jnp_programs()
    out: dict[str, Any] = dict.fromkeys(PHASES[:-1], 0.0)
    out["imports"] = time.perf_counter() - start
    lower_options: dict[str, Any] = {} if gpu else {"lowering_platforms": ("cuda",)}
    rng = np.random.default_rng(0)

    def inputs_of(shapes: Sequence[Any]) -> list[Any]:  # numpy's, not lowering's: this side imports none of ours
        return [jax.device_put(rng.standard_normal(s.shape).astype(s.dtype)) for s in shapes]

    for _, lower, xla_compile, first_run in time_programs(progs, inputs_of, run=gpu, **lower_options):
        out["lower"] += lower
        out["xla_compile"] += xla_compile
        out["first_run"] += first_run
    if side == "kernel-cache":
        from kernel_cache import default_store

        out["compiles"] = default_store().stats.session().get("compiles", 0)
    out["labels"] = [label for label, _, _ in progs]
    out["modules"] = sorted(sys.modules)
    return out


def run(side: str, env: dict[str, str]) -> dict[str, Any]:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", side], env=env,
                          capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child ({side}) failed:\n{proc.stdout}\n{proc.stderr}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["wall"] = wall
    return result


def _has_gpu() -> bool:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "GPU" in out


def environments(work: str, gpu: bool, arch: str) -> dict[str, dict[str, str]]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KERNEL_CACHE_", "JAX_COMPILATION_CACHE"))}
    base["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    if not gpu:
        base["JAX_PLATFORMS"] = "cpu"
    store = os.path.join(work, "store")
    os.makedirs(store, mode=0o700)
    jax_cache = os.path.join(work, "jnp-xla")
    os.makedirs(jax_cache, mode=0o700)
    ours = {**base, "KERNEL_CACHE_DIR": store, "KERNEL_CACHE_XLA": "1"}
    if not gpu:
        ours["KERNEL_CACHE_TARGET_ARCH"] = arch
    return {"kernel-cache": ours, "jax.numpy": {**base, "BENCH_JAX_CACHE": jax_cache}}


def _median(runs: list[dict[str, Any]], phase: str) -> float:
    return statistics.median(float(r[phase]) for r in runs)


def report(results: dict[str, list[dict[str, Any]]], gpu: bool) -> dict[str, Any]:
    ours, theirs = results["kernel-cache"], results["jax.numpy"]
    print(f"\nwhole warm process, fresh each, median of {len(ours)} (seconds)")
    print(f"{'phase':<14}{'kernel-cache':>14}{'jax.numpy':>14}{'ratio':>9}")
    summary: dict[str, Any] = {}
    for phase in PHASES:
        if phase in ("xla_compile", "first_run") and not gpu:
            print(f"{phase:<14}{'skipped: no GPU (cross-lowering only)':>37}")
            continue
        a, b = _median(ours, phase), _median(theirs, phase)
        summary[phase] = {"kernel-cache": a, "jax.numpy": b, "ratio": a / b if b else None}
        print(f"{phase:<14}{a:>14.3f}{b:>14.3f}{(a / b if b else float('nan')):>8.3f}x")
    walls = {side: " ".join(f"{r['wall']:.2f}" for r in runs) for side, runs in results.items()}
    print(f"  wall, every run: kernel-cache {walls['kernel-cache']}; jax.numpy {walls['jax.numpy']}")
    beyond = sorted(set(ours[-1]["modules"]) - set(theirs[-1]["modules"]))
    own = [m for m in beyond if m.split(".")[0] in ("kernel_cache", "compiler", "lowering")]
    other = [m for m in beyond if m not in own]
    print(f"modules beyond the jax.numpy process's: {len(own)} of ours, {len(other)} others: {', '.join(other) or '-'}")
    print(f"kernel-cache compiles in the measured runs: {sum(int(r.get('compiles', 0)) for r in ours)}")
    summary["modules_ours"] = own
    summary["modules_other"] = other
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    ap.add_argument("--runs", type=int, default=7, help="measured processes per side (default 7)")
    ap.add_argument("--arch", default="sm_90", help="cross-lowering target without a GPU (default sm_90)")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    gpu = _has_gpu() if args.child is None else os.environ.get("BENCH_GPU") == "1"
    if args.child:
        print(json.dumps(child(args.child, gpu)))
        return
    work = tempfile.mkdtemp(prefix="kc-bench-process-")
    try:
        envs = environments(work, gpu, args.arch)
        for env in envs.values():
            env["BENCH_GPU"] = "1" if gpu else "0"
        fill = {side: run(side, envs[side]) for side in SIDES}  # fills the store and both JAX caches
        if fill["kernel-cache"]["labels"] != fill["jax.numpy"]["labels"]:
            raise SystemExit(f"program sets differ: {fill['kernel-cache']['labels']} vs {fill['jax.numpy']['labels']}")
        results: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
        for _ in range(args.runs):  # alternating: a machine getting busier or quieter biases neither side
            for side in SIDES:
                results[side].append(run(side, envs[side]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"host: {os.cpu_count()} cores, {'GPU' if gpu else f'no GPU: both sides cross-lower for cuda ({args.arch})'}, "
          f"python {sys.version.split()[0]}")
    summary = report(results, gpu)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": gpu, "summary": summary,
                       "runs": {s: [{k: v for k, v in r.items() if k != "modules"} for r in rs]
                                for s, rs in results.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
