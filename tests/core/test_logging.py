"""Logging that fits Python's: records always go to the `kernel_cache` logger; kernel-cache adds its
own stderr handler (and stops propagation) only when KERNEL_CACHE_LOG=info|debug asks for it.

Each case runs in a fresh interpreter (logging configuration is process-wide); one real compile
(the example add kernel) in the whole file.
"""

from __future__ import annotations

import logging
import re
import textwrap

import pytest
from conftest import run_python

import kernel_cache
from kernel_cache import Config

ADD = "add_kernel sm_90 warps=4 stages=3 ctas=1 BLOCK=1024"

COMPILE = textwrap.dedent("""
    import logging, sys
    if sys.argv[1:] == ["basic"]:
        logging.basicConfig(level=logging.INFO, format="ROOT %(name)s %(levelname)s %(message)s")
    elif sys.argv[1:] == ["basic-debug"]:
        logging.basicConfig(level=logging.DEBUG, format="ROOT %(name)s %(levelname)s %(message)s")
    import compiler
    from compiler.examples import add_kernel
    spec = compiler.make_spec(add_kernel, ["*fp32", "*fp32", 4096, "*fp32"], {"BLOCK": 1024}, target="sm_90")
    compiler.get_or_compile(spec)
    compiler.get_or_compile(spec)
    assert compiler.lookup(spec)[0] is not None
""")

# A store-only program: no Triton, a fake build.
LOOKUPS = textwrap.dedent("""
    import logging, sys
    if "basic" in sys.argv[1:]:
        logging.basicConfig(level=logging.INFO, format="ROOT %(name)s %(message)s")
    import kernel_cache
    store = kernel_cache.default_store()
    build = lambda: ({"name": "k"}, {"b": b"1"}, 0.1)
    store.get_or_create("0123456789abcdef" * 2, build, label=lambda: "my_kernel sm_90 warps=4")
    store.get_or_create("0123456789abcdef" * 2, build, label=lambda: "my_kernel sm_90 warps=4")
    assert store.lookup("0123456789abcdef" * 2, label="my_kernel") is not None
""")


def _run(code: str, env: dict | None = None, *args: str):
    return run_python(code if not args else f"import sys; sys.argv[1:] = {list(args)!r}\n" + code, env)


def _ours(text: str) -> list[str]:
    """kernel-cache's lines, printed by its handler ("kernel-cache ...") or by an application's handler
    whose format names the logger ("ROOT kernel_cache [level] ...", "kernel_cache ...")."""
    return [line for line in text.splitlines() if re.match(r"kernel-cache |(ROOT )?kernel_cache\S* ", line)]


def test_compile_at_debug_then_basicconfig_info_in_a_new_process(tmp_path):
    """KERNEL_CACHE_LOG=debug: every line once on stderr (a root handler too: no doubles), with the
    key summary of the compile and the lock wait; then in a new process plain
    logging.basicConfig(level=INFO) shows exactly one line per lookup, with kernel, arch and config."""
    env = {"KERNEL_CACHE_DIR": str(tmp_path / "cache")}
    err = _run(COMPILE, {**env, "KERNEL_CACHE_LOG": "debug"}, "basic-debug").stderr
    lines = _ours(err)
    assert not [line for line in lines if line.startswith("ROOT")], err  # not propagated to the root handler
    # each line once: the wait, the key summary and one line per lookup (two memory hits may print the
    # same text when their times round alike, so count lines rather than compare them)
    assert len(lines) == 5, err
    [summary] = [line for line in lines if " compiling " in line]
    assert ADD in summary and "key covers" in summary
    for part in ("kernel=add_kernel@", "signature=x_ptr:*fp32,y_ptr:*fp32,n:i32,out_ptr:*fp32", "target=cuda:90",
                 "options=#", "toolchain=#"):
        assert part in summary, summary
    [wait] = [line for line in lines if " wait " in line]
    assert "disk lock (acquired)" in wait and ADD in wait
    levels = [line.split()[2] for line in lines if line.startswith("kernel-cache ") and " ms  " in line
             and " wait " not in line]
    assert levels == ["compile", "memory", "memory"], err
    key = summary.split()[1]

    err = _run(COMPILE, env, "basic").stderr
    lines = _ours(err)
    assert len(lines) == 3, err
    for line, level in zip(lines, ("disk", "memory", "memory")):
        assert line.startswith("ROOT kernel_cache INFO "), line  # the application's format names the logger once
        assert "kernel-cache" not in line, line
        fields = line.split()
        assert fields[3] == key and fields[4] == level and fields[6] == "ms", line
        assert line.endswith("  " + ADD), line


