"""Spec -> Artifact: run Triton's stages for a named target, on any host (no GPU, no driver).

Concurrent compiles take turns in Triton's front end (`FRONT_END`): CPython 3.11's `ast` module is
not safe to use from several threads at once ("AST constructor recursion depth mismatch", fixed in
3.12), and the front end (AST to TTIR) holds the GIL, so interleaving K front ends only makes all K
finish late. Biggest kernel first (a guess: a wrong one costs order, never correctness): its long
MLIR/LLVM stages and ptxas, which release the GIL, start while the small ones take their turns.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import json
import threading
import time
from collections.abc import Iterator

from . import triton_compat as tc
from .artifact import TEXT_BLOBS, Artifact
from .errors import CompileError
from .recipe import to_recipe
from .spec import KernelSpec
from .toolchain import toolchain_summary

_ALWAYS_KEPT = frozenset({"ptx", "cubin", "amdgcn", "hsaco", "ttir"})
_EXTRA_META = ("tmem_size", "num_warpgroups", "ptx_version", "arch", "enable_fp_fusion",
               "launch_cooperative_grid", "launch_pdl", "maxnreg",
               "tensordesc_meta")  # per host-side TMA descriptor: swizzle, element type, block (the launcher needs them)


class Turns:
    """A lock whose waiters are served heaviest first (first come, first served among equals)."""

    def __init__(self) -> None:
        self._changed = threading.Condition(threading.Lock())
        self._waiting: list[tuple[float, int]] = []  # (-weight, arrival): the heap's top goes next
        self._arrivals = itertools.count()
        self._held = False

    @contextlib.contextmanager
    def turn(self, weight: float = 0.0) -> Iterator[None]:
        ticket = (-weight, next(self._arrivals))
        with self._changed:
            heapq.heappush(self._waiting, ticket)
            try:
                while self._held or self._waiting[0] != ticket:
                    self._changed.wait()
            except BaseException:  # interrupted while waiting (KeyboardInterrupt): leave the queue
                self._waiting.remove(ticket)
                heapq.heapify(self._waiting)
                self._changed.notify_all()
                raise
            heapq.heappop(self._waiting)
            self._held = True
        try:
            yield
        finally:
            with self._changed:
                self._held = False
                self._changed.notify_all()


FRONT_END = Turns()  # the process's one front end: every compile of every thread takes its turn here


def front_end_weight(spec: KernelSpec) -> float:
    """A guess of how long `spec` compiles, to order front ends: source length times pipeline stages
    (software pipelining multiplies the code LLVM and ptxas see)."""
    source = getattr(spec.kernel, "src", "")
    return float(len(source if isinstance(source, str) else "") * max(1, spec.num_stages))


def compile_spec(spec: KernelSpec) -> Artifact:
    """Compile `spec` through Triton's stages; CompileError names the failing one."""
    stages = ["options"]  # the stages entered, the last one failing where one fails
    keep = _ALWAYS_KEPT | (set(TEXT_BLOBS) if spec.keep_ir else set())
    start = time.perf_counter()
    try:
        parsed = tc.parse_options(spec.target, spec.triton_options())
        stages.append("ast")
        src = tc.ast_source(spec.kernel, dict(spec.signature), dict(spec.constexprs), dict(spec.attrs))
        outputs, metadata = tc.run_stages(src, spec.target, parsed, stages.append, keep=keep,
                                          front_end=FRONT_END.turn(front_end_weight(spec)))
    except CompileError:
        raise
    except Exception as exc:
        raise CompileError(spec.name, stages[-1], spec.summary(), exc) from exc
    seconds = time.perf_counter() - start

    blobs = {ext: out if isinstance(out, bytes) else str(out).encode() for ext, out in outputs.items()}  # the kept
    cluster = metadata.get("cluster_dims", (1, 1, 1))
    return Artifact(
        name=metadata["name"], target=spec.target, num_warps=int(metadata.get("num_warps", spec.num_warps)),
        num_ctas=int(metadata.get("num_ctas", spec.num_ctas)), num_stages=spec.num_stages,
        shared_mem=int(metadata.get("shared", 0)), cluster_dims=tuple(cluster or (1, 1, 1)),
        global_scratch_size=int(metadata.get("global_scratch_size", 0) or 0),
        global_scratch_align=int(metadata.get("global_scratch_align", 1) or 1),
        toolchain={"summary": toolchain_summary(spec.target), "triton_version": tc.TRITON_VERSION},
        compile_seconds=seconds, recipe=to_recipe(spec), blobs=blobs,
        extra={k: json.loads(json.dumps(metadata[k], default=str)) for k in _EXTRA_META if k in metadata})
