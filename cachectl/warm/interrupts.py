"""How an interrupt stops a prewarm: Ctrl-C (the whole process group), a scheduler's SIGINT or a
SIGTERM (this process alone), however it was started (a script's `cachectl prewarm &` starts it
ignoring SIGINT).

While `interrupts_stop_work` holds, SIGINT raises KeyboardInterrupt and SIGTERM `Terminated` (a
KeyboardInterrupt), so both run one path: the prewarm stops its compiles (`compile_processes.cancel`)
and reports what landed. A signal that arrives while an entry is being written (`Store._level_put`)
waits for the write, WRITE_GRACE at most, so an interrupt leaves whole entries and no half-written
file; one that arrives while JAX or a program is imported (`signals_held`) waits for the import's
end: one raised inside jaxlib's extension set-up aborts the process (nanobind, exit 134).
"""

from __future__ import annotations

import contextlib
import gc
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

from kernel_cache.store import Store

WRITE_GRACE = 1.0  # longest a signal waits for the entry write it arrived in
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """SIGTERM while a prewarm runs: the Ctrl-C path runs, and cachectl exits with 143."""

    exit_code = 128 + signal.SIGTERM


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
            if _held is None:  # `_nudge` sends SIGALRM until it is raised (a held block raises it at its end)
                _held, _held_since = make, time.monotonic()
            return
        raise make()
    return handle


def _nudge(stop: threading.Event, main: int) -> None:
    """While an interrupt is held, SIGALRM to the main thread every 5 ms (`_release`). Sent to that
    thread: a process-wide timer's signal may be taken by another thread (compile threads run), and
    the main thread's sleep or wait would run to its end. A thread of its own, started outside any
    handler: a handler that starts one can be interrupted by the very signal it waits for."""
    while not stop.wait(0.005):
        if _held is not None and not _holding:
            signal.pthread_kill(main, signal.SIGALRM)


def _release(signum: int, frame: FrameType | None) -> None:
    """SIGALRM: raise the held interrupt once the write is over (or WRITE_GRACE has passed)."""
    global _held
    if _held is None or _holding:
        return
    if _writing(frame) and time.monotonic() - _held_since < WRITE_GRACE:
        return  # asked again in 5 ms
    make, _held = _held, None
    raise make()


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait for the end of this block (an import of JAX: see above), then stop the
    work as they would have: our handler keeps one, whichever thread took it; under Python's own, this
    thread blocks them meanwhile."""
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
    """While a prewarm runs, SIGINT and SIGTERM raise (see above), even where this process was started
    ignoring SIGINT. Outside the main thread nothing changes."""
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
    stop = threading.Event()
    nudging = threading.Thread(target=_nudge, args=(stop, threading.get_ident()), daemon=True,
                               name="kernel-cache-interrupts")
    nudging.start()
    try:
        yield
    finally:
        stop.set()
        nudging.join()  # no SIGALRM after the handlers are put back
        for callback in (_collection_starts, _collection_ends):
            with contextlib.suppress(ValueError):
                gc.callbacks.remove(callback)
        held, _held = _held, None
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    if held is not None:  # it came during the last write: the work is done, the interrupt still counts
        raise held()
