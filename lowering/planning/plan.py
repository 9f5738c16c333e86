"""One Triton call resolved: what the user asked (`BoundCall`) and everything the lowering derives from
it and the operands' avals before reading a kernel: target, configs, runtime argument types, each
config's launch, the payload's call fields and the operand shapes.

The plan is the call object the rest of the lowering takes (records, winners, emitter). The rule
plans a call to build its custom call; `ahead` plans the calls traced so far to start their
compiles before their rules run. Both plan the same way, so a kernel compiled ahead is the one the
rule asks for (same spec, same content key).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from compiler import KernelSpec, Target, make_spec, parse_target
from kernel_cache import Config
from kernel_cache.errors import KernelCacheError

from ..payload.jaxlib_compat import triton_module
from . import kernels
from .aliasing import OutputOrder, outputs
from .bound_call import BoundCall
from .configs import LaunchConfig, Resolved, resolve


class Launch(NamedTuple):
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


class KernelPlan(NamedTuple):
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
        target = target_of(platform, call.compute_capability, config.target_arch)
        evaluation = evaluation if evaluation is not None else Evaluation(avals_in, avals_out, call)
        order, results, aliases, inputs, resolved = evaluation.resolved()
        args = kernels.argument_types([a.dtype for a in avals_in], call.scalars,
                                      [a.dtype for a in results[:order.pointers]], call.arg_tree,
                                      aligned=call.aligned_pointers)
        zeroed_bytes = _zeroed_bytes(resolved.zeroed, order, call, avals_in, avals_out)
        launches = [Launch(grid=grid, zeroed_bytes=zeroed, description=c.description, bound=frozenset(c.constexprs))
                    for c, grid, zeroed in zip(resolved.configs, resolved.grids, zeroed_bytes, strict=True)]
        leaf_names = _leaf_names(list(resolved.named), inputs)
        info = CallInfo(
            name=call.name, kernel_name=resolved.fn.__name__,
            scalar_desc=str({leaf_names[p]: v for p, v in call.scalars}),
            compute_capability=int(target.arch) if target.backend == "cuda" else 0,  # an int for cuda
            aliases=aliases, num_inputs=len(avals_in), in_sizes=tuple(map(_nbytes, avals_in)),
            serialized_metadata=bytes(call.serialized_metadata), debug=call.debug)
        shapes = [(tuple(map(int, a.shape)), dtype_info(a.dtype)[0]) for a in (*avals_in, *results)]
        return cls(call=call, platform=platform, target=target, fn=resolved.fn, configs=resolved.configs, args=args,
                   options=call_options(call), named=resolved.named, metaparams=dict(call.metaparams.items()),
                   leaf_names=leaf_names, order=order, avals_in=list(avals_in), avals_out=list(avals_out),
                   results=results, aliases=aliases, launches=launches, info=info, shapes=shapes)

    def specs(self) -> list[KernelSpec]:
        return [make_spec(self.fn, self.args, dict(c.constexprs), target=self.target, num_warps=c.num_warps,
                          num_stages=c.num_stages, num_ctas=c.num_ctas, **self.options) for c in self.configs]


def call_options(call: BoundCall) -> dict[str, Any]:
    """The backend options a call's kernels are compiled with (over the spec's defaults)."""
    return {"enable_fp_fusion": call.enable_fp_fusion, "debug": call.debug, **dict(call.backend_options.items())}


class Evaluation:
    """A call's user functions (heuristics, prune hook, perf model, a grid and zeroed outputs written as
    functions) evaluated once per lowering: the signature and the plan both read it. What they raised
    is raised again to each reader, not re-evaluated."""

    def __init__(self, avals_in: Sequence[Any], avals_out: Sequence[Any], call: BoundCall) -> None:
        self.avals_in, self.avals_out, self.call = avals_in, avals_out, call
        self.done: ResolvedCall | Exception | None = None

    def resolved(self) -> "ResolvedCall":
        if self.done is None:
            try:
                order, results, aliases = outputs(self.call, self.avals_out)
                flat = list(self.avals_in)  # the positional runtime args before the outputs: scalars at their places
                for position, value in self.call.scalars:
                    flat.insert(position, value)
                tree = self.call.arg_tree  # a tuple parameter as one tuple, as the kernel takes it
                inputs = flat if tree is None else list(tree.unflatten(flat))
                self.done = order, results, aliases, inputs, resolve(self.call, inputs + results[:order.pointers])
            except Exception as error:
                self.done = error
        if isinstance(self.done, Exception):
            raise self.done
        return self.done


# (output order, results in the kernel's order, aliases, runtime inputs, the kernel resolved)
ResolvedCall = tuple[OutputOrder, list[Any], tuple[tuple[int, int], ...], list[Any], Resolved]


ENV_VAR = "KERNEL_CACHE_TARGET_ARCH"


class NoTargetError(KernelCacheError, RuntimeError):
    """Lowering for a GPU platform with no GPU visible and no explicit architecture."""


@functools.lru_cache(maxsize=256)  # asked once per call: resolved once per arch
def target_of(platform: str, compute_capability: "int | str | None", configured: "int | str | None") -> Target:
    """The target a call is lowered for: its own compute capability, else the configured arch
    (`configured`: KERNEL_CACHE_TARGET_ARCH), else the device's. The configured one comes before the
    device so that cross-lowering and prewarming on a GPU-less host are explicit."""
    arch = compute_capability if compute_capability is not None else (configured or _device_arch(platform))
    target = parse_target(arch)
    if target.backend != ("cuda" if platform == "cuda" else "hip"):
        raise ValueError(f"target {target.name} is not a {platform} architecture "
                         f"(check compute_capability / {ENV_VAR})")
    return target


@functools.cache
def first_device(platform: str) -> Any:
    """JAX's first device of `platform`, None where it has none."""
    import jax

    try:
        devices = jax.devices(platform)
    except RuntimeError:
        return None
    return devices[0] if devices else None


