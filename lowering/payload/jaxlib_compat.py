"""Every difference between jaxlib releases that the lowering touches, in one place.

Decided by capability wherever jaxlib lets us look: the custom call targets the GPU plugin
registers, the keywords `TritonKernel`'s constructor takes, and the Triton proto schema embedded in the
plugin binary. (The autotuner's alias restore, a fix that leaves no trace but jaxlib's version, is in
every supported jaxlib: pyproject.toml's floor.)
"""

from __future__ import annotations

import functools
import json
import logging
from types import ModuleType
from typing import Any, NamedTuple

import kernel_cache
from compiler.toolchain import memoized_for_file
from kernel_cache.errors import KernelCacheError

from . import proto

log = logging.getLogger("kernel_cache.lowering")

LEGACY_TARGET = "triton_kernel_call"
FFI_TARGET = "triton_kernel_call_ffi"


class JaxlibSupportError(KernelCacheError, RuntimeError):
    """The installed jaxlib cannot run Triton kernels for the requested platform."""


def ir_type(ctx: Any, aval: Any) -> Any:
    """The MLIR type of an array aval in the module `ctx` lowers."""
    from jax._src.interpreters import mlir

    return mlir.aval_to_ir_type(ctx.module_context, aval)


def jaxlib_version() -> tuple[int, ...]:
    from jax._src.lib import version

    return tuple(version)


@functools.cache
def triton_module(platform: str) -> ModuleType:
    """The plugin's `_triton` extension for `platform`; cross-lowering for a platform whose plugin is
    absent borrows the other plugin's: the proto it writes is the same message."""
    from jaxlib import plugin_support

    module = plugin_support.import_from_plugin(platform, "_triton")
    if module is None:
        other = "rocm" if platform == "cuda" else "cuda"
        module = plugin_support.import_from_plugin(other, "_triton")
    if module is None:
        import jax

        version = ".".join(str(v) for v in jaxlib_version())
        raise JaxlibSupportError(  # the install lines are the README's ("Install into your environment")
            f"no jaxlib GPU plugin with Triton support is installed for '{platform}': on a host without a GPU, "
            f'pip install --no-deps "jax-cuda13-plugin=={version}" (the plugin alone, at jaxlib\'s exact '
            f'version); on a GPU host, pip install "jax[cuda13]=={jax.__version__}" (with its CUDA runtime); '
            f"for ROCm, jax-rocm*-plugin at jaxlib's version")
    return module


@functools.cache
def plugin_installed(platform: str) -> bool:
    """Whether jaxlib's own GPU plugin for `platform`, with its Triton extension, is installed."""
    from jaxlib import plugin_support

    return plugin_support.import_from_plugin(platform, "_triton") is not None


@functools.cache
def ffi_target_registered(platform: str) -> bool:
    """Whether the platform's own plugin registers the CUDA-graph-compatible FFI target for Triton calls."""
    return plugin_installed(platform) and FFI_TARGET in triton_module(platform).registrations()


def tma_descriptors_in_jaxlib() -> bool:
    """Whether the CUDA plugin can pass TMA descriptor parameters (jax-triton 0.4's TensorDescriptor)."""
    return plugin_installed("cuda") and hasattr(triton_module("cuda"), "create_tma_descriptor_parameter")


def tma_descriptors_in_triton() -> bool:
    import importlib.util

    import triton

    version = tuple(int(p) for p in triton.__version__.split("+")[0].split(".")[:2] if p.isdigit())
    return importlib.util.find_spec("triton.tools.tensor_descriptor") is not None and version >= (3, 7)


def capabilities(platform: str, config: kernel_cache.Config) -> list[Any]:
    """What a lowered call's payload depends on in jaxlib, for its record's key."""
    return [jaxlib_version(), repr(module_image_layout(platform, config))]


def plugin_takes_module_image(platform: str) -> bool:
    """Whether the plugin accepts a precompiled binary (jaxlib > 0.11.0), whatever
    KERNEL_CACHE_MODULE_IMAGE says (`cachectl doctor`)."""
    return platform == "cuda" and plugin_installed(platform) and _layout_in_plugin(platform) is not None


class KernelFields(NamedTuple):
    """What `TritonKernel` needs, whatever its constructor looks like."""

    name: str
    num_warps: int
    num_ctas: int
    shared_mem: int
    binary: str  # PTX text (CUDA) or the path of an HSACO file (ROCm)
    ttir: str
    compute_capability: int
    global_scratch_size: int = 0
    global_scratch_align: int = 1


