"""How list and show present persisted autotune winners (`cachectl tune`)."""

from __future__ import annotations

from cachectl import entry_kinds
from cachectl.inventory import EntryInfo
from cachectl.render import human_size, human_time, table
from cachectl.show_views import ShowArgs, say_unreadable
from kernel_cache.entries.entry import Entry
from kernel_cache.entries.winner_entry import Winner


def list_block(infos: list[EntryInfo], verbose: bool) -> list[str]:
    """After list's table: one line per winner (kernel, GPU model, key values, winning config, time)."""
    rows = [(i, i.kind_summary) for i in infos if i.kind == entry_kinds.WINNER.name and i.kind_summary is not None]
    if not rows:
        return []
    lines = ["", "autotune winners (cachectl tune):"]
    for info, w in rows:
        lines.append(f"  {info.key if verbose else info.key[:12]}  {info.kernel} on {w['device']} [{w['key_values']}]: "
                     f"{w['config']}  {_ms(w['seconds'])} (slowest of {w['configs']}: {_ms(w['slowest_seconds'])})")
    return lines


def show(entry: Entry, info: EntryInfo, args: ShowArgs) -> None:
    """`cachectl show KEY` of a winner: what it is for, which config won, every config's time."""
    try:
        record = Winner.from_meta(entry.meta)
    except ValueError as exc:
        print(f"key          {entry.key}  ({info.level})")
        say_unreadable("winner", exc)
        return
    print(f"key          {entry.key}  ({info.level})")
    print(f"winner of    {record.kernel} (autotuned, {len(record.configs)} configs)")
    print(f"gpu          {record.device}  arch {record.arch}")
    print(f"key values   {record.key_text}")
    print(f"toolchain    {record.toolchain or '?'}")
    print(f"tuned        {human_time(record.tuned_at)} on {record.label or '?'}, median of {record.reps} runs each")
    print(f"last used    {human_time(info.last_used)}   hits {args.hits}   size {human_size(info.size_bytes)}")
    rows = [["", "MEDIAN", "CONFIG", "KERNEL KEY"]]
    for n, c in enumerate(record.configs):
        rows.append(["->" if n == record.winner else "", _ms(c.seconds) if c.seconds is not None else "failed",
                     c.description + (f"  ({c.error})" if c.error else ""), c.key[:12]])
    print("\n".join(table(rows, right={1})))


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms"
