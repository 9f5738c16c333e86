"""What cachectl says when it cannot do what was asked, read as a user reads it: `python -m cachectl`
in a child process, its exit code and its whole stderr. Each message is one `cachectl:` line that
names what the user wrote (the flag or the variable, as spelled) and what to do, never a traceback,
Python's warning layout, or a suggestion that then fails. No kernel is compiled here."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys

import pytest
from conftest import ROOT, child_env
from redis_server import RedisServer, free_port

from kernel_cache import Config, Entry, Store

needs_redis = pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed")
UNREACHABLE_FIX = "fix: check the host, port and firewall, and that redis-server runs"
PASSWORD_FIX = "fix: check KERNEL_CACHE_REMOTE_PASSWORD_FILE (or the URL's user:password)"


def cachectl(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in child_env().items() if not k.startswith("KERNEL_CACHE_")}
    return subprocess.run([sys.executable, "-m", "cachectl", *map(str, args)], cwd=ROOT, env={**full, **(env or {})},
                          capture_output=True, text=True, timeout=120)


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The one line cachectl wrote on stderr, checked to be its own and nothing else."""
    assert proc.stderr.count("\n") == 1 and proc.stderr.endswith("\n"), proc.stderr
    assert proc.stderr.startswith("cachectl: ") and "Traceback" not in proc.stderr, proc.stderr
    assert "KernelCacheWarning" not in proc.stderr and "meanwhile" not in proc.stderr, proc.stderr
    return proc.stderr.rstrip("\n")


@pytest.fixture
def cache(tmp_path):
    """A local cache directory with nothing in it yet."""
    Store(Config(dir=tmp_path / "cache")).close()
    return tmp_path / "cache"


# A malformed remote URL, from the flag or the variable --------------------------------------------
BAD_URLS = {
    "redis://127.0.0.1:99999/0": "the port must be a number from 1 to 65535 (given: '99999')",
    "http://127.0.0.1:6379/0": "no Redis URL (redis://host:port/db, rediss:// for TLS, unix:///path/redis.sock)",
    "redis//127.0.0.1:6379/0": "no Redis URL (redis://host:port/db, rediss:// for TLS, unix:///path/redis.sock)",
    "redis://127.0.0.1:port/0": "the port must be a number from 1 to 65535 (given: 'port')",
    "redis://127.0.0.1:6379/zero": "the database after the host must be a number (given: 'zero')",
}
COMMANDS = [["list"], ["doctor"], ["config"], ["stats"], ["clear", "--yes"], ["prewarm"]]


def _bad_remote(url: str, command: list[str], source: str, cache) -> subprocess.CompletedProcess[str]:
    if source == "--remote":
        return cachectl("--dir", cache, *command, "--remote", url)
    return cachectl("--dir", cache, *command, env={"KERNEL_CACHE_REMOTE": url})


@pytest.mark.parametrize("source", ["--remote", "KERNEL_CACHE_REMOTE"])
@pytest.mark.parametrize("url", sorted(BAD_URLS))
def test_a_malformed_remote_url_is_one_line_naming_where_it_was_written(url, source, cache):
    proc = _bad_remote(url, ["list"], source, cache)
    assert proc.returncode == 2 and proc.stdout == ""
    assert one_line(proc) == f"cachectl: {source}: '{url}': {BAD_URLS[url]}"


@pytest.mark.parametrize("source", ["--remote", "KERNEL_CACHE_REMOTE"])
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_refuses_a_malformed_remote_url_alike(command, source, cache):
    url = "redis://127.0.0.1:99999/0"
    proc = _bad_remote(url, command, source, cache)
    assert proc.returncode == 2 and proc.stdout == ""
    assert one_line(proc) == f"cachectl: {source}: '{url}': {BAD_URLS[url]}"


def test_the_flag_replaces_a_malformed_variable(cache):
    """--remote stands for KERNEL_CACHE_REMOTE, as --dir does for KERNEL_CACHE_DIR: the variable is not read."""
    proc = cachectl("--dir", cache, "config", "--json", "--remote", "redis://127.0.0.1:6379/0",
                    env={"KERNEL_CACHE_REMOTE": "http://elsewhere"})
    assert proc.returncode == 0 and proc.stderr == ""
    rows = {r["variable"]: r for r in json.loads(proc.stdout)["settings"]}
    assert rows["KERNEL_CACHE_REMOTE"]["value"] == "redis://127.0.0.1:6379/0"


