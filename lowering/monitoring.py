"""kernel-cache's counters as `jax.monitoring` events: a JAX job's listeners see the kernel cache as
they see JAX's own compilation cache. Installed when `lowering` is imported (a recorder: nothing runs
until an event); every event `cachectl stats` counts is recorded by jax.monitoring's own functions as:

    /kernel_cache/hits                     event,    level=memory|disk|shared|remote  (one per kernel served)
    /kernel_cache/record_hits              event,    level=...  (a lowered-call record served a whole call)
    /kernel_cache/compile_time_saved_sec   duration, level=...  (the compile seconds that hit saved)
    /kernel_cache/misses                   event
    /kernel_cache/compiles                 event
    /kernel_cache/compile_time_sec         duration  (seconds that compile took)
    /kernel_cache/rejected                 event,    level=shared|remote  (an entry refused for who wrote it)
    /kernel_cache/errors                   event     (a corrupt entry, a failed level read or write)

`level` is a keyword argument of the listener call (jax.monitoring passes `**kwargs` on every
supported JAX). A JAX listener that raises never fails a lowering (kernel_cache.telemetry.events).
"""

from __future__ import annotations

from jax import monitoring

from kernel_cache.telemetry import events

RECORDER = (monitoring.record_event, monitoring.record_event_duration_secs)
events.add_recorder(*RECORDER)
