"""A store safe among strangers: each attack on a shared store is tried for real and must fail, with the
victim still getting the right kernel; each wait must end by itself.

Runs as root where it can (CI does): then real users and groups are created for the attacker and
the team, files are chowned to them, and small filesystems are mounted. Elsewhere those tests skip
with the reason.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, child_env
from test_shared_level import KEY, KEY2, Builder, kernel_cache_warnings, make_entry, mounted, recorded_warnings

from kernel_cache import Config, CorruptEntry, Entry, Store
from kernel_cache.coordination import locks
from kernel_cache.entries import entry as entry_format
from kernel_cache.entries.entry import InvalidKey
from kernel_cache.errors import ReentrantBuild, RejectedEntry
from kernel_cache.levels.shared import SharedLevel
from kernel_cache.trust.safefs import Owners, Tree, UnsafeFile
from kernel_cache.trust.signing import Signer

SIGNING_KEY = b"team-signing-key-0123456789abcdef"
NOGROUP = 65534
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None,
                               reason="needs root and useradd to create real users and groups")


pytestmark = pytest.mark.usefixtures("fresh_warnings")  # each test's warnings said afresh (conftest)


def cachectl(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernel_cache", *map(str, args)], cwd=ROOT,
                          env=child_env(**(env or {})), capture_output=True, text=True, timeout=120)


# Users and groups -------------------------------------------------------------------------------
def chown_tree(path: Path, uid: int, gid: int) -> None:
    for p in [path, *path.rglob("*")]:
        os.lchown(p, uid, gid)


# 1. Writes and deletions through planted links --------------------------------------------------
def test_a_symlinked_quarantine_cannot_make_prune_delete_an_operators_files(tmp_path):
    shared, victim = tmp_path / "shared", tmp_path / "operator-files"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    Store(Config(dir=tmp_path / "a", shared_dir=shared.mkdir() or shared)).put(make_entry(KEY))
    os.rmdir(shared / "quarantine")
    os.symlink(victim, shared / "quarantine")
    old = time.time() - 10 * 86400
    os.utime(victim / "precious.txt", (old, old))

    with recorded_warnings() as caught:
        store = Store(Config(dir=tmp_path / "b", shared_dir=shared))
    assert store.shared is None  # the level is refused as a whole
    assert any("quarantine" in m and "symbolic link" in m for m in kernel_cache_warnings(caught))
    assert store.get_or_create(KEY, Builder(KEY))[1] == make_entry(KEY).blobs
    out = cachectl("--dir", tmp_path / "b", "--shared-dir", shared, "prune", "--all-levels", "--older-than", "1d")
    assert out.returncode == 2 and "symbolic link" in out.stderr
    assert (victim / "precious.txt").read_text() == "keep me"


@pytest.mark.parametrize("level", ["entries", "locks"])
def test_a_symlinked_fanout_directory_is_never_written_through(tmp_path, level):
    shared, victim = tmp_path / "shared", tmp_path / "victim"
    shared.mkdir()
    victim.mkdir()
    SharedLevel(shared)  # creates the layout
    os.symlink(victim, shared / level / KEY[:2])
    store = Store(Config(dir=tmp_path / "local", shared_dir=shared))
    with recorded_warnings() as caught:
        build = Builder(KEY)
        assert store.get_or_create(KEY, build)[1] == make_entry(KEY).blobs and build.calls == 1
    assert list(victim.iterdir()) == []  # no entry, temp file or lock landed in the victim's dir
    assert any("symbolic link" in m for m in kernel_cache_warnings(caught))
    assert store.disk.get(KEY) is not None  # the local level still got the kernel


@pytest.mark.parametrize("level", ["locks", "entries", "stats"])
def test_a_symlinked_level_of_the_local_cache_makes_it_unused(tmp_path, level):
    cache, victim = tmp_path / "cache", tmp_path / "victim"
    Store(Config(dir=cache)).close()
    victim.mkdir()
    shutil.rmtree(cache / level)
    os.symlink(victim, cache / level)
    with recorded_warnings() as caught:
        store = Store(Config(dir=cache))
    assert store.disk is None and "symbolic link" in kernel_cache_warnings(caught)[0]
    assert store.get_or_create(KEY, Builder(KEY))[1] == make_entry(KEY).blobs
    assert list(victim.iterdir()) == []
    out = cachectl("--dir", cache, "list")
    assert out.returncode == 2 and "symbolic link" in out.stderr


def test_a_lock_file_symlinked_to_a_victims_file_is_not_truncated(tmp_path):
    cache = tmp_path / "cache"
    Store(Config(dir=cache)).close()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (cache / "locks" / KEY[:2]).mkdir()
    os.symlink(victim, cache / "locks" / KEY[:2] / f"{KEY}.lock")
    store = Store(Config(dir=cache))
    with recorded_warnings() as caught:
        assert store.get_or_create(KEY, Builder(KEY))[1] == make_entry(KEY).blobs
    assert victim.read_text() == "precious"
    assert any("cannot lock" in m for m in kernel_cache_warnings(caught))


def test_the_flock_probe_never_follows_a_planted_name(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    lock_dir = tmp_path / "shared" / "locks"
    lock_dir.mkdir(parents=True)
    for pid in range(os.getpid(), os.getpid() + 3):  # the old probe name was predictable
        os.symlink(victim, lock_dir / f".flock-probe.{pid}")
    assert locks.choose_lock_kind(Tree(tmp_path / "shared", Owners.current()), ("locks",)) in ("flock", "soft")
    assert victim.read_text() == "precious"
    assert sorted(p.name for p in lock_dir.iterdir() if not p.is_symlink()) == []  # probe cleaned up


def test_keys_that_are_not_content_addresses_are_refused_at_every_door(tmp_path):
    store = Store(Config(dir=tmp_path / "local", shared_dir=(tmp_path / "shared").mkdir() or tmp_path / "shared"))
    for bad in ("../../x", "A" * 32, "a" * 31, "a" * 33, "0123456789abcdef0123456789abcde/", ""):
        with recorded_warnings() as caught:
            with pytest.raises(InvalidKey):
                store.get_or_create(bad, Builder(KEY))
            with pytest.raises(InvalidKey):
                store.get(bad)
        assert kernel_cache_warnings(caught) == []  # a caller's mistake, not a cache failure
        for level in (store.disk, store.shared):
            with pytest.raises(InvalidKey):
                level.get(bad)
            with pytest.raises(InvalidKey):
                level.put_raw(bad, entry_format.encode(make_entry(KEY)))
    assert not (tmp_path / "x").exists() and not any(p.name == "x" for p in tmp_path.rglob("x*"))


# 2. Cache poisoning -----------------------------------------------------------------------------
def forge(key: str, cubin: bytes) -> bytes:
    """What a group member can do without the key: any content, a valid checksum."""
    return entry_format.encode(Entry(key=key, meta={"kernel": "synthetic"}, blobs={"cubin": cubin}))


def test_with_a_signing_key_a_replaced_shared_entry_is_rejected_and_never_kept(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    signed = dict(signing_key=SIGNING_KEY)
    Store(Config(dir=tmp_path / "ci", shared_dir=shared, **signed)).get_or_create(KEY, Builder(KEY))
    path = shared / "entries" / KEY[:2] / KEY
    path.write_bytes(forge(KEY, b"evil cubin"))  # the group member's swap, checksum recomputed

    victim = Store(Config(dir=tmp_path / "victim", shared_dir=shared, **signed))
    with recorded_warnings() as caught:
        assert victim.get(KEY) is None
        assert victim.stats.session()["rejected"] == 1
        build = Builder(KEY)
        assert victim.get_or_create(KEY, build)[1] == make_entry(KEY).blobs and build.calls == 1
    assert any("unsigned" in m for m in kernel_cache_warnings(caught))
    assert victim.disk.get(KEY).blobs == make_entry(KEY).blobs  # the forged copy never landed locally
    assert Signer(SIGNING_KEY).problem(path.read_bytes()) is None  # republished, signed

    for tampered in (lambda d: d[:-1] + bytes([d[-1] ^ 1]),  # flipped MAC
                     lambda d: Signer(b"another-teams-key-0123456789abcd").sign(d)):
        path.write_bytes(tampered(path.read_bytes()))
        fresh = Store(Config(dir=tmp_path / f"v{secrets.token_hex(2)}", shared_dir=shared, **signed))
        with pytest.raises(RejectedEntry):
            fresh.shared.get(KEY)
        assert fresh.get(KEY) is None and fresh.stats.session()["rejected"] == 1


@ROOT_ONLY
def test_without_a_key_an_entry_planted_by_a_stranger_is_refused(tmp_path, people):
    shared = tmp_path / "shared"
    shared.mkdir()
    Store(Config(dir=tmp_path / "owner", shared_dir=shared)).get_or_create(KEY, Builder(KEY))
    path = shared / "entries" / KEY[:2] / KEY
    path.write_bytes(forge(KEY, b"evil cubin"))
    os.chown(path, people["stranger"], NOGROUP)
    victim = Store(Config(dir=tmp_path / "victim", shared_dir=shared))
    with recorded_warnings() as caught:
        assert victim.get(KEY) is None and victim.stats.session()["rejected"] == 1
        build = Builder(KEY)
        assert victim.get_or_create(KEY, build)[1] == make_entry(KEY).blobs and build.calls == 1
    assert "owned by" in kernel_cache_warnings(caught)[0]
    assert victim.disk.get(KEY).blobs == make_entry(KEY).blobs


@ROOT_ONLY
def test_a_group_directory_is_trusted_only_once_the_group_is_named(tmp_path, people):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, people["teammate"], people["team"])
    os.chmod(shared, 0o2775)
    SharedLevel(shared, owners=Owners.current(people["team"])).put(make_entry(KEY))
    chown_tree(shared, people["teammate"], people["team"])  # written by a teammate
    with recorded_warnings() as caught:
        plain = Store(Config(dir=tmp_path / "a", shared_dir=shared))
    assert plain.shared is None and "KERNEL_CACHE_TRUSTED_GROUP" in kernel_cache_warnings(caught)[0]
    named = Store(Config(dir=tmp_path / "b", shared_dir=shared, trusted_group=people["team_name"]))
    assert named.get(KEY)[1] == "shared"
    os.chown(shared / "entries" / KEY[:2] / KEY, people["stranger"], NOGROUP)  # not the team's file
    assert Store(Config(dir=tmp_path / "c", shared_dir=shared, trusted_group=str(people["team"]))).get(KEY) is None


@ROOT_ONLY
def test_a_precreated_world_writable_local_dir_is_not_used(tmp_path, people):
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chown(cache, people["stranger"], NOGROUP)
    os.chmod(cache, 0o777)
    with recorded_warnings() as caught:
        store = Store(Config(dir=cache))
    assert store.disk is None
    (message,) = kernel_cache_warnings(caught)
    assert "writable by every user" in message and "memory only" in message
    assert store.get_or_create(KEY, Builder(KEY))[1] == make_entry(KEY).blobs


def test_a_bundle_needs_signed_entries_when_a_key_is_configured(tmp_path):
    from cachectl.move.bundle_file import export_bundle

    bundle = tmp_path / "b.kcb"
    described = {"target": {"backend": "cuda", "arch": 90, "warp_size": 32}, "toolchain": {"summary": "t"}}
    good = Entry(key=KEY, meta={"kernel": "synthetic", **described}, blobs={"cubin": b"good"})
    evil = Entry(key=KEY2, meta={"kernel": "synthetic", **described}, blobs={"cubin": b"evil"})
    export_bundle(bundle, [(KEY, Signer(SIGNING_KEY).sign(entry_format.encode(good)), {}),
                           (KEY2, entry_format.encode(evil), {})])
    env = {"KERNEL_CACHE_SIGNING_KEY": SIGNING_KEY.decode()}
    out = cachectl("--dir", tmp_path / "cache", "import", bundle, "--allow-stale", "--json", env=env)
    report = json.loads(out.stdout)
    assert out.returncode == 1 and report["imported"] == 1
    assert [r["member"] for r in report["rejected"]] == [KEY2] and "unsigned" in report["rejected"][0]["reason"]


# 3. Denial of service ---------------------------------------------------------------------------
def test_a_fifo_at_an_entry_path_is_refused_without_blocking(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    level = SharedLevel(shared)
    (shared / "entries" / KEY[:2]).mkdir()
    os.mkfifo(shared / "entries" / KEY[:2] / KEY)
    with pytest.raises(CorruptEntry, match="not a regular file"):
        level.get(KEY)  # returns at once: opened O_NONBLOCK, refused by fstat
    assert not (shared / "entries" / KEY[:2] / KEY).exists()  # moved to quarantine
    store = Store(Config(dir=tmp_path / "local", shared_dir=shared))
    assert store.get_or_create(KEY, Builder(KEY))[1] == make_entry(KEY).blobs


@pytest.mark.parametrize("shape", ["empty", "nested"])
def test_a_directory_planted_at_an_entry_path_is_quarantined_and_the_kernel_published(tmp_path, shape):
    shared = tmp_path / "shared"
    shared.mkdir()
    planted = shared / "entries" / KEY[:2] / KEY
    planted.mkdir(parents=True)
    if shape == "nested":
        (planted / "a" / "b").mkdir(parents=True)
        (planted / "a" / "b" / "f").write_bytes(b"x")
    builder = Builder(KEY)
    with recorded_warnings():
        Store(Config(dir=tmp_path / "node1", shared_dir=shared)).get_or_create(KEY, builder)
    assert builder.calls == 1 and planted.is_file()  # published over the planted name
    (bad,) = SharedLevel(shared).quarantined()
    assert bad["key"] == KEY and bad["kind"] == "directory"
    fresh = Builder(KEY)  # a fresh node is served from the shared level, no compile
    assert Store(Config(dir=tmp_path / "node2", shared_dir=shared)).get_or_create(KEY, fresh)[1] == make_entry(KEY).blobs
    assert fresh.calls == 0
    old = time.time() - 7200
    os.utime(bad["path"], (old, old))
    result = cachectl("--shared-dir", shared, "--dir", tmp_path / "node1", "prune", "--level", "shared", "--json")
    assert result.returncode == 0, result.stderr
    assert [d["path"] for d in json.loads(result.stdout)["debris"]] == [bad["path"]]
    assert not os.path.exists(bad["path"]) and SharedLevel(shared).quarantined() == []


def test_prune_removes_a_directory_planted_at_an_entry_path_at_once(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    Store(Config(dir=tmp_path / "local", shared_dir=shared)).close()
    planted = shared / "entries" / KEY[:2] / KEY
    (planted / "deep").mkdir(parents=True)
    fifo = shared / "entries" / KEY2[:2] / KEY2
    fifo.parent.mkdir(exist_ok=True)
    os.mkfifo(fifo)
    result = cachectl("--shared-dir", shared, "--dir", tmp_path / "local", "prune", "--level", "shared", "--json")
    assert result.returncode == 0, result.stderr
    assert sorted(d["path"] for d in json.loads(result.stdout)["debris"]) == sorted([str(planted), str(fifo)])
    assert not planted.exists() and not fifo.exists()


def test_a_fifo_at_a_soft_lock_path_does_not_hang_the_waiter(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    level = SharedLevel(shared, lock_mode="soft", stale_after=0.5)
    (shared / "locks" / KEY[:2]).mkdir(parents=True)
    os.mkfifo(shared / "locks" / KEY[:2] / f"{KEY}.softlock")
    start = time.monotonic()
    with level.lock(KEY, 0.3) as held:
        assert held is False  # fresh: could be anything; the wait is bounded
    old = time.time() - 60
    os.utime(shared / "locks" / KEY[:2] / f"{KEY}.softlock", (old, old))
    with level.lock(KEY, 10) as held:
        assert held is True  # an old non-file at a lock path is debris: taken over
    assert time.monotonic() - start < 10


@pytest.mark.parametrize("plant", ["dev-zero", "sparse", "dangling"])
def test_giant_and_endless_files_are_refused_unread(tmp_path, plant):
    shared = tmp_path / "shared"
    shared.mkdir()
    level = SharedLevel(shared, max_entry_bytes=1 << 20)
    path = shared / "entries" / KEY[:2] / KEY
    path.parent.mkdir()
    if plant == "dev-zero":
        os.symlink("/dev/zero", path)
        match = "symbolic link"
    elif plant == "sparse":
        with open(path, "wb") as f:
            f.truncate(3 << 30)  # 3 GiB, no blocks
        match = "cap"
    else:
        os.symlink(tmp_path / "nowhere", path)
        match = "symbolic link"
    with pytest.raises(CorruptEntry, match=match):
        level.get(KEY)
    assert level.get(KEY) is None  # moved aside: the next reader compiles


@pytest.mark.parametrize("depth, accepted", [(31, True), (32, True), (33, False), (200, False)])
def test_metadata_past_32_levels_is_refused_though_the_parser_takes_it(depth, accepted):
    """Between the policy (32) and the parser's recursion limit the depth is measured on the text;
    brackets inside strings do not count, in either direction."""
    nested = "[" * (depth - 1) + "]" * (depth - 1)  # inside the top-level object: depth levels in all
    meta = ('{"key":"' + KEY2 + '","s":"]]]]}}}}[[[[{{{{\\"\\\"]]","x":' + nested + "}").encode()
    assert entry_format.json_depth(meta) == depth
    fields = struct.pack("<8sHHIIQ", entry_format.MAGIC, entry_format.ENTRY_FORMAT_VERSION, 0, len(meta), 0, len(meta))
    data = fields + entry_format._checksum(fields, meta) + meta
    if accepted:
        assert entry_format.decode(data).key == KEY2
    else:
        with pytest.raises(CorruptEntry, match="nests deeper than 32 levels"):
            entry_format.decode(data)


def test_nesting_counts_levels_of_lists_and_objects():
    texts = (b"1", b'"[["', b"[]", b"{}", b"[1, [2]]", b'{"a": [{"b": {}}]}')
    assert [entry_format.json_depth(v) for v in texts] == [0, 0, 1, 1, 2, 4]


def test_deep_json_metadata_is_a_bad_entry_not_a_crash(tmp_path):
    cache = tmp_path / "cache"
    store = Store(Config(dir=cache))
    store.put(make_entry(KEY))
    deep = b"[" * 100_000 + b"]" * 100_000
    meta = b'{"key":"' + KEY2.encode() + b'","x":' + deep + b"}"
    payload = meta
    import struct

    fields = struct.pack("<8sHHIIQ", entry_format.MAGIC, entry_format.ENTRY_FORMAT_VERSION, 0, len(meta), 0,
                         len(payload))
    data = fields + entry_format._checksum(fields, payload) + payload
    with pytest.raises(CorruptEntry, match="nests"):
        entry_format.decode(data)
    store.close()
    (cache / "entries" / KEY2[:2]).mkdir(exist_ok=True)
    (cache / "entries" / KEY2[:2] / KEY2).write_bytes(data)  # planted: no writer of ours stores a bad entry
    out = cachectl("--dir", cache, "verify", "--repair")
    assert out.returncode == 0 and "Traceback" not in out.stderr and "nests" in out.stdout
    assert Store(Config(dir=cache)).get(KEY)[1] == "disk"


def test_foreign_names_in_the_shared_tree_are_ignored(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    level = SharedLevel(shared)
    level.put(make_entry(KEY))
    Store(Config(dir=tmp_path / "local")).close()
    (shared / "entries" / KEY[:2] / "README.txt").write_text("hello")
    (shared / "entries" / "zz-not-hex").mkdir()
    (shared / "entries" / "zz-not-hex" / "x").write_text("x")
    (shared / "entries" / "\u00e9t\u00e9").write_text("x")
    (shared / "quarantine" / "no-dot-name").write_text("x")
    (shared / "locks" / "??").mkdir()
    assert list(level.keys()) == [KEY]
    for command in (["list"], ["stats"], ["verify"], ["prune", "--all-levels", "--dry-run"]):
        out = cachectl("--dir", tmp_path / "local", "--shared-dir", shared, *command)
        assert out.returncode == 0 and "Traceback" not in out.stderr, (command, out.stderr)


# 4. Stuck neighbours and bounded waits ----------------------------------------------------------
def test_a_builder_that_asks_for_its_own_key_gets_an_error_not_a_deadlock(tmp_path):
    store = Store(Config(dir=tmp_path))

    def build():
        store.get_or_create(KEY, build)
        return {}, {}, 0.0

    result = []
    thread = threading.Thread(target=lambda: result.append(_catch(lambda: store.get_or_create(KEY, build))))
    thread.start()
    thread.join(10)
    assert not thread.is_alive() and isinstance(result[0], ReentrantBuild)
    assert "would wait on itself" in str(result[0])
    assert store.get_or_create(KEY, Builder(KEY))[1] == make_entry(KEY).blobs  # the key is not stuck


def _catch(fn):
    try:
        return fn()
    except Exception as exc:
        return exc


def test_the_per_key_lock_table_holds_only_keys_in_flight(tmp_path):
    store = Store(Config(dir=tmp_path))
    for i in range(200):
        key = f"{i:032x}"
        store.get_or_create(key, Builder(key))
    assert store._key_locks._locks == {}


def test_flock_waits_end_at_the_timeout(tmp_path):
    tree = Tree(tmp_path, Owners.current())
    with locks.hold(tree, ("k.lock",), "flock", 5) as first:
        assert first
        start = time.monotonic()
        done = []
        thread = threading.Thread(target=lambda: done.append(_hold_once(tree)))
        thread.start()
        thread.join(10)
    assert done == [False] and time.monotonic() - start < 5


def _hold_once(tree) -> bool:
    # flock locks belong to the open file: a second open in another thread contends like a process
    with locks.hold(tree, ("k.lock",), "flock", 0.3) as held:
        return held


# 5. Operations under failure --------------------------------------------------------------------
def test_a_warm_cache_on_a_full_disk_serves_hits_and_can_be_listed_pruned_and_cleared(tmp_path):
    with mounted("-t", "tmpfs", "-o", "size=2m,mode=0755", "tmpfs", str(tmp_path / "disk")) as disk:
        cache = disk / "cache"
        keys = [f"{i:032x}" for i in range(4)]
        store = Store(Config(dir=cache))
        for key in keys:
            store.put(make_entry(key, size=100_000))
        store.close()
        filler = disk / "filler"
        with open(filler, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        warm = Store(Config(dir=cache))
        assert [warm.get(k)[1] for k in keys] == ["disk"] * 4
        listed = cachectl("--dir", cache, "list", "--json")
        assert listed.returncode == 0, listed.stderr
        assert sorted(i["key"] for i in json.loads(listed.stdout)["entries"]) == keys
        assert cachectl("--dir", cache, "stats").returncode == 0
        pruned = cachectl("--dir", cache, "prune", "--max-size", "150K", "--json")
        assert pruned.returncode == 0, pruned.stderr
        assert len(json.loads(pruned.stdout)["removed"]) >= 2
        cleared = cachectl("--dir", cache, "clear", "--yes")
        assert cleared.returncode == 0, cleared.stderr
        assert [p for p in (cache / "entries").rglob("*") if not p.is_dir()] == []


def test_a_warm_cache_on_a_read_only_mount_serves_hits_and_lists(tmp_path):
    cache = tmp_path / "cache"
    store = Store(Config(dir=cache))
    store.put(make_entry(KEY, size=100_000))
    store.put(make_entry(KEY2, size=100))  # a small one as well
    store.close()
    with mounted("--bind", "-o", "ro", str(cache), str(tmp_path / "ro")) as ro:
        if os.access(ro, os.W_OK) and subprocess.run(["touch", str(ro / "probe")]).returncode == 0:
            pytest.skip("this machine's bind mount is not read-only")
        with recorded_warnings() as caught:
            image = Store(Config(dir=ro))
            assert image.get(KEY)[1] == "disk" and image.get(KEY2)[1] == "disk"
            assert image.get_or_create("ab" * 16, Builder("ab" * 16))[1] == make_entry("ab" * 16).blobs
        assert len(kernel_cache_warnings(caught)) <= 1
        listed = cachectl("--dir", ro, "list", "--json")
        assert listed.returncode == 0, listed.stderr
        assert sorted(i["key"] for i in json.loads(listed.stdout)["entries"]) == sorted([KEY, KEY2])
        stats = cachectl("--dir", ro, "stats", "--json")
        assert stats.returncode == 0 and json.loads(stats.stdout)["entries"] == 2, stats.stderr
        # nothing can be removed there: prune says so, entry by entry, counts nothing and exits 1
        pruned = cachectl("--dir", ro, "prune", "--max-size", "0", "--json")
        assert pruned.returncode == 1, pruned.stderr
        report = json.loads(pruned.stdout)
        assert report["removed"] == [] and report["bytes_freed"] == 0
        assert KEY in {f["key"] for f in report["failed"]}
        assert "Traceback" not in pruned.stderr and "could not remove" in pruned.stderr
        assert (ro / "entries").exists() and sorted(
            i["key"] for i in json.loads(cachectl("--dir", ro, "list", "--json").stdout)["entries"]) == sorted([KEY, KEY2])
        cleared = cachectl("--dir", ro, "clear", "--yes", "--json")  # nor by clear: no traceback, nothing counted
        assert cleared.returncode == 1 and "Traceback" not in cleared.stderr, cleared.stderr
        report = json.loads(cleared.stdout)
        assert report["removed"] == 0 and {f["key"] for f in report["failed"]} == {KEY, KEY2}
        assert sorted(p.name for p in (ro / "entries").rglob("*") if p.is_file()) == sorted([KEY, KEY2])


# The safe file layer itself ----------------------------------------------------------------------
def test_tree_refuses_links_fifos_and_untrusted_owners_at_every_level(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "f").write_bytes(b"data")
    os.symlink(tmp_path / "real", tmp_path / "link")
    os.mkfifo(tmp_path / "real" / "fifo")
    tree = Tree(tmp_path, Owners.current())
    assert tree.read("real", "f", max_bytes=10)[0] == b"data"
    with pytest.raises(UnsafeFile, match="symbolic link"):
        tree.read("link", "f", max_bytes=10)
    with pytest.raises(UnsafeFile, match="not a regular file"):
        tree.read("real", "fifo", max_bytes=10)
    with pytest.raises(UnsafeFile, match="cap"):
        tree.read("real", "f", max_bytes=3)
    with pytest.raises(UnsafeFile):
        tree.read("..", "etc", max_bytes=10)
    assert not tree.unlink("real")  # never a directory
    assert tree.unlink("link") and (tmp_path / "real" / "f").exists()  # the link, not its target
    (tmp_path / "real" / "sub").mkdir()
    (tmp_path / "real" / "sub" / "f").write_bytes(b"data")
    assert tree.read("real", "sub", "f", max_bytes=10)[0] == b"data"
    os.chmod(tmp_path / "real" / "sub", 0o777)  # levels below the first are checked at every access
    with pytest.raises(UnsafeFile, match="writable by every user"):
        tree.read("real", "sub", "f", max_bytes=10)
    os.chmod(tmp_path / "real", 0o777)  # the first level is checked when a Tree first opens it
    with pytest.raises(UnsafeFile, match="writable by every user"):
        Tree(tmp_path, Owners.current()).read("real", "f", max_bytes=10)


def test_the_signing_key_file_must_be_private(tmp_path):
    from kernel_cache import ConfigError

    key_file = tmp_path / "key"
    key_file.write_text(SIGNING_KEY.decode() + "\n")
    os.chmod(key_file, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        Config.from_env({"KERNEL_CACHE_SIGNING_KEY_FILE": str(key_file)})
    os.chmod(key_file, 0o600)
    assert Config.from_env({"KERNEL_CACHE_SIGNING_KEY_FILE": str(key_file)}).signing_key == SIGNING_KEY
    assert "team-signing" not in repr(Config(signing_key=SIGNING_KEY))
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        Config.from_env({"KERNEL_CACHE_SIGNING_KEY": "short"})
    with pytest.raises(ConfigError, match="no such group"):
        Config.from_env({"KERNEL_CACHE_TRUSTED_GROUP": "no-such-group-kc"})


def test_the_redis_password_file_is_read_as_a_private_file(tmp_path):
    """A symlink, a FIFO (which a plain read would block on) or a file others can read is refused,
    as for the signing key; the password never shows in the Config's repr."""
    from kernel_cache import ConfigError

    secret = tmp_path / "redis-password"
    secret.write_text("s3cret-pass\n")
    os.chmod(secret, 0o640)
    with pytest.raises(ConfigError, match="KERNEL_CACHE_REMOTE_PASSWORD_FILE=.*chmod 600"):
        Config.from_env({"KERNEL_CACHE_REMOTE_PASSWORD_FILE": str(secret)})
    os.chmod(secret, 0o600)
    config = Config.from_env({"KERNEL_CACHE_REMOTE_PASSWORD_FILE": str(secret)})
    assert config.remote_password == "s3cret-pass" and "s3cret" not in repr(config)
    (tmp_path / "link").symlink_to(secret)
    with pytest.raises(ConfigError, match="symbolic link is refused"):
        Config.from_env({"KERNEL_CACHE_REMOTE_PASSWORD_FILE": str(tmp_path / "link")})
    os.mkfifo(tmp_path / "fifo", 0o600)
    with pytest.raises(ConfigError, match="not a regular file"):
        Config.from_env({"KERNEL_CACHE_REMOTE_PASSWORD_FILE": str(tmp_path / "fifo")})


