"""cachectl show: one entry's key, then its metadata as the view its kind names renders it
(`EntryKind.show`, "module:function", imported when show runs); the views of the kinds this version
writes are here."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import Any, cast

from cachectl import entry_kinds
from cachectl.context import EXIT_OK, EXIT_PROBLEMS, CliError, Context
from cachectl.entry_kinds import EntryKind
from cachectl.inventory import EntryInfo, find_by_prefix, read_raw, scan_all
from cachectl.render import human_size, human_time, milliseconds, table
from kernel_cache.entries import entry as entry_format
from kernel_cache.entries.call_entry import CallRecord
from kernel_cache.entries.entry import Entry
from kernel_cache.entries.memo_entry import TEXT_BLOB
from kernel_cache.entries.memo_entry import problem as memo_problem
from kernel_cache.entries.summary import EntrySummary
from kernel_cache.entries.warm_set import members_of, signed_of
from kernel_cache.entries.winner_entry import Winner

_MEMBERS = 12  # a warm set's members listed without -v
_MEMO_CHARS = 200  # of a memo's text, without -v


@dataclass(frozen=True)
class ShowArgs:
    """What a view may need beyond the entry: its hit count, the keys the cache holds (to say
    which of a record's kernels are still cached), and -v."""

    hits: int
    cached: Container[str]
    verbose: bool


View = Callable[[Entry, EntryInfo, ShowArgs], None]


def say_unreadable(label: str, why: object) -> None:
    """A view's line for an entry its kind cannot read, with the command that repairs the cache."""
    print(f"{label:<12} unreadable: {why} (run 'cachectl verify --repair')")


def view(kind: EntryKind) -> View:
    """The function that renders `show` of an entry of `kind`."""
    module, _, function = kind.show.partition(":")
    return cast(View, getattr(importlib.import_module(module), function))


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
    print(f"key          {entry.key}  ({info.level})")
    view(entry_kinds.kind_of(entry.meta))(entry, info, ShowArgs(hits=hits, cached={i.key for i in infos}, verbose=ctx.verbose))
    return EXIT_OK


def show_kernel(entry: Entry, info: EntryInfo, args: ShowArgs) -> None:
    """A kernel (and an entry of a kind this version does not know); with -v its whole metadata too."""
    meta, summary = entry.meta, EntrySummary.from_meta(entry.meta)
    blobs = {name: len(data) for name, data in sorted(entry.blobs.items())}
    print(f"kernel       {summary.kernel}")
    print(f"arch         {summary.arch}  warps={meta.get('num_warps')} stages={meta.get('num_stages')}"
          f" ctas={meta.get('num_ctas')} shared_mem={meta.get('shared_mem')}")
    print(f"toolchain    {summary.toolchain or '?'}")
    print(f"compiled     {human_time(summary.created)} in {summary.compile_seconds:.3f} s")
    print(f"last used    {human_time(info.last_used)}   hits {args.hits}")
    print(f"size         {human_size(info.size_bytes)}  blobs: "
          + ", ".join(f"{n} {human_size(s)}" for n, s in blobs.items()))
    recipe = summary.recipe
    if not recipe:
        print("recipe       none (the entry records no recipe; prewarm cannot rebuild it)")
    for n, (field, value) in enumerate(sorted((recipe or {}).items())):
        shown = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        print(f"{'recipe' if n == 0 else '':<13}{field:<11} {shown}")
    if args.verbose:
        print("metadata     " + json.dumps(meta, indent=2, sort_keys=True).replace("\n", "\n             "))


def show_call(entry: Entry, info: EntryInfo, args: ShowArgs) -> None:
    """A lowered-call record: the call it serves, its kernels (still cached beside it or not: it keeps
    its own copy) and its payload, or the winner it points at."""
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


def show_winner(entry: Entry, info: EntryInfo, args: ShowArgs) -> None:
    """An autotune winner: what it is for, which config won, every config's time."""
    try:
        record = Winner.from_meta(entry.meta)
    except ValueError as exc:
        say_unreadable("winner", exc)
        return
    print(f"winner of    {record.kernel} (autotuned, {len(record.configs)} configs)")
    print(f"gpu          {record.device}  arch {record.arch}")
    print(f"key values   {record.key_text}")
    print(f"toolchain    {record.toolchain or '?'}")
    print(f"tuned        {human_time(record.tuned_at)} on {record.label or '?'}, median of {record.reps} runs each")
    print(f"last used    {human_time(info.last_used)}   hits {args.hits}   size {human_size(info.size_bytes)}")
    rows = [["", "MEDIAN", "CONFIG", "KERNEL KEY"]]
    for n, c in enumerate(record.configs):
        rows.append(["->" if n == record.winner else "", milliseconds(c.seconds) if c.seconds is not None else "failed",
                     c.description + (f"  ({c.error})" if c.error else ""), c.key[:12]])
    print("\n".join(table(rows, right={1})))


def show_memo(entry: Entry, info: EntryInfo, args: ShowArgs) -> None:
    """A memo record: its name, the files' identity as the node that wrote it saw them, and its text."""
    why = memo_problem(entry)
    if why is not None:
        say_unreadable("memo", why)
        return
    identity = entry.meta["identity"]
    files = [part for part in identity if isinstance(part, list) and part and isinstance(part[0], str)] \
        if isinstance(identity, list) else []
    text = entry.blobs[TEXT_BLOB].decode()
    print(f"memo         {entry.meta['name']} (what a fresh node reads instead of deriving it)")
    for part in files:
        print(f"file         {part[0]}")
    shown = text if args.verbose or len(text) <= _MEMO_CHARS else text[:_MEMO_CHARS] + "... (-v: all of it)"
    print(f"text         {shown!r}")
    print(f"recorded     {human_time(info.created)}   last used {human_time(info.last_used)}   "
          f"size {human_size(info.size_bytes)}")


def show_warm_set(entry: Entry, info: EntryInfo, args: ShowArgs) -> None:
    """A warm set: the program's first ask and its members in the order the program read them, each
    still held beside it or not (a member no longer held is never served from the set)."""
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
    shown = list(members.items()) if args.verbose else list(members.items())[:_MEMBERS]
    for key, member in shown:
        kind = str(member.meta.get("kind", "?"))
        print(f"member       {key[:12]}  {kind:<14} {human_size(member.size)}"
              f"{'' if key in args.cached else ' (not held: not served)'}")
    if len(shown) < len(members):
        print(f"             ... {len(members) - len(shown)} more (-v: all of them)")
    print(f"recorded     {human_time(info.created)}   last used {human_time(info.last_used)}   "
          f"size {human_size(info.size_bytes)}")
