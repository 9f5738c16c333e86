"""kernel-cache's JAX front end: a drop-in `triton_call` (`import lowering as jt`) whose kernels come
from the kernel_cache store, so a warm process lowers with no Triton compile and, where jaxlib
allows, launches with no ptxas.

Knows JAX/jaxlib; every jaxlib difference lives in `lowering.jaxlib_compat`.
"""

from . import rule as _rule  # noqa: F401  (registers the cuda/rocm lowering rules)
from .api import triton_call
from .devices import MultiDeviceError
from .jaxlib_compat import JaxlibSupportError
from .primitive import triton_kernel_call_p
from .target_arch import NoTargetError
from .utils import cdiv, next_power_of_2, strides_from_shape

__all__ = ["JaxlibSupportError", "MultiDeviceError", "NoTargetError", "cdiv", "next_power_of_2",
           "strides_from_shape", "triton_call", "triton_kernel_call_p"]
