"""Assemble jaxlib's Triton call (plain or autotuned) from artifacts and emit the XLA custom call.

Plain calls use the CUDA-graph-compatible FFI target where the plugin registers it; autotuned calls
stay on the legacy target, where jaxlib's autotuner is known to work (illegal memory accesses were
seen with autotuned kernels on the FFI target).
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np
from jax.interpreters.mlir import ir  # jaxlib's MLIR bindings, as jax re-exports them
from jaxlib.mlir.dialects import stablehlo as hlo  # what jax's own `hlo` alias names

from compiler import KernelSpec, TensorDesc
from compiler import triton_compat as compiler_tc
from kernel_cache import Config
from kernel_cache.lazy import later

from ..payload import deflate
from ..payload import jaxlib_compat as compat
from ..planning.aliasing import CallShape
from ..planning.plan import CallInfo, KernelPlan, Launch

if TYPE_CHECKING:
    from compiler import Artifact

    from ..payload import module_image
else:  # the module image is built only for a call lowered kernel by kernel (a warm call's payload is its record's)
    module_image = later("lowering.payload.module_image")


class ConfigCall(NamedTuple):
    """One config's compiled kernel and how to launch it."""

    spec: KernelSpec
    artifact: Artifact
    launch: Launch


def _parameters(module: ModuleType, call: ConfigCall, args: Sequence[Any]) -> list[Any]:
    """One TritonParameter per runtime value the compiled kernel still takes (jaxlib's are flat:
    `position` counts flat values, as zeroing does)."""
    spec = call.spec
    names = [n for n in spec.kernel.arg_names if n not in call.launch.bound]
    params: list[Any] = []
    position = 0
    descriptors = iter(call.artifact.extra.get("tensordesc_meta") or ())

    def add(ty: Any, value: Any, path: tuple[int, ...]) -> None:
        nonlocal position
        if isinstance(ty, tuple):
            for i, (item_ty, item) in enumerate(zip(ty, value)):
                add(item_ty, item, (*path, i))
            return
        if ty == "constexpr":  # an int equal to 1, specialized away as Triton's launcher does
            pass
        elif ty.startswith("tensordesc"):
            params.extend(_descriptor_parameters(module, value, next(descriptors, None), spec.name))
        elif ty.startswith("*"):
            aligned = ["tt.divisibility", 16] in spec.attrs.get(path, [])
            params.append(module.create_array_parameter(call.launch.zeroed_bytes.get(position, 0),
                                                        16 if aligned else 0))
        else:
            value = getattr(value, "value", value)  # a compiler.Scalar carries its own type
            params.append(module.create_scalar_parameter(value, "i1" if ty == "u1" else ty))  # jaxlib's name for u1
        position += 1

    for name, value in zip(names, args):
        add(spec.signature[name], value, (spec.kernel.arg_names.index(name),))
    return params


def _descriptor_parameters(module: ModuleType, desc: TensorDesc, meta: dict[str, Any] | None, kernel: str) -> list[Any]:
    """A host-side TMA descriptor as jaxlib launches it: the descriptor (from the compiled kernel's
    swizzle, element type and block), then its shape (i32 each) and strides (i64 each)."""
    if meta is None:
        raise compat.JaxlibSupportError(f"kernel '{kernel}' takes a TensorDescriptor but its compiled metadata "
                                        f"describes none (Triton >= 3.7 records them)")
    if meta.get("is_im2col") or meta.get("fp4_padded"):
        raise NotImplementedError("im2col and fp4-padded TMA descriptors are not supported (nor by jax-triton 0.4)")
    if desc.round_f32_to_tf32 and desc.dtype != "fp32":
        raise ValueError(f"TMA descriptors with round_f32_to_tf32=True must have a float32 input type, got {desc.dtype}")
    elem_type = compiler_tc.tma_host_elem_type(int(meta["elem_type"]), desc.round_f32_to_tf32)
    out = [module.create_tma_descriptor_parameter(
        elem_type=elem_type, swizzle=int(meta["swizzle"]), shape=list(desc.shape), strides=list(desc.strides),
        block_shape=[int(b) for b in meta["block_size"]], oob_fill=1 if desc.padding == "nan" else 0)]
    out += [module.create_scalar_parameter(int(d), "i32") for d in desc.shape]
    out += [module.create_scalar_parameter(int(s), "i64") for s in desc.strides]
    return out


