"""jaxlib shims: TritonKernel constructors across releases, the embedded proto schema, module_image."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import pytest
from inspect_call import custom_calls, decode_any_call

import compiler
from kernel_cache import current_config
from lowering import examples as ep
from lowering.payload import jaxlib_compat as compat
from lowering.payload import proto as pw
from lowering.payload.module_image import ModuleImage, inject
from lowering.payload.proto import schemas_from_binary

FIELDS = compat.KernelFields(name="k", num_warps=4, num_ctas=1, shared_mem=128, binary="PTX", ttir="",
                             compute_capability=90)


def _fake_kernel_class(arity: int, scratch: bool):
    class TritonKernel:
        def __init__(self, *args, **kwargs):
            if len(args) != arity or (kwargs and not scratch):
                raise TypeError("incompatible function arguments")
            self.args, self.kwargs = args, kwargs

    return SimpleNamespace(TritonKernel=TritonKernel)


@pytest.mark.parametrize("arity,scratch,expected", [
    (7, False, ("k", 4, 1, 128, "PTX", "", 90)),
    (7, True, ("k", 4, 1, 128, "PTX", "", 90)),
])
def test_triton_kernel_constructor_of_each_jaxlib_generation(arity, scratch, expected):
    module = _fake_kernel_class(arity, scratch)
    kernel = compat.make_triton_kernel(module, FIELDS)
    assert kernel.args == expected
    assert kernel.kwargs == ({"global_scratch_size": 0, "global_scratch_align": 1} if scratch else {})
    again = compat.make_triton_kernel(module, FIELDS)  # memoized choice still works
    assert again.args == expected


def test_global_scratch_without_jaxlib_support_is_refused():
    module = _fake_kernel_class(7, False)
    with pytest.raises(compat.JaxlibSupportError, match="global scratch"):
        compat.make_triton_kernel(module, FIELDS._replace(global_scratch_size=64))


def test_real_jaxlib_constructor_and_targets():
    kernel = compat.make_triton_kernel(compat.triton_module("cuda"), FIELDS)
    assert kernel is not None
    assert compat.ffi_target_registered("cuda")


def test_installed_plugin_schema_is_read_from_the_binary():
    with open(compat.triton_module("cuda").__file__, "rb") as f:
        schemas = schemas_from_binary(f.read())
    kernel = schemas["jax_triton.TritonKernel"]
    assert kernel["ptx"][0] == 4 and kernel["num_ctas"][0] == 10
    has_image = "module_image" in kernel
    assert (compat.module_image_layout("cuda", current_config()) is not None) == has_image
    if compat.jaxlib_version() < (0, 11, 0):
        assert not has_image  # jaxlib 0.10.2 would ignore a module image: none is sent


# A descriptor shaped like jaxlib 0.11.2's triton.proto -------------------------------------------
def _ld(number, payload: bytes) -> pw.Field:
    return pw.Field(number, pw.LEN, payload)


def _field(name, number, ftype, type_name=""):
    fields = [_ld(1, name.encode()), pw.Field(3, pw.VARINT, number), pw.Field(5, pw.VARINT, ftype)]
    if type_name:
        fields.append(_ld(6, type_name.encode()))
    return _ld(2, pw.encode(fields))


def _message(name, fields, nested=()):
    return pw.encode([_ld(1, name.encode()), *fields, *[_ld(3, n) for n in nested]])


def descriptor_0112() -> bytes:
    kernel = _message("TritonKernel", [
        _field("kernel_name", 1, 9), _field("num_warps", 2, 13), _field("shared_mem_bytes", 3, 13),
        _field("ptx", 4, 9), _field("ttir", 5, 9), _field("compute_capability", 6, 13), _field("num_ctas", 10, 13),
        _field("module_image", 11, 11, ".jax_triton.ModuleImageProto"), _field("global_scratch_size", 12, 13),
        _field("global_scratch_align", 13, 13)])
    image = _message("ModuleImageProto", [_field("object_file", 1, 12), _field("kernel_name", 2, 9),
                                          _field("shared_mem_bytes", 3, 13)])
    config = _message("Config", [_field("kernel_call", 1, 11, ".jax_triton.TritonKernelCall"),
                                 _field("description", 2, 9)])
    call = _message("TritonKernelCall", [_field("kernel", 1, 11, ".jax_triton.TritonKernel")])
    tuned = _message("TritonAutotunedKernelCall", [_field("name", 1, 9),
                                                   _field("configs", 2, 11, ".jax_triton.TritonAutotunedKernelCall.Config")],
                     nested=[config])
    any_call = _message("TritonAnyKernelCall", [_field("kernel_call", 1, 11, ".jax_triton.TritonKernelCall"),
                                                _field("autotuned_kernel_call", 2, 11, ".jax_triton.TritonAutotunedKernelCall")])
    return pw.encode([_ld(1, b"jaxlib/gpu/triton.proto"), _ld(2, b"jax_triton"),
                      *[_ld(4, m) for m in (kernel, image, call, tuned, any_call)], _ld(12, b"proto3")])


def test_module_image_layout_from_a_0112_style_schema():
    blob = b"\x00garbage before" + descriptor_0112() + b"\x00\x00trailing bytes"
    layout = compat.layout_from_schemas(schemas_from_binary(blob))
    assert layout is not None
    assert (layout.image_field, layout.object_file, layout.kernel_name, layout.shared_mem_bytes) == (11, 1, 2, 3)


@pytest.fixture()
def with_module_image(monkeypatch):
    layout = compat.layout_from_schemas(schemas_from_binary(descriptor_0112()))
    monkeypatch.setattr(compat, "module_image_layout", lambda platform, config: layout if platform == "cuda" else None)
    return layout


def _lower(fn, *shapes):
    return custom_calls(jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",)))


def test_cubin_goes_into_each_kernel_where_the_proto_has_module_image(with_module_image):
    vec = jax.ShapeDtypeStruct((1 << 20,), jnp.float32)
    (call,) = _lower(functools.partial(ep.add_program, block=1024, compute_capability=90), vec, vec)
    kernel = call["kernel_call"]["kernel"]
    spec = compiler.make_spec(ep.add, ["*fp32", "*fp32", 1 << 20, "*fp32"], {"BLOCK": 1024}, target=90)
    art = compiler.get_or_compile(spec)[0]
    assert kernel["module_image"] == {"object_file": art.cubin, "kernel_name": art.name,
                                      "shared_mem_bytes": art.shared_mem}
    assert kernel["ptx"] == art.ptx  # PTX stays: jaxlib falls back to it where the image is unusable

    mat = jax.ShapeDtypeStruct((256, 256), jnp.float16)
    (tuned,) = _lower(functools.partial(ep.matmul_program, compute_capability=90), mat, mat)
    images = [c["kernel_call"]["kernel"]["module_image"]["object_file"] for c in tuned["autotuned"]["configs"]]
    assert len(images) == 6 and all(i.startswith(b"\x7fELF") for i in images) and len(set(images)) == 6


def test_inject_keeps_everything_else_byte_identical(with_module_image):
    module = compat.triton_module("cuda")
    kernel = compat.make_triton_kernel(module, FIELDS)
    call = module.TritonKernelCall(kernel, 2, 1, 1, [module.create_array_parameter(0, 16)])
    proto = call.to_proto("name", b"meta")
    injected = inject(proto, [ModuleImage(b"\x7fELFcubin", "k", 128)], with_module_image)
    decoded = decode_any_call(injected)
    assert decoded["kernel_call"]["kernel"]["module_image"]["object_file"] == b"\x7fELFcubin"
    plain = decode_any_call(proto)
    decoded["kernel_call"]["kernel"].pop("module_image")
    assert decoded == plain
    with pytest.raises(ValueError, match="left over"):
        inject(proto, [ModuleImage(b"a", "k", 0)] * 2, with_module_image)


def test_wire_codec_round_trips():
    fields = [pw.Field(1, pw.VARINT, 300), pw.Field(2, pw.LEN, b"abc"), pw.Field(3, pw.FIXED32, 7),
              pw.Field(4, pw.FIXED64, 1 << 40)]
    assert pw.decode(pw.encode(fields)) == fields
    with pytest.raises(pw.WireError):
        pw.decode(b"\x12\x05ab")
