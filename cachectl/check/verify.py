"""cachectl verify: every entry's format, checksum and kind checked; --repair removes what is bad."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cachectl import entry_kinds
from cachectl.context import EXIT_OK, EXIT_PROBLEMS, Context
from cachectl.inventory import read_raw
from kernel_cache.entries import entry as entry_format
from kernel_cache.entries.entry import CorruptEntry
from kernel_cache.lazy import later
from kernel_cache.levels.protocols import KeptLevel
from kernel_cache.sanitize import escaped

if TYPE_CHECKING:
    from cachectl.check import rebuild
else:
    rebuild = later("cachectl.check.rebuild")  # it imports Triton: loaded only for --rebuild


def cmd_verify(ctx: Context, args: Any) -> int:
    if args.rebuild or args.sample is not None or args.all or args.allow_module:
        return rebuild.cmd(ctx, args)  # rebuild.cmd refuses its options without --rebuild
    checked = 0
    bad: list[BadEntry] = []
    store = ctx.store()
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
    if ctx.json:
        ctx.emit_json({"checked": checked, "remaining_bad": len(left),
                       "bad": [{**b.__dict__, "key": escaped(b.key), "reason": escaped(b.reason)} for b in bad],
                       "quarantined": quarantined})
    else:
        for b in bad:
            print(f"{'removed' if b.repaired else 'BAD'}  {escaped(b.key)}  ({b.level}): {escaped(b.reason)}")
        for q in quarantined:
            print(f"quarantined  {q['key']}  (shared): {q['path']}, removed by 'cachectl prune' after an hour")
        ctx.say(f"checked {checked} entries: {len(bad)} bad" + (f", {len(bad) - len(left)} removed" if args.repair
                                                                  else ""))
    if left:
        if not ctx.json:
            print(f"cachectl: {len(left)} bad entries remain (run 'cachectl verify --repair')", file=sys.stderr)
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