def test_a_refused_tree_never_closes_a_descriptor_it_no_longer_owns(tmp_path):
    import gc

    (tmp_path / "open").mkdir(mode=0o777)
    os.chmod(tmp_path / "open", 0o777)
    (tmp_path / "good").mkdir()
    (tmp_path / "good" / "f").write_bytes(b"ok")
    for _ in range(5):
        with pytest.raises(UnsafeFile) as refused:  # keeps the half-made Tree alive a while
            Tree(tmp_path / "open", Owners.current())
        good = Tree(tmp_path / "good", Owners.current())  # reuses the refused tree's number
        del refused
        gc.collect()
        assert good.read("f", max_bytes=10)[0] == b"ok"
        good.close()


def test_names_planted_in_quarantine_and_as_temp_files_print_escaped(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    Store(Config(dir=tmp_path / "local", shared_dir=shared)).close()
    forged = b"\nINJECTED-LINE removed 999 entries\x1b[2J"
    names = [forged, b"raw-\xff\xfe-bytes", b"." + KEY.encode() + b".\nINJECTED-TEMP.tmp"]
    for name in names[:2]:
        with open(os.path.join(os.fsencode(shared / "quarantine"), name), "wb") as f:
            f.write(b"x")
    temp = os.path.join(os.fsencode(shared / "entries" / KEY[:2]), names[2])
    os.makedirs(os.path.dirname(temp), exist_ok=True)
    with open(temp, "wb") as f:
        f.write(b"x")
    old = time.time() - 7200
    for path in [*(os.path.join(os.fsencode(shared / "quarantine"), n) for n in names[:2]), temp]:
        os.utime(path, (old, old))
    for command in (["verify"], ["verify", "--json"], ["prune", "--all-levels", "--dry-run"],
                    ["prune", "--all-levels", "--json"]):
        proc = subprocess.run([sys.executable, "-m", "kernel_cache", "--dir", str(tmp_path / "local"),
                               "--shared-dir", str(shared), *command], cwd=ROOT, env=child_env(), capture_output=True,
                              timeout=120)
        out = proc.stdout + proc.stderr
        assert proc.returncode in (0, 1), out
        assert not any(line.startswith((b"INJECTED", b".\nINJ")) for line in out.splitlines()), out
        assert b"\xff" not in out and b"\x1b" not in out, out
        if command == ["prune", "--all-levels", "--json"]:
            shown = sorted(d["path"].rsplit("/", 1)[1] for d in json.loads(out)["debris"])
            assert shown == sorted(["\\nINJECTED-LINE removed 999 entries\\x1b[2J", "raw-\\xff\\xfe-bytes",
                                    f".{KEY}.\\nINJECTED-TEMP.tmp"])
        elif command == ["verify"]:
            assert b"\\nINJECTED-LINE" in out and b"raw-\\xff\\xfe-bytes" in out


def test_a_huge_intercept_value_is_echoed_short(tmp_path):
    value = "jax_triton," + "x" * 100_000
    proc = subprocess.run([sys.executable, "-c", "import kernel_cache; kernel_cache.default_store()"], cwd=ROOT,
                          env=child_env(KERNEL_CACHE_INTERCEPT=value), capture_output=True, text=True, timeout=120)
    assert len(proc.stderr) < 2000, len(proc.stderr)  # the .pth warning at start, then the ConfigError
    assert "(100011 chars)" in proc.stderr
    from kernel_cache import ConfigError
    from kernel_cache.settings.config import Config as _Config
    with pytest.raises(ConfigError) as caught:
        _Config.from_env({"KERNEL_CACHE_INTERCEPT": value})
    assert len(str(caught.value)) < 600 and "(100011 chars)" in str(caught.value)
