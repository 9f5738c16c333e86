"""`cachectl stats --format prometheus`: the stats report in Prometheus' text exposition format, as
node-exporter's textfile collector reads it (the recipe: docs/cachectl.md). Every number is one
`stats --json` reports, each series labelled with the cache directory. The text is built whole
before it is printed, so a failed run leaves no partial file; an unreachable level is no failed run
(`kernel_cache_level_reachable 0`), so the last file's numbers never stand for a level that is gone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cachectl import entry_kinds
from kernel_cache.telemetry.stats import LEVELS

PREFIX = "kernel_cache_"
# hits_total's `kind` label: the tag of the kind of entry that served the lookup (entries_by_kind's values)
KERNEL, CALL = entry_kinds.KERNEL.tag, entry_kinds.CALL.tag

Sample = tuple[Mapping[str, str], float | int]


def render(report: Mapping[str, Any]) -> str:
    """The exposition text of a `cachectl stats` report (the dict `--json` prints)."""
    base = {"dir": str(report["dir"])}
    kinds = entry_kinds.every()  # the kind label: each kind's tag, as inventory.counts counts them by name
    legend = ", ".join(f"{k.tag}: {k.legend}" if k.legend else k.tag for k in kinds)
    levels: Mapping[str, Mapping[str, Any]] = report["levels"]
    reached = {t: v for t, v in levels.items() if v.get("entries") is not None}  # an unreachable level has no count
    families: list[tuple[str, str, str, list[Sample]]] = [
        ("hits_total", "counter", "Lookups served from this level (memory, disk, shared, remote), by the kind "
         f"of entry that served them: {KERNEL} (a kernel read) or {CALL} (a lowered-call record serving a whole "
         "call, its kernels unread). Summed over kind: every lookup served, as cachectl stats counts them.",
         [({"level": t, "kind": kind}, report[field].get(t, 0))
          for t in LEVELS for kind, field in ((KERNEL, "hits"), (CALL, "record_hits"))]),
        ("misses_total", "counter", "Lookups no level could serve (each is then compiled).",
         [({}, report["misses"])]),
        ("compiles_total", "counter", "Kernels compiled and stored.", [({}, report["compiles"])]),
        ("compile_seconds_total", "counter", "Seconds spent compiling kernels.",
         [({}, report["compile_seconds"])]),
        ("compile_seconds_saved_total", "counter", "Compile seconds saved by hits of either kind (each hit "
         "counts the compile time recorded in the entry that served it).", [({}, report["compile_seconds_saved"])]),
        ("rejected_total", "counter", "Entries refused for who wrote them (unsigned, signed with another key, "
         "untrusted owner); the reason is not counted, see the warnings of the job that met them.",
         [({}, report["rejected"])]),
        ("errors_total", "counter", "Corrupt entries and failed level reads or writes.", [({}, report["errors"])]),
        ("entries", "gauge", "Entries stored in this level (a copy in two levels counts in each).",
         [({"level": t}, v["entries"]) for t, v in reached.items()]),
        ("bytes", "gauge", "Bytes stored in this level.", [({"level": t}, v["bytes"]) for t, v in reached.items()]),
        ("entries_by_kind", "gauge", f"Entries stored in this level by kind ({legend}).",
         [({"level": t, "kind": k.tag}, v["kinds"].get(k.name, 0)) for t, v in reached.items() for k in kinds]),
        ("level_writable", "gauge", "1 if the user running cachectl can write to this level, else 0.",
         [({"level": t}, int(bool(v["writable"]))) for t, v in levels.items()]),
        ("level_reachable", "gauge", "1 if cachectl could list this level, else 0 (a remote server down: its "
         "entries and bytes are then left out, not reported as 0).",
         [({"level": t}, int(v.get("entries") is not None)) for t, v in levels.items()]),
        ("max_bytes", "gauge", "The local level's bound (KERNEL_CACHE_MAX_BYTES, else the one stored in the cache "
         "directory by cachectl config max-size, else 8 GiB).", [({}, report["max_bytes"])]),
        ("over_max_bytes", "gauge", "1 if the local level holds more than its bound, else 0.",
         [({}, int(bool(report["over_max_bytes"])))]),
        ("counters_persisted", "gauge", "1 if the hit/miss/compile counters were read from the cache directory, "
         "0 if they could not be (they then count only the cachectl process: zeros).",
         [({}, int(report["counters"] == "persisted"))]),
    ]
    lines: list[str] = []
    for name, kind, help_text, samples in families:
        if not samples:  # no level: the family is left out, not declared empty
            continue
        full = PREFIX + name
        lines.append(f"# HELP {full} {_escaped(help_text)}")
        lines.append(f"# TYPE {full} {kind}")
        lines.extend(f"{full}{_labels({**base, **labels})} {_value(value)}" for labels, value in samples)
    return "\n".join(lines) + "\n"


def _labels(labels: Mapping[str, str]) -> str:
    escaped = {k: _escaped(v).replace('"', '\\"') for k, v in labels.items()}
    return "{" + ",".join(f'{k}="{v}"' for k, v in escaped.items()) + "}"


def _escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _value(value: float | int) -> str:
    """Integers as integers, floats as Python's shortest round-trip repr (what --json prints)."""
    return str(value) if isinstance(value, int) else repr(float(value))

