"""On an NVIDIA GPU: programs served from their lowered-call records alone run correctly.

A fresh process lowers and runs the example programs (writing kernels and records, and at exit their
warm set); then every kernel entry is deleted, and another fresh process runs them again from the
records, read from the warm set: results equal the jnp references, nothing compiles, and the custom
calls carry the cached cubin.
"""

from __future__ import annotations

import json

import pytest
from conftest import run_python
from test_gpu_lowering import GPU_CHILD_ENV

from kernel_cache import Config, Store
from kernel_cache.entries import call_entry, warm_set

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda_device")]

CHILD = """
import json, sys
import jax, numpy as np
sys.path.insert(0, 'tests')
from lowering import examples as ep
from kernel_cache import Store, default_store
asked, real_get = [], Store.get
Store.get = lambda self, key: asked.append(key) or real_get(self, key)  # the keys read from the store
worst = 0.0
for label, fn, shapes in ep.programs():
    inputs = ep.random_inputs(shapes)
    lowered = jax.jit(fn).lower(*inputs)
    got = np.asarray(lowered.compile()(*inputs), np.float32)
    want = np.asarray(ep.references()[label](*inputs), np.float32)
    worst = max(worst, float(np.max(np.abs(got - want) / (1 + np.abs(want)))))
session = default_store().stats.session()
print(json.dumps({"worst": worst, "compiles": session["compiles"], "hits": sum(session["hits"].values()),
                  "record_hits": sum(session["record_hits"].values()), "asked": asked}))
"""


def _run(directory) -> dict:
    proc = run_python(CHILD, env={**GPU_CHILD_ENV, "KERNEL_CACHE_DIR": str(directory)})
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_programs_run_from_their_records_alone(tmp_path):
    directory = tmp_path / "cache"
    first = _run(directory)
    assert first["compiles"] == 14 and first["worst"] < 2e-2
    store = Store(Config(dir=directory))
    kinds: dict[str, list[str]] = {}
    for key in store.disk.keys():
        found = store.get(key)
        if found is not None:
            kinds.setdefault(found[0].meta.get("kind", ""), []).append(key)
    assert len(kinds[call_entry.KIND]) == 9 and len(kinds["triton-kernel"]) == 14
    (warm,) = kinds[warm_set.KIND]  # the program's warm set, written at the first process's exit
    assert set(warm_set.members_of(store.get(warm)[0])) == set(kinds[call_entry.KIND])
    for key in kinds["triton-kernel"]:
        store.delete(key)
    store.close()
    again = _run(directory)
    assert again["compiles"] == 0 and again["worst"] < 2e-2
    assert again["record_hits"] == 9 and again["hits"] == 0  # one record hit per call; no kernel read
    assert not set(again["asked"]) & set(kinds[call_entry.KIND])  # every record came from the warm set


JITS_CHILD = """
import json, sys
import jax, jax.numpy as jnp, numpy as np
from lowering import examples as ep
from kernel_cache import default_store
x, y = ep.random_inputs((jax.ShapeDtypeStruct((1 << 16,), jnp.float32),) * 2)
worst = 0.0
for _ in range(4):  # a new jit each time (a new function: JAX's caches cannot answer, the rule runs)
    got = np.asarray(jax.jit(lambda x, y: ep.add_program(x, y, block=1024))(x, y))
    worst = max(worst, float(np.max(np.abs(got - (np.asarray(x) + np.asarray(y))))))
print(json.dumps({"error": worst, "record_hits": default_store().stats.session()["record_hits"]}))
"""


def test_a_call_lowered_again_from_the_session_memo_runs_correctly(tmp_path):
    """The third and later lowerings of one call (here in new jits) are served from the session's
    memo (no plan, key or store read); what they lower runs and gives the same sums."""
    proc = run_python(JITS_CHILD, env={**GPU_CHILD_ENV, "KERNEL_CACHE_DIR": str(tmp_path / "cache")})
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["error"] < 1e-5
    assert result["record_hits"].get("memory", 0) == 3  # the first compiles; the others are record hits
