"""What one Triton call compiles: its target, kernel configs and the runtime argument types, from the
call's parameters and the avals of its operands.

The lowering rule plans a call to build its custom call; `ahead` plans the calls traced so far to
start their compiles before their rules run. Both plan the same way, so a kernel compiled ahead is
the one the rule asks for (same spec, same content key).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jax import core

from compiler import KernelSpec, Target

from . import kernels
from .aliasing import OutputOrder
from .bound_call import BoundCall
from .configs import LaunchConfig, named_args, resolve_configs
from .target_arch import resolve_target


@dataclass(frozen=True)
class KernelPlan:
    target: Target
    fn: Any  # the @triton.jit function under any autotune / heuristics wrappers
    configs: list[LaunchConfig]
    args: list[Any]  # runtime argument types in order (tuple parameters kept as tuples)
    options: dict[str, Any]
    named: dict[str, Any]  # the kernel's runtime parameters by name, as heuristics see them
    metaparams: dict[str, Any]
    leaf_names: list[str]  # each flat runtime value's name (`yz[1]` inside a tuple parameter)
    order: OutputOrder
    avals_out: list[Any]  # the output avals as the call returns them
    results: list[Any]  # the output avals in the kernel's order
    aliases: tuple[tuple[int, int], ...]  # (input, output position in `results`)

    @classmethod
    def of(cls, platform: str, avals_in: Sequence[Any], avals_out: Sequence[Any], call: BoundCall) -> "KernelPlan":
        """The plan of `call` lowered for `platform`, its operands and results of these avals."""
        target = resolve_target(platform, call.compute_capability)
        meta = dict(call.metaparams)
        # jax-triton 0.4's in-place reading: aliased outputs get no pointer and go last among the results
        order = OutputOrder.of(len(avals_out), call.input_output_aliases, call.pointerless_aliases)
        results = [avals_out[o] for o in order.order]
        pointed = results[:order.pointers]
        aliases = tuple((int(i), order.position(int(o))) for i, o in call.input_output_aliases)
        inputs = _grouped(call.arg_tree, _runtime_values(avals_in, call.scalars))
        named = named_args(call.kernel, inputs + pointed, meta)
        fn, configs = resolve_configs(call.kernel, named, meta, num_warps=call.num_warps, num_stages=call.num_stages,
                                      num_ctas=call.num_ctas)
        flat_args = kernels.runtime_args([a.dtype for a in avals_in], call.scalars, [a.dtype for a in pointed])
        num_flat_inputs = len(avals_in) + len(call.scalars)
        args = (kernels.descriptors(_grouped(call.arg_tree, flat_args[:num_flat_inputs]))
                + flat_args[num_flat_inputs:])
        options = {"enable_fp_fusion": call.enable_fp_fusion, "debug": call.debug, **dict(call.backend_options)}
        return cls(target, fn, configs, args, options, named, meta, _leaf_names(list(named), inputs), order,
                   list(avals_out), results, aliases)

    def specs(self) -> list[KernelSpec]:
        return kernels.specs_for(self.fn, self.args, self.configs, self.target, self.options)


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


def plan_bound(platform: str, avals_in: Sequence[Any], params: Mapping[str, Any]) -> KernelPlan:
    """The plan of a call as it was bound (`triton_kernel_call_p` parameters), before its rule runs."""
    avals_out = [core.ShapedArray(shape, dtype) for shape, dtype in params["out_avals"]]
    return KernelPlan.of(platform, avals_in, avals_out, BoundCall.of(params))
