"""Shared fixtures: an isolated environment and example kernels compiled once per session.

GPU tests (marked `gpu`) run where `nvidia-smi -L` lists a GPU: there JAX_PLATFORMS is left to JAX
(it picks CUDA when its CUDA plugin works) and JAX does not preallocate GPU memory (tests start
child processes on the same GPU). Elsewhere they are skipped and JAX_PLATFORMS defaults to cpu.
The run ends with one line saying whether the GPU tests ran, on what, or why they were skipped.
"""

from __future__ import annotations

import grp
import importlib.metadata
import importlib.util
import json
import os
import pwd
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
# Test modules import the scaffolding in tests/support/ (fake servers, child programs, the custom-call
# decoder) and a few helpers of other test modules by plain name: each folder of tests/ is on the path,
# here and in every child interpreter (`python_path`). File names are unique across the folders.
TEST_PATHS = [TESTS / "support", *sorted(p for p in TESTS.iterdir() if p.is_dir() and p.name not in ("support", "__pycache__"))]
for _path in [ROOT, *TEST_PATHS][::-1]:
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

# Tests never touch the user's cache: drop KERNEL_CACHE_* and point the toolchain memo (and any
# default cache location) at a per-session directory that subprocesses inherit.
for _name in [n for n in os.environ if n.startswith("KERNEL_CACHE_")]:
    del os.environ[_name]
_SESSION_HOME = tempfile.mkdtemp(prefix="kernel-cache-tests-")
os.environ["XDG_CACHE_HOME"] = _SESSION_HOME
os.environ["TRITON_CACHE_DIR"] = _TRITON_CACHE = os.path.join(_SESSION_HOME, "triton")


@pytest.fixture(autouse=True)
def _triton_cache_dir_kept():
    """jax_triton sets TRITON_CACHE_DIR="" for the whole process when it is imported (tests that import
    the client programs in-process): after every test the session's value is back, for later tests and
    the child processes they start."""
    yield
    os.environ["TRITON_CACHE_DIR"] = _TRITON_CACHE


def _visible_gpus() -> list[str]:
    """The names `nvidia-smi -L` lists ("NVIDIA H100 80GB HBM3"); empty without a driver or a GPU."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        proc = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if proc.returncode != 0:
        return []
    return re.findall(r"^GPU \d+: (.+?)(?: \(UUID: [^)]*\))?\s*$", proc.stdout, re.M)


GPUS = _visible_gpus()
NO_GPU_REASON = "no NVIDIA GPU visible: " + (
    "nvidia-smi -L lists none" if shutil.which("nvidia-smi") else "no nvidia-smi on PATH")
if GPUS:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
else:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # CPU-only hosts: cross-lowering, no device probing


def jax_cuda_problem() -> str | None:
    """Why JAX in this process has no CUDA device although a GPU is visible, or None if it has one."""
    import jax

    try:
        if jax.devices("cuda"):
            return None
    except RuntimeError:
        pass
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if platforms and not {"cuda", "gpu"} & set(platforms.lower().split(",")):
        return f"JAX_PLATFORMS={platforms} hides the GPU from JAX"
    if not any(importlib.util.find_spec(f"jax_plugins.xla_cuda{v}") for v in (12, 13)):
        return ("an NVIDIA GPU is visible but this JAX has no CUDA runtime plugin: install "
                f"'jax[cuda13]=={jax.__version__}' (or jax-cuda13-pjrt) into this environment")
    return "an NVIDIA GPU is visible but JAX sees no CUDA device (see JAX's warning above)"


def installed(dist: str) -> str | None:
    """The version of distribution `dist` installed in this environment, or None."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


