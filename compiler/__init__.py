"""kernel-cache's compiler front end: Triton kernel spec -> content key -> compiled artifact.

Knows Triton; knows nothing of JAX or of where artifacts are stored (see `kernel_cache`). What only
a lookup by content key or a miss runs (the key, the store, the artifact, `compile_spec`, recipes) is
imported at its first use: a warm process, which lowers from its call records, never loads it.
"""

from typing import TYPE_CHECKING, Any

from kernel_cache.lazy import later

from .errors import CompileError
from .spec import SCALAR_TYPES, KernelSpec, Pointer, Scalar, TensorDesc, make_spec
from .target import Target, parse_target
from .toolchain import toolchain_fingerprint
from .triton_compat import int_type as triton_int_type

if TYPE_CHECKING:
    from .artifact import Artifact
    from .cache_or_compile import get_or_compile, lookup
    from .compile import compile_spec
    from .key import KeyMemo, content_key, key_document, session_keys
    from .recipe import RecipeError, from_recipe, to_recipe
else:
    _artifact = later("compiler.artifact")
    _cached = later("compiler.cache_or_compile")
    _compile = later("compiler.compile")
    _key = later("compiler.key")
    _recipe = later("compiler.recipe")

__all__ = [
    "SCALAR_TYPES", "Artifact", "CompileError", "KernelSpec", "KeyMemo", "Pointer", "RecipeError", "Scalar", "Target",
    "TensorDesc", "compile_spec", "content_key", "from_recipe", "get_or_compile", "key_document", "lookup",
    "make_spec", "parse_target", "session_keys", "to_recipe", "toolchain_fingerprint", "triton_int_type",
]


_LATER = {"Artifact": "_artifact", "get_or_compile": "_cached", "lookup": "_cached", "compile_spec": "_compile",
          "KeyMemo": "_key", "content_key": "_key", "key_document": "_key", "session_keys": "_key",
          "RecipeError": "_recipe", "from_recipe": "_recipe", "to_recipe": "_recipe"}


def __getattr__(name: str) -> Any:
    """A name of a module a warm process does not load, imported at its first use and kept here."""
    holder = _LATER.get(name)
    if holder is None:
        raise AttributeError(f"module 'compiler' has no attribute {name!r}")
    value = globals()[name] = getattr(globals()[holder], name)
    return value
