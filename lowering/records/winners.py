"""Persisted autotune winners at lowering time: an autotuned call whose winner is stored (keyed by its
configs' content keys, autotune-key values and GPU model) is lowered as one plain call of that config
(docs/design.md, "Tuned once"); `tuning()` is how `tune` records a program's sites and forces configs.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

import compiler
import kernel_cache
from compiler import KernelSpec, triton_compat
from kernel_cache.lazy import later
from kernel_cache.session import SessionMemo

from ..planning.plan import KernelPlan, first_device

if TYPE_CHECKING:
    from kernel_cache.entries import winner_entry
else:
    winner_entry = later("kernel_cache.entries.winner_entry")  # read only where a winner is stored, or on a miss


class Site(NamedTuple):
    """One autotuned call site, as lowering saw it."""

    key: str  # the winner key
    kernel: str
    config_keys: tuple[str, ...]
    descriptions: tuple[str, ...]
    key_values: Any  # canonical
    key_text: str
    spec: KernelSpec  # the first config's (target, toolchain)
    device: str


# session memo: winner key -> its config's content key (None: no winner)
_STORED: SessionMemo[dict[str, str | None]] = SessionMemo("lowering.records.winners.stored", lambda _: {})


class Tuning(NamedTuple):
    """A tuning under way in a session (`tuning()`): the configs it forces, the sites it records."""

    forced: Mapping[str, str]  # winner key -> config key to lower
    recorder: list[Site] | None  # where the sites of a lowering go


class Choice(NamedTuple):
    """What persisted winners decide for one autotuned call."""

    config: int | None  # the index of the config to lower alone; None: lower the call autotuned
    key: str | None = None  # the winner key looked up (None: winners do not apply to this call)
    family: tuple[str, ...] = ()  # every config's content key (where a winner key was computed)


def narrowed(plan: KernelPlan, session: kernel_cache.Session) -> tuple[KernelPlan, list[KernelSpec], Choice]:
    """`plan`, its specs and the winners' choice, narrowed to the persisted winner's config (while
    tuning, the forced one) where there is one: then one plain call, no autotuning at launch."""
    specs = plan.specs()
    under_way: Tuning | None = session.tuning
    applies = len(specs) > 1 and (under_way is not None or session.config.winners)
    device = gpu_model(plan.platform, session.config) if applies else None
    if device is None:  # one config, winners off, or cross-lowering with no GPU model to look a winner up by
        return plan, specs, Choice(None)
    keys = compiler.session_keys(session)
    config_keys = [compiler.content_key(spec, keys=keys) for spec in specs]
    values, text = key_values(plan.call.kernel, plan.named, plan.metaparams, plan.avals_in, plan.avals_out)
    key = winner_entry.winner_key(config_keys, values, device)
    if under_way is not None and under_way.recorder is not None:
        under_way.recorder.append(Site(key, specs[0].name, tuple(config_keys),
                                       tuple(c.description for c in plan.configs), values, text, specs[0], device))
    chosen = under_way.forced.get(key) if under_way is not None else stored_winner(session, key)
    if chosen not in config_keys:
        return plan, specs, Choice(None, key, tuple(config_keys))
    index = config_keys.index(chosen)
    return (plan._replace(configs=[plan.configs[index]], launches=[plan.launches[index]]), [specs[index]],
            Choice(index, key, tuple(config_keys)))


def stored_winner(session: kernel_cache.Session, key: str) -> str | None:
    """The winning config's content key stored under winner `key` (memoized per session)."""
    memo = _STORED.of(session)
    if key not in memo:
        found = session.store.get(key)
        memo[key] = (winner_entry.Winner.from_meta(found[0].meta).best.key
                     if found is not None and winner_entry.problem(found[0]) is None else None)
    return memo[key]


def remember(session: kernel_cache.Session, record: winner_entry.Winner) -> None:
    """After storing a winner in this session: later lowerings use it without a store read."""
    _STORED.of(session)[record.key] = record.best.key


@contextlib.contextmanager
def tuning(session: kernel_cache.Session, forced: Mapping[str, str], record: list[Site] | None = None) -> Iterator[None]:
    """While inside: lower each site `forced` names as that config alone (the rest autotuned, stored
    winners ignored) and append every site seen to `record`. A `configure()` meanwhile starts a
    session that is not tuning."""
    saved = session.tuning
    session.tuning = Tuning(dict(forced), record)
    try:
        yield
    finally:
        session.tuning = saved


def gpu_model(platform: str, config: kernel_cache.Config) -> str | None:
    """The GPU model winners are looked up for: the configured one, else the visible device's."""
    return config.gpu_model or _device_kind(platform)


@functools.cache
def _device_kind(platform: str) -> str | None:
    device = first_device(platform)
    return None if device is None else str(device.device_kind)


def key_values(kernel: Any, named: Mapping[str, Any], metaparams: Mapping[str, Any], avals_in: Sequence[Any],
               avals_out: Sequence[Any]) -> tuple[Any, str]:
    """(canonical key values, text): the autotuner's `key` arguments as Triton keys its cache, plus
    every operand's shape and dtype: a winner is tuned for one problem size even where the key leaves
    a size out."""
    names: list[str] = []
    for wrapper in triton_compat.wrapper_chain(kernel):
        if triton_compat.is_autotuner(wrapper):
            names += [k for k in triton_compat.autotune_keys(wrapper) if k not in names]
    available = {**metaparams, **named}
    chosen = [(n, _value(available[n])) for n in names if n in available]
    operands = [_value(a) for a in avals_in], [_value(a) for a in avals_out]
    values = winner_entry.canonical({"key": [[n, v] for n, v in chosen], "in": operands[0], "out": operands[1]})
    text = ", ".join(f"{n}={_show(v)}" for n, v in chosen)
    text += ("; " if text else "") + ", ".join(map(_show, operands[0])) + " -> " + ", ".join(map(_show, operands[1]))
    return values, text


def _value(value: Any) -> Any:
    if hasattr(value, "shape") and hasattr(value, "dtype"):  # an aval
        return ["array", [int(d) for d in value.shape], np.dtype(value.dtype).name]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return repr(value)


_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int32": "i32", "int64": "i64"}


def _show(value: Any) -> str:
    if isinstance(value, list) and len(value) == 3 and value[0] == "array":
        return f"{_SHORT.get(value[2], value[2])}[{','.join(map(str, value[1]))}]"
    return str(value)
