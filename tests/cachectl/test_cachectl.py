"""cachectl driven as a subprocess against a real store filled by real Triton compiles.

One store is compiled per session (add + softmax for sm_90 and sm_80); tests that change a store
work on a copy of it.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest
from conftest import child_env, python_path

from cachectl.inventory import EntryFilter, EntryInfo, find_by_prefix, plan_prune
from kernel_cache.entries import entry as entry_format

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ("add", "softmax")
ARCHES = ("sm_90", "sm_80")


def cachectl(*args, cwd=ROOT, env=None, timeout=300) -> subprocess.CompletedProcess:
    """Run `python -m kernel_cache ARGS` (what the cachectl console script runs)."""
    full_env = child_env(**(env or {}))
    return subprocess.run([sys.executable, "-m", "kernel_cache", *map(str, args)], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def ok(*args, **kw) -> subprocess.CompletedProcess:
    proc = cachectl(*args, **kw)
    assert proc.returncode == 0, f"cachectl {args} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def as_json(*args, **kw):
    doc = json.loads(ok(*args, "--json", **kw).stdout)
    assert doc["schema"] == 2
    return doc["entries"] if args and "list" in args else doc


@pytest.fixture(scope="session")
def pristine(tmp_path_factory):
    """(directory, {(kernel label, arch): key}) of a store filled by real compiles, plus one later
    disk hit on add/sm_90 so hit counters are non-zero."""
    from compiler import get_or_compile
    from compiler.examples import example_specs
    from kernel_cache import Config, Store

    directory = tmp_path_factory.mktemp("cachectl") / "store"
    store = Store(Config(dir=directory))
    keys = {}
    for arch in ARCHES:
        for label, spec in example_specs(arch):
            if label in KERNELS:
                keys[(label, arch)] = get_or_compile(spec, store)[1]
    store.close()
    again = Store(Config(dir=directory))
    spec = dict(example_specs("sm_90"))["add"]
    assert get_or_compile(spec, again)[1] == keys[("add", "sm_90")]
    again.close()
    return directory, keys


@pytest.fixture
def store_copy(pristine, tmp_path):
    directory, keys = pristine
    copy = tmp_path / "store"
    shutil.copytree(directory, copy)
    return copy, keys


def _disk(directory):
    from kernel_cache.levels.disk import DiskLevel

    return DiskLevel(directory)


def set_last_used(directory: Path, ages: dict[str, float]) -> None:
    """Age entries: key -> seconds since last use (the entry file's mtime)."""
    now = time.time()
    for key, age in ages.items():
        os.utime(_entry_file(directory, key), (now - age, now - age))


def listed_keys(directory, *args) -> set[str]:
    return {row["key"] for row in as_json("--dir", directory, "list", *args)}


# list / show / stats -----------------------------------------------------------------------
def test_list_json_schema_and_filters(pristine):
    directory, keys = pristine
    rows = as_json("--dir", directory, "list")
    assert {r["key"] for r in rows} == set(keys.values())
    by_key = {r["key"]: r for r in rows}
    for (label, arch), key in keys.items():
        row = by_key[key]
        assert row["kernel"] == f"{label}_kernel" and row["arch"] == arch
        assert row["size_bytes"] > 1000 and row["created"] <= row["last_used"] + 1
        assert row["toolchain"].startswith("triton-") and row["stale"] is False and row["level"] == "disk"
    assert by_key[keys[("add", "sm_90")]]["hits"] == 1
    assert by_key[keys[("softmax", "sm_80")]]["hits"] == 0

    assert listed_keys(directory, "--kernel", "soft*", "--arch", "sm_80") == {keys[("softmax", "sm_80")]}
    assert listed_keys(directory, "--arch", "sm_90") == {keys[("add", "sm_90")], keys[("softmax", "sm_90")]}
    assert listed_keys(directory, "--older-than", "1d") == set()
    assert listed_keys(directory, "--stale") == set()
    sizes = [r["size_bytes"] for r in as_json("--dir", directory, "list", "--sort", "size")]
    assert sizes == sorted(sizes, reverse=True)

    table = ok("--dir", directory, "list", "--kernel", "add*").stdout.splitlines()
    assert table[0].split() == ["KEY", "KERNEL", "CONFIG", "ARCH", "SIZE", "CREATED", "LAST", "USED", "HITS"]
    assert {line.split()[0] for line in table[1:-1]} == {keys[("add", a)][:12] for a in ARCHES}
    assert table[-1].startswith("2 entries")


def test_listing_does_not_count_as_use(store_copy):
    directory, keys = store_copy
    set_last_used(directory, {k: 7200 for k in keys.values()})
    ok("--dir", directory, "list")
    ok("--dir", directory, "show", keys[("add", "sm_90")][:10])
    assert listed_keys(directory, "--older-than", "1h") == set(keys.values())


def test_show_prefix_json_and_ir(pristine):
    directory, keys = pristine
    key = keys[("softmax", "sm_80")]
    human = ok("--dir", directory, "show", key[:8]).stdout
    assert key in human and "softmax_kernel" in human and "sm_80" in human
    assert "kernel      compiler.examples:softmax_kernel" in human  # the recipe

    shown = as_json("--dir", directory, "show", key[:8])
    assert shown["key"] == key and shown["meta"]["name"] == "softmax_kernel"
    assert shown["meta"]["recipe"]["kernel"] == "compiler.examples:softmax_kernel"
    # the binaries, the TTIR, and the binaries' raw-deflate runs (spliced into jaxlib's compressed call)
    assert set(shown["blobs"]) == {"cubin", "ptx", "ttir", "cubin.deflate", "ptx.deflate"}

    ptx = ok("--dir", directory, "show", key[:8], "--ptx").stdout
    assert ".entry softmax_kernel" in ptx and ".target sm_80" in ptx

    no_ttgir = cachectl("--dir", directory, "show", key[:8], "--ttgir")
    assert no_ttgir.returncode == 1 and "has no ttgir" in no_ttgir.stderr and "keep_ir" in no_ttgir.stderr

    unknown = cachectl("--dir", directory, "show", "ffffffffffffffffzz")
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == "cachectl: no entry has a key starting with 'ffffffffffffffffzz'"


def test_find_by_prefix_rejects_ambiguous_prefix():
    def info(key):
        return EntryInfo(key=key, level="disk", kernel="k", arch="sm_90", size_bytes=1, created=0, last_used=0)

    infos = [info("ab12" + "0" * 28), info("ab34" + "0" * 28), info("cd00" + "0" * 28)]
    assert find_by_prefix(infos, "AB3").key.startswith("ab34")
    with pytest.raises(LookupError, match="ambiguous: 2 entries"):
        find_by_prefix(infos, "ab")


def test_stats_json_and_zero(store_copy):
    directory, keys = store_copy
    stats = as_json("--dir", directory, "stats")
    rows = as_json("--dir", directory, "list")
    assert stats["entries"] == 4 and stats["bytes"] == sum(r["size_bytes"] for r in rows)
    assert stats["hits"] == {"memory": 0, "disk": 1, "job": 0, "shared": 0, "remote": 0}
    assert stats["misses"] == 4 and stats["compiles"] == 4
    add90 = next(r for r in rows if r["key"] == keys[("add", "sm_90")])
    assert stats["compile_seconds_saved"] == pytest.approx(add90["compile_seconds"], abs=1e-5)
    assert stats["oldest"] <= stats["newest"]
    human = ok("--dir", directory, "stats").stdout
    assert "disk entries         4" in human and "misses               4" in human

    ok("--dir", directory, "stats", "--zero")
    zeroed = as_json("--dir", directory, "stats")
    assert zeroed["hits"] == {"memory": 0, "disk": 0, "job": 0, "shared": 0, "remote": 0}
    assert zeroed["misses"] == zeroed["compiles"] == 0 and zeroed["entries"] == 4


# prune ---------------------------------------------------------------------------------------
def test_prune_max_size_evicts_least_recently_used(store_copy):
    directory, keys = store_copy
    order = [keys[("softmax", "sm_80")], keys[("add", "sm_80")], keys[("softmax", "sm_90")],
             keys[("add", "sm_90")]]  # oldest use first
    set_last_used(directory, {key: 400 - 100 * i for i, key in enumerate(order)})
    sizes = {r["key"]: r["size_bytes"] for r in as_json("--dir", directory, "list")}
    budget = sizes[order[2]] + sizes[order[3]]

    dry = as_json("--dir", directory, "prune", "--max-size", budget, "--dry-run")
    assert [r["key"] for r in dry["removed"]] == order[:2] and dry["dry_run"] is True
    assert listed_keys(directory) == set(order)

    out = ok("--dir", directory, "prune", "--max-size", budget).stdout
    assert listed_keys(directory) == set(order[2:])
    assert "removed 2 entries" in out and order[0][:12] in out and order[1][:12] in out


def test_prune_older_than_and_kernel(store_copy):
    directory, keys = store_copy
    set_last_used(directory, {keys[("add", "sm_80")]: 40 * 86400, keys[("softmax", "sm_90")]: 31 * 86400,
                              keys[("add", "sm_90")]: 29 * 86400})
    result = as_json("--dir", directory, "prune", "--older-than", "30d")
    assert {r["key"] for r in result["removed"]} == {keys[("add", "sm_80")], keys[("softmax", "sm_90")]}
    assert result["bytes_freed"] == sum(r["size_bytes"] for r in result["removed"])
    assert listed_keys(directory) == {keys[("add", "sm_90")], keys[("softmax", "sm_80")]}

    ok("--dir", directory, "prune", "--kernel", "add*")
    assert listed_keys(directory) == {keys[("softmax", "sm_80")]}


def test_prune_stale_removes_only_other_toolchains(store_copy):
    directory, keys = store_copy
    stale_key = keys[("softmax", "sm_90")]
    disk = _disk(directory)
    entry = entry_format.decode(disk.peek_raw(stale_key), expected_key=stale_key)
    entry.meta["toolchain"] = {**entry.meta["toolchain"], "summary": "triton-3.0.0+0123456789ab"}
    disk.put_raw(stale_key, entry_format.encode(entry))
    disk.close()

    assert listed_keys(directory, "--stale") == {stale_key}
    ok("--dir", directory, "prune", "--stale")
    assert listed_keys(directory) == set(keys.values()) - {stale_key}


def test_prune_removes_old_debris_only(store_copy):
    directory, keys = store_copy
    old_temp = directory / "entries" / "ab" / f".{'ab' * 16}.host.123.abcd.tmp"  # a writer that crashed
    new_temp = directory / "entries" / "ab" / f".{'ab' * 16}.host.124.abcd.tmp"  # one at work
    old_lock = directory / "locks" / "ee" / f"{'e' * 32}.lock"
    for path in (old_temp, new_temp, old_lock):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 100)
    two_hours_ago = time.time() - 7200
    for path in (old_temp, old_lock):
        os.utime(path, (two_hours_ago, two_hours_ago))

    result = as_json("--dir", directory, "prune")
    assert sorted(d["path"] for d in result["debris"]) == sorted([str(old_temp), str(old_lock)])
    assert result["removed"] == [] and not old_temp.exists() and not old_lock.exists()
    assert new_temp.exists()
    assert listed_keys(directory) == set(keys.values())
    assert ok("--dir", directory, "verify").returncode == 0  # the entry files untouched


