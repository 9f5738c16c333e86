"""Interrupts stop `cachectl prewarm`: Ctrl-C (SIGINT to the process group), SIGINT to the main
process alone (`timeout -s INT`, a batch scheduler) and SIGTERM, in both prewarm modes, with worker
processes and without. Real subprocesses and real signals: after the signal no entry lands more than
a second later, the process exits promptly with 130 (143 for SIGTERM), no worker outlives it, what
was built stays whole in the cache and the summary says "interrupted after N of M".

The workload is long and cheap to set up: one real compile (the example add kernel) whose entry is
copied under 96 recipes of other BLOCK / num_warps / num_stages, rebuilt for two arches (~190 builds);
the program is 60 variants of the example add program. The interrupt comes once the first builds
have landed, so only those few compile.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import ROOT, child_env, python_path, run_python

from cachectl.inventory import read_raw
from cachectl.warm import interrupts
from kernel_cache import Config, Store
from kernel_cache.entries import entry as entry_format
from kernel_cache.entries.entry import Entry, is_key, peek_meta
from kernel_cache.entries.summary import META_KIND

AFTER_SIGNAL = 1.0  # no entry may land later than this after the signal
EXIT_WITHIN = 5.0  # the process is gone by then (it takes ~0.5 s; JAX's own exit adds ~0.5 s)

PROGRAM_MODULE = textwrap.dedent("""
    import functools

    import jax
    import jax.numpy as jnp

    from lowering.examples import add_program

    def programs():
        vec = jax.ShapeDtypeStruct((4096,), jnp.float32)
        return [(f"add[{b},{w},{s}]", functools.partial(add_program, block=b, num_warps=w, num_stages=s), (vec, vec))
                for b in (64, 128, 256, 512, 1024) for w in (1, 2, 4, 8) for s in (1, 2, 3)]

    def one_program():
        vec = jax.ShapeDtypeStruct((4096,), jnp.float32)
        return [("add", functools.partial(add_program, block=1024), (vec, vec))]
""")


@pytest.fixture(scope="module")
def recipe_store(tmp_path_factory) -> Path:
    """A store holding the example add kernel for sm_90 and 96 more recipes of it (entries copied
    from the real one under other keys, their recipes asking for other launch parameters)."""
    from compiler import get_or_compile
    from compiler.examples import example_specs

    directory = tmp_path_factory.mktemp("prewarm-interrupt") / "store"
    store = Store(Config(dir=directory))
    _, key = get_or_compile(dict(example_specs("sm_90"))["add"], store)
    seed = entry_format.decode(store.disk.peek_raw(key), expected_key=key)
    for block in (64, 128, 256, 512, 2048, 4096):
        for warps in (1, 2, 4, 8):
            for stages in (1, 2, 3, 4):
                planted = copy.deepcopy(seed)
                planted.key = hashlib.sha256(f"{block}/{warps}/{stages}".encode()).hexdigest()[:len(key)]
                planted.meta["recipe"]["constexprs"]["BLOCK"] = {"v": block}
                planted.meta["recipe"]["num_warps"], planted.meta["recipe"]["num_stages"] = warps, stages
                store.disk.put_raw(planted.key, entry_format.encode(planted))
    store.close()
    return directory


@pytest.fixture(scope="module")
def program_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("prewarm-programs")
    (directory / "prewarm_interrupt_programs.py").write_text(PROGRAM_MODULE)
    return directory


def _records(directory: Path) -> dict[str, float]:
    """key -> when it was stored, for every entry of the local level (read-only, as `cachectl list`)."""
    if not (directory / "entries").is_dir():
        return {}
    store = Store(Config(dir=directory), read_only=True)
    try:
        return {r["key"]: r["created"] for r in store.disk.listing()} if store.disk is not None else {}
    finally:
        store.close()


def _kernel_keys(directory: Path, keys) -> set[str]:
    """Those of `keys` that are kernels (a program's lowering also writes lowered-call records)."""
    store = Store(Config(dir=directory), read_only=True)
    try:
        return {k for k in keys if peek_meta(read_raw(store.disk, k)).get(META_KIND, "triton-kernel") == "triton-kernel"}
    finally:
        store.close()


def _children(pid: int) -> set[int]:
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.add(int(stat.parent.name))
    return out


def _compile_workers(pids: set[int]) -> set[int]:
    """Those of `pids` that are compile worker processes (`compiler.compile_processes`)."""
    out = set()
    for pid in pids:
        try:
            if b"compile_worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.add(pid)
        except OSError:
            continue
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def _interrupt(directory: Path, args: list[str], how: str, sig: int, env: dict, tmp_path: Path,
               min_new: int = 2) -> dict:
    """Run `cachectl --dir DIRECTORY prewarm ARGS` in its own session, send `sig` once `min_new`
    entries have landed (to the group or to the main process alone), and report what followed."""
    before = set(_records(directory))
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "kernel_cache", "--dir", str(directory), "prewarm", *args],
                                cwd=ROOT, env=child_env(**env), stdout=stdout, stderr=stderr, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(set(_records(directory)) - before) < min_new:
            assert proc.poll() is None, f"prewarm ended before the interrupt:\n{err.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "no entry landed in 120 s"
            time.sleep(0.05)
        workers = _children(proc.pid)
        compile_workers = _compile_workers(workers)
        sent = time.time()
        if how == "group":
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
        code = proc.wait(timeout=60)
        exited = time.time() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    time.sleep(0.2)  # a worker left behind would go on writing meanwhile
    records = _records(directory)
    new = set(records) - before
    return {"code": code, "exited": exited, "new": new, "sent": sent,
            "late": sorted(round(records[k] - sent, 2) for k in new if records[k] > sent + AFTER_SIGNAL),
            "last": max((records[k] - sent for k in new), default=0.0),
            "survivors": sorted(pid for pid in workers if _alive(pid)), "compile_workers": compile_workers,
            "stdout": out.read_text(), "stderr": err.read_text()}


