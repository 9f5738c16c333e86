"""Put each kernel's cached cubin into the serialized call, so jaxlib loads it instead of running ptxas.

jaxlib's Python `TritonKernel` cannot set `module_image`; we append the field to every
`TritonKernel` message of a serialized `TritonAnyKernelCall`, in call order. Field numbers come from
the plugin's own schema.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, cast

from . import proto as pw
from .jaxlib_compat import ModuleImageLayout


class ModuleImage(NamedTuple):
    object_file: bytes  # cubin
    kernel_name: str
    shared_mem_bytes: int


def _edited(message: bytes, paths: list[tuple[int, ...]], edit: Callable[[bytes], bytes]) -> bytes:
    """`message` with `edit` applied, in order, to each message field at one of `paths` (field numbers,
    outermost first), in one pass."""
    out = []
    for f in pw.decode(message):
        tails = [path[1:] for path in paths if path[0] == f.number]
        if tails and f.wire_type == pw.LEN:
            value = cast(bytes, f.value)  # a message field holds bytes
            f = pw.Field(f.number, pw.LEN, edit(value) if tails == [()] else _edited(value, tails, edit))
        out.append(f)
    return pw.encode(out)


def inject(any_call: bytes, images: Sequence[ModuleImage], layout: ModuleImageLayout) -> bytes:
    """`any_call` (a serialized TritonAnyKernelCall) with images[i] in its i-th kernel."""
    remaining = list(images)

    def with_image(kernel: bytes) -> bytes:
        image = remaining.pop(0)
        message = [pw.Field(layout.object_file, pw.LEN, image.object_file),
                   pw.Field(layout.kernel_name, pw.LEN, image.kernel_name.encode())]
        if layout.shared_mem_bytes:
            message.append(pw.Field(layout.shared_mem_bytes, pw.VARINT, image.shared_mem_bytes))
        return pw.encode([*[g for g in pw.decode(kernel) if g.number != layout.image_field],
                          pw.Field(layout.image_field, pw.LEN, pw.encode(message))])

    out = _edited(any_call, [(layout.any_call_field, layout.kernel_field), (layout.any_autotuned_field,
                  layout.config_field, layout.config_call_field, layout.kernel_field)], with_image)
    if remaining:
        raise ValueError(f"{len(remaining)} module image(s) left over: the call has fewer kernels")
    return out
