"""Which directories become caches (the CACHEDIR.TAG marker) and inspecting a shared directory alone.

`KERNEL_CACHE_DIR=$HOME` never fills a home directory with entries/, locks/, stats/ and the
toolchain memo; cachectl never imports entries next to a user's thesis.txt; a shared directory can be
looked at without a local one, and `--dir SHARED verify --repair` never writes the local layout into
the shared one.
"""

from __future__ import annotations

import json
import os
import warnings

import pytest
from test_shared_level import make_entry

from cachectl.main import main as cachectl
from kernel_cache import Config, Store
from kernel_cache.levels import cache_marker
from kernel_cache.settings.config import TOOLCHAIN_MEMO
from kernel_cache.telemetry import warnings_once
from kernel_cache.telemetry.warnings_once import KernelCacheWarning

KEYS = [f"{i:x}" * 32 for i in range(1, 4)]


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for name in list(os.environ):
        if name.startswith("KERNEL_CACHE_"):
            monkeypatch.delenv(name)
    warnings_once.reset()
    yield
    warnings_once.reset()


def opened(**config) -> tuple[Store, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = Store(Config(**config))
    return store, [str(w.message) for w in caught if issubclass(w.category, KernelCacheWarning)]


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = cachectl([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def home(tmp_path):
    home = tmp_path / "home"
    (home / "entries").mkdir(parents=True)  # an entries/ folder of the user's own is no cache either
    (home / "thesis.txt").write_text("chapter 1")
    return home


def local_cache(path, keys=KEYS):
    store = Store(Config(dir=path))
    for key in keys:
        store.put(make_entry(key))
    store.close()
    return path


@pytest.fixture
def shared_cache(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    store = Store(Config(shared_dir=shared))
    for key in KEYS:
        store.put(make_entry(key))
    store.close()
    return shared


def test_the_library_does_not_turn_a_home_directory_into_a_cache(home):
    before = sorted(os.listdir(home))
    store, messages = opened(dir=home)
    store.put(make_entry(KEYS[0]))
    assert store.disk is None and store.get(KEYS[0]) is not None  # served from memory
    store.close()
    assert len(messages) == 1 and "not a kernel-cache directory" in messages[0] and "thesis.txt" in messages[0]
    assert sorted(os.listdir(home)) == before and not os.listdir(home / "entries")


def test_the_toolchain_memo_is_never_written_into_a_directory_that_is_not_a_cache(home, tmp_path):
    from compiler.toolchain import _save_memo

    _save_memo(home / TOOLCHAIN_MEMO, {"probe": "value"})
    assert not (home / TOOLCHAIN_MEMO).exists()
    fresh = tmp_path / "memo-home" / "kernel-cache"
    _save_memo(fresh / TOOLCHAIN_MEMO, {"probe": "value"})
    assert json.loads((fresh / TOOLCHAIN_MEMO).read_text()) == {"probe": "value"}
    assert cache_marker.MARKER in os.listdir(fresh)


def test_the_toolchain_memo_is_written_without_fsync_and_a_torn_one_is_recomputed(tmp_path, monkeypatch):
    """The memo is a cache of derived facts: a power cut that leaves it empty or torn costs a
    recomputation, so its writes skip the fsyncs that entries keep."""
    from compiler import toolchain
    from kernel_cache.trust import safefs

    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    cache = tmp_path / "cache"
    cache_marker.claim_directory(str(cache))
    synced.clear()
    toolchain._save_memo(cache / TOOLCHAIN_MEMO, {"probe": "value"})
    assert synced == [] and toolchain._read_memo(cache / TOOLCHAIN_MEMO)["probe"] == "value"
    with safefs.atomic_file(tmp_path / "bundle.bin") as f:  # everything else stays durable
        f.write(b"bundle")
    assert len(synced) >= 1
    (cache / TOOLCHAIN_MEMO).write_bytes(b'{"probe": "val')  # torn by a crash
    assert toolchain._read_memo(cache / TOOLCHAIN_MEMO) == {}
    assert toolchain._memoized({"probe": (["id"], lambda: "recomputed")}, cache) == {"probe": "recomputed"}
    assert toolchain._read_memo(cache / TOOLCHAIN_MEMO)[json.dumps(["probe", ["id"]])] == "recomputed"


def test_a_new_cache_carries_the_marker_and_an_old_one_gains_it_on_its_first_write(tmp_path):
    new = local_cache(tmp_path / "new")
    text = (new / cache_marker.MARKER).read_text()
    assert text.startswith(cache_marker.SIGNATURE + "\n") and "kernel-cache local cache" in text

    (new / cache_marker.MARKER).unlink()  # as written before the marker existed
    reader_read_only = Store(Config(dir=new), read_only=True)
    assert reader_read_only.disk is not None and not (new / cache_marker.MARKER).exists()
    reader_read_only.close()
    reader, messages = opened(dir=new)
    assert reader.disk is not None and not messages and (new / cache_marker.MARKER).exists()
    assert reader.get(KEYS[1]) is not None
    reader.close()


@pytest.mark.parametrize("torn", ["empty", "cut short"])
def test_a_marker_torn_by_a_power_cut_reads_as_none_and_is_written_again(tmp_path, monkeypatch, torn):
    """The marker is written without fsync: what a power cut leaves of it (nothing, or the start of
    ours) is no marker, and the cache, holding only kernel-cache's names, gains it again."""
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    store, _ = opened(dir=tmp_path / "new")
    store.close()
    assert synced == []  # opening a new cache writes no file durably (its entries are written at their put)
    cache = local_cache(tmp_path / "cache")
    full = cache_marker.marker_text(cache_marker.LOCAL)
    (cache / cache_marker.MARKER).write_bytes(b"" if torn == "empty" else full[:20])
    reader, messages = opened(dir=cache)
    assert reader.disk is not None and not messages and reader.get(KEYS[1]) is not None
    assert (cache / cache_marker.MARKER).read_bytes() == full
    reader.close()
    (cache / cache_marker.MARKER).write_bytes(full[:20] + b"another tool")  # not a cut of ours: foreign
    _, messages = opened(dir=cache)
    assert any("not kernel-cache's" in m for m in messages)


def test_a_local_and_a_shared_cache_are_never_taken_for_each_other(tmp_path, shared_cache, capsys):
    local = local_cache(tmp_path / "local")
    store, messages = opened(dir=tmp_path / "node", shared_dir=local)
    assert store.shared is None and "is a kernel-cache local cache directory" in messages[0]
    store.close()
    store, messages = opened(dir=shared_cache)
    assert store.disk is None and "is a kernel-cache shared cache directory" in messages[0]
    store.close()

    code, out, err = run(capsys, "--dir", shared_cache, "verify", "--repair")
    assert code == 2 and "--shared-dir" in err and len(err.strip().splitlines()) == 1
    assert sorted(os.listdir(shared_cache)) == sorted(["entries", "locks", "quarantine", cache_marker.MARKER])
    assert not (shared_cache / "stats").exists()


def test_cachectl_refuses_to_import_into_a_directory_that_is_not_a_cache(home, tmp_path, capsys):
    bundle = tmp_path / "three.kcb"
    assert run(capsys, "--dir", local_cache(tmp_path / "src"), "export", bundle)[0] == 0
    before = {p.relative_to(home) for p in home.rglob("*")}
    code, out, err = run(capsys, "--dir", home, "import", bundle)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "not a kernel-cache directory" in err and "thesis.txt" in err
    assert {p.relative_to(home) for p in home.rglob("*")} == before
    code, _, err = run(capsys, "--dir", home, "list")
    assert code == 2 and "not a kernel-cache directory" in err


@pytest.mark.parametrize("command", [["stats", "--json"], ["list", "--json"], ["verify", "--json"],
                                     ["show", KEYS[0][:10], "--json"]])
def test_a_shared_directory_is_inspected_alone_and_left_as_it_was(shared_cache, capsys, command):
    def snapshot():
        return {str(p.relative_to(shared_cache)): p.stat().st_mtime_ns for p in shared_cache.rglob("*")}

    before = snapshot()
    code, out, err = run(capsys, "--shared-dir", shared_cache, *command)
    assert code == 0, err
    doc = json.loads(out)
    if command[0] == "list":
        assert {row["key"] for row in doc["entries"]} == set(KEYS) and {row["level"] for row in doc["entries"]} == {"shared"}
    elif command[0] == "verify":
        assert doc["checked"] == 3 and doc["bad"] == [] and "index" not in doc
    elif command[0] == "show":
        assert doc["key"] == KEYS[0]
    assert snapshot() == before


def test_a_shared_directory_is_pruned_alone_when_named(shared_cache, capsys):
    code, out, err = run(capsys, "--shared-dir", shared_cache, "prune", "--max-size", "0", "--json")
    assert code == 0, err
    assert len(json.loads(out)["removed"]) == 3
    assert not [p for p in (shared_cache / "entries").rglob("*") if p.is_file()]
    assert sorted(os.listdir(shared_cache)) == sorted(["entries", "locks", "quarantine", cache_marker.MARKER])


def test_with_no_local_directory_a_destructive_command_needs_the_level_named(shared_cache, capsys, monkeypatch):
    monkeypatch.setenv("KERNEL_CACHE_SHARED_DIR", str(shared_cache))  # from the environment: not named here
    code, _, err = run(capsys, "prune", "--max-size", "0")
    assert code == 2 and "--level shared" in err
    assert len([p for p in (shared_cache / "entries").rglob("*") if p.is_file()]) == 3


def test_the_demos_own_mark_is_one_a_cache_directory_may_hold():
    from scripts import demo

    assert demo.MARKER == cache_marker.DEMO_MARKER and demo.MARKER in cache_marker.LOCAL_NAMES
