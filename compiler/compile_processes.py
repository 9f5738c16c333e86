"""The one way compiles run: KERNEL_CACHE_COMPILE_WORKERS threads (`submit`), each compile on an idle
worker process where a pool of them pays, else in the thread.

Threads: Triton's MLIR/LLVM passes release the GIL and ptxas is a subprocess (docs/design.md, "Cold
start"). At exit, queued work is cancelled and compiles under way finish; `cancel` (an interrupted
`cachectl prewarm`) also kills the workers and publishes nothing more.

Workers take Triton's front end (AST to TTIR, which holds the GIL) out of this process: each compiles
a spec sent as its recipe and returns the entry, which must name the parent's own content key. With
no worker ready in time, a kernel a worker cannot import by name, or a worker that failed, the kernel
compiles in the parent (a worker reporting an error stays; one that dies, hangs or lies is killed).

Workers pay only when ready before the first miss (`scripts/bench_cold.py`, 16-core H200: ready in
~0.8 s, a 14-kernel module in 0.43 s against 0.79 s on threads), so they start in a process about to
compile (`start_cold`) or once MIN_KERNELS kernels were handed ahead (`expect`), on hosts of MIN_CORES
usable cores, at most half the cores per node (`take_slot`: ranks starting cold together). A slot is
a lock file held by its worker for its life, so even kill -9 frees it; the host's name keeps a
network filesystem from bounding several nodes as one.

`subprocess`, not `multiprocessing`: a spawned child re-runs `__main__` (a script without a main
guard would start again in every worker), and fork is unsafe beside JAX's threads. The module is
long because the threads, the pool, its workers' pipes and the rule belong together.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kernel_cache import Store, at_exit
from kernel_cache.entries import entry as entries
from kernel_cache.entries.summary import META_COMPILE_SECONDS
from kernel_cache.errors import KernelCacheError
from kernel_cache.levels.cache_marker import LOCKS_DIR
from kernel_cache.settings.config import Config
from kernel_cache.trust.safefs import Owners, Tree, host_tag

from . import cache_or_compile, recipe
from . import compile_worker as wire
from .artifact import Artifact
from .key import KeyMemo
from .spec import KernelSpec
from .target import Target

log = logging.getLogger("kernel_cache.compiler")

MIN_CORES = 8  # below it a pool's start takes the cores the parent's tracing and threads need
MIN_KERNELS = 8  # kernels handed ahead in this process before a pool is started
IDLE_SECONDS = 20.0  # a pool unused this long closes its workers (the next miss may start it again)
READY_TIMEOUT = 60.0  # a worker not ready (Triton imported) by then is killed
WAIT_FOR_BUSY = 1.0  # a kernel's wait for a busy worker before it compiles in the parent
COMPILE_TIMEOUT = 300.0  # a compile not answered by then: the worker is killed, the parent compiles it
STOP_GRACE = 1.0  # a worker told to exit (its pipe closed) is killed after this
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where `compiler` is imported from
NICE = 10  # a worker's niceness: where cores run short (8 importing Triton beside 14 compiles) the parent goes first
_BOOT = (f"import os, sys\ntry:\n    os.nice({NICE})\nexcept OSError:\n    pass\n"  # before Triton's import
         f"sys.path.insert(0, {_ROOT!r})\nfrom compiler.compile_worker import main\nmain()")


def node_slots() -> int:
    """Workers of all this node's processes together (`take_slot`): the rule's share of the cores."""
    return max(1, usable_cores() // 2)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


UNBOUNDED = -1  # `take_slot`'s answer where slots cannot be kept: start the worker without one


def take_slot(memo_dir: Path, capacity: int) -> int | None:
    """A locked descriptor of a free slot among `capacity` (for one worker), None when all are held,
    or UNBOUNDED where the directory cannot hold lock files (each pool's own bound stays)."""
    try:
        with contextlib.closing(Tree(memo_dir, Owners.current(), create=True)) as tree:
            for index in range(capacity):
                with tree.open_lock_file(LOCKS_DIR, "compile-workers", host_tag(), str(index)) as fd:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        continue  # held: by a worker of this process or of a neighbour
                    return os.dup(fd)  # the lock lives on with the duplicate (one open file)
        return None
    except (OSError, KernelCacheError):
        return UNBOUNDED


class _Worker:
    """One worker process and its pipes; `state` (starting, idle, busy, loading: importing a kernel's
    module) changes under the pool's lock."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.proc, self.stdin, self.stdout = proc, proc.stdin, proc.stdout
        self.state = "starting"

    def reply(self, deadline: float) -> tuple[int, bytes]:
        """The worker's next frame by `deadline`; OSError where it died, hung or garbled it."""
        frame = wire.read_frame(self.stdout.fileno(), deadline)
        if frame is None:
            raise wire.FrameError(f"exited (status {self.proc.poll()})")
        return frame

    def ready(self, deadline: float) -> bool:
        """Whether it says READY (its imports done) by `deadline`."""
        try:
            return self.reply(deadline)[0] == wire.READY
        except OSError as exc:
            log.debug("compile worker %d: %s", self.proc.pid, exc)
            return False


def _stop(workers: list[_Worker], grace: float) -> None:
    """Each worker's pipe closed (it exits after answering its frame), killed after `grace` seconds."""
    for worker in workers:
        with contextlib.suppress(OSError):
            worker.stdin.close()
    deadline = time.monotonic() + grace
    for worker in workers:
        try:
            worker.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            worker.proc.kill()
            worker.proc.wait()
        worker.stdout.close()


def portable(spec: KernelSpec) -> dict[str, Any] | None:
    """`spec`'s recipe where a worker rebuilds the very spec from it (checked here, from the kernels
    this process holds by name, and the module importable by name), else None."""
    try:
        made = recipe.to_recipe(spec)
        same = recipe.from_recipe(made, imported_only=True) == spec
    except Exception:  # not a recipe, or a kernel not held here by that name
        return None
    module = sys.modules.get(made["kernel"].partition(":")[0])
    return made if same and getattr(module, "__spec__", None) is not None else None


class Pool:
    """This process's compile workers: started in the background, lent one compile at a time."""

    def __init__(self) -> None:
        self.pid = os.getpid()  # a forked child starts its own pool: the pipes are its parent's
        self.forced: int | None = None  # `override`
        self.expected = 0  # kernels handed ahead in this process (the rule)
        self.counts = {"started": 0, "worker": 0, "parent": 0, "lost": 0, "refused": 0, "loading": 0,
                       "no slot": 0}
        self._changed = threading.Condition()
        self._workers: list[_Worker] = []
        self._starting = 0  # workers being started, not yet in `_workers`
        self._closed = False
        self._last_use = time.monotonic()
        self._reaping = False

    # The rule ------------------------------------------------------------------------------
    def wanted(self, config: Config, kernels: int) -> int:
        """How many workers the pool should have now that a miss hands `kernels` ahead (0: none)."""
        with self._changed:
            self.expected += kernels
            expected, have = self.expected, len(self._workers) + self._starting
        size = self.wanted_cold(config)
        if self.forced is not None or size == 0:
            return size
        if expected < MIN_KERNELS or not have and kernels < 2:
            return 0  # (a pool closed when idle starts again at a miss that hands several kernels ahead)
        return max(have, min(size, expected))

    def wanted_cold(self, config: Config) -> int:
        """How many workers a process about to compile (`start_cold`) should have: the rule's host part
        (0: none; the forced size where one is forced)."""
        if config.memo_dir is None or not sys.executable:
            return 0  # no memo directory to share the installed tools' fingerprint through
        if self.forced is not None:
            return self.forced
        threads, cores = config.compile_threads, usable_cores()
        return 0 if threads <= 1 or cores < MIN_CORES else min(threads, cores // 2)

    # Workers -------------------------------------------------------------------------------
    def grow(self, count: int, config: Config, target: Target | None) -> int:
        """Have `count` workers (returned): the missing ones start on a thread, warmed up for `target`."""
        memo_dir = None if config.memo_dir is None else str(config.memo_dir)
        with self._changed:
            missing = count - len(self._workers) - self._starting
            if self._closed or missing <= 0 or memo_dir is None:
                return count
            self._starting += missing  # counted at once: a second miss starts no more
        at_exit.add("compile workers", _close_at_exit)
        hello = json.dumps({"path": [p for p in sys.path if isinstance(p, str)],
                            "warm": None if target is None else target.name, "memo_dir": memo_dir}).encode()
        slots = memo_dir if self.forced is None else None  # a forced size (tests, benchmarks) is not bounded
        threading.Thread(target=self._start, args=(missing, hello, slots), name="kernel-cache-processes-start",
                         daemon=True).start()
        return count

    def _start(self, count: int, hello: bytes, slots: str | None) -> None:
        """`count` workers, each holding a slot in the memo directory `slots` (None: unbounded)."""
        started: list[_Worker] = []
        for begun in range(count):
            slot = take_slot(Path(slots), node_slots()) if slots is not None else UNBOUNDED
            if slot is None:  # every slot of the node held: the rest would find none either
                with self._changed:
                    self._starting -= count - begun
                    self.counts["no slot"] += 1
                break
            worker = self._spawn(hello, slot)
            if worker is not None:
                started.append(worker)
        deadline = time.monotonic() + READY_TIMEOUT
        for worker in started:
            ready = worker.ready(deadline)
            with self._changed:
                if ready and worker in self._workers:
                    worker.state = "idle"
                    self._last_use = time.monotonic()  # idle from now on: not since the pool was made
                    self._changed.notify_all()
            if not ready:
                self.drop(worker)
        with self._changed:
            if self._reaping or not self._workers:
                return
            self._reaping = True
        self._reap()  # this thread closes the workers once idle

    def _spawn(self, hello: bytes, slot: int) -> _Worker | None:
        """One worker started, greeted and holding `slot` for its life; None if it cannot start."""
        worker: _Worker | None = None
        try:
            proc = subprocess.Popen([sys.executable, "-c", _BOOT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, bufsize=0, close_fds=True, start_new_session=True,
                                    pass_fds=() if slot == UNBOUNDED else (slot,))
            worker = _Worker(proc)
            wire.write_frame(worker.stdin.fileno(), wire.HELLO, hello)
        except OSError as exc:
            log.debug("a compile worker could not start: %s", exc)
        finally:
            if slot != UNBOUNDED:
                os.close(slot)  # the worker's copy holds it now
        with self._changed:
            self._starting -= 1
            if worker is not None and not self._closed:
                self._workers.append(worker)
                self.counts["started"] += 1
                return worker
        if worker is not None:
            _stop([worker], 0.0)
        return None

    def borrow(self) -> _Worker | None:
        """An idle worker, now marked busy, else the first busy one back within WAIT_FOR_BUSY (sooner
        than this process, whose compiles share the GIL with JAX's tracing); None: compile here."""
        deadline = time.monotonic() + WAIT_FOR_BUSY
        with self._changed:
            while True:
                for worker in self._workers:
                    if worker.state == "idle":
                        worker.state = "busy"
                        self._last_use = time.monotonic()
                        return worker
                left = deadline - time.monotonic()
                if self._closed or left <= 0 or not any(w.state == "busy" for w in self._workers):
                    return None
                self._changed.wait(left)

    def _ready_later(self, worker: _Worker) -> None:
        """Lend `worker` again once it says READY (a thread of its own waits), dropped if not in time."""
        with self._changed:
            worker.state = "loading"
            self._changed.notify_all()  # one busy worker fewer: a kernel waiting for one may stop waiting

        def wait() -> None:
            if worker.ready(time.monotonic() + READY_TIMEOUT):
                self.give_back(worker)
            else:
                self.drop(worker)

        threading.Thread(target=wait, name="kernel-cache-processes-load", daemon=True).start()

    def give_back(self, worker: _Worker) -> None:
        with self._changed:
            self._last_use = time.monotonic()
            kept = worker in self._workers and not self._closed
            if kept:
                worker.state = "idle"
                self._changed.notify_all()
        if not kept:
            _stop([worker], STOP_GRACE)

    def drop(self, worker: _Worker) -> None:
        """Out of the pool and killed (dead, hung, or compiling under other inputs than ours)."""
        with self._changed:
            if worker in self._workers:
                self._workers.remove(worker)
            self._changed.notify_all()
        _stop([worker], 0.0)

    def has_workers(self) -> bool:
        with self._changed:
            return bool(self._workers or self._starting) and not self._closed

    def close(self, grace: float) -> None:
        """Every worker told to exit, then killed after `grace` seconds."""
        with self._changed:
            self._closed = True
            workers, self._workers = self._workers, []
            self._changed.notify_all()
        _stop(workers, grace)

    def _reap(self) -> None:
        """Close the workers once none has been lent for IDLE_SECONDS."""
        with self._changed:
            while True:
                if self._closed or not (self._workers or self._starting):
                    self._reaping = False
                    return
                quiet = time.monotonic() - self._last_use
                if quiet >= IDLE_SECONDS and not self._starting and all(w.state == "idle" for w in self._workers):
                    idle, self._workers, self._reaping = self._workers, [], False
                    break
                self._changed.wait(max(0.05, IDLE_SECONDS - quiet))
        log.debug("closing %d idle compile workers", len(idle))
        _stop(idle, STOP_GRACE)

    # A compile -------------------------------------------------------------------------------
    def build(self, spec: KernelSpec, key: str, request: bytes) -> tuple[dict[str, Any], dict[str, bytes], float]:
        """The store's build for `key`: on a worker where one is lent (`borrow`), its entry checked; else
        in this thread (the worker given back, or dropped where it died, hung or sent another key)."""
        worker = self.borrow()
        if worker is not None:
            try:
                wire.write_frame(worker.stdin.fileno(), wire.REQUEST, request)  # a few KiB: the pipe takes it whole
                kind, payload = worker.reply(time.monotonic() + COMPILE_TIMEOUT)
                got = entries.decode(payload, expected_key=key) if kind == wire.ENTRY else None  # checksummed, our key
            except (OSError, entries.CorruptEntry) as exc:  # dead, hung, or other sources or environment than ours
                log.debug("compiling %s in the parent: worker %d: %s", spec.name, worker.proc.pid, exc)
                self._count("lost" if isinstance(exc, OSError) else "refused")
                self.drop(worker)
            else:
                if got is not None:
                    self._count("worker")
                    self.give_back(worker)
                    return got.meta, got.blobs, float(got.meta.get(META_COMPILE_SECONDS, 0.0))
                log.debug("compiling %s in the parent: worker %d says %s", spec.name, worker.proc.pid, payload[:2000])
                if kind == wire.LOADING:  # importing the kernel's module: later kernels are the worker's
                    self._count("loading")
                    self._ready_later(worker)
                else:  # an ERROR: the worker stays
                    self._count("refused")
                    self.give_back(worker)
        self._count("parent")
        return cache_or_compile.build_here(spec, key)

    def _count(self, what: str) -> None:
        with self._changed:
            self.counts[what] += 1


_lock = threading.Lock()
_pool: Pool | None = None


def _mine() -> Pool | None:
    """This process's pool where it has one (a forked child's is not its parent's)."""
    pool = _pool
    return pool if pool is not None and pool.pid == os.getpid() else None


def _current() -> Pool:
    """This process's pool (made at its first use; a forked child gets its own)."""
    global _pool
    with _lock:
        pool = _mine()
        if pool is None:
            pool = _pool = Pool()
        return pool


def expect(config: Config, kernels: int, target: Target | None = None) -> int:
    """A miss hands `kernels` compiles ahead: start the pool the rule says pays (warmed up for
    `target`, in the background). Returns the size wanted (0: none)."""
    pool = _current()
    return pool.grow(pool.wanted(config, kernels), config, target)


def start_cold(config: Config, target: Target | None = None) -> int:
    """A process about to compile (no toolchain fingerprint memo: a new node or Triton): start the
    workers now, to be ready by the first miss once JAX has traced the jit. Returns the size wanted."""
    pool = _current()
    return pool.grow(pool.wanted_cold(config), config, target)


def get_or_compile(spec: KernelSpec, store: Store, *, keys: KeyMemo | None = None,
                   known_missing: bool = False) -> tuple[Artifact, str]:
    """`compiler.get_or_compile`, on a worker process where the pool has one and it can rebuild `spec`."""
    pool = _mine()
    memo_dir = store.config.memo_dir
    made = portable(spec) if pool is not None and pool.has_workers() and memo_dir is not None else None
    if pool is None or made is None:
        return cache_or_compile.get_or_compile(spec, store, keys=keys, known_missing=known_missing)
    request = json.dumps({"recipe": made, "memo_dir": str(memo_dir)}).encode()
    return cache_or_compile.get_or_compile(spec, store, keys=keys, known_missing=known_missing,
                                           build_on=lambda spec, key: pool.build(spec, key, request))


def override(workers: int | None) -> None:
    """The pool's size whatever the rule says (0: never a pool; None: the rule again)."""
    _current().forced = workers


def workers() -> list[tuple[int, str]]:
    """(pid, state) of each worker started and not yet closed."""
    pool = _mine()
    if pool is None:
        return []
    with pool._changed:
        return [(w.proc.pid, w.state) for w in pool._workers]


def counts() -> dict[str, int]:
    """What the pool did: workers started; kernels on a worker or the parent; workers lost; replies
    refused; kernels handed back while a worker imported their module; starts with no node slot."""
    pool = _mine()
    return {} if pool is None else dict(pool.counts)


def shutdown() -> None:
    """Kill every worker and reap it; a later `expect` starts a new pool."""
    global _pool
    with _lock:
        pool, _pool = _mine(), None
    if pool is not None:
        pool.close(0.0)


def cancel(grace: float = 0.0) -> None:
    """Compile nothing more: queued work cancelled, workers killed, a compile under way unpublished.
    `grace`: wait that long for those ends, so what they print still goes where the caller sends it."""
    cache_or_compile.stopped.set()
    _cancel_queued()
    shutdown()
    threads = _threads
    if threads is not None and grace > 0:
        deadline = time.monotonic() + grace
        for thread in list(threads._threads):  # the executor's own: they end once nothing is queued
            thread.join(max(0.0, deadline - time.monotonic()))


def _close_at_exit() -> None:
    """At exit, after the compile threads: kill every worker, leaving the pool closed so none starts."""
    pool = _mine()
    if pool is not None:
        pool.close(0.0)


# The compile threads -------------------------------------------------------------------------
_threads: ThreadPoolExecutor | None = None


def submit(config: Config, fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """Run `fn(*args)` on a compile thread; cancelled if the process exits before it starts."""
    global _threads
    with _lock:
        if _threads is None:
            _threads = ThreadPoolExecutor(config.compile_threads, thread_name_prefix="kernel-cache-compile-")
            # after concurrent.futures' own exit hook, so run before it (they run in reverse): what
            # is queued is cancelled before it joins the threads
            threading._register_atexit(_cancel_queued)  # type: ignore[attr-defined]
        _threads._max_workers = max(_threads._max_workers, config.compile_threads)  # grows, as a config asks
        return _threads.submit(fn, *args)


def _cancel_queued() -> None:
    """Before Python joins its threads: what has not started is cancelled."""
    if _threads is not None:
        _threads.shutdown(wait=False, cancel_futures=True)