def test_plan_prune_combines_selection_and_size():
    infos = [EntryInfo(key=f"{i:032x}", level="disk", kernel="matmul" if i < 2 else "add", arch="sm_90",
                       size_bytes=100, created=0, last_used=float(i)) for i in range(5)]
    doomed = plan_prune(infos, EntryFilter(kernel_glob="matmul"), max_bytes=200)
    assert [i.key[-1] for i in doomed] == ["0", "1", "2"]


# verify / clear --------------------------------------------------------------------------------
def _entry_file(directory: Path, key: str) -> Path:
    return directory / "entries" / key[:2] / key


def test_verify_finds_flipped_and_truncated_entries_and_repairs(store_copy):
    directory, keys = store_copy
    assert ok("--dir", directory, "verify").stdout.strip() == "checked 4 entries: 0 bad"

    flipped, truncated = keys[("add", "sm_90")], keys[("softmax", "sm_80")]
    data = bytearray(_entry_file(directory, flipped).read_bytes())
    data[len(data) // 2] ^= 0x40
    _entry_file(directory, flipped).write_bytes(bytes(data))
    entry_file = _entry_file(directory, truncated)
    entry_file.write_bytes(entry_file.read_bytes()[:-500])

    bad = cachectl("--dir", directory, "verify", "--json")
    assert bad.returncode == 1
    report = json.loads(bad.stdout)
    assert report["checked"] == 4 and report["remaining_bad"] == 2
    reasons = {b["key"]: b["reason"] for b in report["bad"]}
    assert reasons[flipped] == "entry checksum mismatch"
    assert reasons[truncated].startswith("entry is truncated")
    assert "2 bad entries remain" in cachectl("--dir", directory, "verify").stderr

    repaired = cachectl("--dir", directory, "verify", "--repair")
    assert repaired.returncode == 0 and "2 removed" in repaired.stdout
    assert listed_keys(directory) == {keys[("add", "sm_80")], keys[("softmax", "sm_90")]}
    assert ok("--dir", directory, "verify").stdout.strip() == "checked 2 entries: 0 bad"


def test_clear_needs_yes(store_copy):
    directory, keys = store_copy
    refused = cachectl("--dir", directory, "clear")
    assert refused.returncode == 2 and "--yes" in refused.stderr
    assert listed_keys(directory) == set(keys.values())
    assert as_json("--dir", directory, "clear", "--yes")["removed"] == 4
    assert listed_keys(directory) == set()


# export / import -------------------------------------------------------------------------------
def test_export_clear_import_round_trip(store_copy, tmp_path):
    directory, keys = store_copy
    bundle = tmp_path / "sm90.kcb"
    exported = as_json("--dir", directory, "export", bundle, "--arch", "sm_90")
    assert exported["entries"] == 2 and bundle.stat().st_size == exported["file_bytes"] < exported["bytes"]
    ok("--dir", directory, "clear", "--yes")

    fresh = tmp_path / "elsewhere"  # import creates the directory, e.g. in a container build
    result = as_json("--dir", fresh, "import", bundle)
    assert result["imported"] == 2 and result["rejected"] == [] and result["stale"] == 0
    assert listed_keys(fresh) == {keys[("add", "sm_90")], keys[("softmax", "sm_90")]}
    assert ok("--dir", fresh, "verify").returncode == 0
    assert ".entry add_kernel" in ok("--dir", fresh, "show", keys[("add", "sm_90")], "--ptx").stdout
    assert as_json("--dir", fresh, "import", bundle)["present"] == 2


def _bundle_with(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_import_validates_format_checksum_and_toolchain(pristine, tmp_path):
    directory, keys = pristine
    disk = _disk(directory)
    good_key, bad_key, stale_key = keys[("add", "sm_80")], keys[("softmax", "sm_80")], keys[("add", "sm_90")]
    good = disk.peek_raw(good_key)
    tampered = bytearray(disk.peek_raw(bad_key))
    tampered[-1] ^= 1
    stale = entry_format.decode(disk.peek_raw(stale_key), expected_key=stale_key)
    stale.meta["toolchain"]["summary"] = "triton-3.0.0+0123456789ab"
    disk.close()
    manifest = json.dumps({"format": "kernel-cache-bundle", "version": 1, "entries": []}).encode()
    bundle = tmp_path / "mixed.kcb"
    _bundle_with(bundle, {"manifest.json": manifest, f"entries/{good_key}.kce": good,
                          f"entries/{bad_key}.kce": bytes(tampered),
                          f"entries/{stale_key}.kce": entry_format.encode(stale),
                          "../../etc/evil": b"x"})

    target = tmp_path / "target"
    proc = cachectl("--dir", target, "import", bundle, "--json")
    assert proc.returncode == 1
    result = json.loads(proc.stdout)
    assert result["imported"] == 1 and result["stale"] == 1
    assert {r["member"]: r["reason"] for r in result["rejected"]} == {
        bad_key: "entry checksum mismatch", "../../etc/evil": "not an entry of a kernel-cache bundle"}
    assert listed_keys(target) == {good_key}

    # A bundle of another version lands nothing, wherever its manifest sits in the archive.
    future = tmp_path / "future.kcb"
    manifest_v99 = json.dumps({"format": "kernel-cache-bundle", "version": 99, "entries": []}).encode()
    _bundle_with(future, {f"entries/{good_key}.kce": good, "manifest.json": manifest_v99})
    other = tmp_path / "other"
    proc = cachectl("--dir", other, "import", future)
    assert proc.returncode == 1 and "bundle version 99" in proc.stderr
    assert not (other / "entries").exists() or listed_keys(other) == set()

    garbage = tmp_path / "garbage.kcb"
    garbage.write_bytes(b"not a tarball at all")
    proc = cachectl("--dir", target, "import", garbage)  # not a bundle at all: the import could not run
    assert proc.returncode == 2 and proc.stderr.startswith("cachectl: ") and "not a kernel-cache bundle" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


# arguments and exit codes ------------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["prune", "--max-size", "10X"], "argument --max-size: cannot read '10X' as a size"),
    (["list", "--older-than", "3 fortnights"], "argument --older-than: cannot read '3 fortnights' as a duration"),
    (["prewarm", "-j", "0"], "argument -j: expected a positive number"),
    (["verify", "--rebuild", "--sample", "0"], "argument --sample: expected a positive number, got '0'"),
    (["verify", "--rebuild", "--sample", "-5"], "argument --sample: expected a positive number, got '-5'"),
    (["tune", "prog:main", "--reps", "-1"], "argument --reps: expected a positive number, got '-1'"),
    (["frobnicate"], "unknown command 'frobnicate'; one of: list, show"),
])
def test_bad_arguments_exit_2_with_one_line(pristine, args, message):
    proc = cachectl("--dir", pristine[0], *args)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr


