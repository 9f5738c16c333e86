"""Lowered-call records at lowering time: a call seen before, in any process, is one store read.

The record's key is a fingerprint of everything the payload is built from, computed without
building a kernel spec, a content key or a proto:
  - the kernel function: its name, Triton's own cache key (source, called @jit functions, globals)
    and its parameters' flags (do_not_specialize, annotations);
  - the runtime arguments (pointer types, scalar values), the launch options, and per config its
    constexprs, warps, stages, CTAs, grid, zeroed outputs and description;
  - the call's name, aliases, operand shapes and dtypes, serialized metadata and debug flag;
  - the target, the toolchain fingerprint, jaxlib's version and module-image layout, whether
    persisted winners apply (and on which GPU model), and the source of this project's compiler
    and lowering packages (an edited module is a new fingerprint, never a stale payload).
The document is encoded by the core's one canonical encoder (`kernel_cache.canonical`, with the
compiler's Triton values and this floor's `Scalar` and `TensorDesc`) and hashed by the core's digest:
the int 1, the float 1.0, True and "1" differ; anything that has no canonical form (an object keyed
by identity) makes the call unrecorded, and it is lowered kernel by kernel as before.

With persisted winners in play, a record of an autotuned call names its winner key: a winner
stored since (by `cachectl tune`) redirects the reader to the record of that winner alone.
KERNEL_CACHE_CALL_RECORDS=0 keeps records out of the store: they live in this session only (a
model's layers lowering the same call again). The fingerprint is the call's one key: the store's
record and this session's copy use it alike. ROCm payloads name a temporary file: never recorded.
"""

from __future__ import annotations

import glob
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash

import compiler
from compiler import Artifact
from compiler import triton_compat as tc
from compiler.key import triton_value
from compiler.toolchain import installed_tools, toolchain_summary
from kernel_cache import Config, Session, Store, call_entry, lookup_log
from kernel_cache.canonical import canonical, canonical_text
from kernel_cache.digest import digest, digest_text
from kernel_cache.levels.memory import SizedLRU

from ..payload import jaxlib_compat as compat
from ..planning.plan import KernelPlan
from . import winners

FORMAT = 2  # 2: one canonical encoder (kernel_cache.canonical) instead of this module's tagged tuples
_code: list[str] = []  # the source fingerprint of the compiler and lowering packages (computed once)


def _code_identity() -> str:
    """xxh3 of the compiler and lowering packages' sources: a payload is only reused by the code
    that would build it the same way (~0.6 ms once per process). Raises TypeError (the call is then
    not recorded) where the sources cannot be read, e.g. an install of compiled files only."""
    if not _code:
        hasher, read = xxhash.xxh3_128(), 0
        for package in (compiler, __import__(__package__ or "lowering")):
            for path in sorted(glob.glob(os.path.join(os.path.dirname(package.__file__ or ""), "*.py"))):
                hasher.update(os.path.basename(path).encode() + b"\0")
                with open(path, "rb") as f:
                    hasher.update(f.read())
                read += 1
        _code.append(hasher.hexdigest() if read else "")
    if not _code[0]:
        raise TypeError("the compiler and lowering sources are not readable: calls are not recorded")
    return _code[0]


def _lowering_value(value: Any) -> Any:
    """The tagged form of the values only a lowering passes (a typed scalar, a TMA descriptor), then
    Triton's (`compiler.key.triton_value`): the canonical encoder's extension for a fingerprint."""
    kind = type(value)
    if kind is compiler.Scalar:
        return {"scalar": [value.type, _canonical(value.value)]}
    if kind is compiler.TensorDesc:
        return {"tensordesc": _canonical([value.type_name, list(value.shape), list(value.strides), value.padding,
                                          value.round_f32_to_tf32])}
    return triton_value(value)


def _canonical(value: Any) -> Any:
    return canonical(value, _lowering_value)


