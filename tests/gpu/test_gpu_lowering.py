"""On an NVIDIA GPU: lowering.triton_call results equal jnp references (skipped without a GPU).

scripts/test.sh runs them where `nvidia-smi -L` lists a GPU (tests/conftest.py then leaves JAX_PLATFORMS
to JAX; elsewhere it defaults to cpu); the run's last lines say whether they ran or why not.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import triton
import triton.language as tl
from conftest import run_python
from test_lowering import subprocess_path

import lowering as jt
from kernel_cache import current_config
from lowering import examples as ep
from lowering.payload import jaxlib_compat as compat

# Children share the GPU with this process: no up-front grab of most of its memory.
GPU_CHILD_ENV = {"JAX_PLATFORMS": "cuda,cpu", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda_device")]



def _close(got, want, dtype):
    tol = 2e-2 if dtype == jnp.float16 else 1e-4
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=tol, atol=tol)


@pytest.mark.parametrize("label", [label for label, _, _ in ep.programs()])
def test_program_matches_jnp_reference(label):
    fn, shapes = {lbl: (f, s) for lbl, f, s in ep.programs()}[label]
    inputs = ep.random_inputs(shapes)
    got = jax.jit(fn)(*inputs)
    _close(got, ep.references()[label](*inputs), shapes[0].dtype)


def test_eager_call_matches_reference():
    x, y = ep.random_inputs([jax.ShapeDtypeStruct((5000,), jnp.float32)] * 2)
    _close(ep.add_program(x, y, block=1024), x + y, jnp.float32)


def _inplace(x, y, kernel=ep.add, **kw):  # out aliases x: x += y
    return jt.triton_call(x, y, x.size, kernel=kernel, out_shape=x, input_output_aliases={0: 0},
                          grid=lambda m: (jt.cdiv(x.size, m["BLOCK"]),), **kw)


def test_in_place_kernel_with_aliases():
    x, y = ep.random_inputs([jax.ShapeDtypeStruct((10000,), jnp.float32)] * 2)
    want = np.asarray(x) + np.asarray(y)
    _close(jax.jit(functools.partial(_inplace, BLOCK=1024))(x, y), want, jnp.float32)
    donated = jax.jit(functools.partial(_inplace, BLOCK=1024), donate_argnums=0)(jnp.array(x), y)
    _close(donated, want, jnp.float32)


def test_autotuned_in_place_kernel_restores_aliased_inputs():
    x, y = ep.random_inputs([jax.ShapeDtypeStruct((1 << 16,), jnp.float32)] * 2, seed=3)
    want = np.asarray(x) + np.asarray(y)
    got = jax.jit(functools.partial(_inplace, kernel=ep.tuned_add), donate_argnums=0)(jnp.array(x), y)
    _close(got, want, jnp.float32)  # x + y once, not x + k*y after k configs were timed


@triton.jit
def row_sum_atomic(x_ptr, n_cols, out_ptr, BLOCK: tl.constexpr):
    """out[0] += sum of each row: correct only on a zeroed output."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n_cols + offs, mask=offs < n_cols, other=0.0)
    tl.atomic_add(out_ptr, tl.sum(x, axis=0))


def test_zeroed_outputs():
    x = ep.random_inputs([jax.ShapeDtypeStruct((64, 100), jnp.float32)])[0]

    @jax.jit
    def total(x):
        return jt.triton_call(x, 100, kernel=row_sum_atomic, out_shape=jax.ShapeDtypeStruct((1,), jnp.float32),
                              grid=(64,), zeroed_outputs=(0,), BLOCK=128)

    for _ in range(3):  # an un-zeroed output would accumulate across calls
        _close(total(x)[0], np.asarray(x).sum(), jnp.float32)


CUDA_GRAPH_SCRIPT = """
import os, json, jax, jax.numpy as jnp, numpy as np
from lowering import examples as ep
def f(x, y):
    a = ep.add_program(x, y, block=1024)
    return ep.add_program(a * 2.0, y, block=512) + 1.0
x, y = ep.random_inputs([jax.ShapeDtypeStruct((1 << 16,), jnp.float32)] * 2)
compiled = jax.jit(f).lower(x, y).compile()
text = compiled.as_text()
outs = [np.asarray(compiled(x, y)) for _ in range(3)]
want = (np.asarray(x) + np.asarray(y)) * 2 + np.asarray(y) + 1
print(json.dumps({"command_buffer": "command_buffer" in text,
                  "ok": all(bool(np.allclose(o, want, rtol=1e-5, atol=1e-5)) for o in outs),
                  "snippet": [l for l in text.splitlines() if "custom_call_target" in l or "command_buffer" in l][:6]}))
"""