def test_missing_directory_is_an_error_and_not_created(tmp_path):
    missing = tmp_path / "nope"
    proc = cachectl("--dir", missing, "list")
    assert proc.returncode == 2 and proc.stderr.startswith(f"cachectl: no cache directory at {missing}: ")
    assert not missing.exists()
    env = {k: "" for k in os.environ if k.startswith("KERNEL_CACHE_")}
    proc = cachectl("stats", env=env)
    assert proc.returncode == 2 and "pass --dir DIR or set KERNEL_CACHE_DIR" in proc.stderr


def test_dir_from_environment(pristine):
    directory, keys = pristine
    rows = json.loads(ok("list", "--json", env={"KERNEL_CACHE_DIR": str(directory)}).stdout)["entries"]
    assert {r["key"] for r in rows} == set(keys.values())


# prewarm -----------------------------------------------------------------------------------------
ORPHAN_MODULE = textwrap.dedent("""
    import triton
    import triton.language as tl

    @triton.jit
    def orphan_kernel(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)
""")


def test_prewarm_recipes_for_two_arches_reports_unimportable_kernel(store_copy, tmp_path, monkeypatch):
    directory, keys = store_copy
    # An entry whose kernel module is gone by the time prewarm runs.
    module_dir = tmp_path / "mods"
    module_dir.mkdir()
    (module_dir / "cachectl_orphan_kernels.py").write_text(ORPHAN_MODULE)
    monkeypatch.syspath_prepend(str(module_dir))
    import cachectl_orphan_kernels

    from compiler import get_or_compile, make_spec
    from kernel_cache import Config, Store

    store = Store(Config(dir=directory))
    get_or_compile(make_spec(cachectl_orphan_kernels.orphan_kernel, ["*fp32", 4096], {"BLOCK": 256},
                             target="sm_90"), store)
    for arch in ("sm_80",):  # drop what prewarm must rebuild
        for label in KERNELS:
            store.disk.delete(keys[(label, arch)])
    store.close()
    shutil.rmtree(module_dir)

    proc = cachectl("--dir", directory, "prewarm", "--arch", "sm_80,sm_90", "-j", "2", "--json",
                    "--allow-module", "compiler.examples", "--allow-module", "cachectl_orphan_*")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert report["built"] == 2 and report["present"] == 2 and report["failed"] == 2
    built = {(o["label"], o["arch"]): o["key"] for o in report["outcomes"] if o["status"] == "built"}
    assert built == {(f"{k}_kernel", "sm_80"): keys[(k, "sm_80")] for k in KERNELS}  # same content keys
    failed = [o for o in report["outcomes"] if o["status"] == "failed"]
    assert {o["arch"] for o in failed} == {"sm_80", "sm_90"}
    assert all("cannot import module 'cachectl_orphan_kernels'" in o["error"] for o in failed)
    assert "built    sm_80" in proc.stderr  # the per-kernel log goes to stderr under --json
    assert listed_keys(directory, "--arch", "sm_80") == {keys[(k, "sm_80")] for k in KERNELS}
    assert ok("--dir", directory, "verify").returncode == 0

    again = cachectl("--dir", directory, "prewarm", "--kernel", "softmax*", "--arch", "sm_80,sm_90",
                     "--allow-module", "compiler.examples")
    assert again.returncode == 0 and "built 0, already present 2, failed 0" in again.stdout


