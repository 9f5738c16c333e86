"""cachectl verify --rebuild: kernel entries recompiled from their recipes and compared byte for byte.

One cache is compiled per module (two small example kernels for sm_90, in the local and the shared
level, signed with a team key; beside them a kernel of another toolchain, one naming a module nobody
allowed, and an entry of another kind); tests that change it work on a copy. cachectl runs in this
process, so Triton is imported once; each verify recompiles at most the two kernels (~0.1-0.2 s each).
"""

from __future__ import annotations

import json
import re
import shutil
import sys

import pytest
from conftest import ROOT

import kernel_cache
from cachectl.check import rebuild as rebuild_check
from cachectl.main import build_parser, main
from kernel_cache import Config, Entry, Store
from kernel_cache.entries import entry as entry_format
from kernel_cache.trust.signing import Signer

SIGNING_KEY = b"verify-rebuild-team-key-0123456789"
KERNELS = ("add", "scaled_add")
ALLOW = ("--allow-module", "compiler.examples")
STALE_KEY, MARKER_KEY, OTHER_KEY = "b1" * 16, "b2" * 16, "b3" * 16
MARKER_MODULE = "verify_rebuild_marker_never_imported"
REFERENCE = (ROOT / "docs" / "cachectl.md").read_text()  # its JSON output table


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """(root holding local/ and shared/, {label: key})."""
    from compiler import get_or_compile
    from compiler.examples import example_specs

    root = tmp_path_factory.mktemp("verify-rebuild")
    (root / "shared").mkdir()
    store = Store(Config(dir=root / "local", shared_dir=root / "shared", signing_key=SIGNING_KEY))
    specs = dict(example_specs("sm_90"))
    keys = {label: get_or_compile(specs[label], store)[1] for label in KERNELS}
    add = store.get(keys["add"])[0]
    old = {**add.meta, "toolchain": {"summary": "triton-0.0.0+0123456789ab", "triton_version": "0.0.0"}}
    foreign = {**add.meta, "recipe": {**add.meta["recipe"], "kernel": f"{MARKER_MODULE}:add_kernel"}}
    for key, meta in ((STALE_KEY, old), (MARKER_KEY, foreign), (OTHER_KEY, {"kind": "from-a-newer-version"})):
        store.disk.put_raw(key, store.encode(Entry(key, meta, dict(add.blobs))))
    store.close()
    return root, keys


@pytest.fixture
def cache(pristine, tmp_path, monkeypatch):
    """A copy of the cache: (cachectl's location options, root, {label: key})."""
    root, keys = pristine
    shutil.copytree(root, tmp_path / "copy")
    monkeypatch.setenv("KERNEL_CACHE_SIGNING_KEY", SIGNING_KEY.decode())
    monkeypatch.setattr(kernel_cache, "_default", None)  # compiling opens a process session: dropped after
    yield ("--dir", tmp_path / "copy" / "local", "--shared-dir", tmp_path / "copy" / "shared"), tmp_path / "copy", keys
    if kernel_cache._default is not None:
        kernel_cache._default.close()


