"""A multi-process JAX job's key-value store as a level of the session's store: where
`jax.distributed` is initialized with more than one process (and KERNEL_CACHE_JOB is not 0), the
job compiles each kernel once (`kernel_cache.levels.job`). Joined at the session's first use: a job
must call `jax.distributed.initialize()` before its first Triton call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernel_cache.lazy import later
from kernel_cache.store import Store

from . import jax_compat

if TYPE_CHECKING:
    from kernel_cache.levels import job as job_level
else:
    job_level = later("kernel_cache.levels.job")  # only in a process of a multi-process job


def join(store: Store) -> bool:
    """Add the job's key-value store to `store` where this process is one of a job's; whether it did."""
    config = store.config
    if config.disabled or not config.job:
        return False
    found = jax_compat.job_store()
    if found is None:
        return False
    client, process, processes = found
    store.add_transient(job_level.JobLevel(
        client, process, processes, signer=store.signer, max_bytes=config.job_max_bytes,
        max_entry_bytes=config.max_entry_bytes, lease_max_seconds=config.lock_timeout))
    return True