MARKER_MODULE = textwrap.dedent("""
    from pathlib import Path

    Path(__file__).with_name("imported.marker").write_text("this module ran")
    from compiler.examples import add_kernel  # the real kernel: its entries are present
""")


def test_prewarm_imports_only_allowed_modules(store_copy, tmp_path):
    """A recipe written into the cache names a module with a side effect on import: a bare prewarm
    imports nothing; --allow-module decides which recipes are rebuilt."""
    directory, keys = store_copy
    module_dir = tmp_path / "mods"
    module_dir.mkdir()
    (module_dir / "cachectl_marker_mod.py").write_text(MARKER_MODULE)
    marker = module_dir / "imported.marker"
    disk = _disk(directory)
    planted = entry_format.decode(disk.peek_raw(keys[("add", "sm_90")]), expected_key=keys[("add", "sm_90")])
    planted.key, planted.meta["name"] = "f" * 32, "planted_kernel"
    planted.meta["recipe"]["kernel"] = "cachectl_marker_mod:add_kernel"
    disk.put_raw(planted.key, entry_format.encode(planted))
    disk.close()
    env = {"PYTHONPATH": python_path(module_dir)}

    bare = cachectl("--dir", directory, "prewarm", "--arch", "sm_90", env=env)
    assert bare.returncode == 0, bare.stderr
    assert "no --allow-module given" in bare.stdout and "built 0, already present 0, failed 0, skipped 3" in bare.stdout
    assert "SKIPPED  1 recipe build(s) of module 'cachectl_marker_mod'" in bare.stderr
    assert not marker.exists()

    proc = cachectl("--dir", directory, "prewarm", "--arch", "sm_90", "--allow-module", "compiler.examples", "--json",
                    env=env)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["built"], report["present"], report["failed"], report["skipped"]) == (0, 2, 0, 1)
    assert report["allowed_modules"] == ["compiler.examples"]
    skipped = [o for o in report["outcomes"] if o["status"] == "skipped"]
    assert [(o["label"], o["arch"], o["module"], o["key"]) for o in skipped] == [
        ("add_kernel", "sm_90", "cachectl_marker_mod", "")]
    assert "not allowed" in skipped[0]["error"] and "--allow-module 'cachectl_marker_mod'" in skipped[0]["error"]
    assert not marker.exists()

    allowed = cachectl("--dir", directory, "prewarm", "--arch", "sm_90", "--allow-module", "compiler.examples",
                       "--allow-module", "cachectl_marker_*", env=env)
    assert allowed.returncode == 0 and "built 0, already present 3, failed 0 in" in allowed.stdout
    assert marker.exists()  # allowed: imported (and resolved to the real add kernel, already present)


