"""cachectl list / show / stats / config: read-only views of the cache."""

from __future__ import annotations

import os
import stat
import sys
import time
from typing import Any, TypedDict

from .. import entry as entry_format
from .. import entry_kinds
from ..config import XLA_SUBDIR, sources, spelled
from ..disk_index import ENTRIES_DIR, INDEX
from ..display import escaped, redacted
from ..inventory import EntryFilter, EntryInfo, find_by_prefix, mark_stale, normal_arch, read_raw, scan, sort_entries
from ..safefs import Tree
from ..tier import KeptTier
from ..tiers.disk import DiskTier
from ..tiers.remote import RemoteTier
from . import kinds, prometheus, show_views, winners_view
from .context import EXIT_OK, EXIT_PROBLEMS, CliError, Context
from .render import human_size, human_time, table


class _TierStats(TypedDict):
    """One tier's row of `cachectl stats`."""

    path: str
    entries: int
    bytes: int
    kinds: dict[str, int]
    writable: bool
    over_max_bytes: bool


class _SettingRow(TypedDict):
    """One setting's row of `cachectl config`."""

    variable: str
    value: str | None
    source: str
    meaning: str


def entry_filter(args: Any, check_stale: bool) -> EntryFilter:
    """The selection options shared by list, prune, export and prewarm."""
    arches = frozenset(normal_arch(a) for a in args.arch) if getattr(args, "arch", None) else None
    return EntryFilter(kernel_glob=getattr(args, "kernel", None), arches=arches,
                       older_than_seconds=getattr(args, "older_than", None), stale_only=check_stale)


def scan_all(ctx: Context, tiers: list[KeptTier], with_stale: bool) -> list[EntryInfo]:
    """Every entry of `tiers`, with hit counts and (if asked) whether it is stale."""
    store = ctx.store()
    infos = []
    for tier in tiers:
        infos += scan(tier, store.stats.entry_hits)
    if with_stale:
        mark_stale(infos, ctx.installed_toolchain)
    return infos


def cmd_list(ctx: Context, args: Any) -> int:
    tiers = ctx.tiers(args.tier)
    check_stale = args.stale or ctx.json or ctx.verbose  # --json always says: true, false or null (unknown)
    selection = entry_filter(args, args.stale)
    now = time.time()
    infos = sort_entries([i for i in scan_all(ctx, tiers, check_stale) if selection.matches(i, now)], args.sort)
    if ctx.json:
        ctx.emit_json({"entries": [i.to_json() for i in infos]})
        return EXIT_OK
    show_tier = len(tiers) > 1
    header = ["KEY", "KERNEL", "ARCH", "SIZE", "CREATED", "LAST USED", "HITS"]
    header += ["TIER"] if show_tier else []
    header += ["STALE"] if check_stale else []
    rows = [] if ctx.quiet else [header]  # -q: the rows alone, for scripts
    for i in infos:
        row = [i.key if ctx.verbose else i.key[:12], kinds.kernel_label(i), i.arch, human_size(i.size_bytes),
               human_time(i.created), human_time(i.last_used), str(i.hits)]
        row += [i.tier] if show_tier else []
        row += [{True: "yes", False: "no", None: "?"}[i.stale]] if check_stale else []
        rows.append(row)
    if rows:
        print("\n".join(table(rows, right={3, 6})))
    if not ctx.quiet:
        print(kinds.total_line(infos))
        for line in winners_view.list_block(infos, ctx.verbose):
            print(line)
    return EXIT_OK


