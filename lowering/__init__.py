"""kernel-cache's JAX front end: a drop-in `triton_call` whose kernels come from the kernel_cache store.

`import lowering as jt`: a warm process lowers with no Triton compile and, where jaxlib allows,
launches with no ptxas.

Knows JAX/jaxlib; every jaxlib difference lives in `lowering.payload.jaxlib_compat`.
"""

from typing import Any

from . import first_use, utils, xla_cache  # noqa: F401  (first_use: the session at the first call)
from . import monitoring as _monitoring  # noqa: F401  (kernel-cache's counters as jax.monitoring events)
from .frontend.api import triton_call
from .frontend.primitive import triton_kernel_call_p
from .frontend.rule import MultiDeviceError  # (the module registers the cuda/rocm lowering rules)
from .payload.jaxlib_compat import LEGACY_TARGET, JaxlibSupportError, triton_module
from .planning.plan import NoTargetError
from .tensor_descriptor import TensorDescriptor
from .utils import cdiv, next_power_of_2, strides_from_shape

# jax-triton 0.4's name for the custom call target its calls use (autotuned calls here too).
CUSTOM_CALL_TARGET_NAME = LEGACY_TARGET
# The jax-triton API level `triton_call` implements, for code that checks it: 0.3.1's arguments and
# meaning, plus 0.4's keywords and names (see lowering.frontend.api for the 0.4 forms it refuses).
__version_info__ = (0, 3, 1)
__version__ = "0.3.1"

__all__ = ["CUSTOM_CALL_TARGET_NAME", "JaxlibSupportError", "MultiDeviceError", "NoTargetError", "TensorDescriptor",
           "__version__", "__version_info__", "cdiv",
           "get_compute_capability", "get_serialized_metadata", "next_power_of_2", "strides_from_shape",
           "triton_call", "triton_kernel_call_p", "utils"]


def get_compute_capability(device: int = 0) -> int:
    """The CUDA device's compute capability as jax-triton returns it (e.g. 90), from jaxlib's plugin."""
    return int(triton_module("cuda").get_compute_capability(device))


def get_serialized_metadata(*args: Any, **kwargs: Any) -> Any:
    """jaxlib's helper that reads a serialized Triton call's metadata, as jax-triton re-exports it."""
    return triton_module("cuda").get_serialized_metadata(*args, **kwargs)
