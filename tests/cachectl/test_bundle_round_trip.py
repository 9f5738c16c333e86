"""A bundle round-trips: what `cachectl export` writes, `cachectl import` takes.

One process cross-lowers every example program for sm_90 (each kernel compiled once), filling a
local cache (kernels, lowered calls, a warm set and its lineage memo) and, where redis-server is
installed, a real remote level (the same plus the toolchain's memos). A bundle of either imports
into an empty directory with exit 0 and nothing rejected, and that cache serves the programs with
no compile; an entry that fails its checks is still rejected.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import ROOT, child_env
from test_cachectl import cachectl

from cachectl.move.bundle_file import export_bundle
from kernel_cache.entries import entry as entry_format
from kernel_cache.entries import memo_entry, warm_set

LOWER = """
import json, jax, kernel_cache
from lowering import examples
for _, fn, shapes in examples.programs(compute_capability=90):
    jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",))
print(json.dumps(kernel_cache.default_store().stats.session()))
"""
TOOLCHAIN_MEMOS = {"triton_key", "backend_hash", "module_image_layout"}
SUMMARY = re.compile(r"imported (\d+) of (\d+) entries \([^)]*\) into disk; 0 already present, 0 skipped as stale, "
                     r"(\d+) rejected\n")


def lower_examples(directory: Path, **env: str) -> dict:
    """The store's session counters of a process that cross-lowers every example program with its
    cache in `directory`."""
    proc = subprocess.run([sys.executable, "-c", LOWER], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=child_env(KERNEL_CACHE_DIR=str(directory), **env))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def warm(tmp_path_factory, request) -> tuple[Path, dict[str, str] | None]:
    """(a warm cache directory, the environment of its remote level, or None without redis-server):
    one lowering of the example programs writes both."""
    remote = None
    if shutil.which("redis-server") is not None:
        server = request.getfixturevalue("server")
        remote = {"KERNEL_CACHE_REMOTE": server.url, "KERNEL_CACHE_REMOTE_NAMESPACE": "round-trip",
                  "KERNEL_CACHE_REMOTE_UNSIGNED": "1"}
    directory = tmp_path_factory.mktemp("round-trip") / "warm"
    assert lower_examples(directory, **(remote or {}))["compiles"] > 0
    return directory, remote


def listed(directory: Path, *args: str) -> list[dict]:
    proc = cachectl("--dir", directory, "list", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["entries"]


def export(directory: Path, bundle: Path, *args: str, env: dict[str, str] | None = None) -> int:
    """Export as a user does; the entry count it reports (exit 0, nothing on stderr)."""
    proc = cachectl("--dir", directory, "export", bundle, *args, env=env)
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    found = re.fullmatch(rf"exported (\d+) entries \([^)]*\) to {re.escape(str(bundle))}\n", proc.stdout)
    assert found, proc.stdout
    return int(found.group(1))


def import_whole(bundle: Path, target: Path, entries: int) -> None:
    """Import into `target` as a user does: every entry lands, none rejected, exit 0, stderr empty."""
    proc = cachectl("--dir", target, "import", bundle)
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    found = SUMMARY.fullmatch(proc.stdout)
    assert found and found.groups() == (str(entries), str(entries), "0"), proc.stdout


def served_without_compiling(directory: Path) -> None:
    """A fresh process lowering the programs against `directory` alone is served every call."""
    stats = lower_examples(directory)
    assert stats["compiles"] == 0 and stats["misses"] == 0, stats
    assert sum(stats["hits"].values()) + sum(stats["record_hits"].values()) > 0, stats


def test_a_bundle_of_a_warm_cache_imports_whole_and_serves_without_compiling(warm, tmp_path):
    """The local level holds a warm set's lineage memo beside its kernels and records: the bundle
    carries it and the import takes it, so a scripted export and import succeeds."""
    directory, _ = warm
    rows = listed(directory)
    carried = {r["key"] for r in rows if r["kind"] != warm_set.KIND}
    assert any(r["kind"] == memo_entry.KIND for r in rows)
    bundle = tmp_path / "warm.kcb"
    assert export(directory, bundle) == len(carried)
    fresh = tmp_path / "fresh"
    import_whole(bundle, fresh, len(carried))
    assert {r["key"] for r in listed(fresh)} == carried
    served_without_compiling(fresh)


def test_a_bundle_of_the_remote_level_imports_whole_and_serves_without_compiling(warm, tmp_path):
    """The remote level holds the toolchain's memos beside the kernels and records: the bundle
    carries them and an empty local directory takes them, with everything else."""
    directory, remote = warm
    if remote is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    bundle = tmp_path / "remote.kcb"
    exported = export(directory, bundle, "--level", "remote", env=remote)
    fresh = tmp_path / "fresh"
    import_whole(bundle, fresh, exported)
    rows = listed(fresh)
    assert len(rows) == exported and {r["kernel"] for r in rows if r["kind"] == memo_entry.KIND} == TOOLCHAIN_MEMOS
    served_without_compiling(fresh)


def test_an_entry_that_fails_its_checks_is_still_rejected(warm, tmp_path):
    """A memo filed under a key its name and identity do not give, and a kernel that names no target
    or toolchain, are rejected (exit 1, each named with why); the bundle's other entries land."""
    directory, _ = warm
    exported = tmp_path / "warm.kcb"
    total = export(directory, exported)
    with tarfile.open(exported, "r:gz") as tar:
        raws = {m.name[len("entries/"):-len(".kce")]: tar.extractfile(m).read()
                for m in tar.getmembers() if m.name.startswith("entries/")}
    decoded = {key: entry_format.decode(raw, expected_key=key) for key, raw in raws.items()}
    memo = next(e for e in decoded.values() if e.meta["kind"] == memo_entry.KIND)
    kernel = next(e for e in decoded.values() if e.meta["kind"] == "triton-kernel")
    memo.meta["identity"] = ["another program's first call"]
    del kernel.meta["target"], kernel.meta["toolchain"]
    raws[memo.key], raws[kernel.key] = entry_format.encode(memo), entry_format.encode(kernel)
    bundle = tmp_path / "forged.kcb"
    export_bundle(bundle, [(key, raw, {}) for key, raw in raws.items()])

    fresh = tmp_path / "fresh"
    proc = cachectl("--dir", fresh, "import", bundle)
    assert proc.returncode == 1
    assert sorted(proc.stderr.splitlines()) == sorted([
        f"rejected  {memo.key}: installed-memo record filed under a key its name and identity do not give",
        f"rejected  {kernel.key}: entry names no target or toolchain"])
    found = SUMMARY.fullmatch(proc.stdout)
    assert found and found.groups() == (str(total - 2), str(total), "2"), proc.stdout
    assert {r["key"] for r in listed(fresh)} == set(raws) - {memo.key, kernel.key}
