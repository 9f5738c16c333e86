"""Programs as one module: the shape a model has, where one jit traces every Triton call before any is
lowered (what compile-ahead needs). Shared by scripts/bench_cold.py and tests/support/compile_ahead_child.py;
imports nothing, so a benchmark's own-path child stays free of kernel-cache."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def as_one_program(chosen: Sequence[tuple[str, Callable[..., Any], Sequence[Any]]]
                   ) -> tuple[Callable[..., list[Any]], list[Any]]:
    """`chosen` (label, function, example arguments) programs as one function, with its flat arguments."""
    def module(*args: Any) -> list[Any]:
        out, i = [], 0
        for _, fn, example in chosen:
            out.append(fn(*args[i:i + len(example)]))
            i += len(example)
        return out

    return module, [a for _, _, example in chosen for a in example]