# A remote that does not answer --------------------------------------------------------------------
def _doctor_fix(url: str) -> str:
    proc = cachectl("doctor", "--json", "--remote", url, env={"KERNEL_CACHE_REMOTE_UNSIGNED": "1"})
    assert proc.returncode == 1 and proc.stderr == "", proc.stderr  # no warning line beside the report
    checks = json.loads(proc.stdout)["checks"]
    return "fix: " + next(c["fix"] for c in checks if c["check"] == "remote")


def test_an_unreachable_remote_is_one_cachectl_line_with_doctors_fix(cache):
    url = f"redis://127.0.0.1:{free_port()}/0"  # a port nothing listens on
    env = {"KERNEL_CACHE_REMOTE_UNSIGNED": "1"}
    listed = cachectl("--dir", cache, "--remote", url, "list", env=env)
    assert listed.returncode == 1
    line = one_line(listed)
    assert line.startswith(f"cachectl: the remote level was not listed: remote cache {url}: no node answered (")
    assert "Connection refused" in line and line.endswith(f"; {UNREACHABLE_FIX}") and "try again" not in line
    cleared = cachectl("--remote", url, "clear", "--yes", "--level", "remote", env=env)
    assert cleared.returncode == 1
    line = one_line(cleared)
    assert line.startswith(f"cachectl: remote cache {url}: ") and line.endswith(f"; {UNREACHABLE_FIX}")
    assert _doctor_fix(url) == UNREACHABLE_FIX


@needs_redis
def test_a_wrong_password_is_one_cachectl_line_with_doctors_fix(tmp_path, cache):
    server = RedisServer(tmp_path)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as conn:
            conn.sendall(b"CONFIG SET requirepass right-password-123\r\n")
            assert conn.recv(16).startswith(b"+OK")
        url = f"redis://:wrong-password-456@127.0.0.1:{server.port}/0"
        env = {"KERNEL_CACHE_REMOTE_UNSIGNED": "1"}
        for command in (["list"], ["stats"], ["verify"]):
            proc = cachectl("--dir", cache, "--remote", url, *command, env=env)
            assert proc.returncode == 1, (command, proc.stderr)
            line = one_line(proc)
            assert "AuthenticationError" in line and line.endswith(f"; {PASSWORD_FIX}"), line
            assert "try again" not in line and "wrong-password-456" not in line
        assert _doctor_fix(url) == PASSWORD_FIX
    finally:
        server.stop()


# A kernel defined in a script ---------------------------------------------------------------------
@pytest.fixture
def script_kernel_cache(cache):
    """Three entries of the example add kernel as a script records it (`__main__:add_kernel`), built
    by the installed toolchain: what running the README's example leaves in a cache."""
    from compiler import parse_target, to_recipe
    from compiler.examples import example_specs
    from compiler.toolchain import toolchain_summary

    target = parse_target("sm_90")
    recipe = {**to_recipe(dict(example_specs("sm_90"))["add"]), "kernel": "__main__:add_kernel"}
    meta = {"kind": "triton-kernel", "name": "add_kernel", "arch": "sm_90", "target": dict(target.json),
            "toolchain": {"summary": toolchain_summary(target, cache)}}
    store = Store(Config(dir=cache))
    for warps in (2, 4, 8):
        key = f"{warps:02x}" * 16
        entry = Entry(key, {**meta, "recipe": {**recipe, "num_warps": warps}}, {"ptx": b"// ptx"})
        store.disk.put_raw(key, store.encode(entry))
    store.close()
    return cache


SCRIPT_REASON = ("__main__:add_kernel is defined in a script, which no import finds again: only kernels defined in "
                 "an importable module (installed, or on PYTHONPATH) can be prewarmed or rebuilt; move it into one "
                 "and import it from the script")


@pytest.mark.parametrize("allow", [[], ["--allow-module", "__main__"], ["--allow-module", "*"]], ids=str)
def test_verify_rebuild_says_a_script_kernel_cannot_be_rebuilt_and_suggests_no_allow_module(script_kernel_cache, allow):
    proc = cachectl("--dir", script_kernel_cache, "verify", "--rebuild", *allow)
    assert proc.returncode == 0
    assert proc.stderr == f"SKIPPED  3 entries: {SCRIPT_REASON}\n"
    assert "--allow-module" not in proc.stdout and "3 kernel not importable" in proc.stdout, proc.stdout


