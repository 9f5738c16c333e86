"""Bundles from strangers: `import` reads a bounded stream and stops at the first cap exceeded.

Bundles are built here with tarfile/gzip directly (no Triton, no compiles); entries are small
synthetic ones. Most tests import into a dict-backed level: the bundle reader is what is tested.
"""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
import tarfile
import textwrap
import time
import zlib
from pathlib import Path

import pytest
from conftest import ROOT, child_env

from cachectl.move import bundle_file, tar_stream
from cachectl.move.bundle_file import BundleError, export_bundle, stage_bundle
from kernel_cache.entries.entry import Entry, encode

KEYS = [f"{i:032x}" for i in range(1, 6)]
MANIFEST = json.dumps({"format": "kernel-cache-bundle", "version": 1, "entries": []}).encode()
MiB = 1 << 20


class DictLevel:
    """The two methods import_bundle uses of a level."""

    def __init__(self):
        self.data: dict[str, bytes] = {}

    def __contains__(self, key):
        return key in self.data

    def put_raw(self, key, data):
        assert isinstance(data, bytes)
        self.data[key] = data


def import_bundle(path: Path, level, **options) -> bundle_file.ImportResult:
    with stage_bundle(path, **options) as staged:
        return staged.publish(level)


def entry_bytes(key: str, size: int = 2000) -> bytes:
    return encode(Entry(key=key, meta={"name": "synthetic_kernel", "created": 1.7e9},
                        blobs={"cubin": bytes(range(256)) * (size // 256 + 1)}))


class Zeros(io.RawIOBase):
    """n zero bytes, read in chunks: a bomb member is built without holding it in memory."""

    def __init__(self, n: int):
        self.left = n

    def readable(self):
        return True

    def readinto(self, buf):
        n = min(len(buf), self.left)
        buf[:n] = bytes(n)
        self.left -= n
        return n


def member(name: str, data: bytes | int = b"", kind=tarfile.REGTYPE, linkname: str = "") -> tuple:
    """(TarInfo, file object or None); `data` an int is that many zero bytes, streamed."""
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mtime, info.mode = kind, linkname, int(time.time()), 0o644
    if kind != tarfile.REGTYPE:
        return info, None
    if isinstance(data, int):
        info.size = data
        return info, Zeros(data)
    info.size = len(data)
    return info, io.BytesIO(data)


def write_bundle(path: Path, members: list[tuple], fmt=tarfile.PAX_FORMAT) -> Path:
    with tarfile.open(path, "w:gz", format=fmt) as tar:
        for info, fileobj in members:
            tar.addfile(info, fileobj)
    return path


def good_members(keys=KEYS[:2]) -> list[tuple]:
    return [member(f"entries/{k}.kce", entry_bytes(k)) for k in keys]


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# Good bundles --------------------------------------------------------------------------------
def test_exported_bundle_has_manifest_first_and_imports(tmp_path):
    path = tmp_path / "good.kcb"
    result = export_bundle(path, [(k, entry_bytes(k), {"kernel": "synthetic_kernel"}) for k in KEYS])
    assert result.entries == len(KEYS)
    with tarfile.open(path, "r:gz") as tar:
        assert tar.getnames()[0] == "manifest.json"
    level = DictLevel()
    imported = import_bundle(path, level)
    assert imported.imported == KEYS and imported.rejected == [] and set(level.data) == set(KEYS)
    assert level.data[KEYS[0]] == entry_bytes(KEYS[0])
    assert import_bundle(path, level).present == KEYS


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_bundle_with_manifest_last_still_imports(tmp_path, fmt):
    """Bundles written before the manifest moved first: read twice, nothing lands before it."""
    path = write_bundle(tmp_path / "old.kcb", good_members() + [member("manifest.json", MANIFEST)], fmt)
    level = DictLevel()
    result = import_bundle(path, level)
    assert result.imported == KEYS[:2] and result.rejected == []

    bad = json.dumps({"format": "kernel-cache-bundle", "version": 99}).encode()
    future = write_bundle(tmp_path / "future.kcb", good_members() + [member("manifest.json", bad)], fmt)
    fresh = DictLevel()
    with pytest.raises(BundleError, match="bundle version 99"):
        import_bundle(future, fresh)
    assert fresh.data == {}


def test_long_member_names_in_pax_and_gnu_headers(tmp_path):
    long_name = "entries/" + "a" * 300 + ".kce"
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        path = write_bundle(tmp_path / f"long-{fmt}.kcb",
                            [member("manifest.json", MANIFEST), member(long_name, b"x")] + good_members(), fmt)
        result = import_bundle(path, DictLevel())
        assert result.imported == KEYS[:2]
        assert result.rejected == [(long_name[:200] + "…", "not an entry of a kernel-cache bundle")]


def test_accept_hook_rejects_with_its_reason(tmp_path):
    path = write_bundle(tmp_path / "b.kcb", [member("manifest.json", MANIFEST)] + good_members())
    seen = []

    def accept(raw: bytes):
        seen.append(raw)
        return "unsigned entry" if raw == entry_bytes(KEYS[1]) else None

    level = DictLevel()
    result = import_bundle(path, level, accept=accept)
    assert len(seen) == 2 and all(isinstance(raw, bytes) for raw in seen)
    assert result.imported == [KEYS[0]] and result.rejected == [(KEYS[1], "unsigned entry")]
    assert set(level.data) == {KEYS[0]}


def test_a_record_that_verify_would_refuse_is_not_imported(tmp_path):
    """A lowered-call record whose payload is no zlib stream (format and checksum valid) is rejected
    with verify's reason; a well-formed one lands."""
    from kernel_cache.entries.call_entry import CallRecord

    def record(key: str, payload: bytes) -> bytes:
        return encode(CallRecord(key=key, kernel="add_kernel", call_name="add", platform="cuda", arch="sm_90",
                                 target={"backend": "cuda", "arch": 90, "warp_size": 32}, toolchain="t",
                                 config_keys=(KEYS[2],), compile_seconds=0.1, payload=payload).to_entry())

    good, bad = record(KEYS[0], zlib.compress(b"proto")), record(KEYS[1], b"not zlib at all")
    path = write_bundle(tmp_path / "b.kcb", [member("manifest.json", MANIFEST), member(f"entries/{KEYS[0]}.kce", good),
                                             member(f"entries/{KEYS[1]}.kce", bad)])
    level = DictLevel()
    result = import_bundle(path, level)
    assert result.imported == [KEYS[0]] and set(level.data) == {KEYS[0]}
    assert [k for k, _ in result.rejected] == [KEYS[1]] and "zlib" in result.rejected[0][1]


# Path tricks and odd member types ---------------------------------------------------------------
def test_path_tricks_links_and_devices_rejected_without_touching_the_filesystem(tmp_path, monkeypatch):
    work = tmp_path / "work"
    (work / "entries").mkdir(parents=True)
    monkeypatch.chdir(work)
    target_key = KEYS[0]
    evil = [
        member("../x", b"escaped"),
        member("/tmp/kernel-cache-absolute-x", b"absolute"),
        member(f"entries/../../{KEYS[3]}.kce", entry_bytes(KEYS[3])),
        member(f"./entries/{KEYS[4]}.kce", entry_bytes(KEYS[4])),
        member(f"entries/{KEYS[1]}.kce", kind=tarfile.SYMTYPE, linkname="/etc/passwd"),
        member(f"entries/{KEYS[2]}.kce", kind=tarfile.LNKTYPE, linkname=f"entries/{target_key}.kce"),
        member("entries/null", kind=tarfile.CHRTYPE),
        member("entries/disk", kind=tarfile.BLKTYPE),
        member("entries/fifo", kind=tarfile.FIFOTYPE),
        member("entries/", kind=tarfile.DIRTYPE),
        member("bad\nname\x1b[31m", b"terminal tricks"),
    ]
    before = tree(tmp_path)
    path = write_bundle(tmp_path / "evil.kcb", [member("manifest.json", MANIFEST)] + evil +
                        [member(f"entries/{target_key}.kce", entry_bytes(target_key))])
    level = DictLevel()
    result = import_bundle(path, level)
    assert result.imported == [target_key] and set(level.data) == {target_key}
    rejected = dict(result.rejected)
    assert len(rejected) == len(evil)
    assert set(rejected.values()) == {"not an entry of a kernel-cache bundle"}
    assert "../x" in rejected and "/tmp/kernel-cache-absolute-x" in rejected
    assert "bad\\nname\\x1b[31m" in rejected  # printable when reported
    assert tree(tmp_path) == before | {"evil.kcb"}
    assert not Path("/tmp/kernel-cache-absolute-x").exists()


# Caps -------------------------------------------------------------------------------------------
BOMB_CHILD = textwrap.dedent("""
    import json, resource, sys, tracemalloc
    from cachectl.move import tar_stream
    from cachectl.move.bundle_file import BundleError, stage_bundle

    class DictLevel(dict):
        def put_raw(self, key, data):
            self[key] = data

    path, caps = sys.argv[1], json.loads(sys.argv[2])
    tar_stream.MAX_TOTAL_BYTES = caps.pop("MAX_TOTAL_BYTES", tar_stream.MAX_TOTAL_BYTES)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    try:
        with stage_bundle(path, **caps) as staged:
            staged.publish(DictLevel())
        error = None
    except BundleError as exc:
        error = str(exc)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    rss_growth = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) * 1024
    print(json.dumps({"error": error, "peak": peak, "rss_growth": rss_growth}))
""")


@pytest.fixture(scope="module")
def gzip_bomb(tmp_path_factory) -> Path:
    """A 64 MiB entry member of zeros: about 64 KiB of gzip."""
    path = tmp_path_factory.mktemp("bomb") / "bomb.kcb"
    write_bundle(path, [member("manifest.json", MANIFEST), member(f"entries/{KEYS[0]}.kce", 64 * MiB)])
    assert path.stat().st_size < MiB
    return path


@pytest.mark.parametrize("caps, cap_named", [
    ({"MAX_TOTAL_BYTES": 8 * MiB}, "total-size cap"),  # counted as decompressed, not from the header
    ({"max_entry_bytes": 8 * MiB}, "per-entry cap"),  # refused from the header, before any data
])
def test_gzip_bomb_stops_at_the_cap_with_low_memory(gzip_bomb, caps, cap_named):
    proc = subprocess.run([sys.executable, "-c", BOMB_CHILD, str(gzip_bomb), json.dumps(caps)], cwd=ROOT,
                          env=child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["error"] is not None and cap_named in report["error"] and "stopped reading" in report["error"]
    assert report["peak"] < 16 * MiB, report  # the bomb is 64 MiB; reading it whole peaks above that
    assert report["rss_growth"] < 32 * MiB, report


def test_total_cap_counts_every_decompressed_byte(tmp_path, monkeypatch):
    """Members each under the entry cap, skipped junk included, add up past the total cap."""
    junk = [member(f"junk/{i}", 1 * MiB) for i in range(12)]
    path = write_bundle(tmp_path / "many.kcb", [member("manifest.json", MANIFEST)] + junk)
    monkeypatch.setattr(tar_stream, "MAX_TOTAL_BYTES", 8 * MiB)
    with pytest.raises(BundleError, match="expands to more than 8 MiB .the total-size cap.; .* exported in parts"):
        import_bundle(path, DictLevel(), max_entry_bytes=2 * MiB)
    monkeypatch.setattr(tar_stream, "MAX_TOTAL_BYTES", 16 * MiB)
    assert import_bundle(path, DictLevel(), max_entry_bytes=2 * MiB).imported == []


def test_too_many_members(tmp_path, monkeypatch):
    path = write_bundle(tmp_path / "many.kcb",
                        [member("manifest.json", MANIFEST)] + [member(f"junk/{i}", b"x") for i in range(50)])
    level = DictLevel()
    monkeypatch.setattr(tar_stream, "MAX_MEMBERS", 10)
    with pytest.raises(BundleError, match="more than 10 members .the member-count cap."):
        import_bundle(path, level)
    monkeypatch.setattr(tar_stream, "MAX_MEMBERS", 51)
    assert len(import_bundle(path, level).rejected) == 50


@pytest.mark.parametrize("manifest_first", [True, False])
def test_member_over_the_entry_cap(tmp_path, manifest_first):
    big = member(f"entries/{KEYS[2]}.kce", entry_bytes(KEYS[2], size=3 * MiB))
    manifest = [member("manifest.json", MANIFEST)]
    members = manifest + [big] + good_members() if manifest_first else [big] + good_members() + manifest
    path = write_bundle(tmp_path / "big.kcb", members)
    level = DictLevel()
    with pytest.raises(BundleError, match=f"entries/{KEYS[2]}.kce holds 3 MiB, over the 2 MiB per-entry cap"):
        import_bundle(path, level, max_entry_bytes=2 * MiB)
    assert level.data == {}  # the cap was met before any entry: nothing landed
    assert len(import_bundle(path, level, max_entry_bytes=4 * MiB).imported) == 3


@pytest.mark.parametrize("manifest_first", [True, False])
def test_oversize_manifest(tmp_path, monkeypatch, manifest_first):
    padded = json.dumps({"format": "kernel-cache-bundle", "version": 1, "entries": [],
                         "padding": "x" * (2 * MiB)}).encode()
    manifest = [member("manifest.json", padded)]
    path = write_bundle(tmp_path / "fat.kcb", manifest + good_members() if manifest_first
                        else good_members() + manifest)
    level = DictLevel()
    monkeypatch.setattr(tar_stream, "MAX_MANIFEST_BYTES", 1 * MiB)
    with pytest.raises(BundleError, match="manifest.json holds 2 MiB, over the 1 MiB manifest cap"):
        import_bundle(path, level)
    assert level.data == {}
    monkeypatch.setattr(tar_stream, "MAX_MANIFEST_BYTES", 4 * MiB)
    assert len(import_bundle(path, level).imported) == 2


@pytest.mark.parametrize("manifest", [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"format": "kernel-cache-bundle", "version": 1, "entries": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"a": ' * 100_000 + b"1" + b"}" * 100_000,
])
def test_deeply_nested_manifest_is_refused_before_parsing(tmp_path, manifest):
    path = write_bundle(tmp_path / "deep.kcb", [member("manifest.json", manifest)] + good_members())
    level = DictLevel()
    with pytest.raises(BundleError, match="nests deeper than 32 levels"):
        import_bundle(path, level)
    assert level.data == {}


def test_brackets_inside_strings_do_not_count_as_nesting(tmp_path):
    manifest = json.dumps({"format": "kernel-cache-bundle", "version": 1, "entries": [],
                           "note": "[{" * 50_000 + '\\"]'}).encode()
    assert bundle_file.json_depth(manifest) == 2
    assert bundle_file.json_depth(b'[[["\\"[[[[[[", [1]]]]') == 4
    path = write_bundle(tmp_path / "b.kcb", [member("manifest.json", manifest)] + good_members())
    assert len(import_bundle(path, DictLevel()).imported) == 2


def test_entry_metadata_too_deep_to_decode_is_rejected_not_raised(tmp_path, monkeypatch):
    """Entry metadata depth is the entry format's to cap; a RecursionError that gets through
    rejects that one entry instead of ending the import with a traceback."""
    from kernel_cache.entries import entry as entry_format

    decode = entry_format.decode

    def deep_for_one(data, expected_key=None):
        if expected_key == KEYS[0]:
            raise RecursionError("maximum recursion depth exceeded while decoding a JSON array")
        return decode(data, expected_key=expected_key)

    monkeypatch.setattr(entry_format, "decode", deep_for_one)
    path = write_bundle(tmp_path / "b.kcb", [member("manifest.json", MANIFEST)] + good_members())
    result = import_bundle(path, DictLevel())
    assert result.imported == [KEYS[1]] and result.rejected == [(KEYS[0], "entry metadata is nested too deeply")]


def test_damaged_and_foreign_files(tmp_path):
    good = write_bundle(tmp_path / "good.kcb", [member("manifest.json", MANIFEST)] + good_members(KEYS))
    cut = tmp_path / "cut.kcb"
    raw = gzip.decompress(good.read_bytes())
    third_entry = raw.index(b"KCACHE", raw.index(b"KCACHE", raw.index(b"KCACHE") + 1) + 1)
    cut.write_bytes(gzip.compress(raw[: third_entry + 100]))
    level = DictLevel()
    with pytest.raises(BundleError, match="is damaged at entry 3"):
        import_bundle(cut, level)
    assert level.data == {}  # all or nothing: the two entries read before the damage did not land

    truncated_gzip = tmp_path / "truncated.kcb"
    truncated_gzip.write_bytes(good.read_bytes()[:200])
    with pytest.raises(BundleError, match="is damaged|not a kernel-cache bundle"):
        import_bundle(truncated_gzip, DictLevel())

    for name, content in [("plain.kcb", b"not a tarball at all"), ("gz.kcb", gzip.compress(b"hello" * 1000)),
                          ("empty.kcb", b"")]:
        (tmp_path / name).write_bytes(content)
        with pytest.raises(BundleError, match="not a kernel-cache bundle"):
            stage_bundle(tmp_path / name)
    nomanifest = write_bundle(tmp_path / "nomanifest.kcb", good_members())
    with pytest.raises(BundleError, match="has no manifest.json"):
        import_bundle(nomanifest, DictLevel())


def test_cachectl_import_reports_the_cap(tmp_path, monkeypatch):
    """Through the CLI: the cap's BundleError is one line on stderr, exit 1."""
    path = write_bundle(tmp_path / "many.kcb",
                        [member("manifest.json", MANIFEST)] + [member(f"junk/{i}", b"x") for i in range(20)])
    code = (f"import sys; from cachectl import main; from cachectl.move import tar_stream; tar_stream.MAX_MEMBERS = 10; "
            f"sys.exit(main(['--dir', {str(tmp_path / 'cache')!r}, 'import', {str(path)!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=child_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("cachectl: ")]
    assert len(lines) == 1 and "member-count cap" in lines[0], proc.stderr
