"""On an NVIDIA GPU: TransformerEngine's real Triton path (scripts/te_programs.py: TE 2.20's
triton_call_lowering and MoE permutation kernels) gives TE's own outputs bit for bit through
KERNEL_CACHE_INTERCEPT=transformer_engine, cold and warm, and a warm process compiles nothing.

Fresh processes, as scripts/bench_te.py runs them (its children, its comparison). Needs TE's
pure-Python wheel (scripts/te_programs.py says where it is looked for) and kernel-cache pip-installed
(its .pth hook and entry points). Skipped without a GPU (tests/conftest.py).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT, child_env

from scripts import te_programs

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda_device"),
              pytest.mark.skipif(te_programs.te_package_dir() is None, reason=te_programs.MISSING)]


def test_tes_outputs_bit_for_bit_and_a_warm_process_compiles_nothing(tmp_path):
    out = tmp_path / "bench_te.json"
    proc = subprocess.run([sys.executable, "scripts/bench_te.py", "--json", str(out)], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    report = json.loads(out.read_text())
    runs, differences = report["runs"], report["differences"]
    assert set(runs) == {"own cold", "own warm", "intercepted cold", "intercepted warm"}
    assert all(not found for found in differences.values()), differences  # every output TE's, bit for bit
    assert len(runs["own cold"]["digests"]) >= 17
    for name in ("intercepted cold", "intercepted warm"):
        assert runs[name]["served_by"] == "transformer_engine"
        assert runs[name]["tally"]["transformer_engine"]["fallback"] == 0
    assert runs["intercepted cold"]["compiles"] > 0 and runs["intercepted warm"]["compiles"] == 0
