"""The toolchain memo shared through the cluster's levels (compiler.toolchain): a fresh node (an
empty cache directory) takes Triton's build key, the backend's hash and any file memo from a node
that derived them for the very same files, and derives them itself when the record is forged,
unsigned, of another key, or of files whose identity differs (a copy, a rewrite at the same size and
mtime): never weaker than the node's own memo."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

import kernel_cache
from compiler import make_spec, toolchain
from compiler import triton_compat as tc
from compiler.examples import add_kernel
from kernel_cache import Config
from kernel_cache.entries import memo_entry
from kernel_cache.settings.config import TOOLCHAIN_MEMO
from kernel_cache.trust.signing import Signer

KEY = b"cluster-signing-key-0123456789abcdef"
OTHER_KEY = b"another-team-signing-key-0123456789"
pytestmark = pytest.mark.usefixtures("fresh_warnings")


@pytest.fixture
def node(tmp_path) -> Iterator[object]:
    """`node(name, **settings)`: the process configured as a fresh node (its own empty cache dir) on
    the cluster's shared directory, its per-process toolchain memo cleared; restored afterwards."""
    (tmp_path / "shared").mkdir()

    def configure(name: str, **settings: object) -> kernel_cache.Store:
        toolchain.clear_process_memo()
        settings = {"shared_dir": tmp_path / "shared", "signing_key": KEY, **settings}
        return kernel_cache.configure(Config(dir=tmp_path / name, **settings))  # type: ignore[arg-type]

    yield configure
    toolchain.clear_process_memo()
    kernel_cache.configure()


def counting(text: str, calls: list[str]) -> object:
    def compute() -> str:
        calls.append(text)
        return text
    return compute


@pytest.fixture
def plugin(tmp_path) -> Path:
    path = tmp_path / "install" / "libplugin.so"
    path.parent.mkdir()
    path.write_bytes(b"\x7fELF plugin v1" * 100)
    return path


def test_a_fresh_node_takes_the_toolchain_another_node_derived_and_derives_nothing(node, monkeypatch):
    target = make_spec(add_kernel, ["*fp32", "*fp32", 64, "*fp32"], {"BLOCK": 64}, target=90).target
    node("node-a")
    derived = toolchain.installed_tools(target)

    def never() -> str:
        raise AssertionError("derived again on a node the cluster serves")

    monkeypatch.setattr(toolchain, "triton_build_key", never)
    monkeypatch.setattr(tc, "backend_toolchain_hash", lambda target: never())
    store = node("node-b")
    assert not (Path(store.config.dir) / TOOLCHAIN_MEMO).exists()  # type: ignore[arg-type]
    assert toolchain.installed_tools(target) == derived
    assert (Path(store.config.dir) / TOOLCHAIN_MEMO).exists()  # type: ignore[arg-type]  # its own memo now
    assert store.disk is not None and len(store.disk) == 0  # the records were copied nowhere


def test_a_file_memo_is_shared_and_a_rewrite_at_the_same_size_and_mtime_is_another_identity(node, plugin):
    calls: list[str] = []
    node("node-a")
    assert toolchain.memoized_for_file("layout", str(plugin), counting("v1", calls)) == "v1"
    node("node-b")
    assert toolchain.memoized_for_file("layout", str(plugin), counting("v1", calls)) == "v1"
    assert calls == ["v1"]  # node b read node a's

    st = plugin.stat()
    plugin.write_bytes(b"\x7fELF plugin v2" * 100)  # other bytes, same size ...
    os.utime(plugin, ns=(st.st_atime_ns, st.st_mtime_ns))  # ... and mtime: only its ctime tells
    assert toolchain._identity(str(plugin)) == [str(plugin), st.st_size, st.st_mtime_ns]
    node("node-c")
    assert toolchain.memoized_for_file("layout", str(plugin), counting("v2", calls)) == "v2"
    assert calls == ["v1", "v2"]

    copy = plugin.parent / "copy.so"
    shutil.copy2(plugin, copy)  # the same bytes elsewhere: another installation, derived for itself
    node("node-d")
    assert toolchain.memoized_for_file("layout", str(copy), counting("copy", calls)) == "copy"


@pytest.mark.parametrize("writer", ["unsigned", "another key"])
def test_a_record_not_signed_with_the_clusters_key_is_refused_and_derived_here(node, plugin, writer):
    calls: list[str] = []
    node("writer", signing_key=None if writer == "unsigned" else OTHER_KEY)
    assert toolchain.memoized_for_file("layout", str(plugin), counting("planted", calls)) == "planted"
    store = node("reader")
    assert toolchain.memoized_for_file("layout", str(plugin), counting("honest", calls)) == "honest"
    assert calls == ["planted", "honest"]
    assert store.stats.session()["rejected"] >= 1