def _assert_whole(directory: Path) -> None:
    """Every entry verifies; every file under entries/ is an entry named by its key in its key's folder,
and no temp file (a write cut short) is left."""
    verify = subprocess.run([sys.executable, "-m", "kernel_cache", "--dir", str(directory), "verify"], cwd=ROOT,
                            env=child_env(), capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0 and ": 0 bad" in verify.stdout, verify.stdout + verify.stderr
    files = [p.relative_to(directory / "entries") for p in (directory / "entries").rglob("*") if not p.is_dir()]
    assert all(len(f.parts) == 2 and is_key(f.name) and f.name[:2] == f.parts[0] for f in files), files
    assert not [p for p in directory.rglob("*") if p.name.endswith(".tmp")]


def _check_stopped(result: dict, sig: int) -> None:
    print(f"signal {signal.Signals(sig).name}: exited {result['exited']:.2f} s later, {len(result['new'])} entries "
          f"new, the last {result['last']:+.2f} s from the signal")
    assert result["code"] == (143 if sig == signal.SIGTERM else 130), result["stderr"][-3000:]
    assert result["exited"] < EXIT_WITHIN
    assert result["late"] == [], f"entries landed after the interrupt: {result['late']}"
    assert result["survivors"] == []


@pytest.mark.slow
@pytest.mark.parametrize("how, sig, jobs, output", [
    ("group", signal.SIGINT, "2", "--json"),  # Ctrl-C at a terminal
    ("main", signal.SIGINT, "2", "text"),  # timeout -s INT, a batch scheduler: the main process alone
    ("main", signal.SIGTERM, "2", "--json"),
    ("main", signal.SIGINT, "1", "text"),  # built in the main process itself
])
def test_interrupt_stops_recipe_builds(recipe_store, tmp_path, how, sig, jobs, output):
    directory = tmp_path / "store"
    shutil.copytree(recipe_store, directory)
    args = ["--arch", "sm_80,sm_90", "--allow-module", "compiler.examples", "-j", jobs]
    result = _interrupt(directory, args + ([output] if output != "text" else []), how, sig, {}, tmp_path)
    _check_stopped(result, sig)
    assert len(result["compile_workers"]) == (2 if jobs == "2" else 0)  # -j 1: in the main process
    if output == "--json":
        report = json.loads(result["stdout"])
        assert report["interrupted"] is True and report["failed"] == 0 and report["present"] == 1
        done, total, built = report["done"], report["total"], report["built"]
        assert f"cachectl: interrupted after {done} of {total} builds" in result["stderr"]
    else:
        match = re.search(r"^interrupted after (\d+) of (\d+) builds: built (\d+), already present 1, failed 0, "
                          r"not built (\d+) ", result["stdout"], re.M)
        assert match, result["stdout"][-2000:]
        done, total, built, left = map(int, match.groups())
        assert done + left == total  # the counts add up to what was planned
    assert total == 2 * 97  # every recipe for both arches, the real entry's own (present) included
    assert 2 <= built == done - 1 == len(result["new"]) < total  # each build landed whole and is counted
    _assert_whole(directory)


@pytest.mark.slow
@pytest.mark.parametrize("how, sig, arches, jobs", [
    ("main", signal.SIGINT, "sm_90,sm_80", "2"),  # one spawned worker per arch: where an interrupt could hang
    ("group", signal.SIGTERM, "sm_90", "1"),  # lowered in the main process
])
def test_interrupt_stops_program_lowering(program_dir, tmp_path, how, sig, arches, jobs):
    pytest.importorskip("lowering")
    directory = tmp_path / "store"
    args = ["prewarm_interrupt_programs:programs", "--arch", arches, "-j", jobs, "--json"]
    result = _interrupt(directory, args, how, sig, {"PYTHONPATH": python_path(program_dir)}, tmp_path, min_new=4)
    _check_stopped(result, sig)
    report = json.loads(result["stdout"])
    lowerings = len(arches.split(","))
    assert report["interrupted"] is True and report["failed"] == 0
    assert report["total"] in (None, 60 * lowerings) and report["done"] < 60 * lowerings
    built = {o["key"] for o in report["outcomes"] if o["status"] == "built"}
    assert built == _kernel_keys(directory, result["new"]) and len(built) >= 2  # what landed is reported
    assert report["built"] == len(built)
    _assert_whole(directory)


def test_program_mode_reports_present_kernels_in_json_and_text(program_dir, tmp_path):
    """A second prewarm of the same program builds nothing: JSON counts what the text calls present."""
    pytest.importorskip("lowering")
    directory = tmp_path / "store"
    env = child_env(PYTHONPATH=python_path(program_dir))

    def prewarm(*extra):
        proc = subprocess.run([sys.executable, "-m", "kernel_cache", "--dir", str(directory), "prewarm",
                               "prewarm_interrupt_programs:one_program", "--arch", "sm_90", *extra],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return proc

    first = json.loads(prewarm("--json").stdout)
    assert (first["built"], first["present"], first["done"], first["total"]) == (1, 0, 1, 1)
    again = json.loads(prewarm("--json").stdout)
    assert (again["built"], again["present"], again["failed"], again["interrupted"]) == (0, 1, 0, False)
    (present,) = [o for o in again["outcomes"] if o["status"] == "present"]
    assert (present["label"], present["arch"], present["key"]) == ("add_kernel", "sm_90", first["outcomes"][0]["key"])
    text = prewarm().stdout
    assert "nothing to build: the one kernel prewarm_interrupt_programs:one_program needs is already in the cache" in text


def test_interrupt_during_an_entry_write_waits_for_it(tmp_path, monkeypatch):
    """A signal arriving while an entry is written is raised once the write is over: no half entry."""
    store = Store(Config(dir=tmp_path / "store"))
    key, written = "ab" * 16, []
    real_keep = store.disk.keep

    def keep(entry: Entry, data: bytes) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs meanwhile, and holds the interrupt
        real_keep(entry, data)
        written.append(entry.key)

    monkeypatch.setattr(store.disk, "keep", keep)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt), interrupts.interrupts_stop_work():
        store.put(Entry(key=key, meta={"name": "k"}, blobs={"b": b"x" * 100_000}))
        time.sleep(2)  # raised here, within milliseconds
    assert time.monotonic() - start < 1.0
    assert written == [key] and store.disk.get(key) is not None
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    store.close()


def test_an_interrupt_landing_in_a_gc_callback_is_not_lost():
    """Python drops an exception raised inside a garbage-collector callback (JAX registers one), so a
    SIGTERM landing there would let a prewarm run to its end and exit 0: the interrupt waits for the
    collection to end, then stops the work. (In a fresh process: no other thread may take the signal.)"""
    code = textwrap.dedent("""
        import gc, os, signal, time
        from cachectl.warm import interrupts

        seen = []

        def callback(phase, info):
            if phase == "start" and not seen:
                seen.append(phase)
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)  # the handler runs here, inside the callback

        gc.callbacks.append(callback)
        start = time.monotonic()
        try:
            with interrupts.interrupts_stop_work():
                gc.collect()
                time.sleep(2)  # raised here, once the collection is over
            print("NOT RAISED")
        except KeyboardInterrupt:
            print("RAISED", bool(seen), round(time.monotonic() - start, 2))
    """)
    out = run_python(code).stdout.split()
    assert out[:2] == ["RAISED", "True"] and float(out[2]) < 1.0, out
