"""Every key follows what a compile reads: the content key, a lowered call's key and its signature
move together under every option and environment variable the installed Triton parses (they share
`compiler.inputs`), a record never serves a kernel built against another libdevice, and the two
reads Triton's own key is blind to (a module attribute, a plain global) give fresh kernels.
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
import types

import jax
import jax.numpy as jnp
import pytest
import triton
import triton.language as tl
from conftest import run_python
from inspect_call import custom_calls
from test_call_records import use_store  # noqa: F401  (fixture)
from test_call_signature import _call_of
from triton.language.extra import libdevice

import compiler
import kernel_cache
from compiler import triton_compat as tc
from compiler.spec import compile_options
from lowering import triton_call
from lowering.planning.bound_call import BoundCall, FrozenItems
from lowering.planning.plan import KernelPlan
from lowering.records import call_key

VEC = jax.ShapeDtypeStruct((1024,), jnp.float32)
TARGET = compiler.Target("cuda", 90, 32)


@triton.jit
def erf_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, libdevice.erf(tl.load(x_ptr + offs)))


def erf_program(x):
    return triton_call(x, kernel=erf_kernel, out_shape=x, grid=(1,), BLOCK=x.shape[0], compute_capability=90)


def _compiles() -> int:
    return kernel_cache.default_store().stats.session().get("compiles", 0)


def _fresh_process() -> None:
    """This process's memos emptied, as a new process would start (the store's files kept)."""
    kernel_cache.default_store().memory.clear()
    kernel_cache.current_session().forget()


def _lower(program, *shapes) -> list[dict]:
    jax.clear_caches()
    return custom_calls(jax.jit(program).trace(*shapes).lower(lowering_platforms=("cuda",)))


def _ptx(calls: list[dict]) -> str:
    (call,) = calls
    return call["kernel_call"]["kernel"]["ptx"]


# --- the three keys, side by side -----------------------------------------------------------------

def _keys() -> tuple[str, str | None, str | None]:
    """(the content key of the add call's kernel, the call's key, its signature), computed now."""
    platform, avals_in, avals_out, params = _ADD_CALL
    config = kernel_cache.current_config()
    plan = KernelPlan.of(platform, avals_in, avals_out, BoundCall(**params), config)
    (spec,) = plan.specs()
    key = call_key.call_key(plan, None, None, config)
    signed = call_key.signed_call(platform, avals_in, avals_out, params, None, config)
    return compiler.content_key(spec), key, None if signed is None else signed[0]


def _knobs() -> list[tuple[str, object]]:
    """Every environment variable Triton's knobs read, with its descriptor (Triton 3.5+ `triton.knobs`)."""
    knobs = getattr(triton, "knobs", None)
    if knobs is None:
        return []
    found = {}
    for group in vars(knobs).values():
        if type(type(group)).__name__ == "type" and type(group).__module__ == knobs.__name__:
            for descriptor in vars(type(group)).values():
                name = getattr(descriptor, "key", None)
                if isinstance(name, str) and name.isupper():
                    found[name] = descriptor
    return sorted(found.items())


def _perturbations(name: str, descriptor: object) -> list[str]:
    kind = type(descriptor).__name__
    if "bool" in kind:
        return ["0", "1"]
    if "int" in kind:
        return ["2"]
    if name.endswith("_PATH") or name.endswith("_DIR"):
        return [os.path.join(tc.TRITON_DIR, "backends", "amd", "lib", "ocml.bc")]
    return ["-O1", "1"]


_ADD_CALL: tuple = ()


@pytest.fixture(scope="module")
def add_call():
    from lowering import examples as ep
    global _ADD_CALL
    _ADD_CALL = _call_of(lambda x, y: ep.add_program(x, y, block=1024, compute_capability=90), (VEC, VEC))
    return _ADD_CALL