def test_prewarm_program_lowers_for_cuda_on_cpu(tmp_path):
    pytest.importorskip("lowering")
    (tmp_path / "cachectl_user_program.py").write_text(textwrap.dedent("""
        import functools
        import jax
        import jax.numpy as jnp
        from lowering.examples import add_program

        def programs(arch):
            assert arch == "sm_80"
            vec = jax.ShapeDtypeStruct((4096,), jnp.float32)
            return [("add-1024", functools.partial(add_program, block=1024), (vec, vec)),
                    ("broken", lambda x: undefined_name(x), (vec,))]
    """))
    directory = tmp_path / "store"
    env = {"PYTHONPATH": python_path(tmp_path)}
    proc = cachectl("--dir", directory, "prewarm", "cachectl_user_program:programs", "--arch", "sm_80",
                    "-j", "1", "--json", env=env)
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert report["built"] == 1 and report["failed"] == 1
    failed = next(o for o in report["outcomes"] if o["status"] == "failed")
    assert failed["label"] == "broken" and "undefined_name" in failed["error"]
    (built,) = [o for o in report["outcomes"] if o["status"] == "built"]
    # the lowering also recorded the call, and the worker's exit kept the program's warm set (and the
    # memo naming it by the program's lineage): entries, but no kernels, so not counted as built
    rows = {r["kind"]: r for r in as_json("--dir", directory, "list")}
    assert sorted((kind, r["kernel"], r["arch"]) for kind, r in rows.items()) == [
        ("installed-memo", "warm-set lineage", "?"), ("lowered-call", "add_kernel", "sm_80"),
        ("triton-kernel", "add_kernel", "sm_80"), ("warm-set", "1 entry", "sm_80")]
    assert built["key"] == rows["triton-kernel"]["key"] and rows["lowered-call"]["call"]["kernels"] == [built["key"]]
    # filed under the call's signature, the first thing the lowering asked of it (the add call has one)
    assert rows["warm-set"]["warm"]["members"] == 1 and rows["warm-set"]["warm"]["first"] != rows["lowered-call"]["key"]
    shown_set = ok("--dir", directory, "show", rows["warm-set"]["key"]).stdout
    assert "1 member, 1 still held; 1 served by their call's signature" in shown_set
    assert ok("--dir", directory, "verify").stdout.strip() == "checked 4 entries: 0 bad"
    shown = ok("--dir", directory, "show", rows["lowered-call"]["key"]).stdout
    assert "lowered call add_kernel" in shown and f"kernels      1: {built['key'][:12]}\n" in shown

    missing = cachectl("--dir", directory, "prewarm", "no_such_module_xyz:programs", env=env)
    assert missing.returncode == 2 and "cannot import module 'no_such_module_xyz'" in missing.stderr


