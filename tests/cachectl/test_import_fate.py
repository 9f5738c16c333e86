"""`cachectl import` is all or nothing per bundle, and says exactly what happened to each entry.

A bundle that cannot be read to its end (truncated, damaged, an entry its manifest lists missing)
lands nothing and creates no cache: "imported 0 of N entries: ... damaged at entry K", exit 1. A
file that is no bundle at all (/etc/passwd, a gzip file of something else, another tarball) exits
2. When the level stops taking writes part-way, every entry's fate is reported (imported, failed,
not reached). Bundles here hold small synthetic entries (no Triton, no compiles); the CLI runs in
this process through cachectl's main().
"""

from __future__ import annotations

import errno
import gzip
import io
import json
import os
import re
import tarfile
from pathlib import Path

import pytest

from cachectl.main import main
from cachectl.move import bundle_file
from cachectl.move.bundle_file import (
    EVICTED,
    FAILED,
    IMPORTED,
    NOT_REACHED,
    PRESENT,
    REJECTED,
    BundleError,
    NotABundle,
    export_bundle,
    stage_bundle,
)
from kernel_cache.entries.entry import Entry, encode
from kernel_cache.trust.signing import Signer

KEYS = [f"{i:02x}" * 16 for i in range(0xa1, 0xa6)]  # five keys with distinct prefixes (a1a1…, a2a2…)
TARGET = {"backend": "cuda", "arch": 90, "warp_size": 32}
SIGNING_KEY = b"import-fate-signing-key-0123456789"


def entry_bytes(key: str, size: int = 3000) -> bytes:
    """A well-formed entry naming a target and a toolchain (as every real entry does)."""
    return encode(Entry(key=key, meta={"kernel": "synthetic_kernel", "name": "synthetic_kernel", "created": 1.7e9,
                                       "target": TARGET, "toolchain": {"summary": "triton-0.0.0+synthetic"}},
                        blobs={"cubin": os.urandom(size)}))


def good_bundle(path: Path, keys=KEYS) -> Path:
    export_bundle(path, [(k, entry_bytes(k), {"kernel": "synthetic_kernel"}) for k in keys])
    return path


def import_bundle(path: Path, level) -> bundle_file.ImportResult:
    with stage_bundle(path) as staged:
        return staged.publish(level)


def cut_bundle(good: Path, path: Path, entry: int) -> Path:
    """`good` re-compressed and cut inside its `entry`-th entry (from 1): a truncated tar."""
    raw = gzip.decompress(good.read_bytes())
    at = -1
    for _ in range(entry):
        at = raw.index(b"KCACHE", at + 1)
    path.write_bytes(gzip.compress(raw[:at + 100]))
    return path


def foreign_files(directory: Path) -> dict[str, Path]:
    """Files that are no kernel-cache bundle, each of another kind."""
    tarball = io.BytesIO()
    with tarfile.open(fileobj=tarball, mode="w:gz") as tar:
        info = tarfile.TarInfo("README")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"hello"))
    files = {"notes.gz": gzip.compress(b"not a bundle\n" * 100), "other.tar.gz": tarball.getvalue(),
             "notes.txt": b"not a bundle\n"}
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return {"/etc/passwd": Path("/etc/passwd"), **{name: directory / name for name in files}}


class DictLevel:
    """A level that keeps what it is given, optionally refusing from the n-th write on."""

    name = "dict"

    def __init__(self, fail_from: int | None = None, keep: bool = True):
        self.data: dict[str, bytes] = {}
        self.fail_from, self.keep, self.writes = fail_from, keep, 0

    def __contains__(self, key):
        return key in self.data

    def put_raw(self, key, data):
        self.writes += 1
        if self.fail_from is not None and self.writes >= self.fail_from:
            raise OSError("local cache is read-only here (disk full)")
        if self.keep:
            self.data[key] = data


