"""The README's two commands pick their stack by the Python they run on, asked without installing.

`scripts/demo.sh --which-stack` prints the line a real run starts with (which Python and why, which
stack, which venv) and stops before scripts/setup_env.sh; `scripts/test.sh --which-stacks` prints the
stacks it would test. Each runs here from a copy of scripts/ (no venv beside it) under a PATH holding only
the interpreters a test gives it (and `dirname`), with pyenv's versions out of sight unless a test lays out
a pyenv root of its own. The interpreters are this host's (pyenv's 3.10.13, 3.11.7, 3.12.1, 3.13.0, or
Debian's 3.11); a test whose Python is missing here is skipped, saying which.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT

BASH = shutil.which("bash") or "/bin/bash"
STACK_OF = {"3.11": "oldest", "3.12": "current", "3.13": "current-py313"}


def interpreter(minor: str) -> str | None:
    """A real interpreter of Python `minor` on this host (not a pyenv shim: a shim needs pyenv on PATH)."""
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    candidates = sorted(glob.glob(f"{pyenv}/versions/{minor}.*/bin/python{minor}"))
    candidates += [f"/usr/bin/python{minor}", f"/usr/local/bin/python{minor}"]
    for path in candidates:
        if os.access(path, os.X_OK):
            proc = subprocess.run([path, "-c", "import sys, venv; print('%d.%d' % sys.version_info[:2])"],
                                  capture_output=True, text=True)
            if proc.returncode == 0 and proc.stdout.strip() == minor:
                return path
    return None


def need(*minors: str) -> dict[str, str]:
    found = {m: interpreter(m) for m in minors}
    missing = [m for m, path in found.items() if path is None]
    if missing:
        pytest.skip(f"no Python {', '.join(missing)} on this host (pyenv's versions or /usr/bin)")
    return {m: p for m, p in found.items() if p is not None}


@pytest.fixture
def checkout(tmp_path) -> Path:
    """The scripts a newcomer runs, in a tree of their own: no venv there, none may appear."""
    tree = tmp_path / "kernel-cache"
    shutil.copytree(ROOT / "scripts", tree / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    return tree


def run(checkout: Path, tmp_path: Path, command: list[str], pythons: dict[str, str], env: dict[str, str] | None = None,
        pyenv_versions: dict[str, str] | None = None, python3: str | None = None,
        venv: Path | None = None) -> subprocess.CompletedProcess:
    """`command` (a script of `checkout` and its arguments) under a PATH holding `dirname` and, for
    each minor of `pythons`, a `pythonX.Y`; `python3` (an interpreter) is the python3 on that PATH;
    `venv` is activated as `source venv/bin/activate` would (VIRTUAL_ENV, its bin first on PATH);
    `pyenv_versions` ("3.12.1": interpreter) lays out a pyenv root holding those versions (otherwise
    PYENV_ROOT is an empty directory). Each call in a directory of its own."""
    where = tmp_path / f"run{len(list(tmp_path.glob('run*')))}"
    bin_dir, pyenv, home = where / "bin", where / "pyenv", where / "home"
    for d in (bin_dir, pyenv / "versions", home):
        d.mkdir(parents=True)
    os.symlink(shutil.which("dirname") or "/usr/bin/dirname", bin_dir / "dirname")
    for minor, path in pythons.items():
        os.symlink(path, bin_dir / f"python{minor}")
    if python3 is not None:
        os.symlink(python3, bin_dir / "python3")
    for version, path in (pyenv_versions or {}).items():
        (pyenv / "versions" / version / "bin").mkdir(parents=True)
        os.symlink(path, pyenv / "versions" / version / "bin" / "python")
    clean = {"PATH": str(bin_dir), "HOME": str(home), "PYENV_ROOT": str(pyenv), "LANG": "C.UTF-8"}
    if venv is not None:
        clean.update(PATH=f"{venv / 'bin'}{os.pathsep}{bin_dir}", VIRTUAL_ENV=str(venv))
    proc = subprocess.run([BASH, str(checkout / command[0]), *command[1:]], cwd=where, capture_output=True,
                          text=True, env={**clean, **(env or {})}, timeout=120)
    assert not [p.name for p in checkout.iterdir() if p.name.startswith(".venv")], "a venv was made"
    return proc


def assert_first_line(first: str, minor: str, stack: str) -> None:
    """The demo's first line: the Python it runs on and why, then the stack and its venv (to be made:
    none is beside the copied scripts)."""
    venv = ".venv" if stack == "oldest" else f".venv-{stack}"
    assert first.startswith(f"kernel-cache demo on Python {minor}."), first
    assert " because " in first and f": the {stack} stack, jax " in first, first
    assert first.endswith(f"; venv {venv} (to be made)"), first


def venv_python(checkout: Path, stack: str, env: dict[str, str]) -> str:
    """The interpreter scripts/setup_env.sh would make stack `stack`'s venv with, under `env`."""
    asked = subprocess.run([BASH, "-c", f"source {checkout}/scripts/stacks/python.sh; stack_python {stack}"],
                           capture_output=True, text=True, env=env)
    return asked.stdout.strip()