JAX_TRITON = installed("jax-triton")
# jax-triton 0.4's own programs and semantics: the current stacks install it, the oldest has 0.3.1
needs_jax_triton_04 = pytest.mark.skipif(
    JAX_TRITON is None or tuple(int(p) for p in JAX_TRITON.split(".")[:2]) < (0, 4),
    reason=f"needs jax-triton 0.4, and this environment has {f'jax-triton {JAX_TRITON}' if JAX_TRITON else 'none'}: "
           "runs on the current stacks (KERNEL_CACHE_STACKS=current scripts/test.sh)")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real redis-server for the remote-level tests of one module (tests/support/redis_server.py)."""
    from redis_server import RedisServer

    srv = RedisServer(tmp_path_factory.mktemp("redis"))
    yield srv
    srv.stop()


@pytest.fixture
def fresh_warnings():
    """Once-per-process warnings said afresh in this test (the remote tests count what was said)."""
    from kernel_cache.telemetry import warnings_once

    warnings_once.reset()
    yield
    warnings_once.reset()


@pytest.fixture(scope="module")
def cuda_device():
    """The CUDA device the GPU tests run on; skips them with the reason when JAX has none (GPU test
    modules name it in `pytestmark`, so a module is skipped as a whole)."""
    problem = jax_cuda_problem()
    if problem is not None:
        pytest.skip(problem)
    import jax

    return jax.devices("cuda")[0]


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_SESSION_HOME, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    if GPUS:
        return
    skip = pytest.mark.skip(reason=NO_GPU_REASON)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Whether the GPU tests ran (and on what) or were skipped, and why; then every other skip, counted
    per reason, so each skipped test of the run is explained."""
    outcome: dict[str, str] = {}  # nodeid -> failed / skipped / passed (the worst phase wins)
    reasons: dict[str, int] = {}
    others: dict[str, set[str]] = {}  # reason -> nodeids of skipped tests not marked gpu
    rank = {"passed": 0, "skipped": 1, "failed": 2}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if not isinstance(report, pytest.TestReport):
                continue  # also in stats: deselected items, warnings
            result = "failed" if report.failed else "skipped" if report.skipped else "passed"
            reason = _skip_reason(report) if result == "skipped" else ""
            if "gpu" not in report.keywords:
                if result == "skipped":
                    others.setdefault(reason, set()).add(report.nodeid)
                continue
            if report.when != "call" and result == "passed":
                continue
            if result == "skipped":
                reasons[reason] = reasons.get(reason, 0) + 1
            if rank[result] >= rank[outcome.get(report.nodeid, "passed")]:
                outcome[report.nodeid] = result
    if outcome:
        counts = {r: sum(1 for v in outcome.values() if v == r) for r in ("passed", "failed", "skipped")}
        if counts["skipped"] == len(outcome):
            why = "; ".join(f"{n}: {r}" if len(reasons) > 1 else r
                            for r, n in sorted(reasons.items(), key=lambda kv: -kv[1])) or "skipped"
            line = f"GPU tests: {len(outcome)} skipped ({why})"
        else:
            ran = ", ".join(f"{n} {r}" for r, n in counts.items() if n)
            where = ", ".join(sorted(set(GPUS))) or "a GPU"
            line = f"GPU tests: {ran}; ran on {where}"
        terminalreporter.write_line(line, yellow=counts["skipped"] > 0 or counts["failed"] > 0,
                                    green=counts["passed"] > 0 and not counts["failed"] and not counts["skipped"])
    if others:
        total = sum(len(ids) for ids in others.values())
        terminalreporter.write_line(f"Other skips: {total}", yellow=True)
        for reason, ids in sorted(others.items(), key=lambda kv: -len(kv[1])):
            terminalreporter.write_line(f"  {len(ids)}: {reason}", yellow=True)


def _skip_reason(report) -> str:
    if isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    return str(report.longrepr or "skipped")


@pytest.fixture(scope="session")
def example_specs_sm90():
    from compiler.examples import example_specs

    return dict(example_specs("sm_90"))


@pytest.fixture(scope="session")
def compiled_sm90(example_specs_sm90):
    """label -> Artifact, every example kernel compiled once for sm_90."""
    from compiler import compile_spec

    return {label: compile_spec(spec) for label, spec in example_specs_sm90.items()}


def python_path(*extra) -> str:
    """The repo and the test folders first, then whatever PYTHONPATH this run has (e.g. a --target install of a dependency)."""
    return os.pathsep.join(str(p) for p in (ROOT, *TEST_PATHS, *extra, os.environ.get("PYTHONPATH", "")) if p)


def child_env(**overrides) -> dict:
    """os.environ for a child interpreter that imports this repo's packages."""
    return {**os.environ, "PYTHONPATH": python_path(), **overrides}


def json_child(script: Path, out: Path, *args: str, **env: str) -> dict:
    """Run `script OUT ARGS...`, a child that writes a JSON report to OUT; the report, with the
    child's stderr under "stderr". Raises with the child's output when it fails."""
    proc = subprocess.run([sys.executable, str(script), str(out), *args], cwd=ROOT, capture_output=True, text=True,
                          env=child_env(**env), timeout=600)
    if proc.returncode != 0:
        raise AssertionError(f"{out.stem} child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-6000:]}")
    report = json.loads(out.read_text())
    report["stderr"] = proc.stderr
    return report


def run_python(code: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter from the repo root; raises with its output on failure."""
    full_env = child_env(**(env or {}))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full_env, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"subprocess failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def people():
    """Real accounts: 'stranger' (no shared group) and 'teammate' (in the team group)."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd to create real users and groups")
    tag = secrets.token_hex(3)
    team, stranger, teammate = f"kcteam{tag}", f"kcstr{tag}", f"kcmate{tag}"
    subprocess.run(["groupadd", team], check=True)
    subprocess.run(["useradd", "-M", "-N", stranger], check=True)
    subprocess.run(["useradd", "-M", "-N", "-G", team, teammate], check=True)
    yield {"team": grp.getgrnam(team).gr_gid, "team_name": team,
           "stranger": pwd.getpwnam(stranger).pw_uid, "teammate": pwd.getpwnam(teammate).pw_uid}
    for user in (stranger, teammate):
        subprocess.run(["userdel", user], capture_output=True)
    subprocess.run(["groupdel", team], capture_output=True)