def cachectl(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


# Damaged bundles land nothing ---------------------------------------------------------------------
def test_a_truncated_bundle_imports_nothing_and_says_where_it_broke(tmp_path, capsys):
    good = good_bundle(tmp_path / "good.kcb")
    cut = cut_bundle(good, tmp_path / "cut.kcb", entry=4)
    target = tmp_path / "cache"

    code, out, err = cachectl(capsys, "--dir", target, "import", cut, "--allow-stale")
    assert code == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"cachectl: imported 0 of {len(KEYS)} entries: {cut} is damaged at entry 4: ")
    assert "truncated" in lines[0]
    assert not target.exists()  # the cache is opened only for a bundle read whole

    code, out, _ = cachectl(capsys, "--dir", target, "import", cut, "--json")
    doc = json.loads(out)
    assert code == 1 and doc["exit_code"] == 1 and doc["schema"] == 2
    assert (doc["imported"], doc["expected"], doc["at_entry"], doc["fates"]) == (0, len(KEYS), 4, [])
    assert "damaged at entry 4" in doc["error"]

    # the same bundle whole lands every entry, into the same (new) directory
    code, out, _ = cachectl(capsys, "--dir", target, "import", good, "--allow-stale", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["imported"] == len(KEYS) and [f["fate"] for f in doc["fates"]] == [IMPORTED] * len(KEYS)


@pytest.mark.parametrize("damage", ["gzip trailer cut", "gzip stream cut", "entry missing from the manifest"])
def test_every_kind_of_damage_lands_nothing(tmp_path, damage):
    good = good_bundle(tmp_path / "good.kcb")
    bad = tmp_path / "bad.kcb"
    if damage == "gzip trailer cut":  # the tar is whole, the gzip's length and checksum are missing
        bad.write_bytes(good.read_bytes()[:-4])
    elif damage == "gzip stream cut":
        bad.write_bytes(good.read_bytes()[: good.stat().st_size * 2 // 3])
    else:  # a bundle re-packed without its last entry: the manifest still lists it
        raw = gzip.decompress(good.read_bytes())
        with tarfile.open(fileobj=io.BytesIO(raw)) as src, tarfile.open(bad, "w:gz") as dst:
            for info in src.getmembers()[:-1]:
                dst.addfile(info, src.extractfile(info))
    level = DictLevel()
    with pytest.raises(BundleError) as caught:
        import_bundle(bad, level)
    assert not isinstance(caught.value, NotABundle) and level.data == {} and level.writes == 0
    assert caught.value.expected == len(KEYS)
    if damage == "entry missing from the manifest":
        assert f"damaged: 1 of the {len(KEYS)} entries its manifest.json lists are missing ({KEYS[-1][:12]})" \
            in str(caught.value)


@pytest.mark.parametrize("name", ["/etc/passwd", "notes.gz", "other.tar.gz", "notes.txt"])
def test_a_file_that_is_no_bundle_exits_2_and_creates_nothing(tmp_path, capsys, name):
    path = foreign_files(tmp_path)[name]
    with pytest.raises(NotABundle):
        stage_bundle(path)
    target = tmp_path / "cache"
    code, out, err = cachectl(capsys, "--dir", target, "import", path)
    assert code == 2 and out == "" and "not a kernel-cache bundle" in err and len(err.strip().splitlines()) == 1
    assert not target.exists()


def test_a_truncated_foreign_tarball_is_still_no_bundle(tmp_path):
    other = foreign_files(tmp_path)["other.tar.gz"]
    cut = tmp_path / "other-cut.tar.gz"
    cut.write_bytes(other.read_bytes()[:-10])
    with pytest.raises(NotABundle, match="not a kernel-cache bundle"):
        stage_bundle(cut)


# Publishing part-way: each entry's fate -------------------------------------------------------------
def test_a_level_failing_part_way_reports_every_entrys_fate(tmp_path):
    level = DictLevel(fail_from=3)
    level.data[KEYS[0]] = b"already here"
    result = import_bundle(good_bundle(tmp_path / "b.kcb"), level)
    assert [(f.member, f.fate) for f in result.fates] == [
        (KEYS[0], PRESENT), (KEYS[1], IMPORTED), (KEYS[2], IMPORTED), (KEYS[3], FAILED), (KEYS[4], NOT_REACHED)]
    assert result.failed == [(KEYS[3], "local cache is read-only here (disk full)")]
    assert result.not_reached == [KEYS[4]] and not result.complete
    assert set(level.data) == set(KEYS[:3])


def test_a_level_that_silently_keeps_nothing_is_a_failure(tmp_path):
    result = import_bundle(good_bundle(tmp_path / "b.kcb", KEYS[:2]), DictLevel(keep=False))
    assert [f.fate for f in result.fates] == [FAILED, NOT_REACHED] and "did not keep it" in result.failed[0][1]


def test_cachectl_names_what_was_imported_and_what_was_not(tmp_path, capsys, monkeypatch):
    from kernel_cache.levels.disk import DiskLevel

    put_raw, writes = DiskLevel.put_raw, []

    def full_after_two(self, key, data):
        writes.append(key)
        if len(writes) > 2:
            raise OSError(f"local cache {self.directory} is read-only here (disk full)")
        put_raw(self, key, data)

    monkeypatch.setattr(DiskLevel, "put_raw", full_after_two)
    path = good_bundle(tmp_path / "b.kcb")
    code, out, err = cachectl(capsys, "--dir", tmp_path / "cache", "import", path, "--allow-stale")
    assert code == 1
    assert f"imported 2 of {len(KEYS)} entries" in out and f"writing {KEYS[2][:12]} failed" in out
    assert "2 more not reached (not imported)" in out
    assert f"failed    {KEYS[2]}: local cache" in err and "disk full" in err
    assert f"not reached {KEYS[3]}" in err and f"not reached {KEYS[4]}" in err

    writes.clear()
    code, out, _ = cachectl(capsys, "--dir", tmp_path / "cache2", "import", path, "--allow-stale", "--json")
    doc = json.loads(out)
    assert code == 1 and doc["imported"] == 2 and doc["not_reached"] == KEYS[3:]
    assert doc["failed"] == [{"key": KEYS[2], "reason": f"local cache {tmp_path / 'cache2'} is read-only here "
                                                          f"(disk full)"}]
    assert [f["fate"] for f in doc["fates"]] == [IMPORTED, IMPORTED, FAILED, NOT_REACHED, NOT_REACHED]


def test_entries_larger_than_the_local_bound_are_refused_before_any_lands(tmp_path, capsys, monkeypatch):
    """Importing more than KERNEL_CACHE_MAX_BYTES would evict the cache's own entries and then the
    bundle's: nothing lands, the setting is named, and what was there stays."""
    cache = tmp_path / "cache"
    assert cachectl(capsys, "--dir", cache, "import", good_bundle(tmp_path / "one.kcb", KEYS[:1]),
                    "--allow-stale")[0] == 0
    monkeypatch.setenv("KERNEL_CACHE_MAX_BYTES", "8K")  # the other four entries take about 12 KiB
    path = good_bundle(tmp_path / "b.kcb")
    code, out, err = cachectl(capsys, "--dir", cache, "import", path, "--allow-stale")
    assert code == 1 and out == ""
    assert f"imported 0 of {len(KEYS)} entries: they take " in err and "KERNEL_CACHE_MAX_BYTES=8.0 KiB" in err
    assert "--level shared" in err
    code, out, _ = cachectl(capsys, "--dir", cache, "import", path, "--allow-stale", "--json")
    doc = json.loads(out)
    assert code == 1 and doc["imported"] == 0 and doc["evicted"] == [] and "KERNEL_CACHE_MAX_BYTES" in doc["error"]
    code, out, _ = cachectl(capsys, "--dir", cache, "list", "--json")
    assert code == 0 and [row["key"] for row in json.loads(out)["entries"]] == KEYS[:1]


def test_an_entry_evicted_by_a_later_one_is_reported_evicted(tmp_path, capsys, monkeypatch):
    """A bounded level that drops an imported entry for a later entry of the same bundle: that entry's
    fate is 'evicted', the import is incomplete (exit 1) and the summary says why."""
    from kernel_cache.levels.disk import DiskLevel

    put_raw, writes = DiskLevel.put_raw, []

    def keeps_only_the_last_two(self, key, data):  # as an LRU bound of two entries would
        put_raw(self, key, data)
        writes.append(key)
        if len(writes) > 2:
            self.delete(writes[-3])

    monkeypatch.setattr(DiskLevel, "put_raw", keeps_only_the_last_two)
    path = good_bundle(tmp_path / "b.kcb", KEYS[:4])
    code, out, err = cachectl(capsys, "--dir", tmp_path / "cache", "import", path, "--allow-stale")
    assert code == 1
    assert "imported 2 of 4 entries" in out and "2 evicted again by later entries (the disk level's size bound)" in out
    for key in KEYS[:2]:
        assert f"evicted   {key}: the disk level evicted it for a later entry of the bundle" in err
    writes.clear()
    code, out, _ = cachectl(capsys, "--dir", tmp_path / "cache2", "import", path, "--allow-stale", "--json")
    doc = json.loads(out)
    assert code == 1 and doc["imported"] == 2 and doc["evicted"] == KEYS[:2]
    assert [f["fate"] for f in doc["fates"]] == [EVICTED, EVICTED, IMPORTED, IMPORTED]
    assert doc["bytes"] == sum(len(entry_bytes(k)) for k in KEYS[2:4])


def test_rejected_entries_are_named_and_the_good_ones_land(tmp_path, capsys):
    tampered = bytearray(entry_bytes(KEYS[1]))
    tampered[-1] ^= 1
    path = tmp_path / "mixed.kcb"
    export_bundle(path, [(KEYS[0], entry_bytes(KEYS[0]), {}), (KEYS[1], bytes(tampered), {}),
                         (KEYS[2], entry_bytes(KEYS[2]), {})])
    code, out, err = cachectl(capsys, "--dir", tmp_path / "cache", "import", path, "--allow-stale", "-v")
    assert code == 1
    assert f"imported  {KEYS[0]}" in out and f"imported  {KEYS[2]}" in out
    assert f"rejected  {KEYS[1]}: entry checksum mismatch" in err
    assert "imported 2 of 3 entries" in out and "1 rejected" in out


# Staging ----------------------------------------------------------------------------------------------
def test_staging_spills_to_a_temporary_file_and_publishes_the_same_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(bundle_file, "STAGING_MEMORY_BYTES", 4096)  # every entry is ~3 KiB: spills at the second
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    entries = {k: entry_bytes(k) for k in KEYS}
    path = tmp_path / "b.kcb"
    export_bundle(path, [(k, data, {}) for k, data in entries.items()])
    level = DictLevel()
    with stage_bundle(path) as staged:
        assert staged.expected == len(KEYS)
        assert staged._spool._rolled  # on disk now, not in memory
        result = staged.publish(level)
    assert result.imported == KEYS and level.data == entries


def test_no_room_to_stage_imports_nothing(tmp_path, capsys, monkeypatch):
    import tempfile

    class Full(tempfile.SpooledTemporaryFile):
        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "SpooledTemporaryFile", Full)
    path = good_bundle(tmp_path / "b.kcb")
    code, out, err = cachectl(capsys, "--dir", tmp_path / "cache", "import", path, "--allow-stale")
    assert code == 1 and not (tmp_path / "cache").exists()
    assert f"imported 0 of {len(KEYS)} entries: cannot stage the bundle's entries" in err and "TMPDIR" in err


# Signing: messages name the setting that was set -------------------------------------------------------
@pytest.mark.parametrize("setting", ["KERNEL_CACHE_SIGNING_KEY_FILE", "KERNEL_CACHE_SIGNING_KEY"])
def test_an_unsigned_entry_is_rejected_naming_the_setting_in_use(tmp_path, capsys, monkeypatch, setting):
    if setting == "KERNEL_CACHE_SIGNING_KEY_FILE":
        key_file = tmp_path / "team.key"
        key_file.write_bytes(SIGNING_KEY + b"\n")
        key_file.chmod(0o600)
        monkeypatch.setenv(setting, str(key_file))
    else:
        monkeypatch.setenv(setting, SIGNING_KEY.decode())
    path = tmp_path / "b.kcb"
    export_bundle(path, [(KEYS[0], Signer(SIGNING_KEY).sign(entry_bytes(KEYS[0])), {}),
                         (KEYS[1], entry_bytes(KEYS[1]), {})])
    code, out, err = cachectl(capsys, "--dir", tmp_path / "cache", "import", path, "--allow-stale", "--json")
    doc = json.loads(out)
    assert code == 1 and doc["imported"] == 1
    [(member, reason)] = [(r["member"], r["reason"]) for r in doc["rejected"]]
    assert member == KEYS[1] and reason.startswith("unsigned")
    assert f"({setting} is set" in reason and re.findall(r"KERNEL_CACHE_\w+", reason) == [setting]
    assert [f["fate"] for f in doc["fates"]] == [IMPORTED, REJECTED]


def test_a_short_key_file_is_refused_naming_the_file_setting(tmp_path):
    from kernel_cache import Config, ConfigError

    key_file = tmp_path / "short.key"
    key_file.write_bytes(b"short\n")
    key_file.chmod(0o600)
    with pytest.raises(ConfigError) as caught:
        Config.from_env({"KERNEL_CACHE_SIGNING_KEY_FILE": str(key_file)})
    message = str(caught.value)
    assert message.startswith(f"KERNEL_CACHE_SIGNING_KEY_FILE={key_file}: ") and "at least 16 bytes (got 5)" in message
    with pytest.raises(ConfigError, match="^KERNEL_CACHE_SIGNING_KEY: a signing key needs at least 16 bytes"):
        Config.from_env({"KERNEL_CACHE_SIGNING_KEY": "short"})
