"""cachectl stats: entries and bytes per level, what the user running cachectl may do there, the counters,
the bound, in text, JSON or Prometheus' format.

What it says is what the user can do and what it reached: writable as a job of theirs would find the
level (`writable_here`); a level it could not reach (a remote server down) unreachable, with why, never
"0 entries"; and a size is the bytes of the entries, the one that list, prune and doctor count.
"""

from __future__ import annotations

import os
import stat
import sys
from typing import Any, TypedDict

from cachectl.context import EXIT_OK, EXIT_PROBLEMS, CliError, Context
from cachectl.inventory import EntryInfo, breakdown, counts, scan_all
from cachectl.render import bound_source, human_size, human_time
from cachectl.see import prometheus
from kernel_cache.errors import LevelUnavailable
from kernel_cache.levels.cache_marker import ENTRIES_DIR
from kernel_cache.levels.disk import DiskLevel
from kernel_cache.levels.protocols import KeptLevel
from kernel_cache.levels.remote.level import RemoteLevel
from kernel_cache.levels.shared import SharedLevel
from kernel_cache.sanitize import escaped
from kernel_cache.settings.config import XLA_SUBDIR
from kernel_cache.trust.safefs import Tree


class _LevelStats(TypedDict):
    """One level's row of `cachectl stats`."""

    path: str
    entries: int | None  # None: the level could not be reached (then `error` says why)
    bytes: int | None
    kinds: dict[str, int]
    writable: bool
    reachable: bool
    error: str | None
    over_max_bytes: bool


def cmd_stats(ctx: Context, args: Any) -> int:
    """Exit 1 when a level could not be reached (its row says so), but for the Prometheus format: there
    the text says it (`kernel_cache_level_reachable 0`) and the textfile recipe must replace the last file."""
    fmt = getattr(args, "format", None)  # --json is --format json; with another --format it is refused
    if ctx.json and fmt not in (None, "json"):
        raise CliError(f"--json and --format {fmt} disagree: pass one of them")
    fmt = "json" if ctx.json else fmt or "text"
    store = ctx.store()
    if args.zero:
        store.stats.zero()
        if fmt == "text":
            ctx.say("statistics zeroed")
            return EXIT_OK
    infos: list[EntryInfo] = []
    unreachable: dict[str, str] = {}
    for level in ctx.levels():
        try:
            infos += scan_all(ctx, [level], with_stale=False)
        except LevelUnavailable as exc:  # a server fault mid-listing: that level's row says it
            unreachable[level.name] = escaped(str(exc))
    report = _report(ctx, infos, unreachable)
    status = EXIT_PROBLEMS if unreachable else EXIT_OK
    if fmt == "prometheus":
        sys.stdout.write(prometheus.render(report))  # built whole first: a failed run prints nothing
        return EXIT_OK
    for why in unreachable.values():
        print(f"cachectl: {why}", file=sys.stderr)
    if fmt == "json":
        if unreachable:
            report.update(error="; ".join(unreachable.values()), exit_code=EXIT_PROBLEMS)
        ctx.emit_json(report)
        return status
    _print(ctx, report, infos)
    return status


def _report(ctx: Context, infos: list[EntryInfo], unreachable: dict[str, str]) -> dict[str, Any]:
    """What --json prints (and Prometheus renders)."""
    store = ctx.store()
    levels: dict[str, _LevelStats] = {}
    for level in ctx.levels():
        error = unreachable.get(level.name)  # then none of its entries were listed
        mine = [i for i in infos if i.level == level.name]
        size = sum(i.size_bytes for i in mine)
        levels[level.name] = {"path": level.location, "entries": None if error is not None else len(mine),
                              "bytes": None if error is not None else size, "kinds": counts(mine),
                              "writable": error is None and writable_here(level), "reachable": error is None,
                              "error": error,
                              # only the local level has a configured bound (the shared one is pruned by cachectl)
                              "over_max_bytes": level.name == "disk" and size > ctx.config.max_bytes}
    created = [i.created for i in infos]
    report: dict[str, Any] = {
        "dir": str(ctx.config.dir), "entries": len(infos), "kinds": counts(infos),
        "bytes": sum(i.size_bytes for i in infos), "max_bytes": ctx.config.max_bytes,
        "max_bytes_source": ctx.bound_source,
        "over_max_bytes": any(t["over_max_bytes"] for t in levels.values()),
        "levels": levels, **store.stats.totals(),
        "oldest": min(created) if created else None, "newest": max(created) if created else None,
        "counters": "persisted" if not store.stats.unavailable else f"this process only ({store.stats.unavailable})",
        "xla": _xla_executables(ctx),
        "remote": remote.describe() if isinstance(remote := store.level("remote"), RemoteLevel) else None,
    }
    if ctx.verbose:
        top = sorted(infos, key=lambda i: (-i.hits, i.key))[:10]
        report["most_hit"] = [{"key": i.key, "kernel": i.kernel, "arch": i.arch, "hits": i.hits} for i in top]
        report["by_arch"] = {arch: sum(1 for i in infos if i.arch == arch) for arch in sorted({i.arch for i in infos})}
    return report


