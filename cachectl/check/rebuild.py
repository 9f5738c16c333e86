"""cachectl verify --rebuild: recompile kernel entries from their recipes and compare the bytes.

A signature says who wrote an entry, not that it is right. A kernel is deterministic for its key and
toolchain (measured: two compiles of each example kernel, Triton 3.9, differ only in
`compile_seconds`), so each chosen entry is rebuilt from its recorded recipe (the store untouched),
the recipe's key checked against the entry's, and the blobs and the metadata a launcher reads
compared byte for byte; `--repair` writes the rebuild over an entry that differs. Triton writes the
kernel's source path into the ttir, ptx and cubin, which the (portable) key does not cover: a
kernel installed at another path gives the same key and other bytes, a mismatch that names both
paths. As in prewarm, only modules matched by --allow-module are imported (`recipes`), and never a
kernel defined in a script.
"""

from __future__ import annotations

import json
import random
import re
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from cachectl import entry_kinds
from cachectl.context import EXIT_OK, EXIT_PROBLEMS, CliError, Context
from cachectl.inventory import EntryInfo, breakdown, counts, read_raw, scan_all
from cachectl.render import shown
from cachectl.warm import recipes
from cachectl.warm.progress import Outcome, Progress
from compiler import CompileError, RecipeError, compile_spec, content_key, from_recipe
from compiler.artifact import DEFLATED
from kernel_cache.entries import entry as entry_format
from kernel_cache.entries.entry import CorruptEntry, Entry
from kernel_cache.entries.summary import META_COMPILE_SECONDS, META_CREATED, META_RECIPE, EntrySummary
from kernel_cache.levels.protocols import KeptLevel
from kernel_cache.store import Store

DEFAULT_SAMPLE = 20  # entries checked when neither --sample nor --all is given: a few seconds of compiles
OTHER_TOOLCHAIN = "built by another toolchain"
# Metadata two compiles of one spec legitimately disagree on (every other field is compared): when the
# store wrote the entry, how long that compile took (the one field the experiment saw differ), and the
# recipe the rebuild came from, which is checked through the key instead (it gave this key).
NOT_COMPARED = (META_CREATED, META_COMPILE_SECONDS, META_RECIPE)
_SOURCE_PATH = re.compile(rb'loc\("([^"\n]+)":\d+:\d+\)|\.file\s+\d+\s+"([^"\n]+)"')  # ttir's locs, ptx's .file


@dataclass
class Check:
    """One kernel entry under verify --rebuild."""

    key: str
    level: str
    kernel: str
    arch: str
    status: str  # "equal", "mismatch", "failed" (could not rebuild or read), "skipped"
    reason: str = ""
    differs: list[str] = field(default_factory=list[str])  # blob names, "meta.FIELD", or "key"
    module: str = ""  # the kernel's module (for a skip: the one not allowed)
    seconds: float = 0.0
    repaired: bool = False

    def outcome(self) -> Outcome:  # what prewarm's progress display shows
        return Outcome(self.kernel, self.arch, self.status, key=self.key, seconds=self.seconds,
                       error=self.reason, module=self.module)


@dataclass
class Rebuilt:
    """What the recipe gives: its key, and when that is the entry's, the compiled entry."""

    key: str
    meta: dict[str, Any] = field(default_factory=dict[str, Any])
    blobs: dict[str, bytes] = field(default_factory=dict[str, bytes])


Candidate = tuple[EntryInfo, dict[str, Any], str]  # (entry, its recipe, the kernel's module)


