"""Which parts of a Triton compile hold the GIL, and do threads or processes overlap K cold compiles?

Two measurements that decide how cold compiles run in parallel, for sm_90 on any host (no GPU needed):

1. Per stage of one compile (setup, the AST->TTIR front end, then each stage of the backend's
   `add_stages`, discovered from its stages dict, ptxas last; `to-text` is our driver printing each
   MLIR module): wall time, CPU per wall (this process's threads, then ptxas's), and whether the stage
   releases the GIL. The compile runs in a thread while this thread spins a pure-Python counter, the
   two pinned to different cores: `progress` is the share of the stage's wall time in which the spinner
   was not waiting for the GIL (its CPU time, shown alone as `spin cpu`, plus the time it was ready but
   another process had the CPU, from Linux's schedstat), `slowdown` the stage's time beside the spinner
   over its time alone (both in a pinned thread), and `overlap` = progress + 1/slowdown - 1. The GIL column reads
   progress: `released` (~1: the spinner ran on), `turns` (~0.5: Python bytecode, the two swap every
   switch interval), `blocks` (~0: C/C++ keeping the GIL). Three controls (sleep, a Python loop, a C
   builtin) show each case on this interpreter. A stage that releases the GIL can still be slowed
   beside a Python thread: each re-acquisition waits up to the switch interval (5 ms).
2. K distinct compiles (the example kernels of compiler/examples.py with a block constexpr varied per
   round) serially, on ThreadPoolExecutor(N) and on a spawn ProcessPoolExecutor(N), for N in 1, 2 and
   the CPU count (at most 16). A process pool's start-up (interpreter, `import triton`, our imports,
   one warm-up compile per worker) is timed apart from its compiles.

Compiles go through compiler.compile.compile_spec or the shim's run_stages (no kernel-cache store,
no Triton cache: each run gets a fresh TRITON_CACHE_DIR, checked empty afterwards).
Long (~570 lines) because it holds both measurements, their tables and the conclusion.

  python scripts/measure_compile_parallelism.py [-k 22] [--workers 1,2,16] [--json]
  python scripts/measure_compile_parallelism.py --show result.json   (the tables of a saved --json run)
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

TARGET = "sm_90"
# per round, the value of the one constexpr varied in each example kernel (the first: the examples as written)
_VARIED = {"BLOCK": (1024, 512, 2048, 256), "BLOCK_K": (32, 64, 16, 128), "BLOCK_N": (64, 32, 128, 16)}
_LABELS = {"setup": "setup (context, dialects)", "ast": "AST->TTIR front end", "ttir": "TTIR passes",
           "ttgir": "TTIR->TTGIR", "llir": "TTGIR->LLIR", "ptx": "LLIR->PTX (LLVM)",
           "cubin": "PTX->cubin (ptxas)", "to-text": "to-text (our driver)"}
_CHUNK = 1000  # spinner iterations between two clock reads


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---- the kernel set -------------------------------------------------------------------------------

@functools.cache
def build_specs(k: int) -> list[tuple[str, Any]]:
    """K (label, KernelSpec), all distinct: round r of the example set varies one constexpr."""
    from compiler import make_spec
    from compiler.examples import example_calls

    calls = example_calls()
    rounds = len(next(iter(_VARIED.values())))
    if k > rounds * len(calls):
        raise SystemExit(f"-k is at most {rounds * len(calls)} ({rounds} rounds of {len(calls)} example kernels)")
    out = []
    for i in range(k):
        r = i // len(calls)
        label, kernel, args, cst, launch = calls[i % len(calls)]
        cst = dict(cst)
        name = next(n for n in _VARIED if n in cst)
        cst[name] = _VARIED[name][r]
        out.append((f"{label} {name}={cst[name]}", make_spec(kernel, args, cst, target=TARGET, **launch)))
    if len({spec.describe() for _, spec in out}) != k:
        raise SystemExit("the kernel set has duplicate specs")
    return out


def warmup_spec() -> Any:
    from compiler import make_spec
    from compiler.examples import add_kernel

    return make_spec(add_kernel, ["*fp32", "*fp32", 4096, "*fp32"], {"BLOCK": 64}, target=TARGET)


def fresh_triton_cache(work: str, name: str) -> str:
    path = os.path.join(work, name)
    os.makedirs(path)
    os.environ["TRITON_CACHE_DIR"] = path  # children of a spawn pool inherit it
    return path


def cache_files(path: str) -> int:
    return sum(len(files) for _, _, files in os.walk(path))


# ---- per-stage timing -----------------------------------------------------------------------------

_ACTIVE = threading.local()


class SpinnerClock:
    """The spinner thread's CPU time and run-queue wait, read from the measured thread: its CPU clock
    (exact), and the wait from /proc/self/task/TID/schedstat (Linux; 0 elsewhere) for time it was ready
    to run but another process had the CPU, which is not the GIL's doing."""

    def __init__(self, ident: int, native_id: int) -> None:
        self.clock = time.pthread_getcpuclockid(ident)
        try:
            self.fd: int | None = os.open(f"/proc/self/task/{native_id}/schedstat", os.O_RDONLY)
        except OSError:
            self.fd = None

    def read(self) -> tuple[float, float]:
        cpu = time.clock_gettime(self.clock)
        if self.fd is None:
            return cpu, 0.0
        try:
            return cpu, int(os.pread(self.fd, 128, 0).split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return cpu, 0.0

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)