def _print(ctx: Context, report: dict[str, Any], infos: list[EntryInfo]) -> None:
    levels: dict[str, _LevelStats] = report["levels"]
    hits, records = report["hits"], report["record_hits"]
    served = sum(hits.values()) + sum(records.values())  # a record serves its whole call in one lookup
    lookups = served + report["misses"]
    rate = f" ({100 * served / lookups:.1f}% of lookups served)" if lookups else ""
    print(f"cache directory      {report['dir']}")
    for name, t in levels.items():
        if t["entries"] is None or t["bytes"] is None:
            print(f"{name + ' entries':<20} unreachable: {t['error']}")
            continue
        state = "" if t["writable"] else ", read-only here"
        print(f"{name + ' entries':<20} {t['entries']} ({human_size(t['bytes'])}{state}) in {t['path']}")
    if infos:  # lowered-call records and winners are entries too, but not kernels; a copy counts per level
        per_level = [(name, breakdown([i for i in infos if i.level == name])) for name in levels]
        shown = [(name, text) for name, text in per_level if text]
        line = shown[0][1] if len(levels) == 1 else "; ".join(f"{name}: {text}" for name, text in shown)
        print(f"entry kinds          {line}")
    served_by = [name for name in ("memory", "disk", "shared", "remote") if name != "remote" or ctx.config.remote
                 or hits.get("remote") or records.get("remote")]
    print("hits                 kernels: " + ", ".join(f"{name} {hits.get(name, 0)}" for name in served_by)
          + "; call records: " + ", ".join(f"{name} {records.get(name, 0)}" for name in served_by) + rate)
    print(f"misses               {report['misses']}")
    print(f"compiles             {report['compiles']} ({report['compile_seconds']:.2f} s compiling)")
    print(f"compile time saved   {report['compile_seconds_saved']:.2f} s")
    if report["xla"] is not None:
        x = report["xla"]
        print(f"xla executables      {x['files']} ({human_size(x['bytes'])}) in {escaped(x['path'])}"
              + (" (counted in part: the tree there is too deep or too large)" if x["truncated"] else "")
              + ("" if ctx.config.xla else " (KERNEL_CACHE_XLA is not set here: not used)"))
    if report["remote"] is not None:
        r = report["remote"]
        deployment = (f" cluster of {r.get('masters')} masters," if r.get("cluster")
                      else " read-only replica," if r.get("role") == "slave" else "")
        state = (f"{r['server_version']},{deployment} {r['round_trip_ms']} ms round trip, maxmemory-policy "
                 f"{r['maxmemory_policy']}" if r["reachable"] else f"unreachable ({r.get('error', '')})")
        c = r["counters"]
        print(f"remote               {r['endpoint']} namespace {r['namespace']}: {state}")
        print(f"remote this process  hits {c['hits']}, misses {c['misses']}, errors {c['errors']}, timeouts "
              f"{c['timeouts']}, breaker openings {c['breaker_openings']}, lock waits {c['lock_waits']}, "
              f"rejected {c['rejected']}")
    print(f"errors               {report['errors']}")
    print(f"rejected             {report['rejected']} (entries refused for who wrote them; see README, Trust model)")
    print(f"oldest / newest      {human_time(report['oldest'])} / {human_time(report['newest'])}")
    over = report["over_max_bytes"]
    print(f"max size             {human_size(report['max_bytes'])} ({bound_source(ctx)})"
          + (" EXCEEDED: the next write evicts, or run 'cachectl prune'" if over else ""))
    if ctx.verbose:
        print(f"counters             {report['counters']}")
        print("entries by arch      " + (", ".join(f"{a} {n}" for a, n in report["by_arch"].items()) or "-"))
        for n, row in enumerate(report["most_hit"]):
            print(f"{'most hit' if n == 0 else '':<21}{row['key'][:12]}  {row['kernel']}  {row['arch']}  {row['hits']}")


def writable_here(level: KeptLevel) -> bool:
    """Whether the user running cachectl could write to `level`. cachectl opens the directory levels
    read-only (it only looks), so their own answer is no: ask the filesystem instead, as a job of this
    user would find it (a read-only mount refuses even root). A remote answers for itself."""
    if level.writable or not isinstance(level, (DiskLevel, SharedLevel)):
        return level.writable
    entries = level.directory / ENTRIES_DIR
    return os.access(level.directory, os.W_OK | os.X_OK) and (not entries.exists() or os.access(entries, os.W_OK | os.X_OK))


def _xla_executables(ctx: Context) -> dict[str, Any] | None:
    """JAX's persistent compilation cache under the cache dir (KERNEL_CACHE_XLA=1): files and bytes,
    counted by a bounded walk (`truncated`: a planted tree too deep or too large to count whole)."""
    if ctx.config.dir is None:
        return None
    directory = ctx.config.dir / XLA_SUBDIR
    if not directory.is_dir() or directory.is_symlink():
        return None
    try:
        tree = Tree(directory, None)
    except OSError:
        return None
    try:
        found, truncated = tree.walk()
    finally:
        tree.close()
    sizes = [st.st_size for _, st in found if stat.S_ISREG(st.st_mode)]
    return {"path": str(directory), "files": len(sizes), "bytes": sum(sizes), "truncated": truncated}

