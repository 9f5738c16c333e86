"""Warm sets (`kernel_cache.entries.warm_set`): the entries one program read, kept in one local entry
so its next process reads them in one go. Served only for the members the local level still holds,
each checked under its own key; written at exit only where it changed; refused when forged; end to
end, a second process's records come from the set, never from the store one by one."""

from __future__ import annotations

import os

import pytest
from test_call_records import PROGRAMS, entries, lower, use_store  # noqa: F401  (fixture)

import kernel_cache
from cachectl import entry_kinds
from kernel_cache import Config, Entry, Store, front_level
from kernel_cache.entries import call_entry, warm_set
from kernel_cache.entries import entry as entry_format
from kernel_cache.entries.canonical import digest

_opened: list[Store] = []


def _store(config: Config) -> Store:
    """A store closed when the test ends (an unclosed one may warn when collected, in a later
    test's warning catcher)."""
    _opened.append(Store(config))
    return _opened[-1]


@pytest.fixture(autouse=True)
def _close_stores():
    yield
    while _opened:
        _opened.pop().close()


def _entry(n: int, size: int = 300) -> Entry:
    return Entry(key=digest(["warm set test", n]), meta={"kind": "test", "n": n}, blobs={"data": bytes([n]) * size})


def _stored(store: Store, entries_: list[Entry]) -> list[Entry]:
    """`entries_` written to the store, as a read would return them (with their stored bytes)."""
    for entry in entries_:
        store.put(entry)
    store.memory.clear()
    return [store.get(entry.key)[0] for entry in entries_]


def asked(warm: front_level.WarmSet, key: str) -> Entry | None:
    """What a program's ask of `key` gets from its warm set: the first ask loads the set it names."""
    warm.begin(key)
    return warm.front_get(key)


def _session(directory) -> tuple[Store, front_level.WarmSet]:
    store = _store(Config(dir=directory))
    return store, front_level.WarmSet(store)


def _run(warm: front_level.WarmSet, read: list[Entry]) -> bool:
    """A session that reads `read` (the first through the set, all noted), then exits: whether it wrote."""
    asked(warm, read[0].key)
    for entry in read:
        warm.note(entry)
    return warm.save()


def _members(store: Store, first: Entry) -> list[str]:
    return list(warm_set.members_of(store.get_local(warm_set.set_key(first.key))))


def test_a_second_session_reads_the_members_from_the_set_and_writes_nothing(tmp_path):
    store, warm = _session(tmp_path)
    read = _stored(store, [_entry(n) for n in range(5)])
    assert asked(warm, read[0].key) is None  # no set yet: read from the store, and noted
    for entry in read:
        warm.note(entry)
    assert warm.save()
    set_entry = store.get_local(warm_set.set_key(read[0].key))
    assert set_entry is not None and warm_set.problem(set_entry) is None
    assert list(warm_set.members_of(set_entry)) == [e.key for e in read]  # in the order they were read

    store, warm = _session(tmp_path)
    store.get = lambda key: pytest.fail(f"read {key[:12]} from the store")  # type: ignore[method-assign]
    for entry in read:
        served = asked(warm, entry.key)
        assert served is not None and (served.key, served.meta, served.blobs) == (entry.key, entry.meta, entry.blobs)
    assert asked(warm, _entry(99).key) is None  # not a member: the caller reads the store
    assert not warm.save()  # nothing new, nothing gone: a warm process repeating its run writes nothing


def test_a_member_the_local_level_no_longer_holds_is_not_served(tmp_path):
    store, warm = _session(tmp_path)
    read = _stored(store, [_entry(n) for n in range(3)])
    _run(warm, read)
    store.delete(read[1].key)  # an operator's delete, a prune, an eviction

    store, warm = _session(tmp_path)
    assert asked(warm, read[0].key) is not None
    assert asked(warm, read[1].key) is None
    assert asked(warm, read[2].key) is not None
    assert warm.save()  # a member gone: the set is written without it
    assert _members(store, read[0]) == [read[0].key, read[2].key]


def test_new_reads_go_first_and_the_set_keeps_what_it_held(tmp_path):
    store, warm = _session(tmp_path)
    read = _stored(store, [_entry(n) for n in range(4)])
    _run(warm, read[:3])

    store, warm = _session(tmp_path)
    asked(warm, read[0].key)
    warm.note(read[3])  # read from the store: a key the set did not hold
    assert warm.save()
    members = _members(store, read[0])
    assert members == [read[0].key, read[3].key, read[1].key, read[2].key]


def test_a_malformed_set_is_read_from_the_store_and_written_anew(tmp_path):
    store, warm = _session(tmp_path)
    read = _stored(store, [_entry(n) for n in range(2)])
    bad = warm_set.to_entry(read[0].key, read)
    bad.meta["members"][1][2][0][1] += 1  # its sizes no longer add up to its blob
    store.put_local(bad)

    store, warm = _session(tmp_path)
    assert asked(warm, read[0].key) is None  # not served: the caller reads the store
    for key in (read[0].key, read[1].key):
        warm.note(store.get(key)[0])
    assert warm.save()
    rewritten = store.get_local(warm_set.set_key(read[0].key))
    assert warm_set.problem(rewritten) is None and list(warm_set.members_of(rewritten)) == [e.key for e in read]