@dataclass
class Slot:
    """Where one call's record lives (`key` None: this call is not recorded), and what it held:
    `payload` and the number of kernels it launches (None: lower kernel by kernel)."""

    key: str | None
    plan: KernelPlan
    winners_apply: bool
    session: Session
    memos: "_Memos"
    payload: bytes | None = None
    kernels: int = 0

    def remember(self, payload: bytes, fetched: Sequence[tuple[Artifact, str]], family: Sequence[str],
                 winner_key: str | None, chosen: bool) -> None:
        """Record a payload just built from `fetched` (kernel, content key) pairs. `family` lists
        every config's content key where winners apply; `chosen`: the payload is the winner alone."""
        self.payload, self.kernels = payload, len(fetched)
        if self.key is None:
            return
        keys = tuple(key for _, key in fetched)
        seconds = sum(art.compile_seconds for art, _ in fetched)
        if not chosen:
            self._put(self.key, keys, seconds, payload, (winner_key or "") if self.winners_apply else "")
            return
        self._put(_winner_slot(self.key, keys[0]), keys, seconds, payload, winner_key or "")
        if _read(self, self.key) is None:  # the call's own record points readers at its winner
            self._put(self.key, tuple(family), 0.0, None, winner_key or "")

    def _put(self, key: str, keys: tuple[str, ...], seconds: float, payload: bytes | None, winner_key: str) -> None:
        plan = self.plan
        record = call_entry.CallRecord(
            key=key, kernel=plan.fn.__name__, call_name=plan.call.name, platform=plan.platform,
            arch=plan.target.name, target=plan.target.to_json(), toolchain=toolchain_summary(plan.target),
            config_keys=keys, compile_seconds=seconds, payload=payload, winner_key=winner_key)
        if self.session.config.call_records:
            self.session.store.put(record.to_entry())
        else:  # records off: kept for this session only (a model's layers lowering the same call again)
            self.memos.records.put(key, record)


def find(plan: KernelPlan, session: Session, module: Any = None) -> Slot:
    """The record slot of this call (its fingerprint, decided before any kernel is looked up) and,
    for a call seen before, its payload: one store read (records off: from this session's memo).
    `module`: the JAX module being lowered (what cannot change within it is read once per module)."""
    config = session.config
    device = winners.gpu_model(plan.platform, config) if len(plan.configs) > 1 and config.winners else None
    memos = session.memos.get(_MEMOS) or session.memo(_MEMOS, _Memos)
    slot = Slot(None, plan, device is not None, session, memos)
    if plan.platform != "cuda" or winners.TUNING in session.memos:  # tuning: nothing lowered may be reused
        return slot
    slot.key = _fingerprint(plan, module, device, memos, config)
    if slot.key is not None:
        _serve(slot)
    return slot


def _serve(slot: Slot) -> None:
    """Fill `slot` from its record, counted as hits of the record's kernels."""
    assert slot.key is not None
    start = time.perf_counter()
    found = _read(slot, slot.key)
    if found is None:
        return
    record, level = found
    if record.winner_key:
        chosen = winners.stored_winner(slot.session, record.winner_key)
        if chosen is not None and chosen in record.config_keys:
            found = _read(slot, _winner_slot(slot.key, chosen))
            if found is None:
                return  # lowered below as the winner alone, which records it
            record, level = found
    if record.payload is None:
        return  # its winner is gone: lowered autotuned below, which records that
    store = slot.session.store
    for key in record.config_keys:  # counted as its kernels' hits: `cachectl stats` stays comparable
        store.stats.hit(level, key, record.compile_seconds / len(record.config_keys))
    _touch_kernels(store, slot.memos.touched, record.config_keys)
    if lookup_log.log.isEnabledFor(logging.INFO):
        kernel = slot.plan.fn.__name__
        lookup_log.lookup(record.key, lambda: f"{kernel} call record ({_kernels(len(record.config_keys))})", level, start)
    slot.payload, slot.kernels = record.payload, len(record.config_keys)


def _touch_kernels(store: Store, touched: set[str], keys: Sequence[str]) -> None:
    """Tell the LRU order that a record's kernels are in use (once per session): they are never
    read while their record serves, and a size-bounded level must not evict them first (a new
    kernel-cache version or toolchain fingerprints every call anew, and then needs them)."""
    new = [key for key in keys if key not in touched]
    if new:
        if len(touched) < 1 << 16:
            touched.update(new)
        store.touch(new)


