"""Learn autotune winners on the GPU: time every config of every autotuned call site of a program,
on the program's real arguments, and store the fastest (`cachectl tune`).

A site is timed with the whole program lowered with that site forced to one config and every other
site to its best so far (nothing autotunes at launch): the median blocked step time over `reps` runs
after `warmup`. The program as a whole is timed, not the kernel alone, so a config that costs
elsewhere (a fusion it breaks, memory traffic) is charged for it. Each run gets fresh device copies
of the arguments, made before the timer starts, so a donated argument or an in-place kernel sees the
original inputs, as jaxlib's autotuner restores aliased inputs. A config that fails never wins.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax

import kernel_cache
from compiler.toolchain import toolchain_summary
from kernel_cache.entries import winner_entry
from kernel_cache.errors import KernelCacheError

from . import winners

log = logging.getLogger(__name__)


class TuneError(KernelCacheError, RuntimeError):
    """Tuning cannot run here (no GPU), or a program could not be lowered."""


class Program(NamedTuple):
    label: str
    fn: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class SiteResult(NamedTuple):
    """A tuned call site: the record stored (None when every config failed) and where it came from."""

    program: str
    site: winners.Site
    timings: list[winner_entry.ConfigTiming]
    record: winner_entry.Winner | None
    seconds: float  # spent tuning this site
    duplicate: bool = False  # the same site (winner key) was already tuned by an earlier program


def require_gpu() -> str:
    """The GPU model tuning will run on; TuneError where JAX sees no CUDA device."""
    try:
        devices = jax.devices("cuda")
    except RuntimeError as exc:
        devices, why = [], str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    else:
        why = "JAX lists no cuda device"
    if not devices:
        raise TuneError(f"tuning times kernels on a GPU, and JAX sees no CUDA GPU here ({why}); run it on a "
                        f"GPU node of the model the job runs on")
    return str(devices[0].device_kind)


def tune(programs: Sequence[Program], *, reps: int = 20, warmup: int = 3,
         report: Callable[[str, Any], None] = lambda event, data: None) -> list[SiteResult]:
    """Tune every autotuned site of `programs`, storing each winner in the process store.
    `report(event, data)` is called with ("site", (program, Site, index, count)) before a site,
    ("config", (Site, ConfigTiming)) after each config and ("done", SiteResult) after a site."""
    require_gpu()
    session = kernel_cache.current_session()
    store = session.store
    best: dict[str, str] = {}  # winner key -> the config key lowered for it while other sites are timed
    results: list[SiteResult] = []
    for program in programs:
        sites = discover(program, session)
        for site in sites:
            best.setdefault(site.key, site.config_keys[0])
        for index, site in enumerate(sites):
            report("site", (program.label, site, index, len(sites)))
            done = next((r for r in results if r.site.key == site.key), None)
            if done is not None:
                result = SiteResult(program.label, site, done.timings, done.record, 0.0, duplicate=True)
            else:
                result = _tune_site(session, program, site, best, reps, warmup, report)
                if result.record is not None:
                    store.put(result.record.to_entry())
                    winners.remember(session, result.record)
                    best[site.key] = result.record.best.key
            results.append(result)
            report("done", result)
    for program in programs:  # lowered once as a run would, winners applying: each call's winner record written
        try:
            _lower(program)
        except Exception as exc:  # it lowered while tuning: logged, the winners stay stored (the next run records)
            log.warning("kernel-cache: %s: recording the tuned calls failed: %s: %s", program.label,
                        type(exc).__name__, exc)
    store.stats.flush()
    return results


def discover(program: Program, session: kernel_cache.Session) -> list[winners.Site]:
    """The distinct autotuned call sites of `program`, in the order lowering meets them."""
    seen: list[winners.Site] = []
    try:
        with winners.tuning(session, forced={}, record=seen):
            _lower(program)
    except Exception as exc:
        raise TuneError(f"{program.label}: lowering failed: {type(exc).__name__}: {exc}".splitlines()[0]) from exc
    unique: dict[str, winners.Site] = {}
    for site in seen:
        unique.setdefault(site.key, site)
    return list(unique.values())


def _lower(program: Program) -> Any:
    jax.clear_caches()  # type: ignore[no-untyped-call]  # (unannotated in jax) jit's caches would hand back the executable of another forced config
    jitted = program.fn if hasattr(program.fn, "lower") else jax.jit(program.fn)
    return jitted.lower(*program.args, **program.kwargs)


def _tune_site(session: kernel_cache.Session, program: Program, site: winners.Site, best: dict[str, str], reps: int, warmup: int,
               report: Callable[[str, Any], None]) -> SiteResult:
    start = time.perf_counter()
    timings = []
    for config_key, description in zip(site.config_keys, site.descriptions):
        try:
            with winners.tuning(session, forced={**best, site.key: config_key}):
                compiled = _lower(program).compile()
            seconds: float | None = time_compiled(compiled, program.args, program.kwargs, reps, warmup)
            error = ""
        except Exception as exc:  # a config that cannot run (too much shared memory, say) never wins
            seconds, error = None, f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        timing = winner_entry.ConfigTiming(config_key, description, seconds, error)
        timings.append(timing)
        report("config", (site, timing))
    ok = [i for i, t in enumerate(timings) if t.seconds is not None]
    record = None
    if ok:
        winner = min(ok, key=lambda i: (timings[i].seconds, i))
        spec = site.spec
        record = winner_entry.Winner(kernel=site.kernel, arch=spec.target.name, target=spec.target.json,
                                     toolchain=toolchain_summary(spec.target), device=site.device,
                                     key_values=site.key_values, key_text=site.key_text, configs=tuple(timings),
                                     winner=winner, reps=reps, label=program.label)
    return SiteResult(program.label, site, timings, record, time.perf_counter() - start)


def time_compiled(compiled: Any, args: Sequence[Any], kwargs: dict[str, Any], reps: int, warmup: int) -> float:
    """Median seconds of one blocked run of `compiled`, each run on fresh copies of the arguments."""
    samples = []
    for run in range(warmup + reps):
        a, kw = jax.tree_util.tree_map(lambda x: x.copy() if isinstance(x, jax.Array) else x, (tuple(args), dict(kwargs)))
        jax.block_until_ready((a, kw))  # type: ignore[no-untyped-call]  # unannotated in jax
        start = time.perf_counter()
        jax.block_until_ready(compiled(*a, **kw))  # type: ignore[no-untyped-call]  # (as above)
        if run >= warmup:
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)
