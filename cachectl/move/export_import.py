"""cachectl export / import: move a warm cache where no shared directory reaches.

The whole bundle is read and checked before the cache is even opened (`bundle_file`): a file that
is no bundle (exit 2) or a bundle that is damaged, truncated or past a cap (exit 1) lands nothing
and creates nothing; the report names each entry of a bundle read whole that was not imported, and why.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from cachectl.context import BOUND_STORED, EXIT_OK, EXIT_PROBLEMS, CliError, Context
from cachectl.inventory import entry_filter, read_raw, scan_all
from cachectl.move.bundle_file import (
    EVICTED,
    FAILED,
    NOT_REACHED,
    REJECTED,
    ImportResult,
    NoRoom,
    StagingError,
    export_bundle,
    stage_bundle,
)
from cachectl.move.tar_stream import BundleError, NotABundle
from cachectl.render import human_size
from kernel_cache.entries import entry as entry_format
from kernel_cache.entries import warm_set
from kernel_cache.settings.config import sources


def cmd_export(ctx: Context, args: Any) -> int:
    if os.path.lexists(args.file) and not args.force:
        raise CliError(f"{args.file} exists; pass --force to replace it (the new bundle is written aside and "
                       f"renamed over it only once complete)")
    if os.path.lexists(args.file) and not os.path.isfile(args.file):
        raise CliError(f"{args.file} is not a regular file; not replacing it")
    chosen, skipped = _exportable(ctx, args)
    if not chosen and skipped:
        for key, why in skipped:
            print(f"skipped {key[:12]}: {why}", file=sys.stderr)
        raise CliError(f"every entry that matches the selection was skipped; nothing written to {args.file}",
                       EXIT_PROBLEMS)
    if not chosen:
        raise CliError(f"no entries match the selection; nothing written to {args.file}")
    if not args.file.parent.is_dir():
        raise CliError(f"cannot write {args.file}: no directory {args.file.parent}")
    try:
        result = export_bundle(args.file, chosen)
    except OSError as exc:
        raise CliError(f"cannot write {args.file}: {exc}", EXIT_PROBLEMS) from None
    if ctx.json:
        ctx.emit_json({"file": str(args.file), "entries": result.entries, "bytes": result.bytes,
                       "file_bytes": result.file_bytes, "skipped_corrupt": [key for key, _ in skipped]})
    else:
        for key, why in skipped:
            print(f"skipped {key[:12]}: {why}", file=sys.stderr)
        ctx.say(f"exported {result.entries} entries ({human_size(result.bytes)}, "
                f"{human_size(result.file_bytes)} compressed) to {args.file}"
                + (f"; {len(skipped)} skipped" if skipped else ""))
    return EXIT_PROBLEMS if skipped else EXIT_OK


def _exportable(ctx: Context, args: Any) -> tuple[list[tuple[str, bytes, dict[str, Any]]], list[tuple[str, str]]]:
    """The selected entries' bytes (signed where a key is set), first copy of each key, and the keys
    skipped with why (corrupt; a shared entry not carrying our signature)."""
    levels = ctx.levels(args.level)
    signer = ctx.store().signer
    selection = entry_filter(args, args.stale)
    now = time.time()
    chosen: list[tuple[str, bytes, dict[str, Any]]] = []
    seen: set[str] = set()
    skipped: list[tuple[str, str]] = []
    for info in scan_all(ctx, levels, with_stale=args.stale):
        if info.key in seen or not selection.matches(info, now) or info.kind == warm_set.KIND:
            continue  # a warm set copies its members: the node that imports them writes its own
        level = next(t for t in levels if t.name == info.level)
        try:
            raw = read_raw(level, info.key)
            if raw is None:  # removed since the scan: skipped as ever, with the words decode(None) raised
                raise TypeError("cannot convert 'NoneType' object to bytes")
            entry_format.decode(raw, expected_key=info.key)
        except (entry_format.CorruptEntry, TypeError) as exc:
            skipped.append((info.key, f"corrupt ({exc})" if str(exc) else "corrupt"))
            continue
        if signer is not None:
            # the local level is trusted by ownership, so its entries are vouched for here; a shared
            # entry must already carry our signature (exporting must not launder a planted one)
            problem = signer.problem(raw) if level.name == "shared" else None
            if problem is not None:
                skipped.append((info.key, f"{problem} ({_key_setting()} is set)"))
                continue
            raw = signer.sign(raw)
        seen.add(info.key)
        chosen.append((info.key, raw, {"kernel": info.kernel, "arch": info.arch, "toolchain": info.toolchain}))
    return chosen, skipped


def _key_setting() -> str:
    """The signing-key setting the operator actually set (the file or the variable)."""
    return next((s.env for s, source in sources() if s.field == "signing_key" and source == "environment"),
                "a signing key")


def cmd_import(ctx: Context, args: Any) -> int:
    if not args.file.is_file():
        raise CliError(f"no bundle at {args.file}")
    signer = ctx.config.signer()
    setting = _key_setting()

    def signed_by_our_key(data: bytes) -> str | None:  # with a key, a bundle proves nothing by itself
        problem = signer.problem(data) if signer is not None else None
        return None if problem is None else f"{problem} ({setting} is set: entries must carry its signature)"

    try:  # before any cache is created or opened for it
        staged = stage_bundle(args.file, accept=signed_by_our_key if signer is not None else None,
                              max_entry_bytes=ctx.config.max_entry_bytes)
    except NotABundle as exc:  # the import does not apply to this file
        raise CliError(str(exc)) from None
    except (BundleError, StagingError) as exc:  # a bundle that cannot be read whole: nothing lands
        return _nothing_imported(ctx, args, exc)
    with staged:
        ctx.store(create=True)
        level = ctx.levels(args.level)[0]
        room = ctx.config.max_bytes if level.name == "disk" else None
        try:
            result = staged.publish(level, ctx.installed_toolchain, allow_stale=args.allow_stale, room=room)
        except NoRoom as exc:
            needed, bound = human_size(exc.needed), human_size(exc.room)
            if needed == bound:  # the sizes differ below the shown precision
                needed, bound = f"{exc.needed} bytes", f"{exc.room} bytes"
            setting = "cachectl config max-size" if ctx.bound_source == BOUND_STORED else "KERNEL_CACHE_MAX_BYTES"
            return _nothing_imported(ctx, args, exc, why=(
                f"they take {needed}, more than the local level holds ({setting}={bound}): importing "
                f"them would evict this cache's entries and then each other; raise {setting} or "
                f"import with --level shared"))
    if ctx.json:
        ctx.emit_json(_result_json(result, level.name))
    else:
        _say_fates(ctx, result, level.name)
    return EXIT_PROBLEMS if result.rejected or not result.complete else EXIT_OK


def _result_json(result: ImportResult, level: str) -> dict[str, Any]:
    return {"imported": len(result.imported), "present": len(result.present), "stale": len(result.stale),
            "rejected": [{"member": m, "reason": r} for m, r in result.rejected],
            "failed": [{"key": k, "reason": r} for k, r in result.failed],
            "not_reached": result.not_reached, "evicted": result.evicted, "expected": result.expected,
            "fates": [{"member": f.member, "fate": f.fate, "reason": f.reason} for f in result.fates],
            "bytes": result.bytes, "level": level}


def _nothing_imported(ctx: Context, args: Any, exc: Exception, why: str | None = None) -> int:
    expected = getattr(exc, "expected", None)
    message = f"imported 0{f' of {expected}' if expected else ''} entries: {why or exc}"
    print(f"cachectl: {message}", file=sys.stderr)
    if ctx.json:  # the usual document, plus what an error carries
        ctx.emit_json({**_result_json(ImportResult(expected=expected), args.level),
                       "at_entry": getattr(exc, "at_entry", None), "error": message, "exit_code": EXIT_PROBLEMS})
    return EXIT_PROBLEMS


def _say_fates(ctx: Context, result: ImportResult, level: str) -> None:
    """Each entry not imported on stderr (every entry's fate on stdout with -v), then the summary."""
    for fate in result.fates:
        if fate.fate in (REJECTED, FAILED, EVICTED):
            print(f"{fate.fate:<9} {fate.member}: {fate.reason}", file=sys.stderr)
        elif fate.fate == NOT_REACHED:
            print(f"{fate.fate:<9} {fate.member}", file=sys.stderr)
        elif ctx.verbose and not ctx.quiet:
            print(f"{fate.fate:<9} {fate.member}")
    ctx.say(f"imported {len(result.imported)} of {len(result.fates)} entries ({human_size(result.bytes)}) into "
            f"{level}; {len(result.present)} already present, {len(result.stale)} skipped as stale"
            + (" (use --allow-stale to import them anyway)" if result.stale else "")
            + f", {len(result.rejected)} rejected"
            + (f"; writing {result.failed[0][0][:12]} failed, so the import stopped there: "
               f"{len(result.not_reached)} more not reached (not imported)" if result.failed else "")
            + (f"; {len(result.evicted)} evicted again by later entries (the {level} level's size bound)"
               if result.evicted else ""))
