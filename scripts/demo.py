"""The main job: a JAX program set calling Triton kernels through `lowering.triton_call`, run cold
(empty cache) and then warm, each in a fresh process, as consecutive training jobs would.

On a host without a GPU the programs are cross-lowered for CUDA (`--arch`, default sm_90): the
lowering is where jax-triton runs Triton and where kernel-cache serves kernels from its store.
With a GPU they are also compiled by XLA, run, and checked against jax.numpy references.
Usage: demo.py [--dir DIR] [--arch sm_90] [--keep]

Per program and phase the table says where its kernels came from: compiled, read from a level
(memory, disk, shared, remote), or served whole by the call's lowered-call record on a level (what a
warm phase shows). What a phase writes to stderr (the store's warnings: a remote that cannot be
reached, an unsigned remote) is passed on as it comes, marked with the phase, and a level that did
not serve as configured is named after the table.

The demo never deletes what it did not make: it writes to its own directory (.kernel-cache/demo in
the repo, whatever KERNEL_CACHE_DIR says), marks a directory it creates with a `.kernel-cache-demo`
file, and only ever empties a directory that carries that mark. `--dir` naming a directory that is
neither empty nor marked is refused (exit 2) and left untouched.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = ROOT / ".kernel-cache" / "demo"
MARKER = ".kernel-cache-demo"  # kernel_cache.levels.cache_marker.DEMO_MARKER: a cache directory may hold it
MARKER_TEXT = "kernel-cache demo cache: scripts/demo.sh empties this directory at each start (--keep keeps it)\n"


class DemoDirError(Exception):
    """The directory cannot be used by the demo; nothing in it was touched."""


def is_demo_dir(path: Path) -> bool:
    """Whether `path` carries the demo's marker: a regular file (lstat: a symbolic link does not
    count), owned by this user, with the text the demo writes."""
    marker = path / MARKER
    try:
        st = os.lstat(marker)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size != len(MARKER_TEXT.encode()):
            return False
        fd = os.open(marker, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as f:
        return f.read() == MARKER_TEXT.encode()


def _mark(path: Path) -> None:
    fd = os.open(path / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(MARKER_TEXT)


def prepare_demo_dir(path: Path, keep: bool = False) -> Path:
    """Make `path` ready to be the demo's cache and return it: a new or empty directory is created
    and marked; a marked one is emptied (all but the marker), or left as it is with `keep`. Any
    other path (a non-empty directory without the marker, a file, a dangling link) raises
    DemoDirError before anything is changed."""
    if not os.path.lexists(path):
        path.mkdir(parents=True)
        _mark(path)
        return path
    if not path.is_dir():
        raise DemoDirError(f"{path} exists and is not a directory")
    if is_demo_dir(path):
        if not keep:
            with os.scandir(path) as entries:
                for entry in entries:
                    if entry.name == MARKER:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path)
                    else:
                        os.unlink(entry.path)  # a link is removed itself, never its target
        return path
    with os.scandir(path) as entries:
        if any(True for _ in entries):
            raise DemoDirError(f"{path} is not empty and is not a demo cache (no {MARKER} file): not touching it; "
                               "pick a new or empty directory with --dir")
    _mark(path)
    return path


def _levels(store: Any) -> dict[str, Any]:
    """The store's levels at the end of a phase: each in use with where it is and how it was used
    then, each configured but unusable with why, and the remote's counters (errors, timeouts...)."""
    remote = store.level("remote")
    return {"used": [{"name": t.name, "location": t.location, "mode": t.mode} for t in store.levels],
            "unusable": {name: str(exc) for name, exc in store.unavailable.items()},
            "remote": dict(remote.counters) if remote is not None else None}


