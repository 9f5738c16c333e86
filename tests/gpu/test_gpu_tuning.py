"""On an NVIDIA GPU: `cachectl tune` learns the winners of an autotuned matmul and of an in-place
autotuned add (its input donated), once; a FRESH process then lowers both as plain calls of their
winner on the FFI target, gets the results of the untuned (autotuned) program, runs them inside
XLA's command buffers (CUDA graphs) and does no autotuning at its first run.

Skipped without a GPU (see tests/conftest.py); scripts/test.sh runs them where `nvidia-smi -L`
lists one.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from conftest import run_python
from test_cachectl import cachectl
from test_call_records import entries
from test_gpu_lowering import GPU_CHILD_ENV
from test_lowering import subprocess_path

import kernel_cache
from kernel_cache.entries import call_entry
from lowering.payload import jaxlib_compat as compat

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda_device")]

# jaxlib's autotuner says this when it benchmarks configs at a launch (absl INFO, shown at level 0).
AUTOTUNE_LOG = "utotuning function"
COMMAND_BUFFERS = {"XLA_FLAGS": "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1",
                   "TF_CPP_MIN_LOG_LEVEL": "0", "TF_CPP_VMODULE": "command_buffer_conversion_pass=2"}



@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """(cache directory, `cachectl tune --json` document): the example tune programs tuned once."""
    directory = tmp_path_factory.mktemp("tuned") / "cache"
    proc = cachectl("--dir", directory, "tune", "lowering.examples:tune_programs", "--reps", "5", "--warmup", "2",
                    "--json", env={**GPU_CHILD_ENV, **subprocess_path()}, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    return directory, json.loads(proc.stdout)


FRESH = """
import json, sys, time
import jax, numpy as np
sys.path.insert(0, "tests")
from inspect_call import custom_calls
from lowering import examples as ep
out = {}
for label, fn, args in ep.tune_programs():   # the same programs and inputs (fixed seeds) as tuning had
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    expected = np.asarray(args[0]) + np.asarray(args[1]) if "in place" in label else None
    lowered = jitted.lower(*args)
    calls = [{"target": c["target"], "autotuned": "autotuned" in c,
              "grid": c["kernel_call"]["grid"] if "kernel_call" in c else None,
              "num_warps": c["kernel_call"]["kernel"]["num_warps"] if "kernel_call" in c else None}
             for c in custom_calls(lowered)]
    compiled = lowered.compile()
    copies = [a.copy() for a in args]                # the in-place program donates its first argument
    t = time.perf_counter()
    result = np.asarray(jax.block_until_ready(compiled(*copies)), np.float32)
    first = time.perf_counter() - t
    again = np.asarray(compiled(*[a.copy() for a in args]), np.float32)
    out[label] = {"calls": calls, "first_run": first, "result": result.ravel()[:4096].tolist(),
                  "repeatable": bool(np.array_equal(result, again)),
                  "in_place_ok": None if expected is None else bool(np.allclose(result, expected, rtol=1e-6, atol=1e-6))}
