"""How `cachectl show` presents a shared memo record (kernel_cache.entries.memo_entry): which memo, of which
files as the node that wrote it saw them, and its text."""

from __future__ import annotations

from cachectl.inventory import EntryInfo
from cachectl.render import human_size, human_time
from cachectl.show_views import ShowArgs, say_unreadable
from kernel_cache.entries.entry import Entry
from kernel_cache.entries.memo_entry import TEXT_BLOB, problem

_SHOWN_CHARS = 200  # of the text, without -v


def show(entry: Entry, info: EntryInfo, args: ShowArgs) -> None:
    """`cachectl show KEY` of a memo record: its name, the files' identity and its text."""
    print(f"key          {entry.key}  ({info.level})")
    why = problem(entry)
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
    shown = text if args.verbose or len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "... (-v: all of it)"
    print(f"text         {shown!r}")
    print(f"recorded     {human_time(info.created)}   last used {human_time(info.last_used)}   "
          f"size {human_size(info.size_bytes)}")
