"""cachectl prewarm: build kernels ahead of a job, from recorded recipes or from a program."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from ..summary import EntrySummary
from . import kinds, programs, recipes
from .context import EXIT_OK, EXIT_PROBLEMS, CliError, Context
from .inspect import entry_filter, scan_all
from .outcomes import Outcome, PrewarmError
from .render import Progress


def cmd_prewarm(ctx: Context, args: Any) -> int:
    store = ctx.store(create=True)
    progress = Progress(ctx)
    start = time.perf_counter()
    try:
        if args.program:
            progress.expect(None)
            programs.run_program(args.program, args.arch or ["sm_90"], ctx.config, args.jobs, progress)
        else:
            infos = scan_all(ctx, ctx.kept(), with_stale=False)
            selection = entry_filter(argparse.Namespace(kernel=args.kernel), False)
            # slowest first: the workers finish together instead of waiting on one long compile
            found = [recipe for i in sorted(infos, key=lambda i: (-i.compile_seconds, i.key))
                     if selection.matches(i, time.time()) and (recipe := EntrySummary.from_meta(i.meta).recipe)]
            no_recipe = sum(1 for i in infos if i.kind == kinds.KERNEL and not i.has_recipe)  # records have none
            if not found:
                ctx.say("no recipes in the cache to rebuild (fill it by running the job once, "
                        "or prewarm MODULE:FUNCTION)")
            elif not args.allow_module:
                ctx.say("no --allow-module given: rebuilding a recipe imports the module it names, which "
                        "whoever wrote the cache chose, so no recipe is rebuilt; pass --allow-module PATTERN "
                        "(e.g. 'mylib.*') for the kernel modules you trust")
            has_key = lambda key: any(key in t for t in ctx.kept())  # noqa: E731
            todo = recipes.plan_recipe_builds(found, args.arch, has_key, progress,
                                              allowed=recipes.module_filter(args.allow_module))
            progress.expect(len(todo))
            recipes.run_recipe_builds(todo, ctx.config, args.jobs, progress, store=store)
            if no_recipe and ctx.verbose:
                ctx.say(f"{no_recipe} kernels record no recipe and were skipped")
    except PrewarmError as exc:
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
        if args.program and not built and not failed:
            ctx.say(f"nothing to build: every kernel {args.program} needs is already in the cache "
                    f"({seconds:.1f} s to check)")
            return EXIT_OK
        ctx.say(f"built {len(built)}, already present {len(present)}, failed {len(failed)}"
                + (f", skipped {len(skipped)} (module not allowed"
                   + ("" if all(o.module for o in skipped) else " or recipe malformed") + ")" if skipped else "")
                + f" in {seconds:.1f} s with -j {args.jobs}")
    return EXIT_PROBLEMS if failed else EXIT_OK  # a skipped recipe is the operator's choice, not a failure


def _report_skipped(skipped: list[Outcome], verbose: bool) -> None:
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

