"""The README's "Install into your environment" works as written.

The CPU-only host's lines are parsed out of README.md (so the README and this test cannot drift) and
run, one by one, in a fresh venv (`python -m venv`, nothing else in it) against a copy of this
checkout, with that venv first on PATH as a user's activated environment has it and the stack's venv
off it. Then: kernel-cache imports from that venv (not from the checkout), `cachectl --version` runs,
the `.pth` hook and the client entry points are installed, no CUDA runtime came along (no `nvidia-*`,
no `jax-cuda13-pjrt`), `cachectl doctor` says the jaxlib row is ok and the README's own JAX example
cross-lowers a Triton call for cuda with nothing on stderr. Before the plugin line, lowering fails
and both `cachectl doctor` and the error name the README's plugin line as the fix.

That test installs jax, jaxlib and Triton from the package index (about two minutes and 1.5 GB on the
2-core box), so it runs where scripts/test.sh tests every stack (`KERNEL_CACHE_STACKS=all`, as CI does:
test.sh then sets KC_TEST_FRESH_INSTALL=1, which also asks for it by hand), once: on the current
stack's venv, whose Python gets the current stack's jax from the README's lines. The other tests here are quick and run
on every stack: no extra brings a CUDA runtime, and the README's GPU line pins the GPU-tested stack.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import ROOT
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

README = (ROOT / "README.md").read_text()
CHECKOUT = "/path/to/kernel-cache"  # the README's placeholder for the checkout
STACK_FILE = Path(sys.prefix) / ".kernel-cache-stack"  # written by scripts/setup_env.sh
RUN_ON = "current"
FRESH_INSTALL = os.environ.get("KC_TEST_FRESH_INSTALL") == "1"  # scripts/test.sh sets it for KERNEL_CACHE_STACKS=all
# a CUDA runtime, or a package that brings one: what a CPU-only host must not get
CUDA_RUNTIME = re.compile(r"^(nvidia-.*|jax-cuda\d*-pjrt|jax-cuda\d*-plugin)$")
CUDA_EXTRAS = {"cuda", "cuda12", "cuda13", "with-cuda", "cuda12-local", "cuda13-local", "gpu", "tpu"}


def install_section() -> str:
    start = README.index("## Install into your environment")
    end = README.find("\n## ", start + 1)
    return README[start:end if end != -1 else None]


def bash_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", install_section(), re.S)


def commands(block: str) -> list[str]:
    """A block's command lines, without comments and blank lines."""
    lines = [line.split("  #")[0].strip() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def cpu_lines() -> list[str]:
    (block,) = [b for b in bash_blocks() if "--no-deps" in b]
    return commands(block)


def supported_row(stack: str) -> dict[str, str]:
    """The README's "Supported versions" row of `stack`, by column."""
    table = README[README.index("## Supported versions"):README.index("## Install into your environment")]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines() if line.startswith("|")]
    (row,) = [r for r in rows[2:] if r[0] == stack]
    return dict(zip(rows[0], row))


def test_the_readme_gpu_line_pins_the_gpu_tested_stack():
    """The GPU host's line pins `jax[cuda13]` and Triton at the table's GPU host versions (the one stack
    tested on a GPU) and names its Python; pyproject's bounds admit them."""
    gpu_host = supported_row("GPU host")
    (gpu,) = [b for b in bash_blocks() if "--no-deps" not in b]
    assert re.findall(r'"jax\[cuda13\]==([^"]+)"', gpu) == [gpu_host["jax / jaxlib"]], gpu
    assert re.findall(r'"triton==([^"]+)"', gpu) == [gpu_host["triton"]], gpu
    assert f"Python {gpu_host['Python']}" in gpu, gpu
    bounds = {r.name: r.specifier for r in map(Requirement, tomllib.loads((ROOT / "pyproject.toml").read_text())
                                                ["project"]["dependencies"])}
    for name, column in (("jax", "jax / jaxlib"), ("jaxlib", "jax / jaxlib"), ("triton", "triton")):
        assert bounds[name].contains(gpu_host[column]), (name, bounds[name], gpu_host[column])
    lines = cpu_lines()
    assert lines[0] == f"pip install {CHECKOUT}" and "jax-cuda13-plugin==" in lines[1], lines
    assert "cachectl doctor" in lines


def _requirements(name: str, extras: frozenset[str]) -> list[Requirement]:
    """What installing `name[extras]` asks for, markers evaluated for this interpreter."""
    wanted = []
    for text in importlib.metadata.requires(name) or []:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras | {""}):
            wanted.append(req)
    return wanted