@pytest.mark.parametrize("allow", [[], ["--allow-module", "__main__"]], ids=str)
def test_prewarm_says_a_script_kernel_cannot_be_prewarmed_and_suggests_no_allow_module(script_kernel_cache, allow):
    proc = cachectl("--dir", script_kernel_cache, "prewarm", "--arch", "sm_80", "-j", "1", *allow)
    assert proc.returncode == 0
    assert proc.stderr == f"SKIPPED  3 recipe build(s): {SCRIPT_REASON}\n"
    assert "--allow-module" not in proc.stdout and "skipped 3 (kernel not importable)" in proc.stdout, proc.stdout


def test_the_readme_says_where_a_kernel_must_live_to_be_prewarmed():
    readme = (ROOT / "README.md").read_text()
    example = readme[readme.index("## Using it from JAX"):readme.index("## Already using")]
    said = " ".join(example.split())
    assert re.search(r"cachectl prewarm[^.]*only kernels defined in an importable module[^.]*can be prewarmed", said)


# Levels named as typed, and how to configure the one asked for -----------------------------------
@pytest.mark.parametrize("flag", ["--level", "--tier", "--lev"])
def test_an_unknown_level_is_named_by_the_flag_as_typed(cache, flag):
    proc = cachectl("--dir", cache, "clear", "--yes", flag, "bogus")
    assert proc.returncode == 2 and proc.stdout == ""
    named = "--level" if flag == "--lev" else flag  # an abbreviation: the option it stands for
    assert one_line(proc) == (f"cachectl: unknown value for {named} 'bogus'; one of: disk, shared, remote "
                              f"(see 'cachectl clear --help')")


@pytest.mark.parametrize("level, how", [("remote", "pass --remote URL or set KERNEL_CACHE_REMOTE"),
                                        ("shared", "pass --shared-dir DIR or set KERNEL_CACHE_SHARED_DIR")])
def test_a_level_not_configured_is_configured_by_its_own_option(cache, level, how):
    proc = cachectl("--dir", cache, "clear", "--yes", "--level", level)
    assert proc.returncode == 2 and proc.stdout == ""
    assert one_line(proc) == f"cachectl: no {level} level configured ({how})"


# --dir naming no cache directory --------------------------------------------------------------------
def test_a_missing_cache_directory_says_what_creates_one(tmp_path):
    missing = tmp_path / "new-cache"
    proc = cachectl("--dir", missing, "list")
    assert proc.returncode == 2 and proc.stdout == ""
    assert one_line(proc) == (f"cachectl: no cache directory at {missing}: a program run with "
                              f"KERNEL_CACHE_DIR={missing} creates it at its first cached kernel call, as "
                              f"'cachectl prewarm' and 'cachectl import' with --dir do")
    assert not missing.exists()
    made = cachectl("--dir", missing, "prewarm", "-j", "1")  # as the line says: prewarm creates it
    assert made.returncode == 0 and cachectl("--dir", missing, "list").returncode == 0


def test_a_plain_file_given_as_the_cache_directory_is_said_to_be_no_directory(tmp_path):
    plain = tmp_path / "cache.txt"
    plain.write_text("notes")
    for command in (["list"], ["prewarm"]):
        proc = cachectl("--dir", plain, *command)
        assert proc.returncode == 2 and proc.stdout == ""
        assert one_line(proc) == f"cachectl: {plain} is not a directory: name the cache directory (--dir DIR or KERNEL_CACHE_DIR)"
    assert plain.read_text() == "notes"


# tune's argument ------------------------------------------------------------------------------------
@pytest.mark.parametrize("program", ["mymodel", "mymodel:", ":tuned_calls", "jobs/train.py:tuned_calls"])
def test_tune_checks_its_argument_form_before_looking_for_a_gpu(tmp_path, program):
    proc = cachectl("--dir", tmp_path / "cache", "tune", program)
    assert proc.returncode == 2 and proc.stdout == ""
    line = one_line(proc)
    assert line.startswith("cachectl: argument MODULE:FUNCTION: expected a function in an importable module, as "
                           "MODULE:FUNCTION (e.g. myjob.programs:tuned_calls")
    assert line.endswith(f"got '{program}' (see 'cachectl tune --help')") and "GPU" not in line
    assert ("not a file path" in line) == program.endswith(".py:tuned_calls")
    assert not (tmp_path / "cache").exists()
