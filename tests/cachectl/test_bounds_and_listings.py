"""A cachectl that tells the truth.

1. What the user can do and what cachectl could not reach: a shared directory the user can write is
   writable (text, JSON, the Prometheus gauge), an unreachable remote is a row saying so (exit 1), and
   doctor and stats say one size.
2. A bound stored with the cache (`cachectl config max-size SIZE`, as `ccache -M`): shown with where it
   came from, honoured by every store on that directory unless KERNEL_CACHE_MAX_BYTES is set, enforced by
   a plain `cachectl prune`; a refused file is one warning for a program and exit 2 for cachectl.
3. `cachectl list` tells entries apart: the six configs of one autotuned kernel are six different
   CONFIG cells; LAST USED to the second in -v and JSON.

Caches here hold synthetic entries (their metadata as the compiler writes it; the matmul's recipes are
the compiler's own, made from its example specs without compiling); nothing is compiled.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
import warnings
from pathlib import Path

import pytest
from test_cachectl import as_json, cachectl, ok
from test_shared_level import mounted

from cachectl.render import human_size
from kernel_cache import Config, Store, configure
from kernel_cache.entries.entry import Entry
from kernel_cache.entries.summary import USUAL_OPTIONS
from kernel_cache.settings import cache_settings
from kernel_cache.telemetry.warnings_once import KernelCacheWarning

DEAD_REMOTE = "redis://127.0.0.1:9/0"  # the discard port: nothing listens there
TOOLCHAIN = {"summary": "triton-0.0.0+000000000000"}


pytestmark = pytest.mark.usefixtures("fresh_warnings")  # each test's warnings said afresh (conftest)


def kernel_meta(name: str = "add_kernel", *, recipe: dict | None = None, warps: int = 4, stages: int = 3,
                toolchain: dict | None = None) -> dict:
    """Metadata as compiler.artifact writes it (the fields listings read)."""
    return {"kind": "triton-kernel", "name": name, "arch": "sm_90", "num_warps": warps, "num_stages": stages,
            "num_ctas": 1, "target": {"backend": "cuda", "arch": 90, "warp_size": 32},
            "toolchain": toolchain or TOOLCHAIN, "compile_seconds": 0.25, "created": time.time(), "recipe": recipe}


def fill(directory: Path, count: int, size: int = 100_000, **config) -> list[str]:
    """`count` kernel entries of about `size` bytes each; their keys, oldest use first."""
    store = Store(Config(dir=directory, **config))
    keys = [f"{n + 1:032x}" for n in range(count)]
    for key in keys:
        store.put(Entry(key=key, meta=kernel_meta(f"k{key[-4:]}"), blobs={"cubin": os.urandom(size)}))
    store.close()
    now = time.time()
    for age, key in enumerate(reversed(keys)):
        used = now - 3600 * (age + 1)
        os.utime(directory / "entries" / key[:2] / key, (used, used))
    return keys


def prometheus_value(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(f"kernel_cache_{name}{{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


# 1. What the user can do, what cachectl could not reach, one size -------------------------------------
def test_a_shared_directory_the_user_can_write_is_writable_in_text_json_and_prometheus(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    fill(tmp_path / "local", 2, size=1000, shared_dir=shared)  # entries in both levels
    both = ("--dir", tmp_path / "local", "--shared-dir", shared)
    levels = as_json(*both, "stats")["levels"]
    assert levels["shared"]["writable"] is True and levels["disk"]["writable"] is True
    assert levels["shared"]["entries"] == 2 and levels["shared"]["reachable"] is True
    text = ok(*both, "stats").stdout
    assert re.search(r"^shared entries +2 \([^)]*\) in ", text, re.M) and "read-only here" not in text, text
    prom = ok(*both, "stats", "--format", "prometheus").stdout
    assert prometheus_value(prom, "level_writable", level="shared") == 1
    assert prometheus_value(prom, "level_writable", level="disk") == 1

    with mounted("--bind", "-o", "ro", str(shared), str(tmp_path / "ro")) as ro:  # and one nobody can write
        if os.access(ro, os.W_OK):
            pytest.skip("this machine's bind mount is not read-only")
        assert as_json("--dir", tmp_path / "local", "--shared-dir", ro, "stats")["levels"]["shared"]["writable"] is False
        text = ok("--dir", tmp_path / "local", "--shared-dir", ro, "stats").stdout
        assert re.search(r"^shared entries +2 \(.*, read-only here\)", text, re.M), text


def test_stats_gives_an_unreachable_remote_its_own_row_and_exits_1(tmp_path):
    fill(tmp_path / "local", 3, size=1000)
    where = ("--dir", tmp_path / "local", "--remote", DEAD_REMOTE)
    env = {"KERNEL_CACHE_REMOTE_UNSIGNED": "1"}
    text = cachectl(*where, "stats", env=env)
    assert text.returncode == 1, text
    assert re.search(r"^remote entries +unreachable: remote cache ", text.stdout, re.M), text.stdout
    assert re.search(r"^disk entries +3 \(", text.stdout, re.M) and "0 entries" not in text.stdout
    assert "remote cache" in text.stderr

    doc = json.loads(cachectl(*where, "stats", "--json", env=env).stdout)
    remote = doc["levels"]["remote"]
    assert remote["reachable"] is False and remote["entries"] is None and remote["bytes"] is None
    assert "remote cache" in remote["error"] and doc["exit_code"] == 1 and doc["error"]
    assert doc["levels"]["disk"]["entries"] == 3 and doc["levels"]["disk"]["reachable"] is True

    # the textfile collector's file is replaced and says so, rather than keeping the last numbers
    prom = cachectl(*where, "stats", "--format", "prometheus", env=env)
    assert prom.returncode == 0, prom
    assert prometheus_value(prom.stdout, "level_reachable", level="remote") == 0
    assert prometheus_value(prom.stdout, "level_reachable", level="disk") == 1
    assert prometheus_value(prom.stdout, "entries", level="remote") is None
    assert prometheus_value(prom.stdout, "entries", level="disk") == 3

    listed = cachectl(*where, "list", "--level", "remote", env=env)  # the level's own commands fail (done before)
    assert listed.returncode == 1 and "remote cache" in listed.stderr and "0 entries" not in listed.stdout


def test_doctor_stats_and_list_say_one_size(tmp_path):
    directory = tmp_path / "cache"
    fill(directory, 3, size=50_000)
    stats = as_json("--dir", directory, "stats")
    size = stats["levels"]["disk"]["bytes"]
    assert size == sum(r["size_bytes"] for r in as_json("--dir", directory, "list"))
    assert ok("--dir", directory, "list").stdout.splitlines()[-1].endswith(human_size(size))
    doctor = json.loads(cachectl("--dir", directory, "doctor", "--json").stdout)
    sized = next(c for c in doctor["checks"] if c["check"] == "cache-size")
    assert sized["status"] == "ok" and sized["detail"].startswith(f"3 entries, {human_size(size)} of "), sized


# 2. The bound stored with the cache -----------------------------------------------------------------------
def test_config_max_size_stores_the_bound_and_config_says_where_it_came_from(tmp_path):
    directory = tmp_path / "cache"
    fill(directory, 1, size=1000)
    said = ok("--dir", directory, "config", "max-size", "300K").stdout
    assert "stored max size 300.0 KiB" in said and "cachectl prune" in said
    stored = directory / cache_settings.SETTINGS_FILE
    assert json.loads(stored.read_text()) == {"max_bytes": 300 << 10}
    assert not stat.S_IMODE(stored.stat().st_mode) & (stat.S_IWGRP | stat.S_IWOTH)  # read back owner-checked

    shown = as_json("--dir", directory, "config", "max-size")
    assert shown["max_bytes"] == 300 << 10 and shown["source"] == "cache directory"
    assert shown["stored"] == {"path": str(stored), "max_bytes": 300 << 10}
    assert "300.0 KiB (stored in the cache directory" in ok("--dir", directory, "config", "max-size").stdout
    rows = {r["variable"]: r for r in as_json("--dir", directory, "config")["settings"]}
    row = rows["KERNEL_CACHE_MAX_BYTES"]
    assert row["value"] == "300K" and row["source"] == "cache directory"
    assert rows["KERNEL_CACHE_DIR"]["value"] == str(directory) and rows["KERNEL_CACHE_DIR"]["source"] == "command line"
    in_env = {r["variable"]: r for r in as_json("config", env={"KERNEL_CACHE_DIR": str(directory)})["settings"]}
    assert in_env["KERNEL_CACHE_DIR"]["source"] == "environment"
    assert re.search(r"^KERNEL_CACHE_MAX_BYTES +300K +cache directory$", ok("--dir", directory, "config").stdout, re.M)

    env = {"KERNEL_CACHE_MAX_BYTES": "1M"}  # the environment overrides it, and says what it overrides
    shown = as_json("--dir", directory, "config", "max-size", env=env)
    assert shown["max_bytes"] == 1 << 20 and shown["source"] == "environment"
    assert "overriding the 300.0 KiB stored" in ok("--dir", directory, "stats", env=env).stdout
    row = next(r for r in as_json("--dir", directory, "config", env=env)["settings"]
               if r["variable"] == "KERNEL_CACHE_MAX_BYTES")
    assert row["value"] == "1M" and row["source"] == "environment"

    assert cachectl("--dir", directory, "config", "max-size", "lots").returncode == 2
    assert cachectl("--dir", directory, "config", "max-size", "0").returncode == 2
    assert cachectl("--dir", tmp_path, "config", "max-size", "1G").returncode == 2  # holds other files: no cache
    ok("--dir", directory, "config", "max-size", "default")
    assert not stored.exists() and as_json("--dir", directory, "config", "max-size")["source"] == "default"


def test_every_store_on_the_directory_honours_the_stored_bound_unless_told_otherwise(tmp_path):
    directory = tmp_path / "cache"
    ok("--dir", directory, "config", "max-size", "200K")  # a new directory becomes a cache with its bound
    store = Store(Config(dir=directory))
    assert store.config.max_bytes == 200 << 10 and store.disk.max_bytes == 200 << 10
    for n in range(30):  # 600 KB written: the store evicts down to the stored bound as it goes
        store.put(Entry(key=f"{n + 1:032x}", meta=kernel_meta(), blobs={"cubin": os.urandom(20_000)}))
    assert sum(r["size_bytes"] for r in store.disk.listing()) <= 200 << 10
    store.close()

    session_store = configure(Config.from_env({"KERNEL_CACHE_DIR": str(directory)}))
    try:
        assert session_store.config.max_bytes == 200 << 10  # what KERNEL_CACHE_DIR alone gives a program
        overridden = configure(Config.from_env({"KERNEL_CACHE_DIR": str(directory), "KERNEL_CACHE_MAX_BYTES": "1G"}))
        assert overridden.config.max_bytes == 1 << 30 and overridden.disk.max_bytes == 1 << 30
    finally:
        configure()  # the session the environment gives (memory only here)
    explicit = Store(Config(dir=directory, max_bytes=8 << 30))  # given in code, even at the default's value
    assert explicit.config.max_bytes_given and explicit.disk.max_bytes == 8 << 30
    explicit.close()
    assert not Config().max_bytes_given and Config.from_env({"KERNEL_CACHE_MAX_BYTES": "8G"}).max_bytes_given


def test_a_plain_prune_enforces_the_stored_bound(tmp_path):
    directory = tmp_path / "cache"
    keys = fill(directory, 6, size=100_000)
    ok("--dir", directory, "config", "max-size", "400K")
    stats = as_json("--dir", directory, "stats")
    assert stats["over_max_bytes"] is True and stats["max_bytes"] == 400 << 10
    assert stats["max_bytes_source"] == "cache directory"
    text = ok("--dir", directory, "stats").stdout
    assert re.search(r"^max size +400\.0 KiB \(stored in the cache directory.*EXCEEDED", text, re.M), text

    assert ok("--dir", directory, "prune", env={"KERNEL_CACHE_MAX_BYTES": "1G"}).stdout.startswith(
        "removed 0 entries")  # the environment's bound is the one that holds there
    pruned = as_json("--dir", directory, "prune")
    assert pruned["bound"] == {"max_bytes": 400 << 10, "source": "cache directory"}
    assert [r["key"] for r in pruned["removed"]] == keys[:2]  # least recently used first, until it fits
    assert pruned["remaining"]["disk"]["bytes"] <= 400 << 10
    assert as_json("--dir", directory, "stats")["over_max_bytes"] is False
    assert ok("--dir", directory, "prune").stdout.startswith("removed 0 entries")


@pytest.mark.parametrize("plant", ["not json", "wrong value", "symlink", "writable by others", "too large"])
def test_a_refused_settings_file_is_one_warning_for_a_program_and_a_config_error_for_cachectl(tmp_path, plant):
    directory = tmp_path / "cache"
    fill(directory, 1, size=1000)
    stored = directory / cache_settings.SETTINGS_FILE
    if plant == "symlink":
        (tmp_path / "elsewhere.json").write_text('{"max_bytes": 1}')
        stored.symlink_to(tmp_path / "elsewhere.json")
    else:
        stored.write_text({"not json": "max_bytes = 1G", "wrong value": '{"max_bytes": "lots"}',
                           "writable by others": '{"max_bytes": 1}',
                           "too large": json.dumps({"max_bytes": 1, "pad": "x" * 5000})}[plant])
        os.chmod(stored, 0o666 if plant == "writable by others" else 0o644)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            store = Store(Config(dir=directory))
            assert store.config.max_bytes == 8 << 30 and store.disk is not None  # the default, still caching
            store.close()
    said = [str(w.message) for w in caught if issubclass(w.category, KernelCacheWarning)]
    assert len(said) == 1 and str(stored) in said[0] and "cachectl config max-size" in said[0], said

    refused = cachectl("--dir", directory, "list")
    assert refused.returncode == 2 and str(stored) in refused.stderr and len(refused.stderr.splitlines()) == 1
    ok("--dir", directory, "config", "max-size", "1M")  # config rewrites it
    assert as_json("--dir", directory, "config", "max-size")["max_bytes"] == 1 << 20
    store = Store(Config(dir=directory))
    assert store.config.max_bytes == 1 << 20
    store.close()


# 3. Rows that tell entries apart ---------------------------------------------------------------------------
def test_list_tells_the_six_configs_of_an_autotuned_kernel_apart(tmp_path):
    from compiler.examples import example_specs
    from compiler.recipe import to_recipe

    directory = tmp_path / "cache"
    store = Store(Config(dir=directory))
    specs = [spec for label, spec in example_specs("sm_90") if label.startswith("matmul[")]
    assert len(specs) == 6
    for n, spec in enumerate(specs):
        store.put(Entry(key=f"{n + 1:032x}", meta=kernel_meta("matmul_kernel", recipe=to_recipe(spec),
                                                               warps=spec.num_warps, stages=spec.num_stages),
                        blobs={"cubin": b"x" * 5000}))
    store.close()
    rows = ok("--dir", directory, "list").stdout.splitlines()
    assert rows[0].split()[:4] == ["KEY", "KERNEL", "CONFIG", "ARCH"]
    configs = [re.split(r" {2,}", line)[2] for line in rows[1:-1]]
    assert len(set(configs)) == 6, rows
    assert "BLOCK_M=64 BLOCK_N=64 BLOCK_K=32 w4 s3" in configs  # constexprs in the kernel's order
    assert "BLOCK_M=128 BLOCK_N=128 BLOCK_K=32 w8 s3" in configs  # not the strides Triton made constexprs of 1

    verbose = ok("--dir", directory, "list", "-v").stdout.splitlines()  # -v: the module, the whole config
    assert verbose[0].split()[:4] == ["KEY", "KERNEL", "MODULE", "CONFIG"]
    assert all(" compiler.examples  stride_ak=1 stride_bn=1 stride_cn=1 BLOCK_M=" in line for line in verbose[1:-1])
    entries = as_json("--dir", directory, "list")
    assert {e["module"] for e in entries} == {"compiler.examples"}
    assert sorted(e["config"] for e in entries) == sorted(f"stride_ak=1 stride_bn=1 stride_cn=1 {c}" for c in configs)


def test_rows_alike_in_config_say_what_else_differs(tmp_path):
    def add(signature: list, toolchain: str) -> dict:
        recipe = {"version": 1, "kernel": "mylib.kernels:add_kernel", "signature": signature,
                  "constexprs": {"BLOCK": {"v": 1024}}, "num_warps": 4, "num_stages": 3, "num_ctas": 1,
                  "options": {"enable_fp_fusion": {"v": True}, "debug": {"v": False}}}
        return kernel_meta(recipe=recipe, toolchain={"summary": toolchain})

    f32 = [["x", "*fp32"], ["n", "i32"], ["BLOCK", "constexpr"]]
    f16 = [["x", "*fp16"], ["n", "i32"], ["BLOCK", "constexpr"]]
    directory = tmp_path / "cache"
    store = Store(Config(dir=directory))
    for key, meta in (("1" * 32, add(f32, "triton-3.3.0+aaaa")), ("2" * 32, add(f16, "triton-3.3.0+aaaa")),
                      ("3" * 32, add(f32, "triton-3.4.0+bbbb"))):
        store.put(Entry(key=key, meta=meta, blobs={"cubin": b"x" * 100}))
    store.close()
    configs = {e["key"]: e["config"] for e in as_json("--dir", directory, "list")}
    assert set(configs.values()) == {"BLOCK=1024 w4 s3"}  # the usual options are not named
    text = ok("--dir", directory, "list").stdout
    assert re.search(r"  BLOCK=1024 w4 s3 \*fp16,i32  ", text), text  # the types tell this one apart
    assert "BLOCK=1024 w4 s3 *fp32,i32 triton-3.3.0+aaaa" in text  # and the toolchain these two
    assert "BLOCK=1024 w4 s3 *fp32,i32 triton-3.4.0+bbbb" in text


def test_last_used_to_the_second_in_verbose_list_and_json(tmp_path):
    directory = tmp_path / "cache"
    key = fill(directory, 1, size=1000)[0]
    used = float(int(time.time()) - 3 * 3600 - 7)  # a time whose seconds show
    os.utime(directory / "entries" / key[:2] / key, (used, used))
    assert as_json("--dir", directory, "list")[0]["last_used"] == used
    shown = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(used))
    assert shown in ok("--dir", directory, "list", "-v").stdout
    assert shown not in ok("--dir", directory, "list").stdout and shown[:-3] in ok("--dir", directory, "list").stdout


def test_the_usual_options_are_the_compilers_defaults():
    from compiler.spec import DEFAULT_OPTIONS

    assert USUAL_OPTIONS == DEFAULT_OPTIONS
