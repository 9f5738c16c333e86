"""One Triton call resolved: what the user asked (`BoundCall`) and everything the lowering derives from
it and the operands' avals before reading a kernel: target, configs, runtime argument types, each
config's launch, the payload's call fields and the operand shapes.

The plan is the call object the rest of the lowering takes (records, winners, emitter). The rule
plans a call to build its custom call; `ahead` plans the calls traced so far to start their
compiles before their rules run. Both plan the same way, so a kernel compiled ahead is the one the
rule asks for (same spec, same content key).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from jax import core

from compiler import KernelSpec, Target, make_spec
from kernel_cache import Config
from kernel_cache.value_class import Value

from . import kernels
from .aliasing import OutputOrder, outputs
from .bound_call import BoundCall
from .configs import LaunchConfig, Resolved, resolve
from .target_arch import resolve_target


@dataclass(frozen=True)
class Launch:
    """How one config is launched: known from the call and its config alone, before any kernel is read."""

    grid: tuple[int, int, int]
    zeroed_bytes: dict[int, int]  # runtime-argument position -> bytes to zero before launch
    description: str
    bound: frozenset[str]  # parameters given by name (metaparams, config kwargs, heuristics)


class CallInfo(NamedTuple):
    """The call's own fields of the payload, whatever its configs (a tuple: the fingerprint encodes it as one)."""

    name: str
    kernel_name: str
    scalar_desc: str
    compute_capability: int
    aliases: tuple[tuple[int, int], ...]
    num_inputs: int
    in_sizes: tuple[int, ...]
    serialized_metadata: bytes
    debug: bool


@dataclass(frozen=True)
class KernelPlan:
    call: BoundCall  # what the user asked
    platform: str
    target: Target
    fn: Any  # the @triton.jit function under any autotune / heuristics wrappers
    configs: list[LaunchConfig]
    args: list[Any]  # runtime argument types in order (tuple parameters kept as tuples)
    options: dict[str, Any]
    named: dict[str, Any]  # the kernel's runtime parameters by name, as heuristics see them
    metaparams: dict[str, Any]
    leaf_names: list[str]  # each flat runtime value's name (`yz[1]` inside a tuple parameter)
    order: OutputOrder
    avals_in: list[Any]  # the operands' avals
    avals_out: list[Any]  # the output avals as the call returns them
    results: list[Any]  # the output avals in the kernel's order
    aliases: tuple[tuple[int, int], ...]  # (input, output position in `results`)
    launches: list[Launch]  # one per config
    info: CallInfo
    shapes: list[tuple[tuple[int, ...], str]]  # every operand's and result's (shape, dtype name)

    @classmethod
    def of(cls, platform: str, avals_in: Sequence[Any], avals_out: Sequence[Any], call: BoundCall,
           config: Config, evaluation: "Evaluation | None" = None) -> "KernelPlan":
        """`evaluation`: the call's user functions already evaluated for this lowering (else evaluated here)."""
        target = target_of(platform, call.compute_capability, config)
        meta = dict(call.metaparams.items())
        evaluation = evaluation if evaluation is not None else Evaluation(avals_in, avals_out, call)
        order, results, aliases, inputs, resolved = evaluation.resolved()
        pointed = results[:order.pointers]
        named = resolved.named
        args = kernels.argument_types([a.dtype for a in avals_in], call.scalars, [a.dtype for a in pointed],
                                      call.arg_tree, aligned=call.aligned_pointers)
        options = call_options(call)
        zeroed_bytes = _zeroed_bytes(resolved.zeroed, order, call, avals_in, avals_out)
        launches = [Launch(grid=grid, zeroed_bytes=zeroed, description=c.description, bound=frozenset(c.constexprs))
                    for c, grid, zeroed in zip(resolved.configs, resolved.grids, zeroed_bytes, strict=True)]
        leaf_names = _leaf_names(list(named), inputs)
        info = CallInfo(
            name=call.name, kernel_name=resolved.fn.__name__,
            scalar_desc=str({leaf_names[p]: v for p, v in call.scalars}),
            compute_capability=int(target.arch) if target.backend == "cuda" else 0,  # an int for cuda
            aliases=aliases, num_inputs=len(avals_in), in_sizes=tuple(map(_nbytes, avals_in)),
            serialized_metadata=bytes(call.serialized_metadata), debug=call.debug)
        shapes = [(tuple(map(int, a.shape)), _dtype(a.dtype)[0]) for a in (*avals_in, *results)]
        plan = object.__new__(cls)  # the frozen dataclass's __init__ would set 19 fields one object.__setattr__ each
        plan.__dict__.update(
            call=call, platform=platform, target=target, fn=resolved.fn, configs=resolved.configs, args=args,
            options=options, named=named, metaparams=meta, leaf_names=leaf_names, order=order,
            avals_in=list(avals_in), avals_out=list(avals_out), results=results, aliases=aliases,
            launches=launches, info=info, shapes=shapes)
        return plan

    def specs(self) -> list[KernelSpec]:
        return [make_spec(self.fn, self.args, dict(c.constexprs), target=self.target, num_warps=c.num_warps,
                          num_stages=c.num_stages, num_ctas=c.num_ctas, **self.options) for c in self.configs]

    def only(self, index: int) -> "KernelPlan":
        """This plan with config `index` alone (a persisted autotune winner's)."""
        return dataclasses.replace(self, configs=[self.configs[index]], launches=[self.launches[index]])


