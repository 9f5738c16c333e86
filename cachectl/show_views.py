"""Which function renders `cachectl show` of an entry: the one its kind names in the core's registry
(`entry_kinds`, as "module:function": the core may not import cachectl), imported when show runs,
each called with the same arguments."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import cast

from cachectl.entry_kinds import EntryKind
from cachectl.inventory import EntryInfo
from kernel_cache.entries.entry import Entry


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
