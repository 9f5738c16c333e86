"""ejKernel (0.0.80.x): the `triton_kernel_call` primitive of its fork of jax-triton (`ejkernel.callib`),
lowered through kernel-cache. Its extra `device` parameter only picks the device whose compute
capability it compiles for; the lowering's device (or `compute_capability`) decides here, as in
`lowering.triton_call`."""

from types import ModuleType

from . import primitive_client
from .primitive_client import COMMON_PARAMS, PrimitiveClient

CLIENT = PrimitiveClient(name="ejkernel", distribution="ejkernel", lowest=(0, 0, 80), below=(0, 0, 81),
                         params=COMMON_PARAMS | {"device"})


def install(module: ModuleType) -> None:
    """Entry point `kernel_cache.clients:ejkernel`; `module` is ejkernel.callib._triton_call."""
    primitive_client.install(CLIENT, module)
