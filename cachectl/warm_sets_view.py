"""How `cachectl show` presents a warm set (kernel_cache.entries.warm_set): the program's first ask, how
many members a call's signature names, and its members in the order the program read them, each
said to be still held beside it or not (a member the local index no longer holds is never served
from the set)."""

from __future__ import annotations

from cachectl.inventory import EntryInfo
from cachectl.render import human_size, human_time
from cachectl.show_views import ShowArgs, say_unreadable
from kernel_cache.entries.entry import Entry
from kernel_cache.entries.warm_set import members_of, signed_of

_SHOWN = 12  # members listed without -v


def show(entry: Entry, info: EntryInfo, args: ShowArgs) -> None:
    """`cachectl show KEY` of a warm set; `args.cached`: the keys the cache holds."""
    print(f"key          {entry.key}  ({info.level})")
    try:
        members = members_of(entry)  # its shape checked, as `warm_set.problem` checks it
    except ValueError as exc:
        say_unreadable("warm set", exc)
        return
    held = sum(1 for key in members if key in args.cached)
    signed = signed_of(entry)
    count = len(members)
    print(f"warm set     of the programs whose first ask is {entry.meta['first'][:12]}: {count} "
          f"member{'' if count == 1 else 's'}, {held} still held; {len(signed)} served by their call's signature")
    shown = list(members.items()) if args.verbose else list(members.items())[:_SHOWN]
    for key, member in shown:
        kind = str(member.meta.get("kind", "?"))
        print(f"member       {key[:12]}  {kind:<14} {human_size(member.size)}"
              f"{'' if key in args.cached else ' (not held: not served)'}")
    if len(shown) < len(members):
        print(f"             ... {len(members) - len(shown)} more (-v: all of them)")
    print(f"recorded     {human_time(info.created)}   last used {human_time(info.last_used)}   "
          f"size {human_size(info.size_bytes)}")
