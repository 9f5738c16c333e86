"""cachectl on lowered-call records (kernel_cache.entries.call_entry): list and stats tell them from
kernels, show explains one, verify catches a broken one, prune/export/import treat them as entries
(stale by toolchain like kernels), prewarm does not count them as kernels.

The cache holds one real compiled kernel (add, sm_90) and records built directly as the lowering
builds them (`CallRecord.to_entry`), one of them pointing at a stored autotune winner; the
lowering's own records are covered by test_cachectl.py's prewarm-from-a-program test.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
import zlib
from pathlib import Path

import pytest
import xxhash
from test_cachectl import as_json, cachectl, listed_keys, ok

from cachectl import entry_kinds
from cachectl.inventory import EntryInfo, counts
from cachectl.render import human_size
from cachectl.see.listing import total_line
from kernel_cache import Config, Store, value_class
from kernel_cache.entries import entry as entry_format
from kernel_cache.entries import winner_entry
from kernel_cache.entries.call_entry import KIND, CallRecord
from kernel_cache.levels.disk import DiskLevel

GPU = "Test GPU 80GB"
UNCACHED = xxhash.xxh3_128_hexdigest(b"a config compiled elsewhere, never cached here")
OLD_TOOLCHAIN = "triton-3.0.0+0123456789ab"


def key_of(name: str) -> str:
    return xxhash.xxh3_128_hexdigest(name.encode())


@dataclasses.dataclass
class Cache:
    directory: Path
    kernel: str  # the real kernel's content key
    call: CallRecord  # a record holding its payload
    pointer: CallRecord  # an autotuned call's record holding only its winner key
    winner: winner_entry.Winner

    @property
    def keys(self) -> set[str]:
        return {self.kernel, self.call.key, self.pointer.key, self.winner.key}


@pytest.fixture(scope="module")
def record_cache(tmp_path_factory) -> Cache:
    from compiler import get_or_compile
    from compiler.examples import example_specs

    directory = tmp_path_factory.mktemp("records") / "cache"
    store = Store(Config(dir=directory))
    artifact_key = get_or_compile(dict(example_specs("sm_90"))["add"], store)[1]
    found = store.get(artifact_key)
    assert found is not None
    meta = found[0].meta
    target, toolchain = meta["target"], meta["toolchain"]["summary"]
    win = winner_entry.Winner(kernel="add_kernel", arch="sm_90", target=target, toolchain=toolchain, device=GPU,
                              key_values=winner_entry.canonical({"n": 4096}), key_text="n=4096",
                              configs=(winner_entry.ConfigTiming(artifact_key, "BLOCK: 256", 1e-3),
                                       winner_entry.ConfigTiming(UNCACHED, "BLOCK: 512", 2e-3)),
                              winner=0, reps=5, label="test")
    call = CallRecord(key=key_of("call"), kernel="add_kernel", call_name="add", platform="cuda", arch="sm_90",
                      target=target, toolchain=toolchain, config_keys=(artifact_key,), compile_seconds=0.05,
                      payload=zlib.compress(b"the proto jaxlib launches " * 64), created=time.time())
    pointer = value_class.replace(call, key=key_of("pointer"), config_keys=(artifact_key, UNCACHED), payload=None,
                                  winner_key=win.key, compile_seconds=0.0)
    for entry in (call.to_entry(), pointer.to_entry(), win.to_entry()):
        store.put(entry)
    store.close()
    return Cache(directory, artifact_key, call, pointer, win)


@pytest.fixture
def record_copy(record_cache, tmp_path) -> Cache:
    shutil.copytree(record_cache.directory, tmp_path / "cache")
    return dataclasses.replace(record_cache, directory=tmp_path / "cache")


def test_list_labels_records_and_totals_by_kind(record_cache):
    c = record_cache
    text = ok("--dir", c.directory, "list").stdout
    assert f"{c.call.key[:12]}  add_kernel [call]" in text and f"{c.pointer.key[:12]}  add_kernel [call]" in text
    assert f"{c.kernel[:12]}  add_kernel " in text and f"{c.winner.key[:12]}  add_kernel [winner]" in text
    total = next(line for line in text.splitlines() if line.endswith("B") and " entries" in line)
    assert total.startswith("4 entries (1 kernel, 2 lowered calls, 1 winner), ")
    assert "entries" not in ok("--dir", c.directory, "list", "-q").stdout  # the rows alone

    rows = {r["key"]: r for r in as_json("--dir", c.directory, "list")}
    assert set(rows) == c.keys
    call, pointer, kernel = rows[c.call.key], rows[c.pointer.key], rows[c.kernel]
    assert call["kind"] == KIND and call["kernel"] == "add_kernel" and call["arch"] == "sm_90"
    assert call["call"] == {"call_name": "add", "platform": "cuda", "kernels": [c.kernel], "winner_key": ""}
    assert pointer["call"]["kernels"] == [c.kernel, UNCACHED] and pointer["call"]["winner_key"] == c.winner.key
    assert kernel["call"] is None and rows[c.winner.key]["call"] is None
    # a record carries its kernels' target and toolchain: checked for staleness like them
    assert call["stale"] is False and pointer["stale"] is False and call["has_recipe"] is False
    assert listed_keys(c.directory, "--kernel", "add*", "--arch", "sm_80") == set()


def test_show_explains_a_record_and_a_pointer_record(record_cache):
    c = record_cache
    shown = ok("--dir", c.directory, "show", c.call.key[:10]).stdout
    assert "lowered call add_kernel, call name 'add'\n" in shown and "platform     cuda  arch sm_90\n" in shown
    assert f"kernels      1: {c.kernel[:12]}\n" in shown and "winner key" not in shown
    assert f"payload      {human_size(len(c.call.payload or b''))} (the compressed call" in shown
    assert f"toolchain    {c.call.toolchain}\n" in shown

    pointer = ok("--dir", c.directory, "show", c.pointer.key).stdout
    assert f"kernels      2 (autotuned): {c.kernel[:12]}, {UNCACHED[:12]} (not cached)\n" in pointer
    assert f"winner key   {c.winner.key[:12]} (stored)\n" in pointer
    assert "payload      none: no payload, it points at its winner" in pointer

    doc = as_json("--dir", c.directory, "show", c.pointer.key)
    assert doc["kind"] == KIND and doc["blobs"] == {} and doc["call"]["winner_key"] == c.winner.key
    assert as_json("--dir", c.directory, "show", c.call.key)["blobs"] == {"payload": len(c.call.payload or b"")}
    no_ptx = cachectl("--dir", c.directory, "show", c.call.key, "--ptx")
    assert no_ptx.returncode == 1 and "has no ptx" in no_ptx.stderr


def test_show_says_when_the_winner_is_not_stored(record_copy):
    c = record_copy
    disk = DiskLevel(c.directory)
    assert disk.delete(c.winner.key)
    disk.close()
    pointer = ok("--dir", c.directory, "show", c.pointer.key).stdout
    assert f"winner key   {c.winner.key[:12]} (none stored yet: 'cachectl tune' learns it)" in pointer


def test_stats_counts_entries_by_kind(record_cache):
    c = record_cache
    stats = as_json("--dir", c.directory, "stats")
    assert stats["entries"] == 4
    assert stats["kinds"] == {"triton-kernel": 1, "lowered-call": 2, "autotune-winner": 1}
    assert "entry kinds          1 kernel, 2 lowered calls, 1 winner\n" in ok("--dir", c.directory, "stats").stdout


def _write_raw(directory, entry) -> None:
    """Put an entry's bytes into the local level as they are: a valid checksum over a bad record."""
    disk = DiskLevel(directory)
    disk.put_raw(entry.key, entry_format.encode(entry))
    disk.close()