def cmd(ctx: Context, args: Any) -> int:
    if not args.rebuild:
        raise CliError("--sample, --all and --allow-module go with --rebuild (see 'cachectl verify --help')")
    start = time.perf_counter()
    levels = {t.name: t for t in ctx.levels(args.level)}
    progress = Progress(ctx)
    infos = scan_all(ctx, list(levels.values()), with_stale=True)  # stale: built by another toolchain
    candidates, skipped, others = plan(infos, recipes.module_filter(args.allow_module))
    for check in skipped:
        progress(check.outcome())
    chosen = candidates if args.all else random.sample(candidates, min(len(candidates), args.sample or DEFAULT_SAMPLE))
    chosen.sort(key=lambda c: (c[0].kernel, c[0].arch, c[0].key, c[0].level))
    progress.expect(len(chosen))
    checks: list[Check] = []
    rebuilds: dict[str, Rebuilt | str] = {}  # by key: a key in two levels is compiled once
    try:
        for info, recipe, module in chosen:
            check = check_entry(levels[info.level], info, recipe, module, rebuilds)
            if check.status == "mismatch" and args.repair:
                repair(ctx.store(), levels[info.level], check, rebuilds[info.key])
            (skipped if check.status == "skipped" else checks).append(check)  # skipped: gone since listed
            progress(check.outcome())
    finally:
        progress.finish()
    return _report(ctx, args, checks, skipped, others, len(candidates) - len(chosen), time.perf_counter() - start)


def plan(infos: list[EntryInfo], allowed: Any) -> tuple[list[Candidate], list[Check], list[EntryInfo]]:
    """(entries that can be compared, kernel entries skipped with the reason, entries of other kinds
    or unreadable ones). Nothing is imported here: module names are read from the recipes."""
    candidates: list[Candidate] = []
    skipped, others = [], []
    for info in infos:
        if info.error or info.kind != entry_kinds.KERNEL.name:
            others.append(info)  # lowered-call records and winners have no recipe; plain verify reads the rest
            continue
        recipe = EntrySummary.from_meta(info.meta).recipe
        check = Check(info.key, info.level, shown(info.kernel), shown(info.arch), "skipped")
        if recipe is None:
            check.reason = "records no recipe"
        elif info.stale is None:
            check.reason = "its toolchain is not installed here (no backend for its target)"
        elif info.stale:
            check.reason = f"{OTHER_TOOLCHAIN} ({shown(info.toolchain)})"
        else:
            try:
                refused = recipes.refusal(recipe, allowed, "verify --rebuild")
            except recipes.MalformedRecipe as exc:
                refused = str(exc), ""
            if refused is None:
                candidates.append((info, recipe, recipes.recipe_modules(recipe)[0]))
                continue
            check.reason, check.module = refused
        skipped.append(check)
    return candidates, skipped, others


def check_entry(level: KeptLevel, info: EntryInfo, recipe: dict[str, Any], module: str,
                rebuilds: dict[str, Rebuilt | str]) -> Check:
    """Rebuild `info`'s recipe (once per key) and compare it with the entry `level` holds."""
    start = time.perf_counter()
    check = Check(info.key, info.level, shown(info.kernel), shown(info.arch), "failed", module=module)
    try:
        raw = read_raw(level, info.key)
        if raw is None:
            check.status, check.reason = "skipped", "removed since the listing was read"
            return check
        stored = entry_format.decode(raw, expected_key=info.key)
    except CorruptEntry as exc:
        check.reason = f"unreadable: {exc} (see 'cachectl verify')"
        return check
    rebuilt = rebuilds[info.key] = rebuilds.get(info.key) or rebuild(recipe, info.key)
    check.seconds = time.perf_counter() - start
    if isinstance(rebuilt, str):
        check.reason = rebuilt
    elif rebuilt.key != info.key:
        check.status, check.differs = "mismatch", ["key"]
        check.reason = (f"the recipe does not give this key (it gives {rebuilt.key[:12]}): the entry is not what "
                        f"its recipe builds, or was built under TRITON_* settings this shell lacks")
    else:
        check.differs = differences(stored, rebuilt)
        check.status = "mismatch" if check.differs else "equal"
        if check.differs:
            check.reason = ", ".join(check.differs) + " differ from the rebuild" + _path_note(stored.blobs, rebuilt.blobs)
    return check