print(json.dumps(out))
"""


def fresh_process(directory, **env):
    proc = run_python(FRESH, {**GPU_CHILD_ENV, **subprocess_path(), **COMMAND_BUFFERS, "KERNEL_CACHE_DIR": str(directory),
                              **env}, timeout=600)
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def config_of(description: str) -> dict:
    return {k: v for k, v in re.findall(r"(\w+): (\w+)", description)}


@pytest.fixture(scope="module")
def runs(tuned):
    directory, _ = tuned
    with_winners = fresh_process(directory)
    autotuned = fresh_process(directory, KERNEL_CACHE_WINNERS="0")  # the same cache, winners ignored
    return with_winners, autotuned


def test_tune_times_every_config_and_stores_one_winner_per_site(tuned, cuda_device):
    directory, doc = tuned
    sites = {s["program"]: s for s in doc["sites"]}
    assert set(sites) == {"matmul[autotuned x6]", "tuned_add[in place]"} and doc["stored"] == 2 and doc["failed"] == 0
    assert sites["matmul[autotuned x6]"]["kernel"] == "matmul_kernel" and len(sites["matmul[autotuned x6]"]["configs"]) == 6
    for site in sites.values():
        timed = [c["seconds"] for c in site["configs"]]
        assert all(t is not None and t > 0 for t in timed), site
        best = min(site["configs"], key=lambda c: c["seconds"])
        assert site["winner"] == best["description"] and site["device"] == cuda_device.device_kind
    listed = json.loads(cachectl("--dir", directory, "list", "--json").stdout)["entries"]
    winners = {e["key"]: e["winner"] for e in listed if e["kind"] == "autotune-winner"}
    assert set(winners) == {s["key"] for s in sites.values()}
    assert {w["device"] for w in winners.values()} == {cuda_device.device_kind}


def test_tune_records_each_call_narrowed_to_its_winner(tuned):
    """After tuning, each program is lowered once as a run would: the winner's own lowered-call
    record is stored (one config, filed for its site), so a fresh process reads it whole."""
    directory, doc = tuned
    store = kernel_cache.configure(kernel_cache.Config(dir=directory))
    try:
        records = [call_entry.CallRecord.from_entry(e) for e in entries(store, call_entry.KIND).values()]
    finally:
        kernel_cache.configure()
    narrowed = {r.winner_key for r in records if r.winner_key and len(r.config_keys) == 1 and r.payload is not None}
    assert narrowed == {s["key"] for s in doc["sites"]}, records


def test_a_fresh_process_lowers_the_winners_as_plain_ffi_calls(tuned, runs):
    _, doc = tuned
    (with_winners, _), (autotuned, _) = runs
    winners = {s["program"]: config_of(s["winner"]) for s in doc["sites"]}
    target = compat.FFI_TARGET if compat.ffi_target_registered("cuda") else compat.LEGACY_TARGET
    for label, run in with_winners.items():
        (call,) = run["calls"]
        assert call["target"] == target and not call["autotuned"], (label, call)
        win = winners[label]
        assert call["num_warps"] == int(win["num_warps"])
        if label.startswith("matmul"):
            assert call["grid"] == [1024 // int(win["BLOCK_M"]), 1024 // int(win["BLOCK_N"]), 1]
        else:
            assert call["grid"] == [(1 << 16) // int(win["BLOCK"]), 1, 1]
        (before,) = autotuned[label]["calls"]
        assert before["autotuned"] and before["target"] == compat.LEGACY_TARGET


def test_winners_give_the_results_of_the_autotuned_program(runs):
    (with_winners, _), (autotuned, _) = runs
    for label, run in with_winners.items():
        tol = 2e-2 if label.startswith("matmul") else 1e-6
        np.testing.assert_allclose(run["result"], autotuned[label]["result"], rtol=tol, atol=tol, err_msg=label)
        assert run["repeatable"], label
    for run in (with_winners, autotuned):  # x + y once: donated, aliased input restored for each config
        assert run["tuned_add[in place]"]["in_place_ok"]


def test_winners_run_in_command_buffers_and_nothing_autotunes_at_first_run(runs):
    (_, with_log), (_, autotuned_log) = runs
    if compat.ffi_target_registered("cuda"):  # evidence of capture, as in test_gpu_lowering
        assert re.search(r"Creating command buffer thunk with the following thunks:.*triton_kernel_call", with_log), \
            "the winners' FFI calls were not captured in a CUDA graph:\n" + with_log[-3000:]
    assert AUTOTUNE_LOG not in with_log, with_log[-3000:]
    if AUTOTUNE_LOG not in autotuned_log:  # the log is the autotuner's only trace; absent, the HLO check above stands
        pytest.skip("this jaxlib does not log its autotuning at TF_CPP_MIN_LOG_LEVEL=0")