def test_verify_checks_each_member_as_the_kind_it_says_it_is(tmp_path):
    store = _store(Config(dir=tmp_path))
    good = _stored(store, [_entry(0)])[0]
    record = call_entry.CallRecord(key=digest("a call"), kernel="k", call_name="", platform="cuda", arch="sm_90",
                                   target={}, toolchain="t", config_keys=(good.key,), compile_seconds=0.0,
                                   payload=b"not a zlib stream").to_entry()
    bad = warm_set.to_entry(good.key, [good, record])
    assert warm_set.problem(bad) is None  # its shape is sound
    assert "warm set member" in entry_kinds.problem(bad) and "zlib" in entry_kinds.problem(bad)  # verify, import
    assert entry_kinds.problem(warm_set.to_entry(good.key, [good])) is None


@pytest.mark.parametrize("edit, why", [
    (lambda m: m.update(first="0" * 32), "key its first member does not give"),
    (lambda m: m["members"].append(m["members"][0]), "twice"),
    (lambda m: m["members"][0][2][0].__setitem__(1, m["members"][0][2][0][1] + 1), "add up"),
    (lambda m: m["members"][0][2][0].__setitem__(1, True), "[name, size]"),
    (lambda m: m["members"][0][2].append(m["members"][0][2][0]), "names once"),
    (lambda m: m["members"][0].__setitem__(0, "../x"), "[key, metadata, blob sizes]"),
    (lambda m: m["members"][0].__setitem__(1, ["not", "a", "dict"]), "[key, metadata, blob sizes]"),
    (lambda m: m.pop("signed"), "signatures"),
    (lambda m: m.update(signed=[["a" * 32, "b" * 32]]), "signatures"),  # names no member
    (lambda m: m.update(signed=[["a" * 32, m["members"][0][0]]] * 2), "signatures"),  # one signature twice
    (lambda m: m.update(signed=[["../x", m["members"][0][0]]]), "signatures"),
    (lambda m: m.update(signed=[["a" * 32]]), "signatures"),
])
def test_malformed_sets_say_why(tmp_path, edit, why):
    store = _store(Config(dir=tmp_path))
    read = _stored(store, [_entry(n) for n in range(2)])
    entry = warm_set.to_entry(read[0].key, read)
    edit(entry.meta)
    assert why in warm_set.problem(entry)
    with pytest.raises(ValueError):
        warm_set.members_of(entry)


def test_the_set_keeps_within_its_member_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(warm_set, "MAX_MEMBERS", 3)
    store, warm = _session(tmp_path)
    read = _stored(store, [_entry(n) for n in range(5)])
    _run(warm, read)
    assert _members(store, read[0]) == [e.key for e in read[:3]]


def test_the_set_keeps_within_its_byte_bound(tmp_path, monkeypatch):
    store, warm = _session(tmp_path)
    read = _stored(store, [_entry(n, size=1000) for n in range(5)])
    monkeypatch.setattr(warm_set, "MAX_BYTES", 2 * (read[0].size + 1024) + 10)
    _run(warm, read)
    assert _members(store, read[0]) == [e.key for e in read[:2]]


def test_a_store_without_a_local_level_keeps_no_set():
    warm = front_level.WarmSet(_store(Config(dir=None)))
    entry = _entry(1)
    assert asked(warm, entry.key) is None
    warm.note(entry)
    assert not warm.active and not warm.save()


def test_a_new_process_reads_its_programs_records_from_the_warm_set(tmp_path, use_store):  # noqa: F811
    """End to end: a session lowers two programs (their records written and noted), exit saves its set;
    a new session (what a new process is) lowers them again: the same custom calls, each record a
    record hit from the disk level, and not one record read from the store on its own."""
    store = use_store(tmp_path / "cache")
    programs = PROGRAMS[:2]
    first = [lower(fn, shapes) for _, fn, shapes in programs]
    front_level.save_all()  # what exit does
    records = set(entries(store, call_entry.KIND))
    assert len(records) == 2
    sets = entries(store, warm_set.KIND)
    assert len(sets) == 1 and set(warm_set.members_of(next(iter(sets.values())))) == records

    store = use_store(tmp_path / "cache")
    asked: list[str] = []
    real_get = Store.get

    def spying_get(self, key):
        asked.append(key)
        return real_get(self, key)

    Store.get = spying_get  # type: ignore[method-assign]
    try:
        again = [lower(fn, shapes) for _, fn, shapes in programs]
    finally:
        Store.get = real_get  # type: ignore[method-assign]
    assert again == first
    assert not records & set(asked)
    assert store.stats.session()["record_hits"]["disk"] == 2
    before = {k: e.meta["created"] for k, e in entries(store, warm_set.KIND).items()}
    front_level.save_all()
    assert {k: e.meta["created"] for k, e in entries(store, warm_set.KIND).items()} == before  # nothing new: not written
    kernel_cache.configure()


