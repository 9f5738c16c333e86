"""A key depends on what is compiled, never on where a file lives: Triton installed at another path
(another venv, a copied site-packages) gives the same keys, and a process using that install is
served the first one's kernels from a shared directory with no compile."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import triton
from conftest import ROOT, child_env

from compiler import portable as portable_module
from compiler.portable import portable


def test_a_file_path_stands_for_its_content(tmp_path):
    a, b = tmp_path / "a" / "libdevice.bc", tmp_path / "b" / "elsewhere.bc"
    for path in (a, b):
        path.parent.mkdir()
        path.write_bytes(b"bitcode" * 100)
    doc = {"extern_libs": [["libdevice", str(a)]], "n": 3, "rel": "not/absolute", "gone": "/no/such/file"}
    moved = portable({**doc, "extern_libs": [["libdevice", str(b)]]})
    assert portable(doc) == moved and moved["extern_libs"][0][1]["file"]
    assert moved["rel"] == "not/absolute" and moved["gone"] == "/no/such/file" and moved["n"] == 3
    b.write_bytes(b"other bitcode")  # new content: a new digest, whatever the memo held
    assert portable({"lib": str(b)}) != portable({"lib": str(a)})


def test_a_directory_stands_for_its_files(tmp_path):
    for top in ("one", "two"):
        (tmp_path / top / "include" / "sub").mkdir(parents=True)
        (tmp_path / top / "include" / "sub" / "h.h").write_text("#define X 1\n")
    assert portable(str(tmp_path / "one" / "include")) == portable(str(tmp_path / "two" / "include"))
    (tmp_path / "two" / "include" / "sub" / "h.h").write_text("#define X 2\n")
    assert portable(str(tmp_path / "one" / "include")) != portable(str(tmp_path / "two" / "include"))


def test_a_huge_directory_keeps_its_path(tmp_path, monkeypatch):
    monkeypatch.setattr(portable_module, "MAX_DIRECTORY_FILES", 2)
    for i in range(3):
        (tmp_path / f"f{i}").write_text(str(i))
    assert portable(str(tmp_path)) == str(tmp_path)


@pytest.fixture(scope="module")
def other_install(tmp_path_factory):
    """This Triton at another path: its package directory linked file by file (or copied) elsewhere."""
    site = tmp_path_factory.mktemp("other-site")
    source = os.path.dirname(triton.__file__)
    try:
        subprocess.run(["cp", "-al", source, str(site / "triton")], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        shutil.copytree(source, site / "triton", symlinks=True)
    return site


KEYS = """
import json, triton, compiler
from compiler.examples import example_specs
print(json.dumps({"triton": triton.__file__, "keys": [compiler.content_key(s) for _, s in example_specs("sm_90")]}))
"""

LOWER = """
import json, jax, kernel_cache, triton
from lowering import examples
for _, fn, shapes in examples.programs(compute_capability=90):
    jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",))
print(json.dumps({"triton": triton.__file__, "stats": kernel_cache.default_store().stats.session()}))
"""


def _child(code: str, site=None, **env) -> dict:
    path = child_env()["PYTHONPATH"]
    full = child_env(PYTHONPATH=f"{site}{os.pathsep}{path}" if site else path, **env)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_two_installs_give_the_same_keys(other_install):
    here, there = _child(KEYS), _child(KEYS, other_install)
    assert there["triton"].startswith(str(other_install)) and not here["triton"].startswith(str(other_install))
    assert here["keys"] == there["keys"] and len(set(here["keys"])) == len(here["keys"])


@pytest.mark.slow
def test_the_other_install_is_served_from_the_shared_directory(other_install, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    common = {"KERNEL_CACHE_SHARED_DIR": str(shared), "KERNEL_CACHE_CALL_RECORDS": "0"}
    first = _child(LOWER, KERNEL_CACHE_DIR=str(tmp_path / "node1"), **common)
    second = _child(LOWER, other_install, KERNEL_CACHE_DIR=str(tmp_path / "node2"), **common)
    assert second["triton"].startswith(str(other_install))
    assert first["stats"]["compiles"] == 14
    assert second["stats"]["compiles"] == 0 and second["stats"]["hits"].get("shared") == 14, second["stats"]
