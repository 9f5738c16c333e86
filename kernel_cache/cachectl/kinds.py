"""Entry kinds as cachectl names them: the tag in list's KERNEL column, and the per-kind count of
list's and stats' totals. Beside its kernels a store holds entries that are not kernels (lowered-call
records, autotune winners); an operator counting kernels must be able to tell them apart."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from .. import call_records, winners
from ..maintenance import EntryInfo
from .render import human_size

KERNEL = "triton-kernel"  # compiler.artifact.KIND, not imported: list and stats start without Triton
UNREADABLE, OTHER = "unreadable", "other"
_TAGS = {call_records.KIND: "call", winners.KIND: "winner"}
# (kind, one, many) in the order totals name them
_NOUNS = ((KERNEL, "kernel", "kernels"), (call_records.KIND, "lowered call", "lowered calls"),
          (winners.KIND, "winner", "winners"), (OTHER, "other", "others"), (UNREADABLE, "unreadable", "unreadable"))


def kernel_label(info: EntryInfo) -> str:
    """The KERNEL column: `add_kernel`, `add_kernel [call]`, `matmul_kernel [winner]`."""
    if info.error:
        return f"<corrupt: {info.error}>"
    tag = _TAGS.get(info.kind)
    return f"{info.kernel} [{tag}]" if tag else info.kernel


def counts(infos: Iterable[EntryInfo]) -> dict[str, int]:
    """Entries per kind; an unreadable entry counts as "unreadable", a kind this version does not
    know (a newer writer's) as "other"."""
    known = {kind for kind, _, _ in _NOUNS}
    found = Counter(UNREADABLE if i.error else i.kind if i.kind in known else OTHER for i in infos)
    return {kind: found[kind] for kind, _, _ in _NOUNS if found[kind]}


def breakdown(infos: Iterable[EntryInfo]) -> str:
    """'14 kernels, 9 lowered calls' (empty for no entries)."""
    found = counts(infos)
    return ", ".join(f"{n} {one if n == 1 else many}" for kind, one, many in _NOUNS if (n := found.get(kind, 0)))


def total_line(infos: list[EntryInfo]) -> str:
    """list's last line: '23 entries (14 kernels, 9 lowered calls), 852.8 KiB'. It starts with
    'N entries' as it always did, for scripts that read it."""
    detail = breakdown(infos)
    return (f"{len(infos)} entries" + (f" ({detail})" if detail else "")
            + f", {human_size(sum(i.size_bytes for i in infos))}")