def cmd_show(ctx: Context, args: Any) -> int:
    tiers = ctx.tiers()
    try:
        infos = scan_all(ctx, tiers, with_stale=False)
        info = find_by_prefix(infos, args.key)
    except LookupError as exc:
        raise CliError(str(exc)) from None
    tier = next(t for t in tiers if t.name == info.tier)
    raw = read_raw(tier, info.key)
    try:
        entry = entry_format.decode(raw, expected_key=info.key) if raw is not None else None
    except entry_format.CorruptEntry as exc:
        raise CliError(f"entry {info.key[:12]} is corrupt: {exc} (run 'cachectl verify --repair')",
                       EXIT_PROBLEMS) from None
    if entry is None:
        raise CliError(f"entry {info.key[:12]} disappeared while reading it", EXIT_PROBLEMS)
    if args.blobs:
        for name in args.blobs:
            if name not in entry.blobs:
                hint = " (kept only when the kernel was compiled with keep_ir=True)" if name in (
                    "ttgir", "llir") else ""
                raise CliError(f"entry {info.key[:12]} has no {name}{hint}", EXIT_PROBLEMS)
            sys.stdout.write(entry.blobs[name].decode(errors="replace"))
        return EXIT_OK
    hits = ctx.store().stats.entry_hits(info.key)
    if ctx.json:
        blobs = {name: len(data) for name, data in sorted(entry.blobs.items())}
        ctx.emit_json({"key": entry.key, "tier": info.tier, "size_bytes": info.size_bytes, "hits": hits,
                       "last_used": info.last_used, "blobs": blobs, "meta": entry.meta, "kind": info.kind,
                       **info.summaries()})
        return EXIT_OK
    view = show_views.view(entry_kinds.kind_of(entry.meta))
    view(entry, info, show_views.ShowArgs(hits=hits, cached={i.key for i in infos}, verbose=ctx.verbose))
    return EXIT_OK


def cmd_stats(ctx: Context, args: Any) -> int:
    fmt = stats_format(ctx, args)
    store = ctx.store()
    if args.zero:
        store.stats.zero()
        if fmt == "text":
            ctx.say("statistics zeroed")
            return EXIT_OK
    infos = scan_all(ctx, ctx.kept(), with_stale=False)
    totals = store.stats.totals()
    tiers: dict[str, _TierStats] = {}
    for tier in ctx.kept():
        mine = [i for i in infos if i.tier == tier.name]
        size = sum(i.size_bytes for i in mine)
        where = tier.endpoint if isinstance(tier, RemoteTier) else str(tier.directory)
        tiers[tier.name] = {"path": where, "entries": len(mine), "bytes": size,
                            "kinds": kinds.counts(mine), "writable": _writable_here(tier),
                            # only the local tier has a configured bound (the shared one is pruned by cachectl)
                            "over_max_bytes": tier.name == "disk" and size > ctx.config.max_bytes}
    created = [i.created for i in infos]
    report = {
        "dir": str(ctx.config.dir), "entries": len(infos), "kinds": kinds.counts(infos),
        "bytes": sum(i.size_bytes for i in infos),
        "max_bytes": ctx.config.max_bytes, "over_max_bytes": any(t["over_max_bytes"] for t in tiers.values()),
        "tiers": tiers, **totals,
        "oldest": min(created) if created else None, "newest": max(created) if created else None,
        "counters": "persisted" if not store.stats.unavailable else f"this process only ({store.stats.unavailable})",
        "xla": _xla_executables(ctx),
        "remote": remote.describe() if isinstance(remote := store.level("remote"), RemoteTier) else None,
    }
    if ctx.verbose:
        top = sorted(infos, key=lambda i: (-i.hits, i.key))[:10]
        report["most_hit"] = [{"key": i.key, "kernel": i.kernel, "arch": i.arch, "hits": i.hits} for i in top]
        report["by_arch"] = {arch: sum(1 for i in infos if i.arch == arch) for arch in sorted({i.arch for i in infos})}
    if fmt == "json":
        ctx.emit_json(report)
        return EXIT_OK
    if fmt == "prometheus":
        sys.stdout.write(prometheus.render(report))  # built whole first: a failed run prints nothing
        return EXIT_OK
    hits = report["hits"]
    lookups = sum(hits.values()) + report["misses"]
    rate = f" ({100 * sum(hits.values()) / lookups:.1f}% hit rate)" if lookups else ""
    print(f"cache directory      {report['dir']}")
    for name, t in tiers.items():
        state = "" if t["writable"] else ", read-only here"
        print(f"{name + ' entries':<20} {t['entries']} ({human_size(t['bytes'])}{state}) in {t['path']}")
    if infos:  # lowered-call records and winners are entries too, but not kernels; a copy counts per tier
        per_tier = [(name, kinds.breakdown([i for i in infos if i.tier == name])) for name in tiers]
        shown = [(name, text) for name, text in per_tier if text]
        line = shown[0][1] if len(tiers) == 1 else "; ".join(f"{name}: {text}" for name, text in shown)
        print(f"entry kinds          {line}")
    print(f"hits                 memory {hits['memory']}, disk {hits['disk']}, shared {hits['shared']}"
          + (f", remote {hits['remote']}" if hits.get("remote") or ctx.config.remote else "") + rate)
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
        state = (f"{r['server_version']}, {r['round_trip_ms']} ms round trip, maxmemory-policy {r['maxmemory_policy']}"
                 if r["reachable"] else f"unreachable ({r.get('error', '')})")
        c = r["counters"]
        print(f"remote               {r['endpoint']} namespace {r['namespace']}: {state}")
        print(f"remote this process  hits {c['hits']}, misses {c['misses']}, errors {c['errors']}, timeouts "
              f"{c['timeouts']}, breaker openings {c['breaker_openings']}, lock waits {c['lock_waits']}, "
              f"rejected {c['rejected']}")
    print(f"errors               {report['errors']}")
    print(f"rejected             {report['rejected']} (entries refused for who wrote them; see README, Trust model)")
    print(f"oldest / newest      {human_time(report['oldest'])} / {human_time(report['newest'])}")
    over = report["over_max_bytes"]
    print(f"max size             {human_size(report['max_bytes'])} (KERNEL_CACHE_MAX_BYTES)"
          + (" EXCEEDED: the next write evicts, or run 'cachectl prune --max-size SIZE'" if over else ""))
    if ctx.verbose:
        print(f"counters             {report['counters']}")
        print("entries by arch      " + (", ".join(f"{a} {n}" for a, n in report["by_arch"].items()) or "-"))
        for n, row in enumerate(report["most_hit"]):
            print(f"{'most hit' if n == 0 else '':<21}{row['key'][:12]}  {row['kernel']}  {row['arch']}  {row['hits']}")
    return EXIT_OK


