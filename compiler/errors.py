"""Errors the compiler raises, with enough context to act on without a debugger."""

from __future__ import annotations

from kernel_cache.errors import KernelCacheError


class CompileError(KernelCacheError, RuntimeError):
    """A Triton stage failed. Names the kernel, the stage, a short spec summary and Triton's message."""

    def __init__(self, kernel: str, stage: str, summary: str, cause: BaseException):
        self.kernel = kernel
        self.stage = stage
        self.summary = summary
        self.triton_message = f"{type(cause).__name__}: {cause}".strip()
        super().__init__(
            f"compiling kernel '{kernel}' failed at stage '{stage}' ({summary}):\n{self.triton_message}")
