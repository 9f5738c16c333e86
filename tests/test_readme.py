"""The README's Python example runs as written (cross-lowered for sm_90 on a CPU host)."""

import re

from conftest import ROOT, run_python


def test_readme_jax_example_runs(tmp_path):
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Using it from JAX.*?```python\n(.*?)```", text, re.S).group(1)
    (tmp_path / "readme_example.py").write_text(block)
    out = run_python(f"import runpy; runpy.run_path({str(tmp_path / 'readme_example.py')!r})",
                     {"KERNEL_CACHE_DIR": str(tmp_path / "cache")})  # nothing else set: as a newcomer runs it
    assert "triton_kernel_call" in out.stdout


def test_readme_configuration_table_is_the_settings_table():
    from kernel_cache.config import render_table

    assert render_table() in (ROOT / "README.md").read_text()


def test_every_warning_the_trust_model_explains_is_one_the_code_can_give():
    """The README's 'warning starts with' table: each fragment of each quoted message (split at '…') is
    in the source of the core's messages, so a reworded warning cannot leave its explanation behind."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("| warning starts with |"):]
    rows = table[:table.index("\n\n")].splitlines()[2:]
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
