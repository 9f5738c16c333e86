"""The entry-kind registry (cachectl.entry_kinds): every kind a writer puts in a store is registered
once, each kind's check refuses what is malformed of it, and verify, bundle import, list, stats,
Prometheus and show all take a kind from the registry: one registered here, in a fixture, is checked,
summarised, tagged, counted, labelled and shown without touching any of them."""

from __future__ import annotations

import dataclasses
import json
import os
import time
import zlib
from pathlib import Path

import pytest

from cachectl import entry_kinds
from cachectl.check.verify import verify
from cachectl.entry_kinds import EntryKind
from cachectl.inventory import EntryInfo
from cachectl.main import main
from cachectl.move.bundle_file import export_bundle, stage_bundle
from cachectl.see import show
from kernel_cache import Config, Store, value_class
from kernel_cache.entries import call_entry, memo_entry, warm_set, winner_entry
from kernel_cache.entries import entry as entry_format
from kernel_cache.entries.entry import Entry
from kernel_cache.levels.disk import DiskLevel

KEYS = tuple(f"{n:032x}" for n in range(1, 8))
TARGET = {"backend": "cuda", "arch": 90, "warp_size": 32}


# One real entry of each kind, built by its writer -------------------------------------------------
def kernel_entry() -> Entry:
    from compiler.artifact import Artifact
    from compiler.target import parse_target

    meta, blobs = Artifact(name="add_kernel", target=parse_target("sm_90"), num_warps=4, num_ctas=1, num_stages=2,
                           shared_mem=0, blobs={"cubin": b"\x7fELF a cubin"}).to_entry()
    return Entry(key=KEYS[0], meta=meta, blobs=blobs)


def call_record(**changes) -> call_entry.CallRecord:
    record = call_entry.CallRecord(
        key=KEYS[1], kernel="add_kernel", call_name="add", platform="cuda", arch="sm_90", target=TARGET,
        toolchain="triton-x+abc", config_keys=(KEYS[0],), compile_seconds=0.1, payload=zlib.compress(b"proto"))
    return value_class.replace(record, **changes)


def winner(**changes) -> winner_entry.Winner:
    record = winner_entry.Winner(
        kernel="add_kernel", arch="sm_90", target=TARGET, toolchain="triton-x+abc", device="Test GPU",
        key_values=winner_entry.canonical({"n": 4096}), key_text="n=4096",
        configs=(winner_entry.ConfigTiming(KEYS[0], "BLOCK: 256", 1e-3), winner_entry.ConfigTiming(KEYS[2], "BLOCK: 512", 2e-3)),
        winner=0, reps=5, label="test")
    return dataclasses.replace(record, **changes)


def memo() -> Entry:
    return memo_entry.to_entry("triton_key", ["3.9.0", ["/site/triton/_C/libtriton.so", 1, 2, 3, 4]], "3.9.0abc")


def warm(*members: Entry) -> Entry:
    members = members or (kernel_entry(), call_record().to_entry())
    return warm_set.to_entry(members[0].key, list(members))


def with_meta(entry: Entry, **meta: object) -> Entry:
    return Entry(key=entry.key, meta={**entry.meta, **meta}, blobs=entry.blobs)


# kind name -> (a good entry, malformed entries of the kind): one row per registered kind
def cases() -> dict[str, tuple[Entry, list[Entry]]]:
    good_winner = winner().to_entry()
    return {
        # A kernel has no record of its own to check: decode checks its format and checksum, and its
        # launch metadata is the compiler's to read (Artifact.from_entry). Nothing more is refused.
        entry_kinds.KERNEL.name: (kernel_entry(), []),
        call_entry.KIND: (call_record().to_entry(), [
            call_record(payload=b"not a zlib stream").to_entry(),
            call_record(payload=zlib.compress(b"proto")[:-3]).to_entry(),  # truncated
            call_record(payload=None).to_entry(),  # neither a payload nor a winner key
            with_meta(call_record().to_entry(), config_keys=["../../etc/passwd"]),
        ]),
        memo_entry.KIND: (memo(), [
            Entry(key=memo().key, meta={**memo().meta, "identity": [["/elsewhere/libtriton.so", 1, 2, 3, 4]]},
                  blobs=memo().blobs),  # filed under another identity's key
            Entry(key=memo().key, meta=memo().meta, blobs={"text": b"\xff"}),  # not UTF-8
            Entry(key=memo().key, meta=memo().meta, blobs={}),
        ]),
        warm_set.KIND: (warm(), [
            Entry(key=KEYS[6], meta=warm().meta, blobs=warm().blobs),  # filed under a key its first read does not give
            Entry(key=warm().key, meta=warm().meta, blobs={"members": warm().blobs["members"][:-1]}),  # cut short
            warm(kernel_entry(), call_record(payload=b"not a zlib stream").to_entry()),  # a member no usable record
        ]),
        winner_entry.KIND: (good_winner, [
            Entry(key=winner(device="another GPU").key, meta=good_winner.meta),  # filed under another key
            with_meta(good_winner, winner={"index": 7}),
            with_meta(good_winner, configs="no list"),
        ]),
    }


