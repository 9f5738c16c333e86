"""The README's Python example runs as written (cross-lowered for sm_90 on a CPU host), the README stays
a ten-minute read, and the README and docs/ link only to what exists."""

import json
import re
import subprocess
import sys
import tomllib
import unicodedata
from pathlib import Path

from conftest import ROOT, child_env, run_python
from packaging.specifiers import SpecifierSet
from packaging.version import Version

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_readme_jax_example_runs(tmp_path):
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Using it from JAX.*?```python\n(.*?)```", text, re.S).group(1)
    (tmp_path / "readme_example.py").write_text(block)
    out = run_python(f"import runpy; runpy.run_path({str(tmp_path / 'readme_example.py')!r})",
                     {"KERNEL_CACHE_DIR": str(tmp_path / "cache")})  # nothing else set: as a newcomer runs it
    assert "triton_kernel_call" in out.stdout


def test_readme_configuration_table_is_the_settings_table():
    from kernel_cache.settings.config import render_table

    assert render_table() in (ROOT / "README.md").read_text()


def test_the_readme_defaults_are_spelled_as_cachectl_config_prints_them():
    """Each default the configuration table writes as a value (`10m`, `256M`, `auto`) is the value
    `cachectl config` prints for that setting where nothing is set."""
    text = (ROOT / "README.md").read_text()
    written = {}
    for line in text.splitlines():
        if line.startswith("| `KERNEL_CACHE_"):
            values = re.findall(r"`([^`]+)`", line.rstrip(" |").rsplit(" | ", 1)[1])
            if values:
                written[line.split("`")[1]] = values[-1]
    proc = subprocess.run([sys.executable, "-m", "kernel_cache", "config", "--json"], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    printed = {row["variable"]: row["value"] for row in json.loads(proc.stdout)["settings"] if row["source"] == "default"}
    assert {"KERNEL_CACHE_LOCK_TIMEOUT", "KERNEL_CACHE_SOFT_LOCK_STALE", "KERNEL_CACHE_REMOTE_TTL"} <= written.keys()
    assert {name: printed.get(name) for name in written} == written


def test_pyprojects_python_bound_is_the_supported_pythons():
    """pyproject's requires-python admits exactly the Pythons of the README's "Supported versions" table,
    which the install section's "Python X to Y" spans."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("## Supported versions"):text.index("## Install into your environment")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines() if line.startswith("|")]
    column = rows[0].index("Python")
    supported = {row[column] for row in rows[2:]}
    bound = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    assert {f"3.{minor}" for minor in range(40) if f"3.{minor}" in bound} == supported, (str(bound), supported)
    low, high = re.search(r"\(Python (3\.\d+) to (3\.\d+)\)", text[text.index("## Install into"):]).groups()
    assert (low, high) == (min(supported, key=Version), max(supported, key=Version))


def test_every_warning_the_trust_model_explains_is_one_the_code_can_give():
    """docs/trust.md's 'warning starts with' table: each fragment of each quoted message (split at '…') is
    in the source of the core's messages, so a reworded warning cannot leave its explanation behind."""
    text = (ROOT / "docs" / "trust.md").read_text()
    table = text[text.index("| warning starts with |"):]
    rows = table.split("\n\n")[0].splitlines()[2:]  # to the table's end, or the page's
    # the core's source with implicitly joined string literals joined ("...a " f"b" -> "...a b")
    sources = "\n".join(re.sub(r'"\s*\n\s*f?"', "", p.read_text()) for p in (ROOT / "kernel_cache").rglob("*.py"))
    checked = 0
    for row in rows:
        for quoted in re.findall(r"`([^`]*)`", row.split("|")[1]):
            for fragment in (f.strip(" (") for f in quoted.split("…")):
                if len(fragment) > 3:
                    assert fragment in sources, (fragment, row[:80])
                    checked += 1
    assert checked >= 15


def test_the_readme_is_a_ten_minute_read():
    """At most 500 lines and 45 KB, no line over 200 characters. The one exception is the settings table,
    generated from kernel_cache/settings/config.py and kept verbatim (the test above): its rows are as long as
    their meanings."""
    from kernel_cache.settings.config import render_table

    path = ROOT / "README.md"
    text = path.read_text()
    generated = set(render_table().splitlines())
    assert len(text.splitlines()) <= 500, len(text.splitlines())
    assert path.stat().st_size <= 45 * 1024, path.stat().st_size
    long = [(n, line[:60]) for n, line in enumerate(text.splitlines(), 1) if len(line) > 200 and line not in generated]
    assert not long, long


def test_the_readme_keeps_the_two_commands_near_the_top():
    text = (ROOT / "README.md").read_text()
    two = text.index("## Two commands")
    block = re.search(r"```bash\n(.*?)```", text[two:], re.S).group(1)
    assert [line.split("#")[0].strip() for line in block.splitlines()] == ["scripts/demo.sh", "scripts/test.sh"]
    assert text[:two].count("\n## ") == 0 and len(text[:two].splitlines()) <= 40


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").strip().lower()
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # a '#' line in a code block is no heading
    seen: dict[str, int] = {}
    ids = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, re.M):
        anchor = github_anchor(heading)
        ids.add(f"{anchor}-{seen[anchor]}" if anchor in seen else anchor)
        seen[anchor] = seen.get(anchor, 0) + 1
    return ids


def test_github_anchor():
    assert github_anchor("cachectl — inspect, bound, verify and prewarm the cache") == \
        "cachectl--inspect-bound-verify-and-prewarm-the-cache"
    assert github_anchor("Already using jax-triton, ejKernel or TE?") == "already-using-jax-triton-ejkernel-or-te"
    assert github_anchor("`lowering.triton_call`") == "loweringtriton_call"
    assert github_anchor("Remote cache (Redis)") == "remote-cache-redis"


def test_every_relative_link_resolves():
    """Every relative link in README.md and docs/*.md names a file that exists and, with '#', a heading in it."""
    checked = 0
    for path in DOCUMENTS:
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        text = re.sub(r"`[^`\n]*`", "", text)  # code spans hold no links
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
                continue
            file, _, anchor = target.partition("#")
            linked = (path.parent / file).resolve() if file else path
            assert linked.is_file(), f"{path.relative_to(ROOT)} links to {target}: no such file"
            assert linked.is_relative_to(ROOT), f"{path.relative_to(ROOT)} links outside the repository: {target}"
            if anchor:
                assert anchor in anchors(linked), f"{path.relative_to(ROOT)} links to {target}: no such heading"
            checked += 1
    assert checked >= 30, checked
