"""KERNEL_CACHE_XLA=1 keeps JAX's compiled executables under KERNEL_CACHE_DIR/xla (small programs too),
a second process reads them back, and cachectl stats reports them; unset, nothing changes."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT, child_env

PROGRAM = """
import json, jax, jax.numpy as jnp
import lowering
f = jax.jit(lambda x: jnp.sin(x) * 2 + 1)
f(jnp.ones(64)).block_until_ready()
print(json.dumps({"dir": jax.config.jax_compilation_cache_dir}))
"""


def run(env):
    proc = subprocess.run([sys.executable, "-c", PROGRAM], cwd=ROOT, env=child_env(**env), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_opt_in_keeps_xla_executables_beside_the_kernels(tmp_path):
    cache = tmp_path / "cache"
    assert run({"KERNEL_CACHE_DIR": str(cache)})["dir"] is None  # not opted in: JAX untouched
    assert not (cache / "xla").exists()
    env = {"KERNEL_CACHE_DIR": str(cache), "KERNEL_CACHE_XLA": "1"}
    assert run(env)["dir"] == str(cache / "xla")
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
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=child_env(KERNEL_CACHE_DIR=str(tmp_path / "cache"), KERNEL_CACHE_XLA="1"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["dir"] == str(tmp_path / "mine")