def test_kernel_cache_log_info_prints_each_line_once_on_stderr(tmp_path):
    for args in ((), ("basic",)):  # alone, and next to a root handler that must not repeat it
        proc = _run(LOOKUPS, {"KERNEL_CACHE_LOG": "info"}, *args)
        lines = _ours(proc.stderr)
        assert proc.stdout == ""
        assert not [line for line in lines if line.startswith("ROOT")], proc.stderr
        assert [line.split()[2] for line in lines[1:]] == ["compile", "memory", "memory"], proc.stderr
        assert lines[0] == "kernel-cache " + kernel_cache.MEMORY_ONLY
        assert lines[1].startswith("kernel-cache 0123456789ab compile ")
        assert lines[1].endswith(" ms  my_kernel sm_90 warps=4") and lines[3].endswith(" ms  my_kernel")


@pytest.mark.parametrize("setting", [None, "off"])
def test_without_logging_configured_nothing_is_printed(tmp_path, setting):
    env = {"KERNEL_CACHE_DIR": str(tmp_path)} if setting is None else {"KERNEL_CACHE_LOG": setting}
    proc = _run(LOOKUPS, env)
    assert proc.stderr == "" and proc.stdout == ""


def test_off_leaves_the_logger_to_the_application():
    proc = _run(LOOKUPS, {"KERNEL_CACHE_LOG": "off"}, "basic")
    lines = _ours(proc.stderr)
    assert len(lines) == 4 and all(line.startswith("ROOT kernel_cache ") for line in lines), proc.stderr


def test_memory_only_line_once_from_the_process_store_only(tmp_path):
    code = textwrap.dedent("""
        import logging
        logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
        import kernel_cache
        kernel_cache.Store(kernel_cache.Config())  # explicit stores say nothing
        print("explicit done", flush=True)
        kernel_cache.default_store()
        kernel_cache.configure()
        kernel_cache.current_config()
    """)
    proc = _run(code)
    assert _ours(proc.stderr) == ["kernel_cache " + kernel_cache.MEMORY_ONLY]
    assert _ours(_run(code, {"KERNEL_CACHE_DIR": str(tmp_path)}).stderr) == []
    assert _ours(_run(code, {"KERNEL_CACHE_DISABLE": "1"}).stderr) == []


def test_warnings_name_kernel_cache_and_show_no_internal_source(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code = textwrap.dedent(f"""
        import kernel_cache
        kernel_cache.Store(kernel_cache.Config(dir={str(blocker / "cache")!r}))
    """)
    err = _run(code).stderr
    assert err.startswith("kernel-cache:0: KernelCacheWarning: cannot use cache directory"), err
    assert len(err.splitlines()) == 1, err  # no source line of ours under it
    filtered = "import warnings; warnings.filterwarnings('ignore', module='kernel_cache')\n" + code
    assert _run(filtered).stderr == ""


def test_configure_adds_and_removes_its_handler():
    logger = logging.getLogger("kernel_cache")

    def ours():
        return [h for h in logger.handlers if getattr(h, "_kernel_cache", False)]

    try:
        kernel_cache.configure(Config(log="debug"))
        kernel_cache.configure(Config(log="info"))
        assert len(ours()) == 1 and logger.level == logging.INFO and logger.propagate is False
        kernel_cache.configure(Config(log="off"))
        assert ours() == [] and logger.level == logging.NOTSET and logger.propagate is True
    finally:
        for handler in ours():
            logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
        logger.propagate = True
        kernel_cache.configure()
