"""Prewarm from a program: `MODULE:FUNCTION` names a user function returning JAX programs (the
contract: docs/cachectl.md, "prewarm"); each is lowered for `cuda` on this host, which compiles
every Triton kernel the GPU job will need into the cache. While it runs the process-wide store is
this cache, its `target_arch` the one to compile for (what triton_call reads without a
compute_capability)."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import kernel_cache
from cachectl import entry_kinds
from cachectl.inventory import read_raw
from cachectl.warm.interrupts import signals_held
from cachectl.warm.progress import Lowered, Outcome, Planned, PrewarmError, Report
from compiler import parse_target
from kernel_cache.entries import call_entry
from kernel_cache.entries.entry import peek_meta
from kernel_cache.entries.summary import META_KIND, EntrySummary
from kernel_cache.levels.protocols import KeptLevel
from kernel_cache.settings.config import Config
from kernel_cache.store import Store


# Programs ----------------------------------------------------------------------------------
def load_program(path: str) -> Any:
    """Import `MODULE:FUNCTION`, its form checked as the command line was read (the current directory
    is importable, as with `python -m`)."""
    module_name, _, func_name = path.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        with signals_held():  # it imports JAX: an interrupt waits for the import's end (see signals_held)
            module = importlib.import_module(module_name)
    except Exception as exc:
        raise PrewarmError(f"cannot import module '{module_name}': {type(exc).__name__}: {exc}") from exc
    obj: object = module
    for part in func_name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise PrewarmError(f"module '{module_name}' has no attribute '{func_name}'")
    if not callable(obj):
        raise PrewarmError(f"{path} is not callable")
    return obj


def lower_program(path: str, arch: str, config: Config) -> Iterator[Outcome | Planned | Lowered]:
    """Yields Planned(number of programs), then per program its kernels (built: landed in the cache
    meanwhile; present: already there, used), its failure, and Lowered."""
    # JAX reads JAX_PLATFORMS when it is first imported: so here, after run_program set it, not at the
    # top; an interrupt meanwhile waits for the import's end (see signals_held)
    with signals_held():
        import jax

    store = kernel_cache.configure(config.with_(target_arch=arch))
    kept = [t for t in store.persistent_levels if isinstance(t, KeptLevel)]
    seen = known_keys(kept)
    used = _used_keys(store)
    start = time.perf_counter()
    try:
        fn = load_program(path)
        takes_arch = False  # a callable without a signature is passed none
        with contextlib.suppress(TypeError, ValueError):
            takes_arch = "arch" in inspect.signature(fn).parameters  # not via **kwargs: those go on to triton_call
        kwargs = {"arch": arch} if takes_arch else {}
        programs = list(fn(**kwargs) or ())
    except Exception as exc:
        store.stats.flush()
        yield Planned(1)
        yield Outcome(path, arch, "failed", seconds=time.perf_counter() - start,
                      error=f"{type(exc).__name__}: {exc}".splitlines()[0])
        yield Lowered(path, arch)
        return
    yield Planned(len(programs))
    before = set(seen)
    present: set[str] = set()
    for index, item in enumerate(programs):
        label, item_start = f"{path}[{index}]", time.perf_counter()
        try:
            label, f, args, kw = program_item(item, label)
            jax.jit(f).trace(*args, **kw).lower(lowering_platforms=("cuda",))
        except Exception as exc:  # one bad program must not stop the others
            yield Outcome(label, arch, "failed", seconds=time.perf_counter() - item_start,
                          error=f"{type(exc).__name__}: {exc}".splitlines()[0])
        yield from new_kernels(kept[:1], seen, arch)  # the fastest level: where every build lands first
        for key in sorted((used & before) - present):  # there before, and served this lowering
            present.add(key)
            level = next((t for t in kept if key in t), None)
            summary = _kernel_summary(level, key) if level is not None else None
            if summary is not None:
                yield Outcome(summary.kernel, arch, "present", key=key)
        yield Lowered(label, arch)
    store.stats.flush()
    yield from new_kernels(kept, seen, arch)  # what landed only in a slower level (the local one busy)


def _used_keys(store: Store) -> set[str]:
    """The keys of the kernels `store` serves from now on (hits, not builds), filled as it serves
    them: a call record served whole counts the kernels it names."""
    used: set[str] = set()
    count, count_record = store.stats.hit, store.stats.record_hit

    def hit(level: str, key: str, compile_seconds: float) -> None:
        used.add(key)
        count(level, key, compile_seconds)

    def record_hit(level: str, key: str, compile_seconds: float) -> None:
        found = store.get(key)
        if found is not None:
            with contextlib.suppress(ValueError):
                used.update(call_entry.CallRecord.from_entry(found[0]).config_keys)
        count_record(level, key, compile_seconds)

    store.stats.hit = hit  # type: ignore[method-assign]
    store.stats.record_hit = record_hit  # type: ignore[method-assign]
    return used


def program_item(item: Any, default_label: str) -> tuple[str, Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
    """(label, fn, args, kwargs) from (fn, args), (fn, args, kwargs) or (label, fn, args)."""
    item = tuple(item)
    if item and isinstance(item[0], str):
        label, item = item[0], item[1:]
    else:
        label = (getattr(item[0], "__name__", None) if item else None) or default_label
    if len(item) == 2:
        return label, item[0], tuple(item[1]), {}
    if len(item) == 3:
        return label, item[0], tuple(item[1]), dict(item[2])
    raise TypeError(f"{default_label}: expected (fn, args), (fn, args, kwargs) or (label, fn, args)")


def new_kernels(levels: list[KeptLevel], seen: set[str], arch: str | None = None) -> list[Outcome]:
    """Kernels in `levels` whose keys are not in `seen` (which grows by what is found), as "built":
    those for `arch`, or with none each for its own (after an interrupt: those the lowerings cut
    short had built, whole entries, kept)."""
    out = []
    for level in levels:
        known = {r["key"] for r in level.listing()}
        for key in sorted(known - seen):
            summary = _kernel_summary(level, key)
            if summary is None or arch is not None and summary.arch not in ("?", arch):
                continue  # a record, or a kernel for another arch
            out.append(Outcome(summary.kernel, arch or summary.arch, "built", key=key, seconds=summary.compile_seconds))
        seen |= known
    return out


def known_keys(levels: list[KeptLevel]) -> set[str]:
    return {r["key"] for level in levels for r in level.listing()}


def _kernel_summary(level: KeptLevel, key: str) -> EntrySummary | None:
    """The entry's summary if it is a kernel (not a lowered-call record or a winner), else None."""
    raw = read_raw(level, key)
    meta = peek_meta(raw) if raw else {}
    if meta.get(META_KIND, entry_kinds.KERNEL.name) != entry_kinds.KERNEL.name:
        return None
    return EntrySummary.from_meta(meta)


def run_program(path: str, arches: list[str], config: Config, jobs: int, report: Report) -> None:
    """Lower the program for one arch after another in this process, `jobs` compiles at once: on
    the compile threads and the worker processes a lowering's rule starts (`compile_processes`)."""
    names = [parse_target(a).name for a in arches]  # a ValueError names the unknown one
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # lower for cuda without touching a GPU
    load_program(path)  # fail fast, in this process, on a typo
    for arch in names:
        for event in lower_program(path, arch, config.with_(compile_workers=jobs)):
            report(event)
