"""cachectl: see, bound, check and warm a kernel-cache directory.

This module parses arguments and prints; the work is in maintenance (list/prune/verify), bundle
(export/import) and prewarm. Only commands that need Triton (stale checks, prewarm) import it,
so `cachectl list` starts in a fraction of a second.

Exit codes: 0 success; 1 the command ran but found or left problems (bad entries, failed builds,
rejected bundle entries); 2 it could not run (bad argument, missing directory, unknown key).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

from .config import Config, ConfigError, parse_duration, parse_size
from .warnings_once import KernelCacheWarning

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2


class CliError(Exception):
    """A one-line reason to stop, with its exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not a usage dump
        raise CliError(f"{message} (see '{self.prog} --help')")


# Argument types --------------------------------------------------------------------------
def _size(text: str) -> int:
    try:
        return parse_size(text, "size")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("size: ")) from None


def _duration(text: str) -> float:
    try:
        return parse_duration(text, "age")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("age: ")) from None


def _arch_list(text: str) -> list[str]:
    arches = [a.strip() for a in text.split(",") if a.strip()]
    if not arches:
        raise argparse.ArgumentTypeError("expected a comma-separated list like sm_80,sm_90")
    return arches


def _jobs(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of worker processes, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dir", type=Path, default=argparse.SUPPRESS,
                        help="cache directory (default: $KERNEL_CACHE_DIR)")
    common.add_argument("--shared-dir", type=Path, default=argparse.SUPPRESS,
                        help="shared multi-node cache directory (default: $KERNEL_CACHE_SHARED_DIR)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print machine-readable JSON")
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="print only data and errors")
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="print more detail (full keys, skipped kernels)")

    parser = _Parser(prog="cachectl", parents=[common],
                     description="Inspect, bound, verify and prewarm a kernel-cache directory.",
                     epilog="exit codes: 0 ok, 1 problems found or left, 2 cannot run")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def command(name, handler, help_text):
        p = sub.add_parser(name, parents=[common], help=help_text, description=help_text)
        p.set_defaults(handler=handler)
        return p

    def filters(p, tier=True):
        p.add_argument("--kernel", metavar="GLOB", help="kernel name (glob, e.g. 'matmul*')")
        p.add_argument("--arch", type=_arch_list, metavar="ARCHES", help="target arch(es), e.g. sm_90,sm_80")
        p.add_argument("--older-than", type=_duration, metavar="AGE", help="not used for AGE (e.g. 30d, 12h)")
        p.add_argument("--stale", action="store_true", help="built by another toolchain than the installed one")
        if tier:
            _tier_option(p)

    p = command("list", cmd_list, "list cached kernels")
    filters(p)
    p.add_argument("--sort", choices=_sort_keys(), default="last_used", help="sort column (default: last_used)")

    p = command("show", cmd_show, "show one entry's metadata and recipe")
    p.add_argument("key", help="key or unique key prefix")
    for blob in ("ptx", "ttir", "ttgir", "llir", "amdgcn"):
        p.add_argument(f"--{blob}", action="append_const", const=blob, dest="blobs",
                       help=f"print the stored {blob.upper()} text")

    p = command("stats", cmd_stats, "entries, bytes, hits, misses, compile time saved")
    p.add_argument("--zero", action="store_true", help="reset the counters")

    p = command("prune", cmd_prune, "remove entries (and debris of crashed writers)")
    p.add_argument("--max-size", type=_size, metavar="SIZE",
                   help="evict least recently used entries until the tier fits SIZE (e.g. 10G)")
    filters(p)
    p.add_argument("--dry-run", action="store_true", help="only print what would be removed")

    p = command("verify", cmd_verify, "check every entry's format and checksum")
    p.add_argument("--repair", action="store_true", help="remove bad entries")
    _tier_option(p)

    p = command("clear", cmd_clear, "remove every entry")
    p.add_argument("--yes", action="store_true", help="really remove everything")
    _tier_option(p)

    p = command("prewarm", cmd_prewarm, "build kernels ahead of a job, from recipes or from a program")
    p.add_argument("program", nargs="?", metavar="MODULE:FUNCTION",
                   help="lower this JAX program for cuda instead of rebuilding recipes")
    p.add_argument("--arch", type=_arch_list, metavar="ARCHES",
                   help="build for these targets (default: each recipe's own; programs: sm_90)")
    p.add_argument("--kernel", metavar="GLOB", help="only recipes of these kernels")
    p.add_argument("--allow-module", action="append", default=[], metavar="PATTERN", dest="allow_module",
                   help="rebuild recipes whose kernel module matches this glob, e.g. 'mylib.*' (repeatable); "
                        "rebuilding imports the module, so recipes of other modules are skipped, and "
                        "with none given no recipe is rebuilt")
    p.add_argument("-j", "--jobs", type=_jobs, default=os.cpu_count() or 1, metavar="N",
                   help="worker processes (default: CPU count)")

    p = command("export", cmd_export, "write selected entries to one compressed bundle")
    p.add_argument("file", type=Path)
    filters(p)

    p = command("import", cmd_import, "validate a bundle and add its entries")
    p.add_argument("file", type=Path)
    p.add_argument("--allow-stale", action="store_true", help="also import entries of other toolchains")
    p.add_argument("--tier", choices=("disk", "shared"), default="disk", help="where to put them (default: disk)")
    return parser


