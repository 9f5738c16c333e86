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
