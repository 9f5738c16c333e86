"""What cachectl does to a store's entries, without printing: list, count, select, prune, verify.
Knows nothing of Triton: whether an entry is stale is the context's to say."""

from __future__ import annotations

import fnmatch
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from cachectl import entry_kinds, notices
from cachectl.context import Context
from cachectl.entry_kinds import EntryKind
from kernel_cache.entries import entry as entry_format
from kernel_cache.entries import warm_set
from kernel_cache.entries.entry import CorruptEntry
from kernel_cache.entries.summary import EntrySummary
from kernel_cache.errors import LevelUnavailable
from kernel_cache.levels.protocols import KeptLevel

SORT_KEYS = ("last_used", "created", "size", "kernel", "arch", "hits", "key")


@dataclass
class EntryInfo:
    """One cached entry as listings show it (metadata only; blobs are not kept)."""

    key: str
    level: str
    kernel: str
    arch: str
    size_bytes: int
    created: float
    last_used: float
    hits: int = 0
    toolchain: str = ""
    compile_seconds: float = 0.0
    has_recipe: bool = False
    stale: bool | None = None  # None: not checked, or the target's toolchain is not installed
    error: str = ""  # non-empty: the metadata could not be read
    kind: str = ""  # what the entry's metadata says it is: "triton-kernel", "lowered-call", ... (entry_kinds)
    kind_summary: dict[str, Any] | None = None  # its kind's summary, if the kind has one (a winner's, a call's)
    config: str = ""  # a kernel's constexprs, warps, stages: what tells one kernel's entries apart (summary)
    module: str = ""  # a kernel's module, from its recipe
    meta: dict[str, Any] = field(default_factory=dict[str, Any], repr=False)

    @property
    def entry_kind(self) -> EntryKind:
        """UNREADABLE for unreadable metadata, OTHER for a kind this version does not know."""
        return entry_kinds.UNREADABLE if self.error else entry_kinds.named(self.kind)

    @property
    def label(self) -> str:
        """list's KERNEL column: `add_kernel`, `add_kernel [call]`, `matmul_kernel [winner]`."""
        if self.error:
            return f"<corrupt: {self.error}>"
        return f"{self.kernel} [{self.entry_kind.tag}]" if self.entry_kind.tagged else self.kernel

    def summaries(self) -> dict[str, dict[str, Any] | None]:
        """What --json gives under each summarised kind's tag ("winner", "call"): this entry's
        summary under its own kind's, None under the others'."""
        return {k.tag: self.kind_summary if k.name == self.kind else None
                for k in entry_kinds.registered() if k.summary is not None}

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("meta")
        out.pop("kind_summary")
        return {**out, **self.summaries()}


@dataclass
class EntryFilter:
    """The selection shared by list, prune and export. Unset fields match everything."""

    kernel_glob: str | None = None
    arches: frozenset[str] | None = None
    older_than_seconds: float | None = None  # not used for at least this long
    stale_only: bool = False

    @property
    def is_empty(self) -> bool:
        return (self.kernel_glob is None and self.arches is None and self.older_than_seconds is None
                and not self.stale_only)

    def matches(self, info: EntryInfo, now: float) -> bool:
        return ((self.kernel_glob is None or fnmatch.fnmatchcase(info.kernel, self.kernel_glob))
                and (self.arches is None or info.arch in self.arches)
                and (self.older_than_seconds is None or now - info.last_used >= self.older_than_seconds)
                and (not self.stale_only or info.stale is True))


def counts(infos: Iterable[EntryInfo]) -> dict[str, int]:
    """Entries per kind name, in the registry's order ("unreadable", "other" included)."""
    found = Counter(i.entry_kind.name for i in infos)
    return {k.name: found[k.name] for k in entry_kinds.every() if found[k.name]}


def breakdown(infos: Iterable[EntryInfo]) -> str:
    """'14 kernels, 9 lowered calls' (empty for no entries)."""
    found = counts(infos)
    return ", ".join(f"{n} {k.one if n == 1 else k.many}" for k in entry_kinds.every() if (n := found.get(k.name, 0)))


def normal_arch(name: str) -> str:
    """'90', 'sm90', 'SM_90' -> 'sm_90' without importing the compiler."""
    text = name.strip().lower()
    digits = text.removeprefix("cuda:").removeprefix("sm_").removeprefix("sm")
    return f"sm_{digits}" if digits.isdigit() else text


def entry_filter(args: Any, check_stale: bool) -> EntryFilter:
    """The selection options shared by list, prune, export and prewarm."""
    arches = frozenset(normal_arch(a) for a in args.arch) if getattr(args, "arch", None) else None
    return EntryFilter(kernel_glob=getattr(args, "kernel", None), arches=arches,
                       older_than_seconds=getattr(args, "older_than", None), stale_only=check_stale)


def read_raw(level: KeptLevel, key: str) -> bytes | None:
    """The entry bytes, read without counting as a use of the entry. Raises CorruptEntry for
    what cannot be an entry (a pickled row, a symlink or FIFO at the entry's path, a giant)."""
    try:
        return level.peek_raw(key)
    except (CorruptEntry, LevelUnavailable):
        raise  # a level that fails (a remote server fault) is no entry's damage: the caller says so
    except OSError as exc:  # safefs.UnsafeFile and friends: the name holds something hostile
        raise CorruptEntry(str(exc)) from None


