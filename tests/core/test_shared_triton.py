"""16 processes, each its own 'node' (own local level), cold shared directory, the example kernel set
compiled by real Triton: compiles across all processes == distinct keys, identical artifacts."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import child_env

REPO = Path(__file__).resolve().parents[2]
N_PROCESSES = 16

RANK = textwrap.dedent("""
    import hashlib, json, sys, time, warnings
    from pathlib import Path
    from kernel_cache import KernelCacheWarning, default_store

    go = Path(sys.argv[1])
    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as caught:
        from compiler import get_or_compile
        from compiler.examples import example_specs
        specs = example_specs("sm_90")
        store = default_store()
        while not go.exists():
            time.sleep(0.005)
        digests = {}
        for label, spec in specs:
            artifact, key = get_or_compile(spec)
            meta, blobs = artifact.to_entry()
            digests[key] = hashlib.sha256(b"".join(n.encode() + blobs[n] for n in sorted(blobs))).hexdigest()
    session = store.stats.session()
    print(json.dumps({"specs": len(specs), "digests": digests, "compiles": session["compiles"],
                      "errors": session["errors"], "lock_kind": store.shared.lock_kind,
                      "warnings": [str(w.message) for w in caught if issubclass(w.category, KernelCacheWarning)]}))
""")


def _memo_seed(tmp_path: Path) -> Path:
    """One process computes the toolchain fingerprint memo; ranks get a copy (as a warm node would),
    so the test spends its time on the shared level, not on 16 hashes of libtriton."""
    seed = tmp_path / "seed"
    env = child_env(KERNEL_CACHE_DIR=str(seed))
    code = ("from compiler import toolchain_fingerprint, parse_target\n"
            "toolchain_fingerprint(parse_target('sm_90'))")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)
    return seed


@pytest.mark.slow
@pytest.mark.parametrize("lock", ["auto", "soft"])
def test_16_ranks_compile_each_example_kernel_once(tmp_path, lock):
    pytest.importorskip("triton")
    shared = tmp_path / "shared"
    shared.mkdir()
    seed = _memo_seed(tmp_path)
    go = tmp_path / "go"
    procs = []
    for i in range(N_PROCESSES):
        node = tmp_path / f"node-{i}"
        shutil.copytree(seed, node)
        env = child_env(KERNEL_CACHE_DIR=str(node), KERNEL_CACHE_SHARED_DIR=str(shared), KERNEL_CACHE_LOCK=lock)
        procs.append(subprocess.Popen([sys.executable, "-c", RANK, str(go)], env=env, cwd=REPO,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    time.sleep(1.0)
    go.touch()
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))

    keys = set(results[0]["digests"])
    assert results[0]["specs"] == 11 and len(keys) == 11
    assert sum(r["compiles"] for r in results) == len(keys)
    for key in keys:
        assert len({r["digests"][key] for r in results}) == 1, "artifacts differ between ranks"
    assert [r["errors"] for r in results] == [0] * N_PROCESSES
    assert [r["warnings"] for r in results] == [[]] * N_PROCESSES
    assert {r["lock_kind"] for r in results} == {"soft" if lock == "soft" else "flock"}
    published = [p for p in (shared / "entries").rglob("*") if p.is_file()]
    assert sorted(p.name for p in published) == sorted(keys)  # no temp debris
