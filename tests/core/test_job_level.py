"""The job level on an in-memory key-value store shaped like a job's coordinator (get, atomic create,
overwrite, delete): entries shared and checked, one compile per key across the stores of a job, a dead
holder's lease taken over within one lease lifetime, the byte bound, and a coordinator that refuses or
hangs: one warning, one timeout at most, then the level is skipped."""

from __future__ import annotations

import threading
import time
import warnings

import pytest

from kernel_cache import Config, Store
from kernel_cache.entries import entry as entry_format
from kernel_cache.entries.entry import CorruptEntry, Entry
from kernel_cache.errors import RejectedEntry
from kernel_cache.levels.job import PREFIX, JobLevel
from kernel_cache.telemetry import warnings_once
from kernel_cache.trust.signing import Signer

KEY = "0123456789abcdef0123456789abcdef"
KEYS = [f"{i:032x}" for i in range(1, 9)]


@pytest.fixture(autouse=True)
def _fresh_warnings():
    warnings_once.reset()
    yield
    warnings_once.reset()


class FakeCoordinator:
    """A job's key-value store in memory. `fail`: the call names ('get', 'create', ...) that raise;
    `hang`: those that block until `release` is set."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.lock = threading.Lock()
        self.calls: list[str] = []
        self.fail: set[str] = set()
        self.hang: set[str] = set()
        self.release = threading.Event()

    def _enter(self, call: str) -> None:
        self.calls.append(call)
        if call in self.hang:
            self.release.wait(30)
        if call in self.fail:
            raise RuntimeError(f"UNAVAILABLE: the coordinator refused {call}")

    def get(self, name: str) -> bytes | None:
        self._enter("get")
        with self.lock:
            return self.values.get(name)

    def create(self, name: str, value: bytes) -> bool:
        self._enter("create")
        with self.lock:
            if name in self.values:
                return False
            self.values[name] = value
            return True

    def overwrite(self, name: str, value: bytes) -> None:
        self._enter("overwrite")
        with self.lock:
            self.values[name] = value

    def delete(self, name: str) -> None:
        self._enter("delete")
        with self.lock:
            self.values.pop(name, None)


def entry_bytes(key: str = KEY, size: int = 300, signer: Signer | None = None) -> bytes:
    data = entry_format.encode(Entry(key=key, meta={"kernel": "synthetic"}, blobs={"cubin": b"k" * size}))
    return signer.sign(data) if signer is not None else data


def level(client: FakeCoordinator, process: int = 0, lease_seconds: float = 1.0, **kwargs) -> JobLevel:
    made = JobLevel(client, process, 4, **kwargs)
    made.lease_seconds, made.call_seconds, made.entry_seconds = lease_seconds, 0.3, 0.3  # a test's pace
    return made


def test_an_entry_put_by_one_process_is_read_by_another():
    client = FakeCoordinator()
    mine, theirs = level(client, 0), level(client, 1)
    assert theirs.get(KEY) is None and KEY not in theirs
    mine.put_raw(KEY, entry_bytes())
    assert KEY in theirs
    entry = theirs.get(KEY)
    assert entry is not None and entry.blobs["cubin"] == b"k" * 300
    assert entry.stored == entry_bytes()  # copied up by the store as it was stored
    mine.put_raw(KEY, entry_bytes(size=10))  # first writer wins: never overwritten
    assert theirs.get(KEY).blobs["cubin"] == b"k" * 300
    assert mine.counters["writes"] == 1 and mine.put_bytes == len(entry_bytes())


def test_a_damaged_entry_is_a_miss_and_removed():
    client = FakeCoordinator()
    mine = level(client)
    mine.put_raw(KEY, entry_bytes())
    client.values[PREFIX + "e/" + KEY] = client.values[PREFIX + "e/" + KEY][:-7] + b"garbage"
    with pytest.raises(CorruptEntry):
        mine.get(KEY)
    assert PREFIX + "e/" + KEY not in client.values and KEY not in mine
    with pytest.raises(ValueError):
        mine.put_raw(KEY, b"not an entry")
    assert mine.writable


def test_with_a_signing_key_only_signed_entries_are_read():
    client, signer = FakeCoordinator(), Signer(b"job-signing-key-0123456789abcdef")
    signed = level(client, signer=signer)
    client.values[PREFIX + "e/" + KEY] = entry_bytes()  # unsigned, planted
    with pytest.raises(RejectedEntry, match="unsigned"):
        signed.get(KEY)
    client.values[PREFIX + "e/" + KEY] = entry_bytes(signer=Signer(b"another-key-0123456789abcdefghij"))
    with pytest.raises(RejectedEntry, match="another key"):
        signed.get(KEY)
    client.values[PREFIX + "e/" + KEY] = entry_bytes(signer=signer)
    assert signed.get(KEY) is not None


def test_a_waiter_sees_the_holders_entry_and_does_not_compile():
    client = FakeCoordinator()
    holder, waiter = level(client, 0), level(client, 1)
    outcome: list[object] = []
    with holder.lock(KEY, 5) as held:
        assert held is True
        thread = threading.Thread(target=lambda: outcome.append(_lock_once(waiter, KEY, 5)))
        thread.start()
        time.sleep(0.2)
        assert not outcome  # waiting for the holder
        holder.put_raw(KEY, entry_bytes())
    thread.join(5)
    assert outcome == [False] and waiter.counters["lock_waits"] == 1
    assert not [name for name in client.values if "/l/" in name]  # released
    with waiter.lock(KEY, 5) as again:  # a later process: the entry is there, the lease free
        assert again is True


def test_a_wait_ends_at_its_timeout():
    client = FakeCoordinator()
    holder, waiter = level(client, 0, lease_seconds=30.0), level(client, 1, lease_seconds=30.0)
    with holder.lock(KEY, 5):
        start = time.monotonic()
        assert _lock_once(waiter, KEY, 0.3) is False
        assert time.monotonic() - start < 1.5


def test_a_dead_holders_lease_costs_one_lifetime_and_one_takes_it_over():
    client = FakeCoordinator()
    deadline_ms = int((time.time() + 0.6) * 1000)
    client.values[f"{PREFIX}l/{KEY}/0"] = f"kcj1:3-dead:{deadline_ms}".encode()  # its holder was killed
    waiters = [level(client, i) for i in range(3)]
    outcome: dict[int, tuple[object, float]] = {}

    def wait(i: int) -> None:
        start = time.monotonic()
        with waiters[i].lock(KEY, 30) as got:
            outcome[i] = (got, time.monotonic() - start)
            if got:
                time.sleep(0.2)  # compiling
                waiters[i].put_raw(KEY, entry_bytes())
    threads = [threading.Thread(target=wait, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    got = sorted(str(v[0]) for v in outcome.values())
    assert got == ["False", "False", "True"], outcome
    assert max(v[1] for v in outcome.values()) < 0.6 + 0.2 + 1.0  # the lease's end, the compile, polling


def test_a_lease_whose_deadline_never_comes_is_taken_after_one_unchanged_lifetime():
    client = FakeCoordinator()
    client.values[f"{PREFIX}l/{KEY}/0"] = b"kcj1:3-dead:99999999999999"  # a holder's clock far ahead
    start = time.monotonic()
    assert _lock_once(level(client, 1, lease_seconds=0.5), KEY, 30) is True
    assert 0.5 <= time.monotonic() - start < 1.5


def test_a_live_holder_keeps_its_lease_past_its_lifetime():
    client = FakeCoordinator()
    holder, waiter = level(client, 0, lease_seconds=0.3), level(client, 1, lease_seconds=0.3)
    with holder.lock(KEY, 5):
        start = time.monotonic()
        assert _lock_once(waiter, KEY, 1.2) is False  # the heartbeat kept it: the wait ran to its end
        assert time.monotonic() - start >= 1.1


def test_the_bound_stops_puts_and_leases_with_one_warning():
    client = FakeCoordinator()
    bounded = level(client, max_bytes=2 * len(entry_bytes()) + 10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for key in KEYS[:4]:
            bounded.put_raw(key, entry_bytes(key))
    assert bounded.put_bytes == 2 * len(entry_bytes()) and not bounded.writable
    assert "bound" in bounded.mode
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and "KERNEL_CACHE_JOB_MAX_BYTES" in said[0], said
    assert bounded.get(KEYS[0]) is not None  # still read


@pytest.mark.parametrize("call", ["create", "get"])
def test_a_coordinator_refusing_costs_one_warning_then_the_level_is_skipped(call):
    client = FakeCoordinator()
    client.fail.add(call)
    mine = level(client)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mine.put_raw(KEY, entry_bytes())
        assert mine.get(KEY) is None
        with mine.lock(KEY, 5) as held:
            assert held is None  # nobody to wait for: compile now
        mine.put_raw(KEYS[0], entry_bytes(KEYS[0]))
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and "refused" in said[0] and "KERNEL_CACHE_JOB=0" in said[0], said
    assert mine.skipped and not mine.writable and "skipped" in mine.mode
    assert client.calls.index(call) == len(client.calls) - 1  # nothing asked after the fault


def test_a_hung_coordinator_costs_one_timeout():
    client = FakeCoordinator()
    client.hang.add("get")
    mine = level(client)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            start = time.monotonic()
            assert mine.get(KEY) is None
            assert KEY not in mine
            with mine.lock(KEY, 30) as held:
                assert held is None
            assert mine.get(KEYS[0]) is None
            assert time.monotonic() - start < 0.3 + 0.5
        said = [str(w.message) for w in caught]
        assert len(said) == 1 and "did not answer within 0.3 s" in said[0], said
    finally:
        client.release.set()


def _lock_once(lv: JobLevel, key: str, timeout: float) -> object:
    with lv.lock(key, timeout) as got:
        return got


# The level in the store ---------------------------------------------------------------------

def job_store(tmp_path, name: str, client: FakeCoordinator, process: int, **config) -> Store:
    store = Store(Config(dir=tmp_path / name, **config))
    store.add_transient(level(client, process))
    return store


def test_the_stores_of_a_job_compile_each_key_once(tmp_path):
    client = FakeCoordinator()
    stores = [job_store(tmp_path, f"p{i}", client, i) for i in range(4)]
    built: list[str] = []

    def run(store: Store) -> None:
        for key in KEYS:
            def build(key: str = key) -> tuple[dict, dict, float]:
                built.append(key)
                time.sleep(0.05)
                return {"kernel": "synthetic"}, {"cubin": key.encode() * 8}, 0.05
            assert store.get_or_create(key, build)[1]["cubin"] == key.encode() * 8
    threads = [threading.Thread(target=run, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(built) == KEYS
    hits = sum(s.stats.session()["hits"]["job"] for s in stores)
    assert hits == 3 * len(KEYS)
    assert all(s.get_local(key) is not None for s in stores for key in KEYS)  # copied to each local level


def test_with_a_shared_directory_the_job_level_coordinates_and_the_directory_keeps(tmp_path):
    client = FakeCoordinator()
    (tmp_path / "shared").mkdir()
    store = job_store(tmp_path, "local", client, 0, shared_dir=tmp_path / "shared")
    assert [t.name for t in store.levels] == ["memory", "disk", "job", "shared"]
    assert [t.name for t in store._lock_levels()] == ["disk", "job", "shared"]
    assert [t.name for t in store.cluster_levels] == ["job", "shared"]
    store.get_or_create(KEY, lambda: ({"kernel": "synthetic"}, {"cubin": b"x" * 64}, 0.01))
    assert KEY in store.level("job") and KEY in store.shared  # written to every level: the directory lasts
    later = Store(Config(dir=tmp_path / "next-run", shared_dir=tmp_path / "shared"))  # the job is gone
    assert later.get(KEY)[1] == "shared"


def test_a_failing_job_level_never_fails_a_compile(tmp_path):
    client = FakeCoordinator()
    client.fail.update({"create", "get"})
    store = job_store(tmp_path, "local", client, 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for key in KEYS[:3]:
            meta, blobs = store.get_or_create(key, lambda: ({"kernel": "synthetic"}, {"cubin": b"y" * 8}, 0.01))
            assert blobs["cubin"] == b"y" * 8
    assert store.stats.session()["compiles"] == 3
    assert len([w for w in caught if "coordinator" in str(w.message)]) == 1