def serialized_call(platform: str, calls: Sequence[ConfigCall], args: Sequence[Any], info: CallInfo,
                    config: Config) -> bytes:
    """The zlib-compressed TritonAnyKernelCall proto for these configs."""
    layout: Any = compat.module_image_layout(platform, config)
    module = compat.triton_module(platform)
    kernel_calls = []
    for call in calls:
        art, binary = call.artifact, cast(str, call.artifact.ptx)  # from_entry refused an entry without its binary
        if platform == "rocm":  # jaxlib reads the HSACO from a file path, then deletes the file
            fd, binary = tempfile.mkstemp(suffix=".hsaco", prefix="kernel-cache-")
            with os.fdopen(fd, "wb") as f:
                f.write(cast(bytes, art.hsaco))
        kernel = compat.make_triton_kernel(module, compat.KernelFields(
            name=art.name, num_warps=art.num_warps, num_ctas=art.num_ctas, shared_mem=art.shared_mem,
            binary=binary, ttir=(art.ttir or "") if info.debug else "", compute_capability=info.compute_capability,
            global_scratch_size=art.global_scratch_size, global_scratch_align=art.global_scratch_align))
        kernel_calls.append(module.TritonKernelCall(kernel, *call.launch.grid, _parameters(module, call, args)))
    if len(kernel_calls) == 1:
        launch = kernel_calls[0]
    else:
        launch = module.TritonAutotunedKernelCall(
            f"{info.name} ({info.kernel_name}) {info.scalar_desc}",
            [(k, c.launch.description) for k, c in zip(kernel_calls, calls)],
            # (input buffer, output buffer counted after the inputs, bytes): restored between configs
            [(i, info.num_inputs + o, info.in_sizes[i]) for i, o in info.aliases])
    proto = launch.to_proto(info.name, info.serialized_metadata)
    cubins = [c.artifact.blobs.get("cubin") for c in calls]  # the blobs themselves: asked once each
    with_image = layout is not None and all(cubins)
    if with_image:
        proto = module_image.inject(proto, [module_image.ModuleImage(cast(bytes, cubin), c.artifact.name,
                                                                      c.artifact.shared_mem)
                                            for c, cubin in zip(calls, cubins)], layout)
    parts = []  # (bytes, their deflate run) of each kernel's PTX and of the cubins in the module image
    for call, cubin in zip(calls, cubins):
        art, ptx = call.artifact, call.artifact.blobs.get("ptx")
        if platform == "cuda" and ptx:
            parts.append((ptx, deflate.deflated(ptx, art.deflated("ptx"))))
        if with_image and cubin:
            parts.append((cubin, deflate.deflated(cubin, art.deflated("cubin"))))
    return deflate.compress(proto, parts)


def emit(ctx: Any, operands: Sequence[Any], plan: KernelPlan | CallShape, payload: bytes, *,
         autotuned: bool) -> Sequence[ir.Value[Any]]:
    """The stablehlo custom call launching `payload` for `plan`, its results in the user's order, with the
    cost_estimate where jax-triton 0.4 puts it (docs/clients.md, "cost_estimate")."""
    call, platform, target_name = plan.call, plan.platform, plan.call.custom_call_target
    result_types = [compat.ir_type(ctx, aval) for aval in plan.results]  # the kernel's order: pointer outputs first
    ranks = ([a.ndim for a in ctx.avals_in], [a.ndim for a in plan.results])  # laid out row-major
    use_ffi = not autotuned and target_name != compat.LEGACY_TARGET and compat.ffi_target_registered(platform)
    if target_name == compat.FFI_TARGET and not use_ffi:
        raise compat.JaxlibSupportError(
            f"custom_call_target_name='{compat.FFI_TARGET}' needs a non-autotuned call and a jaxlib whose "
            f"{platform} plugin registers that target")
    backend_config: bytes | dict[str, ir.Attribute]
    estimate = json.dumps(dict(call.cost_estimate)) if call.cost_estimate else None
    if use_ffi:
        target, api_version = compat.FFI_TARGET, 4
        backend_config = {"name": ir.StringAttr.get(call.name), "opaque": ir.StringAttr.get(payload)}
        if estimate is not None:
            backend_config["cost_estimate_json"] = ir.StringAttr.get(estimate)
    else:
        target, api_version, backend_config = compat.LEGACY_TARGET, 2, payload
    op = _build_op(target, result_types, list(operands), backend_config, api_version, ranks, dict(plan.aliases),
                   call.has_side_effect)
    if estimate is not None and not use_ffi:
        op.attributes["mhlo.frontend_attributes"] = ir.DictAttr.get({"cost_estimate_json": ir.StringAttr.get(estimate)})
    return op.results if plan.order.identity else plan.order.results(op.results)


def _build_op(target: str, result_types: list[Any], operands: list[Any], backend_config: bytes | dict[str, Any],
              api_version: int, ranks: tuple[list[int], list[int]], aliases: dict[int, int],
              has_side_effect: bool) -> Any:
    """The op `mlir.custom_call` builds for these arguments, attribute for attribute (a test holds the
    two equal): JAX's builder makes each layout through two numpy conversions and a type lookup,
    nearly half its cost, once per Triton call lowered."""
    if isinstance(backend_config, dict):  # as JAX's builder: an empty string, the dict beside it, api_version 1
        config_attr, api_version = ir.StringAttr.get(""), 1
    else:
        config_attr = ir.StringAttr.get(backend_config)
    index, (ranks_in, ranks_out) = ir.IndexType.get(), ranks
    attributes = {
        "call_target_name": ir.StringAttr.get(target),
        "has_side_effect": ir.BoolAttr.get(has_side_effect),
        "backend_config": config_attr,
        "api_version": ir.IntegerAttr.get(ir.IntegerType.get_signless(32), api_version),
        "called_computations": ir.ArrayAttr.get([]),
        "output_operand_aliases": ir.ArrayAttr.get([
            hlo.OutputOperandAlias.get(output_tuple_indices=[output] if len(result_types) > 1 else [],
                                       operand_index=operand, operand_tuple_indices=[])
            for operand, output in aliases.items()]),
        "operand_layouts": ir.ArrayAttr.get([ir.DenseIntElementsAttr.get(_row_major(rank), type=index)
                                             for rank in ranks_in]),
        "result_layouts": ir.ArrayAttr.get([ir.DenseIntElementsAttr.get(_row_major(rank), type=index)
                                            for rank in ranks_out]),
    }
    op = hlo.CustomCallOp.build_generic(results=result_types, operands=operands, attributes=attributes)
    if isinstance(backend_config, dict):
        op.operation.attributes["mhlo.backend_config"] = ir.DictAttr.get(backend_config)
    return op


@functools.lru_cache(maxsize=64)
def _row_major(rank: int) -> Any:  # an int64 ndarray (MLIR's stubs type the attribute's buffer narrowly)
    found = np.arange(rank - 1, -1, -1, dtype=np.int64)
    found.flags.writeable = False
    return found
