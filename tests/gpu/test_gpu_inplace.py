"""On an NVIDIA GPU: jax-triton 0.4-style programs (in place without an output pointer, tuples, Refs,
keyword operands, an unused result) through `lowering.triton_call` equal their jax.numpy references,
eagerly and under jit, and a second process lowers them with no compile (skipped without a GPU)."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import run_python

import lowering as jt
from scripts import jax_triton_04_programs

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda_device")]
PROGRAMS = {label: (fn, args, ref) for label, fn, args, ref in jax_triton_04_programs.programs(jt)}
GPU_CHILD_ENV = {"JAX_PLATFORMS": "cuda,cpu", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


def _equal(got, want):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        tol = 1e-2 if g.dtype == jnp.float16 else 1e-5
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), rtol=tol, atol=tol)


@pytest.mark.parametrize("label", sorted(PROGRAMS))
def test_program_matches_its_reference_under_jit(label):
    fn, args, ref = PROGRAMS[label]
    _equal(jax.jit(fn)(*args), ref(*args))


@pytest.mark.parametrize("label", ["inplace", "tuple_mixed", "nested", "ref_only", "refs_in_tuple"])
def test_program_matches_its_reference_eagerly(label):
    fn, args, ref = PROGRAMS[label]
    _equal(fn(*args), ref(*args))


def test_the_inputs_of_an_in_place_call_are_not_changed_without_donation():
    fn, (x, y), _ = PROGRAMS["inplace"]
    before = np.asarray(y).copy()
    jax.jit(fn)(x, y).block_until_ready()
    np.testing.assert_array_equal(np.asarray(y), before)  # XLA copied y: the caller's array is intact


CHILD = """
import json, jax, numpy as np
import kernel_cache, lowering as jt
from scripts import jax_triton_04_programs
worst = 0.0
for label, fn, args, ref in jax_triton_04_programs.programs(jt):
    for g, w in zip(jax.tree_util.tree_leaves(jax.jit(fn)(*args)), jax.tree_util.tree_leaves(ref(*args))):
        worst = max(worst, float(np.max(np.abs(np.asarray(g, np.float32) - np.asarray(w, np.float32)))))
print(json.dumps({"stats": kernel_cache.default_store().stats.session(), "worst": worst}))
"""


def test_a_second_process_compiles_nothing(tmp_path):
    env = {**GPU_CHILD_ENV, "KERNEL_CACHE_DIR": str(tmp_path / "cache")}
    cold = json.loads(run_python(CHILD, env).stdout.strip().splitlines()[-1])
    warm = json.loads(run_python(CHILD, env).stdout.strip().splitlines()[-1])
    assert cold["stats"]["compiles"] > 0 and warm["stats"]["compiles"] == 0, (cold, warm)
    assert cold["worst"] < 1e-2 and warm["worst"] < 1e-2