def test_every_kind_a_writer_puts_in_a_store_is_registered():
    from compiler.artifact import KIND as ARTIFACT_KIND

    written = {e.meta["kind"] for e in (kernel_entry(), call_record().to_entry(), winner().to_entry(), memo(), warm())}
    assert written == {ARTIFACT_KIND, call_entry.KIND, winner_entry.KIND, memo_entry.KIND, warm_set.KIND}
    assert {k.name for k in entry_kinds.registered()} == written
    assert entry_kinds.KERNEL.name == ARTIFACT_KIND  # spelled in the core, which may not import the compiler
    for meta in (kernel_entry().meta, call_record().to_entry().meta, winner().to_entry().meta, memo().meta, warm().meta):
        assert entry_kinds.kind_of(meta).name == meta["kind"]
    every = entry_kinds.every()
    assert every[-2:] == (entry_kinds.OTHER, entry_kinds.UNREADABLE)
    assert len({k.name for k in every}) == len({k.tag for k in every}) == len(every)
    for kind in every:  # each names a show view cachectl can import
        assert callable(show.view(kind)), kind.name


def test_unknown_or_hostile_kinds_fall_back_to_other():
    for meta in ({}, {"kind": "from-a-newer-version"}, {"kind": ["unhashable"]}, {"kind": 7},
                 {"kind": "other"}, {"kind": "unreadable"}):
        assert entry_kinds.kind_of(meta) is entry_kinds.OTHER, meta
    assert entry_kinds.problem(Entry(key=KEYS[5], meta={"kind": "from-a-newer-version"}, blobs={})) is None
    with pytest.raises(ValueError, match="clashes"):
        entry_kinds.register(EntryKind("lowered-call", "call2", "x", "xs"))
    with pytest.raises(ValueError, match="clashes"):
        entry_kinds.register(EntryKind("new-kind", "winner", "x", "xs"))
    assert "new-kind" not in {k.name for k in entry_kinds.registered()}


@pytest.mark.parametrize("name", [k.name for k in entry_kinds.registered()])
def test_each_kind_accepts_a_good_entry_and_refuses_a_malformed_one(name):
    assert set(cases()) == {k.name for k in entry_kinds.registered()}  # a new kind brings its own case
    good, malformed = cases()[name]
    kind = entry_kinds.named(name)
    decoded = entry_format.decode(entry_format.encode(good), expected_key=good.key)
    assert kind.problem(decoded) is None and entry_kinds.problem(decoded) is None
    for bad in malformed:
        reason = kind.problem(bad)
        assert isinstance(reason, str) and reason, bad.meta
        assert entry_kinds.problem(bad) == reason  # verify and bundle import ask the kind
    if kind.summary is not None:
        assert kind.summary(good.meta) is not None and kind.summary({"kind": "some-other-kind"}) is None


# A kind registered here, seen by every tool --------------------------------------------------------
def show_gadget(entry: Entry, info: EntryInfo, args: show.ShowArgs) -> None:
    print(f"gadget {entry.key} with {entry.meta.get('wheels')} wheels, hits {args.hits}")


def _gadget_problem(entry: Entry) -> str | None:
    return None if isinstance(entry.meta.get("wheels"), int) else "gadget has no wheels"


def _gadget_summary(meta: dict[str, object]) -> dict[str, object] | None:
    return {"wheels": meta.get("wheels")} if meta.get("kind") == "test-gadget" else None


@pytest.fixture
def gadget_kind(monkeypatch) -> EntryKind:
    """A kind registered for one test; the registry is restored after it."""
    monkeypatch.setattr(entry_kinds, "_REGISTERED", dict(entry_kinds._REGISTERED))
    return entry_kinds.register(EntryKind("test-gadget", "gadget", "gadget", "gadgets", _gadget_problem,
                                          _gadget_summary, f"{__name__}:show_gadget", legend="a test's gadget"))