def rebuild(recipe: dict[str, Any], key: str) -> Rebuilt | str:
    """The recipe rebuilt without touching the store (only its key when that is not `key`), or why not."""
    try:
        spec = from_recipe(recipe)
        got = content_key(spec)
        if got != key:
            return Rebuilt(got)
        meta, blobs = compile_spec(spec).to_entry()
    except Exception as exc:  # also a recipe that no longer matches its kernel's signature, say
        first = shown(next(iter(str(exc).splitlines()), ""), 300)  # it may quote the recipe: cache content
        return "cannot rebuild: " + (first if isinstance(exc, (RecipeError, CompileError)) else f"{type(exc).__name__}: {first}")
    return Rebuilt(key, json.loads(json.dumps(meta)), blobs)  # metadata as the entry keeps it (JSON)


def differences(stored: Entry, rebuilt: Rebuilt) -> list[str]:
    """The blobs, then the metadata fields ("meta.NAME"), in which `stored` is not `rebuilt`."""
    found = []
    for name in sorted(set(stored.blobs) | set(rebuilt.blobs)):
        if name.endswith(DEFLATED) and name not in stored.blobs:
            continue  # older writers kept no deflate runs: a launcher then deflates the blob (compared) itself
        if stored.blobs.get(name) != rebuilt.blobs.get(name):
            found.append(shown(name, 40))
    for name in sorted((set(stored.meta) | set(rebuilt.meta)) - set(NOT_COMPARED)):
        if stored.meta.get(name) != rebuilt.meta.get(name):
            found.append("meta." + shown(name, 40))
    return found


def _path_note(stored: dict[str, bytes], rebuilt: dict[str, bytes]) -> str:
    """Why a mismatch may be no tampering: the entry names other kernel source files than the rebuild."""
    theirs, ours = ({(m.group(1) or m.group(2)).decode(errors="replace") for name in ("ttir", "ptx")
                     for m in _SOURCE_PATH.finditer(blobs.get(name, b""))} for blobs in (stored, rebuilt))
    if not theirs or theirs == ours:
        return ""
    return (f"; the entry was compiled from {shown(min(theirs - ours, default='?'))}, this rebuild from "
            f"{shown(min(ours - theirs, default='?'))}: Triton writes the kernel's source path into the ttir, "
            f"ptx and cubin, so a kernel installed at another path never compares equal")


def repair(store: Store, level: KeptLevel, check: Check, rebuilt: Rebuilt | str) -> None:
    """Write the rebuild over the entry in `level`: encoded by the store, so signed with the configured
    key as every entry it writes. Sets `check.repaired`, or says in `check.reason` why not."""
    if isinstance(rebuilt, str) or rebuilt.key != check.key:
        check.reason += "; not replaced: no rebuild gives this key"
        return
    if not level.writable:
        check.reason += f"; not replaced: the {level.name} level is read-only here"
        return
    data = store.encode(Entry(check.key, {**rebuilt.meta, META_CREATED: time.time()}, dict(rebuilt.blobs)))
    try:
        level.put_raw(check.key, data)
        if read_raw(level, check.key) != data:
            # A level whose put keeps an entry already there (the remote writes with SET NX, so two
            # racing writers never replace each other's entry): remove the wrong one, then put.
            level.delete(check.key)
            level.put_raw(check.key, data)
        check.repaired = read_raw(level, check.key) == data
    except Exception as exc:  # a full disk, a read-only mount, a server fault: said, the next entry tried
        check.reason += f"; not replaced: {type(exc).__name__}: {exc}"
        return
    if not check.repaired:
        check.reason += f"; not replaced: the {level.name} level kept the entry it had"


