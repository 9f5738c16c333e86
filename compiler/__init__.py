"""kernel-cache's compiler front end: Triton kernel spec -> content key -> compiled artifact.

Knows Triton; knows nothing of JAX or of where artifacts are stored (see `kernel_cache`).
`compile_spec` and the recipes (`compiler.compile`, `compiler.recipe`) are imported at their first
use: a warm process, which compiles nothing, never loads them.
"""

from typing import TYPE_CHECKING, Any

from kernel_cache.lazy import later

from .artifact import Artifact
from .cached import get_or_compile, lookup
from .errors import CompileError
from .key import KeyMemo, content_key, key_document, session_keys
from .spec import SCALAR_TYPES, KernelSpec, Pointer, Scalar, TensorDesc, make_spec
from .target import Target, parse_target
from .toolchain import toolchain_fingerprint
from .triton_compat import int_type as triton_int_type

if TYPE_CHECKING:
    from .compile import compile_spec
    from .recipe import RecipeError, from_recipe, to_recipe
else:
    _compile = later("compiler.compile")
    _recipe = later("compiler.recipe")

__all__ = [
    "SCALAR_TYPES", "Artifact", "CompileError", "KernelSpec", "KeyMemo", "Pointer", "RecipeError", "Scalar", "Target",
    "TensorDesc", "compile_spec", "content_key", "from_recipe", "get_or_compile", "key_document", "lookup",
    "make_spec", "parse_target", "session_keys", "to_recipe", "toolchain_fingerprint", "triton_int_type",
]


_LATER = {"compile_spec": "_compile", "RecipeError": "_recipe", "from_recipe": "_recipe", "to_recipe": "_recipe"}


def __getattr__(name: str) -> Any:
    """The names of the modules a warm process does not load, imported at their first use."""
    holder = _LATER.get(name)
    if holder is None:
        raise AttributeError(f"module 'compiler' has no attribute {name!r}")
    return getattr(globals()[holder], name)
