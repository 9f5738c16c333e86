"""Compile ahead: the first miss of a module starts the compiles of every call traced with
it on KERNEL_CACHE_COMPILE_WORKERS threads; the lowered module and the entries are those of serial
compiles; a warm process starts nothing; an exiting process leaves queued compiles undone."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import json_child

CHILD = Path(__file__).resolve().parents[1] / "support" / "compile_ahead_child.py"
LABELS = "add[BLOCK=256],add[BLOCK=512],softmax,layernorm"  # four kernels, one program each


def lower(tmp_path: Path, name: str, workers: int, mode: str = "module", cache: Path | None = None,
          labels: str = LABELS) -> dict:
    return json_child(CHILD, tmp_path / f"{name}.json", mode, labels,
                      KERNEL_CACHE_DIR=str(cache or tmp_path / name), KERNEL_CACHE_COMPILE_WORKERS=str(workers),
                      TRITON_CACHE_DIR=str(tmp_path / f"{name}-triton"))


@pytest.fixture(scope="module")
def serial_and_parallel(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ahead")
    return lower(tmp, "serial", 1), lower(tmp, "parallel", 2), tmp


def test_the_module_compiles_ahead_on_the_workers_and_lowers_as_serial_compiles_do(serial_and_parallel):
    serial, parallel, _ = serial_and_parallel
    assert len(serial["compile_threads"]) == len(parallel["compile_threads"]) == 4  # each kernel once
    assert set(serial["compile_threads"]) == {"MainThread"}
    ahead = [t for t in parallel["compile_threads"] if t.startswith("kernel-cache-compile-")]
    assert len(ahead) >= 2, parallel["compile_threads"]  # the first miss started the others on workers
    assert parallel["lowered_sha"] == serial["lowered_sha"]
    assert parallel["entries"] == serial["entries"]  # same keys, the same bytes of every blob


def test_a_single_call_is_compiled_by_its_rule_alone(tmp_path):
    """Nothing else was traced: the miss hands no work to a worker (the call being lowered is its rule's)."""
    report = lower(tmp_path, "one", 2, labels="softmax")
    assert report["compile_threads"] == ["MainThread"] and report["workers_started"] == 0


def test_a_warm_process_starts_no_compile(serial_and_parallel):
    _, _, tmp = serial_and_parallel
    warm = lower(tmp, "warm", 2, cache=tmp / "parallel")
    assert warm["compile_threads"] == [] and warm["workers_started"] == 0
    assert sum("cubin" in blobs for blobs in warm["entries"].values()) == 4


def test_calls_traced_but_never_lowered_are_not_waited_for_at_exit(tmp_path):
    """The 9-program module (14 kernels) is traced, its first program lowered (the miss hands the other
    13 kernels to two workers), and the process exits: it finishes the compiles under way, cancels the
    rest, and does not stay to build every queued kernel."""
    def kernels(report):
        return sum("cubin" in blobs for blobs in report["entries"].values())

    assert kernels(lower(tmp_path, "early", 1, "exit-early", labels="")) == 1
    early = lower(tmp_path, "early2", 2, "exit-early", labels="")
    assert 1 <= kernels(early) < 14 and len(early["compile_threads"]) < 14, early["compile_threads"]


def test_two_processes_compiling_ahead_build_each_kernel_once(tmp_path):
    """Cross-process single-flight is unchanged: the lock is taken by whoever compiles, a worker
    thread included, so two cold ranks on one cache build each of the four kernels once between them."""
    import json
    import subprocess
    import sys

    from conftest import ROOT, child_env

    env = child_env(KERNEL_CACHE_DIR=str(tmp_path / "cache"), KERNEL_CACHE_COMPILE_WORKERS="2",
                    TRITON_CACHE_DIR=str(tmp_path / "triton"))
    ranks = [subprocess.Popen([sys.executable, str(CHILD), str(tmp_path / f"rank{i}.json"), "module", LABELS],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    for rank in ranks:
        _, err = rank.communicate(timeout=600)
        assert rank.returncode == 0, err[-3000:]
    reports = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2)]
    assert sum(len(r["compile_threads"]) for r in reports) == 4, [r["compile_threads"] for r in reports]
    assert reports[0]["lowered_sha"] == reports[1]["lowered_sha"]
