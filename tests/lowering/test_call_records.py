"""Lowered-call records on a CPU host (cross-lowered for cuda): a call lowered before is served from
its record alone (its kernels' entries deleted, nothing compiled, the same decoded call as the
kernel-by-kernel lowering); the fingerprint changes with every input of the payload and nothing
else; damaged or foreign entries under a record's key are lowered again and replaced; persisted
winners stored after a record was written redirect it, and removing them restores the autotuned
call; KERNEL_CACHE_CALL_RECORDS=0 and tuning write none.
"""

from __future__ import annotations

import functools
import importlib.util
import textwrap
import types

import jax
import jax.numpy as jnp
import pytest
from conftest import run_python
from inspect_call import custom_calls
from test_winners import GPU, VEC, inplace, put_winner, record_for, site_of

import kernel_cache
from compiler import Target
from compiler import examples as kernels
from kernel_cache import Config, Entry, front_level, value_class
from kernel_cache.bounded_memo import BoundedMemo
from kernel_cache.entries import call_entry
from lowering import examples as ep
from lowering.planning import plan
from lowering.planning.configs import LaunchConfig
from lowering.records import call_key, call_records

SMALL = jax.ShapeDtypeStruct((4096,), jnp.float32)
# A few of the example programs: plain calls with and without scalars, and a 6-config autotuned matmul.
PROGRAMS = [("add", functools.partial(ep.add_program, block=1024, compute_capability=90), (SMALL, SMALL)),
            ("scaled_add", functools.partial(ep.scaled_add_program, scale=0.5, compute_capability=90), (SMALL, SMALL)),
            ("matmul", functools.partial(ep.matmul_program, compute_capability=90),
             (jax.ShapeDtypeStruct((256, 256), jnp.float16),) * 2)]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("call-records")


@pytest.fixture
def use_store():
    """configure(dir=..., **settings) -> the process store; the default store is restored after."""
    def configure(directory, **settings):
        return kernel_cache.configure(Config(dir=directory, **settings))
    yield configure
    kernel_cache.configure()


def forget() -> None:
    """Empty this process's memos, so the next lowering reads the store as a fresh process would."""
    kernel_cache.default_store().memory.clear()
    kernel_cache.current_session().forget()


