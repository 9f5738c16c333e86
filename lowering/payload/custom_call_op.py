"""The stablehlo.custom_call op of a Triton call, built as JAX's `mlir.custom_call` builds it, in fewer steps.

JAX's builder is general (shape operands, tilings, called computations) and makes every attribute
anew, each layout through a numpy array: ~70-100 us of a warm call's ~0.5 ms. This builds the same
attributes for what a Triton call uses (row-major layouts, operand aliases, a string or dictionary
backend config) and keeps the ones a module's calls share (empty called computations, layouts by
rank, the version number) in the module's own `lowering_cache`, which lives and dies with it (MLIR
attributes belong to its context). tests/test_custom_call_op.py checks the op against JAX's own,
attribute by attribute, for each form; the two must print the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jax.interpreters.mlir import ir  # jaxlib's MLIR bindings, as jax re-exports them
from jaxlib.mlir.dialects import stablehlo as hlo  # the dialect JAX builds its ops with

_SHARED = "lowering.payload.custom_call_op"  # our entry in a JAX module's per-module cache


def build(module: Any, target: str, result_types: Sequence[Any], operands: Sequence[Any],
          backend_config: bytes | Mapping[str, Any], api_version: int, operand_output_aliases: Mapping[int, int],
          has_side_effect: bool) -> Any:
    """The op `mlir.custom_call(target, ..., operand_layouts=row-major, result_layouts=row-major)`
    would build (the ranks read from the operands' and results' types). A dictionary backend config
    goes where JAX puts one: an empty `backend_config`, API version 1 and the dictionary as
    `mhlo.backend_config` (XLA reads it as a typed-FFI call)."""
    shared = _shared(module)
    if isinstance(backend_config, bytes):
        config, dictionary = ir.StringAttr.get(backend_config), None
    else:
        config, dictionary, api_version = ir.StringAttr.get(""), ir.DictAttr.get(dict(backend_config)), 1
    attributes = {
        "call_target_name": ir.StringAttr.get(target),
        "has_side_effect": ir.BoolAttr.get(has_side_effect),
        "backend_config": config,
        "api_version": _version(shared, api_version),
        "called_computations": _none(shared),
        "output_operand_aliases": ir.ArrayAttr.get([
            hlo.OutputOperandAlias.get(output_tuple_indices=[output] if len(result_types) > 1 else [],
                                       operand_index=operand, operand_tuple_indices=[])
            for operand, output in operand_output_aliases.items()]),
        "operand_layouts": ir.ArrayAttr.get([_layout(shared, ir.RankedTensorType(v.type).rank) for v in operands]),
        "result_layouts": ir.ArrayAttr.get([_layout(shared, ir.RankedTensorType(t).rank) for t in result_types]),
    }
    op = hlo.CustomCallOp.build_generic(results=list(result_types), operands=list(operands), attributes=attributes)
    if dictionary is not None:
        op.operation.attributes["mhlo.backend_config"] = dictionary
    return op


def _shared(module: Any) -> dict[Any, Any]:
    """This module's attributes kept by value (a fresh dict where the module keeps no cache)."""
    cache = getattr(module, "lowering_cache", None)
    if not isinstance(cache, dict):
        return {}
    found = cache.get(_SHARED)
    if found is None:
        found = cache[_SHARED] = {}
    return found


def _layout(shared: dict[Any, Any], rank: int) -> Any:
    found = shared.get(rank)
    if found is None:  # dims in descending order, as JAX writes a row-major layout
        found = shared[rank] = ir.Attribute.parse(
            f"dense<[{', '.join(map(str, range(rank - 1, -1, -1)))}]> : tensor<{rank}xindex>" if rank else
            "dense<> : tensor<0xindex>")
    return found


def _version(shared: dict[Any, Any], version: int) -> Any:
    found = shared.get(("version", version))
    if found is None:
        found = shared[("version", version)] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32), version)
    return found


def _none(shared: dict[Any, Any]) -> Any:
    found = shared.get("none")
    if found is None:
        found = shared["none"] = ir.ArrayAttr.get([])
    return found