def _device_arch(platform: str) -> "int | str":
    device = first_device(platform)
    if device is None:
        example = "compute_capability=90" if platform == "cuda" else "compute_capability='gfx942'"
        raise NoTargetError(
            f"lowering a Triton kernel for '{platform}' needs the GPU architecture, and this host has "
            f"no {platform} device to read it from: pass {example} to triton_call, or set "
            f"{ENV_VAR} (e.g. sm_90 or gfx942)")
    if platform == "cuda":
        major, _, minor = str(device.compute_capability).partition(".")
        return int(major) * 10 + int(minor or 0)
    return str(triton_module("rocm").get_arch_details(device.id).split(":")[0])


def _zeroed_bytes(zeroed: Sequence[tuple[int, ...]], order: OutputOrder, call: BoundCall, avals_in: Sequence[Any],
                  avals_out: Sequence[Any]) -> list[dict[int, int]]:
    """Per config, {runtime-argument position: bytes to zero} for the outputs it zeroes. An output's
    position is its own pointer's (after the inputs and scalars), or, for an aliased output without
    one (jax-triton 0.4), the input's."""
    if not any(zeroed):
        return [{} for _ in zeroed]
    num_args = len(avals_in) + len(call.scalars)
    positions = {o: num_args + k for k, o in enumerate(order.order[:order.pointers])}  # by the user's output index
    scalar_at = {p for p, _ in call.scalars}
    array_at = [p for p in range(num_args) if p not in scalar_at]  # array i's runtime position
    for i, o in call.input_output_aliases.items():
        positions.setdefault(int(o), array_at[int(i)])
    out_sizes = [_nbytes(a) for a in avals_out]  # the user's order, as zeroed_outputs counts
    return [{positions[i]: out_sizes[i] for i in outputs} for outputs in zeroed]


def _nbytes(aval: Any) -> int:
    return math.prod(map(int, aval.shape)) * dtype_info(aval.dtype)[1]


@functools.lru_cache(maxsize=256)  # numpy computes a dtype's name anew each time
def dtype_info(dtype: Any) -> tuple[str, int]:
    """(numpy's name of a dtype, its item size)."""
    return np.dtype(dtype).name, int(np.dtype(dtype).itemsize)


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
