"""Read back what a lowering emitted: the Triton custom calls of a lowered JAX program, decoded.

For tests and debugging ("which kernel, which grid, PTX or cubin?"), without jaxlib's protobuf
module, which is not shipped to Python.
"""

from __future__ import annotations

import zlib
from typing import Any

from lowering.payload import proto as pw

# Field numbers of jaxlib/gpu/triton.proto (stable since the proto was introduced).
_SCALAR_KINDS = {2: "bool", 3: "i32", 4: "u32", 5: "i64", 6: "u64", 7: "f32", 8: "f64"}


def custom_calls(lowered) -> list[dict]:
    """[{target, api_version, name, call}] for every Triton custom call in `lowered` (a jax Lowered)."""
    from jax._src.lib.mlir import ir

    module = lowered.compiler_ir("stablehlo")
    found: list[dict] = []

    def visit(op) -> None:
        if op.operation.name == "stablehlo.custom_call":
            attrs = op.operation.attributes
            target = ir.StringAttr(attrs["call_target_name"]).value
            if target.startswith("triton_kernel_call"):
                api = ir.IntegerAttr(attrs["api_version"]).value
                if "mhlo.backend_config" in attrs:
                    config = ir.DictAttr(attrs["mhlo.backend_config"])
                    payload = ir.StringAttr(config["opaque"]).value_bytes
                else:
                    payload = ir.StringAttr(attrs["backend_config"]).value_bytes
                found.append({"target": target, "api_version": api, **decode_any_call(zlib.decompress(payload))})
        for region in op.operation.regions:
            for block in region.blocks:
                for inner in block.operations:
                    visit(inner)

    for op in module.body.operations:
        visit(op)
    return found


def decode_kernel(raw: bytes) -> dict:
    f = pw.decode(raw)
    out = {"kernel_name": pw.first(f, 1, b"").decode(), "num_warps": pw.first(f, 2, 0),
           "shared_mem_bytes": pw.first(f, 3, 0), "ptx": pw.first(f, 4, b"").decode(),
           "ttir": pw.first(f, 5, b"").decode(), "compute_capability": pw.first(f, 6, 0),
           "num_ctas": pw.first(f, 10, 1)}
    image = pw.first(f, 11)
    if image is not None:
        g = pw.decode(image)
        out["module_image"] = {"object_file": pw.first(g, 1, b""), "kernel_name": pw.first(g, 2, b"").decode(),
                               "shared_mem_bytes": pw.first(g, 3, 0)}
    return out


def _scalar(kind: str, wire: int, value: int) -> Any:
    import struct

    if kind == "f32":
        return struct.unpack("<f", value.to_bytes(4, "little"))[0]
    if kind == "f64":
        return struct.unpack("<d", value.to_bytes(8, "little"))[0]
    if kind in ("i32", "i64") and value >= 1 << 63:
        return value - (1 << 64)
    return bool(value) if kind == "bool" else value


def _repeated(fields, number: int) -> list[int]:
    """A repeated integer field, packed (one length-delimited run of varints) or not."""
    out = []
    for value in pw.all_of(fields, number):
        if isinstance(value, bytes):
            pos = 0
            while pos < len(value):
                item, pos = pw.read_varint(value, pos)
                out.append(item)
        else:
            out.append(value)
    return out


def decode_kernel_call(raw: bytes) -> dict:
    f = pw.decode(raw)
    params = []
    for p in pw.all_of(f, 5):
        (field,) = pw.decode(p)
        if field.number == 1:
            a = pw.decode(field.value)
            params.append({"array": {"bytes_to_zero": pw.first(a, 1, 0), "ptr_divisibility": pw.first(a, 2, 0)}})
        elif field.number == 9:  # TensorDescriptor { nvidia = 1 { elem_type, swizzle, shape, strides, block_shape, oob_fill } }
            n = pw.decode(pw.first(pw.decode(field.value), 1, b""))
            params.append({"tma": {"elem_type": pw.first(n, 1, 0), "swizzle": pw.first(n, 2, 0),
                                   "shape": _repeated(n, 3), "strides": _repeated(n, 4),
                                   "block_shape": _repeated(n, 5), "oob_fill": pw.first(n, 6, 0)}})
        else:
            kind = _SCALAR_KINDS[field.number]
            params.append({kind: _scalar(kind, field.wire_type, field.value)})
    return {"kernel": decode_kernel(pw.first(f, 1, b"")),
            "grid": (pw.first(f, 2, 0), pw.first(f, 3, 0), pw.first(f, 4, 0)), "parameters": params}


def decode_any_call(raw: bytes) -> dict:
    """A TritonAnyKernelCall as a dict: {name, metadata, kernel_call | autotuned}."""
    f = pw.decode(raw)
    out: dict = {"name": pw.first(f, 4, b"").decode(), "metadata": pw.first(f, 3, b"")}
    if (call := pw.first(f, 1)) is not None:
        out["kernel_call"] = decode_kernel_call(call)
    if (tuned := pw.first(f, 2)) is not None:
        t = pw.decode(tuned)
        configs = []
        for c in pw.all_of(t, 2):
            g = pw.decode(c)
            configs.append({"kernel_call": decode_kernel_call(pw.first(g, 1, b"")),
                            "description": pw.first(g, 2, b"").decode()})
        aliases = []
        for a in pw.all_of(t, 3):
            g = pw.decode(a)
            aliases.append((pw.first(g, 1, 0), pw.first(g, 2, 0), pw.first(g, 3, 0)))
        out["autotuned"] = {"name": pw.first(t, 1, b"").decode(), "configs": configs, "aliases": aliases}
    return out