def call_options(call: BoundCall) -> dict[str, Any]:
    """The backend options a call's kernels are compiled with (over the spec's defaults)."""
    return {"enable_fp_fusion": call.enable_fp_fusion, "debug": call.debug, **dict(call.backend_options.items())}


class Evaluation(Value):
    """A call's user functions (heuristics, prune hook, perf model, a grid and zeroed outputs written as
    functions) evaluated once per lowering: the signature and the plan both read it. What they raised
    is raised again to each reader, not re-evaluated."""

    _fields = ("avals_in", "avals_out", "call", "done", "error")
    avals_in: Sequence[Any]
    avals_out: Sequence[Any]
    call: BoundCall
    done: "ResolvedCall | None"
    error: Exception | None

    def __init__(self, avals_in: Sequence[Any], avals_out: Sequence[Any], call: BoundCall) -> None:
        self.__dict__.update(avals_in=avals_in, avals_out=avals_out, call=call, done=None, error=None)

    def resolved(self) -> "ResolvedCall":
        if self.done is None:
            if self.error is not None:
                raise self.error
            try:
                order, results, aliases = outputs(self.call, self.avals_out)
                inputs = _grouped(self.call.arg_tree, _runtime_values(self.avals_in, self.call.scalars))
                self.done = order, results, aliases, inputs, resolve(self.call, inputs + results[:order.pointers])
            except Exception as error:
                self.error = error
                raise
        return self.done


# (output order, results in the kernel's order, aliases, runtime inputs, the kernel resolved)
ResolvedCall = tuple[OutputOrder, list[Any], tuple[tuple[int, int], ...], list[Any], Resolved]


def target_of(platform: str, compute_capability: Any, config: Config) -> Target:
    """The target a call is lowered for: its own compute capability, else the configured arch."""
    return resolve_target(platform, compute_capability, config.target_arch)


def _zeroed_bytes(zeroed: Sequence[tuple[int, ...]], order: OutputOrder, call: BoundCall, avals_in: Sequence[Any],
                  avals_out: Sequence[Any]) -> list[dict[int, int]]:
    """Per config, {runtime-argument position: bytes to zero} for the outputs it zeroes."""
    if not any(zeroed):
        return [{} for _ in zeroed]
    positions = _zero_positions(order, tuple(call.input_output_aliases.items()), call.scalars, len(avals_in))
    out_sizes = [_nbytes(a) for a in avals_out]  # the user's order, as zeroed_outputs counts
    return [{positions[i]: out_sizes[i] for i in outputs} for outputs in zeroed]


def _zero_positions(order: OutputOrder, aliases: Sequence[tuple[int, int]], scalars: Sequence[tuple[int, Any]],
                    num_inputs: int) -> dict[int, int]:
    """{the user's output index: the runtime argument jaxlib zeroes for it}: an output's own pointer
    (after the inputs and scalars), or, for an aliased output without one (jax-triton 0.4), the input's."""
    num_args = num_inputs + len(scalars)
    positions = {o: num_args + k for k, o in enumerate(order.order[:order.pointers])}
    scalar_at = {p for p, _ in scalars}
    array_at = [p for p in range(num_args) if p not in scalar_at]  # array i's runtime position
    for i, o in aliases:
        positions.setdefault(int(o), array_at[int(i)])
    return positions


def _nbytes(aval: Any) -> int:
    return math.prod(map(int, aval.shape)) * _dtype(aval.dtype)[1]


def dtype_name(dtype: Any) -> str:
    """numpy's name of a dtype (memoized: numpy computes it anew each time)."""
    return _dtype(dtype)[0]


def dtype_names(dtypes: Sequence[Any]) -> list[str]:
    return [_dtype(dtype)[0] for dtype in dtypes]


@functools.lru_cache(maxsize=256)
def _dtype(dtype: Any) -> tuple[str, int]:
    return np.dtype(dtype).name, int(np.dtype(dtype).itemsize)


def _runtime_values(in_avals: Sequence[Any], scalars: Sequence[tuple[int, Any]]) -> list[Any]:
    """The inputs with the scalars at their positions: the positional runtime args before the outputs."""
    values = list(in_avals)
    for position, value in scalars:
        values.insert(position, value)
    return values


def _grouped(arg_tree: Any, flat: list[Any]) -> list[Any]:
    """The flat runtime inputs as the kernel's parameters take them (a tuple parameter as one tuple)."""
    return flat if arg_tree is None else list(arg_tree.unflatten(flat))


def _leaf_names(names: list[str], grouped: list[Any]) -> list[str]:
    """A name per flat runtime value: the parameter's, with its path inside a tuple parameter."""
    if not any(isinstance(value, tuple) for value in grouped):
        return names[:len(grouped)]  # no tuple parameter: the names themselves
    out: list[str] = []

    def walk(name: str, value: Any) -> None:
        if isinstance(value, tuple):
            for i, item in enumerate(value):
                walk(f"{name}[{i}]", item)
        else:
            out.append(name)
    for name, value in zip(names, grouped):
        walk(name, value)
    return out


def plan_bound(platform: str, avals_in: Sequence[Any], params: Mapping[str, Any], config: Config) -> KernelPlan:
    """The plan of a call as it was bound, before its rule runs."""
    avals_out = [core.ShapedArray(shape, dtype) for shape, dtype in params["out_avals"]]
    return KernelPlan.of(platform, avals_in, avals_out, BoundCall(**params), config)