def test_every_option_and_variable_triton_parses_moves_the_three_keys_together(add_call, monkeypatch):
    """For each environment variable the installed Triton's knobs read, and each option its parse
    accepts: where the content key moves, the call's key and its signature move with it, and where it
    stays, they stay (a path standing for its content: a copy of libdevice elsewhere changes nothing)."""
    base = _keys()
    assert None not in base
    moved, checked = [], 0
    for name, descriptor in _knobs():
        if name in os.environ or name.startswith(("TRITON_CACHE", "TRITON_HOME", "TRITON_DUMP", "TRITON_OVERRIDE_DIR")):
            continue
        for value in _perturbations(name, descriptor):
            monkeypatch.setenv(name, value)
            try:
                now = _keys()
            except Exception:  # a value this Triton refuses to parse: nothing is compiled under it
                continue
            finally:
                monkeypatch.delenv(name)
            checked += 1
            assert (now[0] != base[0], now[1] != base[1], now[2] != base[2]) in ((True,) * 3, (False,) * 3), \
                (name, value, now, base)
            if now[0] != base[0]:
                moved.append(name)
    if _knobs():
        assert "TRITON_LIBDEVICE_PATH" in moved and "TRITON_DEFAULT_FP_FUSION" in moved, moved
        assert checked >= 20
    platform, avals_in, avals_out, params = add_call
    for option, value in (("enable_fp_fusion", False), ("debug", True)):
        changed = {**params, option: value}
        assert _keys_with(changed)[0] != base[0] and _keys_with(changed)[1] != base[1]
    options = 0
    for option, value in _option_perturbations():
        changed = {**params, "backend_options": FrozenItems([(option, value)])}
        try:
            content, key = _keys_with(changed)
        except Exception:  # a value this Triton's parse refuses: nothing is compiled under it
            continue
        assert key is not None and (content == base[0] or key != base[1]), option  # never a record of another
        options += content != base[0]
    assert options >= 5
    copy = os.path.join(os.environ["XDG_CACHE_HOME"], "libdevice-copy.bc")
    shutil.copyfile(os.path.join(tc.TRITON_DIR, "backends", "nvidia", "lib", "libdevice.10.bc"), copy)
    monkeypatch.setenv("TRITON_LIBDEVICE_PATH", copy)
    assert _keys() == base  # the same bytes at another path: the same kernel


