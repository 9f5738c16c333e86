"""The one serving path of a lowered call (`serve`), through ordered tiers: this session's calls by
signature, the program's warm set by signature, the call's record by its key, then kernel by kernel
(`Slot.remember` records it). docs/design.md ("One serving path") says why each tier and what
bypasses them: records off (KERNEL_CACHE_CALL_RECORDS=0) keep them in this session, ROCm payloads
name a temporary file (never recorded), tuning reuses nothing lowered.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from compiler.toolchain import toolchain_summary
from kernel_cache import Entry, Session, Store
from kernel_cache.bounded_memo import BoundedMemo, SizedLRU
from kernel_cache.entries import call_entry
from kernel_cache.front_level import WarmSet
from kernel_cache.session import SessionMemo
from kernel_cache.telemetry import lookup_log

from ..planning.aliasing import CallShape, outputs
from ..planning.bound_call import BoundCall
from ..planning.plan import Evaluation, KernelPlan
from . import call_key, winners

if TYPE_CHECKING:
    from compiler import Artifact


@dataclass
class Slot:
    """Where one call's record lives (`key` None: not recorded), and its payload once found or built."""

    key: str | None
    plan: KernelPlan
    session: Session
    memos: "_Memos"
    payload: bytes | None = None
    kernels: int = 0
    record: call_entry.CallRecord | None = None  # the record that served the call, where one did
    signable: str | None = None  # the key of the record whose payload this call lowers to (its own, or its winner's)

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
            self._put(self.key, keys, seconds, payload, winner_key)
            self.signable = self.key
            return
        self.signable = call_entry.winner_record_key(self.key, keys[0])
        self._put(self.signable, keys, seconds, payload, winner_key)
        if _read(self.session, self.memos, self.key) is None:  # the call's own record points readers at its winner
            self._put(self.key, tuple(family), 0.0, None, winner_key)

    def _put(self, key: str, keys: tuple[str, ...], seconds: float, payload: bytes | None, winner_key: str | None) -> None:
        plan = self.plan
        record = call_entry.CallRecord(
            key=key, kernel=plan.fn.__name__, call_name=plan.call.name, platform=plan.platform,
            arch=plan.target.name, target=plan.target.json, toolchain=toolchain_summary(plan.target),
            config_keys=keys, compile_seconds=seconds, payload=payload, winner_key=winner_key or "")
        if self.session.config.call_records:
            entry = record.to_entry()
            self.session.store.put(entry)
            self.memos.warm_set(self.session.store).note(entry)
        else:  # records off: kept for this session only (a model's layers lowering the same call again)
            self.memos.records.put(key, record)


def serve(platform: str, avals_in: Sequence[Any], avals_out: Sequence[Any], params: Mapping[str, Any],
          session: Session, module: Any, build: Callable[[Slot], None]) -> tuple[KernelPlan | CallShape, bytes, int]:
    """(what the rule emits: the call's shape, its plan where it was planned; its payload; its kernel count)
    through the tiers in the module's docstring; `build(slot)`, the last, fills `slot`'s payload."""
    memos = session.memos.get(_MEMOS) or _MEMOS.of(session)
    call = BoundCall(**params)
    evaluation = Evaluation(avals_in, avals_out, call)  # the user's functions, run once for this lowering
    start = time.perf_counter()
    signature, found = find_signed(platform, avals_in, avals_out, params, session, module, evaluation)
    if found is not None and signature is not None:  # tiers 1 and 2: no plan, no key
        record, level = found
        _count(session, memos, record, level, start)
        memos.remember(signature, record)
        return CallShape(call, platform, *outputs(call, avals_out)), record.payload or b"", len(record.config_keys)
    plan = KernelPlan.of(platform, avals_in, avals_out, call, session.config, evaluation)
    slot = find(plan, session, module=module)
    if slot.payload is None:
        build(slot)
    assert slot.payload is not None
    if signature is not None:
        if slot.signable is not None and session.config.call_records:  # signed for the record lowered to
            memos.warm_set(session.store).sign(signature, slot.signable)
        if slot.record is not None:
            memos.remember(signature, slot.record)
    return plan, slot.payload, slot.kernels


def find(plan: KernelPlan, session: Session, module: Any = None) -> Slot:
    """The record slot of this call, keyed before any kernel is looked up, and for a call seen
    before its payload: one store read. `module`: the JAX module being lowered."""
    config = session.config
    device = winners.gpu_model(plan.platform, config) if len(plan.configs) > 1 and config.winners else None
    memos = session.memos.get(_MEMOS) or _MEMOS.of(session)
    slot = Slot(None, plan, session, memos)
    if plan.platform != "cuda" or session.tuning is not None:  # tuning: nothing lowered may be reused
        return slot
    slot.key = call_key.call_key(plan, device, module, config)
    start = time.perf_counter()
    found = _read(session, memos, slot.key) if slot.key is not None else None
    found = _winner_applied(session, memos, *found) if found is not None else None  # None: the winner alone, below
    if found is not None and found[0].payload is not None:  # None: its winner is gone, lowered autotuned below
        record, level = found
        _count(session, memos, record, level, start)
        slot.payload, slot.kernels = record.payload, len(record.config_keys)
        slot.record, slot.signable = record, record.key
    return slot


