"""Child of test_walk.py: follow one warm call from the lowering rule to its payload.

    python tests/support/walk_child.py OUT {fill|walk|cold}

`fill` lowers the add program at two shapes into KERNEL_CACHE_DIR (compiling its kernel once).
`walk`, in a fresh process over that store, lowers the first shape (this process's memos filled, as
in any process after its first call), then follows the lowering of the second. `cold` follows the
first lowering of a process whose store is empty (the kernel compiled). Both with sys.setprofile:
each call into one of our files from another of our files (frames of JAX or the standard library
in between do not count) is an entry. OUT gets the entries, in order: [file, function, caller file].
A value class's `__init__` and the equality, hash and repr `kernel_cache/value_class.py` gives it
are not entries (nor callers): they are what `@dataclass` generated (in "<string>") before the warm
path's classes were written out, and a reader following the call passes them by.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = tuple(str(ROOT / p) + os.sep for p in ("lowering", "compiler", "kernel_cache"))


def main(out: str, mode: str) -> None:
    from lowering import examples

    program = functools.partial(examples.add_program, block=256)
    first, second = (jax.ShapeDtypeStruct((n,), jnp.float32) for n in (4096, 8192))

    def lower(shape: jax.ShapeDtypeStruct) -> None:
        jax.jit(program).trace(shape, shape).lower(lowering_platforms=("cuda",))

    if mode != "cold":
        lower(first)
    if mode == "fill":
        lower(second)
        Path(out).write_text(json.dumps({"entries": []}))
        return
    if mode == "cold":
        second = first
    traced = jax.jit(program).trace(second, second)  # binding is the trace's; the walk is the lowering's
    entries: list[list[str | None]] = []

    from kernel_cache.value_class import Value

    value_methods = str(ROOT / "kernel_cache" / "value_class.py")

    def ours(frame) -> bool:
        code = frame.f_code
        if not code.co_filename.startswith(PACKAGES) or code.co_filename == value_methods:
            return False
        return not (code.co_name == "__init__" and isinstance(frame.f_locals.get("self"), Value))

    def profile(frame, event, arg):
        if event != "call" or not ours(frame):
            return
        caller = frame.f_back
        while caller is not None and not ours(caller):
            caller = caller.f_back
        caller_file = caller.f_code.co_filename if caller is not None else None
        if caller_file != frame.f_code.co_filename:
            entries.append([os.path.relpath(frame.f_code.co_filename, ROOT), frame.f_code.co_name,
                            None if caller_file is None else os.path.relpath(caller_file, ROOT)])

    sys.setprofile(profile)
    try:
        traced.lower(lowering_platforms=("cuda",))
    finally:
        sys.setprofile(None)
    Path(out).write_text(json.dumps({"entries": entries}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
