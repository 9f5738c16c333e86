"""Put each kernel's cached cubin into the serialized call, so jaxlib loads it instead of running ptxas.

jaxlib's Python `TritonKernel` cannot set `module_image`; we append the field to every
`TritonKernel` message of a serialized `TritonAnyKernelCall`, in call order. Field numbers come from
the plugin's own schema.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, cast

from . import proto as pw
from .jaxlib_compat import ModuleImageLayout


class ModuleImage(NamedTuple):
    object_file: bytes  # cubin
    kernel_name: str
    shared_mem_bytes: int


def _with_image(call: bytes, image: ModuleImage, layout: ModuleImageLayout) -> bytes:
    message = [pw.Field(layout.object_file, pw.LEN, image.object_file),
               pw.Field(layout.kernel_name, pw.LEN, image.kernel_name.encode())]
    if layout.shared_mem_bytes:
        message.append(pw.Field(layout.shared_mem_bytes, pw.VARINT, image.shared_mem_bytes))
    out = []
    for f in pw.decode(call):
        if f.number == layout.kernel_field and f.wire_type == pw.LEN:
            kernel = [g for g in pw.decode(cast(bytes, f.value)) if g.number != layout.image_field]  # LEN: bytes
            kernel.append(pw.Field(layout.image_field, pw.LEN, pw.encode(message)))
            f = pw.Field(f.number, pw.LEN, pw.encode(kernel))
        out.append(f)
    return pw.encode(out)


def inject(any_call: bytes, images: Sequence[ModuleImage], layout: ModuleImageLayout) -> bytes:
    """`any_call` (a serialized TritonAnyKernelCall) with images[i] in its i-th kernel."""
    remaining = list(images)
    out = []
    for f in pw.decode(any_call):
        if f.number == layout.any_call_field and f.wire_type == pw.LEN:
            f = pw.Field(f.number, pw.LEN, _with_image(cast(bytes, f.value), remaining.pop(0), layout))
        elif f.number == layout.any_autotuned_field and f.wire_type == pw.LEN:
            tuned = []
            for g in pw.decode(cast(bytes, f.value)):
                if g.number == layout.config_field:
                    config = []
                    for h in pw.decode(cast(bytes, g.value)):  # a message field holds bytes
                        if h.number == layout.config_call_field:
                            h = pw.Field(h.number, pw.LEN, _with_image(cast(bytes, h.value), remaining.pop(0), layout))
                        config.append(h)
                    g = pw.Field(g.number, pw.LEN, pw.encode(config))
                tuned.append(g)
            f = pw.Field(f.number, pw.LEN, pw.encode(tuned))
        out.append(f)
    if remaining:
        raise ValueError(f"{len(remaining)} module image(s) left over: the call has fewer kernels")
    return pw.encode(out)