def _served(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What served one lowering, from the store's session counters around it."""
    return {"compiles": after["compiles"] - before["compiles"],
            "hits": {t: after["hits"][t] - before["hits"][t] for t in after["hits"]},
            "record_hits": {t: after["record_hits"][t] - before["record_hits"][t] for t in after["record_hits"]},
            "rejected": after["rejected"] - before["rejected"], "errors": after["errors"] - before["errors"]}


def phase() -> None:
    """In a child process: lower (and on a GPU, run) every program; print one JSON line."""
    t0 = time.perf_counter()
    import jax
    import numpy as np

    import kernel_cache
    from lowering import examples as ep

    gpu = any(d.platform == "gpu" for d in jax.devices())
    store = kernel_cache.default_store()
    refs = ep.references() if gpu else {}
    rows = []
    for label, fn, shapes in ep.programs():
        before = store.stats.session()
        start = time.perf_counter()
        lowered = jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",))
        seconds = time.perf_counter() - start
        row = {"program": label, "lower": seconds, **_served(before, store.stats.session())}
        if gpu:
            inputs = ep.random_inputs(shapes)
            out = lowered.compile()(*inputs)
            want = refs[label](*inputs)
            row["max_err"] = float(np.max(np.abs(np.asarray(out, np.float32) - np.asarray(want, np.float32))))
        rows.append(row)
    print(json.dumps({"rows": rows, "wall": time.perf_counter() - t0, "gpu": gpu, "levels": _levels(store)}))


class DemoPhaseError(Exception):
    """A phase's process failed; what it wrote to stderr has been shown."""


def _pass_on(stream: IO[str], name: str) -> None:
    """Write each line of a phase's stderr to ours as it comes, marked with the phase."""
    for line in stream:
        sys.stderr.write(f"[{name} phase] {line}")
        sys.stderr.flush()


def run_phase(name: str, env: dict[str, str]) -> dict[str, Any]:
    """Run one phase in a fresh process and return its result. Its stderr is passed on as it comes
    (a remote that cannot be reached, an unsigned remote: the store's warnings are said there)."""
    sys.stdout.flush()  # what was printed comes before what the phase says
    proc = subprocess.Popen([sys.executable, __file__, "--phase"], env=env, cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    pump = threading.Thread(target=_pass_on, args=(proc.stderr, name), daemon=True)
    pump.start()
    out = proc.stdout.read()
    returncode = proc.wait()
    pump.join()
    lines = out.strip().splitlines()
    if returncode != 0 or not lines:
        raise DemoPhaseError(f"the {name} phase failed (exit {returncode}); its stderr is above")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _shown(path: Path) -> str:
    """`path` relative to the working directory when it is below it (as the user would type it)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def served_by(row: dict[str, Any]) -> str:
    """Where one program's kernels came from in a phase (LEGEND says how to read it)."""
    parts = [f"compiled {row['compiles']}"] if row["compiles"] else []
    parts += [f"{level} {n}" for level, n in row["hits"].items() if n]
    parts += [f"{level} record" if n == 1 else f"{level} {n} records" for level, n in row["record_hits"].items() if n]
    parts += [f"{what} {row[what]}" for what in ("rejected", "errors") if row.get(what)]
    return ", ".join(parts) or "no lookup"


LEGEND = ("cold, warm: where each program's kernels came from in that phase. compiled N: Triton compiled N\n"
          "kernels; <level> N: N kernels read from that level (memory, disk, shared, remote); <level> record:\n"
          "the call's lowered-call record there served the whole call, its kernels unread; rejected N: entries\n"
          "refused for who wrote them; errors N: lookups that failed; no lookup: kernel-cache was not asked.")


def total(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The rows' counts added up (the table's total row)."""
    summed: dict[str, Any] = {"compiles": 0, "rejected": 0, "errors": 0, "hits": {}, "record_hits": {}}
    for row in rows:
        for what in ("compiles", "rejected", "errors"):
            summed[what] += row.get(what, 0)
        for counts in ("hits", "record_hits"):
            for level, n in row[counts].items():
                summed[counts][level] = summed[counts].get(level, 0) + n
    return summed


def level_notes(name: str, levels: dict[str, Any]) -> list[str]:
    """What went wrong with the cache levels in one phase, a line each: a level configured but not
    used, a level skipped, a remote's errors and timeouts. Empty when all was well."""
    notes = [f"{name} phase: {level} not used: {why}" for level, why in levels["unusable"].items()]
    notes += [f"{name} phase: {t['name']} {t['location']} ended {t['mode']}" for t in levels["used"]
              if t["mode"].startswith("skipped")]
    remote = levels.get("remote") or {}
    trouble = [f"{remote[what]} {what.replace('_', ' ')}" for what in ("errors", "timeouts", "rejected", "breaker_openings")
               if remote.get(what)]
    if trouble:
        notes.append(f"{name} phase: remote {', '.join(trouble)} (hits {remote.get('hits', 0)}, misses "
                     f"{remote.get('misses', 0)}): its lookups fell back to the local levels and compiling")
    return notes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=str(DEFAULT_DIR),
                    help="the demo's cache: a new, empty or earlier demo directory (default .kernel-cache/demo; "
                         "KERNEL_CACHE_DIR is not used)")
    ap.add_argument("--arch", default=os.environ.get("KERNEL_CACHE_TARGET_ARCH", "sm_90"),
                    help="GPU target when no GPU is visible (default sm_90)")
    ap.add_argument("--keep", action="store_true", help="do not empty the demo's cache dir first")
    ap.add_argument("--phase", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


USERS_CACHES = ("KERNEL_CACHE_DIR", "KERNEL_CACHE_SHARED_DIR")


def phase_env(cache: Path, arch: str, environ: dict[str, str]) -> dict[str, str]:
    """The phases' environment: `environ` with the user's own cache directories replaced by the demo's."""
    env = {k: v for k, v in environ.items() if k not in USERS_CACHES}
    env.update({"KERNEL_CACHE_DIR": str(cache), "KERNEL_CACHE_TARGET_ARCH": arch,
                "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), environ.get("PYTHONPATH")) if p)})
    return env


def print_table(cold: list[dict[str, Any]], warm: list[dict[str, Any]], gpu: bool) -> None:
    """Per program: lowering seconds cold and warm, and where its kernels came from in each phase."""
    cells = [(served_by(c), served_by(w)) for c, w in zip(cold, warm)]
    sums = (served_by(total(cold)), served_by(total(warm)))
    wide = [max(len(row[i]) for row in [*cells, sums, ("cold", "warm")]) + 2 for i in (0, 1)]
    print(f"{'program':<22}{'cold lower s':>13}{'warm lower s':>13}{'speed-up':>10}  {'cold':<{wide[0]}}{'warm':<{wide[1]}}"
          f"{'max |err|' if gpu else ''}".rstrip())
    for c, w, (c_by, w_by) in zip(cold, warm, cells):
        ratio = c["lower"] / w["lower"] if w["lower"] else float("inf")
        err = f"{w['max_err']:.2e}" if "max_err" in w else ""
        print(f"{c['program']:<22}{c['lower']:>13.4f}{w['lower']:>13.4f}{ratio:>9.1f}x  {c_by:<{wide[0]}}{w_by:<{wide[1]}}{err}"
              .rstrip())
    cold_sum = sum(r["lower"] for r in cold)
    warm_sum = sum(r["lower"] for r in warm)
    print(f"{'total':<22}{cold_sum:>13.4f}{warm_sum:>13.4f}{cold_sum / warm_sum:>9.1f}x  {sums[0]:<{wide[0]}}{sums[1]}")


def _shown_location(location: str) -> str:
    """A level's location as the user would type it: a directory below the working directory relative to it."""
    return _shown(Path(location)) if location.startswith("/") else location


def report(cold: dict[str, Any], warm: dict[str, Any], arch: str) -> None:
    """The cache's levels, the table, how to read it, and what went wrong with a level."""
    print("levels: " + ", ".join(f"{t['name']} {_shown_location(t['location'])}" if t["name"] != "memory" else "memory"
                                 for t in cold["levels"]["used"]))
    where = "on the GPU" if cold["gpu"] else f"cross-lowered for {arch} (no GPU here)"
    print(f"lowering {where}; each phase is a fresh process\n")
    print_table(cold["rows"], warm["rows"], cold["gpu"])
    print(f"\n{LEGEND}")
    notes = level_notes("cold", cold["levels"]) + level_notes("warm", warm["levels"])
    if notes:
        print("\ncache levels that did not serve as configured:")
        for note in notes:
            print(f"  {note}")


def start_line(cache: Path, keep: bool) -> str:
    """The demo's first line of its own: its programs, its cache, and whether that was emptied first."""
    state = ("--keep: not emptied, so the cold phase may find what an earlier run left" if keep else
             "emptied at each start, so the cold phase compiles every kernel; --keep keeps it")
    return f"kernel-cache demo: 9 JAX programs / 14 Triton kernels, cache dir {_shown(cache)} ({state})"


def main() -> None:
    args = parse_args()
    if args.phase:
        return phase()
    cache = Path(os.path.abspath(args.dir))
    try:
        prepare_demo_dir(cache, args.keep)
    except (DemoDirError, OSError) as e:
        print(f"demo: {e}", file=sys.stderr)
        sys.exit(2)
    env = phase_env(cache, args.arch, dict(os.environ))
    print(start_line(cache, args.keep))
    ignored = [k for k in USERS_CACHES if os.environ.get(k)]
    if ignored:
        print(f"  ({' and '.join(ignored)} not used: the demo writes only to its own directory; --dir picks another)")
    try:
        cold = run_phase("cold", env)
        warm = run_phase("warm", env)
    except DemoPhaseError as e:
        print(f"demo: {e}", file=sys.stderr)
        sys.exit(1)
    report(cold, warm, args.arch)
    print(f"\nprocess wall (imports included): cold {cold['wall']:.2f} s, warm {warm['wall']:.2f} s")
    cachectl = Path(sys.executable).parent / "cachectl"
    print(f"inspect the cache: {_shown(cachectl) if cachectl.exists() else 'python -m kernel_cache'} --dir {_shown(cache)} list")
    if cachectl.exists():
        print(f"  (or `source {_shown(cachectl.parent / 'activate')}` once, then: cachectl --dir {_shown(cache)} list)")


if __name__ == "__main__":
    main()
