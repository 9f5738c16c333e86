"""jax-triton 0.4's call semantics, as its own `triton_lib.py` defines them, through `lowering.triton_call`
and through interception of `jax_triton.triton_call`, jax-triton 0.3's readings kept
where 0.3 differs (decided per call):

(a) keyword operands with `input_output_aliases` counted over the kernel's runtime parameters in
    declaration order (`x_in_out_ptr=x, n_elements=n, input_output_aliases={1: 0}`);
(b) a keyword operand that repeats a positional one: Python's `TypeError: multiple values for argument`;
(c) a scalar keyword naming a runtime parameter is passed at run time: two values of `n_elements` not
    divisible by 16 launch one kernel. 0.3 compiled every keyword in; that stays where 0.4's binding
    cannot place the scalar (a parameter the positional arguments fill, one after the outputs'), and a
    callable grid reads `meta["n_elements"]` either way;
(d) `cost_estimate` as `cost_estimate_json` in the FFI custom call's backend config, where jax-triton
    0.4 writes it (the legacy target's backend config is the payload: there, a frontend attribute).

Cross-lowered for sm_90 on the CPU, the custom calls decoded. Each kernel spec compiles once: the
lowering path compiles it, interception (in this process) is served from the same store, and
jax-triton 0.4's own path, the reference, runs once in a child process.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from typing import Any

import jax
import jax.numpy as jnp
import pytest
import triton
import triton.language as tl
from inspect_call import custom_calls

import lowering as jt

GRID = (4,)
BLOCK = 256
VEC = jax.ShapeDtypeStruct((GRID[0] * BLOCK,), jnp.float32)
N = 1000  # not divisible by 16: Triton specializes neither 1000 nor 1001, so one kernel serves both
COST = {"flops": 2 * N, "bytes_accessed": 12 * N}


_JAX_TRITON = importlib.metadata.version("jax-triton") if importlib.util.find_spec("jax_triton") else None

# conftest's needs_jax_triton_04, made here: a child process imports this module, and conftest must not
# run there (it clears KERNEL_CACHE_* and points the caches elsewhere)
needs_04 = pytest.mark.skipif(
    _JAX_TRITON is None or tuple(int(p) for p in _JAX_TRITON.split(".")[:2]) < (0, 4),
    reason=f"needs jax-triton 0.4, and this environment has {f'jax-triton {_JAX_TRITON}' if _JAX_TRITON else 'none'}: "
           "runs on the current stacks (KERNEL_CACHE_STACKS=current scripts/test.sh)")
pytestmark = pytest.mark.filterwarnings("ignore:input_output_aliases is deprecated:DeprecationWarning")


@triton.jit
def double_inplace_kernel(n_elements, x_in_out_ptr, BLOCK_SIZE: tl.constexpr):
    """x *= 2 in x's own buffer: no output pointer (jax-triton 0.4's in place)."""
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n_elements
    tl.store(x_in_out_ptr + offs, tl.load(x_in_out_ptr + offs, mask=mask) * 2, mask=mask)


@triton.jit
def add_kernel(x_ptr, y_ptr, n_elements, out_ptr, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n_elements
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def add_output_first_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    """Triton's tutorial order: n_elements after the output's pointer."""
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n_elements
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def negate_kernel(n, x_ptr, out_ptr, BLOCK_SIZE: tl.constexpr):
    """n first: `triton_call(x, n=...)` fills n positionally in 0.4's binding, not in 0.3's."""
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    tl.store(out_ptr + offs, -tl.load(x_ptr + offs, mask=mask), mask=mask)


def programs(m: Any) -> dict[str, tuple[Any, tuple[Any, ...]]]:
    """(a), (c) and (d) written for jax-triton 0.4's API, through `m` (`lowering` or `jax_triton`)."""
    cc = {"grid": GRID, "BLOCK_SIZE": BLOCK, "compute_capability": 90}

    def inplace_by_name(x):
        return m.triton_call(x_in_out_ptr=x, n_elements=N, kernel=double_inplace_kernel, out_type=x,
                             input_output_aliases={1: 0}, **cc)

    def inplace_in_place(x):  # the same operands positionally: the same call
        return m.triton_call(N, x, kernel=double_inplace_kernel, out_type=x, input_output_aliases={1: 0}, **cc)

    def add_n(n):
        return lambda x, y: m.triton_call(x, y, n_elements=n, kernel=add_kernel, out_type=x, **cc)

    def add_with_cost(x, y):
        return m.triton_call(x, y, N, kernel=add_kernel, out_type=x, cost_estimate=COST, **cc)

    return {"a_by_name": (inplace_by_name, (VEC,)), "a_in_place": (inplace_in_place, (VEC,)),
            "c_1000": (add_n(N), (VEC, VEC)), "c_1001": (add_n(N + 1), (VEC, VEC)),
            "d_cost": (add_with_cost, (VEC, VEC))}


