"""The custom call op the rule builds itself (`custom_call._build_op`) is, attribute for attribute,
the op JAX's `mlir.custom_call` builds for the same arguments, on every stack: FFI and legacy
targets, aliases with one and several results, side effects, operands of rank 0 to 3."""

from __future__ import annotations

import itertools
import re

import pytest
from jax._src.interpreters import mlir
from jax._src.lib.mlir.dialects import func
from jax.interpreters.mlir import ir

from lowering.frontend import custom_call

RANKS = [(0, 1), (1, 2, 3), (2,)]  # the operands' ranks per case (results: the same ranks, in order)


def _both(ranks_in, ranks_out, backend_config, api_version, aliases, side_effect):
    with mlir.make_ir_context(), ir.Location.unknown():
        module = ir.Module.create()
        f32 = ir.F32Type.get()

        def tensor(rank):
            return ir.RankedTensorType.get([4] * rank, f32)

        results = [tensor(r) for r in ranks_out]
        with ir.InsertionPoint(module.body):
            block = func.FuncOp("f", ([tensor(r) for r in ranks_in], results)).add_entry_block()
        with ir.InsertionPoint(block):
            operands = list(block.arguments)
            config = backend_config() if callable(backend_config) else backend_config
            ours = custom_call._build_op("triton_kernel_call", results, operands, config, api_version,
                                         (list(ranks_in), list(ranks_out)), dict(aliases), side_effect)
            config = backend_config() if callable(backend_config) else backend_config
            jaxs = mlir.custom_call(
                "triton_kernel_call", result_types=results, operands=operands, backend_config=config,
                api_version=api_version, operand_layouts=[list(reversed(range(r))) for r in ranks_in],
                result_layouts=[list(reversed(range(r))) for r in ranks_out], operand_output_aliases=dict(aliases),
                has_side_effect=side_effect)
            return _unnamed(ours), _unnamed(jaxs), ours.operation.verify()


def _unnamed(op):
    """The op's text without its result's SSA name (the two ops differ in that alone)."""
    return re.sub(r"^%\w+(:\d+)? = ", "", str(op))


def _ffi_config():
    return {"name": ir.StringAttr.get("call"), "opaque": ir.StringAttr.get(b"\x00payload\xff"),
            "cost_estimate_json": ir.StringAttr.get('{"flops": 1.0}')}


@pytest.mark.parametrize("ranks, target, side_effect", list(itertools.product(RANKS, ["legacy", "ffi"], [False, True])))
def test_the_op_is_jaxs_own(ranks, target, side_effect):
    config, api_version = (b"\x00legacy payload\xff", 2) if target == "legacy" else (_ffi_config, 4)  # as `emit` passes
    for ranks_out in (ranks[:1], ranks):  # one result (an alias names no tuple index), and several
        last = len(ranks) - 1  # aliased to the output of its own rank
        for aliases in ({}, {0: 0}, {last: ranks_out.index(ranks[last])} if ranks[last] in ranks_out else {}):
            ours, jaxs, verified = _both(ranks, ranks_out, config, api_version, aliases, side_effect)
            assert ours == jaxs
            assert verified
            assert ours.count("operand_index") == len(aliases)


def test_the_layouts_are_row_major_constants():
    assert custom_call._row_major(3).tolist() == [2, 1, 0]
    assert custom_call._row_major(0).tolist() == []
    assert custom_call._row_major(3) is custom_call._row_major(3)
    with pytest.raises(ValueError):
        custom_call._row_major(2)[0] = 5  # shared between calls: never edited
