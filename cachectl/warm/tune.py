"""cachectl tune: learn the winning config of every autotuned call of a program on this GPU, once,
and keep it in the cache; later processes lower those calls as plain calls of their winner. The
program is prewarm's, with real arguments instead of shapes (docs/cachectl.md, "tune")."""

from __future__ import annotations

import sys
from typing import Any

import kernel_cache
from cachectl.context import EXIT_OK, EXIT_PROBLEMS, CliError, Context
from cachectl.warm.programs import load_program, program_item
from cachectl.warm.progress import PrewarmError
from lowering.records import tune as engine


def cmd_tune(ctx: Context, args: Any) -> int:
    try:
        device = engine.require_gpu()  # before anything is created or imported for the program
    except engine.TuneError as exc:
        raise CliError(str(exc)) from None
    ctx.store(create=True)  # the directory checks (a cache, or new/empty) and creation
    kernel_cache.configure(ctx.config.with_(gpu_model=device, winners=True))
    try:
        programs = _programs(args.program)
    except PrewarmError as exc:
        raise CliError(str(exc)) from None
    out = sys.stderr if ctx.json else sys.stdout
    verbose, quiet = ctx.verbose, ctx.quiet

    def report(event: str, data: Any) -> None:
        if quiet:
            return
        if event == "site":
            label, site, index, count = data
            print(f"tuning  {label} site {index + 1}/{count}: {site.kernel} [{site.key_text}], "
                  f"{len(site.config_keys)} configs on {site.device}", file=out, flush=True)
        elif event == "config" and verbose:
            _, t = data
            shown = f"{t.seconds * 1e3:9.3f} ms" if t.seconds is not None else f"FAILED ({t.error})"
            print(f"        {shown}  {t.description}", file=out, flush=True)
        elif event == "done":
            print("        " + _outcome(data), file=out, flush=True)

    try:
        results = engine.tune(programs, reps=args.reps, warmup=args.warmup, report=report)
    except engine.TuneError as exc:
        raise CliError(str(exc), EXIT_PROBLEMS) from None
    failed = [r for r in results if r.record is None]
    stored = [r for r in results if r.record is not None and not r.duplicate]
    if ctx.json:
        ctx.emit_json({"device": device, "reps": args.reps, "warmup": args.warmup, "stored": len(stored),
                       "failed": len(failed), "sites": [_site_json(r) for r in results]})
    else:
        if not results:
            ctx.say(f"no autotuned calls in {args.program}: nothing to tune")
        ctx.say(f"tuned {_n(len(results), 'call site')} on {device}: {_n(len(stored), 'winner')} stored"
                + (f", {len(failed)} sites where every config failed" if failed else ""))
    return EXIT_PROBLEMS if failed else EXIT_OK


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _programs(path: str) -> list[engine.Program]:
    fn = load_program(path)
    try:
        items = fn()
    except Exception as exc:
        raise PrewarmError(f"{path} failed: {type(exc).__name__}: {exc}".splitlines()[0]) from exc
    programs = []
    for index, item in enumerate(items or ()):
        try:
            label, f, fargs, kwargs = program_item(item, f"{path}[{index}]")
        except (TypeError, IndexError) as exc:
            raise PrewarmError(str(exc)) from None
        programs.append(engine.Program(label, f, fargs, kwargs))
    return programs


def _outcome(result: engine.SiteResult) -> str:
    if result.duplicate:
        return "same call site as an earlier program: its winner applies"
    if result.record is None:
        return "no winner: every config failed (" + "; ".join(t.error for t in result.timings)[:200] + ")"
    best, record = result.record.best, result.record
    assert best.seconds is not None
    slowest = max(t.seconds for t in record.configs if t.seconds is not None)
    return (f"winner {best.description}: {best.seconds * 1e3:.3f} ms per step "
            f"(slowest {slowest * 1e3:.3f} ms) -> {record.key[:12]} in {result.seconds:.1f} s")


def _site_json(result: engine.SiteResult) -> dict[str, Any]:
    site, record = result.site, result.record
    return {"program": result.program, "kernel": site.kernel, "key": site.key, "key_values": site.key_text,
            "device": site.device, "arch": site.spec.target.name, "duplicate": result.duplicate,
            "winner": record.best.description if record is not None else None,
            "winner_config_key": record.best.key if record is not None else None,
            "configs": [t.to_json() for t in result.timings], "seconds": result.seconds}
