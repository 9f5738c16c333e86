"""cachectl prune / verify / clear: bound the cache, check it, repair it, empty it."""

from __future__ import annotations

import sys
from typing import Any, TypedDict

from cachectl import kinds
from cachectl.context import EXIT_OK, EXIT_PROBLEMS, CliError, Context
from cachectl.inspect import entry_filter, scan_all
from cachectl.inventory import BadEntry, EntryInfo, plan_prune, remove_debris, remove_entries, scan, verify
from cachectl.render import bound_source, human_size
from kernel_cache.levels.disk.level import DiskLevel
from kernel_cache.levels.disk.repair import rebuild_index, wipe
from kernel_cache.levels.protocols import KeptLevel
from kernel_cache.sanitize import escaped
from kernel_cache.store import Store


class _IndexState(TypedDict):
    """verify's word on the local index: what is wrong with it, and what a rebuild found."""

    problem: str
    rebuilt: dict[str, Any] | None  # disk_repair.rebuild_index's report once rebuilt


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
            print(f"{verb}  {i.key[:12]}  {kinds.kernel_label(i)}  {i.arch}  {human_size(i.size_bytes)}  "
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
        return remove_debris(level)
    except OSError as exc:  # a read-only mount or someone else's directory: said, not a traceback
        print(f"cachectl: could not remove debris in the {level.name} level: {exc.strerror or exc}", file=sys.stderr)
        return []


def cmd_verify_or_rebuild(ctx: Context, args: Any) -> int:
    """`verify`'s handler: with --rebuild (or an option of its) the entries are recompiled and compared
    (`rebuild_check`, imported only then: it loads Triton); else `cmd_verify` (a branch there would take
    it past the complexity bound)."""
    if args.rebuild or args.sample is not None or args.all or args.allow_module:
        from cachectl import rebuild_check

        return rebuild_check.cmd(ctx, args)
    return cmd_verify(ctx, args)


def _check_index(ctx: Context, store: Store, repair: bool) -> _IndexState | None:
    """What is wrong with the local index (None: nothing, or no local directory); with `repair`, rebuilt."""
    directory = ctx.config.dir
    if directory is None:
        return None
    disk = store.disk
    index: _IndexState | None
    if store.healed_index is not None:  # --repair opens the store for writing, which rebuilt a damaged index
        index = {"problem": store.healed_index["problem"], "rebuilt": store.healed_index}
    elif not isinstance(disk, DiskLevel):
        index = {"problem": str(store.unavailable.get("disk", "unreadable")), "rebuilt": None}
    else:
        problem = disk.integrity_problem()
        index = {"problem": problem, "rebuilt": None} if problem else None
    if index is not None and index["rebuilt"] is None and repair:
        assert disk is not None  # with a directory, ctx.store() opened its entry files when the index failed
        disk.close()
        index["rebuilt"] = rebuild_index(directory, ctx.config.max_bytes, owners=store.owners,
                                         max_entry_bytes=ctx.config.max_entry_bytes, wait=ctx.config.index_timeout)
        store.replace_level("disk", DiskLevel(directory, ctx.config.max_bytes, owners=store.owners,
                                             max_entry_bytes=ctx.config.max_entry_bytes,
                                             index_timeout=ctx.config.index_timeout))
    return index


def cmd_verify(ctx: Context, args: Any) -> int:
    checked = 0
    bad: list[BadEntry] = []
    store = ctx.store()
    index = _check_index(ctx, store, args.repair) if args.level in ("all", "disk") else None
    for level in ctx.levels(args.level):
        # entries of the levels read with a signature check must carry a valid one (the local disk is ours)
        signed = store.signer.problem if store.signer is not None and level.name != "disk" else None
        n, found = verify(level, repair=args.repair, authenticate=signed)
        checked += n
        bad += found
    left = [b for b in bad if not b.repaired]
    # Entries that readers already found corrupt and moved aside (shared level); prune removes them.
    quarantined = [{**q, "path": escaped(q["path"]), "key": escaped(q["key"])}
                   for level in ctx.levels(args.level) for q in level.quarantined()]
    index_left = index is not None and index["rebuilt"] is None
    if ctx.json:
        ctx.emit_json({"checked": checked, "remaining_bad": len(left),
                       "bad": [{**b.__dict__, "key": escaped(b.key), "reason": escaped(b.reason)} for b in bad],
                       "quarantined": quarantined, "index": index})
    else:
        if index is not None:
            print(f"{'rebuilt' if index['rebuilt'] else 'BAD'}  local index ({ctx.config.dir}): {index['problem']}")
            if index["rebuilt"]:
                r = index["rebuilt"]
                listed = "an unreadable index" if r["listed"] is None else f"{r['listed']} listed in the index"
                print(f"         found {r['value_files']} value files ({listed}): {r['recovered']} entries "
                      f"re-indexed, {r['removed']} unreadable removed, {len(r['lost'])} lost"
                      + (f"; the damaged index was kept as entries/{r['moved_aside']}" if r["moved_aside"] else ""))
                for key in r["lost"]:
                    print(f"lost  {escaped(key)}  (disk): listed in the damaged index, no readable copy")
        for b in bad:
            print(f"{'removed' if b.repaired else 'BAD'}  {escaped(b.key)}  ({b.level}): {escaped(b.reason)}")
        for q in quarantined:
            print(f"quarantined  {q['key']}  (shared): {q['path']}, removed by 'cachectl prune' after an hour")
        ctx.say(f"checked {checked} entries: {len(bad)} bad" + (f", {len(bad) - len(left)} removed" if args.repair
                                                                  else ""))
    if left or index_left:
        if not ctx.json:
            what = f"{len(left)} bad entries" + (" and a damaged index" if index_left else "")
            print(f"cachectl: {what} remain (run 'cachectl verify --repair')", file=sys.stderr)
        return EXIT_PROBLEMS
    lost = index["rebuilt"]["lost"] if index is not None and index["rebuilt"] else []
    if lost:
        if not ctx.json:
            print(f"cachectl: the index was rebuilt but {len(lost)} entries it listed are lost (they are "
                  f"built again on their next use)", file=sys.stderr)
        return EXIT_PROBLEMS
    return EXIT_OK


def cmd_clear(ctx: Context, args: Any) -> int:
    chosen = ctx.levels(args.level)
    if not args.yes:
        named = ", ".join(f"{t.name} ({_where(t)})" for t in chosen)
        others = [t.name for t in ctx.kept() if t not in chosen]
        raise CliError(f"clear removes every entry of: {named}"
                       + (f" (not {', '.join(others)}: name it with --level or pass --all-levels)" if others else "")
                       + "; pass --yes to confirm")
    store = ctx.store()
    count, size = 0, 0
    failed: list[tuple[EntryInfo, str]] = []
    for level in chosen:
        infos = scan(level)
        if level.name == "disk" and not (isinstance(level, DiskLevel) and level.writable):
            # a damaged index or a full disk: remove the files themselves, the index with them
            level.close()
            assert level.directory is not None  # the local level (its index or its files alone) is a directory
            try:
                wipe(level.directory, store.owners)
            except OSError as exc:
                failed += [(i, exc.strerror or str(exc)) for i in infos]
                continue
            count += len(infos)
            size += sum(i.size_bytes for i in infos)
            continue
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


def _where(level: KeptLevel) -> str:
    return level.location
