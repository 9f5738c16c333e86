"""cachectl list: the entries of the chosen levels as a table, their totals by kind, and the
autotune winners among them."""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from cachectl import entry_kinds
from cachectl.context import EXIT_OK, EXIT_PROBLEMS, Context
from cachectl.inventory import EntryInfo, breakdown, entry_filter, scan_all, sort_entries
from cachectl.render import human_size, human_time, milliseconds, table
from kernel_cache.entries.summary import EntrySummary, config_items
from kernel_cache.levels.protocols import KeptLevel

CONFIG_CHARS = 48  # list's CONFIG column, cut beyond this without -v


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
    configs = config_labels(infos, whole=verbose)
    for i in infos:
        config = configs[i.key] or "-"
        row = [i.key if verbose else i.key[:12], i.label, *([i.module or "-"] if verbose else []),
               config if verbose or len(config) <= CONFIG_CHARS else config[:CONFIG_CHARS - 1] + "…", i.arch,
               human_size(i.size_bytes), human_time(i.created, verbose), human_time(i.last_used, verbose), str(i.hits)]
        row += [i.level] if show_level else []
        row += [{True: "yes", False: "no", None: "?"}[i.stale]] if check_stale else []
        rows.append(row)
    if rows:
        print("\n".join(table(rows, right={header.index("SIZE"), header.index("HITS")})))
    if not ctx.quiet:
        print(total_line(infos) + ("; not listed: the " + ", ".join(level.name for level, _ in unreachable)
                                         + " level (unreachable)" if unreachable else ""))
        _print_winners(infos, ctx.verbose)
    return status


def total_line(infos: list[EntryInfo]) -> str:
    """list's last line, '23 entries (14 kernels, 9 lowered calls), 852.8 KiB': scripts read its leading 'N entries'."""
    detail = breakdown(infos)
    return (f"{len(infos)} entries" + (f" ({detail})" if detail else "")
            + f", {human_size(sum(i.size_bytes for i in infos))}")


def config_labels(infos: Iterable[EntryInfo], whole: bool = False) -> dict[str, str]:
    """list's CONFIG column, by key: a kernel's constexprs, warps and stages ('BM=64 BN=64 BK=32 w4 s3'),
    a winner's key values. Of a kernel with several entries, only what differs among them (`whole`: all
    of it; a value Triton specialised, such as a stride of 1, is the same in each). Where entries of one
    kernel and arch would still look alike, what else differs is added: the argument types
    ('*fp16,i32'), else the toolchain that built them."""
    shown = list(infos)
    items = {i.key: _config(i) for i in shown}
    labels = {key: " ".join(parts) for key, parts in items.items()}
    if not whole:
        for group in _grouped(shown, lambda i: (i.module, i.kernel, i.entry_kind.name)):
            common = set.intersection(*(set(items[i.key]) for i in group))
            for i in group:
                labels[i.key] = " ".join([p for p in items[i.key] if p not in common] or items[i.key])
    tells: tuple[Callable[[EntryInfo], str], ...] = (
        lambda i: EntrySummary.from_meta(i.meta).signature, lambda i: i.toolchain)
    for tell in tells:  # each on the entries still alike after the one before
        for group in _grouped(shown, lambda i: (i.kernel, i.arch, i.entry_kind.name, labels[i.key])):
            values = {i.key: tell(i) for i in group}
            if len(set(values.values())) > 1:
                for key, value in values.items():
                    labels[key] = f"{labels[key]} {value or '?'}".strip()
    return labels


def _grouped(infos: list[EntryInfo], by: Callable[[EntryInfo], tuple[str, ...]]) -> list[list[EntryInfo]]:
    """The groups of two or more distinct entries (a key in two levels is one entry) alike in `by`."""
    groups: dict[tuple[str, ...], dict[str, EntryInfo]] = defaultdict(dict)
    for i in infos:
        groups[by(i)].setdefault(i.key, i)
    return [list(g.values()) for g in groups.values() if len(g) > 1]


def _config(info: EntryInfo) -> list[str]:
    if info.entry_kind is entry_kinds.WINNER and info.kind_summary is not None:
        return [str(info.kind_summary.get("key_values", ""))]
    return config_items(info.meta) if info.entry_kind is entry_kinds.KERNEL else []


def _print_winners(infos: list[EntryInfo], verbose: bool) -> None:
    """After list's table: one line per winner (kernel, GPU model, key values, winning config, time)."""
    rows = [(i, i.kind_summary) for i in infos if i.kind == entry_kinds.WINNER.name and i.kind_summary is not None]
    if rows:
        print("\nautotune winners (cachectl tune):")
    for info, w in rows:
        slowest = milliseconds(w["slowest_seconds"])
        print(f"  {info.key if verbose else info.key[:12]}  {info.kernel} on {w['device']} [{w['key_values']}]: "
              f"{w['config']}  {milliseconds(w['seconds'])} (slowest of {w['configs']}: {slowest})")
