"""compiler: fidelity with triton.compile, specialization rules, and clear errors."""

from __future__ import annotations

import pytest
import triton
import triton.backends
import triton.language as tl
import triton_reference

from compiler import CompileError, Pointer, compile_spec, make_spec, parse_target
from compiler import triton_compat as tc
from compiler.examples import add_kernel, example_calls, matmul_kernel


def _reference(spec):
    src = tc.ast_source(spec.kernel, dict(spec.signature), dict(spec.constexprs), dict(spec.attrs))
    return triton_reference.reference_compile(src, spec.target, spec.triton_options())


def _as_bytes(value):
    return value.encode() if isinstance(value, str) else value


def test_every_example_kernel_is_byte_identical_to_triton_compile(example_specs_sm90, compiled_sm90):
    assert len(compiled_sm90) == len(example_calls()) == 11
    for label, spec in example_specs_sm90.items():
        art, ref = compiled_sm90[label], _reference(spec)
        assert art.ptx.encode() == _as_bytes(ref.asm["ptx"]), label
        assert art.cubin == ref.asm["cubin"], label
        assert art.ttir.encode() == _as_bytes(ref.asm["ttir"]), label
        assert art.name == ref.metadata.name
        assert art.shared_mem == ref.metadata.shared
        assert art.num_warps == ref.metadata.num_warps


def test_sm80_matches_triton_compile_and_differs_from_sm90(compiled_sm90):
    for label, kernel, args, cst, launch in example_calls():
        if label not in ("add", "matmul[3]"):
            continue
        spec = make_spec(kernel, args, cst, target="sm_80", **launch)
        art, ref = compile_spec(spec), _reference(spec)
        assert art.cubin == ref.asm["cubin"]
        assert ".target sm_80" in art.ptx
        assert art.cubin != compiled_sm90[label].cubin


@pytest.mark.skipif("amd" not in triton.backends.backends, reason="installed Triton has no AMD backend")
def test_rocm_gfx942_hsaco_matches_triton_compile():
    label, kernel, args, cst, launch = example_calls()[0]
    spec = make_spec(kernel, args, cst, target="gfx942", **launch)
    art, ref = compile_spec(spec), _reference(spec)
    assert spec.target.backend == "hip" and spec.target.warp_size == 64
    assert art.hsaco == ref.asm["hsaco"] and art.hsaco[:4] == b"\x7fELF"
    assert art.cubin is None and art.ptx is None


def test_specialization_follows_triton_launcher_rules():
    spec = make_spec(add_kernel, ["*fp32", "*fp16", 1, Pointer("fp32", aligned=False)], {"BLOCK": 64},
                     target="sm_90")
    assert spec.signature == {"x_ptr": "*fp32", "y_ptr": "*fp16", "n": "constexpr", "out_ptr": "*fp32",
                              "BLOCK": "constexpr"}
    assert spec.constexprs == {"n": 1, "BLOCK": 64}  # an int equal to 1 becomes a constexpr
    assert spec.attrs[(0,)] == [["tt.divisibility", 16]]
    assert spec.attrs[(3,)] == []  # an unaligned pointer gets no divisibility hint

    def n_spec(n):
        return make_spec(add_kernel, ["*fp32", "*fp32", n, "*fp32"], {"BLOCK": 64}, target=90)

    assert n_spec(32).attrs[(2,)] == [["tt.divisibility", 16]]
    assert n_spec(33).attrs[(2,)] == []
    assert n_spec(2**40).signature["n"] == "i64"


@triton.jit(do_not_specialize=["n"])
def _no_spec_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs) + n)


def test_do_not_specialize_is_honoured():
    spec = make_spec(_no_spec_kernel, ["*fp32", 32], {"BLOCK": 16}, target="sm_90")
    assert spec.signature["n"] == "i32" and (1,) not in spec.attrs


@triton.jit
def _broken_kernel(x_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(offs))  # loading from a non-pointer is a type error


def test_failing_stage_raises_compile_error_with_context():
    spec = make_spec(_broken_kernel, ["*fp32"], {"BLOCK": 16}, target="sm_90")
    with pytest.raises(CompileError) as info:
        compile_spec(spec)
    err = info.value
    assert err.kernel == "_broken_kernel" and err.stage == "ast"
    assert "sm_90" in str(err) and "BLOCK=16" in str(err)
    assert err.triton_message and err.triton_message in str(err)


@pytest.mark.parametrize("args, error, match", [
    (["*fp33", "*fp32", "*fp32", 8], ValueError, "unknown pointer element type"),
    (["*fp32", "*fp32", 2**64, "*fp32"], ValueError, "does not fit in 64 bits"),
    (["*fp32", "*fp32", -(2**63) - 1, "*fp32"], ValueError, "does not fit in 64 bits"),
    (["*fp32", "*fp32", object(), "*fp32"], TypeError, "must be a pointer type"),
    (["*fp32", "*fp32"], ValueError, "takes 4 runtime argument"),
])
def test_bad_arguments_are_clear_errors(args, error, match):
    with pytest.raises(error, match=match):
        make_spec(add_kernel, args, {"BLOCK": 64}, target="sm_90")


