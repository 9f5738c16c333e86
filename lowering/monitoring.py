"""kernel-cache's counters as `jax.monitoring` events: a JAX job's listeners
(`jax.monitoring.register_event_listener`, `register_event_duration_secs_listener`) see the kernel
cache as they see JAX's own compilation cache ('/jax/compilation_cache/cache_hits', ...).

Installed when `lowering` is imported. Every event the store counts for `cachectl stats`
(kernel_cache.events) is recorded as:

    /kernel_cache/hits                     event,    tier=memory|disk|shared|remote  (one per kernel served)
    /kernel_cache/compile_time_saved_sec   duration, tier=...  (the compile seconds that hit saved)
    /kernel_cache/misses                   event
    /kernel_cache/compiles                 event
    /kernel_cache/compile_time_sec         duration  (seconds that compile took)
    /kernel_cache/rejected                 event,    tier=shared|remote  (an entry refused for who wrote it)
    /kernel_cache/errors                   event     (a corrupt entry, a failed tier read or write)

`tier` is a keyword argument of the listener call (jax.monitoring passes `**kwargs` to listeners on
every supported JAX); each event always passes the same keywords. A JAX listener that raises is
caught by kernel_cache.events: it never fails a lowering.
"""

from __future__ import annotations

from jax import monitoring

from kernel_cache import events

PREFIX = "/kernel_cache/"
HITS, MISSES, COMPILES = f"{PREFIX}hits", f"{PREFIX}misses", f"{PREFIX}compiles"
REJECTED, ERRORS = f"{PREFIX}rejected", f"{PREFIX}errors"
COMPILE_TIME, COMPILE_TIME_SAVED = f"{PREFIX}compile_time_sec", f"{PREFIX}compile_time_saved_sec"
EVENT_NAMES = (HITS, MISSES, COMPILES, REJECTED, ERRORS)
DURATION_NAMES = (COMPILE_TIME_SAVED, COMPILE_TIME)


def forward(event: events.Event) -> None:
    """kernel_cache.events' listener: one kernel-cache event as jax.monitoring events."""
    if event.kind == events.HIT:
        monitoring.record_event(HITS, tier=event.tier)
        monitoring.record_event_duration_secs(COMPILE_TIME_SAVED, event.seconds, tier=event.tier)
    elif event.kind == events.MISS:
        monitoring.record_event(MISSES)
    elif event.kind == events.COMPILE:
        monitoring.record_event(COMPILES)
        monitoring.record_event_duration_secs(COMPILE_TIME, event.seconds)
    elif event.kind == events.REJECTED:
        monitoring.record_event(REJECTED, tier=event.tier or "unknown")
    elif event.kind == events.ERROR:
        monitoring.record_event(ERRORS)


def install() -> None:
    """Forward kernel-cache's events to jax.monitoring (idempotent)."""
    events.add_listener(forward)


def uninstall() -> None:
    events.remove_listener(forward)


install()
