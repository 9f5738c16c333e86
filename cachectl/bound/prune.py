"""cachectl prune / clear: bound the cache, or empty it."""

from __future__ import annotations

import sys
from typing import Any

from cachectl.context import EXIT_OK, EXIT_PROBLEMS, CliError, Context
from cachectl.inventory import EntryInfo, entry_filter, plan_prune, remove_entries, scan, scan_all
from cachectl.render import bound_source, human_size
from kernel_cache.levels.protocols import KeptLevel
from kernel_cache.sanitize import escaped

DEBRIS_AGE_SECONDS = 3600.0  # temp and lock files that crashed writers left, removed past this age


def cmd_prune(ctx: Context, args: Any) -> int:
    """A plain prune (no selection, no --max-size) evicts the local level down to its bound: the one every
    process on the directory honours (KERNEL_CACHE_MAX_BYTES, else the stored one, else 8G)."""
    store = ctx.store()
    selection = entry_filter(args, args.stale)
    plain = selection.is_empty and args.max_size is None
    removed, freed, debris, remaining = [], 0, [], {}
    failed: list[tuple[EntryInfo, str]] = []
    bound: dict[str, Any] | None = None
    for level in ctx.levels(args.level):
        infos = scan_all(ctx, [level], with_stale=args.stale or ctx.json)  # --json always says stale or not
        max_size = args.max_size
        if plain and level.name == "disk":
            max_size = ctx.config.max_bytes
            bound = {"max_bytes": max_size, "source": ctx.bound_source}
        doomed = plan_prune(infos, selection, max_size)
        if not args.dry_run:
            before = len(failed)
            freed += remove_entries(level, doomed, store.stats.forget_entry, failed)
            debris += _debris(level, failed)
            kept = {i.key for i, _ in failed[before:]}
            doomed = [i for i in doomed if i.key not in kept]
        else:
            freed += sum(i.size_bytes for i in doomed)
        removed += doomed
        gone = {i.key for i in doomed}
        rest = [i for i in infos if i.key not in gone]
        remaining[level.name] = {"entries": len(rest), "bytes": sum(i.size_bytes for i in rest)}
    status = EXIT_PROBLEMS if failed else EXIT_OK
    _say_failures(failed)
    if ctx.json:
        ctx.emit_json({"dry_run": args.dry_run, "bound": bound, "removed": [i.to_json() for i in removed],
                       "bytes_freed": freed,
                       "debris": [{"path": escaped(p), "bytes": b} for p, b in debris], "remaining": remaining,
                       "failed": [{"key": i.key, "level": i.level, "reason": escaped(why)} for i, why in failed]})
        return status
    verb = "would remove" if args.dry_run else "removed"
    if not ctx.quiet:
        for i in removed:
            print(f"{verb}  {i.key[:12]}  {i.label}  {i.arch}  {human_size(i.size_bytes)}  "
                  f"({i.level})")
        for path, size in debris:
            print(f"removed debris  {escaped(path)}  {human_size(size)}")
    ctx.say(f"{verb} {len(removed)} entries, {human_size(freed)}"
            + (f"; {len(failed)} could not be removed" if failed else "")
            + (f"; {len(debris)} debris files, {human_size(sum(b for _, b in debris))}" if debris else "")
            + "; left: " + ", ".join(f"{n} {r['entries']} entries {human_size(r['bytes'])}"
                                     for n, r in remaining.items())
            + (f" (bound {human_size(bound['max_bytes'])}: {bound_source(ctx)})" if bound is not None else ""))
    return status


def _say_failures(failed: list[tuple[EntryInfo, str]]) -> None:
    for i, why in failed:
        print(f"cachectl: could not remove {i.key[:12]} ({i.level}): {escaped(why)}", file=sys.stderr)


def _debris(level: KeptLevel, failed: list[tuple[EntryInfo, str]]) -> list[tuple[str, int]]:
    try:
        return [(str(path), int(size)) for path, size in level.remove_debris(DEBRIS_AGE_SECONDS)]
    except OSError as exc:  # a read-only mount or someone else's directory: said, not a traceback
        print(f"cachectl: could not remove debris in the {level.name} level: {exc.strerror or exc}", file=sys.stderr)
        return []


def cmd_clear(ctx: Context, args: Any) -> int:
    chosen = ctx.levels(args.level)
    if not args.yes:
        named = ", ".join(f"{t.name} ({t.location})" for t in chosen)
        others = [t.name for t in ctx.levels() if t not in chosen]
        raise CliError(f"clear removes every entry of: {named}"
                       + (f" (not {', '.join(others)}: name it with --level or pass --all-levels)" if others else "")
                       + "; pass --yes to confirm")
    store = ctx.store()
    count, size = 0, 0
    failed: list[tuple[EntryInfo, str]] = []
    for level in chosen:
        infos = scan(level)
        before = len(failed)
        size += remove_entries(level, infos, store.stats.forget_entry, failed)
        count += len(infos) - (len(failed) - before)
    _say_failures(failed)
    levels = ", ".join(t.name for t in chosen)
    if ctx.json:
        ctx.emit_json({"removed": count, "bytes_freed": size, "levels": [t.name for t in chosen],
                       "failed": [{"key": i.key, "level": i.level, "reason": escaped(why)} for i, why in failed]})
    else:
        ctx.say(f"removed {count} entries, {human_size(size)} ({levels})"
                + (f"; {len(failed)} could not be removed" if failed else ""))
    return EXIT_PROBLEMS if failed else EXIT_OK
