"""scripts/jax_triton_04_programs.py through `import lowering as jt` on every stack: cross-lowered for
sm_90 in two fresh processes sharing a cache dir, the second compiles nothing and emits the same
calls (numerics: tests/gpu/test_gpu_inplace.py on a GPU)."""

from __future__ import annotations

import json

from conftest import run_python

CHILD = """
import sys; sys.path.insert(0, "tests")
import json, jax, kernel_cache, lowering as jt
from lowering import tensor_descriptor
from scripts import jax_triton_04_programs
import inspect_call
calls = {}
for label, fn, args, _ in jax_triton_04_programs.programs(jt, compute_capability=90, tma=tensor_descriptor.supported()):
    lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    calls[label] = [{k: v for k, v in c.items() if k != "metadata"} for c in inspect_call.custom_calls(lowered)]
print(json.dumps({"stats": kernel_cache.default_store().stats.session(), "calls": calls}, default=repr))
"""


def test_a_second_process_lowers_every_program_with_no_compile(tmp_path):
    env = {"KERNEL_CACHE_DIR": str(tmp_path / "cache")}
    cold = json.loads(run_python(CHILD, env).stdout.strip().splitlines()[-1])
    warm = json.loads(run_python(CHILD, env).stdout.strip().splitlines()[-1])
    assert len(cold["calls"]) >= 11 and all(len(c) == 1 for c in cold["calls"].values()), cold["calls"].keys()
    assert cold["stats"]["compiles"] > 0
    assert warm["stats"]["compiles"] == 0 and warm["stats"]["misses"] == 0, warm["stats"]
    assert warm["calls"] == cold["calls"]
