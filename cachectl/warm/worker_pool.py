"""The worker processes both prewarm sources share, and how an interrupt stops them.

This module is long because stopping is its point, and every path of it is here: a prewarm runs for
minutes and gets Ctrl-C (the whole process group), a scheduler's SIGINT or a SIGTERM (the parent
alone). `run_in_pool` runs plain worker processes, one pipe and one task at a time each, so the
parent knows every process and every wait is bounded. Workers ignore SIGINT (and sit in their own
process group, away from a terminal's Ctrl-C) and leave on SIGTERM; while `interrupts_stop_work`
holds, the parent turns SIGINT into KeyboardInterrupt and SIGTERM into `Terminated` (a
KeyboardInterrupt) so both run one path: no more work is handed out, every worker gets SIGTERM and
is killed CANCEL_GRACE later if still there, and what the workers finished is read. The parent
stops on SIGINT however it was started: a script's `cachectl prewarm &` starts it ignoring SIGINT.
In both processes a signal that arrives while an entry is being written (`Store._level_put`) waits
for the write, WRITE_GRACE at most, so an interrupt leaves whole entries and no half-written file;
one that arrives while JAX or a program is imported (`signals_held`) waits for the import's end: one
raised inside jaxlib's extension set-up aborts the process (nanobind, exit 134).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from multiprocessing.connection import wait as wait_ready
from multiprocessing.context import BaseContext
from types import FrameType
from typing import Any

from cachectl.warm.progress import Outcome, Report
from kernel_cache.store import Store

CANCEL_GRACE = 0.5  # seconds a worker has to leave after SIGTERM before it is killed
WRITE_GRACE = 1.0  # longest a signal waits for the entry write it arrived in
_POLL = 0.5  # how often a waiting worker checks that its parent is alive, and the parent its workers
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """SIGTERM while a prewarm runs: the Ctrl-C path runs, and cachectl exits with 143."""

    exit_code = 128 + signal.SIGTERM


class _Cancelled(BaseException):
    """In a worker, the parent's SIGTERM. Not an Exception: a build's `except Exception` lets it pass."""


def pool_context() -> BaseContext:
    """fork is cheapest (Triton already imported), but not once JAX has started its threads."""
    if sys.platform.startswith("linux") and "jax" not in sys.modules:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


# Signals -----------------------------------------------------------------------------------
_held: Callable[[], BaseException] | None = None  # the interrupt waiting for an entry write (or a held block) to end
_held_since = 0.0
_holding = 0  # `signals_held` blocks running: an interrupt waits for the outermost one's end
_collecting = False  # a garbage collection (and its callbacks) is running


def _collection_starts(phase: str, info: dict[str, int]) -> None:  # first of gc.callbacks
    global _collecting
    if phase == "start":
        _collecting = True


def _collection_ends(phase: str, info: dict[str, int]) -> None:  # last of gc.callbacks
    global _collecting
    if phase == "stop":
        _collecting = False


def _writing(frame: FrameType | None) -> bool:
    """Whether an exception raised at `frame` must wait: the code is writing an entry (every level write
    goes through Store._level_put), or it runs inside a garbage-collector callback or a finalizer, where
    Python prints a raised exception and drops it (JAX registers a gc callback: a SIGTERM landing there
    was lost, and the prewarm went on to the end and exited 0)."""
    if _collecting:  # the Python frames of a gc callback are not always on the stack (Python 3.13)
        return True
    code = Store._level_put.__code__
    callbacks = {getattr(callback, "__code__", None) for callback in gc.callbacks}
    while frame is not None:
        if frame.f_code is code or frame.f_code in callbacks or frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _raising(make: Callable[[], BaseException]) -> Callable[[int, FrameType | None], None]:
    """A signal handler raising make(), or, inside an entry write, once the write is over."""
    def handle(signum: int, frame: FrameType | None) -> None:
        global _held, _held_since
        if _holding or _writing(frame):
            if _held is None:
                _held, _held_since = make, time.monotonic()
            if not _holding:  # a held block raises it at its end
                signal.setitimer(signal.ITIMER_REAL, 0.005)  # look again soon (_release)
            return
        raise make()
    return handle


def _release(signum: int, frame: FrameType | None) -> None:
    """SIGALRM: raise the held interrupt once the write is over (or WRITE_GRACE has passed)."""
    global _held
    if _held is None or _holding:
        return
    if _writing(frame) and time.monotonic() - _held_since < WRITE_GRACE:
        signal.setitimer(signal.ITIMER_REAL, 0.005)
        return
    make, _held = _held, None
    raise make()


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait for the end of this block, then stop the work as they would have: for
    an import of JAX (or of a program, which imports it), where one raised inside jaxlib's extension
    set-up aborts the process with a nanobind error (exit 134) instead of stopping it. Under our
    handlers (`interrupts_stop_work`, a worker's) the handler keeps it, whichever thread took it;
    under Python's own, this thread blocks it meanwhile."""
    global _holding, _held
    _holding += 1
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        yield
    finally:
        _holding -= 1
        held = None
        if not _holding:
            held, _held = _held, None
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # one this thread blocked is taken here
        if held is not None:
            raise held()