def test_non_autotuned_call_runs_inside_an_xla_cuda_graph():
    if not compat.ffi_target_registered("cuda"):
        pytest.skip("this jaxlib has no CUDA-graph-compatible Triton FFI target")
    import json
    import re

    env = {"XLA_FLAGS": "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1",
           # XLA names the thunks it puts into each command buffer (CUDA graph) at this log level.
           "TF_CPP_MIN_LOG_LEVEL": "0", "TF_CPP_VMODULE": "command_buffer_conversion_pass=2",
           **GPU_CHILD_ENV, **subprocess_path()}
    proc = run_python(CUDA_GRAPH_SCRIPT, env)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ok"], out
    # Evidence of capture: either the optimized HLO wraps the call in a command buffer (older XLA), or
    # the thunk-level conversion pass reports the Triton call among a command buffer's thunks.
    in_hlo = out["command_buffer"]
    in_log = re.search(r"Creating command buffer thunk with the following thunks:.*triton_kernel_call", proc.stderr)
    assert in_hlo or in_log, "the Triton FFI call was not captured in a CUDA graph:\n" + proc.stderr[-3000:]


GARBAGE_IMAGE_SCRIPT = """
import jax, jax.numpy as jnp
import lowering.payload.module_image as mi
real = mi.ModuleImage
mi.ModuleImage = lambda obj, name, smem: real(b"not a cubin" * 8, name, smem)
from lowering import examples as ep
x, y = ep.random_inputs([jax.ShapeDtypeStruct((4096,), jnp.float32)] * 2)
jax.block_until_ready(jax.jit(lambda a, b: ep.add_program(a, b, block=256))(x, y))
print("RAN")
"""


def test_module_image_is_honoured():
    if compat.module_image_layout("cuda", current_config()) is None:
        pytest.skip("this jaxlib's TritonKernel proto has no module_image; PTX is sent")
    import os
    import subprocess
    import sys

    from conftest import ROOT

    env = {**os.environ, **GPU_CHILD_ENV, **subprocess_path()}
    proc = subprocess.run([sys.executable, "-c", GARBAGE_IMAGE_SCRIPT], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    # a garbage image must break the launch: proof that jaxlib loads the image rather than the PTX
    assert proc.returncode != 0 and "RAN" not in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert "INVALID_IMAGE" in proc.stderr or "invalid" in proc.stderr.lower(), proc.stderr[-2000:]


POISON_CHILD = """
import json, jax, jax.numpy as jnp, numpy as np
import kernel_cache
from lowering import examples as ep
x, y = ep.random_inputs([jax.ShapeDtypeStruct((4096,), jnp.float32)] * 2)
add = np.asarray(jax.jit(lambda a, b: ep.add_program(a, b, block=1024))(x, y))
scaled = np.asarray(jax.jit(lambda a, b: ep.scaled_add_program(a, b, scale=3.0))(x, y))
xs, ys = np.asarray(x), np.asarray(y)
close = lambda a, b: bool(np.allclose(a, b, rtol=1e-5, atol=1e-5))  # the kernel may fuse x * 3 + y
print(json.dumps({"add": close(add, xs + ys), "add_is_scaled": close(add, xs * 3 + ys),
                  "scaled": close(scaled, xs * 3 + ys),
                  "stats": kernel_cache.default_store().stats.session()}))
"""


def test_a_poisoned_shared_kernel_runs_only_where_nothing_authenticates_it(tmp_path):
    """On the GPU: a group member swaps the shared entries of `add` (its kernel and its lowered-call
    record) for those of `scaled_add` (checksums recomputed, no key). A job trusting the directory by
    ownership runs the swapped kernel; a job with the team's signing key rejects them, recompiles and
    gets x + y."""
    import json
    import os

    from kernel_cache.entries import entry as entry_format

    shared = tmp_path / "shared"
    shared.mkdir()
    key = "team-signing-key-0123456789abcdef"

    def run(name, **env):
        proc = run_python(POISON_CHILD, {**GPU_CHILD_ENV, **subprocess_path(), "KERNEL_CACHE_DIR": str(tmp_path / name),
                                         "KERNEL_CACHE_SHARED_DIR": str(shared), **env})
        return json.loads(proc.stdout.strip().splitlines()[-1])

    first = run("writer", KERNEL_CACHE_SIGNING_KEY=key)
    assert first["add"] and first["scaled"]
    entries = {}
    for path in (shared / "entries").rglob("*"):
        if path.is_file():
            entry = entry_format.decode(path.read_bytes())
            entries[entry.meta.get("kind"), entry.meta.get("name")] = (path, entry)
    for kind in ("triton-kernel", "lowered-call"):  # the kernel, and the call's record (what a warm job reads)
        add_path, add_entry = entries[kind, "add_kernel"]
        _, scaled_entry = entries[kind, "scaled_add_kernel"]
        scaled_entry.key = add_entry.key
        add_path.write_bytes(entry_format.encode(scaled_entry))  # the swap: valid format and checksum
        os.utime(add_path)

    trusting = run("trusting")  # no key: the root-owned file passes the ownership rule
    assert trusting["add_is_scaled"] and not trusting["add"]  # the attack is real
    signed = run("signed", KERNEL_CACHE_SIGNING_KEY=key)
    assert signed["add"] and signed["scaled"] and signed["stats"]["rejected"] >= 1
