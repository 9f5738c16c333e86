"""Compile ahead: a program's kernels compile at once, not one lowering rule after another.

JAX traces a whole jitted function before it lowers any of it: binding notes each call (nothing
planned or hashed), and the first miss (`start`) hands every call noted after its own, and what the
program compiled last time (`predicted`), to the compile workers (docs/design.md, "Cold start").
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from jax import core

import compiler
import kernel_cache
from compiler.artifact import KIND as KERNEL_KIND  # the members whose recipes rebuild a spec
from kernel_cache import Entry
from kernel_cache.entries import call_entry
from kernel_cache.entries.summary import META_KIND, META_RECIPE
from kernel_cache.lazy import later
from kernel_cache.session import SessionMemo

from .. import first_use
from ..planning.bound_call import BoundCall
from ..planning.plan import KernelPlan, target_of
from ..records import call_records, winners

if TYPE_CHECKING:
    from compiler import compile_processes
else:
    compile_processes = later("compiler.compile_processes")  # its worker processes, where they pay

log = logging.getLogger("kernel_cache.lowering")

MAX_NOTED = 4096  # calls kept between misses (a long-running process traces many programs)
# Turns a noted call's parameters into triton_kernel_call_p's (a client adapter's translation); None: ours
Translate = Callable[[Sequence[Any], Mapping[str, Any]], "tuple[Sequence[Any], Mapping[str, Any]]"]


class Operand(NamedTuple):
    """What planning reads of an operand: not the tracer itself, which would keep its trace alive."""

    shape: tuple[int, ...]
    dtype: Any


# (operands, params, translate) of each call bound since the last miss, oldest first
_noted: collections.deque[tuple[tuple[Operand, ...], Mapping[str, Any], Translate | None]] = \
    collections.deque(maxlen=MAX_NOTED)
_lock = threading.Lock()


def note(operands: Sequence[Any], params: Mapping[str, Any], translate: Translate | None = None) -> None:
    """Remember a bound call until a miss starts it. The first bound call of a session starts it
    (`first_use`); in a process about to compile, the second distinct one starts its compile workers."""
    starter = first_use.STARTED.of(kernel_cache.current_session()).cold_start
    noted = _operands(operands)
    _noted.append((noted, params, translate))
    if starter is not None and starter.waiting:  # a process that may be about to compile, no workers yet
        starter.bound(_identity(noted, params))


def _operands(values: Sequence[Any]) -> tuple[Operand, ...]:
    return tuple(Operand(tuple(x.shape), x.dtype) for x in values)


def _identity(operands: tuple[Operand, ...], params: Mapping[str, Any]) -> int | None:
    try:
        return hash((operands, frozenset(params.items())))
    except TypeError:
        return None


def start(platform: str, session: kernel_cache.Session, avals_in: Sequence[Any], params: Mapping[str, Any] | None) -> int:
    """A lowering rule missed on the call (`avals_in`, `params`): hand every call noted after its own
    to the compile workers; how many. JAX lowers a module's calls in the order it bound them, so the
    notes up to the missing call's own belong to modules lowered before, or are its rule's to compile."""
    with _lock:
        noted = list(_noted)
        _noted.clear()
    if session.config.compile_threads <= 1:  # one compile at a time: no threads to start
        return 0
    try:  # the missing call's target (worker processes warm up for it)
        target: compiler.Target | None = target_of(platform, (params or {}).get("compute_capability"),
                                                          session.config.target_arch)
    except Exception:  # its rule reports what is wrong
        target = None
    taken = [(*n, _identity(n[0], n[1])) for n in noted]
    own = _identity(_operands(avals_in), params) if params is not None else None
    idents = [n[3] for n in taken]
    if own is not None and own in idents:  # its latest binding: what came before was lowered, or is this
        taken = taken[len(idents) - idents[::-1].index(own):]
    seen: set[int | None] = set()
    calls = []
    for avals_in, params, translate, ident in taken:
        if ident is None or ident not in seen:  # a call bound again (JAX re-tracing a jaxpr) is planned once
            seen.add(ident)
            calls.append((avals_in, params, translate))
    # what the program compiled last time under another toolchain or target (once, at the first miss)
    ahead = predicted(session, target) if target is not None else []
    compile_processes.expect(session.config, len(calls) + len(ahead), target)  # worker processes, where they pay
    for avals_in, params, translate in calls:
        compile_processes.submit(session.config, _plan_and_compile, platform, avals_in, params, translate, session)
    keys = compiler.session_keys(session) if ahead else None
    for spec in ahead:  # after this module's own calls: those are needed first
        compile_processes.submit(session.config, _compile, spec, session.store, keys)
    return len(calls) + len(ahead)


def _plan_and_compile(platform: str, avals_in: Sequence[Any], params: Mapping[str, Any],
                      translate: Translate | None, session: kernel_cache.Session) -> None:
    store = session.store
    try:
        if translate is not None:
            avals_in, params = translate(avals_in, params)
        avals_out = [core.ShapedArray(shape, dtype) for shape, dtype in params["out_avals"]]  # as bound
        plan = KernelPlan.of(platform, avals_in, avals_out, BoundCall(**params), session.config)
        if session.tuning is not None:  # tuning records each call site as its rule lowers it
            specs = plan.specs()
        else:  # the rule will lower a persisted winner alone
            specs = winners.narrowed(plan, session)[1]
    except Exception as exc:  # the rule plans it again and reports what is wrong
        log.debug("not compiling ahead a call of %s: %s", getattr(params.get("kernel"), "__name__", "?"), exc)
        return
    keys = compiler.session_keys(session)
    for spec in specs[1:]:
        compile_processes.submit(session.config, _compile, spec, store, keys)
    _compile(specs[0], store, keys)


def _compile(spec: compiler.KernelSpec, store: kernel_cache.Store, keys: compiler.KeyMemo) -> None:
    try:
        compile_processes.get_or_compile(spec, store, keys=keys)  # on a worker process where one is idle
    except Exception as exc:  # its rule compiles it again and raises the error where the user sees it
        log.debug("compiling %s ahead failed: %s", spec.name, exc)


_ASKED: SessionMemo[list[bool]] = SessionMemo("lowering.compile_ahead.predicted", lambda _: [])


def predicted(session: kernel_cache.Session, target: compiler.Target) -> list[compiler.KernelSpec]:
    """What the program compiled last time, to compile ahead for `target` at this session's first miss
    (empty at every later one): after an upgrade its first call's lineage still names the warm set it
    wrote; each kernel of it whose module is already imported is rebuilt for this target."""
    asked = _ASKED.of(session)
    if asked:
        return []
    asked.append(True)
    members = call_records.predecessor(session)
    if not members:
        return []
    specs, skipped = [], 0
    for entry in _kernels(session.store, members):
        try:
            specs.append(compiler.from_recipe(entry.meta[META_RECIPE], target, imported_only=True))
        except (compiler.RecipeError, KeyError, TypeError, ValueError):
            skipped += 1  # not imported here (or not rebuildable): never imported to find out
    log.debug("compiling ahead %d kernels the program compiled before under another toolchain or target "
              "(%d not imported here)", len(specs), skipped)
    return specs


def _kernels(store: kernel_cache.Store, members: list[Entry]) -> list[Entry]:
    """The kernel entries the set holds or its lowered-call records name (read from the local
    level: the records of a cold run list their kernels, which its set need not hold), each once."""
    found: dict[str, Entry] = {}
    for entry in members:
        kind = entry.meta.get(META_KIND)
        if kind == KERNEL_KIND and isinstance(entry.meta.get(META_RECIPE), dict):
            found.setdefault(entry.key, entry)
        elif kind == call_entry.KIND:
            try:
                keys = call_entry.CallRecord.from_entry(entry).config_keys
            except Exception:  # a malformed record guides nothing
                continue
            for key in keys:
                kernel = found.get(key) or store.get_local(key)
                if kernel is not None and isinstance(kernel.meta.get(META_RECIPE), dict):
                    found[key] = kernel
    return list(found.values())
