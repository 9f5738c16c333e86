"""XLA executables beside the kernels: with KERNEL_CACHE_XLA=1 (and KERNEL_CACHE_DIR), JAX's own
persistent compilation cache is pointed at `<KERNEL_CACHE_DIR>/xla` with thresholds that keep
small programs too, so a warm process skips XLA compilation as well as Triton's.

Applied when `lowering` is imported (before the program compiles anything), from the environment
(reading it opens no cache); code that configures kernel-cache itself calls `apply(config)`. A
directory the user already gave JAX
(`jax_compilation_cache_dir`) is left alone. The executables are specific to the GPU model and
driver of the node that built them: keep them node-local, never in the shared tier.
"""

from __future__ import annotations

from pathlib import Path

import jax

import kernel_cache


def apply(config: kernel_cache.Config | None = None) -> Path | None:
    """Point JAX's persistent cache at the configured directory; returns it (None: not enabled, or
    JAX already has a cache directory of the user's)."""
    directory = (config if config is not None else kernel_cache.Config.from_env()).xla_dir
    if directory is None:
        return None
    current = jax.config.jax_compilation_cache_dir
    if current and Path(current) != directory:
        return None  # the user's own setting wins
    if config is None:
        kernel_cache.default_store()  # the kernel cache's own layout first: <dir> is a kernel cache, xla/ inside it
    directory.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return directory
