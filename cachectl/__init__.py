"""cachectl, the operator's floor: see, bound, check, warm and move a kernel-cache directory.

It sits above every other floor (it may import kernel_cache's core, compiler and lowering; nothing
imports it). `main` parses and dispatches; each command group has its own module (inspect,
maintain, prewarm, bundles), rendering is in `render`, the shared state of a run in `context`.
"""

from cachectl.main import main

__all__ = ["main"]
