"""A lowered call's signature (`call_key.signed_call`): a new process serves a call its program's warm set
signed with no plan and no key, emitting the same custom call (a plain call, one whose grid is a
function, an autotuned one); the signature is deterministic across processes and changes with every
input the plan reads, type-exactly (1, 1.0, True and numpy's int32 differ), with the kernel, its
constexpr defaults, the target and Triton's environment, a grid function's values, an Autotuner's
configs and keys and the GPU model its winners are looked up for; calls whose heuristics, prune
hooks or pre_hooks are functions, or whose grid function raises, have none; tuning bypasses it; a
signed record the local level no longer holds, or an autotuned one whose winner was stored since, is
planned and lowered again.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import triton
from conftest import run_python
from test_call_records import PROGRAMS, entries, lower, use_store  # noqa: F401  (fixture)
from test_winners import GPU, inplace, put_winner, record_for, site_of

import kernel_cache
from compiler import Scalar
from compiler import triton_compat as tc
from kernel_cache import front_level
from kernel_cache.entries import call_entry, warm_set
from lowering import examples as ep
from lowering.planning import plan
from lowering.planning.bound_call import FrozenItems
from lowering.records import call_key, call_records


class _Captured(Exception):
    pass


def _call_of(fn, shapes) -> tuple:
    """(platform, avals_in, avals_out, params) the rule is given for the program's one call,
    captured before anything is read or compiled."""
    seen = []
    real = call_records.serve

    def capture(platform, avals_in, avals_out, params, session, module, build):
        seen.append((platform, list(avals_in), list(avals_out), dict(params)))
        raise _Captured

    call_records.serve = capture
    jax.clear_caches()  # jit would hand back an earlier lowering of the same function
    try:
        with pytest.raises(_Captured):
            jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",))
    finally:
        call_records.serve = real
    return seen[0]


@pytest.fixture(scope="module")
def add_call():
    _, fn, shapes = PROGRAMS[0]
    return _call_of(fn, shapes)


def _signature(*args) -> str | None:
    signed = call_key.signed_call(*args)
    return None if signed is None else signed[0]


def _sig(call, **changes) -> str | None:
    platform, avals_in, avals_out, params = call
    return _signature(platform, changes.pop("avals_in", avals_in), changes.pop("avals_out", avals_out),
                      {**params, **changes}, None, kernel_cache.current_config())


def test_a_new_process_serves_each_signed_call_unplanned(tmp_path, use_store):  # noqa: F811
    """End to end in two sessions (a session is what a new process is): the plain call (add), the
    one whose grid is a function (scaled add) and the autotuned matmul are served by their
    signatures, unplanned; every custom call is the same, every record one record hit from disk."""
    store = use_store(tmp_path / "cache")
    first = [lower(fn, shapes) for _, fn, shapes in PROGRAMS]
    front_level.save_all()  # what exit does
    (saved,) = entries(store, warm_set.KIND).values()
    records = entries(store, call_entry.KIND)
    assert sorted(warm_set.signed_of(saved).values()) == sorted(records) and len(records) == len(PROGRAMS)

    store = use_store(tmp_path / "cache")
    planned = []
    real_of = plan.KernelPlan.of.__func__

    def counting_of(cls, platform, avals_in, avals_out, call, config):
        planned.append(call.kernel)
        return real_of(cls, platform, avals_in, avals_out, call, config)

    plan.KernelPlan.of = classmethod(counting_of)  # type: ignore[method-assign,assignment]
    try:
        again = [lower(fn, shapes) for _, fn, shapes in PROGRAMS]
    finally:
        plan.KernelPlan.of = classmethod(real_of)  # type: ignore[method-assign,assignment]
    assert again == first
    assert planned == []
    assert store.stats.session()["record_hits"]["disk"] == len(PROGRAMS)
    kernel_cache.configure()


def test_a_signed_record_no_longer_held_is_planned_and_lowered_again(tmp_path, use_store):  # noqa: F811
    store = use_store(tmp_path / "cache")
    _, fn, shapes = PROGRAMS[0]
    first = lower(fn, shapes)
    front_level.save_all()
    (record,) = entries(store, call_entry.KIND)
    store.delete(record)
    store = use_store(tmp_path / "cache")
    assert lower(fn, shapes) == first
    assert store.stats.session()["record_hits"]["disk"] == 0  # planned, its kernel read: the record written anew
    assert record in entries(store, call_entry.KIND)
    kernel_cache.configure()


def test_the_signature_is_the_same_in_another_process(add_call):
    code = """
        import functools, json, sys
        import jax, jax.numpy as jnp
        sys.path.insert(0, "tests")
        import test_call_signature as t
        from lowering import examples as ep
        small = jax.ShapeDtypeStruct((4096,), jnp.float32)
        call = t._call_of(functools.partial(ep.add_program, block=1024, compute_capability=90), (small, small))
        print(json.dumps(t._sig(call)))
    """
    out = run_python(textwrap.dedent(code), {"KERNEL_CACHE_TARGET_ARCH": "sm_90"})
    assert json.loads(out.stdout.strip().splitlines()[-1]) == _sig(add_call) is not None


def test_the_signature_changes_with_every_input_type_exactly(add_call, monkeypatch):
    platform, avals_in, avals_out, params = add_call
    (position, n), = params["scalars"]
    block = params["metaparams"]["BLOCK"]
    (out_shape, out_dtype), = params["out_avals"]
    base = _sig(add_call)
    assert base is not None and _sig(add_call) == base
    variants = {
        "BLOCK 1024.0": _sig(add_call, metaparams=FrozenItems([("BLOCK", float(block))])),
        "BLOCK True": _sig(add_call, metaparams=FrozenItems([("BLOCK", True)])),
        "BLOCK '1024'": _sig(add_call, metaparams=FrozenItems([("BLOCK", str(block))])),
        "BLOCK 512": _sig(add_call, metaparams=FrozenItems([("BLOCK", 512)])),
        "n float": _sig(add_call, scalars=((position, float(n)),)),
        "n int32": _sig(add_call, scalars=((position, np.int32(n)),)),
        "n Scalar": _sig(add_call, scalars=((position, Scalar("i64", n)),)),
        "n+16": _sig(add_call, scalars=((position, n + 16),)),
        "grid list": _sig(add_call, grid=list(params["grid"])),
        "grid+1": _sig(add_call, grid=(params["grid"][0] + 1,)),
        "num_warps 4": _sig(add_call, num_warps=4),
        "name": _sig(add_call, name="x"),
        "debug": _sig(add_call, debug=True),
        "metadata": _sig(add_call, serialized_metadata=b"x"),
        "fp fusion": _sig(add_call, enable_fp_fusion=False),
        "out dtype": _sig(add_call, out_avals=((out_shape, np.dtype(np.float16)),)),
        "cc 80": _sig(add_call, compute_capability=80),
        "operand shape": _sig(add_call, avals_in=[a.update(shape=(8192,)) for a in avals_in]),
        "weak type": _sig(add_call, avals_in=[a.update(weak_type=True) for a in avals_in]),
        "result dtype": _sig(add_call, avals_out=[a.update(dtype=jnp.float16) for a in avals_out]),
        "kernel": _sig(add_call, kernel=ep.scaled_add),
        "record key": call_key.call_key(plan.KernelPlan.of(platform, avals_in, avals_out, plan.BoundCall(**params),
                                                           kernel_cache.current_config()),
                                        None, None, kernel_cache.current_config()),
    }
    real_defaults = tc.constexpr_defaults
    monkeypatch.setattr(tc, "constexpr_defaults", lambda fn: {**real_defaults(fn), "BLOCK": 64})
    variants["constexpr default"] = _sig(add_call)  # what a global the default names sets
    monkeypatch.setattr(tc, "constexpr_defaults", real_defaults)
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")
    variants["Triton env"] = _sig(add_call)
    monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION")
    assert _sig(add_call) == base
    assert None not in variants.values(), [k for k, v in variants.items() if v is None]
    assert len({base, *variants.values()}) == len(variants) + 1, variants


def test_calls_whose_inputs_have_no_value_form_have_no_signature(add_call):
    assert _sig(add_call, metaparams=FrozenItems([("BLOCK", object())])) is None
    assert _sig(add_call, arg_tree=jax.tree_util.tree_structure((1, 2))) is None
    assert _sig(add_call, grid=lambda meta: (1 // 0,)) is None  # a grid function that raises: its plan reports it
    assert _sig(add_call, grid=lambda meta: meta["NO_SUCH"]) is None
    assert _sig(add_call, kernel=object()) is None
    configs = [triton.Config({"BLOCK": 256}), triton.Config({"BLOCK": 512})]
    no_form = {
        "heuristics": triton.heuristics({"EXTRA": lambda args: 1})(ep.add),
        "autotune(heuristics)": triton.autotune(configs, key=["n"])(triton.heuristics({"EXTRA": lambda a: 1})(ep.add)),
        "early prune": triton.autotune(configs, key=["n"], prune_configs_by={"early_config_prune": lambda c, a: c})(ep.add),
        "perf model": triton.autotune(configs, key=["n"], prune_configs_by={"perf_model": lambda **k: 1.0,
                                                                            "top_k": 1})(ep.add),
        "pre_hook": triton.autotune([triton.Config({"BLOCK": 256}, pre_hook=lambda nargs: None)], key=["n"])(ep.add),
    }
    assert {name: _sig(add_call, kernel=kernel) for name, kernel in no_form.items()} == dict.fromkeys(no_form)
    session = kernel_cache.current_session()
    assert call_records.find_signed("rocm", *add_call[1:], session) == (None, None)  # ROCm payloads are not recorded


def test_tuning_bypasses_signatures(add_call):
    session = kernel_cache.current_session()
    session.tuning = object()
    try:
        assert call_records.find_signed(*add_call, session) == (None, None)
    finally:
        session.tuning = None


def test_a_frozen_value_is_signed_by_its_fields(add_call):
    @dataclasses.dataclass(frozen=True)
    class Opaque:  # a frozen dataclass is not a FrozenValue: no form
        x: int

    assert _sig(add_call, metaparams=FrozenItems([("BLOCK", Opaque(1))])) is None
    assert _sig(add_call, scalars=((0, Scalar("i32", 1)),)) != _sig(add_call, scalars=((0, Scalar("i64", 1)),))


def test_a_grid_function_is_signed_by_what_it_evaluates_to(add_call):
    """Its values per config stand in for the function: two closures returning the same grid sign alike
    (a closure is new at every trace), another grid or the same grid given as a value does not."""
    (position, n), = add_call[3]["scalars"]
    grid = add_call[3]["grid"]
    same = [_sig(add_call, grid=lambda meta: (n // meta["BLOCK"],)), _sig(add_call, grid=lambda meta: grid)]
    assert same[0] is not None and same[0] == same[1]
    others = [_sig(add_call, grid=lambda meta: (n // meta["BLOCK"] + 1,)),
              _sig(add_call, grid=lambda meta: (n // meta["BLOCK"], 2)),
              _sig(add_call, grid=lambda meta: (meta["n"] // meta["BLOCK"],),
                   scalars=((position, n + 1024),)),  # a scalar the function reads: another grid
              _sig(add_call)]  # the grid as a value
    assert None not in others and len({same[0], *others}) == len(others) + 1
    zeroed = [_sig(add_call, zeroed_outputs=lambda meta: ()), _sig(add_call, zeroed_outputs=lambda meta: (0,))]
    assert None not in zeroed and len({*zeroed, same[0], *others}) == len(others) + 3


def test_an_autotuned_call_is_signed_by_its_configs_keys_and_gpu_model(add_call):
    def tuner(configs=((256, 2), (512, 4)), key=("n",), **config):
        return triton.autotune([triton.Config({"BLOCK": block}, num_warps=warps, **config) for block, warps in configs],
                               key=list(key))(ep.add)

    call = _call_of(lambda x, y: ep.jt.triton_call(x, y, x.size, kernel=tuner(), out_shape=x,
                                                   grid=lambda m: (x.size // m["BLOCK"],), compute_capability=90),
                    add_call[1])
    base = _sig(call)
    assert base is not None and _sig(call, kernel=tuner()) == base  # another Autotuner object of equal value
    variants = {
        "a config's warps": _sig(call, kernel=tuner(configs=((256, 2), (512, 8)))),
        "a config's constexpr": _sig(call, kernel=tuner(configs=((256, 2), (1024, 4)))),
        "configs' order": _sig(call, kernel=tuner(configs=((512, 4), (256, 2)))),
        "one config fewer": _sig(call, kernel=tuner(configs=((256, 2),))),
        "stages": _sig(call, kernel=tuner(num_stages=2)),
        "registers": _sig(call, kernel=tuner(maxnreg=128)),
        "tuner keys": _sig(call, kernel=tuner(key=())),
        "the plain kernel": _sig(call, kernel=ep.add, metaparams=FrozenItems([("BLOCK", 256)])),
    }
    config = kernel_cache.current_config()
    for model in ("GPU A", "GPU B"):
        variants[model] = _signature(*call, None, config.with_(gpu_model=model))
    off = [_signature(*call, None, config.with_(gpu_model=model, winners=False))
           for model in ("GPU A", "GPU B")]
    assert off[0] == off[1] is not None  # winners off: no GPU model is looked up, none is signed
    assert None not in variants.values(), [k for k, v in variants.items() if v is None]
    assert len({base, *variants.values()}) == len(variants) + 1, variants


def test_a_winner_stored_after_its_call_was_signed_narrows_the_next_process(tmp_path, use_store):  # noqa: F811
    """A signed autotuned record is served while no winner is stored. Once `cachectl tune` stores one,
    the next process lowers the winner alone, as its key would, and signs the winner's own record,
    which the processes after serve unplanned; once the winner is removed, the call is autotuned
    again; stored again, the signature leads straight to the winner's record."""
    from test_winners import lower_call

    def new_process(served_by_signature: bool) -> None:
        front_level.save_all()  # what exit does
        use_store(tmp_path / "cache", gpu_model=GPU)
        signature, signed = call_records.find_signed(*_call_of(inplace, (VEC_IN, VEC_IN)), kernel_cache.current_session())
        assert signature is not None and (signed is not None) == served_by_signature
        use_store(tmp_path / "cache", gpu_model=GPU)  # that look-up was outside the process's lowering

    use_store(tmp_path / "cache", gpu_model=GPU)
    autotuned = lower_call()[0]
    assert "autotuned" in autotuned
    new_process(served_by_signature=True)
    assert lower_call()[0] == autotuned
    site = site_of(inplace)
    winner = record_for(site, winner=1)
    put_winner(kernel_cache.default_store(), winner)
    new_process(served_by_signature=False)  # the winner's own record is not written yet: planned
    narrowed = lower_call()[0]
    assert "autotuned" not in narrowed and narrowed["kernel_call"]["grid"] == (8, 1, 1)  # BLOCK 512 alone
    new_process(served_by_signature=True)  # the winner's own record, signed
    assert lower_call()[0] == narrowed
    kernel_cache.default_store().delete(site.key)  # the winner removed (`cachectl prune`)
    new_process(served_by_signature=False)
    assert lower_call()[0] == autotuned
    put_winner(kernel_cache.default_store(), winner)  # tuned again: the signed autotuned record leads to it
    new_process(served_by_signature=True)
    assert lower_call()[0] == narrowed
    kernel_cache.configure()


VEC_IN = jax.ShapeDtypeStruct((4096,), jnp.float32)
