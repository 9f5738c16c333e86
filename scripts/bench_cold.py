"""Cold-start benchmark: a program's kernels compiled one after another vs at once (compile ahead).

Why: a cold process (a new model, a Triton or kernel-cache upgrade, an empty node) compiles every
Triton kernel inside JAX's lowering. With KERNEL_CACHE_COMPILE_WORKERS=1 it does so one call at a time
(serial); otherwise the first miss of a module starts the compiles of every call traced with it on
worker threads (threads: lowering.compile_ahead.ahead), each compile on a worker process where one is
idle (processes: compiler.compile_processes, its pool forced to the compile threads' number; `auto`:
its own rule decides, as a program's default; `warm`: the forced pool started and ready before the
program is traced, the ceiling a pool reaches where its start-up is hidden, and how long that start-up
took). Each row says where its kernels compiled (`on workers`: in worker processes) and its peak
memory: the parent's and the sum of its workers' peaks. This prints, side by side in one run, fresh
processes with every cache empty (KERNEL_CACHE_DIR, TRITON_CACHE_DIR, ejKernel's and CUDA's caches, XDG_CACHE_HOME):
  lower        jax.jit(f).trace(*args).lower()  -- where the kernels compile
  xla_compile  lowered.compile()                 -- GPU only
  first_run    first call + block_until_ready    -- GPU only (ejKernel's own path runs ptxas here)
  wall         the whole child process, imports included
for these programs:
  one kernel   lowering.examples' add[BLOCK=256] alone (compiling at once must cost a single kernel nothing)
  module       the 9 programs of lowering.examples (14 kernels) as one jit, as a model's module is
  9 jits       the same programs, each its own jit (each lowers before the next is traced)
  9 jits, upgraded  the 9 jits again after a run of them under another toolchain (simulated as the
               tests do: TRITON_DISABLE_LINE_INFO=1 makes every key new; and the toolchain memo
               removed, as a new Triton finds none of its own): the first miss compiles,
               ahead, what the last run's warm set names (lowering.compile_ahead.ahead.predicted); serial
               compiles one at a time as each jit lowers
  module in a model  (`--shapes ...,model`) the module, each program followed by 0.1 s of tracing time
               (a model's trace is long: its first Triton call comes long before its first lowering);
               0.9 s of its `lower` is that pause, on every path
  2 modules    (`--shapes ...,two`, without a GPU) the module, then the same programs for sm_80 as a
               second module: 28 kernels, the second 14 where a pool of worker processes is running
  ejkernel     scripts/client_programs.py's ejKernel programs as one jit through
               KERNEL_CACHE_INTERCEPT=ejkernel, on each path, and on a GPU ejKernel's own path
               (where ejKernel is installed and kernel-cache is pip-installed, for the .pth hook)
Without a GPU everything is cross-lowered for sm_90 and only `lower` and `wall` are reported.
Medians over --repeat fresh directory sets.

  python scripts/bench_cold.py [--workers N] [--repeat 1] [--sets examples,ejkernel]
                               [--paths serial,threads,processes] [--shapes one,module,jits,upgrade] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
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

from kernel_cache.settings.config import TOOLCHAIN_MEMO  # noqa: E402
from scripts.bench_child import has_gpu, run_json_child, time_programs  # noqa: E402

PHASES = ("lower", "xla_compile", "first_run", "wall")
PATHS = ("serial", "threads", "processes", "auto", "warm")
SHAPES = ("one", "module", "jits", "upgrade", "two", "model")
MODEL_TRACE_SECONDS = 0.1  # the "model" shape's tracing time after each Triton program
# How the tests simulate an upgrade: a setting Triton counts as changing compiled output, so every key
# and signature is new while the program is the same
UPGRADE_ENV = {"TRITON_DISABLE_LINE_INFO": "1"}
POOL = {"threads": "off", "processes": "on", "auto": "rule", "warm": "warm"}  # BENCH_COLD_PROCESSES, per path
WARM_READY_TIMEOUT = 60.0  # the `warm` path's wait for its workers before lowering


def child(program_set: str, shape: str, cross: bool) -> dict[str, Any]:
    """One fresh process: the set's programs lowered (GPU: compiled and run once) as `shape`."""
    sys.path.insert(0, ROOT)
    if os.environ.get("BENCH_COLD_SWITCH"):  # an experiment: the interpreter's GIL switch interval
        sys.setswitchinterval(float(os.environ["BENCH_COLD_SWITCH"]))
    import jax

    jax.devices()  # backend start-up is no phase (it is in wall)
    pool = os.environ.get("BENCH_COLD_PROCESSES")
    ready_s = set_pool(pool, cross) if pool else 0.0
    from scripts.one_module import as_one_program

    if program_set == "ejkernel":
        from scripts import client_programs

        programs = [(label, fn, args) for _, label, fn, args in client_programs.programs(("ejkernel",))]
    else:
        from lowering.examples import programs as example_programs
        from lowering.examples import random_inputs

        call = {"compute_capability": 90} if cross else {}
        programs = [(label, fn, random_inputs(shapes) if not cross else shapes)
                    for label, fn, shapes in example_programs(**call)]
        if shape == "one":
            programs = programs[:1]
        if shape == "two":  # a second module of as many kernels, for another GPU generation (cross only)
            programs += [(label, fn, shapes) for label, fn, shapes in example_programs(compute_capability=80)]
    lower_options: dict[str, Any] = {"lowering_platforms": ("cuda",)} if cross else {}
    timeline: list[tuple[str, str, float, float]] = []
    origin = time.perf_counter()
    if os.environ.get("BENCH_COLD_TIMELINE"):  # which thread compiled what, when (from the start of lowering)
        import threading

        import compiler.cache_or_compile

        real = compiler.cache_or_compile.compile_spec  # the name get_or_compile calls, patched below

        def timed(spec: Any) -> Any:
            start = time.perf_counter()
            try:
                return real(spec)
            finally:
                timeline.append((threading.current_thread().name, spec.name, start - origin,
                                 time.perf_counter() - origin))

        compiler.cache_or_compile.compile_spec = timed
    half = len(programs) // 2
    if shape == "model":
        programs = with_trace_time(programs, MODEL_TRACE_SECONDS)
    groups = [programs] if shape in ("module", "one", "model") else [programs[:half], programs[half:]] \
        if shape == "two" else [[p] for p in programs]
    times = dict.fromkeys(PHASES[:3], 0.0)
    for group in groups:  # each group's module is built after the previous one lowered, as a program would
        module, flat = as_one_program(group)
        for _, lower, xla_compile, first_run in time_programs([("", module, flat)], lambda values: values,
                                                               run=not cross, **lower_options):
            times["lower"] += lower
            times["xla_compile"] += xla_compile
            times["first_run"] += first_run
    report: dict[str, Any] = {"times": times, "device": str(jax.devices()[0].device_kind), "programs": len(programs)}
    if pool == "warm":
        report["ready_s"] = ready_s
    if timeline:
        report["timeline"] = sorted(timeline, key=lambda t: t[2])
    import resource

    report["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    report["workers_rss_mib"] = 0.0
    if "kernel_cache" in sys.modules:
        import kernel_cache

        report["compiles"] = kernel_cache.default_store().stats.session().get("compiles", 0)
        report["workers"] = kernel_cache.current_config().compile_threads
    if "compiler.compile_processes" in sys.modules:
        from compiler import compile_processes

        report["processes"] = compile_processes.counts()
        report["workers_rss_mib"] = sum(peak_rss_mib(pid) for pid, _ in compile_processes.workers())
    return report


def with_trace_time(programs: list[Any], seconds: float) -> list[Any]:
    """Each program followed, while it is traced, by `seconds` of the parent's time: a model's trace,
    whose first Triton call comes long before its first lowering, without the model's layers (whose
    XLA compile would dwarf the rest)."""
    def traced_slowly(fn: Any) -> Any:
        def run(*args: Any) -> Any:
            out = fn(*args)
            time.sleep(seconds)  # the rest of a layer's tracing
            return out
        return run

    return [(label, traced_slowly(fn), args) for label, fn, args in programs]


def set_pool(pool: str, cross: bool) -> float:
    """The compile worker processes: off, forced on, the rule's, or forced on and started now (`warm`:
    returns the seconds its workers took to be ready). Importing the module takes ~10 ms."""
    import kernel_cache
    from compiler import compile_processes

    if pool != "rule":
        compile_processes.override(0 if pool == "off" else kernel_cache.current_config().compile_threads)
    elif os.environ.get("BENCH_COLD_SLOTS") == "unbounded":  # each rank's rule alone (bench_cold_ranks.py)
        compile_processes.node_slots = lambda: 1 << 16
    return warm_pool(kernel_cache.current_config(), cross) if pool == "warm" else 0.0


def warm_pool(config: Any, cross: bool) -> float:
    """Start the compile workers and wait until every one is ready (Triton imported, warmed up for the
    target): what a pool started well before a program's first miss gives. Returns the seconds it took."""
    from compiler import compile_processes
    from compiler.target import parse_target

    if cross:
        target = parse_target("sm_90")
    else:
        import jax

        major, minor = (int(x) for x in jax.devices()[0].compute_capability.split("."))
        target = parse_target(major * 10 + minor)
    start = time.perf_counter()
    wanted = compile_processes.expect(config, 0, target)
    deadline = start + WARM_READY_TIMEOUT
    while time.perf_counter() < deadline:
        states = [state for _, state in compile_processes.workers()]
        if wanted and len(states) >= wanted and all(state == "idle" for state in states):
            break
        time.sleep(0.01)
    return time.perf_counter() - start


def peak_rss_mib(pid: int) -> float:
    """A live process's peak resident memory (Linux: /proc's VmHWM), 0 where it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:")), 0.0)
    except OSError:
        return 0.0


def child_env(caches: str, workers: int | None, intercept: bool, cross: bool, path: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNEL_CACHE_") and k != "BENCH_COLD_PROCESSES"}
    if path in POOL:
        env["BENCH_COLD_PROCESSES"] = POOL[path]
    env.update(PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
               TRITON_CACHE_DIR=os.path.join(caches, "triton"), XDG_CACHE_HOME=os.path.join(caches, "xdg"),
               EJKERNEL_TRITON_CACHE_DIR=os.path.join(caches, "ejkernel"), CUDA_CACHE_PATH=os.path.join(caches, "nv"),
               COMPILE_FUNC_DIR=os.path.join(caches, "ejit"))
    if workers is not None:  # kernel-cache's path (own: the client alone, no kernel-cache at all)
        env["KERNEL_CACHE_DIR"] = os.path.join(caches, "kernel-cache")
        if workers > 0:  # else kernel-cache's default
            env["KERNEL_CACHE_COMPILE_WORKERS"] = str(workers)
    if intercept:
        env["KERNEL_CACHE_INTERCEPT"] = "ejkernel"
    if cross:
        env.update(KERNEL_CACHE_TARGET_ARCH="sm_90", JAX_PLATFORMS=env.get("JAX_PLATFORMS", "cpu"))
    return env


def run_child(program_set: str, shape: str, env: dict[str, str], cross: bool) -> dict[str, Any]:
    argv = [sys.executable, os.path.abspath(__file__), "--child", program_set, shape] + (["--cross"] if cross else [])
    report, wall, _ = run_json_child(argv, env, ROOT)
    report["times"]["wall"] = wall
    return report


def ejkernel_available() -> str | None:
    """Why the ejKernel rows cannot run here, or None."""
    probe = subprocess.run([sys.executable, "-c", "import ejkernel, sys; print('kernel_cache.interception' in sys.modules)"],
                           env={**os.environ, "KERNEL_CACHE_INTERCEPT": "ejkernel"}, capture_output=True, text=True)
    if probe.returncode != 0:
        return "ejKernel is not installed"
    if probe.stdout.strip() != "True":
        return "kernel-cache is not pip-installed here (no .pth hook for KERNEL_CACHE_INTERCEPT)"
    return None


Row = tuple[str, str, str, "int | None", bool]  # (set, shape, path, workers, intercept)


def plan_rows(sets: list[str], workers: int, cross: bool, paths: tuple[str, ...] = PATHS[:3],
              shapes: tuple[str, ...] = SHAPES[:4]) -> tuple[list[Row], str | None]:
    """The rows to measure, and why the ejKernel rows are skipped (None: they are not). The "2 modules"
    rows are cross-lowered only (the second module is for another GPU generation)."""
    rows: list[Row] = []
    if "examples" in sets:
        for shape in (s for s in shapes if cross or s != "two"):
            rows += [("examples", shape, path, 1 if path == "serial" else workers, False) for path in paths]
    skipped = None
    if "ejkernel" in sets:
        skipped = ejkernel_available()
        if skipped is None:
            if not cross:
                rows.append(("ejkernel", "module", "own", None, False))
            rows += [("ejkernel", "module", path, 1 if path == "serial" else workers, True) for path in paths]
    return rows, skipped


def measure(rows: list[Row], repeat: int, cross: bool) -> dict[str, list[dict[str, Any]]]:
    """Every row `repeat` times, each a fresh process on fresh caches, after one throwaway process (the
    first on a host reads Triton's libraries and ptxas from disk, about 1 s, which would be charged to
    whichever row ran first)."""
    def fresh(program_set: str, shape: str, workers: int | None, intercept: bool, path: str = "") -> dict[str, Any]:
        caches = tempfile.mkdtemp(prefix="kc-bench-cold-")
        try:
            if shape == "upgrade":  # the 9 jits, upgraded: last run's kernel-cache directory, every other cache empty
                run_child(program_set, "jits", child_env(caches, 0, intercept, cross, "threads"), cross)
                for other in ("triton", "xdg", "ejkernel", "nv", "ejit"):
                    shutil.rmtree(os.path.join(caches, other), ignore_errors=True)
                with contextlib.suppress(FileNotFoundError):  # a new Triton has no fingerprint memo yet
                    os.remove(os.path.join(caches, "kernel-cache", TOOLCHAIN_MEMO))
                return run_child(program_set, "jits", {**child_env(caches, workers, intercept, cross, path), **UPGRADE_ENV},
                                 cross)
            return run_child(program_set, shape, child_env(caches, workers, intercept, cross, path), cross)
        finally:
            shutil.rmtree(caches, ignore_errors=True)

    fresh("examples", "one", 1, False)
    results: dict[str, list[dict[str, Any]]] = {}
    for _ in range(repeat):
        for program_set, shape, path, workers, intercept in rows:
            results.setdefault(f"{program_set}/{shape}/{path}", []).append(
                fresh(program_set, shape, workers, intercept, path))
    return results


def summarize(results: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    return {name: {"times": {p: statistics.median(r["times"][p] for r in reports) for p in PHASES},
                   "compiles": reports[0].get("compiles"), "workers": reports[0].get("workers"),
                   "on_workers": statistics.median(r.get("processes", {}).get("worker", 0) for r in reports),
                   "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in reports),
                   "workers_rss_mib": statistics.median(r.get("workers_rss_mib", 0.0) for r in reports),
                   "ready_s": statistics.median(r.get("ready_s", 0.0) for r in reports),
                   "device": reports[0]["device"], "programs": reports[0]["programs"]}
            for name, reports in results.items()}


def ratios_of(summary: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """serial (and own) over each path compiling at once, and threads over processes, for lower and
    wall, per program set and shape."""
    ratios: dict[str, float | None] = {}
    for name in summary:
        base, path = name.rsplit("/", 1)
        if path in ("serial", "own"):
            continue
        for other in (o for o in ("serial", "own", "threads") if f"{base}/{o}" in summary and o != path):
            if other == "threads" and path != "processes":
                continue
            for phase in ("lower", "wall"):
                ours, theirs = summary[name]["times"][phase], summary[f"{base}/{other}"]["times"][phase]
                ratios[f"{base} {phase}: {other} / {path}"] = theirs / ours if ours else None
    return ratios


def print_table(summary: dict[str, dict[str, Any]], ratios: dict[str, float | None], cross: bool, repeat: int) -> None:
    print(f"cold start, {'cross-lowered for sm_90 (no GPU)' if cross else next(iter(summary.values()))['device']}, "
          f"{os.cpu_count()} CPUs, median of {repeat}")
    shown = ("lower", "wall") if cross else PHASES
    print(f"{'programs':<22}{'path':<11}{'workers':>8}{'compiles':>9}{'on workers':>11}"
          + "".join(f"{p:>12}" for p in shown) + f"{'peak RSS':>12}{'+ workers':>14}")
    for name, s in summary.items():
        program_set, shape, path = name.split("/")
        label = {"one": "one kernel", "module": "module", "jits": "9 jits", "upgrade": "9 jits, upgraded",
                 "two": "2 modules", "model": "module in a model"}[shape] \
            if program_set == "examples" \
            else f"ejkernel ({s['programs']} ops)"
        print(f"{label:<22}{path:<11}{s['workers'] or '-':>8}{s['compiles'] if s['compiles'] is not None else '-':>9}"
              + f"{s['on_workers']:>11.0f}" + "".join(f"{s['times'][p]:>11.2f}s" for p in shown)
              + f"{s['peak_rss_mib']:>8.0f} MiB{s['workers_rss_mib']:>10.0f} MiB")
    for name, s in summary.items():
        if s["ready_s"]:
            print(f"  {name}: its workers were ready {s['ready_s']:.2f} s after they were started (not in `lower`)")
    for what, ratio in ratios.items():
        print(f"  {what:<44} {ratio:.2f}x" if ratio else f"  {what}: -")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", nargs=2, metavar=("SET", "SHAPE"), help=argparse.SUPPRESS)
    parser.add_argument("--cross", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=0,
                        help="KERNEL_CACHE_COMPILE_WORKERS of the rows compiling at once (default: kernel-cache's "
                             "own: usable cores, at most 16)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--sets", default="examples,ejkernel")
    parser.add_argument("--paths", default=",".join(PATHS[:3]),
                        help=f"which of {', '.join(PATHS)} to measure (default: the first three)")
    parser.add_argument("--shapes", default=",".join(SHAPES[:4]),
                        help=f"which example programs of {', '.join(SHAPES)} to lower (upgrade: the 9 jits after a "
                             "run of them under another toolchain; two: two modules in turn, without a GPU only; "
                             "default: the first four)")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--timeline", action="store_true", help="record each compile's thread and times (--json)")
    parser.add_argument("--switch-interval", type=float, metavar="S",
                        help="children set sys.setswitchinterval(S) (Python's default is 0.005)")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.cross)))
        return
    cross = not has_gpu()
    if args.timeline:
        os.environ["BENCH_COLD_TIMELINE"] = "1"
    if args.switch_interval:
        os.environ["BENCH_COLD_SWITCH"] = str(args.switch_interval)
    paths, shapes = (tuple(p for p in text.split(",") if p) for text in (args.paths, args.shapes))
    for option, chosen, known in (("--paths", paths, PATHS), ("--shapes", shapes, SHAPES)):
        if set(chosen) - set(known):
            parser.error(f"{option}: unknown {', '.join(sorted(set(chosen) - set(known)))} (known: {', '.join(known)})")
    rows, skipped = plan_rows(args.sets.split(","), args.workers, cross, paths, shapes)
    results = measure(rows, args.repeat, cross)
    summary = summarize(results)
    ratios = ratios_of(summary)
    print_table(summary, ratios, cross, args.repeat)
    if skipped:
        print(f"ejkernel: skipped ({skipped})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cross": cross, "summary": summary, "ratios": ratios, "ejkernel_skipped": skipped,
                       "runs": results}, f, indent=2)


if __name__ == "__main__":
    main()
