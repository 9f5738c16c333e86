"""cachectl export / import: move a warm cache where no shared directory reaches."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from .. import entry as entry_format
from ..bundle import BundleError, NotABundle, export_bundle, import_bundle
from ..maintenance import read_raw
from .context import EXIT_OK, EXIT_PROBLEMS, CliError, Context
from .inspect import entry_filter, scan_all
from .render import human_size


def cmd_export(ctx: Context, args: Any) -> int:
    if os.path.lexists(args.file) and not args.force:
        raise CliError(f"{args.file} exists; pass --force to replace it (the new bundle is written aside and "
                       f"renamed over it only once complete)")
    if os.path.lexists(args.file) and not os.path.isfile(args.file):
        raise CliError(f"{args.file} is not a regular file; not replacing it")
    tiers = ctx.tiers(args.tier)
    signer = ctx.store().signer
    selection = entry_filter(args, args.stale)
    now = time.time()
    chosen, seen, skipped = [], set(), []
    for info in scan_all(ctx, tiers, with_stale=args.stale):
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
    if not chosen:
        raise CliError(f"no entries match the selection{' (all matching entries were corrupt)' if skipped else ''}; "
                       f"nothing written to {args.file}")
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


def cmd_import(ctx: Context, args: Any) -> int:
    if not args.file.is_file():
        raise CliError(f"no bundle at {args.file}")
    with open(args.file, "rb") as f:  # before any cache is created for it
        if f.read(2) != b"\x1f\x8b":
            raise CliError(f"{args.file} is not a kernel-cache bundle (not gzip-compressed)")
    signer = ctx.store(create=True).signer
    tier = ctx.tiers(args.tier)[0]

    def signed_by_our_key(data: bytes) -> str | None:  # with a key, a bundle proves nothing by itself
        problem = signer.problem(data)
        return None if problem is None else f"{problem} (KERNEL_CACHE_SIGNING_KEY is set)"

    try:
        result = import_bundle(args.file, tier, ctx.installed_toolchain, allow_stale=args.allow_stale,
                               accept=signed_by_our_key if signer is not None else None,
                               max_entry_bytes=ctx.config.max_entry_bytes)
    except NotABundle as exc:  # nothing read: the command could not run
        raise CliError(str(exc)) from None
    except BundleError as exc:  # damaged part-way: what was read before the damage has landed
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

