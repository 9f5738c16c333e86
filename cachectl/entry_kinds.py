"""The kinds of entry a store holds, each registered once with everything the tools need of it, so
that no tool compares `kind` strings and a new kind is one `register` call. The kernel kind's name is
spelled here, not imported from the compiler (a test compares them); a view is named as
"module:function": the views import this registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernel_cache.entries import call_entry, memo_entry, warm_set, winner_entry
from kernel_cache.entries.entry import Entry
from kernel_cache.entries.summary import META_KIND

Check = Callable[[Entry], "str | None"]
Summarise = Callable[[dict[str, Any]], "dict[str, Any] | None"]
_VIEWS = "cachectl.see.show:show_"


@dataclass(frozen=True)
class EntryKind:
    """One kind of entry, as every tool handles it."""

    name: str  # what an entry's metadata says (`kind`); OTHER's and UNREADABLE's are no entry's
    tag: str  # short name: list's "name [tag]" where `tagged`, the Prometheus label, its summary's JSON key
    one: str  # the nouns of list's and stats' totals: "1 lowered call", "9 lowered calls"
    many: str
    # why a decoded entry of this kind is unusable (None: it is usable); by default, nothing beyond the
    # format and checksum decoding checked is the core's to check (a kernel's metadata is the compiler's)
    problem: Check = lambda entry: None
    summary: Summarise | None = None  # what list and show --json give of it under `tag` (never raises); None: no key
    show: str = _VIEWS + "kernel"  # "module:function" rendering `cachectl show` of it
    tagged: bool = True  # whether list tags it: not kernels, which the KERNEL column is named for
    legend: str = ""  # what the tag means, where the tag alone does not say (Prometheus' HELP)
    # whether an entry names the target and toolchain it was built for, as bundle import requires of
    # it (and compares with the installed toolchain). A memo names neither: its key is made of what its
    # text was derived from, and a reader takes the text only where that is its own.
    toolchain_bound: bool = True


KERNEL = EntryKind("triton-kernel", "kernel", "kernel", "kernels", tagged=False)
CALL = EntryKind(call_entry.KIND, "call", "lowered call", "lowered calls", call_entry.problem,
                 call_entry.summary, _VIEWS + "call", legend="a lowered-call record")
WINNER = EntryKind(winner_entry.KIND, "winner", "winner", "winners", winner_entry.damage, winner_entry.summary,
                   _VIEWS + "winner", legend="an autotune winner")
MEMO = EntryKind(memo_entry.KIND, "memo", "memo", "memos", memo_entry.problem, memo_entry.summary,
                 _VIEWS + "memo", toolchain_bound=False,
                 legend="a memo record (a toolchain fingerprint or a warm set's lineage)")


def _warm_set_problem(entry: Entry) -> str | None:
    """A warm set's shape (`warm_set.problem`), then each member checked as the kind it says it is."""
    why = warm_set.problem(entry)
    if why is not None:
        return why
    for key, member in warm_set.members_of(entry).items():
        why = problem(member)
        if why is not None:
            return f"warm set member {key[:12]}: {why}"
    return None


WARM_SET = EntryKind(warm_set.KIND, "warm", "warm set", "warm sets", _warm_set_problem, warm_set.summary,
                    _VIEWS + "warm_set", legend="the records one program read, kept in one entry")
# Not registered: what `kind_of` answers for a kind this version does not know (a newer writer's),
# which show presents as it does a kernel, and what counts call an entry whose metadata is unreadable.
OTHER = EntryKind("other", "other", "other", "others", tagged=False)
UNREADABLE = EntryKind("unreadable", "unreadable", "unreadable", "unreadable", tagged=False)

_REGISTERED: dict[str, EntryKind] = {}


def register(kind: EntryKind) -> EntryKind:
    """Make `kind` known to every tool; refuses a name or tag another kind has."""
    clash = [k.name for k in every() if k.name == kind.name or k.tag == kind.tag]
    if clash:
        raise ValueError(f"entry kind {kind.name!r} (tag {kind.tag!r}) clashes with {clash[0]!r}")
    _REGISTERED[kind.name] = kind
    return kind


def registered() -> tuple[EntryKind, ...]:
    """The kinds an entry can be, in the order they were registered."""
    return tuple(_REGISTERED.values())


def every() -> tuple[EntryKind, ...]:
    """What listings count and name, in the order totals name them: the registered kinds, then
    OTHER and UNREADABLE."""
    return (*_REGISTERED.values(), OTHER, UNREADABLE)


def named(name: str) -> EntryKind:
    """The registered kind called `name`; OTHER for any other name."""
    return _REGISTERED.get(name, OTHER)


def kind_of(meta: dict[str, Any]) -> EntryKind:
    """The kind an entry's metadata says it is (OTHER for none this version knows); never raises."""
    return named(str(meta.get(META_KIND, "")))


def problem(entry: Entry) -> str | None:
    """Why a decoded entry is unusable as the kind it says it is, or None. `verify` and bundle
    import both ask here, so an entry refused by one is refused by the other."""
    return kind_of(entry.meta).problem(entry)


for _kind in (KERNEL, CALL, WINNER, MEMO, WARM_SET):
    register(_kind)
