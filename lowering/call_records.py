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
Values are encoded as tagged plain tuples and hashed through their repr (xxh3-128): the int 1,
the float 1.0, True and "1" differ; anything that is not plain (an object keyed by identity) makes
the call unrecorded, and it is lowered kernel by kernel as before.

With persisted winners in play, a record of an autotuned call names its winner key: a winner
stored since (by `cachectl tune`) redirects the reader to the record of that winner alone.
KERNEL_CACHE_CALL_RECORDS=0 turns records off. ROCm payloads name a temporary file: never recorded.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

import compiler
import kernel_cache
from compiler import Artifact, Target
from compiler import triton_compat as tc
from compiler.toolchain import installed_tools, toolchain_summary
from kernel_cache import call_records as records
from kernel_cache import lookup_log

from . import jaxlib_compat as compat
from . import winners
from .custom_call import CallInfo, Launch
from .plan import KernelPlan

FORMAT = 1
_code: list[str] = []  # the source fingerprint of the compiler and lowering packages (computed once)


def _code_identity() -> str:
    """xxh3 of the compiler and lowering packages' sources: a payload is only reused by the code
    that would build it the same way (~0.6 ms once per process). Raises TypeError (the call is then
    not recorded) where the sources cannot be read, e.g. an install of compiled files only."""
    if not _code:
        digest, read = xxhash.xxh3_128(), 0
        for package in (compiler, __import__(__package__ or "lowering")):
            for path in sorted(glob.glob(os.path.join(os.path.dirname(package.__file__ or ""), "*.py"))):
                digest.update(os.path.basename(path).encode() + b"\0")
                with open(path, "rb") as f:
                    digest.update(f.read())
                read += 1
        _code.append(digest.hexdigest() if read else "")
    if not _code[0]:
        raise TypeError("the compiler and lowering sources are not readable: calls are not recorded")
    return _code[0]


_LEAVES = frozenset((str, bytes, bool, int, float, type(None)))


def _plain(value: Any) -> Any:
    """A tagged tuple of plain values standing for `value` (its repr is the encoding); TypeError
    for what has no stable, content-derived form."""
    kind = type(value)
    if kind in _LEAVES:
        return value
    if kind is dict:
        items = [(k if type(k) is str else _plain(k), v if type(v) in _LEAVES else _plain(v)) for k, v in value.items()]
        return ("dict", tuple(sorted(items, key=_item_order)))
    if kind in (list, tuple):
        return (kind.__name__, tuple(v if type(v) in _LEAVES else _plain(v) for v in value))
    if kind is compiler.Scalar:
        return ("scalar", value.type, _plain(value.value))
    if kind is compiler.TensorDesc:
        return ("tensordesc", value.type_name, value.shape, value.strides, value.padding, value.round_f32_to_tf32)
    if tc.is_jit_function(value):
        return ("jit", tc.kernel_fingerprint(value))
    if kind.__name__ == "dtype" and hasattr(value, "name"):  # triton.language dtype
        return ("tl.dtype", str(value))
    if kind.__name__ == "constexpr" and hasattr(value, "value"):
        return _plain(value.value)
    raise TypeError(f"{kind.__name__} has no plain form")


def _item_order(item: tuple[Any, Any]) -> str:
    key = item[0]
    return key if type(key) is str else repr(key)


@dataclass
class Slot:
    """Where one call's record lives (`key` None: this call is not recorded)."""

    key: str | None
    platform: str
    target: Target
    kernel: str
    call_name: str
    winners_apply: bool

    def served(self) -> tuple[bytes, int] | None:
        """(payload, number of kernels it launches) from a record, or None: lower kernel by kernel."""
        if self.key is None:
            return None
        start = time.perf_counter()
        found = _read(self.key)
        if found is None:
            return None
        record, tier = found
        if record.winner_key:
            chosen = winners.stored_winner(record.winner_key)
            if chosen is not None and chosen in record.config_keys:
                found = _read(_winner_slot(self.key, chosen))
                if found is None:
                    return None  # lowered below as the winner alone, which records it
                record, tier = found
        if record.payload is None:
            return None  # its winner is gone: lowered autotuned below, which records that
        store = kernel_cache.default_store()
        for key in record.config_keys:  # counted as its kernels' hits: `cachectl stats` stays comparable
            store.stats.hit(tier, key, record.compile_seconds / len(record.config_keys))
        _touch_kernels(store, record.config_keys)
        lookup_log.lookup(record.key, lambda: f"{self.kernel} call record ({_kernels(len(record.config_keys))})", tier,
                          start)
        return record.payload, len(record.config_keys)

    def remember(self, payload: bytes, fetched: Sequence[tuple[Artifact, str]], family: Sequence[str],
                 winner_key: str | None, chosen: bool) -> None:
        """Record a payload just built from `fetched` (kernel, content key) pairs. `family` lists
        every config's content key where winners apply; `chosen`: the payload is the winner alone."""
        if self.key is None:
            return
        keys = tuple(key for _, key in fetched)
        seconds = sum(art.compile_seconds for art, _ in fetched)
        if not chosen:
            self._put(self.key, keys, seconds, payload, (winner_key or "") if self.winners_apply else "")
            return
        self._put(_winner_slot(self.key, keys[0]), keys, seconds, payload, winner_key or "")
        if _read(self.key) is None:  # the call's own record points readers at its winner
            self._put(self.key, tuple(family), 0.0, None, winner_key or "")

    def _put(self, key: str, keys: tuple[str, ...], seconds: float, payload: bytes | None, winner_key: str) -> None:
        record = records.CallRecord(
            key=key, kernel=self.kernel, call_name=self.call_name, platform=self.platform, arch=self.target.name,
            target=self.target.to_json(), toolchain=toolchain_summary(self.target), config_keys=keys,
            compile_seconds=seconds, payload=payload, winner_key=winner_key)
        kernel_cache.default_store().put(record.to_entry())


