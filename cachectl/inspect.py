"""cachectl list / show: read-only views of the cache's entries (stats: stats_view, config: settings)."""

from __future__ import annotations

import sys
import time
from typing import Any

from cachectl import entry_kinds, kinds, notices, show_views, winners_view
from cachectl.context import EXIT_OK, EXIT_PROBLEMS, CliError, Context
from cachectl.inventory import EntryFilter, EntryInfo, find_by_prefix, mark_stale, normal_arch, read_raw, scan, sort_entries
from cachectl.render import human_size, human_time, table
from kernel_cache.entries import entry as entry_format
from kernel_cache.errors import LevelUnavailable
from kernel_cache.levels.protocols import KeptLevel

CONFIG_CHARS = 48  # list's CONFIG column, cut beyond this without -v


def entry_filter(args: Any, check_stale: bool) -> EntryFilter:
    """The selection options shared by list, prune, export and prewarm."""
    arches = frozenset(normal_arch(a) for a in args.arch) if getattr(args, "arch", None) else None
    return EntryFilter(kernel_glob=getattr(args, "kernel", None), arches=arches,
                       older_than_seconds=getattr(args, "older_than", None), stale_only=check_stale)


def scan_all(ctx: Context, levels: list[KeptLevel], with_stale: bool,
             unreachable: list[tuple[KeptLevel, str]] | None = None) -> list[EntryInfo]:
    """Every entry of `levels`, with hit counts and (if asked) whether it is stale. A level that
    cannot be read (a remote server down) raises LevelUnavailable, or, given `unreachable`, is
    added there with the cause and the other levels are still listed."""
    store = ctx.store()
    infos = []
    for level in levels:
        try:
            infos += scan(level, store.stats.entry_hits)
        except LevelUnavailable as exc:
            why = notices.explained(str(exc))
            if unreachable is None:
                raise LevelUnavailable(why) from None
            unreachable.append((level, why))
    if with_stale:
        mark_stale(infos, ctx.installed_toolchain)
    return infos


def cmd_list(ctx: Context, args: Any) -> int:
    levels = ctx.levels(args.level)
    check_stale = args.stale or ctx.json or ctx.verbose  # --json always says: true, false or null (unknown)
    selection = entry_filter(args, args.stale)
    now = time.time()
    unreachable: list[tuple[KeptLevel, str]] = []
    infos = sort_entries([i for i in scan_all(ctx, levels, check_stale, unreachable) if selection.matches(i, now)],
                         args.sort)
    status = EXIT_PROBLEMS if unreachable else EXIT_OK
    for level, why in unreachable:  # the levels that answered are listed; this one is named, with its cause
        print(f"cachectl: the {level.name} level was not listed: {why}", file=sys.stderr)
    if ctx.json:
        ctx.emit_json({"entries": [i.to_json() for i in infos],
                       "unreachable": [{"level": level.name, "error": why} for level, why in unreachable]})
        return status
    if len(unreachable) == len(levels):
        return status  # no level answered: no table, no "0 entries"
    show_level, verbose = len(levels) > 1, ctx.verbose  # -v: full keys, the kernel's module, times to the second
    header = ["KEY", "KERNEL", *(["MODULE"] if verbose else []), "CONFIG", "ARCH", "SIZE", "CREATED", "LAST USED", "HITS"]
    header += ["LEVEL"] if show_level else []
    header += ["STALE"] if check_stale else []
    rows = [] if ctx.quiet else [header]  # -q: the rows alone, for scripts
    configs = kinds.config_labels(infos, whole=verbose)
    for i in infos:
        config = configs[i.key] or "-"
        row = [i.key if verbose else i.key[:12], kinds.kernel_label(i), *([i.module or "-"] if verbose else []),
               config if verbose or len(config) <= CONFIG_CHARS else config[:CONFIG_CHARS - 1] + "…", i.arch,
               human_size(i.size_bytes), human_time(i.created, verbose), human_time(i.last_used, verbose), str(i.hits)]
        row += [i.level] if show_level else []
        row += [{True: "yes", False: "no", None: "?"}[i.stale]] if check_stale else []
        rows.append(row)
    if rows:
        print("\n".join(table(rows, right={header.index("SIZE"), header.index("HITS")})))
    if not ctx.quiet:
        print(kinds.total_line(infos) + ("; not listed: the " + ", ".join(level.name for level, _ in unreachable)
                                         + " level (unreachable)" if unreachable else ""))
        for line in winners_view.list_block(infos, ctx.verbose):
            print(line)
    return status


def cmd_show(ctx: Context, args: Any) -> int:
    levels = ctx.levels()
    try:
        infos = scan_all(ctx, levels, with_stale=False)
        info = find_by_prefix(infos, args.key)
    except LookupError as exc:
        raise CliError(str(exc)) from None
    level = next(t for t in levels if t.name == info.level)
    raw = read_raw(level, info.key)
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
        ctx.emit_json({"key": entry.key, "level": info.level, "size_bytes": info.size_bytes, "hits": hits,
                       "last_used": info.last_used, "blobs": blobs, "meta": entry.meta, "kind": info.kind,
                       **info.summaries()})
        return EXIT_OK
    view = show_views.view(entry_kinds.kind_of(entry.meta))
    view(entry, info, show_views.ShowArgs(hits=hits, cached={i.key for i in infos}, verbose=ctx.verbose))
    return EXIT_OK
