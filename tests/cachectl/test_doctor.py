"""cachectl doctor: read-only checks of the directories, key, toolchain, jaxlib and GPU, one row each,
exit 1 when any is a problem (with its fix)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, child_env

from kernel_cache import Config, Entry, Store

STATUSES = {"ok", "warn", "problem"}
KEY = "ab" * 16
SIGNING_KEY = "0123456789abcdef0123456789abcdef"

def doctor(*args, env=None) -> subprocess.CompletedProcess:
    """`python -m kernel_cache ARGS doctor` (what `cachectl ARGS doctor` runs)."""
    return subprocess.run([sys.executable, "-m", "kernel_cache", *map(str, args), "doctor"], cwd=ROOT,
                          env=child_env(**(env or {})), capture_output=True, text=True, timeout=300)


def report(*args, env=None) -> tuple[int, dict]:
    proc = doctor(*args, "--json", env=env)
    assert proc.returncode in (0, 1), proc.stderr
    doc = json.loads(proc.stdout)
    assert set(doc) == {"schema", "checks"} and doc["schema"] == 1
    for row in doc["checks"]:
        assert set(row) == {"check", "status", "detail", "fix"} and row["status"] in STATUSES, row
        assert row["fix"] or row["status"] == "ok", row  # whatever is not ok says how to fix it
    names = [row["check"] for row in doc["checks"]]
    assert len(names) == len(set(names))
    return proc.returncode, {row["check"]: row for row in doc["checks"]}


@pytest.fixture
def cache(tmp_path):
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    store = Store(Config(dir=directory))
    store.put(Entry(key=KEY, meta={"name": "k"}, blobs={"b": b"x" * 100}))
    store.close()
    return directory


def _snapshot(directory):
    return sorted((str(p.relative_to(directory)), p.lstat().st_mode, p.lstat().st_size, p.lstat().st_mtime_ns)
                  for p in [directory, *directory.rglob("*")])


def test_healthy_cache_dir_is_ok_and_left_untouched(cache):
    before = _snapshot(cache)
    code, rows = report("--dir", cache)
    assert code == 0
    assert rows["cache-dir"]["status"] == "ok" and str(cache) in rows["cache-dir"]["detail"]
    assert rows["cache-size"]["status"] == "ok" and rows["cache-size"]["detail"].startswith("1 entry, ")
    assert rows["cache-size"]["detail"].endswith(" of 8.0 GiB allowed")
    assert rows["shared-dir"]["status"] == "ok" and "not configured" in rows["shared-dir"]["detail"]
    assert rows["signing-key"]["status"] == "ok"
    assert rows["triton"]["status"] == "ok" and rows["ptxas"]["status"] == "ok"
    assert {"jaxlib", "cache-fs", "gpu"} <= set(rows)
    assert not [r for r in rows.values() if r["status"] == "problem"], rows
    if os.environ.get("JAX_PLATFORMS") == "cpu":  # not probed: JAX is not initialised for a GPU
        assert rows["gpu"]["status"] == "warn" and "JAX_PLATFORMS=cpu" in rows["gpu"]["detail"]
    assert _snapshot(cache) == before  # read-only: no layout, no stats, no recency touched

    human = doctor("--dir", cache)
    assert human.returncode == 0
    lines = human.stdout.splitlines()
    assert lines[0].split() == ["CHECK", "STATUS", "DETAIL"]
    assert len([line for line in lines[1:] if line and not line.startswith(" ")]) == len(rows) + 1  # + summary
    assert lines[-1].startswith(f"doctor: {len(rows)} checks, 0 problems")


def test_world_writable_cache_dir_is_a_problem_with_its_fix(cache):
    os.chmod(cache, 0o777)
    code, rows = report("--dir", cache)
    assert code == 1
    row = rows["cache-dir"]
    assert row["status"] == "problem" and "writable by every user" in row["detail"]
    assert f"chmod o-w {cache}" in row["fix"]
    assert "cache-size" not in rows  # an untrusted directory is not walked

    human = doctor("--dir", cache)
    assert human.returncode == 1
    lines = human.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("cache-dir"))
    assert "problem" in lines[at] and lines[at + 1].strip() == f"fix: {row['fix']}"
    assert "1 problem" in lines[-1]

    os.chmod(cache, 0o700)
    os.chmod(cache / "entries", 0o777)  # a level below counts as much as the top
    code, rows = report("--dir", cache)
    assert code == 1 and f"chmod o-w {cache / 'entries'}" in rows["cache-dir"]["fix"]


def test_a_cache_over_its_bound_is_a_warning_with_its_fix(cache):
    code, rows = report("--dir", cache, env={"KERNEL_CACHE_MAX_BYTES": "10"})
    row = rows["cache-size"]
    assert row["status"] == "warn" and row["detail"].startswith("1 entry, ") and "over the bound" in row["detail"]
    assert "cachectl prune" in row["fix"]


def test_files_of_the_index_layout_are_no_entries_and_are_left_as_they_were(tmp_path):
    """A directory the index layout wrote (value files under entries/aa/bb/, entries/index.db): no
    entry is counted, nothing is changed."""
    directory = tmp_path / "cache"
    value = directory / "entries" / KEY[:2] / KEY[2:4] / f"{KEY[4:]}.val"
    value.parent.mkdir(parents=True)
    os.chmod(directory, 0o700)
    value.write_bytes(b"x" * 100)
    (directory / "entries" / "index.db").write_bytes(b"SQLite format 3\0" + bytes(100))
    before = _snapshot(directory)
    code, rows = report("--dir", directory)
    assert rows["cache-size"]["status"] == "ok" and rows["cache-size"]["detail"].startswith("0 entries, 0 B of ")
    assert _snapshot(directory) == before


def test_shared_dir_with_a_signing_key(cache, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # a world-writable scratch: acceptable only with a signing key
    code, rows = report("--dir", cache, "--shared-dir", shared, env={"KERNEL_CACHE_SIGNING_KEY": SIGNING_KEY})
    assert code == 0
    assert rows["signing-key"]["status"] == "ok" and "key id " in rows["signing-key"]["detail"]
    assert rows["shared-dir"]["status"] == "warn" and "signature" in rows["shared-dir"]["detail"]
    assert "chmod 2770" in rows["shared-dir"]["fix"]  # anyone may delete entries: share with a group
    assert rows["shared-lock"]["status"] == "ok" and rows["shared-lock"]["detail"].startswith("auto chooses ")
    assert rows["shared-fs"]["status"] == "ok"
    assert sorted(p.name for p in shared.iterdir()) == []  # no layout, no flock probe file

    code, rows = report("--dir", cache, "--shared-dir", shared)  # the same directory without a key
    assert code == 1
    assert rows["shared-dir"]["status"] == "problem" and "KERNEL_CACHE_SIGNING_KEY_FILE" in rows["shared-dir"]["fix"]


def test_missing_directories_and_memory_only(tmp_path):
    code, rows = report("--shared-dir", tmp_path / "no-such-mount")
    assert code == 1
    assert rows["cache-dir"]["status"] == "warn" and "memory only" in rows["cache-dir"]["detail"]
    assert rows["shared-dir"]["status"] == "problem" and "mkdir" in rows["shared-dir"]["fix"]
    assert not (tmp_path / "no-such-mount").exists()

    code, rows = report("--dir", tmp_path / "new" / "cache")
    assert code == 0 and rows["cache-dir"]["status"] == "ok" and "created on first use" in rows["cache-dir"]["detail"]
    assert not (tmp_path / "new").exists()


def test_interception_rows_say_whether_the_hook_and_adapters_are_in_place(cache):
    _, unset = report("--dir", cache)
    assert unset["intercept"]["status"] == "ok" and "unset" in unset["intercept"]["detail"]
    _, rows = report("--dir", cache, env={"KERNEL_CACHE_INTERCEPT": "all"})
    assert "intercept" not in rows and rows["intercept-hook"]["status"] == "ok"  # scripts/test.sh installs with pip
    for name, distribution in (("jax_triton", "jax-triton"), ("ejkernel", "ejkernel"),
                               ("transformer_engine", "transformer-engine")):
        row = rows[f"intercept-{name}"]
        try:
            installed = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            assert row["status"] == "warn" and "not installed" in row["detail"], row
        else:
            assert row["status"] == "ok" and installed in row["detail"], row


def test_an_adapter_is_not_called_served_while_the_start_up_hook_is_missing(tmp_path, monkeypatch):
    import site

    from cachectl.check import doctor as doctor_module
    from kernel_cache import Config

    monkeypatch.setattr(site, "getsitepackages", lambda: [str(tmp_path)])  # a site-packages without the .pth
    monkeypatch.setattr(site, "getusersitepackages", lambda: str(tmp_path))
    monkeypatch.setattr(importlib.metadata, "version", lambda distribution: "0.3.1")
    rows = {row.check: row for row in doctor_module._intercept(Config(intercept=("jax_triton",)))}
    assert rows["intercept-hook"].status == "problem"
    assert rows["intercept-jax_triton"].status == "warn" and "served" not in rows["intercept-jax_triton"].detail.split(":")[0]
    assert "kernel_cache.intercept()" in rows["intercept-jax_triton"].detail
