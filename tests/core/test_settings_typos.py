"""A typo in a setting never breaks a program that ran without kernel-cache.

On the current stack (JAX 0.12, jax-triton 0.4.1) jax-triton's own path fails at trace time unless
the interception adapter mends its DCE rule, so the adapter mends it before anything can decline:
with KERNEL_CACHE_INTERCEPT=jax_triton and a malformed setting, a jax-triton program, unchanged,
cross-lowers for sm_90 in a fresh process on jax-triton's own path, and stderr holds one warning
naming the variable and its fix. Every malformed setting, `~user` paths included, is a one-line
ConfigError, and cachectl's exit 2.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT, child_env, needs_jax_triton_04

from kernel_cache import Config, ConfigError
from kernel_cache.settings.config import SETTINGS

# A jax-triton 0.4 program as its user runs it (the environment alone asks for interception), plus a
# report of what kernel-cache did: the calls' targets per program, or the error a program raised.
PROGRAM = f"""
import json, sys
sys.path[:0] = [{str(ROOT / "tests" / "support")!r}, {str(ROOT)!r}]
import jax
import jax_triton
import inspect_call
from scripts import jax_triton_04_programs
report = {{"programs": {{}}}}
for label, fn, args, _ in jax_triton_04_programs.programs(jax_triton, compute_capability=90):
    if label in ("inplace", "unused_result"):
        try:
            lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
        except Exception as exc:
            report["programs"][label] = f"{{type(exc).__name__}}: {{exc}}"[:800]
            continue
        report["programs"][label] = [call["target"] for call in inspect_call.custom_calls(lowered)]
import kernel_cache
from lowering.clients import tally
report["intercept"], report["tally"] = kernel_cache.interception.status(), tally()
print(json.dumps(report))
"""


def _key_file_0644(tmp_path) -> str:
    key = tmp_path / "team.key"
    key.write_text("an ordinary signing key of 32 bytes or more\n")
    key.chmod(0o644)
    return str(key)


# variable -> (its malformed value (tmp_path -> text), what the warning says to do)
MALFORMED = {
    "KERNEL_CACHE_SIGNING_KEY_FILE": (_key_file_0644, "chmod 600 "),
    "KERNEL_CACHE_MAX_BYTES": (lambda tmp_path: "lots", "examples: 4096, 512M, 10G"),
    "KERNEL_CACHE_INTERCEPT": (lambda tmp_path: "jax_triton,jax_trtion",
                               "expected a comma-separated list of jax_triton, ejkernel"),
    "KERNEL_CACHE_DIR": (lambda tmp_path: "~nosuchuser/cache", "write the path in full"),
}


@needs_jax_triton_04
@pytest.mark.parametrize("variable", MALFORMED)
def test_a_jax_triton_04_program_runs_on_its_own_path_with_one_warning(tmp_path, variable):
    value, fix = MALFORMED[variable]
    env = {"KERNEL_CACHE_INTERCEPT": "jax_triton", variable: value(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", PROGRAM], cwd=ROOT, env=child_env(**env), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    report = json.loads(proc.stdout)
    # jax-triton's own calls, each program lowered (no DCE TypeError), none served by kernel-cache
    assert report["programs"] == {"inplace": ["triton_kernel_call_ffi"], "unused_result": ["triton_kernel_call_ffi"]}
    assert report["tally"] == {}
    assert report["intercept"]["jax_triton"].startswith(f"declined: a malformed setting: {variable}")
    warnings = [line for line in proc.stderr.splitlines() if "KernelCacheWarning" in line]
    assert len(warnings) == 1, proc.stderr
    assert variable in warnings[0] and fix in warnings[0] and "correct it or unset it" in warnings[0], warnings[0]
    assert "jax_triton keeps its own compile path" in warnings[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("variable", ["KERNEL_CACHE_DIR", "KERNEL_CACHE_SHARED_DIR", "KERNEL_CACHE_SIGNING_KEY_FILE",
                                      "KERNEL_CACHE_REMOTE_PASSWORD_FILE"])
def test_a_path_of_a_user_who_does_not_exist_is_a_config_error(variable):
    with pytest.raises(ConfigError) as caught:
        Config.from_env({variable: "~nosuchuser/cache"})
    assert str(caught.value) == (f"{variable}='~nosuchuser/cache': '~nosuchuser' names no user with a home "
                                 f"directory here; write the path in full")
    with pytest.raises(ConfigError, match="^dir='~nosuchuser/x': "):
        Config(dir="~nosuchuser/x")


@pytest.mark.parametrize("variable", MALFORMED)
def test_cachectl_says_a_malformed_setting_in_one_line_and_exits_2(tmp_path, variable):
    value, fix = MALFORMED[variable]
    env = {"KERNEL_CACHE_DIR": str(tmp_path / "cache"), variable: value(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "kernel_cache", "stats"], cwd=ROOT, env=child_env(**env),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"cachectl: {variable}") and fix in proc.stderr, proc.stderr


UNFORESEEN = ["lots", "~nosuchuser/x", "-1", "9" * 400, "nan", "inf", "1e5", "0", "0x10", "1.5", "sm_", "a b",
              "redis://", "/dev/null", "/tmp/a\nb", "\udcff\udcfe" * 10, "x" * 5000]


@pytest.mark.parametrize("setting", SETTINGS, ids=[s.env for s in SETTINGS])
def test_every_setting_reads_or_refuses_in_one_line_naming_itself(setting):
    """Values its parser may not foresee (a number too large for a float, undecodable bytes, ...):
    either read, or a ConfigError in one line that names the variable, never another exception."""
    for value in UNFORESEEN:
        try:
            Config.from_env({setting.env: value})
        except ConfigError as exc:
            message = str(exc)
            assert "\n" not in message and setting.env in message, (value[:20], message[:300])


def test_a_program_that_imports_no_client_hears_nothing_of_a_misspelt_client():
    proc = subprocess.run([sys.executable, "-c", "pass"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=child_env(KERNEL_CACHE_INTERCEPT="jax_trtion"))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_importing_lowering_with_a_malformed_setting_defers_the_error_to_the_first_call():
    """An adapter imports `lowering` while its client loads: the import cannot raise; a program of
    kernel-cache's own gets the ConfigError where it first needs the configuration."""
    code = ("import lowering, kernel_cache\n"
            "try:\n    kernel_cache.current_config()\n"
            "except kernel_cache.ConfigError as exc:\n    print('ConfigError:', exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=child_env(KERNEL_CACHE_MAX_BYTES="lots"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ConfigError: KERNEL_CACHE_MAX_BYTES: cannot read 'lots' as a size"), proc.stdout
