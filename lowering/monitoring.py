"""kernel-cache's counters as `jax.monitoring` events: a JAX job's listeners
(`jax.monitoring.register_event_listener`, `register_event_duration_secs_listener`) see the kernel
cache as they see JAX's own compilation cache ('/jax/compilation_cache/cache_hits', ...).

Installed when `lowering` is imported (registering a recorder: nothing runs until an event). Every
event the store counts for `cachectl stats` (kernel_cache.telemetry.events) is recorded, by jax.monitoring's
own functions called straight from the counters, as:

    /kernel_cache/hits                     event,    level=memory|disk|shared|remote  (one per kernel served)
    /kernel_cache/record_hits              event,    level=...  (a lowered-call record served a whole call)
    /kernel_cache/compile_time_saved_sec   duration, level=...  (the compile seconds that hit saved)
    /kernel_cache/misses                   event
    /kernel_cache/compiles                 event
    /kernel_cache/compile_time_sec         duration  (seconds that compile took)
    /kernel_cache/rejected                 event,    level=shared|remote  (an entry refused for who wrote it)
    /kernel_cache/errors                   event     (a corrupt entry, a failed level read or write)

`level` is a keyword argument of the listener call (jax.monitoring passes `**kwargs` to listeners on
every supported JAX); each event always passes the same keywords. A JAX listener that raises is
caught by kernel_cache.telemetry.events: it never fails a lowering.
"""

from __future__ import annotations

from jax import monitoring

from kernel_cache.telemetry import events

HITS, MISSES, COMPILES = (events.EVENT_NAMES[k] for k in (events.HIT, events.MISS, events.COMPILE))
REJECTED, ERRORS = events.EVENT_NAMES[events.REJECTED], events.EVENT_NAMES[events.ERROR]
COMPILE_TIME, COMPILE_TIME_SAVED = events.DURATION_NAMES[events.COMPILE], events.DURATION_NAMES[events.HIT]
EVENT_NAMES = (HITS, MISSES, COMPILES, REJECTED, ERRORS)
DURATION_NAMES = (COMPILE_TIME_SAVED, COMPILE_TIME)
RECORDER = (monitoring.record_event, monitoring.record_event_duration_secs)


def install() -> None:
    """Record kernel-cache's events with jax.monitoring (idempotent)."""
    events.add_recorder(*RECORDER)


def uninstall() -> None:
    events.remove_recorder(*RECORDER)


install()
