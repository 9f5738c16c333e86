"""lowering.triton_call cross-lowered for CUDA on a CPU host: decode the custom call and check it.

Kernels compile once per session into the process store; later lowerings of the same specs hit it.
"""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import triton
import triton.language as tl
from conftest import run_python
from inspect_call import custom_calls

import compiler
import lowering as jt
from compiler.examples import MATMUL_CONFIGS
from lowering import examples as ep
from lowering.payload import jaxlib_compat as compat

f32 = jnp.float32


def lower(fn, *shapes, platform="cuda"):
    return jax.jit(fn).trace(*shapes).lower(lowering_platforms=(platform,))


def only_call(fn, *shapes, platform="cuda"):
    (call,) = custom_calls(lower(fn, *shapes, platform=platform))
    return call


def subprocess_path() -> dict:
    """Keep our PYTHONPATH (e.g. a --target install of a dependency) in child processes."""
    from conftest import python_path

    return {"PYTHONPATH": python_path()}


def compiles() -> int:
    from kernel_cache import default_store

    return default_store().stats.session().get("compiles", 0)


VEC = jax.ShapeDtypeStruct((4096,), f32)


# Small kernels for the cases the program set does not cover ------------------------------------
@triton.jit
def scalars_kernel(x_ptr, a, b, c, flag, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    if flag:
        x = x * c
    tl.store(out_ptr + offs, x + a + b)


@triton.jit
def two_outputs(x_ptr, n, out_a, out_b, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_a + offs, x + EVEN, mask=mask)
    tl.store(out_b + offs, x * 2, mask=mask)


def tuned_call(x, y, **kw):
    return jt.triton_call(x, y, x.size, kernel=ep.tuned_add, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          grid=lambda m: (jt.cdiv(x.size, m["BLOCK"]),), compute_capability=90, **kw)


# The program set -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def program_calls():
    """label -> decoded custom call, for every program of the benchmark set (compiled once)."""
    return {label: only_call(fn, *shapes) for label, fn, shapes in ep.programs(compute_capability=90)}


def test_plain_calls_use_the_ffi_target_with_their_grid(program_calls):
    target = compat.FFI_TARGET if compat.ffi_target_registered("cuda") else compat.LEGACY_TARGET
    assert compat.ffi_target_registered("cuda")  # jaxlib 0.10.2's plugin registers it
    for block in (256, 512, 1024, 2048):
        call = program_calls[f"add[BLOCK={block}]"]
        assert call["target"] == target
        kc = call["kernel_call"]
        assert kc["grid"] == ((1 << 20) // block, 1, 1)
        assert kc["kernel"]["kernel_name"] == "add_kernel"
        assert kc["kernel"]["compute_capability"] == 90
        arr = {"array": {"bytes_to_zero": 0, "ptr_divisibility": 16}}
        assert kc["parameters"] == [arr, arr, {"i32": 1 << 20}, arr]


def test_ptx_in_the_call_is_the_compilers(program_calls):
    spec = compiler.make_spec(ep.add, ["*fp32", "*fp32", 1 << 20, "*fp32"], {"BLOCK": 1024}, target=90)
    fresh = compiler.compile_spec(spec)  # a fresh compile, not the store's copy
    kernel = program_calls["add[BLOCK=1024]"]["kernel_call"]["kernel"]
    assert kernel["ptx"] == fresh.ptx
    assert kernel["shared_mem_bytes"] == fresh.shared_mem
    assert kernel["num_warps"] == fresh.num_warps == 4


def test_scalar_params_and_launch_options(program_calls):
    kc = program_calls["layernorm"]["kernel_call"]
    params = kc["parameters"]
    assert params[3] == {"i32": 768}
    assert params[4]["f32"] == pytest.approx(ep.EPS)
    assert kc["kernel"]["num_warps"] == 8
    assert kc["grid"] == (4096, 1, 1)


def test_autotuned_call_launches_each_config_with_its_own_grid(program_calls):
    call = program_calls["matmul[autotuned x6]"]
    assert call["target"] == compat.LEGACY_TARGET and call["api_version"] == 2
    configs = call["autotuned"]["configs"]
    assert len(configs) == len(MATMUL_CONFIGS)
    args = ["*fp16", "*fp16", 1024, 1024, 1024, 1024, 1, 1024, 1, 1024, 1, "*fp16"]
    for cfg, got in zip(MATMUL_CONFIGS, configs):
        kc = got["kernel_call"]
        assert kc["grid"] == (1024 // cfg.kwargs["BLOCK_M"], 1024 // cfg.kwargs["BLOCK_N"], 1)
        assert got["description"] == str(cfg)
        assert kc["kernel"]["num_warps"] == cfg.num_warps
        spec = compiler.make_spec(ep.matmul, args, dict(cfg.kwargs), target=90, num_warps=cfg.num_warps,
                                  num_stages=cfg.num_stages)
        assert kc["kernel"]["ptx"] == compiler.get_or_compile(spec)[0].ptx
        # the three strides equal to 1 are specialized away, as Triton's launcher does
        assert len(kc["parameters"]) == 3 + 6
    assert call["autotuned"]["aliases"] == []


def test_concurrently_compiled_configs_equal_a_sequential_compile(program_calls):
    cfg = MATMUL_CONFIGS[0]
    args = ["*fp16", "*fp16", 1024, 1024, 1024, 1024, 1, 1024, 1, 1024, 1, "*fp16"]
    spec = compiler.make_spec(ep.matmul, args, dict(cfg.kwargs), target=90, num_warps=cfg.num_warps,
                              num_stages=cfg.num_stages)
    got = program_calls["matmul[autotuned x6]"]["autotuned"]["configs"][0]["kernel_call"]["kernel"]["ptx"]
    assert got == compiler.compile_spec(spec).ptx


def test_relowering_does_no_compile(program_calls):
    before = compiles()
    for _label, fn, shapes in ep.programs(compute_capability=90):
        lower(fn, *shapes)
    assert compiles() == before


# Scalars, outputs, zeroing, aliases ---------------------------------------------------------------
def test_scalar_kinds_and_ints_equal_to_one():
    def fn(x):
        return jt.triton_call(x, 1, 1 << 40, np.float32(0.5), True, kernel=scalars_kernel, out_shape=x,
                              grid=1, BLOCK=4096, compute_capability=90)

    kc = only_call(fn, VEC)["kernel_call"]
    arr = {"array": {"bytes_to_zero": 0, "ptr_divisibility": 16}}
    # a == 1 becomes a constexpr and is not passed; 2**40 is i64; bools are i1 scalars
    assert kc["parameters"][0] == arr and kc["parameters"][-1] == arr
    assert kc["parameters"][1] == {"i64": 1 << 40}
    assert kc["parameters"][2] == {"f32": 0.5}
    assert len(kc["parameters"]) == 5


def test_pytree_outputs_out_type_and_zeroed_outputs():
    def fn(x):
        return jt.triton_call(x, x.size, kernel=two_outputs, out_type=(x, jax.ShapeDtypeStruct((4096,), f32)),
                              grid=lambda m: (jt.cdiv(4096, m["BLOCK"]),), zeroed_outputs=lambda m: (1,) if m["EVEN"] else (),
                              BLOCK=1024, EVEN=1, compute_capability=90)

    out = jax.eval_shape(fn, VEC)
    assert isinstance(out, tuple) and len(out) == 2
    kc = only_call(fn, VEC)["kernel_call"]
    assert kc["grid"] == (4, 1, 1)
    assert [p["array"]["bytes_to_zero"] for p in kc["parameters"] if "array" in p] == [0, 0, 4096 * 4]


def test_in_place_autotuned_call_passes_alias_tuples():
    def fn(x, y):
        return tuned_call(x, y, input_output_aliases={0: 0})

    low = lower(fn, VEC, VEC)
    (call,) = custom_calls(low)
    assert call["target"] == compat.LEGACY_TARGET
    grids = [c["kernel_call"]["grid"] for c in call["autotuned"]["configs"]]
    assert grids == [(16, 1, 1), (8, 1, 1)]
    # (input buffer, num_inputs + output index, bytes), jaxlib >= 0.10.0
    assert call["autotuned"]["aliases"] == [(0, 2, 4096 * 4)]
    assert "output_operand_aliases" in low.as_text()


# Configs: pruning, heuristics, pre_hook ------------------------------------------------------------
def test_configs_conflicting_with_metaparams_are_pruned():
    call = only_call(functools.partial(tuned_call, BLOCK=512), VEC, VEC)
    assert call["target"] == compat.FFI_TARGET  # one config left: a plain call
    assert call["kernel_call"]["grid"] == (8, 1, 1)
    assert call["kernel_call"]["kernel"]["num_warps"] == 4


def _heuristic_kernels():
    configs = [triton.Config({"BLOCK": 256}), triton.Config({"BLOCK": 512})]
    heur = {"EXTRA": lambda args: args["BLOCK"] * 2}

    @triton.jit
    def k(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr, EXTRA: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs) + EXTRA)

    return (triton.autotune(configs, key=["n"])(triton.heuristics(heur)(k)),
            triton.heuristics(heur)(triton.autotune(configs, key=["n"])(k)))


@pytest.mark.parametrize("order", ["autotune(heuristics(jit))", "heuristics(autotune(jit))"])
def test_heuristics_apply_per_config_in_both_decorator_orders(order):
    kernel = dict(zip(["autotune(heuristics(jit))", "heuristics(autotune(jit))"], _heuristic_kernels()))[order]

    def fn(x, y):
        return jt.triton_call(x, y, x.size, kernel=kernel, out_shape=x,
                              grid=lambda m: (jt.cdiv(4096, m["BLOCK"]), m["EXTRA"]), compute_capability=90)

    configs = only_call(fn, VEC, VEC)["autotuned"]["configs"]
    # the heuristic saw each config's BLOCK: EXTRA = 2 * BLOCK
    assert [c["kernel_call"]["grid"] for c in configs] == [(16, 512, 1), (8, 1024, 1)]


def test_pre_hook_is_refused_by_name():
    kernel = triton.autotune([triton.Config({"BLOCK": 256}, pre_hook=lambda nargs: None)], key=["n"])(
        ep.add)
    with pytest.raises(NotImplementedError, match="pre_hook"):
        lower(lambda x, y: jt.triton_call(x, y, x.size, kernel=kernel, out_shape=x, grid=1,
                                          compute_capability=90), VEC, VEC)


# Transformations, devices, targets ------------------------------------------------------------------
def test_jvp_and_vmap_point_to_custom_rules():
    fn = functools.partial(ep.add_program, block=1024, compute_capability=90)
    x = jnp.ones(4096, f32)
    # our prefix, then jax-triton's own sentence: code matching on jax-triton's wording keeps working
    with pytest.raises(NotImplementedError, match=r"^kernel-cache: kernel 'add_kernel' .*jax_triton\.triton_call "
                       r"does not support automatic differentiation\. Use jax\.custom_jvp or jax\.custom_vjp"):
        jax.jvp(fn, (x, x), (x, x))
    with pytest.raises(NotImplementedError, match=r"jax_triton\.triton_call does not support batching with "
                       r"jax\.vmap\. Use jax\.custom_batching\.custom_vmap"):
        jax.eval_shape(jax.vmap(fn), jax.ShapeDtypeStruct((2, 4096), f32), jax.ShapeDtypeStruct((2, 4096), f32))


def test_arrays_on_several_devices_are_refused_outside_shard_map():
    from types import SimpleNamespace

    from lowering.frontend.rule import check_arrays, check_lowering_context

    two = SimpleNamespace(sharding=SimpleNamespace(device_set={"gpu0", "gpu1"}))
    with pytest.raises(jt.MultiDeviceError, match="shard_map"):
        check_arrays([two])
    a, b = (SimpleNamespace(sharding=SimpleNamespace(device_set={d})) for d in ("gpu0", "gpu1"))
    with pytest.raises(jt.MultiDeviceError, match="different devices"):
        check_arrays([a, b])
    ctx = SimpleNamespace(module_context=SimpleNamespace(axis_context=SimpleNamespace(num_devices=4)))
    with pytest.raises(jt.MultiDeviceError, match="4 devices"):
        check_lowering_context(ctx)
    inside = SimpleNamespace(module_context=SimpleNamespace(axis_context=SimpleNamespace(manual_axes={"x"})))
    check_lowering_context(inside)


def _sees_gpu() -> bool:
    try:
        return bool(jax.devices("cuda"))
    except RuntimeError:
        return False


@pytest.mark.skipif(_sees_gpu(), reason="needs a host without a GPU: here the visible GPU gives the architecture")
def test_no_gpu_and_no_arch_is_a_clear_error(monkeypatch):
    import kernel_cache

    monkeypatch.delenv("KERNEL_CACHE_TARGET_ARCH", raising=False)
    kernel_cache.configure()
    fn = functools.partial(ep.add_program, block=1024)
    try:
        with pytest.raises(jt.NoTargetError, match="compute_capability=90.*KERNEL_CACHE_TARGET_ARCH"):
            lower(fn, VEC, VEC)
        monkeypatch.setenv("KERNEL_CACHE_TARGET_ARCH", "sm_90")
        kernel_cache.configure()  # the configuration is read once per configure()
        assert only_call(fn, VEC, VEC)["kernel_call"]["kernel"]["compute_capability"] == 90
    finally:
        monkeypatch.undo()
        kernel_cache.configure()


def test_rocm_cross_lowering_uses_the_legacy_target_with_an_hsaco_path():
    call = only_call(functools.partial(ep.add_program, block=1024, compute_capability="gfx942"), VEC, VEC,
                     platform="rocm")
    assert call["target"] == compat.LEGACY_TARGET  # no rocm plugin here registers the FFI target
    path = call["kernel_call"]["kernel"]["ptx"]
    with open(path, "rb") as f:  # jaxlib reads the HSACO from this file (and deletes it)
        assert f.read(4) == b"\x7fELF"


def test_drop_in_names():
    for name in ("triton_call", "cdiv", "next_power_of_2", "strides_from_shape"):
        assert callable(getattr(jt, name))
    assert jt.strides_from_shape((2, 3, 4)) == (12, 4, 1)
    assert jt.next_power_of_2(1000) == 1024 and jt.cdiv(10, 4) == 3
    with pytest.raises(TypeError, match="out_shape"):
        jt.triton_call(jnp.ones(4), kernel=ep.add, grid=1)


# Warm second process -----------------------------------------------------------------------------
WARM_SCRIPT = """
import json, jax, compiler.cache_or_compile as cached
from lowering import examples as ep
real, n = cached.compile_spec, [0]
def counting(spec):
    n[0] += 1
    return real(spec)
cached.compile_spec = counting
for label, fn, shapes in ep.programs(compute_capability=90):
    jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",))
from kernel_cache import default_store
print(json.dumps({"compiles": n[0], "store": default_store().stats.session().get("compiles", 0)}))
"""


def test_warm_second_process_lowers_with_zero_compiles(tmp_path, program_calls):
    env = {"KERNEL_CACHE_DIR": str(tmp_path / "cache"), "JAX_PLATFORMS": "cpu", **subprocess_path()}
    cold = json.loads(run_python(WARM_SCRIPT, env).stdout.strip().splitlines()[-1])
    warm = json.loads(run_python(WARM_SCRIPT, env).stdout.strip().splitlines()[-1])
    assert cold["compiles"] == 14
    assert warm == {"compiles": 0, "store": 0}