@pytest.mark.parametrize("minor", ["3.11", "3.13"])
def test_the_demo_runs_on_the_only_python_there_is(checkout, tmp_path, minor):
    """Debian 12's lone 3.11 gets the oldest stack, a lone 3.13 current-py313."""
    pythons = need(minor)
    proc = run(checkout, tmp_path, ["scripts/demo.sh", "--which-stack"], pythons)
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    stack = STACK_OF[minor]
    assert_first_line(first, minor, stack)
    assert pythons[minor] in first or f"python{minor}" in first, first
    assert proc.stdout.splitlines() == [first]  # --which-stack: that line alone, nothing installed


def test_the_current_stack_wins_where_python_312_is_found(checkout, tmp_path):
    pythons = need("3.11", "3.12", "3.13")
    proc = run(checkout, tmp_path, ["scripts/demo.sh", "--which-stack"], pythons)
    assert proc.returncode == 0, proc.stderr
    assert_first_line(proc.stdout.splitlines()[0], "3.12", "current")
    assert "because Python 3.12 is the first found of 3.12, 3.13, 3.11 (no python3 on PATH" in proc.stdout
    assert "jax 0.12.0.1" in proc.stdout and "jax-triton 0.4.1" in proc.stdout


@pytest.mark.parametrize("minor", ["3.11", "3.12", "3.13"])
def test_the_python3_on_path_runs_the_demo_on_its_own_stack(checkout, tmp_path, minor):
    """Where every supported Python is found, the python3 a user has on PATH is the one the demo runs
    on, with the newest stack that supports it; the first line says so, and the venv is made from it."""
    pythons = need("3.11", "3.12", "3.13")
    proc = run(checkout, tmp_path, ["scripts/demo.sh", "--which-stack"], pythons, python3=pythons[minor])
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert_first_line(first, minor, STACK_OF[minor])
    assert f"because the python3 on PATH ({tmp_path}/" in first and f"/bin/python3) is Python {minor}:" in first
    bin_dir = tmp_path / "run0" / "bin"  # that run's PATH: python3.11, python3.12, python3.13 and python3
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "PYENV_ROOT": str(tmp_path)}
    assert venv_python(checkout, STACK_OF[minor], env) == str(bin_dir / "python3")  # not python3.X beside it


def test_an_activated_venv_runs_the_demo_on_its_python(checkout, tmp_path):
    """An activated 3.13 venv wins over the 3.12 found beside it: the current-py313 stack, made from
    that venv's python."""
    pythons = need("3.11", "3.12", "3.13")
    venv = tmp_path / "env313"
    subprocess.run([pythons["3.13"], "-m", "venv", "--without-pip", str(venv)], check=True)
    proc = run(checkout, tmp_path, ["scripts/demo.sh", "--which-stack"], pythons, python3=pythons["3.12"], venv=venv)
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert_first_line(first, "3.13", "current-py313")
    assert f"({venv}/bin/python) because the activated venv {venv} is Python 3.13:" in first, first
    env = {"PATH": f"{venv}/bin", "VIRTUAL_ENV": str(venv), "HOME": str(tmp_path), "PYENV_ROOT": str(tmp_path)}
    assert venv_python(checkout, "current-py313", env) == f"{venv}/bin/python"
    named = run(checkout, tmp_path, ["scripts/demo.sh", "--which-stack"], pythons, venv=venv,
                env={"KERNEL_CACHE_STACK": "current"})
    assert_first_line(named.stdout.splitlines()[0], "3.12", "current")
    assert "because KERNEL_CACHE_STACK=current:" in named.stdout


def test_an_unsupported_python3_falls_back_and_says_why(checkout, tmp_path):
    pythons = need("3.10", "3.12")
    proc = run(checkout, tmp_path, ["scripts/demo.sh", "--which-stack"], {"3.12": pythons["3.12"]},
               python3=pythons["3.10"])
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert_first_line(first, "3.12", "current")
    assert "because Python 3.12 is the first found of 3.12, 3.13, 3.11 (the python3 on PATH (" in first
    assert "is Python 3.10, which no stack supports)" in first, first


def test_python_picks_the_stack_of_its_version(checkout, tmp_path):
    """PYTHON=/path/to/python3.13 is honoured where a 3.12 is found too, and over the active Python."""
    pythons = need("3.12", "3.13")
    proc = run(checkout, tmp_path, ["scripts/demo.sh", "--which-stack"], pythons, env={"PYTHON": pythons["3.13"]},
               python3=pythons["3.12"])
    assert proc.returncode == 0, proc.stderr
    assert_first_line(proc.stdout.splitlines()[0], "3.13", "current-py313")
    assert f"({pythons['3.13']})" in proc.stdout and f"because PYTHON={pythons['3.13']} is Python 3.13" in proc.stdout
    # and setup_env.sh makes that stack's venv from it
    env = {"PATH": "/nowhere", "PYTHON": pythons["3.13"], "HOME": str(tmp_path), "PYENV_ROOT": str(tmp_path)}
    assert venv_python(checkout, "current-py313", env) == pythons["3.13"]