# shared level -------------------------------------------------------------------------------------
def test_shared_level_list_prune_verify(store_copy, tmp_path):
    pytest.importorskip("kernel_cache.levels.shared")
    directory, keys = store_copy
    shared = tmp_path / "shared"
    shared.mkdir()
    both = ("--dir", directory, "--shared-dir", shared)
    bundle = tmp_path / "all.kcb"
    ok("--dir", directory, "export", bundle)
    assert as_json(*both, "import", bundle, "--level", "shared")["imported"] == 4

    rows = as_json(*both, "list")
    assert sorted((r["level"], r["key"]) for r in rows) == sorted(
        (level, key) for level in ("disk", "shared") for key in keys.values())
    assert "LEVEL" in ok(*both, "list").stdout.splitlines()[0]
    stats = as_json(*both, "stats")
    assert stats["levels"]["shared"]["entries"] == 4 and stats["entries"] == 8

    pruned = as_json(*both, "prune", "--level", "shared", "--arch", "sm_80")
    assert {(r["level"], r["key"]) for r in pruned["removed"]} == {("shared", keys[(k, "sm_80")]) for k in KERNELS}
    assert listed_keys(directory, "--shared-dir", shared, "--level", "shared") == {
        keys[(k, "sm_90")] for k in KERNELS}
    assert listed_keys(directory) == set(keys.values())  # the disk level is untouched

    victim = keys[("add", "sm_90")]
    path = shared / "entries" / victim[:2] / victim
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    bad = cachectl(*both, "verify", "--json")
    assert bad.returncode == 1
    assert [(b["level"], b["key"]) for b in json.loads(bad.stdout)["bad"]] == [("shared", victim)]
    assert cachectl(*both, "verify", "--repair").returncode == 0
    assert listed_keys(directory, "--shared-dir", shared, "--level", "shared") == {keys[("softmax", "sm_90")]}

    # A reader that meets a corrupt shared entry quarantines it; verify reports it, prune clears it.
    survivor = keys[("softmax", "sm_90")]
    spath = shared / "entries" / survivor[:2] / survivor
    data = bytearray(spath.read_bytes())
    data[-3] ^= 0xFF
    spath.write_bytes(bytes(data))
    from kernel_cache import Config, Store
    with pytest.warns(Warning):
        assert Store(Config(dir=tmp_path / "reader", shared_dir=shared)).get(survivor) is None
    report = as_json(*both, "verify")
    assert [q["key"] for q in report["quarantined"]] == [survivor]
    for q in report["quarantined"]:
        old = time.time() - 2 * 3600
        os.utime(q["path"], (old, old))
    ok(*both, "prune", "--level", "shared")
    assert as_json(*both, "verify")["quarantined"] == []

    missing = cachectl("--dir", directory, "--shared-dir", tmp_path / "no-mount", "list")
    assert missing.returncode == 2 and "no shared cache directory" in missing.stderr


