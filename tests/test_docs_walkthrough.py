"""A newcomer follows the README top to bottom, then the pages it links to (docs/clients.md's Python
example, docs/cachectl.md's commands), from a fresh copy of the tree, in a clean environment (no
KERNEL_CACHE_*, an empty HOME, another working directory), and nothing fails or surprises: each
command runs as written, outputs look as the documents show them, and the demo run twice with
KERNEL_CACHE_DIR pointing at someone's files loses none of them.

`scripts/test.sh` itself is the one README command not run here: this test is part of it.
What is substituted, and why: `/shared` and `mygroup` in the shared-cache recipe (a temporary
directory and a group created for the test: a test must not write to /shared), `/tmp/fresh` (a
temporary directory), the key prefix `6f37` in `cachectl show` (a kernel's; keys depend on the toolchain), and
`cachectl clear --yes` empties a copy of the demo's cache (the prewarm lines after it need it full).
The venv is the one this run already built (KERNEL_CACHE_VENV), with the copy first on PYTHONPATH:
installing jax and triton a second time would double CI's time and prove nothing more.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow
README = (ROOT / "README.md").read_text()
CLIENTS = (ROOT / "docs" / "clients.md").read_text()
CACHECTL = (ROOT / "docs" / "cachectl.md").read_text()


def blocks(language: str, after: str, text: str = README) -> list[str]:
    start = text.index(after)
    return re.findall(rf"```{language}\n(.*?)```", text[start:], re.S)


@pytest.fixture(scope="module")
def newcomer(tmp_path_factory):
    venv = Path(sys.executable).parent.parent
    if not (venv / ".kernel-cache-installed").is_file():
        pytest.skip(f"needs the venv scripts/test.sh builds (running under {venv}): the README's commands "
                    f"would install one, and this host may have no package index")
    base = tmp_path_factory.mktemp("newcomer")
    clone = base / "kernel-cache"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, clone / name)
    home = base / "home"
    home.mkdir()
    work = base / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNEL_CACHE_") and k not in ("XDG_CACHE_HOME",)}
    stack = venv / ".kernel-cache-stack"  # the README's commands reuse this venv, for the stack it holds
    env.update(KERNEL_CACHE_STACK=stack.read_text().strip() if stack.is_file() else "oldest")
    env.update(HOME=str(home), PYTHONPATH=str(clone), KERNEL_CACHE_VENV=str(Path(sys.executable).parent.parent),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    env.pop("JAX_PLATFORMS", None)
    return {"clone": clone, "home": home, "work": work, "env": env, "base": base}


def sh(newcomer, command: str, cwd=None, env=None, check=True) -> subprocess.CompletedProcess:
    full = {**newcomer["env"], **(env or {})}
    proc = subprocess.run(["bash", "-c", command], cwd=cwd or newcomer["work"], env=full, capture_output=True,
                          text=True, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"`{command}` failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def test_the_readme_top_to_bottom(newcomer):
    clone, work = newcomer["clone"], newcomer["work"]
    foreign = newcomer["base"] / "my-real-files"
    foreign.mkdir()
    (foreign / "results.csv").write_text("epoch,loss\n1,0.5\n")

    # "Two commands": the demo, twice, with KERNEL_CACHE_DIR pointing at someone's files.
    (two,) = blocks("bash", "## Two commands")[:1]
    demo_line = next(line for line in two.splitlines() if line.startswith("scripts/demo.sh"))
    demo_command = demo_line.split("#")[0].strip()
    for _ in range(2):
        out = sh(newcomer, demo_command, cwd=clone, env={"KERNEL_CACHE_DIR": str(foreign)})
    assert sorted(p.name for p in foreign.iterdir()) == ["results.csv"]
    assert (foreign / "results.csv").read_text() == "epoch,loss\n1,0.5\n"
    last = out.stdout.strip().splitlines()
    cachectl_hint = next(line for line in last if "cachectl" in line or "python -m kernel_cache" in line)
    demo_dir = clone / ".kernel-cache" / "demo"
    assert demo_dir.is_dir() and str(demo_dir.relative_to(clone)) in cachectl_hint
    cachectl = clone / ".venv" / "bin" / "cachectl"
    cachectl = cachectl if cachectl.exists() else Path(sys.executable).parent / "cachectl"
    listed = sh(newcomer, f"{cachectl} --dir {demo_dir} list")
    # the demo's 14 kernels, one lowered-call record per distinct call of its 9 programs, their warm set
    assert listed.stdout.startswith("KEY") and "\n25 entries (14 kernels, 9 lowered calls, 1 memo, 1 warm set), " in listed.stdout

    # The README's "Using it from JAX" and docs/clients.md's "The compiler and store from Python":
    # verbatim, from elsewhere.
    examples = [blocks("python", "## Using it from JAX")[0],
                blocks("python", "## The compiler and store from Python", CLIENTS)[0]]
    assert "compiler.get_or_compile" in examples[1]
    for n, code in enumerate(examples):
        script = work / f"readme_{n}.py"
        script.write_text(code)
        result = sh(newcomer, f"python {script}", env={"KERNEL_CACHE_DIR": str(work / "cache")})
        if n == 0:
            assert "triton_kernel_call" in result.stdout

    # The shared-cache recipe, with a temporary /shared and a group of our own.
    group = "kcnewcomer"
    if os.geteuid() == 0 and shutil.which("groupadd"):
        subprocess.run(["groupadd", "-f", group], check=True)
        recipe = blocks("bash", "Set it up once for a group")[0]
        recipe = recipe.replace("/shared", str(newcomer["base"] / "shared")).replace("mygroup", group)
        sh(newcomer, recipe + f"\ncachectl --dir {work / 'node-cache'} --shared-dir "
                              f"{newcomer['base'] / 'shared' / 'kernel-cache'} config >/dev/null",
           env={"PATH": f"{cachectl.parent}{os.pathsep}{newcomer['env']['PATH']}"})

    # The signing key recipe, in the empty HOME; then cachectl sees the key.
    key_block = blocks("bash", "## Trust model")[0]
    key_recipe = "\n".join(line.strip() for line in key_block.splitlines())
    shown = sh(newcomer, key_recipe + f"\n{cachectl} config")
    assert re.search(r"KERNEL_CACHE_SIGNING_KEY_FILE\s+set \(key id [0-9a-f]{16}\)\s+environment", shown.stdout)

    # Every `$ cachectl ...` line of docs/cachectl.md, against the demo's cache, checked against what it shows.
    section = CACHECTL
    executed = []
    rows = json.loads(sh(newcomer, f"{cachectl} --dir {demo_dir} list --json").stdout)["entries"]
    keys = [r["key"] for r in rows if r["kind"] == "triton-kernel"]  # `show --ptx` needs a kernel
    for block in re.findall(r"```text\n(.*?)```", section, re.S):
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if not line.startswith("$ cachectl "):
                continue
            command = line[2:].split("  #")[0].strip()
            command = command.replace("6f37", keys[0][:8]).replace("/tmp/fresh", str(work / "fresh"))
            command = command.replace("/tmp/warm.kcb", str(work / "warm.kcb"))  # outside any checkout
            env = {"KERNEL_CACHE_DIR": str(demo_dir)}
            if command.startswith("cachectl clear"):  # on a copy: the prewarm lines below need the recipes
                shutil.copytree(demo_dir, work / "to-clear", dirs_exist_ok=True)
                env = {"KERNEL_CACHE_DIR": str(work / "to-clear")}
            result = sh(newcomer, f"{cachectl}{command[len('cachectl'):]}", env=env, check=False)
            if command.startswith("cachectl tune") and result.returncode == 2 and "no CUDA GPU" in result.stderr:
                continue  # tuning times kernels: where JAX sees no GPU it says so (exit 2) and does nothing
            assert result.returncode in (0, 1) if " verify" in command else result.returncode == 0, \
                (command, result.stdout, result.stderr)
            shown_output = []
            for follow in lines[i + 1:]:
                if follow.startswith("$ ") or follow == "...":
                    break
                shown_output.append(follow)
            _same_shape(command, shown_output, result.stdout.splitlines())
            executed.append(command)
    assert len(executed) >= 12 and any(c.startswith("cachectl prewarm --arch") for c in executed), executed
    assert (work / "warm.kcb").is_file() and (work / "fresh" / "entries").is_dir()


def _same_shape(command: str, shown: list[str], real: list[str]) -> None:
    """The documented sample output against the real one: numbers, keys and times differ, the words
    and the layout do not."""
    if not shown:
        return
    def shape(line: str) -> str:
        line = re.sub(r"\b[0-9a-f]{12,32}\b", "KEY", line)
        line = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d", "TIME", line)
        line = re.sub(r"\d+(\.\d+)?", "N", line)
        return re.sub(r"\s+", " ", line).strip()
    if "list" in command.split()[:2] or command.startswith("cachectl list"):
        assert shape(real[0]) == shape(shown[0]), (command, real[0], shown[0])  # the header
        return
    real_shapes = [shape(line).split(" ")[0] for line in real]
    for line in shown:
        first = shape(line).split(" ")[0]
        assert first in real_shapes, (f"`{command}`: docs/cachectl.md shows '{line}', real output has no such line:\n"
                                      + "\n".join(real))
