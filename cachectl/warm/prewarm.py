"""cachectl prewarm: build kernels ahead of a job, from recorded recipes or from a program. An
interrupt stops the compiles (`interrupts`); what was built stays, and the summary's counts add up
to the total (docs/cachectl.md, "prewarm")."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from dataclasses import asdict
from typing import Any

from cachectl import entry_kinds
from cachectl.context import EXIT_OK, EXIT_PROBLEMS, CliError, Context
from cachectl.inventory import entry_filter, scan_all
from cachectl.warm import programs, recipes
from cachectl.warm.interrupts import interrupts_stop_work
from cachectl.warm.progress import Outcome, PrewarmError, Progress
from compiler import compile_processes
from kernel_cache.entries.summary import EntrySummary
from kernel_cache.levels.protocols import KeptLevel
from kernel_cache.store import Store

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it; SIGTERM (Terminated) gives 143
STOP_GRACE = 2.0  # after an interrupt, the longest wait for the compiles under way in threads to end


def cmd_prewarm(ctx: Context, args: Any) -> int:
    store = ctx.store(create=True)
    progress = Progress(ctx)
    start = time.perf_counter()
    interrupted: KeyboardInterrupt | None = None
    try:
        with interrupts_stop_work():  # SIGINT and SIGTERM stop the compiles; what they built stays
            try:
                if args.program:
                    _from_program(ctx, args, store, progress)
                else:
                    _from_recipes(ctx, args, store, progress)
            except KeyboardInterrupt as exc:  # Terminated (SIGTERM) too
                interrupted = exc
    except (PrewarmError, ValueError) as exc:  # ValueError: an unknown --arch name
        progress.finish()
        raise CliError(str(exc)) from None
    progress.finish()
    seconds = time.perf_counter() - start
    outcomes = progress.outcomes
    built = [o for o in outcomes if o.status == "built"]
    failed = [o for o in outcomes if o.status == "failed"]
    present = [o for o in outcomes if o.status == "present"]
    skipped = [o for o in outcomes if o.status == "skipped"]
    code = EXIT_PROBLEMS if failed else EXIT_OK  # a skipped recipe is the operator's choice, not a failure
    if interrupted is not None:
        code = getattr(interrupted, "exit_code", EXIT_INTERRUPTED)
        if ctx.json or ctx.quiet:
            print(f"cachectl: interrupted after {progress.so_far()}", file=sys.stderr)
    if ctx.json:
        ctx.emit_json({"built": len(built), "present": len(present), "failed": len(failed), "skipped": len(skipped),
                       "interrupted": interrupted is not None, "done": progress.done, "total": progress.total,
                       "allowed_modules": args.allow_module, "seconds": seconds, "jobs": args.jobs,
                       "kernels_per_second": len(built) / seconds if seconds else 0.0,
                       "outcomes": [asdict(o) for o in outcomes]})
        return code
    for o in failed:
        print(f"FAILED  {o.label}  {o.arch}: {o.error}", file=sys.stderr)
    if not ctx.quiet:
        _report_skipped(skipped, ctx.verbose)
    if args.program and not built and not failed and interrupted is None:
        ctx.say(f"nothing to build: {_present_text(len(present), args.program)} ({seconds:.1f} s to check)")
        return code
    ctx.say(("" if interrupted is None else f"interrupted after {progress.so_far()}: ")
            + f"built {len(built)}, already present {len(present)}, failed {len(failed)}"
            + (f", skipped {len(skipped)} ({_skip_reasons(skipped)})" if skipped else "")
            + (_left(progress) if interrupted is not None else "")
            + f" in {seconds:.1f} s with -j {args.jobs}")
    return code


def _skip_reasons(skipped: list[Outcome]) -> str:
    """'module not allowed', 'kernel not importable', 'recipe malformed', as the skips had them."""
    reasons = {"module not allowed" if o.module else "kernel not importable" if recipes.NO_IMPORT in o.error
               else "recipe malformed" for o in skipped}
    return " or ".join(r for r in ("module not allowed", "kernel not importable", "recipe malformed") if r in reasons)


def _left(progress: Progress) -> str:
    """What an interrupt left undone, so the counts add up to the total ("interrupted after 13 of 36
    builds: built 5, already present 0, failed 8, not built 23")."""
    if progress.total is None:
        return ""
    left = progress.total - progress.done
    return f", not built {left}" if progress.unit == "builds" else f", {left} programs not lowered"


def _present_text(count: int, program: str) -> str:
    if count == 0:
        return f"{program} compiles no Triton kernel"
    return (f"the {count} kernels {program} needs are all" if count > 1
            else f"the one kernel {program} needs is") + " already in the cache"


def _local(ctx: Context, store: Store) -> list[KeptLevel]:
    """Where every build lands first (the local disk), to find after an interrupt what landed."""
    return [store.disk] if isinstance(store.disk, KeptLevel) else ctx.levels()


def _from_program(ctx: Context, args: Any, store: Store, progress: Progress) -> None:
    arches = args.arch or ["sm_90"]
    before = programs.known_keys(_local(ctx, store))
    progress.expect_programs(len(arches))
    with contextlib.redirect_stdout(sys.stderr):  # what it prints: stdout is the summary's (JSON)
        try:
            programs.run_program(args.program, arches, ctx.config, args.jobs, progress)
        except KeyboardInterrupt:
            compile_processes.cancel(STOP_GRACE)
            for outcome in programs.new_kernels(_local(ctx, store), before | {o.key for o in progress.outcomes}):
                progress(outcome)
            raise


def _from_recipes(ctx: Context, args: Any, store: Store, progress: Progress) -> None:
    infos = scan_all(ctx, ctx.levels(), with_stale=False)
    selection = entry_filter(argparse.Namespace(kernel=args.kernel), False)
    # slowest first: the workers finish together instead of waiting on one long compile
    found = [recipe for i in sorted(infos, key=lambda i: (-i.compile_seconds, i.key))
             if selection.matches(i, time.time()) and (recipe := EntrySummary.from_meta(i.meta).recipe)]
    no_recipe = sum(1 for i in infos if i.kind == entry_kinds.KERNEL.name and not i.has_recipe)  # records have none
    if not found:
        ctx.say("no recipes in the cache to rebuild (fill it by running the job once, "
                "or prewarm MODULE:FUNCTION)")
    elif not args.allow_module and any(recipes.not_importable(recipe) is None for recipe in found):
        ctx.say("no --allow-module given: rebuilding a recipe imports the module it names, which "
                "whoever wrote the cache chose, so no recipe is rebuilt; pass --allow-module PATTERN "
                "(e.g. 'mylib.*') for the kernel modules you trust")
    has_key = lambda key: any(key in t for t in ctx.levels())  # noqa: E731
    todo = recipes.plan_recipe_builds(found, args.arch, has_key, progress,
                                      recipes.module_filter(args.allow_module))
    progress.expect(len(todo))
    with contextlib.redirect_stdout(sys.stderr):  # Triton's report of a ptxas a Ctrl-C killed
        try:
            recipes.run_recipe_builds(todo, ctx.config, args.jobs, progress, store=store)
        except KeyboardInterrupt:
            compile_processes.cancel(STOP_GRACE)
            local = _local(ctx, store)
            for outcome in recipes.landed(todo, {o.key for o in progress.outcomes}, lambda k: any(k in t for t in local)):
                progress(outcome)
            raise
    if no_recipe and ctx.verbose:
        ctx.say(f"{no_recipe} kernels record no recipe and were skipped")


def _report_skipped(skipped: list[Outcome], verbose: bool) -> None:
    """One stderr line per module not allowed (each skip with -v), one per malformed recipe."""
    if verbose:
        for o in skipped:
            print(f"SKIPPED  {o.label}  {o.arch}: {o.error}", file=sys.stderr)
        return
    by_module: dict[str, int] = {}
    by_reason: dict[str, list[Outcome]] = {}  # a kernel defined in a script: one line for all its builds
    for o in skipped:
        if o.module:
            by_module[o.module] = by_module.get(o.module, 0) + 1
        else:
            by_reason.setdefault(o.error, []).append(o)
    for reason, same in by_reason.items():
        first = same[0]
        print(f"SKIPPED  {first.label}  {first.arch}: {reason}" if len(same) == 1 else
              f"SKIPPED  {len(same)} recipe build(s): {reason}", file=sys.stderr)
    for module, count in sorted(by_module.items()):
        print(f"SKIPPED  {count} recipe build(s) of module '{module}': not allowed "
              f"(rebuild them with --allow-module '{module}')", file=sys.stderr)