def find_signed(platform: str, avals_in: Sequence[Any], avals_out: Sequence[Any], params: Mapping[str, Any],
                session: Session, module: Any = None, evaluation: Evaluation | None = None
                ) -> tuple[str | None, tuple[call_entry.CallRecord, str] | None]:
    """(the call's signature, None on ROCm, while tuning or where it has none; the record that serves it
    unplanned, tier 1 or 2, with its level, or None). The warm set keeps signature -> the record whose
    payload the call lowered to: its own, or its winner's own while that winner is stored."""
    if platform != "cuda" or session.tuning is not None:
        return None, None
    memos = session.memos.get(_MEMOS) or _MEMOS.of(session)
    signed = call_key.signed_call(platform, avals_in, avals_out, params, module, session.config, evaluation)
    if signed is None:
        return None, None
    signature, lineage = signed
    record = memos.served.get(signature)
    if record is not None:
        return signature, (record, "memory")
    if not session.config.call_records:
        return signature, None
    warm = memos.warm_set(session.store)
    entry = warm.signed(signature, lineage)
    record = None if entry is None else _decoded(memos, entry)
    found = None if record is None else _winner_applied(session, memos, record, warm.level)
    if found is None or found[0].payload is None:
        return signature, None  # a record its key must decide, or a pointer: planned and found by its key
    if found[0] is not record:  # a winner stored since: its own record, signed for the next process
        warm.sign(signature, found[0].key)
    return signature, found


def _count(session: Session, memos: "_Memos", record: call_entry.CallRecord, level: str, start: float) -> None:
    store = session.store
    store.stats.record_hit(level, record.key, record.compile_seconds)
    warm = memos.warm_set(store)
    # The LRU order is told once per session and at exit that the record's kernels are in use: never read
    # while their record serves, a size-bounded level must not evict them first (a new toolchain needs them).
    new = [key for key in record.config_keys if key not in memos.touched]
    if new:
        if len(memos.touched) < 1 << 16:
            memos.touched.update(new)
        warm.touch_later(new)
    if lookup_log.log.isEnabledFor(logging.INFO):
        kernel, count = record.kernel, len(record.config_keys)
        lookup_log.lookup(record.key, lambda: record_label(kernel, count), level, start)


def _winner_applied(session: Session, memos: "_Memos", record: call_entry.CallRecord, level: str
                    ) -> tuple[call_entry.CallRecord, str] | None:
    """`record` where it serves the winner stored now under its winner key, else the winner's own
    record; None where that is not stored (the call is lowered as the winner alone, which records it)."""
    if not record.winner_key:
        return record, level
    chosen = winners.stored_winner(session, record.winner_key)
    if record.serves(chosen):
        return record, level
    redirect = record.redirect(chosen)
    found = _read(session, memos, redirect) if redirect is not None else None
    return found if found is not None and found[0].serves(chosen) else None


def _read(session: Session, memos: "_Memos", key: str) -> tuple[call_entry.CallRecord, str] | None:
    """The record under `key` and the level it came from: the program's warm set first, then the store."""
    if not session.config.call_records:
        kept = memos.records.get(key)
        return None if kept is None else (kept, "memory")
    warm = memos.warm_set(session.store)
    warm.begin(key)  # the program's first ask names its set
    found = session.store.get(key)  # its warm set first, in front of the store's levels
    if found is None:
        return None
    entry, level = found
    warm.note(entry)  # a member of the set this session writes
    record = _decoded(memos, entry)
    return None if record is None else (record, level)


def _decoded(memos: "_Memos", entry: Entry) -> call_entry.CallRecord | None:
    """`entry` as a record, checked once per entry object (the memory level and the warm set answer
    with the same one again); None for another kind or a malformed record (lowered and recorded again)."""
    decoded = memos.decoded.get(entry.key)
    if decoded is not None and decoded[0] is entry:
        return decoded[1]
    try:
        record = call_entry.CallRecord.from_entry(entry)
    except ValueError:
        return None
    memos.decoded.remember(entry.key, (entry, record))
    return record


@dataclass
class _Memos:
    """This module's session memos (records off: `records` holds the session's records)."""

    decoded: BoundedMemo[str, tuple[Entry, call_entry.CallRecord]] = field(default_factory=BoundedMemo)
    touched: set[str] = field(default_factory=set)
    records: SizedLRU[call_entry.CallRecord] = field(
        default_factory=lambda: SizedLRU(lambda r: len(r.payload or b"") + 512, 64 << 20))
    served: dict[str, call_entry.CallRecord] = field(default_factory=dict)  # signature -> its record, served here
    served_bytes: int = 0
    warm: WarmSet | None = None  # the records read and written, for this program's next process

    def remember(self, signature: str, record: call_entry.CallRecord) -> None:
        """Serve `signature` from `record` again (tier 1), within MAX_SERVED calls and MAX_SERVED_BYTES."""
        size = len(record.payload or b"") + 512
        if signature not in self.served and len(self.served) < MAX_SERVED and \
                self.served_bytes + size <= MAX_SERVED_BYTES:
            self.served[signature] = record
            self.served_bytes += size

    def warm_set(self, store: Store) -> WarmSet:
        warm = self.warm
        if warm is None:
            warm = self.warm = WarmSet(store)
            store.front_level(warm)
        return warm


_MEMOS = SessionMemo("lowering.records.call_records", lambda _: _Memos())
MAX_SERVED = 4096  # calls the session serves again by signature
MAX_SERVED_BYTES = 64 << 20  # their payloads' bytes


def record_label(kernel: str, kernels: int) -> str:
    """How the lookup log names a call record served: 'matmul_kernel call record (6 kernels)'."""
    return f"{kernel} call record ({kernels} kernel{'' if kernels == 1 else 's'})"


def predecessor(session: Session) -> list[Entry]:
    """What this program needed last time under another toolchain, environment or target: the
    members of the warm set its first call's lineage names, where it found no set of its own."""
    return _MEMOS.of(session).warm_set(session.store).predecessor()
