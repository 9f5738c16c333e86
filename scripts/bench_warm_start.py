"""Warm-start benchmark: the example program set, cold vs warm store, each run in a fresh process.

Phases per run (summed over the 9 programs / 14 kernels of lowering/examples.py):
  lower       jax.jit(f).trace(...).lower(...)  -- where jax-triton runs Triton; we read the store
  lowering_rule  the part of `lower` spent in lowering.triton_call's rule (specs, store, proto)
  xla_compile lowered.compile()                  -- GPU only (FFI target: jaxlib loads kernels here)
  first_run   first call + block_until_ready     -- GPU only (legacy target: ptxas/load, autotuning)
  wall        the whole child process, imports included
On a host without a GPU only `lower` runs (cross-lowering for CUDA, KERNEL_CACHE_TARGET_ARCH or
--arch), so the numbers measure exactly the Triton work that the store removes.

Then, on a GPU, a launch-bound program (a jitted chain of 64 tiny autotuned adds) side by side,
warm store, fresh process each: before (autotuned: jaxlib's legacy target, configs benchmarked at
the first run, no CUDA graph) and after `cachectl tune` (its persisted winner: one plain FFI call
per add, captured by XLA's command buffers): lower, XLA compile, first run and the steady-state
step (median of batches of back-to-back steps). On a CPU host that part says it is skipped.
(The script is long because it holds both benchmarks, each with its child process and its table.)

  python scripts/bench_warm_start.py [--runs 2] [--arch sm_90] [--json out.json] [--no-module-image]
                                     [--xla] [--no-chain]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as `python scripts/...`: the checkout's packages, `scripts` among them
    sys.path.insert(0, ROOT)

from scripts.bench_child import time_programs  # noqa: E402

PHASES = ("lower", "lowering_rule", "xla_compile", "first_run", "first_run_plain", "first_run_autotuned", "wall")


def child(run_on_gpu: bool) -> dict[str, float]:
    """One fresh-process run: returns phase totals in seconds (BENCH_PROFILE=1: cProfile of the
    lowering phase to stderr)."""
    if os.environ.get("BENCH_PROFILE") == "1":
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        try:
            return _child(run_on_gpu)
        finally:
            profiler.disable()
            pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(40)
    return _child(run_on_gpu)


def _child(run_on_gpu: bool) -> dict[str, float]:
    sys.path.insert(0, ROOT)
    import jax

    jax.devices()  # backend start-up is not lowering: keep it out of the phases (it is in wall)
    from lowering import examples as ep
    from lowering.frontend import rule

    rule_seconds = [0.0]
    real_lower_call = rule.lower_call

    def timed_lower_call(*args: Any, **kwargs: Any) -> Any:  # what the lowering rule itself costs
        start = time.perf_counter()
        try:
            return real_lower_call(*args, **kwargs)
        finally:
            rule_seconds[0] += time.perf_counter() - start

    rule.lower_call = timed_lower_call

    progs = ep.programs()
    totals = dict.fromkeys(PHASES[:-1], 0.0)
    import gc

    gc.collect()  # the imports' garbage: a full collection of it inside the first lowering is not ours
    for label, lower, xla_compile, first_run in time_programs(progs, ep.random_inputs, run=run_on_gpu,
                                                               lowering_platforms=("cuda",)):
        totals["lower"] += lower
        totals["xla_compile"] += xla_compile
        totals["first_run"] += first_run
        totals["first_run_autotuned" if "autotuned" in label else "first_run_plain"] += first_run
    totals["lowering_rule"] = rule_seconds[0]
    from kernel_cache import default_store

    totals["compiles"] = default_store().stats.session().get("compiles", 0)
    if not run_on_gpu:  # a lowering-only process (on a GPU host main() starts one more for this)
        totals.update(_per_kernel_split(progs, rule_seconds))
    return totals


def _fresh(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` as a new function object (jax.clear_caches would also drop JAX's device and backend caches,
    which the rule reads on a GPU host, and time their rebuilding as ours)."""
    return lambda *args: fn(*args)


SPLIT_PASSES = 15  # each split figure is the median of this many passes (one pass is ~10 ms: noisy)