@contextlib.contextmanager
def interrupts_stop_work() -> Iterator[None]:
    """While a prewarm runs: SIGINT raises KeyboardInterrupt and SIGTERM `Terminated` (both after an
    entry write in progress), so one path stops the workers; SIGINT even where this process was
    started ignoring it (a script's `cachectl prewarm &`: a prewarm must stop on SIGINT however it was
    started). Outside the main thread nothing changes."""
    global _held
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in (*_SIGNALS, signal.SIGALRM)}
    for sig, make in ((signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated)):
        signal.signal(sig, _raising(make))
    signal.signal(signal.SIGALRM, _release)
    gc.callbacks.insert(0, _collection_starts)  # around every other callback: see _writing
    gc.callbacks.append(_collection_ends)
    try:
        yield
    finally:
        for callback in (_collection_starts, _collection_ends):
            with contextlib.suppress(ValueError):
                gc.callbacks.remove(callback)
        held, _held = _held, None
        if held is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    if held is not None:  # it came during the last write: the work is done, the interrupt still counts
        raise held()


@contextlib.contextmanager
def _signals_blocked() -> Iterator[None]:
    """SIGINT and SIGTERM held (not lost) meanwhile: a process started now inherits the block and
    installs its own handlers before it takes any; cleanup is not cut short."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


# Workers ------------------------------------------------------------------------------------
def _die_with_parent() -> None:
    """Linux: SIGTERM when the parent dies (killed with -9, say), not an orphan building on."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            ctypes.CDLL(None).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