def test_a_signed_record_of_another_identity_under_this_key_is_refused(node, plugin):
    """Even a writer holding the key cannot file one installation's text under another's key: the
    record must repeat the reader's name and identity."""
    calls: list[str] = []
    store = node("reader")
    identity = toolchain.node_identity(toolchain._identity(str(plugin)))
    elsewhere = [str(plugin.parent / "elsewhere.so"), *identity[1:]]
    forged = memo_entry.to_entry("layout", elsewhere, "forged")
    forged = kernel_cache.Entry(key=memo_entry.memo_key("layout", identity), meta=forged.meta, blobs=forged.blobs)
    store.put_shared(forged)
    assert memo_entry.problem(forged) is not None
    assert memo_entry.text_for(forged, "layout", identity) is None
    assert toolchain.memoized_for_file("layout", str(plugin), counting("honest", calls)) == "honest"
    assert calls == ["honest"]


def test_a_record_is_well_formed_only_with_its_own_key_and_one_text():
    identity = [["/opt/lib.so", 10, 20, 30, 40]]
    good = memo_entry.to_entry("layout", identity, "text")
    assert memo_entry.problem(good) is None and memo_entry.text_for(good, "layout", identity) == "text"
    assert memo_entry.text_for(good, "other", identity) is None
    assert memo_entry.text_for(good, "layout", [["/opt/lib.so", 10, 20, 30, 41]]) is None
    for bad in (kernel_cache.Entry(key=good.key, meta=good.meta, blobs={}),
                kernel_cache.Entry(key=good.key, meta=good.meta, blobs={"text": b"\xff\xfe"}),
                kernel_cache.Entry(key=good.key, meta={**good.meta, "format": 99}, blobs=good.blobs)):
        assert memo_entry.problem(bad) is not None and memo_entry.text_for(bad, "layout", identity) is None


def test_without_a_cluster_level_nothing_is_asked_or_published(node, plugin):
    calls: list[str] = []
    store = node("alone", shared_dir=None)
    assert not store.cluster_levels
    assert toolchain.memoized_for_file("layout", str(plugin), counting("here", calls)) == "here"
    assert store.disk is not None and len(store.disk) == 0


def test_the_remote_serves_the_memo_signed(node, plugin, server):
    calls: list[str] = []
    remote = {"shared_dir": None, "remote": server.url, "remote_namespace": "memo"}
    node("node-a", **remote)
    toolchain.memoized_for_file("layout", str(plugin), counting("v1", calls))
    store = node("node-b", **remote)
    assert toolchain.memoized_for_file("layout", str(plugin), counting("again", calls)) == "v1"
    assert calls == ["v1"] and store.stats.levels.get("backfills.disk", 0) == 0

    name = store.level("remote")._entry(memo_entry.memo_key(  # type: ignore[union-attr]
        "layout", toolchain.node_identity(toolchain._identity(str(plugin)))))
    import redis

    entry = memo_entry.to_entry("layout", toolchain.node_identity(toolchain._identity(str(plugin))), "forged")
    from kernel_cache.entries import entry as entry_format

    redis.Redis.from_url(server.url).set(name, Signer(OTHER_KEY).sign(entry_format.encode(entry)))
    node("node-c", **remote)
    assert toolchain.memoized_for_file("layout", str(plugin), counting("honest", calls)) == "honest"


def test_cachectl_lists_and_shows_a_memo_record(tmp_path, capsys, monkeypatch):
    from cachectl.main import main

    for name in [n for n in os.environ if n.startswith("KERNEL_CACHE_")]:
        monkeypatch.delenv(name)
    record = memo_entry.to_entry("triton_key", ["3.9.0", ["/site/triton/_C/libtriton.so", 1, 2, 3, 4]], "3.9.0" + "ab" * 150)
    store = kernel_cache.Store(Config(dir=tmp_path / "cache"))
    store.put(record)
    store.close()
    assert main(["--dir", str(tmp_path / "cache"), "list"]) == 0
    assert "[memo]" in (out := capsys.readouterr().out) and "(1 memo)" in out
    assert main(["--dir", str(tmp_path / "cache"), "show", record.key]) == 0
    out = capsys.readouterr().out
    assert "memo         triton_key" in out and "file         /site/triton/_C/libtriton.so" in out
    assert "(-v: all of it)" in out
    assert main(["--dir", str(tmp_path / "cache"), "verify"]) == 0
