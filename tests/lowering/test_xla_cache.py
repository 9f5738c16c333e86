"""KERNEL_CACHE_XLA=1 keeps JAX's compiled executables under KERNEL_CACHE_DIR/xla (small programs too),
a second process reads them back, and cachectl stats reports them; unset, nothing changes.

JAX runs those files as code, so the directory is handed over only when nobody else could have
written it: the attacks below plant a real executable (compiled from `x * 2 + 666`) under the name
of the victim's `x * 2 + 1`, as a stranger or a group member would, and the victim must still get
[1, 3, 5, 7]. A control run hands the same planted directory to JAX directly, proving the plant works.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, child_env
from test_security import chown_tree

from kernel_cache import Config, Store
from kernel_cache.telemetry import warnings_once
from lowering.xla_cache import XlaDirRefused, private_xla_dir

PROGRAM = """
import functools, json, jax, jax.numpy as jnp
import lowering
from lowering import examples
x = jnp.arange(4)  # JAX compiles, and decides about its persistent cache, before any Triton call
s = jax.ShapeDtypeStruct((256,), jnp.float32)
jax.jit(functools.partial(examples.add_program, block=256)).trace(s, s)  # the first Triton call: the session opens
f = jax.jit(lambda x: x * 2 + 1)
print(json.dumps({"dir": jax.config.jax_compilation_cache_dir, "out": f(x).tolist()}))
"""
RIGHT, PLANTED = [1, 3, 5, 7], [666, 668, 670, 672]


def run(env, program=PROGRAM):
    proc = subprocess.run([sys.executable, "-c", program], cwd=ROOT, env=child_env(**env), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["stderr"] = proc.stderr
    return result


def test_opt_in_keeps_xla_executables_beside_the_kernels(tmp_path):
    cache = tmp_path / "cache"
    assert run({"KERNEL_CACHE_DIR": str(cache)})["dir"] is None  # not opted in: JAX untouched
    assert not (cache / "xla").exists()
    env = {"KERNEL_CACHE_DIR": str(cache), "KERNEL_CACHE_XLA": "1"}
    assert run(env)["dir"] == str(cache / "xla")
    assert stat.S_IMODE((cache / "xla").stat().st_mode) == 0o700  # private from the start
    files = [p for p in (cache / "xla").rglob("*") if p.is_file()]
    assert files, "JAX wrote no executable even for a small program"
    before = sorted((p.name, p.stat().st_mtime_ns) for p in files)
    run(env)  # a second process reads them instead of writing new ones
    assert sorted((p.name, p.stat().st_mtime_ns) for p in (cache / "xla").rglob("*") if p.is_file()) >= before
    stats = subprocess.run([sys.executable, "-m", "kernel_cache", "--dir", str(cache), "stats", "--json"], cwd=ROOT,
                           env=child_env(), capture_output=True, text=True, timeout=120)
    xla = json.loads(stats.stdout)["xla"]
    assert xla["path"] == str(cache / "xla") and xla["files"] == len(files) and xla["bytes"] > 0


def test_a_directory_the_user_gave_jax_wins(tmp_path):
    mine = str(tmp_path / "mine")
    code = f"import jax; jax.config.update('jax_compilation_cache_dir', {mine!r})\n" + PROGRAM
    result = run({"KERNEL_CACHE_DIR": str(tmp_path / "cache"), "KERNEL_CACHE_XLA": "1"}, code)
    assert result["dir"] == str(tmp_path / "mine")


# The rule, in process (no JAX needed) -----------------------------------------------------------
@pytest.fixture
def store_for(tmp_path):
    warnings_once.reset()
    opened = []

    def make(directory: Path, **settings) -> Store:
        opened.append(Store(Config(dir=directory, xla=True, **settings)))
        return opened[-1]
    yield make
    for store in opened:
        store.close()
    warnings_once.reset()


def test_a_private_cache_gets_a_private_xla_dir(tmp_path, store_for):
    xla = private_xla_dir(store_for(tmp_path / "cache"))
    assert xla == Path(os.path.realpath(tmp_path / "cache" / "xla"))
    assert stat.S_IMODE(xla.stat().st_mode) == 0o700


def test_an_older_open_xla_dir_of_your_own_files_is_made_private(tmp_path, store_for):
    store = store_for(tmp_path / "cache")
    xla = tmp_path / "cache" / "xla"
    xla.mkdir(mode=0o755)
    os.chmod(xla, 0o755)
    (xla / "jit_f-abc-cache").write_bytes(b"x")
    os.chmod(xla / "jit_f-abc-cache", 0o644)
    assert private_xla_dir(store) == xla
    assert stat.S_IMODE(xla.stat().st_mode) == 0o700


@pytest.mark.parametrize("plant", ["symlink", "fifo", "subdir", "group-writable-file"])
def test_an_open_xla_dir_holding_anything_else_is_refused(tmp_path, store_for, plant):
    store = store_for(tmp_path / "cache")
    xla = tmp_path / "cache" / "xla"
    xla.mkdir(mode=0o755)
    os.chmod(xla, 0o755)
    target = xla / "jit_f-abc-cache"
    if plant == "symlink":
        target.symlink_to("/etc/passwd")
    elif plant == "fifo":
        os.mkfifo(target)
    elif plant == "subdir":
        target.mkdir()
    else:
        target.write_bytes(b"x")
        os.chmod(target, 0o664)
        os.chown(target, -1, 12345)  # a group that is not ours
    with pytest.raises(XlaDirRefused, match="jit_f-abc-cache"):
        private_xla_dir(store)
    assert stat.S_IMODE(xla.stat().st_mode) == 0o755  # left as found: never tightened over a plant


def test_a_symlinked_xla_dir_is_refused(tmp_path, store_for):
    store = store_for(tmp_path / "cache")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "cache" / "xla").symlink_to(elsewhere)
    with pytest.raises((XlaDirRefused, OSError)):
        private_xla_dir(store)


def test_a_cache_inside_a_directory_others_can_write_is_refused(tmp_path, store_for):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)  # not sticky: anyone could rename the cache away and put theirs there
    with pytest.raises(XlaDirRefused, match="not sticky"):
        private_xla_dir(store_for(open_dir / "cache"))
    os.chmod(open_dir, 0o1777)  # like /tmp: only the owner may rename
    assert private_xla_dir(store_for(open_dir / "cache2")).name == "xla"


def test_a_group_writable_cache_dir_is_refused_even_for_a_trusted_group(tmp_path, store_for):
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chmod(cache, 0o2775)
    store = store_for(cache, trusted_group=str(os.getegid()))
    assert store.disk is not None  # the store accepts it for kernels
    with pytest.raises(XlaDirRefused, match="writable by others"):
        private_xla_dir(store)


# Attacks with real users and a real planted executable -------------------------------------------
@pytest.fixture(scope="module")
def attacker_executable(tmp_path_factory) -> bytes:
    """JAX's cache file for `x * 2 + 666` (its name holds a hash of the program and of the cache path,
    its content does not: it runs wherever it is put)."""
    work = tmp_path_factory.mktemp("attacker")
    run({"KERNEL_CACHE_DIR": str(work), "KERNEL_CACHE_XLA": "1"}, PROGRAM.replace("x * 2 + 1", "x * 2 + 666"))
    (made,) = [p for p in (work / "xla").iterdir() if p.name.startswith("jit__lambda")]
    return made.read_bytes()


def swap_in(xla: Path, executable: bytes) -> Path:
    """Put the attacker's executable under the name of the victim's program (learnt by running it
    once at the same path, as anyone who knows the path can)."""
    (victims,) = [p for p in xla.iterdir() if p.name.startswith("jit__lambda")]
    victims.unlink()
    victims.write_bytes(executable)
    return victims


def test_the_planted_executable_runs_when_jax_is_given_the_directory_directly(tmp_path, attacker_executable):
    """The control: JAX alone trusts the file, so the refusals below are what protects the victim."""
    jax_own = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "planted"), "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
               "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    assert run(jax_own)["out"] == RIGHT
    swap_in(tmp_path / "planted", attacker_executable)
    assert run(jax_own)["out"] == PLANTED


def test_a_cache_dir_a_stranger_created_first_is_not_handed_to_jax(tmp_path, people, attacker_executable):
    cache = tmp_path / "cache"
    env = {"KERNEL_CACHE_DIR": str(cache), "KERNEL_CACHE_XLA": "1"}
    run(env)  # the stranger prepares the victim's path with the victim's program's file name...
    swap_in(cache / "xla", attacker_executable)  # ...holding her executable, all hers, mode 0755
    chown_tree(cache, people["stranger"], people["stranger"])
    for path in [cache, *cache.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    result = run(env)
    assert result["out"] == RIGHT and result["dir"] is None
    assert result["stderr"].count("JAX's compilation cache is not pointed at") == 1
    assert "not by you" in result["stderr"]


@pytest.mark.parametrize("trusted", [False, True], ids=["group-untrusted", "group-trusted"])
def test_a_group_members_swapped_executable_never_runs(tmp_path, people, attacker_executable, trusted):
    cache = tmp_path / "cache"
    env = {"KERNEL_CACHE_DIR": str(cache), "KERNEL_CACHE_XLA": "1"}
    run(env)  # the victim's own cache, warm
    for path in [cache, *cache.rglob("*")]:  # shared with a group: 2775, files group-writable
        os.lchown(path, -1, people["team"])
        os.chmod(path, 0o2775 if path.is_dir() else 0o664)
    swapped = swap_in(cache / "xla", attacker_executable)  # the teammate swaps the victim's executable
    os.lchown(swapped, people["teammate"], people["team"])
    if trusted:
        env["KERNEL_CACHE_TRUSTED_GROUP"] = people["team_name"]
    result = run(env)
    assert result["out"] == RIGHT and result["dir"] is None
    assert result["stderr"].count("JAX's compilation cache is not pointed at") == 1
    assert ("writable by others" if trusted else "not trusted") in result["stderr"]


def test_the_stats_walk_of_a_deep_xla_tree_is_bounded(tmp_path):
    cache = tmp_path / "cache"
    Store(Config(dir=cache)).close()
    deep = cache / "xla"
    deep.mkdir(mode=0o700)
    fd = os.open(deep, os.O_RDONLY)
    try:  # 1500 nested levels: past Python's recursion limit and PATH_MAX
        for _ in range(1500):
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        os.close(os.open("f", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    finally:
        os.close(fd)
    try:
        proc = subprocess.run([sys.executable, "-m", "kernel_cache", "--dir", str(cache), "stats", "--json"],
                              cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        xla = json.loads(proc.stdout)["xla"]
        assert xla["truncated"] is True and xla["files"] == 0
    finally:  # taken down one level at a time, whatever happened: shutil.rmtree (pytest's too) recurses
        while (deep / "d").exists():
            os.rename(deep / "d", deep / "peeled")
            for name in os.listdir(deep / "peeled"):
                os.rename(deep / "peeled" / name, deep / name)
            os.rmdir(deep / "peeled")