def test_pyenvs_versions_are_found_off_path(checkout, tmp_path):
    """CI's Python 3.12 is among pyenv's versions, not on PATH."""
    pythons = need("3.11", "3.12")
    proc = run(checkout, tmp_path, ["scripts/demo.sh", "--which-stack"], {"3.11": pythons["3.11"]},
               pyenv_versions={"3.12.1": pythons["3.12"]})
    assert proc.returncode == 0, proc.stderr
    assert_first_line(proc.stdout.splitlines()[0], "3.12", "current")


def test_no_supported_python_and_conflicts_say_so(checkout, tmp_path):
    proc = run(checkout, tmp_path, ["scripts/demo.sh", "--which-stack"], {})
    assert proc.returncode == 2 and proc.stdout == ""
    assert "demo: no supported Python found" in proc.stderr and "PYTHON=/path/to/python3.12" in proc.stderr
    pythons = need("3.11")
    for env, said in [({"PYTHON": pythons["3.11"], "KERNEL_CACHE_STACK": "current"}, "unset one of them"),
                      ({"KERNEL_CACHE_STACK": "newest"}, "no such stack"),
                      ({"PYTHON": str(tmp_path / "nowhere" / "python3")}, "not a Python that runs here")]:
        proc = run(checkout, tmp_path, ["scripts/demo.sh", "--which-stack"], pythons, env=env)
        assert proc.returncode == 2 and proc.stdout == "" and said in proc.stderr, (env, proc.stderr)


def test_the_test_command_tests_one_stack_and_ci_all(checkout, tmp_path):
    """scripts/test.sh tests the demo's stack; KERNEL_CACHE_STACKS=all, which .ci/run sets and the
    README documents, tests every stack in scripts/stacks/."""
    pythons = need("3.11", "3.12", "3.13")
    one = run(checkout, tmp_path, ["scripts/test.sh", "--which-stacks"], pythons)
    assert one.returncode == 0 and one.stdout.split() == ["current"], (one.stdout, one.stderr)
    assert "KERNEL_CACHE_STACKS=all" in one.stderr  # the switch is named where a newcomer looks
    active = run(checkout, tmp_path, ["scripts/test.sh", "--which-stacks"], pythons, python3=pythons["3.11"])
    assert active.stdout.split() == ["oldest"] and "because the python3 on PATH (" in active.stderr, active
    every = run(checkout, tmp_path, ["scripts/test.sh", "--which-stacks"], pythons, env={"KERNEL_CACHE_STACKS": "all"})
    assert sorted(every.stdout.split()) == sorted(p.stem for p in (ROOT / "scripts" / "stacks").glob("*.txt"))
    ci = (ROOT / ".ci" / "run").read_text()
    assert "KERNEL_CACHE_STACKS=all exec scripts/test.sh" in ci
    assert "KERNEL_CACHE_STACKS=all scripts/test.sh" in (ROOT / "README.md").read_text()


def test_the_docs_name_each_pythons_cachectl():
    """README and docs/setup.md give the demo's `cachectl` path for each supported Python: the venv
    scripts/stacks/python.sh makes for that Python's stack."""
    def venv_of(minor: str) -> str:
        asked = subprocess.run([BASH, "-c", f'source "{ROOT}/scripts/stacks/python.sh"; '
                                            f'stack_venv "$(version_stack {minor})" .'],
                               capture_output=True, text=True, env={"PATH": os.environ.get("PATH", "")})
        return asked.stdout.strip().removeprefix("./")

    expected = {minor: venv_of(minor) for minor in STACK_OF}
    assert expected == {"3.11": ".venv", "3.12": ".venv-current", "3.13": ".venv-current-py313"}
    for path in (ROOT / "README.md", ROOT / "docs" / "setup.md"):
        named = dict((m, v) for v, m in re.findall(r"`(\.venv[\w-]*)/bin/cachectl[^`]*` on (?:Python )?(3\.\d+)",
                                                   path.read_text()))
        assert named == expected, (path.name, named)


def test_the_docs_say_what_the_test_command_installs_as_root():
    """scripts/test.sh installs redis-server with apt-get when run as root: README and docs/setup.md say so."""
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert re.search(r'if \[ "\$\(id -u\)" = 0 \] && command -v apt-get .*\n.*apt-get update.*\n.*apt-get install '
                     r'.*redis-server', script)
    readme = (ROOT / "README.md").read_text()
    two = readme[readme.index("## Two commands"):readme.index("## Supported versions")]
    setup = (ROOT / "docs" / "setup.md").read_text()
    for text in (two, setup):
        said = [p for p in re.split(r"\n\s*\n", text) if "redis-server" in p and "root" in p and "apt-get" in p]
        assert said, text[:200]
