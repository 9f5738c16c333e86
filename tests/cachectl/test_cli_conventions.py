"""cachectl keeps what the user owns and speaks like ccache: no silent overwrite, no cache made in
someone else's directory, --version, suggestions, data-only -q, versioned JSON (errors too)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, child_env

from kernel_cache import Config, Entry, Store

KEYS = [f"{i:032x}" for i in range(3)]


def cachectl(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernel_cache", *map(str, args)], cwd=ROOT,
                          env=child_env(**(env or {})), capture_output=True, text=True, timeout=120)


@pytest.fixture
def cache(tmp_path):
    directory = tmp_path / "cache"
    store = Store(Config(dir=directory))
    for key in KEYS:
        store.put(Entry(key=key, meta={"name": "k", "arch": "sm_90"}, blobs={"cubin": os.urandom(40_000)}))
    store.close()
    return directory


def snapshot(directory):
    return sorted((str(p.relative_to(directory)), p.read_bytes() if p.is_file() else None)
                  for p in directory.rglob("*"))


def test_export_never_overwrites_without_force_and_refuses_an_empty_selection(cache, tmp_path):
    precious = tmp_path / "notes.py"
    precious.write_text("print('mine')\n")
    out = cachectl("--dir", cache, "export", precious)
    assert out.returncode == 2 and "--force" in out.stderr and precious.read_text() == "print('mine')\n"

    nothing = cachectl("--dir", cache, "export", tmp_path / "none.kcb", "--kernel", "no-such-kernel")
    assert nothing.returncode == 2 and "no entries match" in nothing.stderr
    assert not (tmp_path / "none.kcb").exists()

    bundle = tmp_path / "warm.kcb"
    assert cachectl("--dir", cache, "export", bundle).returncode == 0
    again = cachectl("--dir", cache, "export", bundle)
    assert again.returncode == 2
    replaced = cachectl("--dir", cache, "export", bundle, "--force", "--json")
    assert replaced.returncode == 0 and json.loads(replaced.stdout)["entries"] == 3


@pytest.mark.parametrize("command", [["prewarm"], ["import", "BUNDLE"], ["list"], ["stats"]])
def test_no_command_turns_a_foreign_directory_into_a_cache(cache, tmp_path, command):
    bundle = tmp_path / "warm.kcb"
    assert cachectl("--dir", cache, "export", bundle).returncode == 0
    home = tmp_path / "my-project"
    home.mkdir()
    (home / "train.py").write_text("import jax\n")
    before = snapshot(home)
    out = cachectl("--dir", home, *[str(bundle) if a == "BUNDLE" else a for a in command])
    assert out.returncode == 2 and "not a kernel-cache directory" in out.stderr
    assert snapshot(home) == before


def test_version_suggestions_and_errors_as_json():
    version = cachectl("--version")
    assert version.returncode == 0 and version.stdout.startswith("cachectl (kernel-cache) ")
    typo = cachectl("lsit")
    assert typo.returncode == 2 and "did you mean 'list'" in typo.stderr
    err = cachectl("--dir", "/nonexistent/kc", "list", "--json")
    assert err.returncode == 2
    doc = json.loads(err.stdout)
    assert {**doc, "error": "?"} == {"schema": 2, "error": "?", "exit_code": 2}
    assert doc["error"].startswith("no cache directory at /nonexistent/kc: ")


def test_quiet_list_prints_rows_only_and_json_is_versioned(cache):
    quiet = cachectl("--dir", cache, "list", "-q")
    assert quiet.returncode == 0 and len(quiet.stdout.strip().splitlines()) == 3
    assert "KEY" not in quiet.stdout and "entries" not in quiet.stdout
    for command in (["list"], ["stats"], ["verify"], ["config"], ["prune", "--dry-run"]):
        doc = json.loads(cachectl("--dir", cache, *command, "--json").stdout)
        assert doc["schema"] == 2, command


def test_stats_flags_a_cache_over_its_bound(cache):
    within = json.loads(cachectl("--dir", cache, "stats", "--json").stdout)
    assert within["over_max_bytes"] is False and within["levels"]["disk"]["over_max_bytes"] is False
    env = {"KERNEL_CACHE_MAX_BYTES": "64K"}
    over = cachectl("--dir", cache, "stats", env=env)
    assert over.returncode == 0 and "EXCEEDED" in over.stdout and "64.0 KiB" in over.stdout
    assert json.loads(cachectl("--dir", cache, "stats", "--json", env=env).stdout)["over_max_bytes"] is True
    verbose = cachectl("--dir", cache, "stats", "-v")
    assert "entries by arch      sm_90 3" in verbose.stdout and "most hit" in verbose.stdout


def test_importing_a_file_that_is_no_bundle_creates_no_cache(tmp_path):
    target, text = tmp_path / "new-cache", tmp_path / "notes.txt"
    text.write_text("not a bundle\n")
    out = cachectl("--dir", target, "import", text)
    assert out.returncode == 2 and "not a kernel-cache bundle" in out.stderr and not target.exists()
