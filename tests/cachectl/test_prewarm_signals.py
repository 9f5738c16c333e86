"""prewarm and signals: a prewarm stops on SIGINT however it was started (a script's
`cachectl prewarm &` starts it ignoring SIGINT) with exit 130; an interrupt that lands while JAX or
the program is imported waits for the import's end (one raised inside jaxlib's extension set-up
aborts the process: nanobind, exit 134), then stops it (130, 143 for SIGTERM); the interrupted
counts add up to what was planned; a kernel module beside the user that the `cachectl` command cannot
import is named with its fix, `PYTHONPATH=.`.

The recipes are synthetic entries written through kernel_cache.Store (the example add kernel's
recipe under other BLOCK / num_warps): only the builds the prewarm gets to before the interrupt
compile. cachectl runs as its console script does (a script file outside the working directory),
so the working directory is not on the import path.
"""

from __future__ import annotations

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
from conftest import child_env

from kernel_cache import Config, Entry, Store

ENTRY_POINT = "import sys\nfrom cachectl.main import main\nsys.exit(main())\n"  # as `cachectl`
BUILDS = [(block, warps) for block in (64, 128, 256, 512, 2048) for warps in (1, 2, 4, 8)]
UNIMPORTABLE = 3  # recipes of `mykernels`, a module beside the user


def _entry(key: str, recipe: dict) -> Entry:
    return Entry(key=key, meta={"name": "add_kernel", "compile_seconds": 0.5, "created": time.time(),
                                "recipe": recipe}, blobs={"cubin": os.urandom(200)})


@pytest.fixture(scope="module")
def recipes_cache(tmp_path_factory) -> Path:
    """The example add kernel's recipe stored under its own key (present), under other launch
    parameters (len(BUILDS) builds to do) and under a module beside the user (UNIMPORTABLE)."""
    from compiler import content_key, to_recipe
    from compiler.examples import example_specs

    spec = dict(example_specs("sm_90"))["add"]
    seed = to_recipe(spec)
    directory = tmp_path_factory.mktemp("prewarm-signals") / "cache"
    store = Store(Config(dir=directory))
    store.put(_entry(content_key(spec), seed))
    for block, warps in BUILDS:
        recipe = {**seed, "constexprs": {"BLOCK": {"v": block}}, "num_warps": warps}
        store.put(_entry(hashlib.sha256(f"{block}/{warps}".encode()).hexdigest()[:32], recipe))
    for n in range(UNIMPORTABLE):
        recipe = {**seed, "kernel": "mykernels:add_kernel", "constexprs": {"BLOCK": {"v": 64 << n}}}
        store.put(_entry(hashlib.sha256(f"mykernels/{n}".encode()).hexdigest()[:32], recipe))
    store.close()
    return directory


@pytest.fixture
def workdir(tmp_path) -> Path:
    """The user's directory: `mykernels.py` beside them, and cachectl's entry point elsewhere."""
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "mykernels.py").write_text("# the user's kernels (none needed here)\n")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "cachectl").write_text(ENTRY_POINT)
    return tmp_path / "work"


def _copy(cache: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(cache, tmp_path / "cache"))


def _backgrounded(workdir: Path, args: list[str], env: dict | None = None) -> tuple[subprocess.Popen, Path]:
    """`cachectl ARGS &` in a non-interactive bash script (SIGINT ignored for it, as bash does), in
    `workdir`; the script waits for it and writes its exit status to workdir/status."""
    cachectl = workdir.parent / "bin" / "cachectl"
    script = (f'"$PY" {cachectl} "$@" > out 2> err & echo $! > pid; wait $!; echo $? > status')
    proc = subprocess.Popen(["bash", "-c", script, "bash", *args], cwd=workdir,
                            env=child_env(PY=sys.executable, **(env or {})), start_new_session=True)
    return proc, workdir / "status"


