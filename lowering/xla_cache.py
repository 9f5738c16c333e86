"""XLA executables beside the kernels: with KERNEL_CACHE_XLA=1 (and KERNEL_CACHE_DIR), JAX's own
persistent compilation cache is pointed at `<KERNEL_CACHE_DIR>/xla` with thresholds that keep
small programs too, so a warm process skips XLA compilation as well as Triton's.

JAX runs what it finds there as code, unchecked, so the directory is handed over only when it
passes `kernel_cache.trust.xla_trust` (the store accepted the cache directory; it and `xla/` are yours
alone; nobody else can swap them); otherwise JAX's cache stays off for kernel-cache's part, with one
warning naming why. A directory the user gave JAX (`jax_compilation_cache_dir`) is the user's
choice and left alone.

Applied when a session's store opens, at its first Triton call (`lowering.first_use`), never at
import; a program that configures kernel-cache itself gets it at the first call after `configure()`.
Where JAX already decided it has no persistent cache (it compiled something first), it is asked to
decide again, so the program's compiles from then on (those holding Triton calls included) use it.
The executables are specific to the GPU model and driver of the node that built them: keep them
node-local, never in the shared level.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax

import kernel_cache
from kernel_cache.telemetry.warnings_once import warn_once
from kernel_cache.trust.xla_trust import XlaDirRefused, private_xla_dir

from . import jax_compat


def apply(store: kernel_cache.Store | None = None) -> Path | None:
    """Point JAX's persistent cache at the store's `xla/` when it may be trusted; returns it (None:
    not enabled, JAX already has a directory of the user's, or refused with a warning)."""
    config = store.config if store is not None else kernel_cache.Config.from_env()
    wanted = config.xla_dir
    if wanted is None:
        return None
    current = jax.config.jax_compilation_cache_dir  # type: ignore[attr-defined, unused-ignore]  # jax < 0.12: set at run time (0.12 types it)
    if current and not _same(Path(current), wanted):
        return None  # the user's own setting wins
    try:
        directory = private_xla_dir(store if store is not None else kernel_cache.default_store())
    except (XlaDirRefused, OSError) as exc:
        if current:  # an earlier apply() in this process handed it over: take it back
            jax.config.update("jax_compilation_cache_dir", None)  # type: ignore[no-untyped-call]  # unannotated in jax
        warn_once(f"xla-refused:{wanted}",
                  f"KERNEL_CACHE_XLA=1: JAX's compilation cache is not pointed at {wanted}: {exc}. JAX runs "
                  f"the executables it finds there as code, so kernel-cache hands it only a directory nobody "
                  f"else can write (README: 'Trust model'); XLA compiles as usual")
        return None
    changed = current != str(directory)
    jax.config.update("jax_compilation_cache_dir", str(directory))  # type: ignore[no-untyped-call]  # unannotated in jax
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # type: ignore[no-untyped-call]  # (as above)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)  # type: ignore[no-untyped-call]  # (as above)
    if changed:
        jax_compat.redecide_persistent_cache()
    return directory


def _same(a: Path, b: Path) -> bool:
    return a == b or os.path.realpath(a) == os.path.realpath(b)