def test_entry_kinds_name_and_summarise_warm_sets(tmp_path):
    store = _store(Config(dir=tmp_path))
    read = _stored(store, [_entry(n) for n in range(2)])
    entry = warm_set.to_entry(read[0].key, read)
    decoded = entry_format.decode(entry_format.encode(entry))
    kind = entry_kinds.kind_of(decoded.meta)
    assert kind is entry_kinds.WARM_SET and (kind.one, kind.many) == ("warm set", "warm sets")
    assert kind.summary(decoded.meta) == {"first": read[0].key, "members": 2}


def test_cachectl_lists_shows_and_verifies_a_warm_set(tmp_path, capsys, monkeypatch):
    from cachectl.main import main

    for name in [n for n in os.environ if n.startswith("KERNEL_CACHE_")]:
        monkeypatch.delenv(name)
    directory = str(tmp_path / "cache")
    store = Store(Config(dir=tmp_path / "cache"))
    read = _stored(store, [_entry(n) for n in range(3)])
    good = warm_set.to_entry(read[0].key, read)
    store.put_local(good)
    store.delete(read[2].key)
    store.close()
    assert main(["--dir", directory, "list"]) == 0
    assert "[warm]" in (out := capsys.readouterr().out) and "1 warm set" in out
    assert main(["--dir", directory, "show", good.key]) == 0
    out = capsys.readouterr().out
    assert "3 members, 2 still held" in out and f"member       {read[2].key[:12]}" in out
    assert "(not held: not served)" in out
    assert main(["--dir", directory, "verify"]) == 0
    capsys.readouterr()

    store = Store(Config(dir=tmp_path / "cache"))
    record = call_entry.CallRecord(key=digest("a call"), kernel="k", call_name="", platform="cuda", arch="sm_90",
                                   target={}, toolchain="t", config_keys=(read[0].key,), compile_seconds=0.0,
                                   payload=b"not a zlib stream").to_entry()
    store.put_local(warm_set.to_entry(read[1].key, [read[1], record]))  # a member that is no usable record
    store.close()
    assert main(["--dir", directory, "verify"]) != 0
    assert "zlib" in capsys.readouterr().out


def test_warm_sets_off_neither_read_nor_write(tmp_path, monkeypatch):
    store, warm = _session(tmp_path)
    read = _stored(store, [_entry(n) for n in range(2)])
    assert _run(warm, read)
    monkeypatch.setenv("KERNEL_CACHE_WARM_SETS", "off")
    monkeypatch.setenv("KERNEL_CACHE_DIR", str(tmp_path))
    config = Config.from_env()
    assert config.warm_sets is False
    off = front_level.WarmSet(_store(config))
    assert asked(off, read[0].key) is None  # the set is there, and not read
    off.note(_stored(store, [_entry(7)])[0])
    assert not off.active and not off.save()


def test_signatures_of_held_members_are_kept_and_served(tmp_path):
    """A session whose first ask is a signature files its set under it; the next serves the member
    the signature names (and, repeating, writes nothing); a pair naming no member is not kept, and
    a member the local level no longer holds is not served by its signature."""
    sig, other = digest("a signature"), digest("another")
    store, warm = _session(tmp_path)
    read = _stored(store, [_entry(n) for n in range(3)])
    assert warm.signed(sig) is None  # the first ask: the set of `sig`, none yet
    for entry in read:
        warm.note(entry)
    warm.sign(sig, read[1].key)
    warm.sign(other, digest("never read"))
    assert warm.save()
    saved = store.get_local(warm_set.set_key(sig))
    assert warm_set.signed_of(saved) == {sig: read[1].key}

    store, warm = _session(tmp_path)
    assert warm.signed(sig) == read[1] and warm.signed(other) is None
    assert not warm.save()  # nothing new

    store, warm = _session(tmp_path)
    store.delete(read[1].key)
    assert warm.signed(sig) is None


def test_a_loaded_set_is_the_stores_front_level(tmp_path, monkeypatch):
    """Once a session's set is in front of the store (`Store.front_level`) and the program's first
    ask has loaded it, `Store.get` answers its members from it, before memory and without the disk,
    as the local level's own; keys it does not hold go down the levels as before. Before the first
    ask loads it, the store's reads never name the set."""
    store, warm = _session(tmp_path)
    read = _stored(store, [_entry(n) for n in range(3)])
    _run(warm, read)
    store, warm = _session(tmp_path)
    store.front_level(warm)
    other = _stored(store, [_entry(9)])[0]
    store.memory.clear()
    assert warm.front_get(read[1].key) is None  # not loaded: a store read names no set
    warm.begin(read[0].key)
    monkeypatch.setattr(store.disk, "get", lambda *a, **k: pytest.fail("read from disk"))
    for entry in read:
        found = store.get(entry.key)
        assert found is not None and found[0].blobs == entry.blobs and found[1] == warm.level
    monkeypatch.undo()
    assert store.get(other.key)[0].blobs == other.blobs  # not a member: from the levels