# TritonKernel class -> whether it takes the global scratch keywords (jaxlib > 0.11.0): asked once, as
# pybind's TypeError would quote the whole PTX
_takes_scratch: dict[Any, bool] = {}


def make_triton_kernel(module: ModuleType, k: KernelFields) -> Any:
    """`module.TritonKernel`, given the global scratch keywords where this jaxlib takes them."""
    cls, takes = module.TritonKernel, _takes_scratch.get(module.TritonKernel)
    args = (k.name, k.num_warps, k.num_ctas, k.shared_mem, k.binary, k.ttir, k.compute_capability)
    if takes is not False:
        try:
            kernel = cls(*args, global_scratch_size=k.global_scratch_size, global_scratch_align=k.global_scratch_align)
        except TypeError:
            if takes:  # it takes them: the error is the arguments'
                raise
            _takes_scratch[cls] = False
        else:
            _takes_scratch[cls] = True
            return kernel
    if k.global_scratch_size:
        raise JaxlibSupportError(f"kernel '{k.name}' needs {k.global_scratch_size} bytes of global scratch memory, "
                                 f"which this jaxlib cannot allocate (needs jaxlib > 0.11.0)")
    return cls(*args)


# module_image: the precompiled cubin inside the proto --------------------------------------------
class ModuleImageLayout(NamedTuple):
    """Field numbers to write a cubin into `TritonKernel` (read from the plugin's own schema)."""

    kernel_field: int  # TritonKernelCall.kernel
    image_field: int  # TritonKernel.module_image
    object_file: int
    kernel_name: int
    shared_mem_bytes: int | None
    config_field: int  # TritonAutotunedKernelCall.configs
    config_call_field: int  # Config.kernel_call
    any_call_field: int  # TritonAnyKernelCall.kernel_call
    any_autotuned_field: int  # TritonAnyKernelCall.autotuned_kernel_call


def layout_from_schemas(schemas: dict[str, proto.MessageSchema]) -> ModuleImageLayout | None:
    """The module_image layout if this schema has one (jaxlib > 0.11.0), else None."""
    try:
        kernel = schemas["jax_triton.TritonKernel"]
        image = kernel.get("module_image")
        if image is None:
            return None
        image_msg = schemas[image[2]]
        call = schemas["jax_triton.TritonKernelCall"]
        tuned = schemas["jax_triton.TritonAutotunedKernelCall"]
        config = schemas["jax_triton.TritonAutotunedKernelCall.Config"]
        any_call = schemas["jax_triton.TritonAnyKernelCall"]
        return ModuleImageLayout(
            kernel_field=_required(call, "kernel"), image_field=image[0],
            object_file=_required(image_msg, "object_file"), kernel_name=_required(image_msg, "kernel_name"),
            shared_mem_bytes=image_msg.get("shared_mem_bytes", (None,))[0], config_field=_required(tuned, "configs"),
            config_call_field=_required(config, "kernel_call"), any_call_field=_required(any_call, "kernel_call"),
            any_autotuned_field=_required(any_call, "autotuned_kernel_call"))
    except KeyError:
        return None


def _required(schema: proto.MessageSchema, field_name: str) -> int:
    """The number of a field the layout needs; KeyError (no layout) where the schema has none (or 0)."""
    number = schema[field_name][0]
    if not number:
        raise KeyError(field_name)
    return number


def module_image_layout(platform: str, config: kernel_cache.Config) -> ModuleImageLayout | None:
    """Where this platform's own plugin reads a precompiled binary (CUDA only), or None if it always
    runs ptxas; KERNEL_CACHE_MODULE_IMAGE=0 turns it off (jaxlib then runs ptxas, as jax-triton)."""
    if platform != "cuda" or not plugin_installed(platform) or not config.module_image:
        return None
    return _layout_in_plugin(platform)


@functools.cache
def _layout_in_plugin(platform: str) -> ModuleImageLayout | None:
    """Scanned from the plugin binary once per plugin build, then from the memo."""
    path = getattr(triton_module(platform), "__file__", None)
    if not path:
        return None
    found = json.loads(memoized_for_file("module_image_layout", path, lambda: json.dumps(_scan_plugin(path))))
    return ModuleImageLayout(**found) if isinstance(found, dict) else None


def _scan_plugin(path: str) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        log.debug("cannot read %s for its proto schema: %s", path, exc)
        return None
    layout = layout_from_schemas(proto.schemas_from_binary(data))
    return None if layout is None else layout._asdict()
