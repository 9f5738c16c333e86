# ruff: noqa: F811  (the record fixtures are imported, then named as parameters)
"""Operator tools that never mislead: `list` with a remote that does not answer still lists what
answered and names what did not; `doctor` changes nothing and never calls usable what cannot be;
one hit model across `list`, `show` and `stats`; a warm set says its arch and goes with its members
at `prune`; a cache made on a full disk (its first use could write no entry) is read by every
command without a traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, child_env
from test_cachectl import as_json, cachectl, ok
from test_cachectl_records import record_cache, record_copy  # noqa: F401  (fixtures)

from kernel_cache import Config, Store
from kernel_cache.entries import warm_set
from kernel_cache.levels.cache_marker import ENTRIES_DIR


# list with a remote that does not answer ---------------------------------------------------------
def test_list_lists_the_levels_that_answered_and_names_the_one_that_did_not(record_copy):
    env = {"KERNEL_CACHE_REMOTE": "redis://127.0.0.1:9/0", "KERNEL_CACHE_REMOTE_UNSIGNED": "1"}
    proc = cachectl("--dir", record_copy.directory, "list", env=env)
    assert proc.returncode == 1, proc
    assert record_copy.kernel[:12] in proc.stdout and record_copy.call.key[:12] in proc.stdout  # local rows
    said = [line for line in proc.stderr.splitlines() if line.startswith("cachectl:")]
    assert len(said) == 1 and "remote level was not listed" in said[0] and "Connection refused" in said[0], said
    doc = json.loads(cachectl("--dir", record_copy.directory, "list", "--json", env=env).stdout)
    assert {e["key"] for e in doc["entries"]} == record_copy.keys
    assert [u["level"] for u in doc["unreachable"]] == ["remote"]


# doctor changes nothing -------------------------------------------------------------------------
def test_doctor_on_a_directory_not_yet_made_creates_nothing(tmp_path):
    directory = tmp_path / "not-yet" / "cache"
    proc = cachectl("doctor", env={"KERNEL_CACHE_DIR": str(directory)})
    assert "does not exist yet: created on first use" in proc.stdout, proc.stdout
    assert not (tmp_path / "not-yet").exists()  # a diagnosis made nothing (no index, no toolchain memo)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc to name a directory no one can make")
def test_doctor_never_calls_a_directory_that_cannot_be_made_ok():
    proc = cachectl("doctor", env={"KERNEL_CACHE_DIR": "/proc/kc"})
    assert proc.returncode == 1
    row = next(line for line in proc.stdout.splitlines() if line.startswith("cache-dir"))
    assert "problem" in row and "cannot be created" in row, row


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed "
                    "(apt-get install redis-server; scripts/test.sh does it where it runs as root)")
def test_doctor_writes_nothing_to_the_remote(server, tmp_path):
    import redis

    client = redis.Redis.from_url(server.url)
    before = set(client.scan_iter(match="kc:doctor:*"))
    cachectl("doctor", env={"KERNEL_CACHE_DIR": str(tmp_path / "c"), "KERNEL_CACHE_REMOTE": server.url,
                            "KERNEL_CACHE_REMOTE_UNSIGNED": "1", "KERNEL_CACHE_REMOTE_NAMESPACE": "doctor"})
    assert set(client.scan_iter(match="kc:doctor:*")) == before
    assert not (tmp_path / "c").exists()


# one hit model -----------------------------------------------------------------------------------
def test_hits_agree_across_list_show_and_stats(record_copy):
    store = Store(Config(dir=record_copy.directory))
    assert store.lookup(record_copy.kernel) is not None  # a kernel read: a hit on the kernel
    store.stats.record_hit("disk", record_copy.call.key, 0.05)  # a record served a call whole
    store.stats.record_hit("disk", record_copy.call.key, 0.05)
    store.close()
    rows = {r["key"]: r["hits"] for r in as_json("--dir", record_copy.directory, "list")}
    assert rows[record_copy.kernel] == 1 and rows[record_copy.call.key] == 2
    shown = ok("--dir", record_copy.directory, "show", record_copy.call.key[:12]).stdout
    assert "hits 2 (calls it served whole" in shown, shown
    stats = as_json("--dir", record_copy.directory, "stats")
    assert sum(stats["hits"].values()) + sum(stats["record_hits"].values()) == sum(rows.values())
    text = ok("--dir", record_copy.directory, "stats").stdout
    assert "kernels: memory 0, disk 1, shared 0; call records: memory 0, disk 2, shared 0" in text, text


# warm sets ----------------------------------------------------------------------------------------
def _warm_set_over(directory, members: list[str]) -> str:
    store = Store(Config(dir=directory))
    entries = [store.get(key)[0] for key in members]
    entry = warm_set.to_entry(members[0], entries)
    store.put(entry)
    store.close()
    return entry.key


def test_a_warm_set_says_its_arch_and_goes_with_its_members(record_copy):
    members = [record_copy.call.key, record_copy.kernel]
    set_key = _warm_set_over(record_copy.directory, members)
    rows = {r["key"]: r for r in as_json("--dir", record_copy.directory, "list")}
    assert rows[set_key]["arch"] == "sm_90"
    proc = ok("--dir", record_copy.directory, "prune", "--kernel", "add*")
    assert set_key[:12] in proc.stdout  # removed with the members it copies
    assert set_key not in {r["key"] for r in as_json("--dir", record_copy.directory, "list")}


# an index that could not be made --------------------------------------------------------------------
CHILD = """
import json, subprocess, sys
out = {}
for command in json.loads(sys.argv[2]):
    proc = subprocess.run([sys.executable, "-m", "kernel_cache", "--dir", sys.argv[1], *command],
                          capture_output=True, text=True, timeout=300)
    out[" ".join(command)] = [proc.returncode, proc.stdout, proc.stderr]
print(json.dumps(out))
"""
COMMANDS = [["list"], ["stats"], ["prune"], ["prune", "--max-size", "1K"], ["verify"], ["show", "0123"],
            ["clear", "--yes"], ["export", "{out}"], ["doctor"], ["config"]]


@pytest.fixture
def full_disk(tmp_path):
    """A 48 KiB tmpfs, 40 KiB of it taken: a filesystem too full for a cache's entries (needs mount)."""
    mount = tmp_path / "full"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip("mounting a small tmpfs needs root with CAP_SYS_ADMIN (what CI's container has)")
    try:
        (mount / "fill").write_bytes(b"\0" * (40 << 10))
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


FIRST_USE = """
from kernel_cache import Entry, default_store
store = default_store()
store.put(Entry(key="ab" * 16, meta={"name": "k"}, blobs={"cubin": bytes(64 << 10)}))
"""


def test_a_cache_made_on_a_full_disk_is_read_by_every_command(full_disk, tmp_path):
    directory = full_disk / "cache"
    made = subprocess.run([sys.executable, "-c", FIRST_USE], cwd=ROOT,
                          env=child_env(KERNEL_CACHE_DIR=str(directory)), capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    assert (directory / ENTRIES_DIR).is_dir()  # the layout was made...
    assert [p for p in (directory / ENTRIES_DIR).rglob("*") if p.is_file()] == []  # ...the entry could not be
    commands = [[a.format(out=tmp_path / "x.tar") for a in c] for c in COMMANDS]
    proc = subprocess.run([sys.executable, "-c", CHILD, str(directory), json.dumps(commands)], cwd=ROOT,
                          env=child_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for command, (code, out, err) in json.loads(proc.stdout).items():
        assert "Traceback" not in out + err, (command, err[-2000:])
        assert code in (0, 1, 2), (command, code, err[-500:])
