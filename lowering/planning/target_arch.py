"""Which GPU to compile for: the caller's compute_capability, else the configured target
(KERNEL_CACHE_TARGET_ARCH / Config.target_arch), else the device.

The configured target comes before the device so that cross-lowering and prewarming on a GPU-less
host are explicit; on a GPU host leave it unset and the device decides.
"""

from __future__ import annotations

import functools

from compiler import Target, parse_target
from kernel_cache.errors import KernelCacheError

from ..payload.jaxlib_compat import triton_module

ENV_VAR = "KERNEL_CACHE_TARGET_ARCH"


class NoTargetError(KernelCacheError, RuntimeError):
    """Lowering for a GPU platform with no GPU visible and no explicit architecture."""


@functools.lru_cache(maxsize=256)  # asked once per call: resolved once per arch
def resolve_target(platform: str, compute_capability: "int | str | None", configured: "int | str | None") -> Target:
    """The compile target for `platform`: the call's own, else the configured one, else the device's."""
    arch = compute_capability if compute_capability is not None else (configured or _device_arch(platform))
    target = parse_target(arch)
    if target.backend != ("cuda" if platform == "cuda" else "hip"):
        raise ValueError(f"target {target.name} is not a {platform} architecture "
                         f"(check compute_capability / {ENV_VAR})")
    return target


@functools.cache
def _device_arch(platform: str) -> "int | str":
    import jax

    try:
        devices = jax.devices(platform)
    except RuntimeError:
        devices = []
    if not devices:
        example = "compute_capability=90" if platform == "cuda" else "compute_capability='gfx942'"
        raise NoTargetError(
            f"lowering a Triton kernel for '{platform}' needs the GPU architecture, and this host has "
            f"no {platform} device to read it from: pass {example} to triton_call, or set "
            f"{ENV_VAR} (e.g. sm_90 or gfx942)")
    device = devices[0]
    if platform == "cuda":
        major, _, minor = str(device.compute_capability).partition(".")
        return int(major) * 10 + int(minor or 0)
    return str(triton_module("rocm").get_arch_details(device.id).split(":")[0])