def attributes(lowered: Any) -> list[dict[str, Any]]:
    """Per Triton custom call: its backend config's attribute names (None: the config is the payload
    itself), its `cost_estimate_json` there, and its frontend attributes."""
    from jax._src.lib.mlir import ir

    found: list[dict[str, Any]] = []

    def visit(op: Any) -> None:
        attrs = op.operation.attributes
        if op.operation.name == "stablehlo.custom_call" and ir.StringAttr(
                attrs["call_target_name"]).value.startswith("triton_kernel_call"):
            entry: dict[str, Any] = {"backend_config": None, "cost_estimate_json": None, "frontend": {}}
            if "mhlo.backend_config" in attrs:
                config = ir.DictAttr(attrs["mhlo.backend_config"])
                entry["backend_config"] = sorted(config[i].name for i in range(len(config)))
                if "cost_estimate_json" in config:
                    entry["cost_estimate_json"] = ir.StringAttr(config["cost_estimate_json"]).value
            if "mhlo.frontend_attributes" in attrs:
                frontend = ir.DictAttr(attrs["mhlo.frontend_attributes"])
                entry["frontend"] = {frontend[i].name: ir.StringAttr(frontend[i].attr).value
                                     for i in range(len(frontend))}
            found.append(entry)
        for region in op.operation.regions:
            for block in region.blocks:
                for inner in block.operations:
                    visit(inner)

    for op in lowered.compiler_ir("stablehlo").body.operations:
        visit(op)
    return found


def comparable(call: dict[str, Any]) -> dict[str, Any]:
    """A decoded call less what differs by design between kernel-cache and jax-triton's own path: the
    compiled text (jax-triton never specializes a static int; kernel-cache attaches the cubin and keeps
    the TTIR out unless debug) and the custom call target's name and API version."""
    call = json.loads(json.dumps(call, default=repr))
    call.pop("target", None)
    call.pop("api_version", None)
    kernel = call["kernel_call"]["kernel"]
    for key in ("ptx", "ttir", "module_image"):
        kernel.pop(key, None)
    return call


def lower_all(m: Any, compiles: Any = None) -> dict[str, dict[str, Any]]:
    """Each program through `m`, cross-lowered for sm_90: its decoded calls, their attributes, the
    custom call's aliases and (with `compiles`, a counter) the Triton compiles its lowering ran."""
    out = {}
    for label, (fn, args) in programs(m).items():
        before = compiles() if compiles else 0
        lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
        out[label] = {"calls": custom_calls(lowered), "attributes": attributes(lowered),
                      "aliased": "output_operand_alias" in lowered.as_text(),
                      "compiles": (compiles() - before) if compiles else None}
    return out


def reference(jax_triton: Any) -> dict[str, Any]:
    """jax-triton 0.4's own path (run by the child below): the programs' calls, and how many kernels
    it compiled for add_kernel across c_1000, c_1001 and d_cost."""
    lowered = lower_all(jax_triton)
    return {"programs": {label: {**p, "calls": [comparable(c) for c in p["calls"]]} for label, p in lowered.items()},
            "add_kernels": len(add_kernel._jT_kernel_cache)}


_REFERENCE_CHILD = """
import json, sys
sys.path[:0] = ["tests"]
import jax_triton
import jax_triton.triton_lib as jtl
from lowering.jax_compat import adapt_foreign_dce_rule
adapt_foreign_dce_rule(jtl.triton_kernel_call_p)  # jax-triton 0.4.1's DCE rule fails on JAX 0.12 (scaffolding)
import test_jax_triton_04_semantics as t
print(json.dumps(t.reference(jax_triton)))
"""


def _compiles() -> int:
    import kernel_cache

    return int(kernel_cache.default_store().stats.session()["compiles"])


