"""Persisted autotune winners on a CPU host: the record and its key, the store round trip, the
lowering picking a stored winner (cross-lowered for cuda), stale and foreign winners falling back
to the autotuned call, cachectl list/show/prune/verify/export/import carrying winners, and
`cachectl tune` refusing to run without a GPU.

A winner record stands in for `cachectl tune`'s result (which needs a GPU: see test_gpu_tuning.py);
the call site it is filed for comes from the lowering itself (`winners.tuning(record=...)`).
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import jax
import jax.numpy as jnp
import pytest
import triton
from conftest import child_env
from inspect_call import custom_calls
from test_cachectl import as_json, cachectl, ok

import compiler
import kernel_cache
from cachectl import entry_kinds
from compiler.toolchain import toolchain_summary
from kernel_cache import Config, Store
from kernel_cache.entries import entry as entry_format
from kernel_cache.entries import winner_entry
from lowering import examples as ep
from lowering.payload import jaxlib_compat as compat
from lowering.records import winners

GPU = "Test GPU 80GB"
VEC = jax.ShapeDtypeStruct((4096,), jnp.float32)


def inplace(x, y, kernel=ep.tuned_add):
    return ep.inplace_tuned_add(x, y, compute_capability=90) if kernel is ep.tuned_add else \
        ep.jt.triton_call(x, y, x.size, kernel=kernel, out_shape=x, input_output_aliases={0: 0},
                          grid=lambda m: (ep.jt.cdiv(x.size, m["BLOCK"]),), compute_capability=90)


def lower_call(fn=inplace, *shapes):
    jax.clear_caches()  # jit would hand back an earlier lowering of the same function
    lowered = jax.jit(fn).trace(*(shapes or (VEC, VEC))).lower(lowering_platforms=("cuda",))
    (call,) = custom_calls(lowered)
    return call, lowered


def site_of(fn=inplace) -> winners.Site:
    seen: list[winners.Site] = []
    with winners.tuning(kernel_cache.current_session(), {}, record=seen):
        lower_call(fn)
    (site,) = seen
    return site


def record_for(site: winners.Site, winner: int, device: str | None = None, **changes) -> winner_entry.Winner:
    timings = tuple(winner_entry.ConfigTiming(k, d, 1e-3 * (1 + abs(i - winner)))
                    for i, (k, d) in enumerate(zip(site.config_keys, site.descriptions)))
    record = winner_entry.Winner(kernel=site.kernel, arch=site.spec.target.name, target=dict(site.spec.target.json),
                                 toolchain=toolchain_summary(site.spec.target), device=device or site.device,
                                 key_values=site.key_values, key_text=site.key_text, configs=timings, winner=winner,
                                 reps=20, label="test")
    return dataclasses.replace(record, **changes)


def put_winner(store, record: winner_entry.Winner) -> None:
    """Store a winner as `cachectl tune` does: in the store, and in this process's lookup memo."""
    store.put(record.to_entry())
    winners.remember(kernel_cache.current_session(), record)


@pytest.fixture
def gpu_store(tmp_path):
    """The process store on a fresh directory, lowering for the GPU model GPU; restored after."""
    store = kernel_cache.configure(Config(dir=tmp_path / "cache", gpu_model=GPU))
    yield store
    kernel_cache.configure()


# The record and its key ------------------------------------------------------------------------
FAKE_KEYS = (f"{1:032x}", f"{2:032x}", f"{3:032x}")


def fake_record(**changes) -> winner_entry.Winner:
    record = winner_entry.Winner(
        kernel="k", arch="sm_90", target={"backend": "cuda", "arch": 90, "warp_size": 32}, toolchain="triton-x+abc",
        device=GPU, key_values=winner_entry.canonical({"key": [["n", 4096]]}), key_text="n=4096",
        configs=tuple(winner_entry.ConfigTiming(k, f"BLOCK: {256 << i}", 1e-3 * (i + 1)) for i, k in enumerate(FAKE_KEYS)),
        winner=0, reps=5, label="prog")
    return dataclasses.replace(record, **changes)


def test_record_round_trips_through_the_entry_format_and_keys_its_content():
    record = fake_record()
    entry = record.to_entry()
    decoded = entry_format.decode(entry_format.encode(entry), expected_key=record.key)
    assert winner_entry.Winner.from_meta(decoded.meta) == record and decoded.blobs == {}
    assert winner_entry.problem(decoded) is None and entry_format.is_key(record.key)
    # the family is the set of config keys: their order does not matter, their content does
    assert fake_record(configs=record.configs[::-1], winner=2).key == record.key
    assert fake_record(configs=record.configs[:2]).key != record.key
    assert fake_record(device="NVIDIA H100 80GB HBM3").key != record.key
    # key values are type-tagged: 4096, 4096.0 and "4096" are three problems
    for other in (4096.0, "4096", True):
        assert fake_record(key_values=winner_entry.canonical({"key": [["n", other]]})).key != record.key