def _per_kernel_split(progs: list[tuple[str, Callable[..., Any], tuple[Any, ...]]],
                      rule_seconds: list[float]) -> dict[str, float]:
    """Our share of a warm lowering, split: lower the same programs again in this process with the
    per-process memos of keys, entries, payloads and kernel functions emptied, so every call is looked
    up again in the store (a started process meeting new calls); what the first pass cost beyond that
    was paid once per process. Also how much of a pass was building the custom-call op (which every
    Triton lowering rule does: jax-triton's through JAX's `mlir.custom_call`, ours in `_build_op`)."""
    import gc
    import statistics

    import jax

    import kernel_cache
    from lowering.frontend import custom_call
    from lowering.payload import deflate

    first = rule_seconds[0]
    builder = [0.0, 0]  # seconds building the op, and its calls (one per Triton call)
    real_builder = custom_call._build_op

    def timed_builder(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return real_builder(*args, **kwargs)
        finally:
            builder[0] += time.perf_counter() - start
            builder[1] += 1

    def combined(*arrays: Any) -> list[Any]:  # the 9 programs as one jit: a model's module of many Triton calls
        out, start = [], 0
        for _, fn, shapes in progs:
            out.append(fn(*arrays[start:start + len(shapes)]))
            start += len(shapes)
        return out

    one_module = [(None, combined, [s for _, _, shapes in progs for s in shapes])]

    def one_pass(forget: bool, units: Sequence[tuple[Any, Callable[..., Any], Sequence[Any]]] = progs
                 ) -> tuple[float, float, int, int]:
        store = kernel_cache.default_store()
        if forget:
            kernel_cache.current_session().forget()  # content keys, record texts, payloads, winners read
            store.memory.clear()
            deflate._runs.clear()
        gc.collect()  # a full collection of JAX's large heap landing inside a pass would be timed as ours
        rule_seconds[0], builder[:] = 0.0, [0.0, 0]
        hits_before = sum(store.stats.session()["hits"].values())
        for _, fn, shapes in units:  # a new function object: jit's own cache cannot answer, the rule runs
            jax.jit(_fresh(fn)).trace(*shapes).lower(lowering_platforms=("cuda",))
        return rule_seconds[0], builder[0], sum(store.stats.session()["hits"].values()) - hits_before, int(builder[1])

    def configure(config: kernel_cache.Config) -> None:  # a new store, opened outside the timed pass
        kernel_cache.configure(config).get("0" * 32)

    def kernel_by_kernel_pass() -> tuple[float, int]:  # the same, with lowered-call records off: (seconds, kernels read)
        configure(base.with_(call_records=False))
        try:
            seconds, _, kernels_read, _ = one_pass(forget=True)
            return seconds, kernels_read
        finally:
            configure(base)

    def without_sets_pass() -> float:  # the same, with warm sets off: each record read on its own
        configure(base.with_(warm_sets=False))
        try:
            return one_pass(forget=True)[0]
        finally:
            configure(base)

    base = kernel_cache.current_config()
    custom_call._build_op = timed_builder
    try:
        again, by_kernel, in_module, no_sets = [], [], [], []
        for _ in range(SPLIT_PASSES):  # interleaved: a machine getting busier or quieter biases neither
            again.append(one_pass(forget=True))
            by_kernel.append(kernel_by_kernel_pass())
            in_module.append(one_pass(forget=True, units=one_module)[0])
            no_sets.append(without_sets_pass())
        repeat = [one_pass(forget=False) for _ in range(SPLIT_PASSES)]  # every memo warm: new jits of the same calls
    finally:
        custom_call._build_op = real_builder
    # the kernels: each one store hit where records are off (a record hit is one record hit, its kernels unread)
    kernels, calls = by_kernel[0][1], again[0][3]
    median_again = statistics.median(a[0] for a in again)
    return {"rule_kernels": kernels, "rule_calls": calls,
            "rule_per_kernel_ms": median_again / max(kernels, 1) * 1e3,
            "rule_per_kernel_unrecorded_ms": statistics.median(b[0] for b in by_kernel) / max(kernels, 1) * 1e3,
            "rule_per_kernel_one_module_ms": statistics.median(in_module) / max(kernels, 1) * 1e3,
            "rule_per_kernel_no_sets_ms": statistics.median(no_sets) / max(kernels, 1) * 1e3,
            "rule_per_call_ms": median_again / max(calls, 1) * 1e3,
            "rule_builder_per_call_ms": statistics.median(a[1] for a in again) / max(calls, 1) * 1e3,
            "rule_once_ms": max(first - median_again, 0.0) * 1e3,
            "rule_repeat_ms": statistics.median(r[0] for r in repeat) / max(kernels, 1) * 1e3}


CHAIN_PHASES = ("lower", "xla_compile", "first_run", "step")


def chain_child() -> dict[str, Any]:
    """One fresh process running the launch-bound chain: phase seconds, plus its custom calls."""
    sys.path.insert(0, ROOT)
    sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
    import statistics

    import jax

    jax.devices()
    from inspect_call import custom_calls  # tests/support/ helper (on sys.path above): decodes the custom calls of a lowering

    from lowering import examples as ep

    (_, fn, args), = ep.launch_bound_programs()
    out: dict[str, Any] = {}
    t = time.perf_counter()
    lowered = jax.jit(fn).lower(*args)
    out["lower"] = time.perf_counter() - t
    calls = custom_calls(lowered)
    out["calls"] = len(calls)
    out["autotuned_calls"] = sum(1 for c in calls if "autotuned" in c)
    out["targets"] = sorted({c["target"] for c in calls})
    t = time.perf_counter()
    compiled = lowered.compile()
    out["xla_compile"] = time.perf_counter() - t
    t = time.perf_counter()
    jax.block_until_ready(compiled(*args))  # type: ignore[no-untyped-call]  # unannotated in jax
    out["first_run"] = time.perf_counter() - t
    batches = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(50):
            result = compiled(*args)
        jax.block_until_ready(result)  # type: ignore[no-untyped-call]  # (as above)
        batches.append((time.perf_counter() - t) / 50)
    out["step"] = statistics.median(batches)
    return out


def run_chain(cache_dir: str, env_extra: dict[str, str], child_flag: str = "--child-chain") -> dict[str, Any]:
    env = {**os.environ, "KERNEL_CACHE_DIR": cache_dir, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
           **env_extra}
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), child_flag], env=env, capture_output=True,
                          text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child failed:\n{proc.stdout}\n{proc.stderr}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def bench_chain(work: str, env: dict[str, str], runs: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(before, after) runs of the launch-bound chain in fresh processes on one warm store."""
    cache = os.path.join(work, "chain")
    run_chain(cache, {**env, "KERNEL_CACHE_WINNERS": "0"})  # fills the store: every config compiled
    before = [run_chain(cache, {**env, "KERNEL_CACHE_WINNERS": "0"}) for _ in range(runs)]
    tune_env = {**os.environ, **env, "KERNEL_CACHE_DIR": cache,
                "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "kernel_cache", "tune", "lowering.examples:launch_bound_programs",
                           "-q"], env=tune_env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"cachectl tune failed:\n{proc.stdout}\n{proc.stderr}")
    after = [run_chain(cache, env) for _ in range(runs)]
    return before, after


def print_chain(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> None:
    print("\nlaunch-bound program: 64 tiny autotuned adds, warm store, fresh process each")
    print(f"{'phase':<22}{'autotuned (s)':>22}{'tuned winner (s)':>22}{'after:before':>14}")
    for phase in CHAIN_PHASES:
        b, a = [r[phase] for r in before], [r[phase] for r in after]
        pattern = "{:.6f}" if phase == "step" else "{:.3f}"
        print(f"{phase:<22}{_fmt(b, pattern):>22}{_fmt(a, pattern):>22}{sum(a) / sum(b):>13.3f}x")
    for name, runs in (("autotuned", before), ("tuned winner", after)):
        r = runs[0]
        print(f"  {name}: {r['calls']} custom calls on {', '.join(r['targets'])}, {r['autotuned_calls']} autotuned")


def _has_gpu() -> bool:
    try:
        import jax

        return bool(jax.devices("cuda"))
    except Exception:
        return False


def run_child(cache_dir: str, env_extra: dict[str, str]) -> dict[str, Any]:
    env = {**os.environ, "KERNEL_CACHE_DIR": cache_dir, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
           **env_extra}
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child"], env=env, capture_output=True,
                          text=True, timeout=900)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child failed:\n{proc.stdout}\n{proc.stderr}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["wall"] = wall
    return result


def versions() -> dict[str, Any]:
    import jax
    import jaxlib
    import triton

    from kernel_cache import current_config
    from lowering.payload import jaxlib_compat as compat

    info = {"python": sys.version.split()[0], "jax": jax.__version__,
            "jaxlib": jaxlib.__version__,  # type: ignore[attr-defined]  # jaxlib re-exports it without `as`
            "triton": triton.__version__, "cpu_count": os.cpu_count(),
            "ffi_target": compat.ffi_target_registered("cuda"),
            "module_image": compat.module_image_layout("cuda", current_config()) is not None}
    try:
        info["device"] = str(jax.devices("cuda")[0].device_kind)
    except Exception:
        info["device"] = "none (cross-lowering only)"
    return info


def measure_runs(work: str, env: dict[str, str], runs: int, gpu: bool,
                 xla: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(cold, warm, warm with KERNEL_CACHE_XLA=1) child reports: per run an empty store, then the same
    store full; on a GPU also the lowering-only split; with `xla` a third process fills JAX's cache
    and a fourth reads it."""
    cold: list[dict[str, Any]] = []
    warm: list[dict[str, Any]] = []
    warm_xla: list[dict[str, Any]] = []
    for i in range(runs):
        cache = os.path.join(work, f"cache{i}")
        cold.append(run_child(cache, env))  # empty store
        warm.append(run_child(cache, env))  # same store, now full
        if gpu:  # the per-kernel split in a process that only lowers (as the CPU runs do)
            warm[-1].update({k: v for k, v in run_child(cache, {**env, "BENCH_GPU": "0"}).items()
                             if k.startswith("rule_")})
        if xla:
            run_child(cache, {**env, "KERNEL_CACHE_XLA": "1"})
            warm_xla.append(run_child(cache, {**env, "KERNEL_CACHE_XLA": "1"}))
    return cold, warm, warm_xla


def profile_warm(work: str, env: dict[str, str]) -> str:
    """cProfile's top of one more warm process (BENCH_PROFILE=1), as text."""
    profile_env = {**os.environ, **env, "BENCH_PROFILE": "1", "KERNEL_CACHE_DIR": os.path.join(work, "cache0"),
                   "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child"], env=profile_env,
                          capture_output=True, text=True, timeout=900)
    return proc.stderr