def _report(ctx: Context, args: Any, checks: list[Check], skipped: list[Check], others: list[EntryInfo],
            not_sampled: int, seconds: float) -> int:
    bad = [c for c in checks if c.status in ("mismatch", "failed")]
    left = [c for c in bad if not c.repaired]
    count = Counter(c.status for c in checks)
    if ctx.json:
        ctx.emit_json({"checked": len(checks), "equal": count["equal"], "mismatched": count["mismatch"],
                       "failed": count["failed"], "repaired": sum(c.repaired for c in checks),
                       "remaining_bad": len(left), "skipped": len(skipped), "not_sampled": not_sampled,
                       "not_rebuilt": counts(others), "sample": None if args.all else args.sample or DEFAULT_SAMPLE,
                       "allowed_modules": args.allow_module, "seconds": seconds,
                       "entries": [asdict(c) for c in checks + skipped]})
        return EXIT_PROBLEMS if left else EXIT_OK
    for c in bad:
        print(f"{'replaced' if c.repaired else c.status.upper()}  {c.key[:12]}  {c.kernel}  {c.arch}  ({c.level}): "
              f"{c.reason}", file=sys.stderr if not c.repaired else sys.stdout)
    if not ctx.quiet:
        _report_skipped(skipped, ctx.verbose)
    if not checks and any(c.module for c in skipped) and not args.allow_module:
        ctx.say("no --allow-module given: rebuilding a recipe imports the module it names, which whoever "
                "wrote the cache chose, so nothing was rebuilt; pass --allow-module PATTERN (e.g. 'mylib.*') "
                "for the kernel modules you trust")
    text = (f"compared {_entries(len(checks), 'kernel ')}" + (" chosen at random" if not_sampled else "")
            + f" with their rebuild: {count['equal']} equal, {count['mismatch']} differ"
            + (f" ({sum(c.repaired for c in checks)} replaced)" if args.repair else "")
            + f", {count['failed']} failed")
    if not_sampled:
        text += f"; {not_sampled} more not sampled (--all checks every one)"
    if skipped:
        why = Counter("module not allowed" if c.module else "another toolchain" if _other_toolchain(c)
                      else "no recipe" if c.reason == "records no recipe"
                      else "kernel not importable" if recipes.NO_IMPORT in c.reason else "other" for c in skipped)
        text += f"; skipped {len(skipped)} (" + ", ".join(f"{n} {w}" for w, n in sorted(why.items())) + ")"
    if others:
        text += f"; not rebuilt: {breakdown(others)}"
    ctx.say(text + f" in {seconds:.1f} s")
    if left:
        print(f"cachectl: {_entries(len(left), 'kernel ')} left that this toolchain does not rebuild from the recipe"
              + ("" if args.repair else " ('cachectl verify --rebuild --repair' replaces those that differ)"), file=sys.stderr)
    return EXIT_PROBLEMS if left else EXIT_OK


def _entries(n: int, what: str = "") -> str:
    """'1 kernel entry', '3 kernel entries'."""
    return f"{n} {what}entry" if n == 1 else f"{n} {what}entries"


def _other_toolchain(check: Check) -> bool:
    return check.reason.startswith(OTHER_TOOLCHAIN)


def _report_skipped(skipped: list[Check], verbose: bool) -> None:
    """On stderr: each skip with -v; else one line per module not allowed, one for the entries of other
    toolchains, one per kernel no import finds, and each other skip (no recipe, a malformed one)."""
    grouped = Counter(c.module or OTHER_TOOLCHAIN for c in skipped if not verbose and (c.module or _other_toolchain(c)))
    for name, n in sorted(grouped.items()):  # a module name has no spaces: never OTHER_TOOLCHAIN
        print(f"SKIPPED  {_entries(n)} " + (f"{name}: only the installed one's entries can be compared (-v names "
              f"them)" if name == OTHER_TOOLCHAIN else f"of module '{name}': not allowed (check them with "
              f"--allow-module '{name}')"), file=sys.stderr)
    unreachable = Counter(c.reason for c in skipped if not verbose and recipes.NO_IMPORT in c.reason)
    for reason, n in unreachable.items():  # one line per kernel defined in a script, whatever its entries
        print(f"SKIPPED  {_entries(n)}: {reason}", file=sys.stderr)
    for c in skipped:
        if verbose or not (c.module or _other_toolchain(c) or c.reason in unreachable):
            print(f"SKIPPED  {c.key[:12]}  {c.kernel}  {c.arch}  ({c.level}): {c.reason}", file=sys.stderr)
