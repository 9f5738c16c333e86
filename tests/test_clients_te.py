"""The TransformerEngine adapter (experimental), against a stand-in of TE's triton_extensions.

transformer-engine-jax needs CUDA to build, so these tests write a package with TE's module layout
and `triton_call_lowering` signature (as in TE's published code: `(ctx, kernel_fn, *array_args, grid,
input_output_aliases=None, constexprs=None)`, constexprs holding scalar runtime arguments too) whose
own path refuses to run: a call reaching it shows interception did not happen. Each scenario runs
in a fresh interpreter, as a TE job would.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from conftest import python_path, run_python

UTILS = '''
def triton_call_lowering(ctx, kernel_fn, *array_args, grid, input_output_aliases=None, constexprs=None{extra}):
    raise RuntimeError("TE's own path ran (it compiles with Triton in every process)")
'''

PERMUTATION = '''
import jax, numpy as np
import triton, triton.language as tl
from jax.extend.core import Primitive
from jax.interpreters import mlir
from .utils import triton_call_lowering  # bound by name, as TE's modules do

@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, FACTOR: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * FACTOR, mask=mask)

scale_p = Primitive("te_standin_scale")
scale_p.def_abstract_eval(lambda x, *, block: jax.core.ShapedArray(x.shape, x.dtype))

def _lowering(ctx, x, *, block):
    n = int(np.prod(ctx.avals_in[0].shape))
    return triton_call_lowering(ctx, scale_kernel, x, grid=(triton.cdiv(n, block),),
                                constexprs={"n": n, "BLOCK": block, "FACTOR": 3.0})

mlir.register_lowering(scale_p, _lowering, platform="cuda")

def scale(x, block=128):
    return scale_p.bind(x, block=block)
'''

LOWER = '''
import json, sys, warnings
warnings.simplefilter("always")
sys.path.insert(0, "tests")
{before}
import jax, jax.numpy as jnp
from transformer_engine.jax.triton_extensions import permutation
{after}
import inspect_call, kernel_cache
from lowering.clients import tally
result = {{"intercept": kernel_cache.interception.status()}}
try:
    lowered = jax.jit(permutation.scale).trace(jnp.ones(1000, jnp.float32)).lower(lowering_platforms=("cuda",))
    calls = inspect_call.custom_calls(lowered)
    result["calls"] = [(c["target"], c["kernel_call"]["kernel"]["kernel_name"], c["kernel_call"]["grid"],
                        len(c["kernel_call"]["parameters"])) for c in calls]
except RuntimeError as exc:
    result["error"] = str(exc)
result["tally"] = tally()
print(json.dumps(result))
'''


def _standin(root, extra: str = "") -> None:
    pkg = root / "transformer_engine" / "jax" / "triton_extensions"
    pkg.mkdir(parents=True)
    for d in (root / "transformer_engine", root / "transformer_engine" / "jax"):
        (d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from .utils import triton_call_lowering\n")
    (pkg / "utils.py").write_text(UTILS.format(extra=extra))
    (pkg / "permutation.py").write_text(PERMUTATION)


def _run(tmp_path, *, env: dict, before: str = "", after: str = "") -> tuple[dict, str]:
    proc = run_python(textwrap.dedent(LOWER.format(before=before, after=after)),
                      env={"PYTHONPATH": python_path(tmp_path), "KERNEL_CACHE_TARGET_ARCH": "sm_90",
                           "KERNEL_CACHE_DIR": str(tmp_path / "cache"), **env})
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.parametrize("how", ["variable", "in code, after TE bound the name"])
def test_te_primitives_are_served_whenever_interception_starts(tmp_path, how):
    _standin(tmp_path)
    if how == "variable":
        report, _ = _run(tmp_path, env={"KERNEL_CACHE_INTERCEPT": "transformer_engine"})
    else:
        report, _ = _run(tmp_path, env={}, after="import kernel_cache\nkernel_cache.intercept('transformer_engine')")
    assert report["intercept"] == {"transformer_engine": "installed"}
    # x and out are the kernel's runtime parameters; n, BLOCK and FACTOR were compiled in (TE's meaning)
    assert report["calls"] == [["triton_kernel_call_ffi", "scale_kernel", [8, 1, 1], 2]]
    assert report["tally"] == {"transformer_engine": {"served": 1, "fallback": 0}}


def test_an_unknown_te_signature_is_left_alone_with_one_warning(tmp_path):
    _standin(tmp_path, extra=", launch_cooperative=False")
    report, stderr = _run(tmp_path, env={"KERNEL_CACHE_INTERCEPT": "transformer_engine"})
    assert report["intercept"]["transformer_engine"].startswith("declined: TE's triton_call_lowering takes")
    assert report["error"] == "TE's own path ran (it compiles with Triton in every process)"
    assert stderr.count("kernel-cache does not intercept transformer_engine") == 1


def test_without_the_variable_te_keeps_its_own_path(tmp_path):
    _standin(tmp_path)
    report, _ = _run(tmp_path, env={})
    assert report["intercept"] == {} and report["tally"] == {}
    assert report["error"] == "TE's own path ran (it compiles with Triton in every process)"
