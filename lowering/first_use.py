"""The session at first use: importing `lowering` opens no store, creates no directory, starts no
thread and changes no JAX setting. The first Triton call bound or lowered under a session (the one
`kernel_cache.current_session()` gives, created from the environment, or a later `configure()`'s)
opens its store and then, once per session:
  - KERNEL_CACHE_XLA=1: JAX's persistent compilation cache is pointed at the store's `xla/`
    (`lowering.xla_cache`); where JAX already decided it had no cache, it decides again;
  - where compiles run at once, the toolchain fingerprint starts computing in the background, so
    a cold process's first lowering does not wait for it (`compiler.toolchain`).
"""

from __future__ import annotations

import kernel_cache
from compiler.toolchain import prime_in_background

from . import xla_cache

STARTED = "lowering.first_use"  # session memo: present once what first use does has been done


def session() -> kernel_cache.Session:
    """The process's session, its first use by a Triton call seen to (a dictionary hit afterwards;
    the lowering rule makes the same check inline)."""
    current = kernel_cache.current_session()
    if STARTED not in current.memos:
        start(current)
    return current


def start(current: kernel_cache.Session) -> None:
    """The set-up importing leaves to the first call, once per session."""
    current.memo(STARTED, lambda: _start(current))


def _start(current: kernel_cache.Session) -> bool:
    xla_cache.apply(current.store)
    if current.config.compile_threads > 1:  # compile_pool.workers(), without importing the pool in a warm process
        prime_in_background()
    return True
