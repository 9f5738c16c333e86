"""cachectl verify: every entry's format, checksum and kind checked, and the local index; --repair
removes what is bad and rebuilds the index."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from cachectl import entry_kinds
from cachectl.context import EXIT_OK, EXIT_PROBLEMS, Context
from cachectl.inventory import read_raw
from kernel_cache.display import escaped
from kernel_cache.entries import entry as entry_format
from kernel_cache.entries.entry import CorruptEntry
from kernel_cache.lazy import later
from kernel_cache.level import KeptLevel
from kernel_cache.levels.disk.level import DiskLevel
from kernel_cache.levels.disk.repair import rebuild_index
from kernel_cache.store import Store

if TYPE_CHECKING:
    from cachectl.check import rebuild
else:
    rebuild = later("cachectl.check.rebuild")  # it imports Triton: loaded only for --rebuild


class _IndexState(TypedDict):
    """verify's word on the local index: what is wrong with it, and what a rebuild found."""

    problem: str
    rebuilt: dict[str, Any] | None  # disk_repair.rebuild_index's report once rebuilt

def cmd_verify_or_rebuild(ctx: Context, args: Any) -> int:
    """With --rebuild (or an option of its) the entries are recompiled and compared (`rebuild`)."""
    if args.rebuild or args.sample is not None or args.all or args.allow_module:
        return rebuild.cmd(ctx, args)
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


@dataclass
class BadEntry:
    key: str
    level: str
    reason: str
    repaired: bool = False


def verify(level: KeptLevel, repair: bool = False,
           authenticate: Callable[[bytes], str | None] | None = None) -> tuple[int, list[BadEntry]]:
    """Decode every entry (format, checksum, key; then what its kind checks: a winner's or lowered
    call's record) and, with `authenticate` (the signature readers of `level` require), its
    signature; returns (entries checked, bad entries)."""
    checked, bad = 0, []
    for rec in level.listing():
        key = rec["key"]
        checked += 1
        try:
            raw = read_raw(level, key)
            if raw is None:  # removed since listing() was read
                checked -= 1
                continue
            if authenticate is not None and (problem := authenticate(raw)) is not None:
                raise CorruptEntry(f"{problem}: readers refuse it")
            entry = entry_format.decode(raw, expected_key=key)
            if (reason := entry_kinds.problem(entry)) is not None:
                raise CorruptEntry(reason)
        except CorruptEntry as exc:
            item = BadEntry(key=key, level=level.name, reason=str(exc))
            if repair:
                item.repaired = bool(level.delete(key))
            bad.append(item)
    return checked, bad