def test_no_extra_brings_a_cuda_runtime():
    """pyproject's extras, and everything they pull in as installed here, name no CUDA runtime: pip
    cannot install one requirement --no-deps, so jaxlib's CUDA plugin is no extra (README)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra, texts in extras.items():
        seen: set[str] = set()
        todo = [Requirement(t) for t in texts]
        todo = [r for r in todo if r.marker is None or r.marker.evaluate({"extra": ""})]
        while todo:
            req = todo.pop()
            name = canonicalize_name(req.name)
            assert not CUDA_RUNTIME.match(name), f"[{extra}] brings {name} (through {sorted(seen) or 'itself'})"
            assert not set(req.extras) & CUDA_EXTRAS, f"[{extra}] asks for {req}"
            if name in seen:
                continue
            seen.add(name)
            try:
                todo += _requirements(name, frozenset(req.extras))
            except importlib.metadata.PackageNotFoundError:
                continue  # not installed on this stack (ejKernel on Python >= 3.12): its name was checked


# The README's lines in a fresh venv -----------------------------------------------------------------------
def _fresh_checkout(base: Path) -> Path:
    """What git has (tracked and untracked but not ignored files): no build/, no egg-info, no venvs."""
    clone = base / "kernel-cache"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, clone / name)
    return clone


def _user_env(venv: Path) -> dict[str, str]:
    """A user's shell with `venv` activated: the stack's venv, PYTHONPATH and JAX_PLATFORMS gone."""
    ours = Path(sys.prefix) / "bin"
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "JAX_PLATFORMS", "PIP_REQUIRE_VIRTUALENV")}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p) != ours]
    env.update(PATH=os.pathsep.join([str(venv / "bin"), *path]), VIRTUAL_ENV=str(venv))
    # conftest points XDG_CACHE_HOME at this session's directory: keep pip's cache where pip keeps it
    env.setdefault("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip"))
    return env


def _sh(command: str, env: dict[str, str], cwd: Path, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
    proc = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode not in ok:
        raise AssertionError(f"`{command}` exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def _doctor(env: dict[str, str], cwd: Path) -> dict[str, dict]:
    proc = _sh("cachectl doctor --json", env, cwd, ok=(0, 1))
    return {row["check"]: row for row in json.loads(proc.stdout)["checks"]}


@pytest.mark.slow
def test_the_readme_cpu_host_install_in_a_fresh_venv(tmp_path):
    stack = STACK_FILE.read_text().strip() if STACK_FILE.is_file() else None
    if stack != RUN_ON or not FRESH_INSTALL:
        pytest.skip(f"installs jax and Triton into a fresh venv (1.5 GB): runs in the all-stacks run "
                    f"(KERNEL_CACHE_STACKS=all scripts/test.sh, as CI runs it; or KC_TEST_FRESH_INSTALL=1), on the "
                    f"{RUN_ON} stack (this is {f'the {stack} stack' if stack else 'no venv of scripts/test.sh'})")
    venv = tmp_path / "env"
    try:
        _install_and_check(tmp_path, venv)
    finally:
        shutil.rmtree(venv, ignore_errors=True)  # 1.5 GB; pytest keeps its last three temporary directories


def _install_and_check(tmp_path: Path, venv: Path) -> None:
    clone, work = _fresh_checkout(tmp_path), tmp_path / "work"
    work.mkdir()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = _user_env(venv)
    lines = [line.replace(CHECKOUT, str(clone)) for line in cpu_lines()]
    (plugin_at,) = [i for i, line in enumerate(lines) if "jax-cuda13-plugin" in line]
    example = work / "readme_example.py"
    example.write_text(re.search(r"## Using it from JAX.*?```python\n(.*?)```", README, re.S).group(1))

    for line in lines[:plugin_at]:
        _sh(line, env, work)
    # Without the plugin lowering fails, and doctor and the error both name the README's plugin line.
    (substitution,) = re.findall(r"\$\(.*\)", lines[plugin_at])
    jaxlib_version = _sh(f"echo {substitution}", env, work).stdout.strip()
    plugin_line = lines[plugin_at].replace(substitution, jaxlib_version)
    rows = _doctor(env, work)
    assert rows["jaxlib"]["status"] == "problem", rows["jaxlib"]
    if "nvidia-smi lists a GPU" in rows["gpu"]["detail"]:  # a GPU host gets jax's CUDA runtime instead
        assert '"jax[cuda13]==' in rows["jaxlib"]["fix"], rows["jaxlib"]
    else:
        assert plugin_line in rows["jaxlib"]["fix"], (plugin_line, rows["jaxlib"])
    failed = _sh(f"python {example}", env, work, ok=(1,))
    assert "JaxlibSupportError" in failed.stderr and plugin_line in failed.stderr, failed.stderr[-3000:]

    for line in lines[plugin_at:]:
        _sh(line, env, work)

    where = json.loads(_sh('python -c "import json, kernel_cache, compiler, lowering, sysconfig; print(json.dumps('
                           '[kernel_cache.__file__, compiler.__file__, lowering.__file__, sysconfig.get_paths()[\'purelib\']]))"',
                           env, work).stdout)
    *modules, site_packages = map(Path, where)
    assert all(m.is_relative_to(site_packages) for m in modules), where  # installed, not the checkout
    assert (Path(site_packages) / "kernel_cache_intercept.pth").read_text() == (ROOT / "kernel_cache_intercept.pth").read_text()
    entry_points = _sh("python -c \"import importlib.metadata as m; "
                       "print(' '.join(sorted(e.name for e in m.entry_points(group='kernel_cache.clients'))))\"",
                       env, work).stdout.split()
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["kernel_cache.clients"]
    assert entry_points == sorted(declared), entry_points
    assert "kernel-cache" in _sh("cachectl --version", env, work).stdout

    installed = {canonicalize_name(p["name"]): p["version"]
                 for p in json.loads(_sh("python -m pip list --format=json", env, work).stdout)}
    assert not [n for n in installed if CUDA_RUNTIME.match(n) and n != "jax-cuda13-plugin"], sorted(installed)
    assert installed["jax-cuda13-plugin"] == installed["jaxlib"] == jaxlib_version, installed

    rows = _doctor(env, work)
    assert rows["jaxlib"]["status"] == "ok" and jaxlib_version in rows["jaxlib"]["detail"], rows["jaxlib"]
    assert not [r for r in rows.values() if r["status"] == "problem"], rows

    lowered = _sh(f"python {example}", env, work)
    assert "triton_kernel_call" in lowered.stdout, lowered.stdout[-2000:]
    assert "Traceback" not in lowered.stderr, lowered.stderr[-3000:]  # a CUDA runtime would print cuDNN's
