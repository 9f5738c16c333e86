"""The metadata fields the compiler writes into an entry and the operator's tools read back.

One typed view instead of bare strings in several modules: the compiler builds entries with
these names (`META_*`), cachectl and prewarm read them through `EntrySummary.from_meta`, which
tolerates anything (an entry from another version, or hostile content) and never raises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

META_KIND = "kind"
META_NAME = "name"
META_ARCH = "arch"
META_TARGET = "target"
META_TOOLCHAIN = "toolchain"
META_CREATED = "created"
META_COMPILE_SECONDS = "compile_seconds"
META_RECIPE = "recipe"


@dataclass(frozen=True)
class EntrySummary:
    kernel: str = "?"
    arch: str = "?"
    created: float | None = None
    compile_seconds: float = 0.0
    toolchain: str = ""  # the toolchain summary the entry was built with
    target: dict[str, Any] | None = None  # {backend, arch, warp_size}
    recipe: dict[str, Any] | None = None

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> "EntrySummary":
        toolchain = meta.get(META_TOOLCHAIN)
        target, recipe = meta.get(META_TARGET), meta.get(META_RECIPE)
        return cls(kernel=str(meta.get(META_NAME, "?")), arch=str(meta.get(META_ARCH, "?")),
                   created=_number(meta.get(META_CREATED)), compile_seconds=compile_seconds(meta),
                   toolchain=str(toolchain.get("summary", "")) if isinstance(toolchain, dict) else "",
                   target=target if isinstance(target, dict) else None,
                   recipe=recipe if isinstance(recipe, dict) and recipe else None)


def compile_seconds(meta: dict[str, Any]) -> float:
    """What building the entry cost (0 when unknown): the one field every hit reads, without the
    rest of the summary."""
    return _number(meta.get(META_COMPILE_SECONDS)) or 0.0


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