def test_verify_reports_and_repairs_broken_records(record_copy):
    c = record_copy
    assert ok("--dir", c.directory, "verify").stdout.strip() == "checked 4 entries: 0 bad"
    not_zlib = value_class.replace(c.call, key=key_of("not zlib")).to_entry()
    not_zlib.blobs["payload"] = b"this is no zlib stream at all"
    truncated = value_class.replace(c.call, key=key_of("truncated")).to_entry()
    truncated.blobs["payload"] = (c.call.payload or b"")[:-6]
    no_keys = value_class.replace(c.call, key=key_of("no keys")).to_entry()
    no_keys.meta["config_keys"] = ["not-a-content-key"]
    for entry in (not_zlib, truncated, no_keys):
        _write_raw(c.directory, entry)

    bad = cachectl("--dir", c.directory, "verify", "--json")
    assert bad.returncode == 1
    report = json.loads(bad.stdout)
    reasons = {b["key"]: b["reason"] for b in report["bad"]}
    assert report["checked"] == 7 and set(reasons) == {not_zlib.key, truncated.key, no_keys.key}
    assert reasons[not_zlib.key].startswith("lowered-call payload is not a zlib stream")
    assert reasons[truncated.key].startswith("lowered-call payload is truncated")
    assert "no content key" in reasons[no_keys.key]
    assert f"BAD  {not_zlib.key}  (disk): lowered-call payload" in cachectl("--dir", c.directory, "verify").stdout

    repaired = cachectl("--dir", c.directory, "verify", "--repair")
    assert repaired.returncode == 0 and "3 bad, 3 removed" in repaired.stdout
    assert listed_keys(c.directory) == c.keys