def scan(level: KeptLevel, hits_of: Callable[[str], int] | None = None) -> list[EntryInfo]:
    """Every entry of `level` with its metadata; unreadable entries are listed with `error` set."""
    infos = []
    for rec in level.listing():
        key = rec["key"]
        info = EntryInfo(key=key, level=level.name, kernel="?", arch="?", size_bytes=int(rec["size_bytes"]),
                         created=float(rec["created"]), last_used=float(rec["last_used"]))
        try:
            raw = read_raw(level, key)
            if raw is None:  # removed since listing() was read
                continue
            info.size_bytes = len(raw)
            meta = entry_format.peek_meta(raw)
        except CorruptEntry as exc:
            info.error = str(exc)
        else:
            info.meta = meta
            summary = EntrySummary.from_meta(meta)
            info.kernel, info.arch, info.toolchain = summary.kernel, summary.arch, summary.toolchain
            info.created = summary.created if summary.created is not None else info.created
            info.compile_seconds, info.has_recipe = summary.compile_seconds, summary.recipe is not None
            info.config, info.module = summary.config, summary.module
            info.kind, kind = str(meta.get("kind", "")), entry_kinds.kind_of(meta)
            info.kind_summary = kind.summary(meta) if kind.summary is not None else None
        if hits_of is not None:
            info.hits = hits_of(key)
        infos.append(info)
    return infos


def scan_all(ctx: Context, levels: list[KeptLevel], with_stale: bool,
             unreachable: list[tuple[KeptLevel, str]] | None = None) -> list[EntryInfo]:
    """Every entry of `levels`, with hit counts and (if asked) whether it is stale. A level that
    cannot be read (a remote server down) raises LevelUnavailable, or, given `unreachable`, is
    added there with the cause and the other levels are still listed."""
    store = ctx.store()
    infos = []
    for level in levels:
        try:
            infos += scan(level, store.stats.entry_hits)
        except LevelUnavailable as exc:
            why = notices.explained(str(exc))
            if unreachable is None:
                raise LevelUnavailable(why) from None
            unreachable.append((level, why))
    if with_stale:  # stale: built by another toolchain than the installed one
        for info in infos:
            target = EntrySummary.from_meta(info.meta).target
            current = ctx.installed_toolchain(target) if not info.error and isinstance(target, dict) else None
            info.stale = None if current is None else info.toolchain != current
    return infos


def sort_entries(infos: list[EntryInfo], by: str) -> list[EntryInfo]:
    """Sort for display; times and sizes and hits descending (newest, largest first)."""
    attr = {"size": "size_bytes"}.get(by, by)
    descending = by in ("last_used", "created", "size", "hits")
    return sorted(infos, key=lambda i: (getattr(i, attr), i.key), reverse=descending)


def find_by_prefix(infos: list[EntryInfo], prefix: str) -> EntryInfo:
    """The one entry whose key starts with `prefix` (the same key in two levels counts once)."""
    prefix = prefix.strip().lower()
    if not prefix:
        raise LookupError("an empty key prefix matches every entry")
    matches: dict[str, EntryInfo] = {}
    for info in infos:
        if info.key.startswith(prefix):
            matches.setdefault(info.key, info)
    if not matches:
        raise LookupError(f"no entry has a key starting with '{prefix}'")
    if len(matches) > 1:
        shown = ", ".join(sorted(k[:16] for k in matches)[:5])
        raise LookupError(f"key prefix '{prefix}' is ambiguous: {len(matches)} entries ({shown}…)")
    return next(iter(matches.values()))


def plan_prune(infos: list[EntryInfo], selection: EntryFilter, max_bytes: int | None) -> list[EntryInfo]:
    """The entries to remove from ONE level, in removal order: every entry the selection matches (when
    it is not empty), then the least recently used of the rest until the rest fits in `max_bytes`."""
    now = time.time()
    doomed = [] if selection.is_empty else [i for i in infos if selection.matches(i, now)]
    if max_bytes is not None:
        gone = {i.key for i in doomed}
        rest = sorted((i for i in infos if i.key not in gone), key=lambda i: (i.last_used, i.key))
        total = sum(i.size_bytes for i in rest)
        for info in rest:
            if total <= max_bytes:
                break
            doomed.append(info)
            total -= info.size_bytes
    return doomed + _emptied_warm_sets(infos, doomed)


def _emptied_warm_sets(infos: list[EntryInfo], doomed: list[EntryInfo]) -> list[EntryInfo]:
    """The warm sets not yet doomed that hold a copy of a doomed entry, or of one no longer in the
    level: keeping one would keep the bytes the prune frees (the next warm run writes a new one)."""
    gone = {i.key for i in doomed}
    present = {i.key for i in infos} - gone
    out = []
    for info in infos:
        if info.key in gone or info.kind != warm_set.KIND or not isinstance(info.meta, dict):
            continue
        members = {m[0] for m in info.meta.get("members", ()) if isinstance(m, list) and m}
        if members - present:
            out.append(info)
    return out


def remove_entries(level: KeptLevel, infos: Iterable[EntryInfo], forget_hits: Callable[[str], None],
                   failed: list[tuple[EntryInfo, str]]) -> int:
    """Delete the entries from `level`; returns the bytes really freed. An entry that could not be
    deleted (not yours, a read-only mount) is appended to `failed` with the reason, never counted."""
    freed = 0
    for info in infos:
        try:
            gone = level.delete(info.key)
            why = "" if gone else "not removable here (not yours, a read-only mount, or already gone)"
        except OSError as exc:
            gone, why = False, exc.strerror or str(exc)
        except Exception as exc:
            gone, why = False, f"{type(exc).__name__}: {exc}"
        if gone:
            freed += info.size_bytes
            forget_hits(info.key)
        else:
            failed.append((info, why))
    return freed
