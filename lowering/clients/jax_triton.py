"""jax-triton 0.3.x: its `triton_kernel_call` primitive lowered through kernel-cache."""

from types import ModuleType

from . import primitive_client
from .primitive_client import COMMON_PARAMS, PrimitiveClient

CLIENT = PrimitiveClient(name="jax_triton", distribution="jax-triton", lowest=(0, 3), below=(0, 4),
                         params=COMMON_PARAMS)


def install(module: ModuleType) -> None:
    """Entry point `kernel_cache.clients:jax_triton`; `module` is jax_triton.triton_lib."""
    primitive_client.install(CLIENT, module)
