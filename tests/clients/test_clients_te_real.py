"""KERNEL_CACHE_INTERCEPT=transformer_engine against TE's real code: TE 2.20's triton_call_lowering and
its MoE permutation kernels (scripts/te_programs.py: row-id map, dispatch, combine, their backward,
padded and not), cross-lowered for sm_90 in fresh processes on TE's own path, intercepted cold and
intercepted warm. TE's C++ core is not involved: its package __init__s do not run.

The same PTX as TE's own path (compiled as TE compiles: no 16-byte pointer hints). What differs by
design: the autotuned call's name (a label jaxlib logs); the arrays' `ptr_divisibility` (TE declares
16 to jaxlib for a kernel compiled without assuming it, we declare what the kernel assumes: none);
and TE's in-place kernels' extra arguments: TE passes a buffer per input and output, the aliased
outputs' included, where the kernel has pointers for its inputs only; jaxlib launches with the kernel
reading its own, so we pass those alone.
"""

from __future__ import annotations

import pytest
from conftest import ROOT, json_child

from scripts import te_programs

pytestmark = pytest.mark.skipif(te_programs.te_package_dir() is None, reason=te_programs.MISSING)

CHILD = ROOT / "tests" / "support" / "te_child.py"
# TE's in-place kernels: pointers for their inputs only, TE passes this many more (the aliased outputs)
IN_PLACE_EXTRA = {"_row_id_map_pass_2_kernel": 2, "_row_id_map_pass_3_kernel": 1}
TE_MODULES = ["transformer_engine", "transformer_engine.common", "transformer_engine.common.triton",
              "transformer_engine.common.triton.permutation", "transformer_engine.jax",
              "transformer_engine.jax.triton_extensions", "transformer_engine.jax.triton_extensions.utils",
              "transformer_engine.jax.version_utils"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """TE's own path, then intercepted cold and warm (one store), each a fresh process."""
    tmp = tmp_path_factory.mktemp("te-real")
    common = {"KERNEL_CACHE_TARGET_ARCH": "sm_90", "JAX_PLATFORMS": "cpu"}
    icpt = {**common, "KERNEL_CACHE_INTERCEPT": "transformer_engine", "KERNEL_CACHE_DIR": str(tmp / "cache"),
            "TRITON_CACHE_DIR": str(tmp / "triton-icpt")}
    own = json_child(CHILD, tmp / "own.json", "--own", **common, TRITON_CACHE_DIR=str(tmp / "triton-own"))
    cold = json_child(CHILD, tmp / "cold.json", **icpt)
    warm = json_child(CHILD, tmp / "warm.json", **icpt)
    return own, cold, warm


def _kernel_calls(call: dict) -> list[dict]:
    return [call["kernel_call"]] if "kernel_call" in call else [c["kernel_call"] for c in call["autotuned"]["configs"]]


def _launches(call: dict) -> dict:
    """What is launched: the target, each config's kernel, launch options, grid and description, and the
    autotuned call's aliases (what jaxlib restores between configs)."""
    configs = [(kc["kernel"]["kernel_name"], kc["kernel"]["num_warps"], kc["kernel"]["num_ctas"],
                kc["kernel"]["shared_mem_bytes"], kc["kernel"]["compute_capability"], kc["grid"])
               for kc in _kernel_calls(call)]
    tuned = call.get("autotuned", {})
    return {"target": call["target"], "api_version": call["api_version"], "name": call["name"], "configs": configs,
            "descriptions": [c["description"] for c in tuned.get("configs", [])], "aliases": tuned.get("aliases")}


def _declared(parameters: list[dict]) -> list[dict]:
    """The parameters without the alignment each array declares to jaxlib."""
    return [{**p, "array": {k: v for k, v in p["array"].items() if k != "ptr_divisibility"}} if "array" in p else p
            for p in parameters]


def test_tes_own_modules_run_and_not_its_core(runs):
    own, cold, _ = runs
    for report in (own, cold):
        assert report["te_modules"] == TE_MODULES  # no transformer_engine_jax, no cpp_extensions
        assert report["te_version"].startswith(te_programs.TE_VERSION)
    assert own["served_by"] == "te" and own["intercept"] == {} and own["tally"] == {}
    assert cold["served_by"] == "transformer_engine"


def test_every_te_call_is_served_and_a_warm_process_compiles_nothing(runs):
    _, cold, warm = runs
    calls = sum(len(p) for p in cold["programs"].values())
    assert set(cold["programs"]) == {label for label, _, _ in te_programs.programs(concrete=False)}
    assert cold["intercept"] == warm["intercept"] == {"transformer_engine": "installed"}
    assert cold["tally"] == warm["tally"] == {"transformer_engine": {"served": calls, "fallback": 0}}
    assert cold["stats"]["compiles"] > 0
    assert warm["stats"]["compiles"] == 0 and warm["stats"]["misses"] == 0, warm["stats"]
    assert warm["programs"] == cold["programs"]  # the same calls, byte for byte (digests of the PTX)
    assert "KernelCacheWarning" not in cold["stderr"] + warm["stderr"], (cold["stderr"] + warm["stderr"])[-3000:]


def test_the_same_kernels_grids_and_configs_as_tes_own_path(runs):
    own, cold, _ = runs
    kernels = set()
    for label, theirs in own["programs"].items():
        ours = cold["programs"][label]
        assert [_launches(c) for c in ours] == [_launches(c) for c in theirs], label
        for mine, te in zip(ours, theirs):
            for our_call, te_call in zip(_kernel_calls(mine), _kernel_calls(te)):
                name = our_call["kernel"]["kernel_name"]
                extra = IN_PLACE_EXTRA.get(name, 0)
                assert len(te_call["parameters"]) == len(our_call["parameters"]) + extra, (label, name)
                assert _declared(our_call["parameters"]) == _declared(te_call["parameters"][:len(our_call["parameters"])])
                assert all(p["array"]["ptr_divisibility"] == 0 for p in our_call["parameters"] if "array" in p)
                assert our_call["kernel"]["ptx"] == te_call["kernel"]["ptx"], (label, name)  # digests: TE's code
                kernels.add(name)
    assert kernels == {"_row_id_map_pass_1_kernel", "_row_id_map_pass_2_kernel", "_row_id_map_pass_3_kernel",
                       "_permute_kernel", "_unpermute_kernel", "_unpermute_bwd_with_merging_probs_kernel"}
    # TE's autotuned kernels: every one of its 7 BLOCK_SIZE configs compiled, the grid per config
    dispatch = {c["kernel_call"]["kernel"]["kernel_name"]: c for c in cold["programs"]["dispatch"]
                if "kernel_call" in c}
    tuned = [c for c in cold["programs"]["dispatch"] if "autotuned" in c][0]["autotuned"]
    assert [c["kernel_call"]["grid"] for c in tuned["configs"]] == [
        [te_programs.TOKENS, te_programs.HIDDEN // b, 1] for b in (64, 128, 256, 512, 1024, 2048, 4096)]
    assert dispatch["_row_id_map_pass_1_kernel"]["kernel_call"]["grid"] == [te_programs.EXPERTS, 4, 1]
    padded = [c for c in cold["programs"]["dispatch_padded"] if "autotuned" in c][0]["autotuned"]
    assert [list(a) for a in padded["aliases"]] == [[6, 8, 40832 * 4096 * 2], [7, 9, 40832 * 4]]
