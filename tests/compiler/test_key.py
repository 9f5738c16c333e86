"""The content key: stable across processes, different whenever the binary could differ."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import textwrap

import pytest
from conftest import run_python

import kernel_cache
from compiler import content_key, key_document, make_spec, toolchain
from compiler.examples import add_kernel, layernorm_kernel
from kernel_cache.bounded_memo import BoundedMemo
from kernel_cache.entries.canonical import digest

_counter = itertools.count()

KERNEL_MODULE = """
import triton
import triton.language as tl

FACTOR = tl.constexpr({factor})

@triton.jit
def helper(x):
    return x * {helper_mult}

@triton.jit
def kern(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(x_ptr + offs, helper(x) * FACTOR, mask=offs < n)
"""


def _load_kernel(tmp_path, factor="2.0", helper_mult="3.0"):
    name = f"kc_key_mod_{next(_counter)}"
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(KERNEL_MODULE.format(factor=factor, helper_mult=helper_mult)))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.kern


def _key(kernel, **kw):
    args = kw.pop("args", ["*fp32", 4096])
    return content_key(make_spec(kernel, args, {"BLOCK": kw.pop("BLOCK", 128)}, target=kw.pop("target", "sm_90"),
                                 **kw))


def test_same_inputs_same_key_and_key_is_128_bit_hex(tmp_path):
    k = _load_kernel(tmp_path)
    assert _key(k) == _key(k)
    assert len(_key(k)) == 32 and int(_key(k), 16) >= 0


def test_key_changes_when_a_called_jit_function_changes(tmp_path):
    assert _key(_load_kernel(tmp_path, helper_mult="3.0")) != _key(_load_kernel(tmp_path, helper_mult="4.0"))


def test_key_changes_when_a_global_constexpr_changes(tmp_path):
    assert _key(_load_kernel(tmp_path, factor="2.0")) != _key(_load_kernel(tmp_path, factor="2.5"))


def test_identical_source_in_two_modules_gives_the_same_key(tmp_path):
    assert _key(_load_kernel(tmp_path)) == _key(_load_kernel(tmp_path))


@pytest.mark.parametrize("change", [
    {"num_warps": 8}, {"num_stages": 2}, {"num_ctas": 2}, {"BLOCK": 256}, {"target": "sm_80"},
    {"args": ["*fp16", 4096]}, {"args": ["*fp32", 4097]}, {"args": ["*fp32", 1]},
    {"enable_fp_fusion": False}, {"debug": True}, {"maxnreg": 128},
])
def test_key_changes_with_every_launch_parameter_and_option(tmp_path, change):
    k = _load_kernel(tmp_path)
    assert _key(k) != _key(k, **change)


def test_scalar_values_with_the_same_specialization_share_a_key():
    def key(n, eps):
        return content_key(make_spec(layernorm_kernel, ["*fp32"] * 3 + [n, eps, "*fp32"], {"BLOCK": 64},
                                     target=90))

    assert key(4096, 1e-5) == key(8192, 1e-6)  # both 16-divisible ints; floats are never specialized
    assert key(4096, 1e-5) != key(4097, 1e-5)


def test_key_changes_with_a_cache_invalidating_env_var(monkeypatch):
    spec = make_spec(add_kernel, ["*fp32", "*fp32", 64, "*fp32"], {"BLOCK": 64}, target=90)
    before = content_key(spec)
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")
    assert key_document(spec)["toolchain"]["env"] == {"TRITON_DEFAULT_FP_FUSION": "false"}
    assert content_key(spec) != before


def test_key_changes_with_a_variable_set_behind_os_environ(monkeypatch):
    """Triton reads its variables with C getenv: a change os.environ does not see (os.putenv, a
    native library's setenv) is a new key too, though the environment's read is memoized."""
    spec = make_spec(add_kernel, ["*fp32", "*fp32", 64, "*fp32"], {"BLOCK": 64}, target=90)
    monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION", raising=False)
    before = content_key(spec)
    try:
        os.putenv("TRITON_DEFAULT_FP_FUSION", "0")
        assert "TRITON_DEFAULT_FP_FUSION" not in os.environ
        assert key_document(spec)["toolchain"]["env"] == {"TRITON_DEFAULT_FP_FUSION": "false"}
        assert content_key(spec) != before
    finally:
        os.unsetenv("TRITON_DEFAULT_FP_FUSION")
    assert content_key(spec) == before


def test_key_changes_with_the_toolchain(monkeypatch):
    spec = make_spec(add_kernel, ["*fp32", "*fp32", 64, "*fp32"], {"BLOCK": 64}, target=90)
    before, tools = content_key(spec), toolchain.installed_tools(spec.target)
    for field, value in [("triton_version", "9.9.9"), ("triton_build", "0" * 64), ("backend", "ptxas 99")]:
        monkeypatch.setattr(toolchain, "installed_tools", lambda *_, changed={**tools, field: value}: changed)
        monkeypatch.setattr(toolchain, "generation", toolchain.generation + 1)  # the tools read anew
        assert content_key(spec) != before


def test_key_is_equal_across_processes_and_the_warm_path_skips_triton_key_and_ptxas(tmp_path):
    code = textwrap.dedent("""
        import json, subprocess, sys
        spawned = []
        _popen = subprocess.Popen.__init__
        def _counting_init(self, args, *a, **k):
            spawned.append(str(args))
            return _popen(self, args, *a, **k)
        subprocess.Popen.__init__ = _counting_init  # ptxas --version would show up here
        import compiler.triton_compat as tc
        expensive = {"triton_key": 0, "backend_hash": 0}
        def counting(name, fn):
            def wrapper(*a, **k):
                expensive[name] += 1
                return fn(*a, **k)
            return wrapper
        tc.triton_build_key = counting("triton_key", tc.triton_build_key)
        tc.backend_toolchain_hash = counting("backend_hash", tc.backend_toolchain_hash)
        from compiler import content_key, make_spec, toolchain
        from compiler.examples import add_kernel
        key = content_key(make_spec(add_kernel, ["*fp32", "*fp32", 4096, "*fp32"], {"BLOCK": 1024}, target="sm_90"))
        from triton.runtime.driver import driver
        print(json.dumps({"key": key, "expensive": expensive, "spawned": spawned,
                          "driver": driver._active is not None or driver._default is not None}))
    """)
    env = {"KERNEL_CACHE_DIR": str(tmp_path / "cache")}
    first = json.loads(run_python(code, env).stdout.strip().splitlines()[-1])
    second = json.loads(run_python(code, env).stdout.strip().splitlines()[-1])
    here = content_key(make_spec(add_kernel, ["*fp32", "*fp32", 4096, "*fp32"], {"BLOCK": 1024}, target="sm_90"))
    assert first["key"] == second["key"] == here
    assert first["expensive"] == {"triton_key": 1, "backend_hash": 1}  # cold: computed once, memoized
    assert second["expensive"] == {"triton_key": 0, "backend_hash": 0}  # warm: neither runs
    assert not second["driver"]  # no GPU driver initialised to compute a key
    assert second["spawned"] == [] and any("ptxas" in p for p in first["spawned"])


def test_memo_is_recomputed_when_the_toolchain_files_change(tmp_path, monkeypatch):
    import compiler.triton_compat as tc

    toolchain.clear_process_memo()
    memo_dir = tmp_path / "memo"
    spec = make_spec(add_kernel, ["*fp32", "*fp32", 64, "*fp32"], {"BLOCK": 64}, target=90)
    calls, real_key = [], tc.triton_build_key
    monkeypatch.setattr(tc, "triton_build_key", lambda *a: calls.append(1) or real_key(*a))
    toolchain.toolchain_fingerprint(spec.target, memo_dir)
    assert len(calls) == 1
    toolchain.clear_process_memo()
    toolchain.toolchain_fingerprint(spec.target, memo_dir)
    assert len(calls) == 1  # served by the memo file
    real = toolchain._triton_identity
    monkeypatch.setattr(toolchain, "_triton_identity", lambda: real() + ["reinstalled"])
    toolchain.clear_process_memo()
    toolchain.toolchain_fingerprint(spec.target, memo_dir)
    assert len(calls) == 2


def test_toolchain_summary_ignores_the_environment_but_the_key_does_not(monkeypatch):
    spec = make_spec(add_kernel, ["*fp32", "*fp32", 64, "*fp32"], {"BLOCK": 64}, target=90)
    summary, key = toolchain.toolchain_summary(spec.target), content_key(spec)
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")
    assert toolchain.toolchain_summary(spec.target) == summary  # cachectl --stale must not depend on TRITON_*
    assert content_key(spec) != key


def test_no_home_directory_means_a_process_only_memo(monkeypatch):
    from pathlib import Path

    for name in ("KERNEL_CACHE_DIR", "XDG_CACHE_HOME", "HOME"):
        monkeypatch.delenv(name, raising=False)

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    import kernel_cache

    try:
        kernel_cache.configure()  # the process configuration is read from the environment once
        assert kernel_cache.current_config().memo_dir is None
        monkeypatch.setenv("KERNEL_CACHE_DISABLE", "1")
        monkeypatch.setenv("KERNEL_CACHE_DIR", "/nonexistent")
        kernel_cache.configure()
        assert kernel_cache.current_config().memo_dir is None
        monkeypatch.delenv("KERNEL_CACHE_DISABLE")
        monkeypatch.delenv("KERNEL_CACHE_DIR")
        kernel_cache.configure()
        toolchain.clear_process_memo()
        spec = make_spec(add_kernel, ["*fp32", "*fp32", 64, "*fp32"], {"BLOCK": 64}, target=90)
        assert len(content_key(spec)) == 32  # computed, memoized in this process only
    finally:
        monkeypatch.undo()
        kernel_cache.configure()


def test_the_memoized_key_is_the_whole_documents_digest(example_specs_sm90):
    """content_key with a session's memo hashes the key document once per spec and toolchain: the key
    is the digest of the whole document, for every example spec, other targets and options, on a
    miss and on the hit after it."""
    import compiler.key as ck
    from compiler import make_spec
    from compiler.examples import add_kernel

    specs = list(example_specs_sm90.values()) + [
        make_spec(add_kernel, ["*fp16", "*fp16", 7, "*fp16"], {"BLOCK": 64}, target="sm_80", num_warps=2,
                  enable_fp_fusion=False),
        make_spec(add_kernel, ["*fp32", "*fp32", 4096, "*fp32"], {"BLOCK": 256}, target="gfx942", num_warps=8)]
    keys: ck.KeyMemo = BoundedMemo.of(64)
    for spec in specs:
        whole = digest(ck.key_document(spec))
        assert ck.content_key(spec, keys=keys) == whole == ck.content_key(spec, keys=keys) == ck.content_key(spec)
    assert len(keys) == len(specs)


def test_a_spec_is_equal_and_hashed_by_its_canonical_text():
    def spec(**kw):
        return make_spec(add_kernel, ["*fp32", "*fp32", kw.pop("n", 4096), "*fp32"], {"BLOCK": 64}, target=90, **kw)

    a, b = spec(), spec()
    assert a is not b and a == b and hash(a) == hash(b) and a.canonical_text == b.canonical_text
    assert a.canonical_text is a.canonical_text  # built once
    for other in (spec(num_warps=8), spec(n=4097), spec(enable_fp_fusion=False), spec(keep_ir=True),
                  make_spec(add_kernel, ["*fp32", "*fp32", 4096, "*fp32"], {"BLOCK": 64}, target=80)):
        assert other != a and other.canonical_text != a.canonical_text
    keys = BoundedMemo.of(64)
    content_key(a, keys=keys)
    content_key(b, keys=keys)
    assert len(keys) == 1  # one spec, one memo entry


def test_content_key_takes_its_memo_and_never_looks_the_session_up(monkeypatch):
    spec = make_spec(add_kernel, ["*fp32", "*fp32", 64, "*fp32"], {"BLOCK": 64}, target=90)
    monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION", raising=False)
    expected = content_key(spec)  # the installed tools read once per process: never again below

    def no_session():
        raise AssertionError("compiler.key looked the session up")

    monkeypatch.setattr(kernel_cache, "current_session", no_session)
    keys = BoundedMemo.of(64)
    assert content_key(spec) == content_key(spec, keys) == expected
    assert list(keys.values()) == [expected]
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")
    assert content_key(spec, keys) != expected
    assert len(keys) == 2  # the toolchain as it is now is part of the memo's key
