"""Entry kinds as list and stats name them: the tag in list's KERNEL column, and the per-kind count of
list's and stats' totals. Beside its kernels a store holds entries that are not kernels (lowered-call
records, autotune winners); an operator counting kernels must be able to tell them apart. Tags, nouns
and their order come from the core's registry (`entry_kinds`), so a kind registered there is named here."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from .. import entry_kinds
from ..entry_kinds import EntryKind
from ..inventory import EntryInfo
from .render import human_size

KERNEL = entry_kinds.KERNEL.name  # the kernel kind, as prewarm's and programs' own checks name it


def kind(info: EntryInfo) -> EntryKind:
    """The entry's kind: UNREADABLE for unreadable metadata, OTHER for a kind this version does not
    know (a newer writer's)."""
    return entry_kinds.UNREADABLE if info.error else entry_kinds.named(info.kind)


def kernel_label(info: EntryInfo) -> str:
    """The KERNEL column: `add_kernel`, `add_kernel [call]`, `matmul_kernel [winner]`."""
    if info.error:
        return f"<corrupt: {info.error}>"
    found = kind(info)
    return f"{info.kernel} [{found.tag}]" if found.tagged else info.kernel


def counts(infos: Iterable[EntryInfo]) -> dict[str, int]:
    """Entries per kind name, in the registry's order; an unreadable entry counts as "unreadable",
    a kind this version does not know as "other"."""
    found = Counter(kind(i).name for i in infos)
    return {k.name: found[k.name] for k in entry_kinds.every() if found[k.name]}


def breakdown(infos: Iterable[EntryInfo]) -> str:
    """'14 kernels, 9 lowered calls' (empty for no entries)."""
    found = counts(infos)
    return ", ".join(f"{n} {k.one if n == 1 else k.many}" for k in entry_kinds.every() if (n := found.get(k.name, 0)))


def total_line(infos: list[EntryInfo]) -> str:
    """list's last line: '23 entries (14 kernels, 9 lowered calls), 852.8 KiB'. It starts with
    'N entries' as it always did, for scripts that read it."""
    detail = breakdown(infos)
    return (f"{len(infos)} entries" + (f" ({detail})" if detail else "")
            + f", {human_size(sum(i.size_bytes for i in infos))}")