def test_clear_and_prune_touch_the_shared_directory_only_when_told(tmp_path):
    """An operator's `clear --yes` with KERNEL_CACHE_SHARED_DIR set empties the local cache alone; the
    team's shared directory needs --level shared or --all-levels, and the refusal names what it would remove."""
    from test_shared_level import KEY, KEY2, make_entry

    from kernel_cache import Config, Store

    shared = tmp_path / "shared"
    shared.mkdir()
    store = Store(Config(dir=tmp_path / "local", shared_dir=shared))
    for key in (KEY, KEY2):
        store.put(make_entry(key))
    store.close()
    env = {"KERNEL_CACHE_SHARED_DIR": str(shared)}
    asked = cachectl("--dir", tmp_path / "local", "clear", env=env)
    assert asked.returncode == 2 and "disk (" in asked.stderr and "not shared" in asked.stderr, asked.stderr
    cleared = cachectl("--dir", tmp_path / "local", "clear", "--yes", "--json", env=env)
    assert cleared.returncode == 0 and json.loads(cleared.stdout)["levels"] == ["disk"]
    def shared_entries():
        return sorted(p.name for p in (shared / "entries").rglob("*") if p.is_file())
    assert shared_entries() == sorted([KEY, KEY2])  # the team's entries stay
    pruned = cachectl("--dir", tmp_path / "local", "prune", "--max-size", "0", "--json", env=env)
    assert json.loads(pruned.stdout)["removed"] == [] and shared_entries() == sorted([KEY, KEY2])
    everything = cachectl("--dir", tmp_path / "local", "clear", "--yes", "--all-levels", env=env)
    assert everything.returncode == 0 and "(disk, shared)" in everything.stdout, everything.stdout
    assert shared_entries() == []


def test_an_age_without_a_unit_is_refused_naming_the_units(tmp_path):
    from kernel_cache import Config, Store
    Store(Config(dir=tmp_path / "c")).close()
    bare = cachectl("--dir", tmp_path / "c", "prune", "--older-than", "30")
    assert bare.returncode == 2 and "has no unit: write it with one of ms, s, m, h, d, w" in bare.stderr, bare.stderr
    assert ok("--dir", tmp_path / "c", "prune", "--older-than", "30d", "--dry-run").returncode == 0
