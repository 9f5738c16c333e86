"""The TransformerEngine adapter (experimental), against a stand-in of TE's triton_extensions.

transformer-engine-jax needs CUDA to build, so these tests write a package with TE's module layout
and `triton_call_lowering` signature (as in TE's published code: `(ctx, kernel_fn, *array_args, grid,
input_output_aliases=None, constexprs=None)`, constexprs holding scalar runtime arguments too) whose
own path refuses to run: a call reaching it shows interception did not happen. Each scenario runs
in a fresh interpreter, as a TE job would.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT, child_env, python_path, run_python

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


# TE's own utils.py (the pure-Python transformer-engine wheel, scripts/test.sh installs it --no-deps) --
REAL_TE = '''
import importlib, importlib.util, json, os, sys, types, warnings
warnings.simplefilter("always")
sys.path[:0] = ["tests", "."]
# TE's package __init__ files load its CUDA extension: make the packages plain namespaces so that only
# triton_extensions/utils.py (and version_utils.py) run, as they are
root = os.path.dirname(importlib.util.find_spec("transformer_engine").origin)
for name, path in (("transformer_engine", root), ("transformer_engine.jax", root + "/jax"),
                   ("transformer_engine.jax.triton_extensions", root + "/jax/triton_extensions")):
    module = types.ModuleType(name)
    module.__path__ = [path]
    sys.modules[name] = module
import jax, jax.numpy as jnp, numpy as np, triton, triton.language as tl
from jax.extend.core import Primitive
from jax.interpreters import mlir
utils = importlib.import_module("transformer_engine.jax.triton_extensions.utils")
if "{own}" == "own":  # TE reads the compute capability from the GPU: answered with 90 (no GPU here)
    from client_child import _Capability90
    utils.gpu_triton = _Capability90(utils.gpu_triton)
from transformer_engine.jax.triton_extensions.utils import triton_call_lowering  # bound by name, as TE does

@triton.autotune(configs=[triton.Config({{"BLOCK_SIZE": 128}}, num_warps=4),
                          triton.Config({{"BLOCK_SIZE": 256}}, num_warps=8)], key=["n"])
@triton.jit
def tuned_scale(x_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2.0, mask=offs < n)

@triton.jit
def plain_scale(x_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2.0, mask=offs < n)

def primitive(kernel):
    p = Primitive("te_real_" + kernel.__name__ if hasattr(kernel, "__name__") else "te_real_tuned")
    p.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
    def lowering(ctx, x):
        n = int(np.prod(ctx.avals_in[0].shape))
        # TE's pattern: a fallback BLOCK_SIZE among the constexprs, the grid a callable of the config
        return triton_call_lowering(ctx, kernel, x, grid=lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),),
                                    constexprs={{"n": n, "BLOCK_SIZE": 128}})
    mlir.register_lowering(p, lowering, platform="cuda")
    return p

import inspect_call, kernel_cache
from lowering.clients import tally
out = {{}}
for label, kernel in (("plain", plain_scale), ("tuned", tuned_scale)):
    p = primitive(kernel)
    lowered = jax.jit(p.bind).trace(jnp.ones(1000, jnp.float32)).lower(lowering_platforms=("cuda",))
    calls = []
    for c in inspect_call.custom_calls(lowered):
        kcs = [c["kernel_call"]] if "kernel_call" in c else [x["kernel_call"] for x in c["autotuned"]["configs"]]
        calls.append([c["target"], [(k["kernel"]["kernel_name"], k["kernel"]["num_warps"], list(k["grid"]),
                                     len(k["parameters"])) for k in kcs]])
    out[label] = calls
print(json.dumps({{"calls": out, "tally": tally(), "intercept": kernel_cache.interception.status()}}))
'''


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is None,
                    reason="needs transformer-engine's pure-Python wheel, not installed here: every stack's venv "
                           "has it (scripts/test.sh)")
def test_tes_own_utils_module_is_served_with_tes_launch_semantics(tmp_path):
    """TE 2.x's real triton_call_lowering: served here, the same kernels, configs, warps and grids as
    TE's own path (config values win over the caller's fallback BLOCK_SIZE; 4 warps by default)."""
    env = {"KERNEL_CACHE_TARGET_ARCH": "sm_90", "KERNEL_CACHE_DIR": str(tmp_path / "cache")}

    def run(mode: str, **extra: str) -> dict:
        script = tmp_path / f"te_{mode}.py"  # Triton reads kernels' source: they must live in a file
        script.write_text(REAL_TE.format(own=mode))
        proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=child_env(**env, **extra),
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    ours = run("ours", KERNEL_CACHE_INTERCEPT="transformer_engine")
    theirs = run("own")
    assert ours["intercept"] == {"transformer_engine": "installed"} and theirs["intercept"] == {}
    assert ours["tally"] == {"transformer_engine": {"served": 2, "fallback": 0}} and theirs["tally"] == {}
    assert ours["calls"]["plain"] == [["triton_kernel_call_ffi", [["plain_scale", 4, [8, 1, 1], 2]]]]
    assert ours["calls"]["tuned"] == [["triton_kernel_call", [["tuned_scale", 4, [8, 1, 1], 2],
                                                               ["tuned_scale", 8, [4, 1, 1], 2]]]]
    assert ours["calls"] == theirs["calls"]