@pytest.fixture
def gadget_cache(tmp_path, monkeypatch, gadget_kind) -> Path:
    """A cache with a kernel, two gadgets (one without wheels) and an entry of an unknown kind."""
    for name in [n for n in os.environ if n.startswith("KERNEL_CACHE_")]:
        monkeypatch.delenv(name)
    directory = tmp_path / "cache"
    store = Store(Config(dir=directory))
    now = time.time()
    store.put(kernel_entry())
    store.put(Entry(key=KEYS[3], meta={"kind": "test-gadget", "name": "car", "arch": "sm_90", "created": now,
                                       "wheels": 4}, blobs={}))
    store.put(Entry(key=KEYS[4], meta={"kind": "test-gadget", "name": "sled", "arch": "sm_90", "created": now},
                    blobs={}))
    store.put(Entry(key=KEYS[5], meta={"kind": "from-a-newer-version", "name": "later", "created": now}, blobs={}))
    store.close()
    return directory


def cachectl(capsys, *args: object) -> tuple[int, str]:
    code = main([str(a) for a in args])
    return code, capsys.readouterr().out


def test_a_registered_kind_is_listed_counted_and_labelled(gadget_cache, capsys):
    code, text = cachectl(capsys, "--dir", gadget_cache, "list")
    assert code == 0
    assert f"{KEYS[3][:12]}  car [gadget]" in text and f"{KEYS[0][:12]}  add_kernel " in text
    assert "4 entries (1 kernel, 2 gadgets, 1 other), " in text.splitlines()[-1]

    code, out = cachectl(capsys, "--dir", gadget_cache, "list", "--json")
    rows = {r["key"]: r for r in json.loads(out)["entries"]}
    assert rows[KEYS[3]]["gadget"] == {"wheels": 4} and rows[KEYS[4]]["gadget"] == {"wheels": None}
    assert rows[KEYS[0]]["gadget"] is None and rows[KEYS[3]]["call"] is None and rows[KEYS[3]]["winner"] is None

    code, out = cachectl(capsys, "--dir", gadget_cache, "stats", "--json")
    assert json.loads(out)["kinds"] == {"triton-kernel": 1, "test-gadget": 2, "other": 1}
    code, out = cachectl(capsys, "--dir", gadget_cache, "stats")
    assert "entry kinds          1 kernel, 2 gadgets, 1 other\n" in out
    code, out = cachectl(capsys, "--dir", gadget_cache, "stats", "--format", "prometheus")
    assert f'kernel_cache_entries_by_kind{{dir="{gadget_cache}",level="disk",kind="gadget"}} 2\n' in out
    assert f'kernel_cache_entries_by_kind{{dir="{gadget_cache}",level="disk",kind="other"}} 1\n' in out
    assert ("# HELP kernel_cache_entries_by_kind Entries stored in this level by kind (kernel, call: a lowered-call "
            "record, winner: an autotune winner, memo: a memo record (a toolchain fingerprint or a warm set's lineage), "
            "warm: the records one program read, kept in one entry, gadget: a test's gadget, other, unreadable).\n") in out


def test_a_registered_kind_is_shown_by_its_own_view(gadget_cache, capsys):
    code, out = cachectl(capsys, "--dir", gadget_cache, "show", KEYS[3])
    assert code == 0 and out == f"key          {KEYS[3]}  (disk)\ngadget {KEYS[3]} with 4 wheels, hits 0\n"
    code, out = cachectl(capsys, "--dir", gadget_cache, "show", KEYS[3], "--json")
    assert json.loads(out)["gadget"] == {"wheels": 4}
    code, out = cachectl(capsys, "--dir", gadget_cache, "show", KEYS[5])  # unknown: shown as a kernel is
    assert out.startswith(f"key          {KEYS[5]}  (disk)\nkernel       later\n")


def test_verify_and_bundle_import_refuse_what_the_kind_refuses(gadget_cache, tmp_path, capsys):
    level = DiskLevel(gadget_cache)
    try:
        checked, bad = verify(level)
        raws = [(key, raw, {}) for key in KEYS[3:6] if (raw := level.peek_raw(key)) is not None]
    finally:
        level.close()
    assert checked == 4 and [(b.key, b.reason) for b in bad] == [(KEYS[4], "gadget has no wheels")]
    code, out = cachectl(capsys, "--dir", gadget_cache, "verify")
    assert code == 1 and "gadget has no wheels" in out

    class Level(dict[str, bytes]):
        def put_raw(self, key: str, data: bytes) -> None:
            self[key] = data

    export_bundle(tmp_path / "b.kcb", raws)
    landed = Level()
    with stage_bundle(tmp_path / "b.kcb") as staged:
        result = staged.publish(landed)
    assert result.rejected == [(KEYS[4], "gadget has no wheels")] and set(landed) == {KEYS[3], KEYS[5]}