def test_a_record_of_the_retired_format_is_never_used_and_is_no_damage():
    """Winner format 2 (key values in the one canonical encoding) replaces format 1: its records
    are never looked up (no key of this version reaches them), are not reported as
    damaged by verify or import, and say why when read."""
    entry = fake_record().to_entry()
    entry.meta["format"] = 1
    assert "tune again with cachectl tune" in winner_entry.problem(entry)
    assert winner_entry.damage(entry) is None and entry_kinds.problem(entry) is None
    assert winner_entry.summary(entry.meta) is None
    entry.meta["format"] = 3  # a newer writer's: not ours to judge or to use
    assert "not an autotune winner record" in winner_entry.damage(entry)


def test_problem_refuses_malformed_or_misfiled_records():
    record = fake_record()
    moved = entry_format.Entry(key=fake_record(device="other").key, meta=record.to_entry().meta)
    assert "another key" in winner_entry.problem(moved)
    bad_index = record.to_entry()
    bad_index.meta["winner"]["index"] = 7
    assert "config #7" in winner_entry.problem(bad_index)
    failed_winner = fake_record(configs=(winner_entry.ConfigTiming(FAKE_KEYS[0], "a", None, "boom"),
                                         *fake_record().configs[1:]))
    assert "did not time" in winner_entry.problem(failed_winner.to_entry())
    not_a_key = record.to_entry()
    not_a_key.meta["configs"][0]["key"] = "../../etc"
    assert "no content key" in winner_entry.problem(not_a_key)
    assert winner_entry.summary({"kind": "triton-kernel"}) is None


def test_store_round_trip_across_processes_of_the_store(tmp_path):
    record = fake_record()
    store = Store(Config(dir=tmp_path / "c"))
    store.put(record.to_entry())
    store.close()
    again = Store(Config(dir=tmp_path / "c"))
    entry, level = again.get(record.key)
    again.close()
    assert level == "disk" and winner_entry.Winner.from_meta(entry.meta) == record


