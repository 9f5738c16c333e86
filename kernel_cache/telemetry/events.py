"""Telemetry hooks, by their public name: each counted hit, miss, compile, rejected entry and error, as it
happens, to whoever listens. They live with the counters (`kernel_cache.telemetry.stats`), which emit them
inline: a hit passes through no other file of ours on its way to jax.monitoring."""

from kernel_cache.telemetry.stats import (
    COMPILE,
    DURATION_NAMES,
    ERROR,
    EVENT_NAMES,
    HIT,
    KINDS,
    MISS,
    PREFIX,
    REJECTED,
    Event,
    Listener,
    add_listener,
    add_recorder,
    emit,
    recorders,
    remove_listener,
)

__all__ = ["COMPILE", "DURATION_NAMES", "ERROR", "EVENT_NAMES", "HIT", "KINDS", "MISS", "PREFIX", "REJECTED", "Event",
           "Listener", "add_listener", "add_recorder", "emit", "recorders", "remove_listener"]
