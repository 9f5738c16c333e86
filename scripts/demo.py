"""The main job: a JAX program set calling Triton kernels through `lowering.triton_call`, run cold
(empty cache) and then warm, each in a fresh process, as consecutive training jobs would.

On a host without a GPU the programs are cross-lowered for CUDA (`--arch`, default sm_90): the
lowering is where jax-triton runs Triton and where kernel-cache serves kernels from its store.
With a GPU they are also compiled by XLA, run, and checked against jax.numpy references.
Usage: demo.py [--dir DIR] [--arch sm_90] [--keep]

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
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = ROOT / ".kernel-cache" / "demo"
MARKER = ".kernel-cache-demo"  # kernel_cache.cache_marker.DEMO_MARKER: a cache directory may hold it
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


def run_phase(env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--phase"], env=env, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"demo phase failed:\n{out.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _shown(path: Path) -> str:
    """`path` relative to the working directory when it is below it (as the user would type it)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _served_by(row: dict[str, Any]) -> str:
    if row["compiles"]:
        return f"compiled {row['compiles']}"
    levels = [f"{t} {n}" for t, n in row["hits"].items() if n]
    return ", ".join(levels) or "-"


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
    print(f"kernel-cache demo: 9 JAX programs / 14 Triton kernels, cache dir {_shown(cache)}"
          + (" (--keep: not emptied)" if args.keep else ""))
    ignored = [k for k in USERS_CACHES if os.environ.get(k)]
    if ignored:
        print(f"  ({' and '.join(ignored)} not used: the demo writes only to its own directory; --dir picks another)")
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
    cachectl = Path(sys.executable).parent / "cachectl"
    print(f"inspect the cache: {_shown(cachectl) if cachectl.exists() else 'python -m kernel_cache'} --dir {_shown(cache)} list")
    if cachectl.exists():
        print(f"  (or `source {_shown(cachectl.parent / 'activate')}` once, then: cachectl --dir {_shown(cache)} list)")


if __name__ == "__main__":
    main()