def test_bad_kernel_target_and_params_are_clear_errors():
    with pytest.raises(TypeError, match="@triton.jit"):
        make_spec(lambda x: x, ["*fp32"], target="sm_90")
    with pytest.raises(ValueError, match="unknown GPU target"):
        parse_target("sm_x")
    with pytest.raises(ValueError, match="no parameter"):
        make_spec(add_kernel, ["*fp32", "*fp32", 8, "*fp32"], {"BLOCK": 64, "NOPE": 1}, target="sm_90")
    with pytest.raises(ValueError, match="needs a value"):
        make_spec(add_kernel, ["*fp32", "*fp32", 8, "*fp32"], {}, target="sm_90")
    with pytest.raises(ValueError, match="num_warps"):
        make_spec(add_kernel, ["*fp32", "*fp32", 8, "*fp32"], {"BLOCK": 64}, target="sm_90", num_warps=0)


def test_autotuned_kernel_is_unwrapped_to_its_jit_function():
    spec = make_spec(matmul_kernel, ["*fp16"] * 2 + [64] * 9 + ["*fp16"], {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32},
                     target="sm_90")
    assert spec.name == "matmul_kernel" and tc.is_jit_function(spec.kernel)


def test_targets_parse_in_every_spelling():
    assert parse_target("sm_90") == parse_target("sm90") == parse_target(90) == parse_target("cuda:90")
    assert parse_target("sm_90a").arch == 90
    assert parse_target("gfx942").backend == "hip" and parse_target("gfx1100").warp_size == 32


@pytest.mark.parametrize("backend", ["cuda", "hip"])
def test_pure_python_specialization_matches_triton_native_rules(backend):
    if backend == "hip" and "amd" not in triton.backends.backends:
        pytest.skip("installed Triton has no AMD backend")
    values = [0, 1, 2, 16, 17, -16, -17, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**63 - 1, 2**63,
              2**64 - 1, 2**40 * 16, True, False, 0.0, 1.0, -2.5, "*fp32", "*fp16", "*bf16", "*i8"]
    for value in values:
        for spec_flag in (True, False):
            for align in (True, False):
                kw = dict(specialize=spec_flag, align=align)
                assert tc.specialize(value, **kw) == triton_reference.native_specialize(backend, value, **kw), (value, kw)


def test_rdna_targets_with_feature_suffixes_keep_wave32():
    assert parse_target("gfx1100:xnack-").warp_size == 32
    assert parse_target("gfx90a").warp_size == 64 and parse_target("gfx942").warp_size == 64


def test_entries_carry_raw_deflate_runs_of_their_binaries(compiled_sm90):
    """The runs lowering splices into jaxlib's zlib stream inflate to exactly the stored binaries."""
    import zlib

    meta, blobs = compiled_sm90["softmax"].to_entry()
    for name in ("ptx", "cubin"):
        run = blobs[name + ".deflate"]
        assert zlib.decompressobj(-15).decompress(run) == blobs[name]


@pytest.mark.parametrize("dropped", ["ptx", None])
def test_an_entry_without_the_binary_its_target_launches_from_is_dropped_and_rebuilt(tmp_path, example_specs_sm90,
                                                                                      compiled_sm90, dropped):
    """A well-formed entry under a kernel's key that lacks its PTX is no usable kernel: the lookup drops it
    (rather than hand jaxlib an empty binary) and get_or_compile builds it again; a whole entry is served."""
    import compiler
    from kernel_cache import Config, Entry, KernelCacheWarning, Store

    spec, artifact = example_specs_sm90["add"], compiled_sm90["add"]
    meta, blobs = artifact.to_entry()
    if dropped is not None:
        blobs = {name: blob for name, blob in blobs.items() if not name.startswith(dropped)}
    store = Store(Config(dir=tmp_path / "cache"))
    key = compiler.content_key(spec)
    store.put(Entry(key=key, meta=meta, blobs=blobs))
    if dropped is None:
        found, _ = compiler.lookup(spec, store)
        assert found is not None and found.ptx == artifact.ptx
        return
    with pytest.warns(KernelCacheWarning, match=f"dropped entry {key[:12]}: .*has no ptx"):
        found, _ = compiler.lookup(spec, store)
    assert found is None and store.lookup(key) is None  # dropped, not served
    rebuilt, _ = compiler.get_or_compile(spec, store)
    assert rebuilt.ptx == artifact.ptx