def _option_perturbations() -> list[tuple[str, object]]:
    """Each option the installed Triton's parse accepts that a call may pass in backend_options (the
    launch parameters and flags of its own aside), with a value other than its default."""
    import dataclasses

    parsed = tc.parse_options(TARGET, compile_options(4, 3, 1, {}))
    own = {"num_warps", "num_stages", "num_ctas", "debug", "enable_fp_fusion", "arch", "backend_name", "warp_size"}
    out: list[tuple[str, object]] = []
    for field in dataclasses.fields(parsed):
        default = getattr(parsed, field.name)
        if field.name in own:
            continue
        if isinstance(default, bool):
            out.append((field.name, not default))
        elif isinstance(default, int):
            out.append((field.name, default // 2))
        elif default is None:
            out.extend([(field.name, 128), (field.name, "x")])
        elif isinstance(default, str):
            out.append((field.name, "ieee" if default != "ieee" else "tf32"))
        elif isinstance(default, tuple) and default and all(isinstance(v, str) for v in default):
            out.append((field.name, default[:-1]))
    return out


def _keys_with(params: dict) -> tuple[str, str | None]:
    platform, avals_in, avals_out, _ = _ADD_CALL
    config = kernel_cache.current_config()
    plan = KernelPlan.of(platform, avals_in, avals_out, BoundCall(**params), config)
    return compiler.content_key(plan.specs()[0]), call_key.call_key(plan, None, None, config)


# --- a served payload against a fresh compile ------------------------------------------------------

def test_a_record_is_never_served_across_libdevices(tmp_path, use_store, monkeypatch):  # noqa: F811
    """A kernel calling libdevice, lowered and recorded (signed in the program's warm set); a new
    process naming another libdevice is not served that record (it compiles against the library it
    names: one without `__nv_erff` fails in ptxas), and back on the first it is served, nothing compiled."""
    use_store(tmp_path / "cache")
    first = _ptx(_lower(erf_program, VEC))
    _fresh_process()
    before = _compiles()
    assert _ptx(_lower(erf_program, VEC)) == first and _compiles() == before  # served: signature and record
    _fresh_process()
    monkeypatch.setenv("TRITON_LIBDEVICE_PATH", os.path.join(tc.TRITON_DIR, "backends", "amd", "lib", "ocml.bc"))
    with pytest.raises(Exception, match="__nv_erff"):
        _lower(erf_program, VEC)
    use_store(tmp_path / "fresh")  # the reference: a fresh cache under the same environment
    with pytest.raises(Exception, match="__nv_erff"):
        _lower(erf_program, VEC)
    monkeypatch.delenv("TRITON_LIBDEVICE_PATH")
    use_store(tmp_path / "cache")
    before = _compiles()
    assert _ptx(_lower(erf_program, VEC)) == first and _compiles() == before


# --- what Triton's own key does not see -----------------------------------------------------------

HELPERS = """
import triton.language as tl
FACTOR = tl.constexpr(2)
"""

KERNELS = """
import triton
import triton.language as tl
import {helpers} as helpers

SCALE = 2

@triton.jit
def by_attribute(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs) * helpers.FACTOR)

@triton.jit
def inner(x):
    return x * SCALE

@triton.jit
def by_global(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, inner(tl.load(x_ptr + offs)))
"""


@pytest.fixture
def blind_module(tmp_path, monkeypatch):
    """A kernel module and its helper module, written under unique names and importable."""
    suffix = tmp_path.name.replace("-", "_")
    (tmp_path / f"blind_helpers_{suffix}.py").write_text(textwrap.dedent(HELPERS))
    (tmp_path / f"blind_kernels_{suffix}.py").write_text(textwrap.dedent(KERNELS.format(helpers=f"blind_helpers_{suffix}")))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = __import__(f"blind_kernels_{suffix}")
    yield module
    sys.modules.pop(module.__name__, None)
    sys.modules.pop(f"blind_helpers_{suffix}", None)


def _spec(kernel) -> compiler.KernelSpec:
    return compiler.make_spec(kernel, ["*fp32", "*fp32"], {"BLOCK": 128}, target=TARGET)


def test_a_module_attribute_and_a_plain_global_are_part_of_the_key(blind_module, monkeypatch):
    """Triton's key stays put when `helpers.FACTOR` or a plain global read by a called @jit function
    changes; the fingerprint, the content key and the compiled PTX all move."""
    monkeypatch.setenv("TRITON_ALLOW_NON_CONSTEXPR_GLOBALS", "1")
    for kernel, change in ((blind_module.by_attribute, lambda: setattr(blind_module.helpers, "FACTOR", tl.constexpr(3))),
                           (blind_module.by_global, lambda: setattr(blind_module, "SCALE", 3))):
        triton_key, print_before = str(kernel.cache_key), tc.kernel_fingerprint(kernel)
        key_before = compiler.content_key(_spec(kernel))
        ptx_before = compiler.compile_spec(_spec(kernel)).blobs["ptx"]
        change()
        assert str(kernel.cache_key) == triton_key  # Triton's own key is blind to it
        assert tc.kernel_fingerprint(kernel) != print_before
        assert compiler.content_key(_spec(kernel)) != key_before
        assert compiler.compile_spec(_spec(kernel)).blobs["ptx"] != ptx_before


def test_the_fingerprint_of_a_module_edited_between_processes_differs(tmp_path):
    """The same source in two processes, the helper module's value edited between them."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from compiler.triton_compat import kernel_fingerprint
        import blind_k
        print(kernel_fingerprint(blind_k.by_attribute))
    """)
    prints = []
    for factor in (2, 3, 2):
        (tmp_path / "blind_h.py").write_text(f"import triton.language as tl\nFACTOR = tl.constexpr({factor})\n")
        (tmp_path / "blind_k.py").write_text(textwrap.dedent(KERNELS.format(helpers="blind_h")))
        prints.append(run_python(code).stdout.strip())
    assert prints[0] == prints[2] != prints[1]


def test_a_kernel_reading_nothing_blind_keeps_tritons_key():
    from compiler import examples
    assert tc.kernel_fingerprint(examples.add_kernel) == str(examples.add_kernel.cache_key)
    assert tc.value_text(types.SimpleNamespace()).startswith("<types.SimpleNamespace")  # no address
