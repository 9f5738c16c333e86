"""Job level: the key-value store of a multi-process JAX job (the coordination service that
`jax.distributed.initialize()` starts), shared by the job's processes for as long as the job runs.

Every process of a job lowers the same program; without a shared directory or a Redis server each
would compile every kernel. Here the first process that misses a key compiles it and the others read
what it published. The core knows no JAX: the lowering hands the level a `JobClient` (`lowering/job.py`).

Layout (under `kernel_cache/v1/`): `e/<key>` an entry's bytes exactly as the other levels store
them (signed where a signing key is set); `p/<key>` a small marker written after the entry, so a
waiter asks whether an entry is there without fetching it; `l/<key>/<n>` the n-th lease on the key.
Entries are created, never overwritten (first writer wins), checked on every read like any level's;
a damaged one is deleted and rebuilt.

Single-flight: atomic create of `l/<key>/0` is the lease. Its value names the holder and a deadline
(`kcj1:<holder>:<deadline, epoch ms>`), pushed forward by a heartbeat while the holder compiles, for
at most the lease's maximum lifetime. Others poll the marker and the lease (20 ms, doubling to
250 ms) within the store's waiting budget. A lease past its deadline, or unchanged for a whole
lifetime by the waiter's own clock (a holder whose clock runs ahead), belongs to a dead holder: the
waiter creates `l/<key>/<n+1>`, which only one of them can, and compiles. A process killed holding
a lease so costs the others one lease lifetime at most, never the lock timeout.

Faults: every call has a deadline (it runs on a worker thread). The first call that times out or
fails skips the level for the rest of the process, with one warning. What a process puts is bounded
(KERNEL_CACHE_JOB_MAX_BYTES): past it, it stops putting and taking leases (one warning).
"""

from __future__ import annotations

import contextlib
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Protocol, TypeVar

from kernel_cache.entries import entry as entry_format
from kernel_cache.entries.entry import CorruptEntry, Entry, check_key
from kernel_cache.errors import RejectedEntry
from kernel_cache.telemetry.warnings_once import warn_once
from kernel_cache.trust.signing import Signer

PREFIX = "kernel_cache/v1/"
LEASE_SECONDS = 10.0  # a lease's lifetime; its holder pushes the deadline forward every third of it
CALL_SECONDS = 2.0  # the deadline of one call carrying no entry (a lease, a marker)
ENTRY_SECONDS = 6.0  # the deadline of one call carrying an entry (up to MAX_VALUE_BYTES)
MAX_VALUE_BYTES = 64 << 20  # the largest value put in the job's store (the coordinator's tested size)
MAX_POLL = 0.25  # the longest a waiter sleeps between two looks (from 20 ms, doubling, jittered)
MAX_GENERATIONS = 64  # leases on one key taken over from dead holders before the level gives up on it
_FAILED = object()
T = TypeVar("T")


class JobClient(Protocol):
    """The job's key-value store as the level uses it: faults are raised; absence and refusal of a
    create are answers."""

    def get(self, name: str) -> bytes | None: ...

    def create(self, name: str, value: bytes) -> bool:
        """Put `value` at `name` unless something is there (atomically): whether it was put."""

    def overwrite(self, name: str, value: bytes) -> None: ...

    def delete(self, name: str) -> None:
        """Remove `name`; nothing there is no error."""