# Lowering ------------------------------------------------------------------------------------------
def test_lowering_uses_the_stored_winner_as_one_plain_ffi_call(gpu_store):
    call, _ = lower_call()
    assert call["target"] == compat.LEGACY_TARGET and len(call["autotuned"]["configs"]) == 2
    site = site_of()
    assert site.device == GPU and site.key_text == "n=4096; f32[4096], f32[4096] -> f32[4096]"
    put_winner(gpu_store, record_for(site, winner=1))
    call, lowered = lower_call()
    assert call["target"] == compat.FFI_TARGET and "autotuned" not in call
    kc = call["kernel_call"]
    assert kc["grid"] == (4096 // 512, 1, 1) and kc["kernel"]["num_warps"] == 4  # config #1: BLOCK 512, 4 warps
    spec = compiler.make_spec(ep.add, ["*fp32", "*fp32", 4096, "*fp32"], {"BLOCK": 512}, target=90, num_warps=4)
    assert kc["kernel"]["ptx"] == compiler.get_or_compile(spec)[0].ptx
    assert "output_operand_aliases" in lowered.as_text()  # the in-place call stays in place


def test_a_winner_lowers_without_compiling_the_other_configs(tmp_path):
    site = site_of_with(Config(gpu_model=GPU))
    store = kernel_cache.configure(Config(dir=tmp_path / "only-winner", gpu_model=GPU))
    try:
        store.put(record_for(site, winner=0).to_entry())
        call, _ = lower_call()
        assert call["kernel_call"]["grid"] == (16, 1, 1)
        assert store.stats.session()["compiles"] == 1  # the winner's kernel, not both configs
    finally:
        kernel_cache.configure()


def site_of_with(config: Config) -> winners.Site:
    kernel_cache.configure(config)
    try:
        return site_of()
    finally:
        kernel_cache.configure()


def test_other_gpu_no_gpu_model_or_winners_off_keep_the_call_autotuned(gpu_store, monkeypatch):
    site = site_of()
    put_winner(gpu_store, record_for(site, winner=1, device="Another GPU"))  # tuned elsewhere
    assert "autotuned" in lower_call()[0]
    put_winner(gpu_store, record_for(site, winner=1))
    for config in (gpu_store.config.with_(winners=False), gpu_store.config.with_(gpu_model=None)):
        kernel_cache.configure(config)  # the same directory, which holds the winner
        assert "autotuned" in lower_call()[0], config
    kernel_cache.configure(gpu_store.config)
    assert "autotuned" not in lower_call()[0]


def test_stale_or_misfiled_winners_fall_back_to_the_autotuned_call(gpu_store):
    site = site_of()
    put_winner(gpu_store, record_for(site, winner=1))
    # a third config makes another family: the winner of the two-config kernel does not apply
    three = triton.autotune(configs=[*ep.tuned_add.configs, triton.Config({"BLOCK": 1024}, num_warps=4)],
                            key=["n"])(ep.add)
    call, _ = lower_call(lambda x, y: inplace(x, y, kernel=three))
    assert len(call["autotuned"]["configs"]) == 3
    # a record filed under this site's key whose content is another family's is never used
    other = record_for(site, winner=1, configs=tuple(dataclasses.replace(c, key=k) for c, k in
                                                     zip(record_for(site, 1).configs, FAKE_KEYS)))
    gpu_store.delete(site.key)
    gpu_store.put(entry_format.Entry(key=site.key, meta=other.to_entry().meta))
    kernel_cache.configure(gpu_store.config)  # a new process store: nothing memoized
    assert "autotuned" in lower_call()[0]


def test_winner_lookups_are_memoized_per_process(gpu_store, monkeypatch):
    site = site_of()
    gpu_store.put(record_for(site, winner=0).to_entry())  # stored by another process: not in this one's memo
    reads = []
    real_get = type(gpu_store).get
    monkeypatch.setattr(type(gpu_store), "get", lambda self, key: reads.append(key) or real_get(self, key))
    for _ in range(3):
        assert "autotuned" not in lower_call()[0]
    assert reads.count(site.key) == 1


# cachectl ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tuned_cache(tmp_path_factory):
    """(directory, winner record): a cache holding tuned_add's two kernels and their winner."""
    directory = tmp_path_factory.mktemp("winners") / "cache"
    store = kernel_cache.configure(Config(dir=directory, gpu_model=GPU))
    try:
        site = site_of()
        record = record_for(site, winner=1)
        store.put(record.to_entry())
    finally:
        kernel_cache.configure()
    return directory, record


@pytest.fixture
def tuned_copy(tuned_cache, tmp_path):
    directory, record = tuned_cache
    shutil.copytree(directory, tmp_path / "cache")
    return tmp_path / "cache", record


def test_list_and_show_display_winners(tuned_cache):
    directory, record = tuned_cache
    text = ok("--dir", directory, "list").stdout
    assert f"{record.key[:12]}  add_kernel [winner]" in text
    assert f"add_kernel on {GPU} [n=4096; " in text and "BLOCK: 512" in text and "1.000 ms" in text
    entries = {e["key"]: e for e in as_json("--dir", directory, "list")}
    assert len(entries) == 3 and entries[record.key]["kind"] == "autotune-winner"
    assert entries[record.key]["winner"]["config"] == record.best.description
    assert entries[record.key]["winner"]["config_key"] in entries  # the winning kernel is in the cache
    assert entries[record.key]["stale"] is False
    kernels = [e for e in entries.values() if e["kind"] == "triton-kernel"]
    assert len(kernels) == 2 and all(e["winner"] is None for e in kernels)
    shown = ok("--dir", directory, "show", record.key[:10]).stdout
    assert f"gpu          {GPU}" in shown and "key values   n=4096" in shown
    assert "->  1.000 ms  BLOCK: 512" in shown and "2.000 ms  BLOCK: 256" in shown
    doc = json.loads(ok("--dir", directory, "show", record.key, "--json").stdout)
    assert doc["kind"] == "autotune-winner" and doc["winner"]["device"] == GPU and doc["meta"]["configs"]


def test_prune_and_verify_handle_winners(tuned_copy):
    directory, record = tuned_copy
    assert ok("--dir", directory, "verify").returncode == 0
    moved = record.to_entry()
    moved.meta["device"] = "Another GPU"  # a valid entry whose record no longer gives its key
    store = Store(Config(dir=directory))
    store.put(moved)
    store.close()
    bad = cachectl("--dir", directory, "verify", "--json")
    assert bad.returncode == 1
    (item,) = json.loads(bad.stdout)["bad"]
    assert item["key"] == record.key and "another key" in item["reason"]
    removed = json.loads(ok("--dir", directory, "prune", "--kernel", "add_kernel", "--json").stdout)["removed"]
    assert {r["kind"] for r in removed} == {"triton-kernel", "autotune-winner"} and len(removed) == 3


def test_export_and_import_carry_winners(tuned_cache, tmp_path):
    directory, record = tuned_cache
    bundle = tmp_path / "warm.kcb"
    assert json.loads(ok("--dir", directory, "export", bundle, "--json").stdout)["entries"] == 3
    fresh = tmp_path / "fresh"
    doc = json.loads(ok("--dir", fresh, "import", bundle, "--json").stdout)
    assert doc["imported"] == 3 and doc["stale"] == 0 and doc["rejected"] == []
    store = Store(Config(dir=fresh))
    entry, _ = store.get(record.key)
    store.close()
    assert winner_entry.Winner.from_meta(entry.meta) == record


def test_tune_refuses_to_run_without_a_gpu(tmp_path):
    target = tmp_path / "new-cache"
    out = cachectl("--dir", target, "tune", "lowering.examples:tune_programs", env={"JAX_PLATFORMS": "cpu"})
    assert out.returncode == 2 and "no CUDA GPU" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not target.exists()
    doc = json.loads(cachectl("--dir", target, "tune", "lowering.examples:tune_programs", "--json",
                              env={"JAX_PLATFORMS": "cpu"}).stdout)
    assert doc["exit_code"] == 2 and "no CUDA GPU" in doc["error"]
    assert child_env()  # (the children ran with this repo on PYTHONPATH)
