"""The metadata fields the compiler writes into an entry (`META_*`) and the operator's tools read back
through `EntrySummary.from_meta`, which tolerates anything (another version's entry, hostile content).
"""

from __future__ import annotations

import reprlib
from typing import Any

from kernel_cache.value_class import FrozenValue

META_KIND = "kind"
META_NAME = "name"
META_ARCH = "arch"
META_TARGET = "target"
META_TOOLCHAIN = "toolchain"
META_CREATED = "created"
META_COMPILE_SECONDS = "compile_seconds"
META_RECIPE = "recipe"
# Backend options every kernel is built with unless told (compiler.spec.DEFAULT_OPTIONS, which a test
# compares): a config's text names only the others.
USUAL_OPTIONS: dict[str, Any] = {"enable_fp_fusion": True, "debug": False}
_VALUE_CHARS = 24  # a constexpr's value in a config's text, at most (a jitted function's name, a repr)
_SHORT = reprlib.Repr()  # (Python 3.11's Repr takes no arguments)
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring = 3, 8, 8, _VALUE_CHARS


class EntrySummary(FrozenValue):
    kernel: str
    arch: str
    created: float | None
    compile_seconds: float
    toolchain: str  # the toolchain summary the entry was built with
    target: dict[str, Any] | None  # {backend, arch, warp_size}
    recipe: dict[str, Any] | None
    module: str  # the kernel's module, from its recipe ("compiler.examples")
    config: str  # what tells one kernel's entries apart: constexprs, warps, stages ("BM=64 BN=64 w4 s3")
    signature: str  # its argument types, constexprs left out ("*fp32,*fp32,i32")

    def __init__(self, kernel: str = "?", arch: str = "?", created: float | None = None, compile_seconds: float = 0.0,
                 toolchain: str = "", target: dict[str, Any] | None = None, recipe: dict[str, Any] | None = None,
                 module: str = "", config: str = "", signature: str = "") -> None:
        given = dict(locals())  # the parameters, which are the fields
        del given["self"]
        self.__dict__.update(given)

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> "EntrySummary":
        toolchain = meta.get(META_TOOLCHAIN)
        target, recipe = meta.get(META_TARGET), meta.get(META_RECIPE)
        recipe = recipe if isinstance(recipe, dict) and recipe else None
        kernel_path = recipe.get("kernel") if recipe is not None else None
        return cls(kernel=str(meta.get(META_NAME, "?")), arch=str(meta.get(META_ARCH, "?")),
                   created=_number(meta.get(META_CREATED)), compile_seconds=compile_seconds(meta),
                   toolchain=str(toolchain.get("summary", "")) if isinstance(toolchain, dict) else "",
                   target=target if isinstance(target, dict) else None, recipe=recipe,
                   module=kernel_path.partition(":")[0] if isinstance(kernel_path, str) else "",
                   config=" ".join(config_items(meta)), signature=_signature(recipe or {}))


def config_items(meta: dict[str, Any]) -> list[str]:
    """['BM=64', 'BN=64', 'BK=32', 'w4', 's3']: a kernel entry's constexprs (in the kernel's order),
    warps, stages, CTAs other than 1 and options other than the usual ones, from its recipe (launch
    numbers: or its metadata); [] for an entry without them. Never raises."""
    recipe = meta.get(META_RECIPE)
    recipe = recipe if isinstance(recipe, dict) else {}
    constexprs, options = recipe.get("constexprs"), recipe.get("options")
    parts = [f"{name}={_value_text(value)}" for name, value in _declared(constexprs, recipe.get("signature"))]
    for field, prefix in (("num_warps", "w"), ("num_stages", "s"), ("num_ctas", "c")):
        value = meta.get(field, recipe.get(field))
        if isinstance(value, int) and not isinstance(value, bool) and not (field == "num_ctas" and value == 1):
            parts.append(f"{prefix}{value}")
    if isinstance(options, dict):
        parts += [f"{name}={text}" for name, value in options.items()
                  if (text := _value_text(value)) != "None" and not _usual(name, value)]
    return parts


def _declared(constexprs: Any, signature: Any) -> list[tuple[str, Any]]:
    """The constexprs in the kernel's parameter order (the recipe's signature lists them all; the stored
    metadata's object has its names sorted)."""
    if not isinstance(constexprs, dict):
        return []
    order = {p[0]: n for n, p in enumerate(signature) if isinstance(p, list) and p and isinstance(p[0], str)} if (
        isinstance(signature, list)) else {}
    return sorted(constexprs.items(), key=lambda item: (order.get(item[0], len(order)), item[0]))


def _usual(name: str, value: Any) -> bool:
    return isinstance(value, dict) and name in USUAL_OPTIONS and value.get("v", ...) is USUAL_OPTIONS[name]


def _value_text(value: Any, depth: int = 0) -> str:
    """A recipe value ({"v": 64}, {"jit": "mod:fn"}, {"tl.dtype": "fp16"}, {"seq": [...]}, {"repr": ...}),
    short: what a reader needs to tell two configs apart (a hostile nesting is cut, never recursed down)."""
    if depth > 3:
        text = "…"
    elif not isinstance(value, dict):
        text = _scalar_text(value)
    elif "v" in value:
        text = _scalar_text(value["v"])
    elif "jit" in value:
        text = str(value["jit"]).rpartition(":")[2]
    elif "tl.dtype" in value:
        text = str(value["tl.dtype"])
    elif isinstance(value.get("seq"), list):
        text = "(" + ",".join(_value_text(v, depth + 1) for v in value["seq"][:_VALUE_CHARS]) + ")"
    else:
        text = str(value.get("repr", "?"))
    return text if len(text) <= _VALUE_CHARS else text[:_VALUE_CHARS - 1] + "…"


def _scalar_text(value: Any) -> str:
    """A value JSON gave: plain text for a scalar, a bounded repr for anything else (a nesting a writer
    made deep or long is cut, not walked whole)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return str(value)
    return _SHORT.repr(value)


def _signature(recipe: dict[str, Any]) -> str:
    pairs = recipe.get("signature")
    if not isinstance(pairs, list):
        return ""
    return ",".join(_scalar_text(p[1]) for p in pairs if isinstance(p, list) and len(p) == 2 and p[1] != "constexpr")


def compile_seconds(meta: dict[str, Any]) -> float:
    """What building the entry cost (0 when unknown): the one field every hit reads."""
    return _number(meta.get(META_COMPILE_SECONDS)) or 0.0


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