def print_phases(cold: list[dict[str, Any]], warm: list[dict[str, Any]], gpu: bool) -> None:
    """The cold/warm table and our share of a warm lowering."""
    shown = [p for p in PHASES if gpu or p in ("lower", "lowering_rule", "wall")]
    print(f"\n{'phase':<22}{'cold (s)':>22}{'warm (s)':>22}{'warm:cold':>12}")
    for phase in shown:
        c = [r[phase] for r in cold]
        w = [r[phase] for r in warm]
        ratio = (sum(w) / sum(c)) if sum(c) else float("nan")
        print(f"{phase:<22}{_fmt(c):>22}{_fmt(w):>22}{ratio:>11.3f}x")
    print(f"{'kernel compiles':<22}{_fmt([r['compiles'] for r in cold], '{:.0f}'):>22}"
          f"{_fmt([r['compiles'] for r in warm], '{:.0f}'):>22}")
    print(f"\nour share of a warm lowering (the lowering rule; JAX's own lowering excluded), warm process, "
          f"{warm[0]['rule_kernels']} kernels in {warm[0]['rule_calls']} calls, median of {SPLIT_PASSES} passes:\n"
          f"  per kernel          {_fmt([r['rule_per_kernel_ms'] for r in warm], '{:.3f}')} ms  (the same programs "
          f"lowered again with this process's key, entry, payload and kernel-function memos emptied)\n"
          f"  kernel by kernel    {_fmt([r['rule_per_kernel_unrecorded_ms'] for r in warm], '{:.3f}')} ms  (the same "
          f"with KERNEL_CACHE_CALL_RECORDS=0, passes interleaved: "
          f"{_fmt([r['rule_per_kernel_ms'] / r['rule_per_kernel_unrecorded_ms'] for r in warm], '{:.2f}')}x)\n"
          f"  in one module       {_fmt([r['rule_per_kernel_one_module_ms'] for r in warm], '{:.3f}')} ms  (the same "
          f"calls in one jit, as a model's: what is read once per module is shared)\n"
          f"  without warm sets   {_fmt([r['rule_per_kernel_no_sets_ms'] for r in warm], '{:.3f}')} ms  (the 9 jits "
          f"with KERNEL_CACHE_WARM_SETS=0, each call planned and its record read on its own, passes "
          f"interleaved: sets and the signatures they keep "
          f"{_fmt([r['rule_per_kernel_ms'] / r['rule_per_kernel_no_sets_ms'] for r in warm], '{:.2f}')}x)\n"
          f"  per call            {_fmt([r['rule_per_call_ms'] for r in warm], '{:.3f}')} ms  (the same, per Triton call)\n"
          f"    of which the op   {_fmt([r['rule_builder_per_call_ms'] for r in warm], '{:.3f}')} ms  (building the "
          f"stablehlo custom call, as every Triton lowering rule does)\n"
          f"  once per process    {_fmt([r['rule_once_ms'] for r in warm], '{:.1f}')} ms  (first pass minus that)\n"
          f"  per kernel, repeat  {_fmt([r['rule_repeat_ms'] for r in warm], '{:.3f}')} ms  (the same calls lowered "
          f"once more in new jits: another step function, a re-trace; one jit's identical calls JAX lowers once)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-chain", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--no-chain", action="store_true",
                    help="skip the launch-bound program (autotuned vs tuned winner; GPU)")
    ap.add_argument("--runs", type=int, default=2, help="cold and warm runs each (default 2)")
    ap.add_argument("--arch", default=None, help="target when no GPU is visible (default sm_90)")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--no-module-image", action="store_true", help="send PTX only (jaxlib runs ptxas)")
    ap.add_argument("--xla", action="store_true",
                    help="also run warm processes with KERNEL_CACHE_XLA=1 and compare XLA compile seconds (GPU)")
    ap.add_argument("--profile", action="store_true",
                    help="after the table, profile one more warm process and print the top of it")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(os.environ.get("BENCH_GPU") == "1")))
        return
    if args.child_chain:
        print(json.dumps(chain_child()))
        return

    sys.path.insert(0, ROOT)
    gpu = _has_gpu()
    env = {"BENCH_GPU": "1" if gpu else "0"}
    if not gpu:
        env["KERNEL_CACHE_TARGET_ARCH"] = args.arch or os.environ.get("KERNEL_CACHE_TARGET_ARCH") or "sm_90"
    if args.no_module_image:
        env["KERNEL_CACHE_MODULE_IMAGE"] = "0"
    info = versions()
    print("host:", json.dumps(info))
    work = tempfile.mkdtemp(prefix="kc-bench-")
    try:
        cold, warm, warm_xla = measure_runs(work, env, args.runs, gpu, args.xla)
        chain = bench_chain(work, env, args.runs) if gpu and not args.no_chain else None
        profile_text = profile_warm(work, env) if args.profile else ""
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print_phases(cold, warm, gpu)
    if warm_xla:
        for phase in ("xla_compile", "wall") if gpu else ("wall",):
            w, x = [r[phase] for r in warm], [r[phase] for r in warm_xla]
            print(f"{phase + ' KERNEL_CACHE_XLA=1':<22}{_fmt(w):>22}{_fmt(x):>22}{sum(x) / sum(w):>11.3f}x"
                  f"   (warm without / with the XLA opt-in)")
    if chain is not None:
        print_chain(*chain)
    elif not args.no_chain:
        print("\nlaunch-bound program (autotuned vs tuned winner): skipped, no GPU here (tuning and step "
              "times need one)")
    if profile_text:
        print("\nprofile of one warm process (cumulative):\n" + profile_text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"host": info, "cold": cold, "warm": warm, "warm_xla": warm_xla,
                       "chain": None if chain is None else {"autotuned": chain[0], "tuned": chain[1]}}, f, indent=1)


def _fmt(values: Iterable[float], pattern: str = "{:.3f}") -> str:
    return " / ".join(pattern.format(v) for v in values)


if __name__ == "__main__":
    main()
