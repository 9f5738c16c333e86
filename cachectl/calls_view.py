"""How `cachectl show` presents a lowered-call record: which call it serves, which kernels it
launches (and whether they are still cached beside it: it keeps its own copy, so it serves
without them), and whether it holds a payload or only points at its autotune winner."""

from __future__ import annotations

from cachectl.inventory import EntryInfo
from cachectl.render import human_size, human_time
from cachectl.show_views import ShowArgs, say_unreadable
from kernel_cache.entries.call_entry import CallRecord
from kernel_cache.entries.entry import Entry


def show(entry: Entry, info: EntryInfo, args: ShowArgs) -> None:
    """`cachectl show KEY` of a record; `args.cached`: the keys the cache holds (to mark its kernels)."""
    print(f"key          {entry.key}  ({info.level})")
    try:
        record = CallRecord.from_entry(entry)
    except ValueError as exc:
        say_unreadable("lowered call", exc)
        return
    n = len(record.config_keys)
    print(f"lowered call {record.kernel}" + (f", call name {record.call_name!r}" if record.call_name else ""))
    print(f"platform     {record.platform}  arch {record.arch}")
    print(f"kernels      {n}{' (autotuned)' if record.autotuned else ''}: "
          + ", ".join(f"{k[:12]}{'' if k in args.cached else ' (not cached)'}" for k in record.config_keys))
    if record.winner_key:
        stored = "stored" if record.winner_key in args.cached else "none stored yet: 'cachectl tune' learns it"
        print(f"winner key   {record.winner_key[:12]} ({stored})")
    if record.payload is None:
        print("payload      none: no payload, it points at its winner")
    else:
        print(f"payload      {human_size(len(record.payload))} (the compressed call jaxlib launches)")
    print(f"toolchain    {record.toolchain or '?'}")
    print(f"recorded     {human_time(record.created)}; compiling its kernels took {record.compile_seconds:.3f} s")
    print(f"last used    {human_time(info.last_used)}   size {human_size(info.size_bytes)}   hits {info.hits} "
          f"(calls it served whole; its kernels count only reads of their own bytes)")