def _wait_for(predicate, seconds: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert proc is None or proc.poll() is None, f"ended before {what}"
        assert time.monotonic() < deadline, f"no {what} in {seconds:.0f} s"
        time.sleep(0.02)


def _finish(proc: subprocess.Popen, status: Path) -> int:
    try:
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return int(status.read_text())


def test_a_backgrounded_script_job_starts_with_sigint_ignored(tmp_path):
    """The premise: bash starts `cmd &` of a non-interactive script ignoring SIGINT."""
    code = "import signal; print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)"
    out = subprocess.run(["bash", "-c", f'"{sys.executable}" -c "{code}" & wait'], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "True"


def test_a_backgrounded_prewarm_stops_on_sigint_and_its_counts_add_up(recipes_cache, tmp_path, workdir):
    cache = _copy(recipes_cache, tmp_path)
    proc, status = _backgrounded(workdir, ["--dir", str(cache), "prewarm", "--allow-module", "compiler.examples",
                                           "--allow-module", "mykernels", "-j", "1"])
    out = workdir / "out"
    _wait_for(lambda: out.exists() and re.search(r"^built ", out.read_text(), re.M), 120, "build", proc)
    os.kill(int((workdir / "pid").read_text()), signal.SIGINT)
    sent = time.monotonic()
    assert _finish(proc, status) == 130, (workdir / "err").read_text()[-3000:]
    assert time.monotonic() - sent < 10
    text = out.read_text()
    match = re.search(r"^interrupted after (\d+) of (\d+) builds: built (\d+), already present (\d+), failed (\d+), "
                      r"not built (\d+) in ", text, re.M)
    assert match, text[-2000:]
    done, total, built, present, failed, left = map(int, match.groups())
    assert (present, failed) == (1, UNIMPORTABLE)
    assert total == 1 + UNIMPORTABLE + len(BUILDS)  # everything planned
    assert built + present + failed == done and done + left == total and 1 <= built < len(BUILDS)
    err = (workdir / "err").read_text()
    hint = ("No module named 'mykernels' ('mykernels' is in the current directory, which cachectl does not "
            "import from: run it with PYTHONPATH=.)")
    assert err.count(hint) == UNIMPORTABLE, err[-3000:]


def test_pythonpath_dot_is_the_fix_it_names(recipes_cache, tmp_path, workdir):
    cache = _copy(recipes_cache, tmp_path)
    cachectl = workdir.parent / "bin" / "cachectl"

    def prewarm(**env) -> dict:
        proc = subprocess.run([sys.executable, str(cachectl), "--dir", str(cache), "prewarm",
                               "--allow-module", "mykernels", "--json"], cwd=workdir, env=child_env(**env),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1, proc.stderr[-3000:]
        return {o["error"] for o in json.loads(proc.stdout)["outcomes"] if o["status"] == "failed"}

    (before,) = prewarm()
    assert "PYTHONPATH=." in before and "is in the current directory" in before
    (after,) = prewarm(PYTHONPATH=os.pathsep.join([".", child_env()["PYTHONPATH"]]))
    assert after == "module 'mykernels' has no kernel 'add_kernel'"  # imported now: this file has none
    (workdir / "mykernels.py").unlink()  # not beside: the hint says where to look
    (elsewhere,) = prewarm()
    assert "No module named 'mykernels'" in elsewhere and "on PYTHONPATH" in elsewhere


PROGRAM = textwrap.dedent("""
    import os, signal
    from pathlib import Path

    os.kill(os.getpid(), getattr(signal, os.environ["SEND"]))  # the interrupt lands as JAX is imported
    import jax
    import jax.numpy as jnp

    Path(os.environ["IMPORTED"]).write_text(jax.__version__)  # the import ran to its end

    def programs():
        Path(os.environ["RAN"]).touch()
        return []
""")


@pytest.mark.parametrize("send, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_an_interrupt_during_jax_import_waits_for_its_end_then_stops(tmp_path, workdir, send, code):
    (workdir / "jaxprogram.py").write_text(PROGRAM)
    env = {"SEND": send, "IMPORTED": str(tmp_path / "imported"), "RAN": str(tmp_path / "ran")}
    proc, status = _backgrounded(workdir, ["--dir", str(tmp_path / "cache"), "prewarm", "jaxprogram:programs"], env)
    assert _finish(proc, status) == code, (workdir / "err").read_text()[-3000:]
    err = (workdir / "err").read_text()
    assert (tmp_path / "imported").exists() and not (tmp_path / "ran").exists()
    assert "Traceback" not in err and "nanobind" not in err and "Abort" not in err, err[-3000:]
    assert "interrupted" in (workdir / "out").read_text() + err


def test_sigint_stops_the_work_though_the_process_started_ignoring_it():
    from cachectl.warm import interrupts

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with pytest.raises(KeyboardInterrupt), interrupts.interrupts_stop_work():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(2)  # raised here, at once
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # put back as it was
    finally:
        signal.signal(signal.SIGINT, previous)


def test_an_interrupt_in_a_held_block_is_raised_at_its_end():
    from cachectl.warm import interrupts

    done = []
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt), interrupts.interrupts_stop_work():
        with interrupts.signals_held():
            os.kill(os.getpid(), signal.SIGINT)
            with interrupts.signals_held():  # nested: the outermost block's end raises it
                time.sleep(0.1)
            done.append("inner")
            time.sleep(0.1)
            done.append("outer")
        done.append("after")  # never reached
    assert done == ["inner", "outer"] and time.monotonic() - start < 1.0
