"""Arguments are named exactly as Triton binds them: positional runtime args go to the kernel's
non-constexpr parameters in its own order, whatever constexprs sit before, between or after them
(set by the caller, an autotune config or a heuristic). Heuristics, perf models, prune functions
and the call's description all see those names. Cross-lowered for sm_90 on the CPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import triton
import triton.language as tl
from inspect_call import custom_calls

import lowering as jt
from lowering.planning.configs import runtime_param_names

VEC = jax.ShapeDtypeStruct((4096,), jnp.float32)


@triton.jit
def interleaved(x_ptr, BLOCK: tl.constexpr, n, out_ptr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        tl.store(out_ptr + offs, tl.load(x_ptr + offs) * 2)
    else:
        tl.store(out_ptr + offs, tl.load(x_ptr + offs) * 2, mask=offs < n)


def _kernel(seen: list):
    def even(args):
        seen.append({k: (type(v).__name__ if not isinstance(v, int) else v) for k, v in args.items()})
        return args["n"] % args["BLOCK"] == 0

    def prune(configs, named):
        seen.append({"prune": sorted(named)})
        return configs

    tuned = triton.autotune([triton.Config({"BLOCK": 512}), triton.Config({"BLOCK": 1024})], key=["n"],
                            prune_configs_by={"early_config_prune": prune})
    return tuned(triton.heuristics({"EVEN": even})(interleaved))


def test_runtime_names_skip_every_kind_of_constexpr():
    kernel = _kernel([])
    assert runtime_param_names(kernel, {}) == ["x_ptr", "n", "out_ptr"]
    assert runtime_param_names(interleaved, {"BLOCK": 8, "EVEN": True}) == ["x_ptr", "n", "out_ptr"]


def test_heuristics_prune_and_description_see_the_scalar_as_n():
    seen: list = []
    kernel = _kernel(seen)

    def fn(x):
        return jt.triton_call(x, 4096, kernel=kernel, out_shape=x, grid=lambda m: (jt.cdiv(4096, m["BLOCK"]),),
                              compute_capability=90)

    (call,) = custom_calls(jax.jit(fn).trace(VEC).lower(lowering_platforms=("cuda",)))
    assert {"prune": ["n", "out_ptr", "x_ptr"]} in seen  # the prune function got the real names
    heuristic_calls = [s for s in seen if "prune" not in s]
    assert heuristic_calls and all(s["n"] == 4096 and s["x_ptr"] != 4096 and "out_ptr" in s for s in heuristic_calls)
    configs = call["autotuned"]["configs"]
    assert [c["kernel_call"]["grid"][0] for c in configs] == [8, 4]  # cdiv(4096, 512), cdiv(4096, 1024)
    assert call["autotuned"]["name"].endswith("{'n': 4096}")  # was "{'BLOCK': 4096}": n taken for BLOCK


@pytest.mark.parametrize("where", ["caller", "config"])
def test_constexpr_before_a_runtime_parameter_binds_the_same_kernel(where):
    kernel = interleaved if where == "caller" else triton.autotune([triton.Config({"BLOCK": 1024})], key=["n"])(
        interleaved)
    extra = {"BLOCK": 1024} if where == "caller" else {}

    def fn(x):
        return jt.triton_call(x, 4096, kernel=kernel, out_shape=x, grid=(4,), EVEN=True, compute_capability=90,
                              **extra)

    (call,) = custom_calls(jax.jit(fn).trace(VEC).lower(lowering_platforms=("cuda",)))
    kernel_call = call["kernel_call"] if "kernel_call" in call else call["autotuned"]["configs"][0]["kernel_call"]
    assert kernel_call["grid"] == (4, 1, 1)


def test_num_stages_zero_is_accepted_as_triton_does():
    from compiler import compile_spec, make_spec
    from compiler.examples import add_kernel

    spec = make_spec(add_kernel, ["*fp32", "*fp32", 4096, "*fp32"], {"BLOCK": 1024}, target="sm_90", num_stages=0)
    assert spec.num_stages == 0 and compile_spec(spec).cubin
    with pytest.raises(ValueError, match="num_stages must be an integer >= 0"):
        make_spec(add_kernel, ["*fp32", "*fp32", 4096, "*fp32"], {"BLOCK": 1024}, target="sm_90", num_stages=-1)


def test_jax_triton_public_names_are_all_there():
    for name in ("triton_call", "cdiv", "next_power_of_2", "strides_from_shape", "get_compute_capability",
                 "get_serialized_metadata", "utils", "CUSTOM_CALL_TARGET_NAME"):
        assert hasattr(jt, name), name
    assert jt.utils.cdiv(10, 4) == 3 and jt.CUSTOM_CALL_TARGET_NAME == "triton_kernel_call"
    assert callable(jt.triton_module("cuda").get_compute_capability)  # what get_compute_capability calls


@pytest.mark.parametrize("target", [None, "triton_kernel_call", "triton_kernel_call_ffi"])
def test_custom_call_target_name_is_honoured(target):
    from lowering import examples as ep
    from lowering.payload import jaxlib_compat as compat

    if target == compat.FFI_TARGET and not compat.ffi_target_registered("cuda"):
        pytest.skip("needs jaxlib's CUDA plugin with the triton_kernel_call_ffi target, absent here: every "
                    "stack's venv has jax-cuda13-plugin at jaxlib's version (scripts/test.sh)")

    def fn(x, y):
        return ep.add_program(x, y, block=1024, compute_capability=90, custom_call_target_name=target,
                              device=0)  # ejKernel's fork passes device=

    (call,) = custom_calls(jax.jit(fn).trace(VEC, VEC).lower(lowering_platforms=("cuda",)))
    expected = target or (compat.FFI_TARGET if compat.ffi_target_registered("cuda") else compat.LEGACY_TARGET)
    assert call["target"] == expected
    with pytest.raises(ValueError, match="custom_call_target_name"):
        jax.jit(lambda x, y: ep.add_program(x, y, block=1024, compute_capability=90,
                                            custom_call_target_name="my_target")).trace(VEC, VEC)