def _tier_option(p) -> None:
    p.add_argument("--tier", choices=("disk", "shared", "all"), default="all",
                   help="which persistent tier (default: all configured)")


def _sort_keys():
    from .maintenance import SORT_KEYS

    return SORT_KEYS


# Context: configuration, store, output --------------------------------------------------
class Context:
    def __init__(self, args):
        self.args = args
        self.json = getattr(args, "json", False)
        self.quiet = getattr(args, "quiet", False)
        self.verbose = getattr(args, "verbose", False)
        try:
            config = Config.from_env()
        except ConfigError as exc:
            raise CliError(str(exc)) from None
        directory = getattr(args, "dir", None) or config.dir
        shared = getattr(args, "shared_dir", None) or config.shared_dir
        self.config = config.with_(dir=directory, shared_dir=shared, disabled=False)
        self._store = None
        self._toolchains: dict[str, str | None] = {}
        command = getattr(args, "command", "")
        self.writes = command in ("prune", "clear", "import", "prewarm") or bool(
            getattr(args, "repair", False) or getattr(args, "zero", False))

    def store(self, create: bool = False, write: bool = False):
        """The store on --dir. Opened read-only unless the command writes, so an operator can look
        at a cache that is full, on a read-only mount or busy; a cache whose index is damaged is
        read from its entry files. A missing directory is an error unless the command fills it."""
        if self._store is None:
            directory = self.config.dir
            if directory is None:
                raise CliError("no cache directory: pass --dir DIR or set KERNEL_CACHE_DIR")
            if not create and not Path(directory).is_dir():
                raise CliError(f"no cache directory at {directory}")
            if not create and not (Path(directory) / "entries").is_dir():
                raise CliError(f"{directory} is not a kernel-cache directory (it has no entries/)")
            if self.config.shared_dir is not None and not create and not Path(self.config.shared_dir).is_dir():
                raise CliError(f"no shared cache directory at {self.config.shared_dir}")
            from .store import Store

            with warnings.catch_warnings():  # the reasons are reported here, once, as errors
                warnings.simplefilter("ignore", KernelCacheWarning)
                self._store = Store(self.config, read_only=not (create or write or self.writes))
            if self._store.disk is None:
                self._store.disk = self._disk_fallback(self._store)
            if self.config.shared_dir is not None and self._store.shared is None:
                raise CliError(f"cannot use the shared cache directory {self.config.shared_dir}: "
                               f"{self._store.unavailable.get('shared', 'unknown reason')}")
        return self._store

    def _disk_fallback(self, store):
        """When the local index cannot be opened: its entry files, read-only, with a note."""
        from .disk import ValueFilesTier
        from .errors import TierUntrusted

        reason = store.unavailable.get("disk")
        if isinstance(reason, TierUntrusted) or reason is None:
            raise CliError(str(reason or f"cannot open the cache directory {self.config.dir}"))
        try:
            tier = ValueFilesTier(self.config.dir, store.owners, self.config.max_entry_bytes)
        except Exception as exc:
            raise CliError(f"cannot open the cache directory {self.config.dir}: {reason}; {exc}") from None
        print(f"cachectl: {reason}; reading the entry files directly", file=sys.stderr)
        return tier

    def tiers(self, which: str = "all") -> list:
        store = self.store()
        chosen = [t for t in store.persistent_tiers if which in ("all", t.name)]
        if not chosen:
            raise CliError(f"no {which} tier configured (pass --shared-dir or set KERNEL_CACHE_SHARED_DIR)")
        return chosen

    def installed_toolchain(self, target: dict) -> str | None:
        """The installed toolchain's summary for `target` (imports Triton on first use)."""
        ident = json.dumps(target, sort_keys=True)
        if ident not in self._toolchains:
            try:
                from compiler.target import Target
                from compiler.toolchain import toolchain_summary

                self._toolchains[ident] = toolchain_summary(Target.from_json(target), self.config.dir)
            except Exception:
                self._toolchains[ident] = None  # backend not installed: cannot tell
        return self._toolchains[ident]

    def say(self, text: str = "") -> None:
        """Human progress and summaries; silent with --json or -q."""
        if not self.json and not self.quiet:
            print(text)

    def emit_json(self, obj) -> None:
        print(json.dumps(obj, indent=2, sort_keys=True, default=str))

    def close(self) -> None:
        if self._store is not None:
            self._store.close()