def test_prune_export_import_treat_records_as_entries(record_copy, tmp_path):
    c = record_copy
    stale = value_class.replace(c.call, key=key_of("stale"), toolchain=OLD_TOOLCHAIN)
    store = Store(Config(dir=c.directory))
    store.put(stale.to_entry())
    store.close()
    assert listed_keys(c.directory, "--stale") == {stale.key}

    bundle = tmp_path / "warm.kcb"
    assert as_json("--dir", c.directory, "export", bundle)["entries"] == 5
    fresh = tmp_path / "fresh"
    imported = as_json("--dir", fresh, "import", bundle)
    assert imported["imported"] == 4 and imported["stale"] == 1 and imported["rejected"] == []
    assert listed_keys(fresh) == c.keys and ok("--dir", fresh, "verify").returncode == 0
    moved = Store(Config(dir=fresh))
    found = moved.get(c.call.key)
    moved.close()
    assert found is not None and CallRecord.from_entry(found[0]) == c.call

    pruned = as_json("--dir", c.directory, "prune", "--stale")
    assert [(r["key"], r["kind"], r["stale"]) for r in pruned["removed"]] == [(stale.key, KIND, True)]
    dry = as_json("--dir", c.directory, "prune", "--kernel", "add_kernel", "--dry-run")
    assert sorted(r["kind"] for r in dry["removed"]) == ["autotune-winner", "lowered-call", "lowered-call",
                                                         "triton-kernel"]
    rows = ok("--dir", c.directory, "prune", "--kernel", "add_kernel", "--dry-run").stdout.splitlines()
    tags = sorted(row.split("  ")[2] for row in rows if row.startswith("would remove  "))  # as list tags them
    assert tags == ["add_kernel", "add_kernel [call]", "add_kernel [call]", "add_kernel [winner]"], rows


def test_prewarm_counts_kernels_not_records(record_cache):
    c = record_cache
    out = ok("--dir", c.directory, "prewarm", "--arch", "sm_90", "--allow-module", "compiler.examples", "-v").stdout
    assert "built 0, already present 1, failed 0" in out
    assert "record no recipe" not in out  # records and winners have none, and are no kernels
    report = as_json("--dir", c.directory, "prewarm", "--arch", "sm_90", "--allow-module", "compiler.examples")
    assert [(o["status"], o["key"]) for o in report["outcomes"]] == [("present", c.kernel)]


def test_kinds_name_every_entry():
    from compiler.artifact import KIND as ARTIFACT_KIND

    assert entry_kinds.KERNEL.name == ARTIFACT_KIND  # the kernel kind cachectl names without importing the compiler

    def info(kind: str, error: str = "") -> EntryInfo:
        return EntryInfo(key="0" * 32, level="disk", kernel="k", arch="sm_90", size_bytes=1024, created=0,
                         last_used=0, kind=kind, error=error)

    infos = [info(KIND), info(entry_kinds.KERNEL.name), info(KIND), info("from-a-newer-version"), info("", "bad checksum")]
    assert counts(infos) == {"triton-kernel": 1, "lowered-call": 2, "other": 1, "unreadable": 1}
    assert total_line(infos) == "5 entries (1 kernel, 2 lowered calls, 1 other, 1 unreadable), 5.0 KiB"
    assert total_line([]) == "0 entries, 0 B"
    assert [i.label for i in infos[:2]] == ["k [call]", "k"]
    assert infos[-1].label == "<corrupt: bad checksum>"