class JobLevel:
    name = "job"

    def __init__(self, client: JobClient, process: int, processes: int, *, signer: Signer | None = None,
                 max_bytes: int = 256 << 20, max_entry_bytes: int = MAX_VALUE_BYTES, lease_max_seconds: float = 600.0):
        """`max_bytes`: what this process may put in all; `lease_max_seconds`: the longest a lease is kept alive."""
        self.client = client
        self.process, self.processes = process, processes
        self.signer = signer
        self.max_bytes = max_bytes
        self.max_entry_bytes = min(max_entry_bytes, MAX_VALUE_BYTES)
        self.lease_max_seconds = lease_max_seconds
        self.lease_seconds, self.call_seconds, self.entry_seconds = LEASE_SECONDS, CALL_SECONDS, ENTRY_SECONDS
        self.put_bytes = 0  # what this process has put
        self.skipped: str | None = None  # why the level is skipped for the rest of the process
        self.full = False  # `max_bytes` reached
        self.counters = {"hits": 0, "misses": 0, "writes": 0, "lock_waits": 0, "takeovers": 0}
        self._lock = threading.Lock()

    @property
    def location(self) -> str:
        return f"this job's key-value store (process {self.process} of {self.processes})"

    @property
    def mode(self) -> str:
        if self.skipped is not None:
            return f"skipped ({self.skipped})"
        return "read-only (bound reached)" if self.full else "read-write"

    @property
    def writable(self) -> bool:
        return self.skipped is None and not self.full

    # Data path -----------------------------------------------------------------------------
    def get(self, key: str) -> Entry | None:
        name = PREFIX + "e/" + check_key(key)
        data = self._call("read an entry", self.entry_seconds, self.client.get, name)
        if data is None or data is _FAILED:
            self._count("misses")
            return None
        assert isinstance(data, bytes)
        if self.signer is not None:
            problem = self.signer.problem(data)
            if problem is not None:
                raise RejectedEntry(f"job entry {key[:12]} is {problem}")
        try:
            entry = entry_format.decode(data, expected_key=key)
        except CorruptEntry:
            self._call("delete an entry", self.call_seconds, self._forget, key)
            raise
        self._count("hits")
        return entry

    def keep(self, entry: Entry, data: bytes) -> None:
        self.put_raw(entry.key, data)

    def put_raw(self, key: str, data: bytes) -> None:
        entry_format.decode(data, expected_key=check_key(key))  # a bad entry must not reach the job
        if not self.writable or len(data) > self.max_entry_bytes:
            return
        with self._lock:
            if self.put_bytes + len(data) > self.max_bytes:
                self.full = True
        if self.full:
            warn_once("job-level-bound",
                      f"this process has put {self.put_bytes / (1 << 20):.1f} MiB of kernels into the job's "
                      f"key-value store, its bound (KERNEL_CACHE_JOB_MAX_BYTES={self.max_bytes / (1 << 20):.0f}M): "
                      f"what it compiles from now on is not shared with the job's other processes. Raise "
                      f"KERNEL_CACHE_JOB_MAX_BYTES if the coordinator has the memory")
            return
        created = self._call("publish an entry", self.entry_seconds + len(data) / (16 << 20), self.client.create,
                             PREFIX + "e/" + key, data)
        if created is _FAILED:
            return
        if created:
            with self._lock:
                self.put_bytes += len(data)
            self._count("writes")
        self._call("publish an entry", self.call_seconds, self.client.create, PREFIX + "p/" + key, b"1")

    def __contains__(self, key: object) -> bool:
        try:
            name = PREFIX + "p/" + check_key(key)
        except (TypeError, ValueError):
            return False
        found = self._call("read a marker", self.call_seconds, self.client.get, name)
        return isinstance(found, bytes)

    @contextlib.contextmanager
    def lock(self, key: str, timeout: float) -> Iterator[bool | None]:
        """A lease on `key` across the job's processes, kept alive for at most `lease_max_seconds`
        (True, False, None: as `Level.lock`)."""
        check_key(key)
        lease = self._acquire(key, timeout)
        if not isinstance(lease, _Held):
            yield lease
            return
        stop = threading.Event()
        beat = threading.Thread(target=self._heartbeat, args=(lease, stop), daemon=True, name="kernel-cache-job-lease")
        beat.start()
        try:
            yield True
        finally:
            stop.set()
            beat.join(timeout=self.call_seconds + 1)
            self._call("release a lease", self.call_seconds, self.client.delete, lease.name)

    def close(self) -> None:
        pass  # the job's store lives as long as the job; a held lease is released by its `lock`

    # Leases --------------------------------------------------------------------------------
    def _acquire(self, key: str, timeout: float) -> _Held | bool | None:
        if self.skipped is not None:
            return None
        deadline, pause, generation, waited = time.monotonic() + timeout, 0.02, 0, False
        seen: tuple[bytes, float] | None = None  # the lease value last seen, and since when (monotonic)
        while generation < MAX_GENERATIONS:
            name = f"{PREFIX}l/{key}/{generation}"
            value = self._lease_value(f"{self.process}-{secrets.token_hex(4)}".encode())
            taken = self._call("take a lease", self.call_seconds, self.client.create, name, value)
            if taken is _FAILED:
                return None
            if taken:
                if waited:
                    self._count("takeovers")
                return _Held(name, value)
            while True:  # someone holds lease `generation`: wait for the entry or the lease's end
                if key in self:
                    return False
                found = self._call("read a lease", self.call_seconds, self.client.get, name)
                if found is _FAILED:
                    return None
                if found is None:
                    break  # released without publishing: try to take it
                assert isinstance(found, bytes)
                now = time.monotonic()
                if seen is None or seen[0] != found:
                    seen = (found, now)
                if _lapsed(found, now - seen[1], self.lease_seconds):
                    generation, seen = generation + 1, None  # a dead holder's: the next lease, for one taker
                    break
                if now >= deadline:
                    return False
                if not waited:
                    waited = True
                    self._count("lock_waits")
                time.sleep(min(pause * (0.5 + random.random()), max(0.0, deadline - now)))
                pause = min(pause * 2, MAX_POLL)
        return None

    def _lease_value(self, holder: bytes) -> bytes:
        return b"kcj1:" + holder + b":" + str(int((time.time() + self.lease_seconds) * 1000)).encode()

    def _heartbeat(self, lease: _Held, stop: threading.Event) -> None:
        holder = lease.value.split(b":")[1]
        while not stop.wait(self.lease_seconds / 3):
            if time.monotonic() - lease.taken > self.lease_max_seconds:
                return  # past its maximum lifetime: let it lapse, whatever the compile is doing
            value = self._lease_value(holder)
            if self._call("keep a lease", self.call_seconds, self.client.overwrite, lease.name, value) is _FAILED:
                return

    # Calls ---------------------------------------------------------------------------------
    def _call(self, what: str, seconds: float, op: Callable[..., T], *args: object) -> T | object:
        """op(*args) within `seconds`, or _FAILED (the level is then skipped)."""
        if self.skipped is not None:
            return _FAILED
        try:
            return _within(lambda: op(*args), seconds)
        except TimeoutError:
            self._skip(f"it did not answer within {seconds:.1f} s when asked to {what}")
        except Exception as exc:
            self._skip(f"it refused to {what} ({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})")
        return _FAILED

    def _skip(self, why: str) -> None:
        with self._lock:
            if self.skipped is not None:
                return
            self.skipped = "coordinator failing"
        warn_once("job-level-skipped",
                  f"the job's key-value store (jax.distributed's coordinator) failed: {why}. This process no "
                  f"longer shares kernels with the job's other processes and compiles what it misses itself. "
                  f"Check the coordinator process (the job's process 0: its load, its network) or set "
                  f"KERNEL_CACHE_JOB=0 to leave the job's store out")

    def _forget(self, key: str) -> None:
        self.client.delete(PREFIX + "p/" + key)
        self.client.delete(PREFIX + "e/" + key)

    def _count(self, name: str) -> None:
        with self._lock:
            self.counters[name] += 1


class _Held:
    __slots__ = ("name", "taken", "value")

    def __init__(self, name: str, value: bytes) -> None:
        self.name, self.value, self.taken = name, value, time.monotonic()


def _lapsed(value: bytes, unchanged_for: float, lease_seconds: float) -> bool:
    """Whether the lease `value` belongs to a dead holder: past its deadline, unchanged for more than
    a lifetime by this process's clock (the holder's may run ahead), or not a lease at all."""
    parts = value.split(b":")
    if len(parts) != 3 or parts[0] != b"kcj1" or not parts[2].isdigit():
        return True
    return int(parts[2]) < time.time() * 1000 or unchanged_for > lease_seconds


def _within(op: Callable[[], T], seconds: float) -> T:
    """op() on a daemon thread, waited for until `seconds` (then TimeoutError): a hung coordinator holds
    that thread (and the level is skipped from then on), never the caller nor the interpreter's exit."""
    outcome: Future[T] = Future()

    def task() -> None:
        try:
            outcome.set_result(op())
        except BaseException as exc:  # handed to the caller, whatever it is
            outcome.set_exception(exc)
    threading.Thread(target=task, daemon=True, name="kernel-cache-job-call").start()
    return outcome.result(timeout=seconds)
