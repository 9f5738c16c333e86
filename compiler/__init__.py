"""kernel-cache's compiler front end: Triton kernel spec -> content key -> compiled artifact.

Knows Triton; knows nothing of JAX or of where artifacts are stored (see `kernel_cache`).
"""

from .artifact import Artifact
from .cached import get_or_compile, lookup
from .compile import compile_spec
from .errors import CompileError
from .key import KeyMemo, content_key, key_document, session_keys
from .recipe import RecipeError, from_recipe, to_recipe
from .spec import SCALAR_TYPES, KernelSpec, Pointer, Scalar, TensorDesc, make_spec
from .target import Target, parse_target
from .toolchain import toolchain_fingerprint
from .triton_compat import int_type as triton_int_type

__all__ = [
    "SCALAR_TYPES", "Artifact", "CompileError", "KernelSpec", "KeyMemo", "Pointer", "RecipeError", "Scalar", "Target",
    "TensorDesc", "compile_spec", "content_key", "from_recipe", "get_or_compile", "key_document", "lookup",
    "make_spec", "parse_target", "session_keys", "to_recipe", "toolchain_fingerprint", "triton_int_type",
]
