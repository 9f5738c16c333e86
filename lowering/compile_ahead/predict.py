"""Compile what the program compiled last time, before it is traced: after an upgrade its first call's
lineage still names the warm set it wrote; each kernel of it whose module is already imported is
rebuilt for this target and compiled at once, once per session (docs/design.md, "Cold start").
"""

from __future__ import annotations

import logging

import compiler
import kernel_cache
from compiler.artifact import KIND as KERNEL_KIND  # the members whose recipes rebuild a spec
from compiler.recipe import RecipeError
from kernel_cache import Entry
from kernel_cache.entries import call_entry
from kernel_cache.entries.summary import META_KIND, META_RECIPE
from kernel_cache.session import SessionMemo

from ..records import call_records

log = logging.getLogger("kernel_cache.lowering")

_ASKED: SessionMemo[list[bool]] = SessionMemo("lowering.compile_ahead.predict", lambda _: [])


def predicted(session: kernel_cache.Session, target: compiler.Target) -> list[compiler.KernelSpec]:
    """The specs to compile ahead for `target` at this session's first miss (empty at every later one)."""
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
        except (RecipeError, KeyError, TypeError, ValueError):
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