def _read(slot: Slot, key: str) -> tuple[call_entry.CallRecord, str] | None:
    if not slot.session.config.call_records:
        kept = slot.memos.records.get(key)
        return None if kept is None else (kept, "memory")
    found = slot.session.store.get(key)
    if found is None:
        return None
    entry, level = found
    try:
        return call_entry.CallRecord.from_entry(entry), level
    except ValueError:
        return None  # another kind under this key (or a malformed record): lowered and recorded again


def _winner_slot(key: str, chosen: str) -> str:
    """Where the record of the call lowered as its persisted winner `chosen` alone lives."""
    return digest(["kernel-cache lowered call", FORMAT, key, "winner", chosen])


def _fingerprint(plan: KernelPlan, module: Any, device: str | None, memos: _Memos, config: Config) -> str | None:
    """The record key of `plan` (None: something in it has no canonical form). `device`: the GPU
    model winners are looked up for (None: they do not apply to this call)."""
    configs = [[dict(c.constexprs), c.num_warps, c.num_stages, c.num_ctas, launch.grid,
                sorted(launch.zeroed_bytes.items()), c.description, sorted(launch.bound)]
               for c, launch in zip(plan.configs, plan.launches, strict=True)]
    try:
        static = _static_part(plan, memos)
        rest = [_module_part(module, plan.platform, config), device, plan.args, plan.options, configs,
                list(plan.info), plan.shapes]
        document_text = "[" + static + "," + canonical_text(rest, _lowering_value) + "]"
    except TypeError:
        return None
    return digest_text(document_text)


@dataclass
class _Memos:
    """This module's session memos: the static part's text per kernel function and target, the
    kernels whose use the levels have been told of, and (records off) the records of this session."""

    static: dict[tuple[Any, ...], tuple[Any, str]] = field(default_factory=dict)
    touched: set[str] = field(default_factory=set)
    records: SizedLRU[call_entry.CallRecord] = field(
        default_factory=lambda: SizedLRU(lambda r: len(r.payload or b"") + 512, 64 << 20))


_MEMOS = "lowering.records.call_records"  # this module's session memo (`_Memos`)
_MODULE_MEMO_KEY = "lowering.records.call_records"  # our entry in a JAX module's own per-module cache


def _module_part(module: Any, platform: str, config: Config) -> Any:
    """Triton's cache-invalidating environment and jaxlib's capabilities, read once per JAX module
    lowered (a jit of hundreds of Triton calls reads them once: Triton's read alone is ~12-50 us, a
    getenv per variable over the whole environment). Nothing runs between the lowering rules of one
    module that could change them. Kept in the module's own `lowering_cache` dict, so it lives and
    dies with the module: neither a strong reference to the module (it slowed every later lowering
    by ~0.8 ms) nor its MLIR context (JAX 0.12 reuses one context for up to 10 modules per thread)."""
    cache = getattr(module, "lowering_cache", None)
    memo_key = (_MODULE_MEMO_KEY, platform)
    if isinstance(cache, dict) and memo_key in cache:
        return cache[memo_key]
    part = [sorted(tc.cache_invalidating_env().items()), *compat.capabilities(platform, config)]
    if isinstance(cache, dict):
        cache[memo_key] = part
    return part


def _static_part(plan: KernelPlan, memos: _Memos) -> str:
    """The fingerprint's text for what one kernel function on one target shares across its calls:
    format, code, installed toolchain (Triton's environment and jaxlib's capabilities are read per
    module: `_module_part`), and the function itself. The function is kept with the text, so its id
    cannot be reused meanwhile."""
    fn, memo = plan.fn, memos.static
    fingerprint = tc.kernel_fingerprint(fn)
    memo_key = (id(fn), fingerprint, plan.target, plan.platform)
    found = memo.get(memo_key)
    if found is None or found[0] is not fn:
        found = (fn, canonical_text(["kernel-cache lowered call", FORMAT, _code_identity(), plan.platform,
                                      plan.target.to_json(), installed_tools(plan.target), fn.__name__, fingerprint,
                                      [list(flags) for flags in tc.param_flags(fn)]], _lowering_value))
        if len(memo) < 4096:
            memo[memo_key] = found
    return found[1]


def _kernels(n: int) -> str:
    return f"{n} kernel" if n == 1 else f"{n} kernels"
