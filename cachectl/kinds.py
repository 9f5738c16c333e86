"""Entry kinds as list and stats name them: the tag in list's KERNEL column, and the per-kind count of
list's and stats' totals. Beside its kernels a store holds entries that are not kernels (lowered-call
records, autotune winners); an operator counting kernels must be able to tell them apart. Tags, nouns
and their order come from the core's registry (`entry_kinds`), so a kind registered there is named here."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable

from cachectl import entry_kinds
from cachectl.entry_kinds import EntryKind
from cachectl.inventory import EntryInfo
from cachectl.render import human_size
from kernel_cache.entries.summary import EntrySummary, config_items

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


def config_labels(infos: Iterable[EntryInfo], whole: bool = False) -> dict[str, str]:
    """list's CONFIG column, by key: a kernel's constexprs, warps and stages ('BM=64 BN=64 BK=32 w4 s3'),
    a winner's key values. Of a kernel with several entries, only what differs among them (`whole`: all
    of it; a value Triton specialised, such as a stride of 1, is the same in each). Where entries of one
    kernel and arch would still look alike, what else differs is added: the argument types
    ('*fp16,i32'), else the toolchain that built them."""
    shown = list(infos)
    items = {i.key: _config(i) for i in shown}
    labels = {key: " ".join(parts) for key, parts in items.items()}
    if not whole:
        for group in _grouped(shown, lambda i: (i.module, i.kernel, kind(i).name)):
            common = set.intersection(*(set(items[i.key]) for i in group))
            for i in group:
                labels[i.key] = " ".join([p for p in items[i.key] if p not in common] or items[i.key])
    tells: tuple[Callable[[EntryInfo], str], ...] = (
        lambda i: EntrySummary.from_meta(i.meta).signature, lambda i: i.toolchain)
    for tell in tells:  # each on the entries still alike after the one before
        for group in _grouped(shown, lambda i: (i.kernel, i.arch, kind(i).name, labels[i.key])):
            values = {i.key: tell(i) for i in group}
            if len(set(values.values())) > 1:
                for key, value in values.items():
                    labels[key] = f"{labels[key]} {value or '?'}".strip()
    return labels


def _grouped(infos: list[EntryInfo], by: Callable[[EntryInfo], tuple[str, ...]]) -> list[list[EntryInfo]]:
    """The groups of two or more distinct entries (a key in two levels is one entry) alike in `by`."""
    groups: dict[tuple[str, ...], dict[str, EntryInfo]] = defaultdict(dict)
    for i in infos:
        groups[by(i)].setdefault(i.key, i)
    return [list(g.values()) for g in groups.values() if len(g) > 1]


def _config(info: EntryInfo) -> list[str]:
    if kind(info) is entry_kinds.WINNER and info.kind_summary is not None:
        return [str(info.kind_summary.get("key_values", ""))]
    return config_items(info.meta) if kind(info) is entry_kinds.KERNEL else []