def _sample() -> tuple[float, ...]:
    """wall, this thread's CPU, the process's CPU, its children's CPU, the spinner's CPU and queue wait."""
    t = os.times()
    spinner = getattr(_ACTIVE, "spinner", None)
    spun = spinner.read() if spinner is not None else (0.0, 0.0)
    return (time.perf_counter(), time.thread_time(), time.process_time(), t.children_user + t.children_system,
            *spun)


class Recorder:
    """Consecutive named segments of one compile, in the thread that runs it."""

    def __init__(self) -> None:
        self.segments: list[tuple[str, tuple[float, ...], tuple[float, ...]]] = []
        self.name: str | None = None
        self.start: tuple[float, ...] = ()

    def switch(self, name: str | None) -> None:
        if name == self.name:
            return
        now = _sample()
        if self.name is not None:
            self.segments.append((self.name, self.start, now))
        self.name, self.start = name, now


def _timed_stage(ext: str, fn: Any) -> Any:
    def run(src: Any, metadata: Any) -> Any:
        rec = getattr(_ACTIVE, "recorder", None)
        if rec is not None:
            rec.switch(ext)
        out = fn(src, metadata)
        if rec is not None:
            rec.switch("to-text")  # run_stages prints the module next
        return out
    return run


def install_stage_timers() -> bool:
    """Wrap every stage the backend adds (whatever this Triton names them). Without it the segments
    still come from run_stages' on_stage callback, each stage then including its to-text."""
    from compiler import parse_target
    from compiler import triton_compat as tc

    backend = tc.make_backend(parse_target(TARGET))
    if "add_stages" in vars(backend):
        return True
    original = backend.add_stages

    def add_stages(stages: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        original(stages, *args, **kwargs)
        for ext, fn in list(stages.items()):
            stages[ext] = _timed_stage(ext, fn)
    try:
        backend.add_stages = add_stages
    except (AttributeError, TypeError):
        return False
    return True


def recorded_compile(spec: Any) -> Recorder:
    """compile_spec's Triton part (options, ASTSource, run_stages) with every segment timed."""
    from compiler import triton_compat as tc

    rec = Recorder()
    _ACTIVE.recorder = rec
    try:
        rec.switch("setup")
        parsed = tc.parse_options(spec.target, spec.triton_options())
        src = tc.ast_source(spec.kernel, dict(spec.signature), dict(spec.constexprs), dict(spec.attrs))
        tc.run_stages(src, spec.target, parsed, rec.switch)
        rec.switch(None)
    finally:
        _ACTIVE.recorder = None
    return rec


def _spin(stop: threading.Event) -> int:
    """Count in Python until `stop`. A thread waiting for the GIL sleeps on a condition variable, so
    the spinner's CPU time (plus run-queue wait) per wall time is the share of the time it was not held
    back by the GIL. Unlike a count of steps, it does not depend on the clock speed, which varied 2-5x
    between runs on the VMs tried."""
    chunks = 0
    while not stop.is_set():
        for _ in range(_CHUNK):
            pass
        chunks += 1
    return chunks


def pick_cpus() -> dict[str, Any]:
    """Two CPUs for the spinner and the measured thread, on different physical cores where the
    topology says so (an SMT sibling would slow the spinner by sharing its core, not by the GIL)."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: no pinning
        return {"spinner": None, "measured": None, "separate_cores": None}

    def core(cpu: int) -> tuple[str, str]:
        base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
        try:
            with open(base + "physical_package_id") as pkg, open(base + "core_id") as cid:
                return pkg.read().strip(), cid.read().strip()
        except OSError:
            return "?", str(cpu)
    if len(allowed) < 2:
        return {"spinner": None, "measured": None, "separate_cores": None}
    a = allowed[0]
    b = next((c for c in allowed[1:] if core(c) != core(a)), allowed[1])
    return {"spinner": a, "measured": b, "separate_cores": core(a) != core(b)}


def _pin(cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})  # Linux: the calling thread only


def in_thread(fn: Any, cpu: int | None, spin: bool) -> Any:
    """fn() run in a thread pinned to `cpu`; with `spin`, this thread spins meanwhile and the
    thread's samples (_sample) include the spinner's clocks."""
    stop = threading.Event()
    box: dict[str, Any] = {}
    spinner = SpinnerClock(threading.get_ident(), threading.get_native_id()) if spin else None

    def work() -> None:
        try:
            _pin(cpu)
            _ACTIVE.spinner = spinner
            box["result"] = fn()
        except BaseException as exc:  # re-raised below, in this thread
            box["error"] = exc
        finally:
            _ACTIVE.spinner = None
            stop.set()
    thread = threading.Thread(target=work, name="measured")
    thread.start()
    if spin:
        _spin(stop)
    thread.join()
    if spinner is not None:
        spinner.close()
    if "error" in box:
        raise box["error"]
    return box["result"]


def _row(name: str, solo: float, beside: float, ran: float, queued: float, **extra: Any) -> dict[str, Any]:
    """`ran`, `queued`: the spinner's CPU seconds and run-queue seconds while the stage ran beside it."""
    slowdown = beside / solo if solo > 0 else float("nan")
    progress = (ran + queued) / beside if beside > 0 else float("nan")
    return {"stage": name, "solo_s": solo, "beside_s": beside, "progress": progress,
            "spinner_cpu": ran / beside if beside > 0 else float("nan"), "slowdown": slowdown,
            "overlap": progress + 1 / slowdown - 1 if slowdown > 0 else float("nan"), **extra}


def controls(cpus: dict[str, Any]) -> list[dict[str, Any]]:
    def py_loop() -> None:
        n = 0
        for i in range(3_000_000):
            n += i

    def spanned(fn: Any) -> Any:
        return lambda: (_sample(), fn(), _sample())

    rows = []
    for name, fn in (("control: time.sleep", lambda: time.sleep(0.25)), ("control: Python loop", py_loop),
                     ("control: C builtin sum()", lambda: sum(range(30_000_000)))):
        a, _, b = in_thread(spanned(fn), cpus["measured"], spin=False)
        a2, _, b2 = in_thread(spanned(fn), cpus["measured"], spin=True)
        rows.append(_row(name, b[0] - a[0], b2[0] - a2[0], b2[4] - a2[4], b2[5] - a2[5]))
    return rows


def _add_segments(segments: list[tuple[str, tuple[float, ...], tuple[float, ...]]],
                  into: dict[int, dict[str, float]]) -> float:
    """Add each stage's difference of clock `i` (end minus start) to `into[i][stage]`; the wall seconds."""
    for name, a, b in segments:
        for i, totals in into.items():
            totals[name] = totals.get(name, 0.0) + b[i] - a[i]
    return sum(b[0] - a[0] for _, a, b in segments)


def measure_stages(specs: list[tuple[str, Any]], cpus: dict[str, Any]) -> dict[str, Any]:
    """Every spec compiled alone, then beside the spinner; per stage totals over the specs."""
    solo_t: dict[str, float] = {}
    beside_t: dict[str, float] = {}
    cpu: dict[str, float] = {}
    child_cpu: dict[str, float] = {}
    ran: dict[str, float] = {}  # the spinner's CPU seconds during the stage, beside it
    queued: dict[str, float] = {}  # its seconds ready to run but without a CPU
    per_kernel = []
    for label, spec in specs:
        rec = in_thread(lambda spec=spec: recorded_compile(spec), cpus["measured"], spin=False)
        total = _add_segments(rec.segments, {0: solo_t, 2: cpu, 3: child_cpu})
        rec2 = in_thread(lambda spec=spec: recorded_compile(spec), cpus["measured"], spin=True)
        total2 = _add_segments(rec2.segments, {0: beside_t, 4: ran, 5: queued})
        per_kernel.append({"kernel": label, "solo_s": total, "beside_s": total2,
                           "stages_s": {n: b[0] - a[0] for n, a, b in rec.segments}})
        say(f"  {label}: {total * 1e3:.0f} ms alone, {total2 * 1e3:.0f} ms beside the spinner")
    n = len(specs)
    compile_s = sum(solo_t.values())
    rows = []
    for name in solo_t:
        rows.append(_row(name, solo_t[name] / n, beside_t.get(name, 0.0) / n, ran.get(name, 0.0) / n,
                         queued.get(name, 0.0) / n,
                         share=solo_t[name] / compile_s, cpu_per_wall=cpu[name] / solo_t[name] if solo_t[name] else 0.0,
                         ptxas_cpu_per_wall=child_cpu[name] / solo_t[name] if solo_t[name] else 0.0))
    return {"kernels": n, "compile_s": compile_s / n, "stages": rows, "per_kernel": per_kernel}


# ---- whole compiles: serial, threads, processes ---------------------------------------------------

def compile_index(i: int, k: int) -> dict[str, Any]:
    from compiler.compile import compile_spec

    spec = build_specs(k)[i][1]
    start = time.time()
    art = compile_spec(spec)
    end = time.time()
    if not art.blobs.get("cubin"):
        raise RuntimeError(f"no cubin for {spec.describe()}")
    return {"i": i, "pid": os.getpid(), "start": start, "end": end, "seconds": end - start}


def _worker_init(k: int, ready: Any) -> None:
    if os.environ.get("MEASURE_SWITCH_INTERVAL"):
        sys.setswitchinterval(float(os.environ["MEASURE_SWITCH_INTERVAL"]))
    t0 = time.perf_counter()
    import triton  # noqa: F401

    t1 = time.perf_counter()
    import compiler.compile
    import compiler.examples  # noqa: F401

    t2 = time.perf_counter()
    build_specs(k)
    from compiler.compile import compile_spec

    compile_spec(warmup_spec())
    t3 = time.perf_counter()
    ready.put({"pid": os.getpid(), "import_triton_s": t1 - t0, "import_ours_s": t2 - t1, "warmup_s": t3 - t2})


def _noop() -> int:
    return os.getpid()


def _summary(mode: str, n: int, wall: float, results: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    per = [r["seconds"] for r in results]
    return {"mode": mode, "workers": n, "compile_wall_s": wall, "per_compile_mean_s": statistics.mean(per),
            "distinct_workers": len({(r["pid"], r.get("thread")) for r in results}), **extra}


def run_serial(k: int) -> dict[str, Any]:
    start = time.perf_counter()
    results = [compile_index(i, k) for i in range(k)]
    return _summary("serial", 1, time.perf_counter() - start, results)


def run_threads(k: int, n: int) -> dict[str, Any]:
    def one(i: int) -> dict[str, Any]:
        return {**compile_index(i, k), "thread": threading.get_ident()}
    start = time.perf_counter()
    with ThreadPoolExecutor(n, thread_name_prefix="compile") as pool:
        results = list(pool.map(one, range(k)))
    return _summary("threads", n, time.perf_counter() - start, results)


def run_processes(k: int, n: int) -> dict[str, Any]:
    import queue

    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Queue()
    start = time.perf_counter()
    pool = ProcessPoolExecutor(n, mp_context=ctx, initializer=_worker_init, initargs=(k, ready))
    try:
        noops = [pool.submit(_noop) for _ in range(n)]  # one per worker, so that all n start now
        workers = []
        for _ in range(n):
            try:
                workers.append(ready.get(timeout=120))
            except queue.Empty:
                break
        for f in noops:
            f.result(timeout=120)
        startup = time.perf_counter() - start
        t0 = time.perf_counter()
        results = list(pool.map(compile_index, range(k), [k] * k))
        wall = time.perf_counter() - t0
    finally:
        t1 = time.perf_counter()
        pool.shutdown()
        shutdown = time.perf_counter() - t1
    return _summary("processes", n, wall, results, startup_s=startup, shutdown_s=shutdown,
                    workers_ready=len(workers),
                    import_triton_s=statistics.mean(w["import_triton_s"] for w in workers) if workers else None,
                    import_ours_s=statistics.mean(w["import_ours_s"] for w in workers) if workers else None,
                    warmup_compile_s=statistics.mean(w["warmup_s"] for w in workers) if workers else None)


# ---- report ---------------------------------------------------------------------------------------

def gil_class(row: dict[str, Any]) -> str:
    """By the spinner's progress: 'released' (it ran on), 'turns' (Python bytecode: the two take turns
    every switch interval), 'blocks' (C/C++ keeping the GIL: the spinner stopped)."""
    return "released" if row["progress"] >= 0.7 else "turns" if row["progress"] >= 0.15 else "blocks"


def conclusion(stages: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    rows = stages["stages"]
    by_class = {c: [r for r in rows if gil_class(r) == c] for c in ("turns", "blocks", "released")}
    share = {c: sum(r["share"] for r in group) for c, group in by_class.items()}
    names = {c: ", ".join(r["stage"] for r in group) or "none" for c, group in by_class.items()}
    held = share["turns"] + share["blocks"]
    slowed = [r["stage"] for r in by_class["released"] if r["slowdown"] >= 1.5]
    fe = next((r for r in rows if r["stage"] == "ast"), None)
    serial = next(r for r in runs if r["mode"] == "serial")["compile_wall_s"]
    top = max(r["workers"] for r in runs)
    thr = next(r for r in runs if r["mode"] == "threads" and r["workers"] == top)
    prc = next(r for r in runs if r["mode"] == "processes" and r["workers"] == top)
    k = thr["k"]
    fe_text = (f"front end {'releases' if gil_class(fe) == 'released' else 'holds'} the GIL "
               f"({fe['share']:.0%} of a compile)" if fe else "no front-end stage seen")
    text = (f"{fe_text}; GIL held: {names['turns']} (Python, {share['turns']:.0%}), {names['blocks']} "
            f"(C++, {share['blocks']:.0%}) -> threads can speed up at most {1 / held if held else float('inf'):.1f}x; "
            f"released: {names['released']} ({share['released']:.0%})")
    if slowed:
        text += f", though {', '.join(slowed)} ran >=1.5x slower beside a Python thread (GIL re-acquisition)"
    text += (f"; with N={top}, threads speed up K={k} compiles by {serial / thr['compile_wall_s']:.2f}x, "
             f"processes by {serial / prc['compile_wall_s']:.2f}x (+{prc['startup_s']:.1f} s start-up: "
             f"{serial / (prc['compile_wall_s'] + prc['startup_s']):.2f}x end to end)")
    gap = thr["compile_wall_s"] / k - prc["compile_wall_s"] / k
    if gap > 0:
        text += f"; processes pay off from ~{prc['startup_s'] / gap:.0f} kernels on (start-up / per-kernel gain)"
    else:
        text += "; processes never pay off here (no faster per kernel than threads)"
    return text


def print_report(result: dict[str, Any]) -> None:
    env = result["environment"]
    print(f"Python {env['python']}, Triton {env['triton']}, {env['cpus']} CPUs, target {TARGET}, K={result['k']}, "
          f"load average {env['loadavg_before'][0]:.1f} before, {env['loadavg_after'][0]:.1f} after, "
          f"switch interval {env.get('switch_interval_s', 0.005) * 1e3:g} ms")
    st = result["stages"]
    print(f"\nPer stage, mean over the {st['kernels']} example kernels ({st['compile_s'] * 1e3:.0f} ms a compile); "
          "progress = share of the stage's time the spinner was not waiting for the GIL")
    pinned = env.get("pinned_cpus") or {}
    if pinned.get("spinner") is not None:
        print(f"(spinner on CPU {pinned['spinner']}, measured thread on CPU {pinned['measured']}, "
              f"{'separate physical cores' if pinned['separate_cores'] else 'possibly SMT siblings'})")
    print(f"{'stage':<28}{'ms':>8}{'share':>7}{'cpu/wall':>9}{'ptxas':>7}{'spin cpu':>9}{'progress':>9}"
          f"{'slowdown':>9}{'overlap':>8}  GIL")
    for r in st["stages"] + result["controls"]:
        label = _LABELS.get(r["stage"], r["stage"])
        share = f"{r['share']:.0%}" if "share" in r else ""
        cpu = f"{r['cpu_per_wall']:.2f}" if "cpu_per_wall" in r else ""
        ptxas = f"{r['ptxas_cpu_per_wall']:.2f}" if "ptxas_cpu_per_wall" in r else ""
        spin = r.get("spinner_cpu", r["progress"])
        print(f"{label:<28}{r['solo_s'] * 1e3:>8.1f}{share:>7}{cpu:>9}{ptxas:>7}{spin:>9.2f}{r['progress']:>9.2f}"
              f"{r['slowdown']:>9.2f}{r['overlap']:>8.2f}  {gil_class(r)}")
    print(f"\nK={result['k']} compiles (first-compile overhead in a process: {result['first_compile_extra_s']:.2f} s)")
    print(f"{'mode':<10}{'N':>3}{'compile s':>11}{'speedup':>9}{'per-compile s':>15}{'start-up s':>12}"
          f"{'import triton':>15}{'warm-up':>9}")
    serial = next(r for r in result["runs"] if r["mode"] == "serial")["compile_wall_s"]
    for r in result["runs"]:
        up = f"{r['startup_s']:.2f}" if "startup_s" in r else ""
        imp = f"{r['import_triton_s']:.2f}" if r.get("import_triton_s") is not None else ""
        warm = f"{r['warmup_compile_s']:.2f}" if r.get("warmup_compile_s") is not None else ""
        print(f"{r['mode']:<10}{r['workers']:>3}{r['compile_wall_s']:>11.2f}{serial / r['compile_wall_s']:>8.2f}x"
              f"{r['per_compile_mean_s']:>15.3f}{up:>12}{imp:>15}{warm:>9}")
    load = max(env["loadavg_before"][0], env["loadavg_after"][0])
    if load > 0.5 * env["cpus"]:
        print(f"\nWARNING: other work shares these CPUs (load average up to {load:.1f} on {env['cpus']} CPUs): "
              f"timings are noisy")
    print(f"\nConclusion: {result['conclusion']}")


def main() -> int:
    cpus = os.cpu_count() or 1
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", type=int, default=22, help="distinct kernels per whole-compile run (default 22)")
    parser.add_argument("--workers", default=",".join(str(n) for n in sorted({1, 2, min(cpus, 16)})),
                        help="comma-separated pool sizes (default: 1, 2 and the CPU count, at most 16)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON (progress goes to stderr)")
    parser.add_argument("--switch-interval", type=float, metavar="S",
                        help="sys.setswitchinterval for the run and its workers (default: Python's, 0.005)")
    parser.add_argument("--show", metavar="FILE", help="print the tables of a saved --json result and exit")
    args = parser.parse_args()
    if args.show:
        with open(args.show) as f:
            saved = json.load(f)
        saved["conclusion"] = conclusion(saved["stages"], saved["runs"])  # as this version words it
        print_report(saved)
        return 0
    workers = sorted({int(n) for n in args.workers.split(",")})
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
        os.environ["MEASURE_SWITCH_INTERVAL"] = str(args.switch_interval)  # for the spawned workers
    work = tempfile.mkdtemp(prefix="measure-compile-")
    began = time.perf_counter()
    load_before = os.getloadavg()
    try:
        fresh_triton_cache(work, "triton-setup")
        import triton

        from compiler.compile import compile_spec

        specs = build_specs(args.k)
        timers = install_stage_timers()
        t0 = time.perf_counter()
        compile_spec(warmup_spec())
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        compile_spec(warmup_spec())
        first_extra = first - (time.perf_counter() - t0)

        pinned = pick_cpus()
        main_affinity = os.sched_getaffinity(0) if pinned["spinner"] is not None else None
        _pin(pinned["spinner"])
        try:
            say("controls ...")
            ctl = controls(pinned)
            say("per-stage timing and GIL check ...")
            fresh_triton_cache(work, "triton-stages")
            from compiler.examples import example_calls

            stages = measure_stages(specs[:len(example_calls())], pinned)
        finally:
            if main_affinity is not None:
                os.sched_setaffinity(0, main_affinity)  # the pools' threads and processes inherit it

        runs = []
        cache_dirs = []
        say("serial ...")
        cache_dirs.append(fresh_triton_cache(work, "triton-serial"))
        runs.append({**run_serial(args.k), "k": args.k})
        for n in workers:
            say(f"threads N={n} ...")
            cache_dirs.append(fresh_triton_cache(work, f"triton-threads-{n}"))
            runs.append({**run_threads(args.k, n), "k": args.k})
        for n in workers:
            say(f"processes N={n} ...")
            cache_dirs.append(fresh_triton_cache(work, f"triton-processes-{n}"))
            runs.append({**run_processes(args.k, n), "k": args.k})
        result = {
            "environment": {"python": platform.python_version(), "triton": triton.__version__, "cpus": cpus,
                            "platform": platform.platform(), "stage_timers": timers,
                            "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                            "switch_interval_s": sys.getswitchinterval(), "pinned_cpus": pinned},
            "k": args.k, "first_compile_extra_s": first_extra,
            "controls": ctl, "stages": stages, "runs": runs,
            "triton_cache_files": sum(cache_files(d) for d in cache_dirs),
        }
        result["conclusion"] = conclusion(stages, runs)
        result["seconds"] = time.perf_counter() - began
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_report(result)
        print(f"(ran {result['seconds']:.0f} s; files written to the Triton caches: {result['triton_cache_files']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
