"""TransformerEngine benchmark, on a GPU: TE's own Triton path vs KERNEL_CACHE_INTERCEPT=transformer_engine.

Why: TE's triton_call_lowering compiles every kernel with Triton in every process (its cache is a dict
in memory); served from the store, a warm process compiles none. This runs scripts/te_programs.py
(TE's real utils.py and permutation kernels: MoE dispatch and combine, forward and backward, padded
and not, 4096 tokens x 4096 hidden bf16, 64 experts, top-8) in fresh processes:
  own cold          TE's own path, every cache empty (TRITON_CACHE_DIR, CUDA_CACHE_PATH, XDG_CACHE_HOME)
  own warm          TE's own path again on the same directories (Triton's own disk cache now warm)
  intercepted cold  KERNEL_CACHE_INTERCEPT=transformer_engine, an empty KERNEL_CACHE_DIR and caches
  intercepted warm  the same directories again
and prints, per process, the sums over programs of: lower (jit(...).trace(...).lower(): where TE's
kernels compile or are read from the store), xla_compile, first_run (first call, jaxlib's autotuning
of TE's autotuned kernels included), then the process wall and kernel-cache's compiles. Every output
is compared bit for bit with own cold's (sha256 of its bytes); where one differs, small ones (below
4M elements, kept per process) show how much.

  python scripts/bench_te.py [--json out.json] [--programs dispatch,combine_grad]

Needs an NVIDIA GPU, TE's pure-Python wheel (scripts/te_programs.py says how) and kernel-cache
pip-installed (its .pth hook and entry points). Without a GPU, tests/clients/test_clients_te_real.py
cross-lowers the same programs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as `python scripts/...`: the checkout's packages, `scripts` among them
    sys.path.insert(0, ROOT)

from scripts.bench_child import has_gpu, run_json_child  # noqa: E402
from scripts.bench_clients import install_problem  # noqa: E402

PHASES = ("lower", "xla_compile", "first_run", "steady")
RUNS = (("own cold", "own", "own"), ("own warm", "own", "own"),
        ("intercepted cold", "intercepted", "icpt"), ("intercepted warm", "intercepted", "icpt"))
SMALL = 1 << 22  # outputs up to this many elements are kept for a closer look when their bits differ


def child(labels: set[str] | None, outputs: str, block_size: int | None = None) -> dict[str, Any]:
    """One fresh process: TE loaded, every program lowered, compiled, run; phases, output digests."""
    import jax
    import numpy as np

    from scripts import te_programs

    te = te_programs.load()
    if block_size is not None:
        te_programs.pin_block_size(block_size)
    report: dict[str, Any] = {"device": str(jax.devices()[0].device_kind), "te_version": te.version,
                              "versions": {"jax": jax.__version__, "triton": _version("triton"),
                                           "jaxlib": _version("jaxlib"), "python": sys.version.split()[0]},
                              "served_by": getattr(te.utils.triton_call_lowering, "__kernel_cache_client__", "te"),
                              "programs": {}, "digests": {}}
    kept: dict[str, Any] = {}
    for label, fn, args in te_programs.programs(concrete=True, labels=labels):
        jax.block_until_ready(args)  # type: ignore[no-untyped-call]  # unannotated in jax
        times: dict[str, float] = {}
        t = time.perf_counter()
        lowered = jax.jit(fn).trace(*args).lower()
        times["lower"] = time.perf_counter() - t
        t = time.perf_counter()
        compiled = lowered.compile()
        times["xla_compile"] = time.perf_counter() - t
        t = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))  # type: ignore[no-untyped-call]  # (as above)
        times["first_run"] = time.perf_counter() - t
        steady = []
        for _ in range(5):
            t = time.perf_counter()
            jax.block_until_ready(compiled(*args))  # type: ignore[no-untyped-call]  # (as above)
            steady.append(time.perf_counter() - t)
        times["steady"] = min(steady)
        report["programs"][label] = times
        for i, leaf in enumerate(jax.tree_util.tree_leaves(out)):
            value = np.asarray(leaf)
            name = f"{label}.{i}"
            report["digests"][name] = [hashlib.sha256(value.tobytes()).hexdigest(), str(value.dtype), list(value.shape)]
            if value.size <= SMALL:
                kept[name] = value.astype(np.float32) if value.dtype.kind == "V" or "bfloat16" in str(value.dtype) \
                    else value
        del out, compiled, lowered
    np.savez(outputs, **kept)
    if "kernel_cache" in sys.modules:  # the hook imported it: intercepted (own children never import it)
        import kernel_cache
        from lowering.clients import tally

        report["intercept"] = kernel_cache.interception.status()
        report["compiles"] = kernel_cache.default_store().stats.session().get("compiles", 0)
        report["tally"] = tally()
    report["te_modules"] = sorted(n for n in sys.modules if n.startswith("transformer_engine"))
    return report


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


def child_env(path: str, caches: str) -> dict[str, str]:
    """The environment of one child: `path` is own or intercepted; every cache lives under `caches`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNEL_CACHE_") and k != "JAX_COMPILATION_CACHE_DIR"}
    env.update(PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
               TRITON_CACHE_DIR=os.path.join(caches, "triton"), XDG_CACHE_HOME=os.path.join(caches, "xdg"),
               CUDA_CACHE_PATH=os.path.join(caches, "nv"), JAX_PLATFORMS="cuda,cpu",
               XLA_PYTHON_CLIENT_PREALLOCATE="false")
    if path == "intercepted":
        env.update(KERNEL_CACHE_INTERCEPT="transformer_engine", KERNEL_CACHE_DIR=os.path.join(caches, "kernel-cache"))
    return env


