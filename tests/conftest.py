"""Shared fixtures: an isolated environment and example kernels compiled once per session."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Tests never touch the user's cache: drop KERNEL_CACHE_* and point the toolchain memo (and any
# default cache location) at a per-session directory that subprocesses inherit.
for _name in [n for n in os.environ if n.startswith("KERNEL_CACHE_")]:
    del os.environ[_name]
_SESSION_HOME = tempfile.mkdtemp(prefix="kernel-cache-tests-")
os.environ["XDG_CACHE_HOME"] = _SESSION_HOME
os.environ["TRITON_CACHE_DIR"] = os.path.join(_SESSION_HOME, "triton")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_SESSION_HOME, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none found)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _has_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def example_specs_sm90():
    from scripts.example_kernels import example_specs

    return dict(example_specs("sm_90"))


@pytest.fixture(scope="session")
def compiled_sm90(example_specs_sm90):
    """label -> Artifact, every example kernel compiled once for sm_90."""
    from compiler import compile_spec

    return {label: compile_spec(spec) for label, spec in example_specs_sm90.items()}


def python_path(*extra) -> str:
    """The repo first, then whatever PYTHONPATH this run has (e.g. a --target install of a dependency)."""
    return os.pathsep.join(str(p) for p in (ROOT, *extra, os.environ.get("PYTHONPATH", "")) if p)


def child_env(**overrides) -> dict:
    """os.environ for a child interpreter that imports this repo's packages."""
    return {**os.environ, "PYTHONPATH": python_path(), **overrides}


def run_python(code: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter from the repo root; raises with its output on failure."""
    full_env = child_env(**(env or {}))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full_env, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"subprocess failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc
