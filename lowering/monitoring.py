"""kernel-cache's counters as `jax.monitoring` events (`/kernel_cache/hits`, ... with a `level`
keyword: docs/cachectl.md lists them): a JAX job's listeners see the kernel cache as they see JAX's
own compilation cache. Installed when `lowering` is imported (a recorder: nothing runs until an
event); a JAX listener that raises never fails a lowering (kernel_cache.telemetry.events).
"""

from __future__ import annotations

from jax import monitoring

from kernel_cache.telemetry import events

RECORDER = (monitoring.record_event, monitoring.record_event_duration_secs)
events.add_recorder(*RECORDER)
