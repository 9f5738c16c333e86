"""jax-triton 0.4 keywords and behaviours beyond the program set (CPU cross-lowering for sm_90)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import triton
import triton.language as tl
from inspect_call import custom_calls

import lowering as jt
from lowering import examples as ep

VEC = jax.ShapeDtypeStruct((4096,), jnp.float32)


def _calls(fn, *shapes):
    return custom_calls(jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",)))


def _add(x, y, **kw):
    kw.setdefault("BLOCK", 256)
    return jt.triton_call(x, y, x.size, kernel=ep.add, out_shape=x, grid=lambda m: (jt.cdiv(x.size, m["BLOCK"]),),
                          compute_capability=90, **kw)


def test_launch_parameters_inside_backend_options():
    (call,) = _calls(lambda x, y: _add(x, y, backend_options={"num_warps": 8}, num_ctas=None), VEC, VEC)
    assert call["kernel_call"]["kernel"]["num_warps"] == 8
    with pytest.raises(ValueError, match="both as an argument and in backend_options"):
        _calls(lambda x, y: _add(x, y, num_warps=4, backend_options={"num_warps": 8}), VEC, VEC)
    with pytest.raises(TypeError, match=r"backend_options\['extern_libs'\] must be hashable, got "):
        _calls(lambda x, y: _add(x, y, backend_options={"extern_libs": {"libdevice": "/x.bc"}}), VEC, VEC)


def test_a_call_whose_outputs_are_unused_is_never_removed():
    def unused(x, y, **kw):
        _add(x, y, **kw)
        return x

    (call,) = _calls(unused, VEC, VEC)  # jax-triton 0.4: it may write through an input or have side effects
    assert call["kernel_call"]["grid"] == (16, 1, 1)
    plain = jax.jit(unused).trace(VEC, VEC).lower(lowering_platforms=("cuda",))
    assert "has_side_effect = true" not in plain.as_text()
    marked = jax.jit(lambda x, y: unused(x, y, has_side_effect=True)).trace(VEC, VEC).lower(
        lowering_platforms=("cuda",))
    assert "has_side_effect = true" in marked.as_text()


def test_cost_estimate_reaches_the_hlo():
    estimate = {"flops": 4096, "bytes_accessed": 3 * 4096 * 4, "transcendentals": 0}
    lowered = jax.jit(lambda x, y: _add(x, y, cost_estimate=estimate)).trace(VEC, VEC).lower(
        lowering_platforms=("cuda",))
    assert '{cost_estimate_json = "{\\22flops\\22: 4096, ' in lowered.as_text()
    assert "cost_estimate_json" in lowered.compiler_ir("hlo").as_hlo_text()  # where: test_jax_triton_04_semantics
    assert "cost_estimate_json" not in jax.jit(_add).trace(VEC, VEC).lower(lowering_platforms=("cuda",)).as_text()
    with pytest.raises(ValueError, match="cost_estimate keys \\['flop'\\]"):
        _calls(lambda x, y: _add(x, y, cost_estimate={"flop": 1}), VEC, VEC)
    with pytest.raises(ValueError, match="must be a number >= 0"):
        _calls(lambda x, y: _add(x, y, cost_estimate={"flops": -1}), VEC, VEC)


def test_perf_model_and_top_k_prune_configs_before_compiling():
    tuned = triton.autotune(
        configs=[triton.Config({"BLOCK": b}, num_warps=4) for b in (128, 256, 512, 1024)], key=["n"],
        prune_configs_by={"perf_model": lambda **kw: abs(kw["BLOCK"] - 512), "top_k": 2})(ep.add)
    (call,) = _calls(lambda x, y: jt.triton_call(x, y, x.size, kernel=tuned, out_shape=x, compute_capability=90,
                                                 grid=lambda m: (jt.cdiv(x.size, m["BLOCK"]),)), VEC, VEC)
    grids = sorted(c["kernel_call"]["grid"][0] for c in call["autotuned"]["configs"])
    assert grids == [4096 // 512, 4096 // 256]  # the two configs the model ranks first: BLOCK 512, 256


@triton.jit
def _add_default_block(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr = 128):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + tl.load(y_ptr + offs, mask=offs < n),
             mask=offs < n)


def test_declared_constexpr_defaults_fill_missing_metaparameters():
    (call,) = _calls(lambda x, y: jt.triton_call(x, y, x.size, kernel=_add_default_block, out_shape=x,
                                                 grid=lambda m: (jt.cdiv(x.size, m["BLOCK"]),),
                                                 compute_capability=90), VEC, VEC)
    assert call["kernel_call"]["grid"] == (4096 // 128, 1, 1)
    (call,) = _calls(lambda x, y: jt.triton_call(x, y, x.size, kernel=_add_default_block, out_shape=x,
                                                 grid=lambda m: (jt.cdiv(x.size, m["BLOCK"]),),
                                                 compute_capability=90, BLOCK=512), VEC, VEC)
    assert call["kernel_call"]["grid"] == (4096 // 512, 1, 1)


@triton.jit
def _axpy(x_ptr, a, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs) * a)


def test_floats_beyond_fp32_range_travel_as_fp64():
    def axpy(a):
        return lambda x: jt.triton_call(x, a, kernel=_axpy, out_shape=x, grid=1, compute_capability=90,
                                        BLOCK=128)

    x = jax.ShapeDtypeStruct((128,), jnp.float32)
    (big,) = _calls(axpy(1e300), x)
    (small,) = _calls(axpy(0.5), x)
    assert {"f64": 1e300} in big["kernel_call"]["parameters"]
    assert {"f32": 0.5} in small["kernel_call"]["parameters"]


def test_bad_aliases_and_array_metaparameters_are_clear_errors():
    two = (jax.ShapeDtypeStruct((8,), jnp.float32),) * 2
    with pytest.raises(ValueError, match="at most one input"):
        _calls(lambda x, y: jt.triton_call(x, y, 8, kernel=ep.add, out_shape=x, grid=1, BLOCK=8,
                                           input_output_aliases={0: 0, 1: 0}, compute_capability=90), *two)
    with pytest.raises(TypeError, match="names no runtime parameter of the kernel"):
        _calls(lambda x, y: jt.triton_call(x, x.size, kernel=ep.add, out_shape=x, grid=1, BLOCK=8, why=y,
                                           y_ptr=y, compute_capability=90), *two)
    with pytest.raises(TypeError, match="complex"):
        _calls(lambda x: jt.triton_call(x, np.complex64(1), kernel=_axpy, out_shape=x, grid=1, BLOCK=8,
                                        compute_capability=90), two[0])


@triton.jit
def _out_in_the_middle(x_ptr, out_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs) + tl.load(y_ptr + offs), mask=offs < n)


def test_keyword_arrays_are_operands_of_the_parameters_they_name():
    """jax-triton 0.4: `triton_call(x, y_ptr=y, n=n)` binds y to y_ptr and n to n, the same call as
    passing them in place; `triton_call(x, n, y_ptr=y)` gives y_ptr twice (n fills it), as Python says."""
    (positional,) = _calls(lambda x, y: _add(x, y), VEC, VEC)
    (by_name,) = _calls(lambda x, y: jt.triton_call(x, y_ptr=y, n=x.size, kernel=ep.add, out_shape=x, BLOCK=256,
                                                    grid=lambda m: (jt.cdiv(x.size, m["BLOCK"]),),
                                                    compute_capability=90), VEC, VEC)
    assert by_name == positional
    with pytest.raises(TypeError, match="multiple values for argument 'y_ptr'"):
        _calls(lambda x, y: jt.triton_call(x, x.size, y_ptr=y, kernel=ep.add, out_shape=x, BLOCK=256, grid=16,
                                           compute_capability=90), VEC, VEC)
    # an output parameter before the named one: 0.4 would bind the output in between, which a launch of
    # inputs-then-outputs cannot express: said, not guessed
    with pytest.raises(TypeError, match="names a parameter after the ones the outputs take"):
        _calls(lambda x, y: jt.triton_call(x, y_ptr=y, n=8, kernel=_out_in_the_middle, out_shape=x, grid=1,
                                           BLOCK=8, compute_capability=90), VEC, VEC)


def test_tensor_descriptor_is_jax_tritons_pytree():
    x = jnp.ones((64, 64), jnp.float32)
    desc = jt.TensorDescriptor.from_array(x, (16, 16))
    assert (desc.shape, desc.strides, desc.block_shape) == ((64, 64), (64, 1), (16, 16))
    assert jax.tree_util.tree_leaves(desc) == [x]  # a pytree whose only child is the array, as in 0.4
    with pytest.raises(ValueError, match="padding must be 'zero' or 'nan'"):
        jt.TensorDescriptor.from_array(x, (16, 16), padding="one")


def test_every_public_name_of_jax_triton_0_3_and_0_4():
    names_03 = {"utils", "triton_call", "cdiv", "next_power_of_2", "strides_from_shape", "__version__",
                "__version_info__", "get_compute_capability", "get_serialized_metadata"}
    names_04 = {"triton_call", "strides_from_shape", "CUSTOM_CALL_TARGET_NAME", "TensorDescriptor", "__version__",
                "__version_info__"}
    assert all(hasattr(jt, n) for n in names_03 | names_04), sorted(n for n in names_03 | names_04 if not hasattr(jt, n))
    import inspect

    ours = set(inspect.signature(jt.triton_call).parameters)
    keywords_04 = {"kernel", "out_type", "grid", "name", "num_warps", "num_stages", "num_ctas", "compute_capability",
                   "backend_options", "input_output_aliases", "zeroed_outputs", "debug", "serialized_metadata",
                   "cost_estimate", "has_side_effect"}
    assert keywords_04 <= ours, keywords_04 - ours
    try:
        import jax_triton
    except ImportError:
        return
    theirs = {n for n, p in inspect.signature(jax_triton.triton_call).parameters.items() if p.kind == p.KEYWORD_ONLY}
    assert theirs <= ours, theirs - ours
    assert {n for n in dir(jax_triton) if not n.startswith("_") and n != "triton_lib" and n != "version"} <= set(dir(jt))


def test_mapping_parameters_read_as_jax_triton_0_4_keeps_them():
    """metaparams, backend_options, input_output_aliases and cost_estimate are read-only mappings in
    the jaxpr (`"BLOCK" in eqn.params["metaparams"]`), equal and hashed alike across traces, so JAX's
    caches see the same call; they refuse assignment."""
    from collections.abc import Mapping

    def program(x, y):
        return _add(x, y, backend_options={"num_warps": 8, "maxnreg": 128}, input_output_aliases={0: 0},
                    cost_estimate={"flops": 4096})

    (eqn,), (again,) = (jax.make_jaxpr(program)(jnp.ones(4096), jnp.ones(4096)).eqns for _ in range(2))
    params = eqn.params
    for name in ("metaparams", "backend_options", "input_output_aliases", "cost_estimate"):
        assert isinstance(params[name], Mapping), name
        assert params[name] == again.params[name] and hash(params[name]) == hash(again.params[name])
    assert "BLOCK" in params["metaparams"] and params["metaparams"]["BLOCK"] == 256
    assert dict(params["backend_options"]) == {"maxnreg": 128}  # the launch parameters are parameters of their own
    assert dict(params["input_output_aliases"]) == {0: 0} and dict(params["cost_estimate"]) == {"flops": 4096}
    assert params["metaparams"] != jax.make_jaxpr(lambda x, y: _add(x, y, BLOCK=512))(
        jnp.ones(4096), jnp.ones(4096)).eqns[0].params["metaparams"]
    with pytest.raises((AttributeError, TypeError)):
        params["metaparams"]["BLOCK"] = 1  # type: ignore[index]
    with pytest.raises(AttributeError):
        params["metaparams"]._items = ()