def _worker_main(conn: Any, fn: Callable[..., Any], initializer: Callable[..., None] | None,
                 initargs: tuple[object, ...], parent: int) -> None:
    """A worker: run fn(*args) per task it is sent and send back what it gives, item by item."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, _raising(_Cancelled))
        signal.signal(signal.SIGALRM, _release)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
        _die_with_parent()
        with contextlib.suppress(OSError):
            # Own process group: a Ctrl-C at the terminal reaches the parent only, not the compiler
            # tools a build runs (ptxas killed by it makes Triton dump its input on stdout).
            os.setpgid(0, 0)
        os.dup2(2, 1)  # what a compiler prints goes to stderr: stdout is the parent's (--json)
        broken = ""
        if initializer is not None:
            try:
                initializer(*initargs)
            except Exception as exc:  # said for each task, as the task's failure
                broken = f"worker set-up failed: {type(exc).__name__}: {exc}".splitlines()[0]
        while True:
            while not conn.poll(_POLL):
                if os.getppid() != parent:
                    return  # the parent is gone: nobody reads what we would build
            task = conn.recv()
            if task is None:
                return
            index, args = task
            if broken:
                conn.send(("error", index, broken))
                continue
            try:
                result = fn(*args)
                for item in (result if isinstance(result, Iterator) else [result]):
                    conn.send(("item", index, item))
            except Exception as exc:
                conn.send(("error", index, f"{type(exc).__name__}: {exc}".splitlines()[0]))
                continue
            conn.send(("done", index, None))
    except _Cancelled:
        os._exit(128 + signal.SIGTERM)  # what was cleaned up on the way out is all there is to do
    except (EOFError, OSError):
        return  # the parent closed our pipe


class _Worker:
    """One worker process and the parent's end of its pipe. Start it with signals blocked and keep
    it where `_stop` finds it before they are let through: an interrupt never leaves one behind."""

    def __init__(self, context: Any, fn: Callable[..., Any], initializer: Callable[..., None] | None,
                 initargs: tuple[object, ...]):
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_worker_main, name="cachectl-prewarm",
                                       args=(child, fn, initializer, initargs, os.getpid()))
        self.process.start()
        child.close()
        self.task: int | None = None
        self.gone = False  # its end of the pipe is closed: it exited or died

    def send(self, index: int, args: tuple[object, ...]) -> bool:
        try:
            self.conn.send((index, args))
        except OSError:
            return False
        self.task = index
        return True

    def messages(self) -> Iterator[tuple[str, int, Any]]:
        """What the worker has sent so far, without waiting for more."""
        try:
            while not self.gone and self.conn.poll(0):
                yield self.conn.recv()
        except (EOFError, OSError):  # the worker died (sending): recv reads a whole length-prefixed message
            self.gone = True       # before decoding it, so a cut-off one is an OSError, never a decode error


def run_in_pool(fn: Callable[..., Any], tasks: list[tuple[object, ...]], labels: list[str], jobs: int, report: Report,
                context: Any, initializer: Callable[..., None] | None = None, initargs: tuple[object, ...] = ()) -> None:
    """Run fn(*task) per task (task[1] is the arch) in up to `jobs` worker processes; report each
    item as it arrives. fn returns an Outcome or yields events. On any exception (an interrupt) the
    workers are stopped within about CANCEL_GRACE, what they finished is reported, and it is raised."""
    workers: list[_Worker] = []
    pending = deque(range(len(tasks)))

    def failed(index: int, error: str) -> None:
        report(Outcome(labels[index], str(tasks[index][1]), "failed", error=error))

    cancelled = True
    try:
        with _signals_blocked():
            for _ in range(min(jobs, len(tasks))):
                workers.append(_Worker(context, fn, initializer, initargs))
        while True:
            for i, w in enumerate(workers):
                while w.task is None and pending:
                    index = pending.popleft()
                    if not w.send(index, tasks[index]):
                        failed(index, "the worker process died (crash or out of memory)")
                        with _signals_blocked():
                            w = workers[i] = _replace(w, context, fn, initializer, initargs)
            busy = [w for w in workers if w.task is not None]
            if not busy:
                break
            wait_ready([w.conn for w in busy] + [w.process.sentinel for w in busy], _POLL)
            for i, w in enumerate(workers):
                if _drain(w, report, failed) and pending:
                    with _signals_blocked():
                        workers[i] = _replace(w, context, fn, initializer, initargs)
        cancelled = False
    finally:
        _stop(workers, cancelled, report)


def _drain(w: _Worker, report: Report, failed: Callable[[int, str], None]) -> bool:
    """Report what worker `w` sent; whether it died with a task (then failed, and `w` needs replacing)."""
    for kind, index, item in w.messages():
        if kind == "item":
            for event in (item if isinstance(item, list) else [item]):
                report(event)
        elif kind == "error":
            failed(index, item)
        if kind in ("done", "error"):
            w.task = None
    if w.task is not None and (w.gone or not w.process.is_alive() and not w.conn.poll(0)):
        failed(w.task, "the worker process died (crash or out of memory)")
        w.task = None
        return True
    return False


def _replace(worker: _Worker, context: Any, fn: Callable[..., Any], initializer: Callable[..., None] | None,
             initargs: tuple[object, ...]) -> _Worker:
    """A new worker for one that died, the dead one reaped. Call it with signals blocked, and put
    the new worker in the dead one's place before they are let through."""
    worker.process.kill()
    worker.process.join(CANCEL_GRACE)
    worker.conn.close()
    return _Worker(context, fn, initializer, initargs)


def _stop(workers: list[_Worker], cancelled: bool, report: Report) -> None:
    """Finished: ask each worker to leave. Cancelled: SIGTERM, SIGKILL CANCEL_GRACE later, then
    report what they finished meanwhile (builds that landed, not failures the interrupt caused).
    Every wait is bounded; signals arriving meanwhile are held until the workers are gone."""
    with _signals_blocked():
        if not cancelled:
            for w in workers:
                with contextlib.suppress(OSError):
                    w.conn.send(None)
        else:
            for w in workers:
                if w.process.is_alive():
                    w.process.terminate()
        deadline = time.monotonic() + (CANCEL_GRACE if cancelled else 5.0)
        for w in workers:
            w.process.join(max(0.0, deadline - time.monotonic()))
        for w in workers:
            if w.process.is_alive():
                w.process.kill()
                w.process.join(1.0)
        for w in workers:
            if cancelled and w.process.exitcode is not None:  # else reading might wait on a live writer
                for kind, _, item in w.messages():
                    for event in (item if isinstance(item, list) else [item]) if kind == "item" else []:
                        if not (isinstance(event, Outcome) and event.status == "failed"):
                            report(event)
            w.conn.close()
            if w.process.exitcode is not None:
                w.process.close()
