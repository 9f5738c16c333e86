"""KERNEL_CACHE_INTERCEPT=jax_triton with jax-triton 0.4 (the current stack): programs written for its
API (scripts/jax_triton_04_programs.py: in place, tuples, Refs, out_type, keyword operands, a call
whose result is unused, cost estimates), unchanged, cross-lowered for sm_90 in fresh processes:
intercepted cold, intercepted warm (compiles nothing), and on jax-triton's own path.
"""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, json_child, needs_jax_triton_04

pytestmark = needs_jax_triton_04
CHILD = ROOT / "tests" / "support" / "jax_triton_04_child.py"


def _child(tmp_path, name: str, *args: str, **env: str) -> dict:
    return json_child(CHILD, tmp_path / f"{name}.json", *args, **env)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("jax-triton-04")
    env = {"KERNEL_CACHE_DIR": str(tmp / "cache"), "KERNEL_CACHE_INTERCEPT": "jax_triton"}
    return _child(tmp, "cold", **env), _child(tmp, "warm", **env), _child(tmp, "own", "--own")


def _without_binaries(call: dict) -> dict:
    """The call less what differs by design: the target (ours is CUDA-graph capturable for plain
    calls), its API version, and the compiled text: jax-triton 0.4 never specializes a static int
    on divisibility by 16 (Triton's own launcher does, and so do we: n=4096 gets vectorized loads)."""
    call = json.loads(json.dumps(call))
    call.pop("target")
    call.pop("api_version")
    kernel_calls = [call["kernel_call"]] if "kernel_call" in call else [
        c["kernel_call"] for c in call["autotuned"]["configs"]]
    for kc in kernel_calls:
        kc["kernel"].pop("ptx")
        kc["kernel"].pop("ttir")
    return call


def test_every_program_is_served_and_a_warm_process_compiles_nothing(runs):
    cold, warm, _ = runs
    assert cold["intercept"] == warm["intercept"] == {"jax_triton": "installed"}
    errors = {label: p["error"] for label, p in cold["programs"].items() if "error" in p}
    assert errors == {}
    calls = sum(len(p["calls"]) for p in cold["programs"].values())
    assert calls == len(cold["programs"]) >= 11
    assert cold["tally"] == {"jax_triton": {"served": calls, "fallback": 0}}
    assert cold["stats"]["compiles"] > 0
    assert warm["stats"]["compiles"] == 0 and warm["stats"]["misses"] == 0, warm["stats"]
    assert warm["programs"] == cold["programs"]
    assert "KernelCacheWarning" not in cold["stderr"] + warm["stderr"]


def test_the_same_calls_as_jax_tritons_own_path(runs):
    cold, _, own = runs
    assert {label for label, p in own["programs"].items() if "error" in p} == set()
    for label, program in cold["programs"].items():
        theirs = own["programs"][label]
        assert [_without_binaries(c) for c in program["calls"]] == [_without_binaries(c) for c in theirs["calls"]], label


def test_a_call_whose_result_is_unused_and_cost_estimates_reach_the_hlo(runs):
    cold, _, own = runs
    assert len(cold["programs"]["unused_result"]["calls"]) == 1
    assert cold["programs"]["with_cost"]["cost_estimate_json"] and own["programs"]["with_cost"]["cost_estimate_json"]
    assert not cold["programs"]["inplace"]["cost_estimate_json"]
