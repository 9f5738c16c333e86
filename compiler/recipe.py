"""Recipes: a JSON description of a spec from which `cachectl prewarm` can rebuild it elsewhere.

A recipe names the kernel by module and qualified name, so kernels defined in `__main__` or in a
closure cannot be rebuilt; `from_recipe` then says so instead of guessing. Rebuilding imports the
module a recipe names: cachectl prewarm imports only modules the operator allows (--allow-module),
never one chosen by whoever wrote the cache.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable
from typing import Any

from kernel_cache.errors import KernelCacheError

from . import triton_compat as tc
from .spec import KernelSpec
from .target import Target, parse_target

RECIPE_VERSION = 1


class RecipeError(KernelCacheError, RuntimeError):
    """A recipe cannot be turned back into a spec (kernel not importable, unknown value type)."""


def _encode_value(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"v": value}
    if tc.is_jit_function(value):
        return {"jit": kernel_path(value)}
    if type(value).__name__ == "dtype" and hasattr(value, "name"):
        return {"tl.dtype": str(value)}
    if type(value).__name__ == "constexpr" and hasattr(value, "value"):
        return _encode_value(value.value)
    if isinstance(value, (list, tuple)):
        return {"seq": [_encode_value(v) for v in value], "tuple": isinstance(value, tuple)}
    return {"repr": repr(value)}


def _decode_value(obj: Any, resolve: Callable[[str], Any]) -> Any:
    if "v" in obj:
        return obj["v"]
    if "jit" in obj:
        return resolve(obj["jit"])
    if "tl.dtype" in obj:
        import triton.language as tl

        return getattr(tl, obj["tl.dtype"])
    if "seq" in obj:
        seq = [_decode_value(v, resolve) for v in obj["seq"]]
        return tuple(seq) if obj.get("tuple") else seq
    raise RecipeError(f"recipe holds a value that cannot be rebuilt: {obj.get('repr', obj)}")


def kernel_path(fn: Any) -> str:
    return f"{fn.fn.__module__}:{fn.fn.__qualname__}"


def import_kernel(path: str, imported_only: bool = False) -> Any:
    """The @jit function `path` names, its module imported where not yet (`imported_only`: as this
    process already holds it, RecipeError where it does not)."""
    module_name, _, qualname = path.partition(":")
    if module_name == "__main__" or "<locals>" in qualname:
        raise RecipeError(f"kernel {path} was defined in a script or closure and cannot be re-imported;"
                          f" move it into an importable module to prewarm it")
    obj = sys.modules.get(module_name)
    if obj is None and imported_only:
        raise RecipeError(f"kernel {path} is not imported in this process")
    try:
        obj = obj or importlib.import_module(module_name)
    except Exception as exc:  # ImportError, but also whatever the module raises on import
        raise RecipeError(f"cannot import module '{module_name}' of kernel {path}: {exc}") from exc
    try:
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except AttributeError as exc:
        raise RecipeError(f"module '{module_name}' has no kernel '{qualname}'") from exc
    return tc.unwrap_jit(obj)


def to_recipe(spec: KernelSpec) -> dict[str, Any]:
    return {
        "version": RECIPE_VERSION,
        "kernel": kernel_path(spec.kernel),
        "signature": [[k, v] for k, v in spec.signature.items()],
        "constexprs": {k: _encode_value(v) for k, v in spec.constexprs.items()},
        "attrs": [[list(k), v] for k, v in spec.attrs.items()],
        "target": spec.target.json,
        "num_warps": spec.num_warps,
        "num_stages": spec.num_stages,
        "num_ctas": spec.num_ctas,
        "options": {k: _encode_value(v) for k, v in spec.options.items()},
        "keep_ir": spec.keep_ir,
    }


def _tuples(value: Any) -> Any:
    """A tuple parameter's type as JSON keeps it (lists) back as the tuples Triton takes."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def from_recipe(recipe: dict[str, Any], target: "Target | str | None" = None, *,
                imported_only: bool = False) -> KernelSpec:
    """Rebuild a spec from a recipe, optionally for another target (another GPU generation).
    `imported_only`: from kernels this process already imported, never importing one (RecipeError)."""
    if recipe.get("version") != RECIPE_VERSION:
        raise RecipeError(f"unsupported recipe version {recipe.get('version')!r}")
    resolve = functools.partial(import_kernel, imported_only=imported_only)
    fn = resolve(recipe["kernel"])
    tgt = parse_target(target) if target is not None else Target.from_json(recipe["target"])
    if tgt.backend != recipe["target"]["backend"]:
        raise RecipeError(f"a {recipe['target']['backend']} recipe cannot be rebuilt for {tgt.name}")
    return KernelSpec(
        kernel=fn, signature={k: _tuples(v) for k, v in recipe["signature"]},
        constexprs={k: _decode_value(v, resolve) for k, v in recipe["constexprs"].items()},
        attrs={tuple(k): v for k, v in recipe["attrs"]}, target=tgt, num_warps=recipe["num_warps"],
        num_stages=recipe["num_stages"], num_ctas=recipe["num_ctas"],
        options={k: _decode_value(v, resolve) for k, v in recipe["options"].items()}, keep_ir=recipe.get("keep_ir", False))