@pytest.fixture(scope="module")
def ours() -> dict[str, dict[str, Any]]:
    return lower_all(jt, _compiles)


@pytest.fixture(scope="module")
def intercepted(ours: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The programs through `jax_triton.triton_call`, intercepted in this process (after `ours`, so
    the store holds every kernel already)."""
    import jax_triton

    import kernel_cache
    from lowering.clients import tally

    assert kernel_cache.intercept("jax_triton") == {"jax_triton": "installed"}
    before = tally().get("jax_triton", {"served": 0, "fallback": 0})
    programs_ = lower_all(jax_triton, _compiles)
    after = tally()["jax_triton"]
    return {"programs": programs_, "served": after["served"] - before["served"],
            "fallback": after["fallback"] - before["fallback"], "module": jax_triton}


@pytest.fixture(scope="module")
def own() -> dict[str, Any]:
    from conftest import run_python

    return json.loads(run_python(_REFERENCE_CHILD).stdout.strip().splitlines()[-1])


def _params(result: dict[str, Any]) -> list[dict[str, Any]]:
    (call,) = result["calls"]
    return call["kernel_call"]["parameters"]


ARRAY = {"array": {"bytes_to_zero": 0, "ptr_divisibility": 16}}


# (a) keyword operands with input_output_aliases over the declared parameters

def test_a_keyword_operands_alias_over_the_kernels_parameters_in_declaration_order(ours):
    by_name, in_place = ours["a_by_name"], ours["a_in_place"]
    assert _params(by_name) == [{"i32": N}, ARRAY]  # n_elements, then x's buffer: no output pointer (0.4)
    assert by_name["aliased"] and by_name["calls"] == in_place["calls"]


@needs_04
def test_a_through_interception_as_jax_tritons_own_path(ours, intercepted, own):
    for label in ("a_by_name", "a_in_place"):
        assert intercepted["programs"][label]["calls"] == ours[label]["calls"], label
        theirs = own["programs"][label]
        assert [comparable(c) for c in ours[label]["calls"]] == theirs["calls"], label
        assert theirs["aliased"] and intercepted["programs"][label]["aliased"]


# (b) a keyword operand repeating a positional one

def _repeats(m: Any) -> list[Any]:
    cc = {"kernel": add_kernel, "grid": GRID, "BLOCK_SIZE": BLOCK, "compute_capability": 90}
    return [lambda x, y: m.triton_call(x, y, x_ptr=x, n_elements=N, out_type=x, **cc),
            lambda x, y: m.triton_call(y, x_ptr=x, n_elements=N, out_type=x, **cc)]


def test_b_a_keyword_repeating_a_positional_operand_is_pythons_type_error():
    for fn in _repeats(jt):
        with pytest.raises(TypeError, match="multiple values for argument 'x_ptr'"):
            jax.jit(fn).trace(VEC, VEC)


@needs_04
def test_b_through_interception_is_jax_tritons_own_error(intercepted):
    for fn in _repeats(intercepted["module"]):
        with pytest.raises(TypeError, match="multiple values for argument 'x_ptr'"):
            jax.jit(fn).trace(VEC, VEC)


def test_b_03_reading_kept_a_scalar_keyword_the_positional_arguments_would_fill_is_compiled_in():
    """`triton_call(x, n=...)` for `(n, x_ptr, out_ptr)`: 0.4 binds x to n (then n twice); 0.3 compiles n
    in and x fills x_ptr. The call still lowers, as it did."""
    lowered = jax.jit(lambda x: jt.triton_call(x, n=N, kernel=negate_kernel, out_type=x, grid=GRID, BLOCK_SIZE=BLOCK,
                                               compute_capability=90)).trace(VEC).lower(lowering_platforms=("cuda",))
    (call,) = custom_calls(lowered)
    assert call["kernel_call"]["parameters"] == [ARRAY, ARRAY]


# (c) a scalar keyword operand is passed at run time

def test_c_two_values_of_a_scalar_keyword_launch_one_kernel(ours):
    first, second = ours["c_1000"], ours["c_1001"]
    assert _params(first) == [ARRAY, ARRAY, {"i32": N}, ARRAY]
    assert _params(second) == [ARRAY, ARRAY, {"i32": N + 1}, ARRAY]
    assert first["calls"][0]["kernel_call"]["kernel"] == second["calls"][0]["kernel_call"]["kernel"]
    assert second["compiles"] == 0  # the kernel of n_elements=1000 serves 1001
    assert ours["d_cost"]["calls"][0]["kernel_call"]["kernel"] == first["calls"][0]["kernel_call"]["kernel"]


@needs_04
def test_c_through_interception_and_jax_tritons_own_path_one_kernel(ours, intercepted, own):
    for label in ("c_1000", "c_1001"):
        assert intercepted["programs"][label]["calls"] == ours[label]["calls"], label
        assert intercepted["programs"][label]["compiles"] == 0, label
        assert [comparable(c) for c in ours[label]["calls"]] == own["programs"][label]["calls"], label
    assert own["add_kernels"] == 1  # jax-triton compiled one add_kernel for n_elements 1000, 1001 (and d_cost)


def test_c_a_callable_grid_reads_the_scalar_keyword_in_either_reading():
    """0.3 passed keywords to the grid as metaparameters; a runtime scalar keyword is there too (as
    Triton's launcher passes the named arguments), and so is one compiled in as 0.3 did (after the
    output's parameter, which 0.4's binding would place where kernel-cache's launch cannot)."""
    def call(kernel):
        return lambda x, y: jt.triton_call(x, y, n_elements=N, kernel=kernel, out_type=x, BLOCK_SIZE=BLOCK,
                                           grid=lambda m: (jt.cdiv(m["n_elements"], m["BLOCK_SIZE"]),),
                                           compute_capability=90)

    for kernel, params in ((add_kernel, [ARRAY, ARRAY, {"i32": N}, ARRAY]), (add_output_first_kernel, [ARRAY] * 3)):
        (found,) = custom_calls(jax.jit(call(kernel)).trace(VEC, VEC).lower(lowering_platforms=("cuda",)))
        assert found["kernel_call"]["grid"] == (4, 1, 1)
        assert found["kernel_call"]["parameters"] == params, kernel  # the tutorial order: n compiled in (0.3)


# (d) cost_estimate where jax-triton 0.4 writes it

def _expected_cost(ffi: bool) -> dict[str, Any]:
    text = json.dumps(COST)
    if ffi:
        return {"backend_config": ["cost_estimate_json", "name", "opaque"], "cost_estimate_json": text, "frontend": {}}
    return {"backend_config": None, "cost_estimate_json": None, "frontend": {"cost_estimate_json": text}}


def test_d_cost_estimate_in_the_ffi_backend_config(ours):
    from lowering.payload import jaxlib_compat as compat

    ffi = compat.ffi_target_registered("cuda")
    (call,) = ours["d_cost"]["calls"]
    assert call["target"] == (compat.FFI_TARGET if ffi else compat.LEGACY_TARGET)
    assert ours["d_cost"]["attributes"] == [_expected_cost(ffi)]
    assert ours["c_1000"]["attributes"][0]["cost_estimate_json"] is None  # none asked, none carried


def test_d_the_legacy_target_carries_it_as_a_frontend_attribute():
    from lowering.payload import jaxlib_compat as compat

    def fn(x, y):
        return jt.triton_call(x, y, N, kernel=add_kernel, out_type=x, grid=GRID, BLOCK_SIZE=BLOCK, cost_estimate=COST,
                              custom_call_target_name=compat.LEGACY_TARGET, compute_capability=90)

    assert attributes(jax.jit(fn).trace(VEC, VEC).lower(lowering_platforms=("cuda",))) == [_expected_cost(False)]


@needs_04
def test_d_through_interception_where_jax_triton_writes_it(ours, intercepted, own):
    theirs = own["programs"]["d_cost"]["attributes"]
    assert [a["cost_estimate_json"] for a in theirs] == [json.dumps(COST)] and theirs[0]["frontend"] == {}
    served = intercepted["programs"]["d_cost"]
    assert served["attributes"] == ours["d_cost"]["attributes"] == [_expected_cost(True)]
    assert {"opaque", "cost_estimate_json"} <= set(theirs[0]["backend_config"])
    assert [comparable(c) for c in served["calls"]] == own["programs"]["d_cost"]["calls"]


@needs_04
def test_every_intercepted_call_was_served(intercepted):
    assert intercepted["served"] == len(programs(jt)) and intercepted["fallback"] == 0
