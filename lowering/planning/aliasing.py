"""Which outputs a kernel receives a pointer for: jax-triton 0.3 passes every output as a pointer after
the inputs, 0.4 none for an aliased one (the kernel writes into the input's buffer); a call says
which it means by the kernel's runtime parameter count (docs/clients.md, "In place"). Where aliased
outputs have no pointer, the custom call's results put them last and `OutputOrder` restores the
user's order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from .bound_call import BoundCall


def pointerless_aliases(kernel_name: str, param_names: Sequence[str], num_inputs: int, num_outputs: int,
                        aliases: Sequence[tuple[int, int]]) -> bool:
    """True for jax-triton 0.4's reading (aliased outputs get no pointer), False for 0.3's; an error
    naming both where the count fits neither. `num_inputs` counts arrays and scalars."""
    if not aliases:
        return False  # both readings agree: every output is a pointer after the inputs
    every, unaliased = num_inputs + num_outputs, num_inputs + num_outputs - len(aliases)
    if len(param_names) == unaliased:
        return True
    if len(param_names) >= every:
        return False
    raise TypeError(
        f"kernel '{kernel_name}' takes {len(param_names)} runtime arguments ({', '.join(param_names)}), which "
        f"fits neither reading of input_output_aliases={dict(aliases)}: jax-triton 0.3 passes every output "
        f"as a pointer after the {num_inputs} inputs and scalars ({every} arguments); jax-triton 0.4 passes "
        f"none for an aliased output, the kernel writing into the input's buffer ({unaliased} arguments)")


def array_indices(aliases: Sequence[tuple[int, int]], scalar_positions: Sequence[int],
                  num_operands: int) -> tuple[tuple[int, int], ...]:
    """jax-triton 0.4's alias inputs, counted over all operands (arrays and scalars), as indices
    among the arrays (how the custom call counts its operands); an index naming a scalar is an error."""
    scalars = sorted(scalar_positions)
    out = []
    for operand, output in aliases:
        if operand in scalars or not 0 <= operand < num_operands:
            raise ValueError(f"input_output_aliases entry {operand}: {output} names no array operand (jax-triton "
                             f"0.4 counts the kernel's operands, scalars included: {num_operands} of them)")
        out.append((operand - sum(1 for p in scalars if p < operand), output))
    return tuple(sorted(out))


class OutputOrder(NamedTuple):
    """The custom call's result order where aliased outputs have no pointer: pointer outputs first."""

    order: tuple[int, ...]  # order[k] = the user's output index of the call's result k
    pointers: int  # how many of them the kernel receives a pointer for (the first ones)
    identity: bool  # the call's results are already in the user's order

    @classmethod
    def of(cls, num_outputs: int, aliases: Iterable[tuple[int, int]], pointerless: bool) -> "OutputOrder":
        aliased = {o for _, o in aliases} if pointerless else set()
        kept = [o for o in range(num_outputs) if o not in aliased]
        order = tuple(kept + sorted(aliased))
        return cls(order, len(kept), order == tuple(range(num_outputs)))

    def results(self, values: Sequence[Any]) -> list[Any]:
        out: list[Any] = [None] * len(values)
        for k, o in enumerate(self.order):
            out[o] = values[k]
        return out


class CallShape(NamedTuple):
    """What `custom_call.emit` reads of a plan, known from the call and its output avals alone: a call
    served by its signature is emitted from this (`CallShape(call, platform, *outputs(call, avals_out))`)."""

    call: BoundCall
    platform: str
    order: OutputOrder
    results: list[Any]
    aliases: tuple[tuple[int, int], ...]


def outputs(call: BoundCall, avals_out: Sequence[Any]) -> tuple[OutputOrder, list[Any], tuple[tuple[int, int], ...]]:
    """(the results' order, the output avals in the kernel's order, (input, result position) aliases)."""
    order = OutputOrder.of(len(avals_out), call.input_output_aliases.items(), call.pointerless_aliases)
    results = [avals_out[o] for o in order.order]
    return order, results, tuple((int(i), order.order.index(int(o))) for i, o in call.input_output_aliases.items())