# Formatting ------------------------------------------------------------------------------
def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_time(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "-"


def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


def _entry_filter(args, check_stale: bool):
    from .maintenance import EntryFilter

    arches = frozenset(_normal_arch(a) for a in args.arch) if getattr(args, "arch", None) else None
    return EntryFilter(kernel_glob=getattr(args, "kernel", None), arches=arches,
                       older_than_seconds=getattr(args, "older_than", None), stale_only=check_stale)


def _normal_arch(name: str) -> str:
    """'90', 'sm90', 'SM_90' -> 'sm_90' without importing the compiler."""
    text = name.strip().lower()
    digits = text.removeprefix("cuda:").removeprefix("sm_").removeprefix("sm")
    return f"sm_{digits}" if digits.isdigit() else text


def _scan(ctx: Context, tiers: list, with_stale: bool) -> list:
    from .maintenance import mark_stale, scan

    store = ctx.store()
    infos = []
    for tier in tiers:
        infos += scan(tier, store.stats.entry_hits)
    if with_stale:
        mark_stale(infos, ctx.installed_toolchain)
    return infos


# Commands --------------------------------------------------------------------------------
def cmd_list(ctx: Context, args) -> int:
    from .maintenance import sort_entries

    tiers = ctx.tiers(args.tier)
    check_stale = args.stale or ctx.json or ctx.verbose
    selection = _entry_filter(args, args.stale)
    now = time.time()
    infos = sort_entries([i for i in _scan(ctx, tiers, check_stale) if selection.matches(i, now)], args.sort)
    if ctx.json:
        ctx.emit_json([i.to_json() for i in infos])
        return EXIT_OK
    show_tier = len(tiers) > 1
    header = ["KEY", "KERNEL", "ARCH", "SIZE", "CREATED", "LAST USED", "HITS"]
    header += ["TIER"] if show_tier else []
    header += ["STALE"] if check_stale else []
    rows = [header]
    for i in infos:
        row = [i.key if ctx.verbose else i.key[:12], i.kernel if not i.error else f"<corrupt: {i.error}>",
               i.arch, human_size(i.size_bytes), human_time(i.created), human_time(i.last_used), str(i.hits)]
        row += [i.tier] if show_tier else []
        row += [{True: "yes", False: "no", None: "?"}[i.stale]] if check_stale else []
        rows.append(row)
    if infos:
        print("\n".join(_table(rows, right={3, 6})))
    if not ctx.quiet:
        print(f"{len(infos)} entries, {human_size(sum(i.size_bytes for i in infos))}")
    return EXIT_OK


def cmd_show(ctx: Context, args) -> int:
    from . import entry as entry_format
    from .maintenance import find_by_prefix, read_raw

    tiers = ctx.tiers()
    try:
        info = find_by_prefix(_scan(ctx, tiers, with_stale=False), args.key)
    except LookupError as exc:
        raise CliError(str(exc)) from None
    tier = next(t for t in tiers if t.name == info.tier)
    raw = read_raw(tier, info.key)
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
    blobs = {name: len(data) for name, data in sorted(entry.blobs.items())}
    if ctx.json:
        ctx.emit_json({"key": entry.key, "tier": info.tier, "size_bytes": info.size_bytes, "hits": hits,
                       "last_used": info.last_used, "blobs": blobs, "meta": entry.meta})
        return EXIT_OK
    meta = entry.meta
    tc = meta.get("toolchain") or {}
    print(f"key          {entry.key}  ({info.tier})")
    print(f"kernel       {meta.get('name', '?')}")
    print(f"arch         {meta.get('arch', '?')}  warps={meta.get('num_warps')} stages={meta.get('num_stages')}"
          f" ctas={meta.get('num_ctas')} shared_mem={meta.get('shared_mem')}")
    print(f"toolchain    {tc.get('summary', '?')}")
    print(f"compiled     {human_time(meta.get('created'))} in {float(meta.get('compile_seconds', 0)):.3f} s")
    print(f"last used    {human_time(info.last_used)}   hits {hits}")
    print(f"size         {human_size(info.size_bytes)}  blobs: "
          + ", ".join(f"{n} {human_size(s)}" for n, s in blobs.items()))
    recipe = meta.get("recipe")
    if not recipe:
        print("recipe       none (the entry records no recipe; prewarm cannot rebuild it)")
    for n, (field, value) in enumerate(sorted((recipe or {}).items())):
        shown = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        print(f"{'recipe' if n == 0 else '':<13}{field:<11} {shown}")
    if ctx.verbose:
        print("metadata     " + json.dumps(meta, indent=2, sort_keys=True).replace("\n", "\n             "))
    return EXIT_OK


def cmd_stats(ctx: Context, args) -> int:
    store = ctx.store()
    if args.zero:
        store.stats.zero()
        ctx.say("statistics zeroed")
        if not ctx.json:
            return EXIT_OK
    infos = _scan(ctx, store.persistent_tiers, with_stale=False)
    totals = store.stats.totals()
    tiers = {}
    for tier in store.persistent_tiers:
        mine = [i for i in infos if i.tier == tier.name]
        tiers[tier.name] = {"path": str(getattr(tier, "directory", "")), "entries": len(mine),
                            "bytes": sum(i.size_bytes for i in mine)}
    created = [i.created for i in infos]
    report = {
        "dir": str(ctx.config.dir), "entries": len(infos), "bytes": sum(i.size_bytes for i in infos),
        "max_bytes": ctx.config.max_bytes, "tiers": tiers, **totals,
        "oldest": min(created) if created else None, "newest": max(created) if created else None,
    }
    if ctx.json:
        ctx.emit_json(report)
        return EXIT_OK
    hits = report["hits"]
    lookups = sum(hits.values()) + report["misses"]
    rate = f" ({100 * sum(hits.values()) / lookups:.1f}% hit rate)" if lookups else ""
    print(f"cache directory      {report['dir']}")
    for name, t in tiers.items():
        print(f"{name + ' entries':<20} {t['entries']} ({human_size(t['bytes'])})")
    print(f"hits                 memory {hits['memory']}, disk {hits['disk']}, shared {hits['shared']}{rate}")
    print(f"misses               {report['misses']}")
    print(f"compiles             {report['compiles']} ({report['compile_seconds']:.2f} s compiling)")
    print(f"compile time saved   {report['compile_seconds_saved']:.2f} s")
    print(f"errors               {report['errors']}")
    print(f"oldest / newest      {human_time(report['oldest'])} / {human_time(report['newest'])}")
    print(f"max size             {human_size(report['max_bytes'])}")
    return EXIT_OK


def cmd_prune(ctx: Context, args) -> int:
    from .maintenance import plan_prune, remove_debris, remove_entries

    store = ctx.store()
    selection = _entry_filter(args, args.stale)
    removed, freed, debris, remaining = [], 0, [], {}
    for tier in ctx.tiers(args.tier):
        infos = _scan(ctx, [tier], with_stale=args.stale)
        doomed = plan_prune(infos, selection, args.max_size)
        if not args.dry_run:
            freed += remove_entries(tier, doomed, store.stats.forget_entry)
            debris += remove_debris(tier)
        else:
            freed += sum(i.size_bytes for i in doomed)
        removed += doomed
        gone = {i.key for i in doomed}
        rest = [i for i in infos if i.key not in gone]
        remaining[tier.name] = {"entries": len(rest), "bytes": sum(i.size_bytes for i in rest)}
    if ctx.json:
        ctx.emit_json({"dry_run": args.dry_run, "removed": [i.to_json() for i in removed], "bytes_freed": freed,
                       "debris": [{"path": p, "bytes": b} for p, b in debris], "remaining": remaining})
        return EXIT_OK
    verb = "would remove" if args.dry_run else "removed"
    if not ctx.quiet:
        for i in removed:
            print(f"{verb}  {i.key[:12]}  {i.kernel}  {i.arch}  {human_size(i.size_bytes)}  ({i.tier})")
        for path, size in debris:
            print(f"removed debris  {path}  {human_size(size)}")
    ctx.say(f"{verb} {len(removed)} entries, {human_size(freed)}"
            + (f"; {len(debris)} debris files, {human_size(sum(b for _, b in debris))}" if debris else "")
            + "; left: " + ", ".join(f"{n} {r['entries']} entries {human_size(r['bytes'])}"
                                     for n, r in remaining.items()))
    return EXIT_OK


def cmd_verify(ctx: Context, args) -> int:
    from .disk import DiskTier, rebuild_index
    from .maintenance import verify

    checked, bad, index = 0, [], None
    store = ctx.store()
    if args.tier in ("all", "disk") and not isinstance(store.disk, DiskTier):
        index = {"problem": str(store.unavailable.get("disk", "unreadable")), "rebuilt": None}
    elif args.tier in ("all", "disk"):
        problem = store.disk.integrity_problem()
        index = {"problem": problem, "rebuilt": None} if problem else None
    if index is not None and args.repair:
        store.disk.close()
        index["rebuilt"] = rebuild_index(ctx.config.dir, ctx.config.max_bytes, owners=store.owners,
                                         max_entry_bytes=ctx.config.max_entry_bytes)
        store.disk = DiskTier(ctx.config.dir, ctx.config.max_bytes, owners=store.owners,
                              max_entry_bytes=ctx.config.max_entry_bytes, index_timeout=ctx.config.index_timeout)
    for tier in ctx.tiers(args.tier):
        n, b = verify(tier, repair=args.repair)
        checked += n
        bad += b
    left = [b for b in bad if not b.repaired]
    # Entries that readers already found corrupt and moved aside (shared tier); prune removes them.
    quarantined = [q for tier in ctx.tiers(args.tier) for q in getattr(tier, "quarantined", list)()]
    index_left = index is not None and index["rebuilt"] is None
    if ctx.json:
        ctx.emit_json({"checked": checked, "bad": [b.__dict__ for b in bad], "remaining_bad": len(left),
                       "quarantined": quarantined, "index": index})
    else:
        if index is not None:
            print(f"{'rebuilt' if index['rebuilt'] else 'BAD'}  local index ({ctx.config.dir}): {index['problem']}")
            if index["rebuilt"]:
                r = index["rebuilt"]
                print(f"         {r['recovered']} entries re-indexed, {r['removed']} unreadable removed; "
                      f"the damaged index was kept as entries/{r['moved_aside']}")
        for b in bad:
            print(f"{'removed' if b.repaired else 'BAD'}  {b.key}  ({b.tier}): {b.reason}")
        for q in quarantined:
            print(f"quarantined  {q['key']}  (shared): {q['path']}, removed by 'cachectl prune' after an hour")
        ctx.say(f"checked {checked} entries: {len(bad)} bad" + (f", {len(bad) - len(left)} removed" if args.repair
                                                                  else ""))
    if left or index_left:
        if not ctx.json:
            what = f"{len(left)} bad entries" + (" and a damaged index" if index_left else "")
            print(f"cachectl: {what} remain (run 'cachectl verify --repair')", file=sys.stderr)
        return EXIT_PROBLEMS
    return EXIT_OK


def cmd_clear(ctx: Context, args) -> int:
    from .disk import DiskTier, wipe
    from .maintenance import remove_entries, scan

    if not args.yes:
        raise CliError("clear removes every entry; pass --yes to confirm")
    store = ctx.store()
    count, size = 0, 0
    for tier in ctx.tiers(args.tier):
        infos = scan(tier)
        count += len(infos)
        if tier.name == "disk" and not (isinstance(tier, DiskTier) and tier.writable):
            # a damaged index or a full disk: remove the files themselves, the index with them
            size += sum(i.size_bytes for i in infos)
            tier.close()
            wipe(ctx.config.dir, store.owners)
            continue
        size += remove_entries(tier, infos, store.stats.forget_entry)
    if ctx.json:
        ctx.emit_json({"removed": count, "bytes_freed": size})
    else:
        ctx.say(f"removed {count} entries, {human_size(size)}")
    return EXIT_OK


def cmd_prewarm(ctx: Context, args) -> int:
    from . import prewarm

    store = ctx.store(create=True)
    progress = _Progress(ctx)
    start = time.perf_counter()
    try:
        if args.program:
            progress.expect(None)
            prewarm.run_program(args.program, args.arch or ["sm_90"], ctx.config, args.jobs, progress)
        else:
            infos = _scan(ctx, store.persistent_tiers, with_stale=False)
            selection = _entry_filter(argparse.Namespace(kernel=args.kernel), False)
            # slowest first: the workers finish together instead of waiting on one long compile
            recipes = [i.meta["recipe"] for i in sorted(infos, key=lambda i: (-i.compile_seconds, i.key))
                       if i.has_recipe and selection.matches(i, time.time())]
            no_recipe = sum(1 for i in infos if not i.error and not i.has_recipe)
            if not recipes:
                ctx.say("no recipes in the cache to rebuild (fill it by running the job once, "
                        "or prewarm MODULE:FUNCTION)")
            elif not args.allow_module:
                ctx.say("no --allow-module given: rebuilding a recipe imports the module it names, which "
                        "whoever wrote the cache chose, so no recipe is rebuilt; pass --allow-module PATTERN "
                        "(e.g. 'mylib.*') for the kernel modules you trust")
            has_key = lambda key: any(key in t for t in store.persistent_tiers)  # noqa: E731
            todo = prewarm.plan_recipe_builds(recipes, args.arch, has_key, progress,
                                              allowed=prewarm.module_filter(args.allow_module))
            progress.expect(len(todo))
            prewarm.run_recipe_builds(todo, ctx.config, args.jobs, progress, store=store)
            if no_recipe and ctx.verbose:
                ctx.say(f"{no_recipe} entries record no recipe and were skipped")
    except prewarm.PrewarmError as exc:
        progress.finish()
        raise CliError(str(exc)) from None
    except ValueError as exc:  # an unknown --arch name
        progress.finish()
        raise CliError(str(exc)) from None
    progress.finish()
    seconds = time.perf_counter() - start
    outcomes = progress.outcomes
    built = [o for o in outcomes if o.status == "built"]
    failed = [o for o in outcomes if o.status == "failed"]
    present = [o for o in outcomes if o.status == "present"]
    skipped = [o for o in outcomes if o.status == "skipped"]
    if ctx.json:
        ctx.emit_json({"built": len(built), "present": len(present), "failed": len(failed), "skipped": len(skipped),
                       "allowed_modules": args.allow_module, "seconds": seconds, "jobs": args.jobs,
                       "kernels_per_second": len(built) / seconds if seconds else 0.0,
                       "outcomes": [o.to_json() for o in outcomes]})
    else:
        for o in failed:
            print(f"FAILED  {o.label}  {o.arch}: {o.error}", file=sys.stderr)
        if not ctx.quiet:
            _report_skipped(skipped, ctx.verbose)
        ctx.say(f"built {len(built)}, already present {len(present)}, failed {len(failed)}"
                + (f", skipped {len(skipped)} (module not allowed"
                   + ("" if all(o.module for o in skipped) else " or recipe malformed") + ")" if skipped else "")
                + f" in {seconds:.1f} s with -j {args.jobs}")
    return EXIT_PROBLEMS if failed else EXIT_OK  # a skipped recipe is the operator's choice, not a failure


def _report_skipped(skipped: list, verbose: bool) -> None:
    """One stderr line per module not allowed (each skip with -v), one per malformed recipe."""
    if verbose:
        for o in skipped:
            print(f"SKIPPED  {o.label}  {o.arch}: {o.error}", file=sys.stderr)
        return
    by_module: dict[str, int] = {}
    for o in skipped:
        if o.module:
            by_module[o.module] = by_module.get(o.module, 0) + 1
        else:
            print(f"SKIPPED  {o.label}  {o.arch}: {o.error}", file=sys.stderr)
    for module, count in sorted(by_module.items()):
        print(f"SKIPPED  {count} recipe build(s) of module '{module}': not allowed "
              f"(rebuild them with --allow-module '{module}')", file=sys.stderr)


class _Progress:
    """A progress bar on a terminal; otherwise one line per kernel (to stderr under --json)."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.outcomes = []
        self.total = 0
        self.done = 0
        self.bar = sys.stderr.isatty() and not ctx.json and not ctx.quiet

    def expect(self, total: int | None) -> None:
        """Start counting builds; `total` None when unknown (a program decides what it compiles)."""
        self.counting, self.total = True, total

    def __call__(self, outcome) -> None:
        self.outcomes.append(outcome)
        if getattr(self, "counting", False):  # outcomes of planning (present, unimportable) don't count
            self.done += 1
        if self.bar:
            if self.total:
                filled = int(30 * min(self.done / self.total, 1.0))
                head = f"[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total}"
            else:
                head = f"[{self.done} done]"
            sys.stderr.write(f"\r{head} {outcome.status} {outcome.label} {outcome.arch}".ljust(100)[:100])
            sys.stderr.flush()
            return
        if self.ctx.quiet or (outcome.status in ("present", "skipped") and not self.ctx.verbose):
            return
        line = (f"{outcome.status:<8} {outcome.arch:<7} {outcome.label:<28} {outcome.key[:12]:<12} "
                f"{outcome.seconds:6.2f} s")  # errors are listed once, at the end
        print(line.rstrip(), file=sys.stderr if self.ctx.json else sys.stdout, flush=True)

    def finish(self) -> None:
        if self.bar:
            sys.stderr.write("\n")
            self.bar = False


def cmd_export(ctx: Context, args) -> int:
    from . import entry as entry_format
    from .bundle import export_bundle
    from .maintenance import read_raw

    tiers = ctx.tiers(args.tier)
    signer = ctx.store().signer
    selection = _entry_filter(args, args.stale)
    now = time.time()
    chosen, seen, skipped = [], set(), []
    for info in _scan(ctx, tiers, with_stale=args.stale):
        if info.key in seen or not selection.matches(info, now):
            continue
        tier = next(t for t in tiers if t.name == info.tier)
        try:
            raw = read_raw(tier, info.key)
            entry_format.decode(raw, expected_key=info.key)
        except (entry_format.CorruptEntry, TypeError):
            skipped.append(info.key)
            continue
        if signer is not None:
            # the local tier is trusted by ownership, so its entries are vouched for here; a shared
            # entry must already carry our signature (exporting must not launder a planted one)
            if tier.name == "shared" and signer.problem(raw) is not None:
                skipped.append(info.key)
                continue
            raw = signer.sign(raw)
        seen.add(info.key)
        chosen.append((info.key, raw, {"kernel": info.kernel, "arch": info.arch, "toolchain": info.toolchain}))
    if not args.file.parent.is_dir():
        raise CliError(f"cannot write {args.file}: no directory {args.file.parent}")
    try:
        result = export_bundle(args.file, chosen)
    except OSError as exc:
        raise CliError(f"cannot write {args.file}: {exc}", EXIT_PROBLEMS) from None
    if ctx.json:
        ctx.emit_json({"file": str(args.file), "entries": result.entries, "bytes": result.bytes,
                       "file_bytes": result.file_bytes, "skipped_corrupt": skipped})
    else:
        for key in skipped:
            print(f"skipped corrupt entry {key[:12]}", file=sys.stderr)
        ctx.say(f"exported {result.entries} entries ({human_size(result.bytes)}, "
                f"{human_size(result.file_bytes)} compressed) to {args.file}")
    return EXIT_OK


def cmd_import(ctx: Context, args) -> int:
    from .bundle import BundleError, import_bundle

    if not args.file.is_file():
        raise CliError(f"no bundle at {args.file}")
    signer = ctx.store(create=True).signer
    tier = ctx.tiers(args.tier)[0]

    def signed_by_our_key(data: bytes) -> str | None:  # with a key, a bundle proves nothing by itself
        problem = signer.problem(data)
        return None if problem is None else f"{problem} (KERNEL_CACHE_SIGNING_KEY is set)"

    try:
        result = import_bundle(args.file, tier, ctx.installed_toolchain, allow_stale=args.allow_stale,
                               accept=signed_by_our_key if signer is not None else None,
                               max_entry_bytes=ctx.config.max_entry_bytes)
    except BundleError as exc:
        raise CliError(str(exc), EXIT_PROBLEMS) from None
    if ctx.json:
        ctx.emit_json({"imported": len(result.imported), "present": len(result.present), "stale": len(result.stale),
                       "rejected": [{"member": m, "reason": r} for m, r in result.rejected],
                       "bytes": result.bytes, "tier": tier.name})
    else:
        for member, reason in result.rejected:
            print(f"rejected  {member}: {reason}", file=sys.stderr)
        ctx.say(f"imported {len(result.imported)} entries ({human_size(result.bytes)}) into {tier.name}; "
                f"{len(result.present)} already present, {len(result.stale)} skipped as stale"
                + (" (use --allow-stale to import them anyway)" if result.stale else "")
                + f", {len(result.rejected)} rejected")
    return EXIT_PROBLEMS if result.rejected else EXIT_OK


def main(argv: list[str] | None = None) -> int:
    ctx = None
    try:
        args = build_parser().parse_args(argv)
        ctx = Context(args)
        return args.handler(ctx, args)
    except CliError as exc:
        print(f"cachectl: {exc}", file=sys.stderr)
        return exc.code
    except BrokenPipeError:  # `cachectl list | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        print("cachectl: interrupted", file=sys.stderr)
        return 130
    finally:
        if ctx is not None:
            ctx.close()


if __name__ == "__main__":
    sys.exit(main())