def lower(fn, shapes) -> list[dict]:
    jax.clear_caches()  # jit would hand back an earlier lowering of the same function
    return custom_calls(jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",)))


def entries(store, kind: str) -> dict[str, Entry]:
    found = {}
    for key in store.disk.keys():
        got = store.get(key)
        if got is not None and got[0].meta.get("kind") == kind:
            found[key] = got[0]
    return found


def test_a_call_lowered_before_is_served_from_its_record_alone(cache_dir, use_store):
    store = use_store(cache_dir / "served", call_records=False)
    kernel_by_kernel = [lower(fn, shapes) for _, fn, shapes in PROGRAMS]
    assert entries(store, call_entry.KIND) == {}  # off: none written
    store = use_store(cache_dir / "served")
    assert [lower(fn, shapes) for _, fn, shapes in PROGRAMS] == kernel_by_kernel
    written = entries(store, call_entry.KIND)
    assert len(written) == len(PROGRAMS)
    matmul = [call_entry.CallRecord.from_entry(e) for e in written.values() if e.meta["name"] == "matmul_kernel"]
    assert len(matmul) == 1 and len(matmul[0].config_keys) == 6 and matmul[0].payload is not None

    for key in entries(store, "triton-kernel"):  # the kernels go; the records must suffice
        store.delete(key)
    forget()
    before = store.stats.session()
    assert [lower(fn, shapes) for _, fn, shapes in PROGRAMS] == kernel_by_kernel
    after = store.stats.session()
    assert after["compiles"] == before["compiles"] and after["misses"] == before["misses"]
    assert sum(after["hits"].values()) == sum(before["hits"].values())  # no kernel was read
    assert sum(after["record_hits"].values()) - sum(before["record_hits"].values()) == len(PROGRAMS)  # one per call

    store = use_store(cache_dir / "served", call_records=False)  # without records the kernels are missed
    lower(*PROGRAMS[0][1:])
    assert store.stats.session()["compiles"] == 1


def test_records_off_keep_a_call_for_this_session_only(cache_dir, use_store, monkeypatch):
    """KERNEL_CACHE_CALL_RECORDS=0: nothing is written to the store, yet a call lowered again in the
    same session is served from the session's copy under the same fingerprint (no kernel read, the
    same payload); a new session (a new process) lowers it kernel by kernel."""
    store = use_store(cache_dir / "session-only", call_records=False, winners=False)  # (no winner reads on a GPU host)
    _, fn, shapes = PROGRAMS[2]  # the autotuned matmul: 6 kernels
    first = lower(fn, shapes)
    reads = []
    real_get = type(store).get
    monkeypatch.setattr(type(store), "get", lambda self, key: reads.append(key) or real_get(self, key))
    assert lower(fn, shapes) == first and reads == []
    assert entries(store, call_entry.KIND) == {}
    monkeypatch.undo()
    store = use_store(cache_dir / "session-only", call_records=False, winners=False)  # a new session: read again
    reads = []
    monkeypatch.setattr(type(store), "get", lambda self, key: reads.append(key) or real_get(self, key))
    assert lower(fn, shapes) == first and len(reads) == 6


def _inputs(**changes):
    """The plan fields of a plain add call the fingerprint reads, with `changes` applied."""
    config = LaunchConfig({"BLOCK": 1024}, 4, 3, 1, "default")
    launch = plan.Launch((4, 1, 1), {}, "default", frozenset({"BLOCK"}))
    info = plan.CallInfo("add", "add_kernel", "{'n': 4096}", 90, (), 2, (16384, 16384), b"", False)
    values = {"platform": "cuda", "fn": kernels.add_kernel, "args": ["*fp32", "*fp32", 4096, "*fp32"],
              "configs": [config], "launches": [launch], "target": Target("cuda", 90, 32),
              "options": {"enable_fp_fusion": True, "debug": False}, "call": info,
              "shapes": [((4096,), "float32")] * 3}
    values.update(changes)
    return values


def _key(**changes) -> str | None:
    values = _inputs(**changes)
    fields = {k: values[k] for k in ("platform", "fn", "args", "configs", "target", "options", "launches", "shapes")}
    call_plan = types.SimpleNamespace(info=values["call"], **fields)
    return call_records.find(call_plan, kernel_cache.current_session(), module=values.get("module")).key


def _edited_kernel(tmp_path, body: str):
    path = tmp_path / f"edited_{abs(hash(body))}.py"
    path.write_text(textwrap.dedent(f"""
        import triton
        import triton.language as tl

        @triton.jit
        def add_kernel(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(out_ptr + offs, {body}, mask=mask)
    """))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.add_kernel


def test_the_fingerprint_follows_every_input_of_the_payload(tmp_path, use_store, monkeypatch):
    use_store(tmp_path / "cache")
    base = _key()
    assert base is not None and base == _key()  # deterministic
    config, launch, info = _inputs()["configs"][0], _inputs()["launches"][0], _inputs()["call"]
    variants = {
        "args: scalar value": _key(args=["*fp32", "*fp32", 4097, "*fp32"]),
        "args: scalar type": _key(args=["*fp32", "*fp32", 4096.0, "*fp32"]),
        "args: dtype": _key(args=["*fp16", "*fp16", 4096, "*fp16"]),
        "options": _key(options={"enable_fp_fusion": False, "debug": False}),
        "constexpr": _key(configs=[value_class.replace(config, constexprs={"BLOCK": 512})]),
        "constexpr type": _key(configs=[value_class.replace(config, constexprs={"BLOCK": True})]),
        "warps": _key(configs=[value_class.replace(config, num_warps=8)]),
        "stages": _key(configs=[value_class.replace(config, num_stages=0)]),
        "description": _key(configs=[value_class.replace(config, description="BLOCK: 1024")]),
        "grid": _key(launches=[launch._replace(grid=(8, 1, 1))]),
        "zeroed": _key(launches=[launch._replace(zeroed_bytes={3: 16384})]),
        "name": _key(call=info._replace(name="other")),
        "aliases": _key(call=info._replace(aliases=((0, 0),))),
        "sizes": _key(call=info._replace(in_sizes=(8192, 8192))),
        "metadata": _key(call=info._replace(serialized_metadata=b"x")),
        "debug": _key(call=info._replace(debug=True)),
        "target": _key(target=Target("cuda", 80, 32), call=info),
        "kernel source": _key(fn=_edited_kernel(tmp_path, "tl.load(x_ptr + offs, mask=mask) * 2")),
        "shapes": _key(shapes=[((64, 64), "float32")] * 3),  # same sizes: a winner is tuned per shape
        "two configs": _key(configs=[config, config], launches=[launch, launch]),
    }
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")  # Triton's own cache-invalidating environment
    variants["triton env"] = _key()
    monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION")
    keys = list(variants.values())
    assert None not in keys and base not in keys and len(set(keys)) == len(keys), variants
    assert _key() == base  # the environment restored: the same record again

    assert _key(configs=[value_class.replace(config, constexprs={"BLOCK": object()})]) is None  # not plain: unrecorded
    use_store(tmp_path / "cache", call_records=False)
    assert _key() == base  # records kept in this session only: the call's one key all the same
    use_store(tmp_path / "cache")
    assert _key(platform="rocm", target=Target("hip", "gfx942", 64)) is None  # ROCm payloads name a temp file
    def unreadable() -> str:
        raise TypeError("the compiler and lowering sources are not readable")

    monkeypatch.setattr(call_key, "code_identity", unreadable)  # sources unreadable (compiled files only): no records
    monkeypatch.setattr(call_key, "_static", BoundedMemo())  # as a process that never read them
    assert _key() is None


def test_the_key_follows_tritons_environment_as_the_content_keys_do(tmp_path, use_store, monkeypatch):
    """An environment change is seen by the next call's key, within one JAX module too (the content
    keys of its kernels see it there, and the two keys must move together), and a module's memo
    never answers for another module on a reused MLIR context (JAX 0.12 reuses one for up to 10)."""
    import types

    from jax._src.lib.mlir import ir

    use_store(tmp_path / "cache")
    shared = ir.Context()
    first = types.SimpleNamespace(context=shared, lowering_cache={})
    second = types.SimpleNamespace(context=shared, lowering_cache={})
    base = _key(module=first)
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")
    assert _key(module=first) != base  # the same module: the compile inputs changed
    assert _key(module=second) != base
    monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION")
    assert _key(module=types.SimpleNamespace(context=shared, lowering_cache={})) == base  # and back


def test_the_fingerprint_is_the_same_in_another_process(tmp_path, use_store):
    use_store(tmp_path / "cache")
    here = _key()
    code = ("import sys; sys.path.insert(0, 'tests'); import kernel_cache; from test_call_records import _key; "
            f"kernel_cache.configure(kernel_cache.Config(dir={str(tmp_path / 'cache')!r})); print(_key())")
    assert run_python(code).stdout.strip() == here


def test_a_damaged_or_foreign_entry_under_a_record_key_is_lowered_again(cache_dir, use_store):
    store = use_store(cache_dir / "damaged")
    _, fn, shapes = PROGRAMS[0]
    good = lower(fn, shapes)
    (key,) = entries(store, call_entry.KIND)
    store.put(Entry(key=key, meta={"kind": "triton-kernel", "name": "impostor"}, blobs={}))
    forget()
    assert lower(fn, shapes) == good
    (again,) = entries(store, call_entry.KIND).values()
    assert again.key == key and call_entry.CallRecord.from_entry(again).payload is not None


def _winner_slot_records(store):
    return {k: call_entry.CallRecord.from_entry(e) for k, e in entries(store, call_entry.KIND).items()}


def test_a_winner_stored_later_redirects_the_record_and_its_removal_restores_it(cache_dir, use_store):
    store = use_store(cache_dir / "winners", gpu_model=GPU)
    site = site_of(inplace)
    assert entries(store, call_entry.KIND) == {}  # tuning lowers without reading or writing records
    autotuned = lower(inplace, (VEC, VEC))
    assert len(autotuned) == 1 and "autotuned" in autotuned[0]
    (first,) = _winner_slot_records(store).values()
    assert first.winner_key == site.key and len(first.config_keys) == 2

    put_winner(store, record_for(site, 1))
    forget()
    plain = lower(inplace, (VEC, VEC))
    assert "autotuned" not in plain[0] and plain[0]["target"] == "triton_kernel_call_ffi"
    found = _winner_slot_records(store)
    assert len(found) == 2 and {len(r.config_keys) for r in found.values()} == {1, 2}

    for key in entries(store, "triton-kernel"):
        store.delete(key)
    forget()
    before = store.stats.session()["compiles"]
    assert lower(inplace, (VEC, VEC)) == plain  # the winner's record alone
    assert store.stats.session()["compiles"] == before

    store.delete(site.key)  # the winner is gone: back to the autotuned record
    forget()
    assert lower(inplace, (VEC, VEC)) == autotuned
    assert store.stats.session()["compiles"] == before


def test_a_call_first_lowered_as_its_winner_points_at_it(cache_dir, use_store):
    store = use_store(cache_dir / "pointer", gpu_model=GPU)
    site = site_of(inplace)
    put_winner(store, record_for(site, 0))
    plain = lower(inplace, (VEC, VEC))
    assert "autotuned" not in plain[0]
    pointer = [r for r in _winner_slot_records(store).values() if r.payload is None]
    assert len(pointer) == 1 and pointer[0].winner_key == site.key and len(pointer[0].config_keys) == 2
    forget()
    assert lower(inplace, (VEC, VEC)) == plain

    store.delete(site.key)
    forget()
    autotuned = lower(inplace, (VEC, VEC))  # built kernel by kernel, and now recorded with its payload
    assert "autotuned" in autotuned[0]
    assert all(r.payload is not None for r in _winner_slot_records(store).values())


def test_another_node_is_served_from_the_shared_directory(cache_dir, use_store):
    shared = cache_dir / "shared"
    shared.mkdir(mode=0o2775)
    use_store(cache_dir / "node-a", shared_dir=shared)
    _, fn, shapes = PROGRAMS[1]
    calls = lower(fn, shapes)
    store = use_store(cache_dir / "node-b", shared_dir=shared)  # a fresh local level on another node
    forget()
    assert lower(fn, shapes) == calls
    session = store.stats.session()
    assert session["compiles"] == 0 and session["record_hits"].get("shared") == 1
    assert session["level_counts"]["disk"]["backfills"] == 1 and session["level_counts"]["disk"]["misses"] == 1
    assert len(entries(store, call_entry.KIND)) == 1 and entries(store, "triton-kernel") == {}  # backfilled: the record


def test_kernels_a_record_serves_stay_recent_in_the_lru_order(cache_dir, use_store):
    """Served from its record, a kernel is never read; it must not look unused to a size-bounded level
    (after a kernel-cache or toolchain upgrade every call is fingerprinted anew and needs its kernels)."""
    import os

    shared = cache_dir / "shared-touch"
    shared.mkdir(mode=0o2775)
    store = use_store(cache_dir / "touch", shared_dir=shared)
    _, fn, shapes = PROGRAMS[0]
    lower(fn, shapes)
    (kernel,) = entries(store, "triton-kernel")
    shared_file = shared / "entries" / kernel[:2] / kernel
    os.utime(store.disk.directory / "entries" / kernel[:2] / kernel, (1000, 1000))
    os.utime(shared_file, (1000, 1000))
    forget()
    lower(fn, shapes)  # served by the record: the kernel is not read
    assert {r["key"]: r["last_used"] for r in store.disk.listing()}[kernel] == 1000  # deferred, not per call
    front_level.save_all()  # what exit does first: the uses are told to the levels with the warm set's
    store.disk.flush_touches()
    store.shared.flush_touches()
    assert {r["key"]: r["last_used"] for r in store.disk.listing()}[kernel] > 1e9
    assert shared_file.stat().st_mtime > 1e9
