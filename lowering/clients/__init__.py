"""Adapters that serve other libraries' Triton calls from the store, their code unchanged.

Loaded by `kernel_cache.intercept` (or KERNEL_CACHE_INTERCEPT) through the `kernel_cache.clients`
entry points once the client has loaded.
"""

from .served import UnsupportedCall, UnsupportedClient, tally

__all__ = ["UnsupportedCall", "UnsupportedClient", "tally"]