def stats_format(ctx: Context, args: Any) -> str:
    """text, json or prometheus: --json is --format json; with another --format it is refused."""
    chosen = getattr(args, "format", None)
    if ctx.json and chosen not in (None, "json"):
        raise CliError(f"--json and --format {chosen} disagree: pass one of them")
    return "json" if ctx.json else chosen or "text"


def _writable_here(tier: KeptTier) -> bool:
    """Whether the user running cachectl could write to `tier`. cachectl opens the local tier
    read-only (it only looks), so that tier's own answer is always no: ask the filesystem instead,
    as a job of this user would find it (a read-only mount refuses even root)."""
    if tier.writable or not isinstance(tier, DiskTier):
        return tier.writable
    index = tier.directory / ENTRIES_DIR / INDEX
    return (os.access(tier.directory, os.W_OK | os.X_OK) and os.access(tier.directory / ENTRIES_DIR, os.W_OK | os.X_OK)
            and (not index.exists() or os.access(index, os.W_OK)))


def cmd_config(ctx: Context, args: Any) -> int:
    """Every KERNEL_CACHE_* setting: its effective value and whether the environment set it."""
    rows: list[_SettingRow] = []
    for setting, source in sources():
        value = getattr(ctx.config, setting.field)
        if source == "unused":
            text = None
        elif setting.field == "signing_key":
            signer = ctx.config.signer()  # None exactly when the key (value) is
            text = None if signer is None else f"set (key id {signer.key_id.hex()})"
        elif setting.field in ("remote", "remote_password"):
            text = None if value is None else redacted(value) if setting.field == "remote" else "set"
        else:
            text = spelled(setting, value)
        rows.append({"variable": setting.env, "value": text, "source": source, "meaning": setting.help})
    if ctx.json:
        ctx.emit_json({"schema": 1, "settings": rows})
        return EXIT_OK
    shown = [["VARIABLE", "VALUE", "SOURCE"]] + [[r["variable"], r["value"] or "-", r["source"]] for r in rows]
    print("\n".join(table(shown, right=set())))
    return EXIT_OK


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
