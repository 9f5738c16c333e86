"""Client benchmark: unmodified jax-triton / ejKernel programs on their own path vs intercepted.

Why: KERNEL_CACHE_INTERCEPT=jax_triton,ejkernel promises that an existing client program stops
recompiling its Triton kernels in a new process. This prints, side by side in one run, what each
fresh process spends running every program of scripts/client_programs.py:
  lower        jax.jit(fn).trace(*args).lower()  -- where the clients run Triton (or read the store)
  xla_compile  lowered.compile()                 -- GPU only
  first_run    first call + block_until_ready    -- GPU only (ejKernel's own path: ptxas at launch)
  wall         the whole child process, imports included
for two paths: `own` (the variable unset, no KERNEL_CACHE_DIR) and `intercepted`
(KERNEL_CACHE_INTERCEPT=jax_triton,ejkernel, KERNEL_CACHE_DIR), each `cold` (every cache empty:
KERNEL_CACHE_DIR, TRITON_CACHE_DIR, ejKernel's EJKERNEL_TRITON_CACHE_DIR, CUDA_CACHE_PATH,
XDG_CACHE_HOME all in a fresh directory) then `warm` (a second process on the same directories).
Every measurement is its own `python scripts/bench_clients.py --child` process. Phase sums cover
the programs that ran on both paths (failures are listed; wall includes their attempts, pass
--programs to leave them out). Medians over --repeat fresh directory sets.

Without a GPU the intercepted path is cross-lowered for sm_90 and only `lower` is reported: the
own path and the run phases need a GPU (ejKernel's own path asks the GPU for its compute capability).

Also printed: the cost of the kernel_cache_intercept.pth hook with the variable unset -- the time
`site` takes to process that one file (site.addpackage: open, read, exec its line) in a `python -S`
process, median of 10 fresh processes.

  python scripts/bench_clients.py [--repeat 1] [--json out.json] [--programs flash_attention,rwkv4]
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
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as `python scripts/...`: the checkout's packages, `scripts` among them
    sys.path.insert(0, ROOT)

from scripts.bench_child import has_gpu, run_json_child  # noqa: E402

PHASES = ("lower", "xla_compile", "first_run", "wall")
PATHS = ("own", "intercepted")
CLIENTS = "jax_triton,ejkernel"
INSTALL_HINT = ("install kernel-cache with pip (`python3 -m pip install --no-deps --no-build-isolation -e .` or a "
                "wheel): its .pth hook and its kernel_cache.clients entry points exist only then, not on PYTHONPATH")


def child(labels: set[str] | None, cross: bool, outputs: str | None) -> dict[str, Any]:
    """One fresh process: every program lowered, compiled and run once; phase seconds per program."""
    sys.path.insert(0, ROOT)
    import jax

    jax.devices()  # backend start-up is no phase (it is in wall)
    from scripts import client_programs

    report: dict[str, Any] = {"device": str(jax.devices()[0].device_kind), "programs": {}, "errors": {}}
    saved = {}
    for client, label, fn, args in client_programs.programs():
        if labels is not None and label not in labels:
            continue
        times: dict[str, Any] = {"client": client}  # and each phase's seconds
        report["programs"][label] = times
        lower_options: dict[str, Any] = {"lowering_platforms": ("cuda",)} if cross else {}
        try:
            t = time.perf_counter()
            lowered = jax.jit(fn).trace(*args).lower(**lower_options)
            times["lower"] = time.perf_counter() - t
            if cross:
                continue
            t = time.perf_counter()
            compiled = lowered.compile()
            times["xla_compile"] = time.perf_counter() - t
            jax.block_until_ready(args)  # type: ignore[no-untyped-call]  # unannotated in jax
            t = time.perf_counter()
            out = jax.block_until_ready(compiled(*args))  # type: ignore[no-untyped-call]  # (as above)
            times["first_run"] = time.perf_counter() - t
            saved.update({f"{label}.{i}": leaf for i, leaf in enumerate(jax.tree_util.tree_leaves(out))})
        except Exception as exc:  # jax-triton's own path fails where its binding is wrong: report, go on
            del report["programs"][label]
            report["errors"][label] = f"{type(exc).__name__}: {exc}"[:400]
    if outputs:
        import numpy as np

        arrays: dict[str, Any] = {k: np.asarray(v) for k, v in saved.items()}  # (numpy's ** would reach allow_pickle)
        np.savez(outputs, **arrays)
    if "kernel_cache" in sys.modules:  # the hook imported it: intercepted (own children never import it)
        import kernel_cache
        from lowering.clients import tally

        report["intercept"] = kernel_cache.interception.status()
        report["compiles"] = kernel_cache.default_store().stats.session().get("compiles", 0)
        report["tally"] = tally()
    return report


def install_problem() -> str | None:
    """Why interception cannot run from this Python (kernel-cache not pip-installed), or None."""
    from importlib.metadata import entry_points

    if not list(entry_points(group="kernel_cache.clients")):
        return f"no 'kernel_cache.clients' entry points: {INSTALL_HINT}"
    probe = subprocess.run([sys.executable, "-c", "import sys; print('kernel_cache.interception' in sys.modules)"],
                           env={**os.environ, "KERNEL_CACHE_INTERCEPT": CLIENTS}, capture_output=True, text=True)
    if probe.stdout.strip() != "True":
        return f"KERNEL_CACHE_INTERCEPT did not reach kernel-cache at start-up (no .pth hook ran): {INSTALL_HINT}"
    return None


def child_env(path: str, caches: str, cross: bool = False, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of one child: `path` is own or intercepted; every cache lives under `caches`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("KERNEL_CACHE_") and k not in ("JAX_COMPILATION_CACHE_DIR", "EASYDEL_TRITON_CACHE_DIR")}
    env.update(PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
               TRITON_CACHE_DIR=os.path.join(caches, "triton"), XDG_CACHE_HOME=os.path.join(caches, "xdg"),
               EJKERNEL_TRITON_CACHE_DIR=os.path.join(caches, "ejkernel"),
               COMPILE_FUNC_DIR=os.path.join(caches, "ejit"), CUDA_CACHE_PATH=os.path.join(caches, "nv"))
    if path == "intercepted":
        env.update(KERNEL_CACHE_INTERCEPT=CLIENTS, KERNEL_CACHE_DIR=os.path.join(caches, "kernel-cache"))
    if cross:
        env.update(KERNEL_CACHE_TARGET_ARCH="sm_90", JAX_PLATFORMS=env.get("JAX_PLATFORMS", "cpu"))
    return {**env, **(extra or {})}


def run_child(env: dict[str, str], labels: str | None = None, cross: bool = False,
              outputs: str | None = None) -> dict[str, Any]:
    argv = [sys.executable, os.path.abspath(__file__), "--child"] + (["--programs", labels] if labels else [])
    argv += (["--cross"] if cross else []) + (["--outputs", outputs] if outputs else [])
    report, wall, stderr = run_json_child(argv, env, ROOT)
    if env.get("KERNEL_CACHE_INTERCEPT") and set(report.get("intercept", {}).values()) != {"installed"}:
        raise SystemExit(f"interception did not install in the child: {report.get('intercept')}\n{stderr[-3000:]}")
    report["wall"], report["stderr"] = wall, stderr
    return report


def hook_cost(runs: int = 10) -> dict[str, Any]:
    """Median seconds `site` spends on kernel_cache_intercept.pth with the variable unset (fresh
    `python -S` processes; the directory is found here, as -S also skips the venv's prefix); None
    where the hook is not installed."""
    import site

    dirs = [d for d in site.getsitepackages() + [site.getusersitepackages()]
            if os.path.isfile(os.path.join(d, "kernel_cache_intercept.pth"))]
    if not dirs:
        return {"seconds": None}
    baseline = tempfile.mkdtemp(prefix="kc-pth-")  # the same work for a one-line `import os` .pth
    with open(os.path.join(baseline, "kernel_cache_intercept.pth"), "w") as f:
        f.write("import os\n")
    env = {k: v for k, v in os.environ.items() if k != "KERNEL_CACHE_INTERCEPT"}
    result: dict[str, Any] = {"dir": dirs[0]}
    for name, where in (("seconds", dirs[0]), ("baseline_seconds", baseline)):
        code = (f"import sys, site, time\nt = time.perf_counter()\n"
                f"site.addpackage({where!r}, 'kernel_cache_intercept.pth', set())\n"
                f"print(time.perf_counter() - t, 'kernel_cache' in sys.modules)")
        samples = [subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True,
                                  check=True).stdout.split() for _ in range(runs)]
        result[name] = statistics.median(float(s[0]) for s in samples)
        result.setdefault("imported_kernel_cache", any(s[1] == "True" for s in samples))
    shutil.rmtree(baseline, ignore_errors=True)
    return result


def summarize(runs: dict[tuple[str, str], list[dict[str, Any]]]
              ) -> tuple[dict[tuple[str, str], dict[str, float]], list[str]]:
    """(path, temperature) -> phase -> median over repeats of the sum over common programs."""
    every = [r for rs in runs.values() for r in rs]
    common = sorted(set.intersection(*(set(r["programs"]) for r in every)))
    table = {}
    for key, rs in runs.items():
        table[key] = {p: statistics.median(sum(r["programs"][lbl].get(p, 0.0) for lbl in common) for r in rs)
                      for p in PHASES[:-1]}
        for client in ("jax_triton", "ejkernel"):  # the first run per client (ejKernel's: ptxas at launch)
            table[key][f"  {client}"] = statistics.median(sum(r["programs"][lbl].get("first_run", 0.0) for lbl in common
                                                              if r["programs"][lbl]["client"] == client) for r in rs)
        table[key]["wall"] = statistics.median(r["wall"] for r in rs)
        table[key]["compiles"] = statistics.median(r.get("compiles", 0) for r in rs)
    return table, common


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cross", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--outputs", default=None, help=argparse.SUPPRESS)  # child: outputs to this .npz (tests)
    ap.add_argument("--repeat", type=int, default=1, help="fresh directory sets (cold + warm each); medians shown")
    ap.add_argument("--json", default=None, help="also write every child's report here")
    ap.add_argument("--programs", default=None, help="comma-separated labels of scripts/client_programs.py")
    args = ap.parse_args()
    if args.child:
        labels = set(args.programs.split(",")) if args.programs else None
        print(json.dumps(child(labels, args.cross, args.outputs)))
        return

    problem = install_problem()
    if problem:
        raise SystemExit(f"bench_clients: {problem}")
    gpu = has_gpu()
    paths = PATHS if gpu else ("intercepted",)
    work = tempfile.mkdtemp(prefix="kc-bench-clients-")
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {(p, t): [] for p in paths for t in ("cold", "warm")}
    try:
        for i in range(args.repeat):
            for path in paths:
                env = child_env(path, os.path.join(work, f"{path}{i}"), cross=not gpu)
                for temperature in ("cold", "warm"):
                    runs[(path, temperature)].append(run_child(env, args.programs, cross=not gpu))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    hook = hook_cost()

    first = runs[(paths[-1], "cold")][0]
    print(f"host: python {sys.version.split()[0]}, device {first['device'] if gpu else 'none (cross-lowering for sm_90)'}, "
          f"{args.repeat} repeat(s), medians")
    table, common = summarize(runs)
    print(f"programs ({len(common)}): {', '.join(common)}")
    for (path, temperature), rs in runs.items():
        for label, error in sorted({k: v for r in rs for k, v in r["errors"].items()}.items()):
            print(f"  left out, failed on {path} {temperature}: {label}: {error[:160]}")
    shown = ("lower", "xla_compile", "first_run", "  jax_triton", "  ejkernel", "wall") if gpu else ("lower", "wall")
    header = "".join(f"{f'{p} {t} (s)':>23}" for t in ("cold", "warm") for p in paths)
    ratios = "".join(f"{f'{t} icpt:own':>16}" for t in ("cold", "warm")) if gpu else f"{'warm:cold':>12}"
    print(f"\n{'phase':<14}{header}{ratios}")
    for phase in shown:
        cells = "".join(f"{table[(p, t)][phase]:>23.3f}" for t in ("cold", "warm") for p in paths)
        if gpu:
            ratio = "".join(f"{_ratio(table[('intercepted', t)][phase], table[('own', t)][phase]):>16}"
                            for t in ("cold", "warm"))
        else:
            ratio = f"{_ratio(table[('intercepted', 'warm')][phase], table[('intercepted', 'cold')][phase]):>12}"
        print(f"{phase:<14}{cells}{ratio}")
    print(f"{'kc compiles':<14}" + "".join(f"{_compiles(table[(p, t)], p):>23}"
                                          for t in ("cold", "warm") for p in paths))
    if not gpu:
        print("\nno GPU here: the own path (ejKernel asks the GPU for its compute capability) and the xla_compile "
              "and first_run phases need one; shown: the intercepted path cross-lowered for sm_90")
    if hook["seconds"] is None:
        print("\n.pth hook: kernel_cache_intercept.pth is not in this Python's site-packages")
    else:
        print(f"\n.pth hook, variable unset: site processes kernel_cache_intercept.pth in {hook['seconds'] * 1e6:.0f} us "
              f"(median of 10 `python -S` processes, site.addpackage of that file alone; a one-line `import os` "
              f".pth: {hook['baseline_seconds'] * 1e6:.0f} us); imported kernel_cache: {hook['imported_kernel_cache']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": gpu, "programs": common, "table": {f"{p} {t}": v for (p, t), v in table.items()},
                       "hook": hook, "runs": {f"{p} {t}": [{k: v for k, v in r.items() if k != "stderr"} for r in rs]
                                              for (p, t), rs in runs.items()}}, f, indent=1)


def _compiles(row: dict[str, float], path: str) -> str:
    return f"{row['compiles']:.0f}" if path == "intercepted" else "-"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.3f}x" if b else "-"


if __name__ == "__main__":
    main()
