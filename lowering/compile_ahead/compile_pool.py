"""The process's compile workers: KERNEL_CACHE_COMPILE_WORKERS threads that compile kernels while
JAX goes on lowering (`ahead`) or while one autotuned call's configs build (`kernels.fetch`).

Threads, not processes: Triton's MLIR/LLVM passes release the GIL and ptxas is a subprocess, so
threads overlap most of a compile, need no importable kernel and no second `import triton` (see
docs/design.md, "Cold start"; `scripts/measure_compile_parallelism.py` measures it). When the process exits,
work still queued is cancelled and the compiles under way finish (at most one per worker): an exiting
program never waits for kernels nobody will lower. (They are not abandoned as daemon threads would be:
a thread inside Triton's C++ when the interpreter finalizes aborts the process.)
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import kernel_cache

_lock = threading.Lock()
_work: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
_threads: list[threading.Thread] = []
_closing = False


def workers(config: kernel_cache.Config) -> int:
    """How many compiles may run at once under `config` (1: one at a time, in the thread that needs it)."""
    return config.compile_threads


def submit(config: kernel_cache.Config, fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """Run `fn(*args)` on a worker (the pool grows to `config`'s number); the future is cancelled if
    the process exits before it starts."""
    future: Future[Any] = Future()
    with _lock:
        if _closing:
            future.cancel()
            return future
        wanted = workers(config)
        while len(_threads) < wanted:
            thread = threading.Thread(target=_run, name=f"kernel-cache-compile-{len(_threads)}",
                                      daemon=_register_exit is None)
            thread.start()
            _threads.append(thread)
    _work.put((future, lambda: fn(*args)))
    return future


def _run() -> None:
    while True:
        item = _work.get()
        if item is None:
            return
        if _closing:
            item[0].cancel()
            continue
        future, call = item
        if not future.set_running_or_notify_cancel():
            continue
        try:
            future.set_result(call())
        except BaseException as exc:  # handed to whoever waits; a worker never dies of it
            future.set_exception(exc)


def _cancel_queued() -> None:
    """At exit, before Python joins its threads: cancel what has not started, then let each worker go."""
    global _closing
    with _lock:
        _closing = True
        count = len(_threads)
    while True:
        try:
            item = _work.get_nowait()
        except queue.Empty:
            break
        if item is not None:
            item[0].cancel()
    for _ in range(count):
        _work.put(None)


# threading's own exit hook runs before Python joins non-daemon threads (atexit's only after, too late:
# the workers would wait for work forever). Where a Python lacks it, the workers are daemon threads,
# left behind at exit with whatever was queued.
_register_exit = getattr(threading, "_register_atexit", None)
if _register_exit is not None:
    _register_exit(_cancel_queued)
