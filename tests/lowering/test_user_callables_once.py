"""A lowering calls the user's functions as jax-triton 0.4 does (`triton_lib.py`): a heuristic once
per config, a grid and zeroed outputs written as functions once per config, the early prune once, a
perf model once per config it ranks: in a cold process and in a warm one (served from the store).
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import pytest
import triton
import triton.language as tl

import kernel_cache
from kernel_cache import Config
from lowering import triton_call

VEC = jax.ShapeDtypeStruct((4096,), jnp.float32)
CALLS: collections.Counter[str] = collections.Counter()


def _heuristic(args):
    CALLS["heuristic"] += 1
    return args["n"] % args["BLOCK"] == 0


def _prune(configs, named_args, **kwargs):
    CALLS["early_config_prune"] += 1
    return configs


def _perf_model(**kwargs):
    CALLS["perf_model"] += 1
    return kwargs["BLOCK"]  # the smaller block ranks first


@triton.autotune(configs=[triton.Config({"BLOCK": 256}, num_warps=4), triton.Config({"BLOCK": 512}, num_warps=4),
                          triton.Config({"BLOCK": 1024}, num_warps=8)],
                 key=["n"], prune_configs_by={"early_config_prune": _prune, "perf_model": _perf_model, "top_k": 2})
@triton.heuristics({"EVEN": _heuristic})
@triton.jit
def tuned_add(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def _grid(meta):
    CALLS["grid"] += 1
    return (triton.cdiv(meta["n"], meta["BLOCK"]),)


def _zeroed(meta):
    CALLS["zeroed_outputs"] += 1
    return (0,)


def program(x, y):
    return triton_call(x, y, x.shape[0], kernel=tuned_add, out_shape=x, grid=_grid, zeroed_outputs=_zeroed,
                       compute_capability=90)


# jax-triton 0.4's counts for one lowering: Autotuner.prune_configs runs the early prune once and the
# perf model on each of the 3 configs; 2 survive, and each evaluates the heuristic, the grid and the
# zeroed outputs once.
JAX_TRITON_04 = {"early_config_prune": 1, "perf_model": 3, "heuristic": 2, "grid": 2, "zeroed_outputs": 2}


@pytest.fixture
def store(tmp_path):
    kernel_cache.configure(Config(dir=tmp_path / "cache"))
    yield
    kernel_cache.configure()


def _one_lowering() -> dict[str, int]:
    CALLS.clear()
    jax.clear_caches()
    jax.jit(program).trace(VEC, VEC).lower(lowering_platforms=("cuda",))
    return dict(CALLS)


def test_each_user_function_runs_as_often_as_jax_triton_runs_it_cold_and_warm(store):
    def compiles() -> int:
        return int(kernel_cache.default_store().stats.session().get("compiles", 0))

    assert _one_lowering() == JAX_TRITON_04  # cold: the two surviving configs compiled
    assert compiles() == 2
    kernel_cache.default_store().memory.clear()
    kernel_cache.current_session().forget()  # a new process on the same store: served from its record
    assert _one_lowering() == JAX_TRITON_04
    assert compiles() == 2