_touched: set[str] = set()  # kernels whose use this process has told the tiers about


def _touch_kernels(store: Any, keys: Sequence[str]) -> None:
    """Tell the LRU order that a record's kernels are in use (once per process): they are never
    read while their record serves, and a size-bounded tier must not evict them first (a new
    kernel-cache version or toolchain fingerprints every call anew, and then needs them)."""
    new = [key for key in keys if key not in _touched]
    if new:
        if len(_touched) < 1 << 16:
            _touched.update(new)
        store.touch(new)


def _read(key: str) -> tuple[records.CallRecord, str] | None:
    found = kernel_cache.default_store().get(key)
    if found is None:
        return None
    entry, tier = found
    try:
        return records.CallRecord.from_entry(entry), tier
    except ValueError:
        return None  # another kind under this key (or a malformed record): lowered and recorded again


def _winner_slot(key: str, chosen: str) -> str:
    return xxhash.xxh3_128_hexdigest(f"{key}:winner:{chosen}".encode())


def slot(platform: str, plan: KernelPlan, launches: Sequence[Launch], call: CallInfo, shapes: Sequence[Any] = (),
         module: Any = None) -> Slot:
    """The record slot of this call (its fingerprint), decided before any kernel is looked up.
    `shapes`: the operands' (shape, dtype), which a winner key covers though the payload does not;
    `module`: the JAX module being lowered (what cannot change within it is read once per module)."""
    fn, args, configs, target, options = plan.fn, plan.args, plan.configs, plan.target, plan.options
    winners_apply = len(configs) > 1 and winners.apply(platform)
    result = Slot(None, platform, target, fn.__name__, call.name, winners_apply)  # key None: unrecorded
    if platform != "cuda" or not kernel_cache.current_config().call_records or winners.tuning_active():
        return result
    try:
        document = (
            _static_part(platform, fn, target), _module_part(module, platform),
            winners.gpu_model(platform) if winners_apply else None,
            _plain(list(args)), _plain(dict(options)),
            tuple((_plain(dict(c.constexprs)), c.num_warps, c.num_stages, c.num_ctas, launch.grid,
                   tuple(sorted(launch.zeroed_bytes.items())), c.description, tuple(sorted(launch.bound)))
                  for c, launch in zip(configs, launches, strict=True)),
            call.as_tuple(),  # typed fields of ints, text and bytes: their repr is already unambiguous
            _plain(list(shapes)))
    except TypeError:
        return result
    result.key = xxhash.xxh3_128_hexdigest(repr(document).encode())
    return result


_MODULE_MEMO_KEY = "kernel_cache.call_records"  # our entry in a JAX module's own per-module cache


def _module_part(module: Any, platform: str) -> Any:
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
    part = (tuple(sorted(tc.cache_invalidating_env().items())), compat.jaxlib_version(),
            repr(compat.module_image_layout(platform)), compat.autotuned_aliases_supported())
    if isinstance(cache, dict):
        cache[memo_key] = part
    return part


_static: dict[tuple[Any, ...], tuple[Any, str]] = {}  # (kernel id, its cache key, target) -> (kernel, text)
_per_target: dict[tuple[str, Target], str] = {}


def _static_part(platform: str, fn: Any, target: Target) -> str:
    """The fingerprint's text for what one kernel function on one target shares across its calls:
    format, code, installed toolchain (Triton's environment and jaxlib's capabilities are read per
    module: `_module_part`), and the function itself. The function is kept with the text, so its id
    cannot be reused meanwhile."""
    fingerprint = tc.kernel_fingerprint(fn)
    memo_key = (id(fn), fingerprint, target, platform)
    found = _static.get(memo_key)
    if found is None or found[0] is not fn:
        found = (fn, repr((_target_part(platform, target), fn.__name__, fingerprint, tc.param_flags(fn))))
        if len(_static) < 4096:
            _static[memo_key] = found
    return found[1]


def _target_part(platform: str, target: Target) -> str:
    text = _per_target.get((platform, target))
    if text is None:
        text = repr(("kernel-cache lowered call", FORMAT, _code_identity(), platform, _plain(target.to_json()),
                     _plain(installed_tools(target))))
        _per_target[(platform, target)] = text
    return text


def _kernels(n: int) -> str:
    return f"{n} kernel" if n == 1 else f"{n} kernels"