def cachectl(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def as_json(capsys, *args) -> tuple[int, dict]:
    code, out, err = cachectl(capsys, *args, "--json")
    doc = json.loads(out)
    assert doc["schema"] == 2, err
    return code, doc


def tamper(root, key: str, change) -> None:
    """Change the shared copy of `key` with `change(entry)` and sign it again with the team's key, as
    a teammate who holds the key (or whoever took over their account) could."""
    shared = Store(Config(shared_dir=root / "shared", signing_key=SIGNING_KEY)).shared
    entry = entry_format.decode(shared.peek_raw(key), expected_key=key)
    change(entry)
    data = Signer(SIGNING_KEY).sign(entry_format.encode(entry))
    assert Signer(SIGNING_KEY).problem(data) is None
    shared.put_raw(key, data)


def _swap_blob(name: str):
    def change(entry: Entry) -> None:
        from compiler.artifact import deflate_run

        blob = entry.blobs[name]
        entry.blobs[name] = blob.replace(b"add.f32", b"sub.f32") if name == "ptx" else blob[:-64] + bytes(64)
        entry.blobs[name + ".deflate"] = deflate_run(entry.blobs[name])  # a careful forger keeps them consistent
        assert entry.blobs[name] != blob
    return change


def test_every_entry_equals_its_rebuild(cache, capsys):
    where, _, keys = cache
    code, doc = as_json(capsys, *where, "verify", "--rebuild", "--all", *ALLOW)
    assert code == 0, doc
    compared = {(e["level"], e["key"]): e for e in doc["entries"] if e["status"] != "skipped"}
    assert set(compared) == {(level, key) for level in ("disk", "shared") for key in keys.values()}
    assert {e["status"] for e in compared.values()} == {"equal"} and doc["checked"] == doc["equal"] == 4
    skipped = {e["key"]: e["reason"] for e in doc["entries"] if e["status"] == "skipped"}
    assert skipped[STALE_KEY].startswith("built by another toolchain (triton-0.0.0+")
    assert skipped[MARKER_KEY].startswith(f"module '{MARKER_MODULE}' is not allowed")
    assert doc["not_rebuilt"] == {"other": 1} and doc["remaining_bad"] == 0 and doc["sample"] is None
    documented = set(re.findall(r"`([a-z_]+)`", re.search(r"^\| `verify --rebuild` \| (.*) \|$", REFERENCE, re.M)[1]))
    assert {*doc, *doc["entries"][0]} - {"schema"} <= documented, "fields docs/cachectl.md's JSON output table lacks"

    code, out, err = cachectl(capsys, *where, "verify", "--rebuild", "--all", *ALLOW)
    assert code == 0 and out.count("equal    sm_90") == 4, out + err
    assert "4 equal, 0 differ, 0 failed" in out and "not rebuilt: 1 other" in out
    assert "SKIPPED  1 entry built by another toolchain" in err
    assert "equal" not in cachectl(capsys, *where, "-q", "verify", "--rebuild", "--all", *ALLOW)[1]


@pytest.mark.parametrize("blob", ["ptx", "cubin"])
def test_a_validly_signed_wrong_entry_is_found_and_repair_replaces_it(cache, capsys, blob):
    where, root, keys = cache
    victim = keys["add"]
    tamper(root, victim, _swap_blob(blob))
    assert cachectl(capsys, *where, "verify", "--level", "shared")[0] == 0  # format, checksum, signature: all good

    code, out, err = cachectl(capsys, *where, "verify", "--rebuild", "--all", "--level", "shared", *ALLOW)
    assert code == 1
    assert f"MISMATCH  {victim[:12]}  add_kernel  sm_90  (shared): {blob}, {blob}.deflate differ" in err
    assert "verify --rebuild --repair" in err and "1 equal, 1 differ" in out
    code, doc = as_json(capsys, *where, "verify", "--rebuild", "--all", "--level", "shared", *ALLOW)
    bad = [e for e in doc["entries"] if e["status"] == "mismatch"]
    assert code == 1 and [(e["key"], e["differs"]) for e in bad] == [(victim, [blob, f"{blob}.deflate"])]

    code, out, err = cachectl(capsys, *where, "verify", "--rebuild", "--all", "--level", "shared", "--repair", *ALLOW)
    assert code == 0 and f"replaced  {victim[:12]}  add_kernel" in out and "(1 replaced)" in out, out + err
    shared = Store(Config(shared_dir=root / "shared", signing_key=SIGNING_KEY)).shared
    assert Signer(SIGNING_KEY).problem(shared.peek_raw(victim)) is None  # written signed, as the store writes
    code, doc = as_json(capsys, *where, "verify", "--rebuild", "--all", *ALLOW)
    assert code == 0 and doc["equal"] == 4


def test_a_recipe_that_does_not_give_the_entrys_key_is_a_mismatch_repair_leaves(cache, capsys):
    where, root, keys = cache
    victim = keys["add"]

    def other_recipe(entry: Entry) -> None:
        entry.meta["recipe"]["constexprs"]["BLOCK"] = {"v": 512}

    tamper(root, victim, other_recipe)
    code, doc = as_json(capsys, *where, "verify", "--rebuild", "--all", "--level", "shared", "--repair", *ALLOW)
    (bad,) = [e for e in doc["entries"] if e["status"] == "mismatch"]
    assert code == 1 and bad["key"] == victim and bad["differs"] == ["key"] and not bad["repaired"]
    assert bad["reason"].startswith("the recipe does not give this key") and "not replaced" in bad["reason"]


def test_modules_not_allowed_are_skipped_with_the_hint_and_never_imported(cache, capsys):
    where, _, keys = cache
    code, out, err = cachectl(capsys, *where, "verify", "--rebuild", "--all")
    assert code == 0 and "compared 0 kernel entries" in out and "no --allow-module given" in out
    assert "SKIPPED  4 entries of module 'compiler.examples': not allowed (check them with --allow-module " \
           "'compiler.examples')" in err
    code, out, err = cachectl(capsys, *where, "-v", "verify", "--rebuild", "--all", "--allow-module", "other.*")
    assert code == 0 and f"module '{MARKER_MODULE}' is not allowed: rebuilding this recipe would import (run) " \
                         f"it, and verify --rebuild imports only modules matched by --allow-module PATTERN" in err
    assert MARKER_MODULE not in sys.modules

    code, doc = as_json(capsys, *where, "verify", "--rebuild", "--all", "--level", "disk", "--allow-module", MARKER_MODULE)
    (failed,) = [e for e in doc["entries"] if e["status"] == "failed"]  # allowed, but no such module: exit 1
    assert code == 1 and failed["key"] == MARKER_KEY and failed["reason"].startswith(
        f"cannot rebuild: cannot import module '{MARKER_MODULE}'") and doc["checked"] == doc["remaining_bad"] == 1


def test_sample_bounds_the_entries_compared(cache, capsys):
    where, _, keys = cache
    code, doc = as_json(capsys, *where, "verify", "--rebuild", "--sample", "1", "--level", "disk", *ALLOW)
    compared = [e for e in doc["entries"] if e["status"] != "skipped"]
    assert code == 0 and len(compared) == doc["checked"] == 1 and doc["not_sampled"] == 1 and doc["sample"] == 1
    assert compared[0]["key"] in keys.values()
    code, out, _ = cachectl(capsys, *where, "verify", "--rebuild", "--sample", "1", "--level", "disk", *ALLOW)
    assert "compared 1 kernel entry chosen at random" in out and "1 more not sampled (--all" in out


def test_a_mismatch_names_the_source_paths_when_they_differ():
    stored = Entry("c" * 32, {}, {"ttir": b'#loc = loc("/home/a/lib/k.py":3:1)\n', "cubin": b"x"})
    rebuilt = rebuild_check.Rebuilt("c" * 32, {}, {"ttir": b'#loc = loc("/opt/b/lib/k.py":3:1)\n', "cubin": b"x"})
    assert rebuild_check.differences(stored, rebuilt) == ["ttir"]
    note = rebuild_check._path_note(stored.blobs, rebuilt.blobs)
    assert "compiled from /home/a/lib/k.py, this rebuild from /opt/b/lib/k.py" in note
    assert rebuild_check._path_note(stored.blobs, stored.blobs) == ""


def test_rebuild_options_need_rebuild_and_the_default_sample_is_documented(cache, capsys):
    where, _, _ = cache
    code, _, err = cachectl(capsys, *where, "verify", "--sample", "3")
    assert code == 2 and "go with --rebuild" in err
    assert cachectl(capsys, *where, "verify", "--rebuild", "--sample", "3", "--all")[0] == 2
    verify = build_parser()._subparsers._group_actions[0].choices["verify"]
    sample = next(a for a in verify._actions if "--sample" in a.option_strings)
    assert f"N={rebuild_check.DEFAULT_SAMPLE}" in sample.help


@pytest.mark.skipif(shutil.which("redis-server") is None,
                    reason="redis-server is not installed (apt-get install redis-server; scripts/test.sh does it "
                           "where it runs as root)")
def test_repair_replaces_a_remote_entry(cache, capsys, tmp_path):
    """The remote writes with SET NX (a put keeps what is there), so there --repair removes the wrong entry first."""
    from redis_server import RedisServer

    where, root, keys = cache
    (tmp_path / "redis").mkdir()
    server = RedisServer(tmp_path / "redis")
    try:
        store = Store(Config(remote=server.url, signing_key=SIGNING_KEY))
        remote = store.level("remote")
        shared = Store(Config(shared_dir=root / "shared", signing_key=SIGNING_KEY)).shared
        for key in keys.values():
            remote.put_raw(key, shared.peek_raw(key))
        victim = keys["scaled_add"]
        wrong = entry_format.decode(remote.peek_raw(victim), expected_key=victim)
        _swap_blob("cubin")(wrong)
        signed = Signer(SIGNING_KEY).sign(entry_format.encode(wrong))
        remote.delete(victim)  # a put alone would keep the entry there
        remote.put_raw(victim, signed)
        assert remote.peek_raw(victim) == signed
        on_remote = ("--dir", where[1], "--remote", server.url, "verify", "--rebuild", "--all", "--level", "remote", *ALLOW)
        code, doc = as_json(capsys, *on_remote)
        assert code == 1 and [e["key"] for e in doc["entries"] if e["status"] == "mismatch"] == [victim]
        code, doc = as_json(capsys, *on_remote, "--repair")
        assert code == 0 and doc["repaired"] == 1 and remote.peek_raw(victim) != signed
        assert as_json(capsys, *on_remote)[1]["equal"] == 2
    finally:
        server.stop()