def run_child(env: dict[str, str], outputs: str, labels: str | None, block_size: int | None) -> dict[str, Any]:
    argv = [sys.executable, os.path.abspath(__file__), "--child", "--outputs", outputs]
    argv += (["--programs", labels] if labels else []) + (["--block-size", str(block_size)] if block_size else [])
    report, wall, stderr = run_json_child(argv, env, ROOT)
    if env.get("KERNEL_CACHE_INTERCEPT") and report.get("intercept") != {"transformer_engine": "installed"}:
        raise SystemExit(f"interception did not install in the child: {report.get('intercept')}\n{stderr[-3000:]}")
    report["wall"], report["stderr"] = wall, stderr
    return report


def compare(runs: dict[str, dict[str, Any]], outputs: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Per run, per output that differs from own cold's bits: elements differing and the largest
    difference (for the small outputs kept), else only that it differs."""
    import numpy as np

    base = runs["own cold"]["digests"]
    found: dict[str, dict[str, Any]] = {}
    with np.load(outputs["own cold"]) as want:
        for name, report in runs.items():
            differ = {k: v for k, v in report["digests"].items() if base.get(k) != v}
            if set(report["digests"]) != set(base):
                differ["(outputs)"] = sorted(set(report["digests"]) ^ set(base))
            details: dict[str, Any] = {}
            with np.load(outputs[name]) as got:
                for key in differ:
                    if key in got.files and key in want.files:
                        a, b = got[key].astype(np.float64), want[key].astype(np.float64)
                        details[key] = {"elements_differing": int(np.sum(a != b)), "of": int(a.size),
                                        "max_abs_diff": float(np.max(np.abs(a - b))),
                                        "max_abs": float(np.max(np.abs(b)))}
                    else:
                        details[key] = "differs (too large to keep)"
            found[name] = details
    return found


def _served(report: dict[str, Any]) -> str:
    counts = report.get("tally", {}).get("transformer_engine")
    return f"{counts['served']}/{counts['fallback']}" if counts else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--outputs", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None, help="also write every child's report and the comparison here")
    ap.add_argument("--programs", default=None, help="comma-separated labels of scripts/te_programs.py")
    ap.add_argument("--block-size", type=int, default=None,
                    help="leave TE's autotuned kernels the one config of this BLOCK_SIZE (64 ... 4096): tells "
                         "outputs that differ by jaxlib's pick of a config from ones that differ by code")
    args = ap.parse_args()
    if args.child:
        labels = set(args.programs.split(",")) if args.programs else None
        print(json.dumps(child(labels, args.outputs, args.block_size)))
        return
    from scripts import te_programs

    if te_programs.te_package_dir() is None:
        raise SystemExit(f"bench_te: {te_programs.MISSING}")
    problem = install_problem()
    if problem:
        raise SystemExit(f"bench_te: {problem}")
    if not has_gpu():
        raise SystemExit("bench_te: no CUDA GPU visible to JAX; tests/clients/test_clients_te_real.py cross-lowers the "
                         "same programs without one")
    work = tempfile.mkdtemp(prefix="kc-bench-te-")
    runs: dict[str, dict[str, Any]] = {}
    outputs: dict[str, str] = {}
    try:
        for name, path, caches in RUNS:
            outputs[name] = os.path.join(work, name.replace(" ", "-") + ".npz")
            runs[name] = run_child(child_env(path, os.path.join(work, caches)), outputs[name], args.programs,
                                   args.block_size)
        differences = compare(runs, outputs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    first = runs["intercepted cold"]
    v = first["versions"]
    print(f"device {first['device']}; python {v['python']}, jax {v['jax']}, jaxlib {v['jaxlib']}, triton {v['triton']}, "
          f"transformer-engine {first['te_version']} (its utils.py and Triton kernels; no C++ core)")
    print(f"programs: {', '.join(first['programs'])}"
          + (f"; TE's autotuned kernels pinned to BLOCK_SIZE={args.block_size}" if args.block_size else ""))
    print(f"\n{'phase (s)':<14}" + "".join(f"{name:>18}" for name in runs))
    for phase in PHASES:
        print(f"{phase:<14}" + "".join(f"{sum(p[phase] for p in r['programs'].values()):>18.3f}" for r in runs.values()))
    print(f"{'wall':<14}" + "".join(f"{r['wall']:>18.3f}" for r in runs.values()))
    print(f"{'kc compiles':<14}" + "".join(f"{r.get('compiles', '-'):>18}" for r in runs.values()))
    print(f"{'served/fallback':<14}" + "".join(f"{_served(r):>18}" for r in runs.values()))
    outputs_total = len(runs["own cold"]["digests"])
    for name, details in differences.items():
        same = outputs_total - len(details)
        print(f"\n{name}: {same}/{outputs_total} outputs bit-identical to own cold's"
              + "".join(f"\n  {k}: {d}" for k, d in details.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": {k: {kk: vv for kk, vv in r.items() if kk != "stderr"} for k, r in runs.items()},
                       "differences": differences}, f, indent=1)


if __name__ == "__main__":
    main()
