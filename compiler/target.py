"""A GPU compile target named by the user ("sm_90", "gfx942", 90) and its canonical form."""

from __future__ import annotations

import re
from typing import Any

from kernel_cache.sanitize import echo
from kernel_cache.value_class import FrozenValue

_SM = re.compile(r"^(?:sm_?|cuda:?)(\d{2,3})a?$")
_GFX = re.compile(r"^(?:hip:)?(gfx[0-9a-f]{3,4}[a-z0-9:+\-]*)$")


class Target(FrozenValue):
    """Backend + arch + warp size: everything Triton's GPUTarget holds, hashable and printable."""

    _fields = ("backend", "arch", "warp_size")
    backend: str  # "cuda" or "hip"
    arch: int | str  # 90 for cuda, "gfx942" for hip
    warp_size: int

    name: str  # the user-facing spelling, sm_90 or gfx942 (derived: not a field)
    json: dict[str, Any]  # the JSON form, made once and shared: read it, never change it

    def __init__(self, backend: str, arch: int | str, warp_size: int) -> None:
        name = f"sm_{arch}" if backend == "cuda" else str(arch)
        json = {"backend": backend, "arch": arch, "warp_size": warp_size}
        self.__dict__.update(backend=backend, arch=arch, warp_size=warp_size, name=name, json=json)

    def __str__(self) -> str:
        return self.name

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "Target":
        return cls(obj["backend"], obj["arch"], int(obj["warp_size"]))


_GFX_MAJOR = re.compile(r"^gfx(\d{1,2})[0-9a-f]{2}")


def _hip_warp_size(arch: str) -> int:
    """CDNA (gfx9xx) runs wave64; RDNA (gfx10+) wave32, as Triton's HIP backend decides."""
    m = _GFX_MAJOR.match(arch)
    return 64 if m is None or int(m.group(1)) < 10 else 32


def parse_target(value: "Target | str | int") -> Target:
    """Accept a Target, "sm_90", "sm90", "cuda:90", 90, "gfx942" or "hip:gfx942"."""
    if isinstance(value, Target):
        return value
    if isinstance(value, bool):
        raise TypeError(f"target must be a name like 'sm_90' or 'gfx942', got {echo(value)}")
    if isinstance(value, int):
        if not 30 <= value <= 200:
            raise ValueError(f"CUDA compute capability {value} is out of range (expected e.g. 80 or 90)")
        return Target("cuda", value, 32)
    if not isinstance(value, str):
        raise TypeError(f"target must be a name like 'sm_90' or 'gfx942', got {type(value).__name__}")
    text = value.strip().lower()
    if m := _SM.match(text):
        return parse_target(int(m.group(1)))
    if m := _GFX.match(text):
        arch = m.group(1)
        return Target("hip", arch, _hip_warp_size(arch))
    raise ValueError(f"unknown GPU target {echo(value)}: expected e.g. 'sm_80', 'sm_90' or 'gfx942'")
