"""Telemetry: `cachectl stats --format prometheus`, the store's counters as
kernel_cache.telemetry.events and jax.monitoring events, and stats' polish (who may write, kinds per level).

Caches here hold synthetic entries (their metadata names a kind, as real kernels, lowered-call
records and winners do); only the lowering test compiles a real kernel, in a child process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
import warnings
from collections import Counter
from pathlib import Path

import pytest
from conftest import child_env, run_python
from test_cachectl import as_json, cachectl, ok
from test_shared_level import KEY, Builder, mounted

from cachectl import entry_kinds
from kernel_cache import Config, Store
from kernel_cache.entries.entry import Entry
from kernel_cache.levels.shared import SharedLevel
from kernel_cache.telemetry import events

SIGNING_KEY = b"telemetry-signing-key-0123456789ab"
KINDS = {"1" * 32: "triton-kernel", "2" * 32: "triton-kernel", "3" * 32: "lowered-call", "4" * 32: "autotune-winner"}


def build(seconds: float = 0.5):
    """A builder whose entry records what it cost, as the compiler's do (hits then count it as saved)."""
    return lambda: ({"kind": "triton-kernel", "compile_seconds": seconds}, {"cubin": b"built"}, seconds)


def entry(key: str, kind: str) -> Entry:
    return Entry(key=key, meta={"kind": kind, "name": f"k{key[:4]}", "arch": "sm_90", "compile_seconds": 0.25,
                                "created": time.time()}, blobs={"cubin": key.encode() * 10})


@pytest.fixture
def cache(tmp_path) -> Path:
    """A local cache with 2 kernels, a lowered-call record and a winner; counters: 2 disk hits and
    1 memory hit, 1 miss, 1 compile."""
    directory = tmp_path / "cache"
    store = Store(Config(dir=directory))
    for key, kind in KINDS.items():
        store.put(entry(key, kind))
    store.close()
    store = Store(Config(dir=directory))
    assert store.get_or_create("1" * 32, Builder("1" * 32))[1]  # disk hit
    assert store.get_or_create("3" * 32, Builder("3" * 32))[1]  # disk hit
    assert store.get_or_create("1" * 32, Builder("1" * 32))[1]  # memory hit
    store.get_or_create("5" * 32, Builder("5" * 32))  # miss, compile (an entry without a kind: "other")
    store.close()
    return directory


# The polish: who may write, kinds per level --------------------------------------------------------------
def test_stats_on_a_writable_cache_does_not_say_read_only(cache):
    stats = as_json("--dir", cache, "stats")
    assert stats["levels"]["disk"]["writable"] is True
    assert "read-only here" not in ok("--dir", cache, "stats").stdout


def test_stats_on_a_read_only_mount_says_read_only(cache, tmp_path):
    with mounted("--bind", "-o", "ro", str(cache), str(tmp_path / "ro")) as ro:
        if os.access(ro, os.W_OK):
            pytest.skip("this machine's bind mount is not read-only")
        assert as_json("--dir", ro, "stats")["levels"]["disk"]["writable"] is False
        human = ok("--dir", ro, "stats").stdout
        assert re.search(r"^disk entries +5 \(.*, read-only here\)", human, re.M), human


def test_stats_counts_kinds_per_level(cache, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    level = SharedLevel(shared)
    for key in ("1" * 32, "2" * 32):  # copies of the local kernels
        level.put(entry(key, "triton-kernel"))
    stats = as_json("--dir", cache, "--shared-dir", shared, "stats")
    assert stats["levels"]["disk"]["kinds"] == {"triton-kernel": 2, "lowered-call": 1, "autotune-winner": 1,
                                               "other": 1}
    assert stats["levels"]["shared"]["kinds"] == {"triton-kernel": 2}
    assert stats["kinds"]["triton-kernel"] == 4  # the total names copies, as "entries" does
    human = ok("--dir", cache, "--shared-dir", shared, "stats").stdout
    assert ("entry kinds          disk: 2 kernels, 1 lowered call, 1 winner, 1 other; shared: 2 kernels\n"
            in human), human
    # one level: the line as it was
    assert "entry kinds          2 kernels, 1 lowered call, 1 winner, 1 other\n" in ok("--dir", cache, "stats").stdout


# cachectl stats --format prometheus ---------------------------------------------------------------------
SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(?:,|$)')


def parse_exposition(text: str) -> dict[str, dict]:
    """Prometheus' text format, strictly: family -> {"type", "help", "samples": {labels: value}}.
    Fails on a sample before its TYPE, a family declared twice, a duplicate series, a bad line."""
    assert text.endswith("\n") and "\r" not in text
    families: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            _, _, name, help_text = line.split(" ", 3)
            assert name not in families, f"{name} declared twice"
            families[name] = current = {"help": help_text, "type": None, "samples": {}}
            current["name"] = name
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert current is not None and current["name"] == name and kind in ("counter", "gauge"), line
            current["type"] = kind
        else:
            match = SAMPLE.match(line)
            assert match and current is not None and match["name"] == current["name"], line
            labels = tuple(LABEL.findall(match["labels"] or ""))
            assert labels not in current["samples"], f"duplicate series {line}"
            current["samples"][labels] = float(match["value"])
    for name, family in families.items():
        assert name.startswith("kernel_cache_") and family["type"] and family["samples"], name
        assert family["type"] != "counter" or name.endswith("_total"), name
    return families


def series(families, name, **labels) -> float:
    """The one sample of `name` whose labels include `labels`."""
    (value,) = [v for key, v in families[name]["samples"].items() if labels.items() <= dict(key).items()]
    return value


def test_prometheus_values_are_the_json_numbers(cache, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    SharedLevel(shared).put(entry("1" * 32, "triton-kernel"))
    args = ("--dir", cache, "--shared-dir", shared, "stats")
    report = as_json(*args)
    text = ok(*args, "--format", "prometheus").stdout
    families = parse_exposition(text)
    assert all(dict(k)["dir"] == str(cache) for f in families.values() for k in f["samples"])
    assert report["hits"] == {"memory": 1, "disk": 2, "job": 0, "shared": 0, "remote": 0}
    for level, hits in report["hits"].items():
        assert series(families, "kernel_cache_hits_total", level=level, kind="kernel") == hits
        assert series(families, "kernel_cache_hits_total", level=level, kind="call") == report["record_hits"][level]
    for name, field in (("misses_total", "misses"), ("compiles_total", "compiles"), ("errors_total", "errors"),
                        ("rejected_total", "rejected"), ("compile_seconds_total", "compile_seconds"),
                        ("compile_seconds_saved_total", "compile_seconds_saved"), ("max_bytes", "max_bytes")):
        assert series(families, f"kernel_cache_{name}") == report[field], name
    assert report["compile_seconds_saved"] == pytest.approx(0.75)
    for level, t in report["levels"].items():
        assert series(families, "kernel_cache_entries", level=level) == t["entries"]
        assert series(families, "kernel_cache_bytes", level=level) == t["bytes"]
        assert series(families, "kernel_cache_level_writable", level=level) == int(t["writable"])
        for kind in entry_kinds.every():
            assert series(families, "kernel_cache_entries_by_kind", level=level, kind=kind.tag) == \
                t["kinds"].get(kind.name, 0)
    assert series(families, "kernel_cache_entries_by_kind", level="shared", kind="kernel") == 1
    assert series(families, "kernel_cache_counters_persisted") == 1
    assert series(families, "kernel_cache_over_max_bytes") == 0


def test_format_option_and_json_flag(cache):
    assert json.loads(ok("--dir", cache, "stats", "--format", "json").stdout)["entries"] == 5
    assert json.loads(ok("--dir", cache, "stats", "--json", "--format", "json").stdout)["entries"] == 5
    assert ok("--dir", cache, "stats", "--format", "text").stdout == ok("--dir", cache, "stats").stdout
    clash = cachectl("--dir", cache, "stats", "--json", "--format", "prometheus")
    assert clash.returncode == 2 and "--json" in clash.stderr and "prometheus" in clash.stderr
    assert cachectl("--dir", cache, "stats", "--format", "yaml").returncode == 2
    # --zero with prometheus: the zeroed metrics alone on stdout
    zeroed = parse_exposition(ok("--dir", cache, "stats", "--zero", "--format", "prometheus").stdout)
    assert series(zeroed, "kernel_cache_hits_total", level="disk", kind="kernel") == 0
    assert series(zeroed, "kernel_cache_entries", level="disk") == 5


def test_the_textfile_recipe_writes_whole_files_or_none(cache, tmp_path):
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    recipe = ('cachectl() { "$PYTHON" -m kernel_cache "$@"; }; '
              'cachectl --dir "$CACHE" stats --format prometheus > "$DIR/kernel_cache.prom.$$" '
              '&& mv "$DIR/kernel_cache.prom.$$" "$DIR/kernel_cache.prom"')
    def run(directory):
        env = child_env(PYTHON=sys.executable, CACHE=str(directory), DIR=str(textfiles))
        return subprocess.run(["bash", "-c", recipe], env=env, capture_output=True, text=True, timeout=300)

    assert run(cache).returncode == 0
    written = (textfiles / "kernel_cache.prom").read_text()
    assert parse_exposition(written)["kernel_cache_entries"]
    failed = run(tmp_path / "no-such-cache")
    assert failed.returncode == 2 and "no cache directory" in failed.stderr
    assert (textfiles / "kernel_cache.prom").read_text() == written  # the last good file stays
    leftovers = [p for p in textfiles.iterdir() if p.name != "kernel_cache.prom"]
    assert [p.stat().st_size for p in leftovers] == [0]  # the shell's temp file: empty, and not *.prom


def test_prometheus_escapes_label_values(tmp_path):
    from cachectl.see import prometheus

    odd = tmp_path / 'we"ird\\dir\nname'
    none = {"memory": 0, "disk": 0, "job": 0, "shared": 0, "remote": 0}
    report = {"dir": str(odd), "hits": none, "record_hits": none, "misses": 0,
              "compiles": 0, "errors": 0, "rejected": 0, "compile_seconds": 0.0, "compile_seconds_saved": 0.0,
              "levels": {}, "max_bytes": 1, "over_max_bytes": False, "counters": "persisted"}
    families = parse_exposition(prometheus.render(report))
    (labels,) = families["kernel_cache_misses_total"]["samples"]
    assert dict(labels)["dir"] == str(odd).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


WARM_CHILD = textwrap.dedent("""
    import json
    import jax
    from kernel_cache import default_store
    from lowering import examples as ep

    for label, fn, shapes in ep.programs():
        jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",))
    print(json.dumps(default_store().stats.session()))
""")


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory) -> tuple[Path, dict]:
    """(a cache, the session counters of its warm process): the example programs cross-lowered for
    sm_90 on the CPU twice, each time in a fresh process, as consecutive jobs (and the demo) run them."""
    directory = tmp_path_factory.mktemp("warm") / "cache"
    env = {"KERNEL_CACHE_DIR": str(directory), "KERNEL_CACHE_TARGET_ARCH": "sm_90", "JAX_PLATFORMS": "cpu"}
    runs = [json.loads(run_python(WARM_CHILD, env).stdout.strip().splitlines()[-1]) for _ in ("cold", "warm")]
    return directory, runs[1]


def test_a_warm_process_hits_are_in_prometheus_as_in_json(warm_cache):
    directory, warm = warm_cache
    assert warm["compiles"] == 0 and sum(warm["record_hits"].values()) > 0, warm  # served by lowered-call records
    report = as_json("--dir", directory, "stats")
    families = parse_exposition(ok("--dir", directory, "stats", "--format", "prometheus").stdout)
    hits = families["kernel_cache_hits_total"]["samples"]
    assert {dict(labels)["kind"] for labels in hits} == {"kernel", "call"}
    for level in report["hits"]:
        assert series(families, "kernel_cache_hits_total", level=level, kind="kernel") == report["hits"][level]
        assert series(families, "kernel_cache_hits_total", level=level, kind="call") == report["record_hits"][level]
    served = sum(report["hits"].values()) + sum(report["record_hits"].values())
    assert sum(hits.values()) == served >= sum(warm["record_hits"].values()) > 0


def test_the_docs_name_every_label_value_prometheus_prints(warm_cache):
    """docs/cachectl.md's `kind="a|b|..."` of hits_total and entries_by_kind: the values the output carries."""
    directory, _ = warm_cache
    families = parse_exposition(ok("--dir", directory, "stats", "--format", "prometheus").stdout)
    telemetry = (Path(__file__).resolve().parents[2] / "docs" / "cachectl.md").read_text().split("## Telemetry")[1]
    for name in ("kernel_cache_hits_total", "kernel_cache_entries_by_kind"):
        documented = re.search(rf'`{name}\{{[^}}]*kind="([^"]+)"\}}`', telemetry)
        assert documented, name
        printed = [dict(labels)["kind"] for labels in families[name]["samples"]]
        assert documented[1].split("|") == list(dict.fromkeys(printed)), name
    assert set(documented[1].split("|")) == {k.tag for k in entry_kinds.every()}


# kernel_cache.telemetry.events ------------------------------------------------------------------------------------
@pytest.fixture
def recorded():
    seen: list[events.Event] = []
    events.add_listener(seen.append)
    yield seen
    events.remove_listener(seen.append)


def test_the_store_emits_each_counted_event(tmp_path, recorded):
    store = Store(Config(dir=tmp_path / "c"))
    store.get_or_create(KEY, build(0.5))
    store.get_or_create(KEY, build(0.5))
    fresh = Store(Config(dir=tmp_path / "c"))
    fresh.get_or_create(KEY, build(0.5))
    assert recorded == [events.Event("miss"), events.Event("compile", "", 0.5), events.Event("hit", "memory", 0.5),
                        events.Event("hit", "disk", 0.5)]
    session = Counter()
    for s in (store.stats.session(), fresh.stats.session()):
        session.update({f"hits.{t}": n for t, n in s["hits"].items()})
        session.update(misses=s["misses"], compiles=s["compiles"])
    assert session["hits.memory"] == 1 and session["hits.disk"] == 1 and session["misses"] == session["compiles"] == 1
    store.close()
    fresh.close()


def test_a_rejected_entry_is_an_event_with_its_level(tmp_path, recorded):
    shared = tmp_path / "shared"
    shared.mkdir()
    SharedLevel(shared).put(entry(KEY, "triton-kernel"))  # unsigned
    store = Store(Config(dir=tmp_path / "c", shared_dir=shared, signing_key=SIGNING_KEY))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert store.get(KEY) is None
    assert [(e.kind, e.level) for e in recorded] == [("rejected", "shared")]
    assert store.stats.session()["rejected"] == 1
    store.close()


def test_a_failing_listener_never_fails_a_lookup(tmp_path):
    def broken(event):
        raise RuntimeError("listener bug")

    heard: list[events.Event] = []
    events.add_listener(broken)
    events.add_listener(heard.append)
    try:
        store = Store(Config(dir=tmp_path / "c"))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # even warnings-as-errors do not reach the caller
            assert store.get_or_create(KEY, Builder(KEY))[1]
            assert store.get_or_create(KEY, Builder(KEY))[1]
        assert [e.kind for e in heard] == ["miss", "compile", "hit"]  # a listener after it still hears
        assert store.stats.session()["compiles"] == 1
        store.close()
    finally:
        events.remove_listener(broken)
        events.remove_listener(heard.append)


def test_with_no_listener_nothing_is_built(monkeypatch):
    from kernel_cache.telemetry import stats as counters  # where the events live (kernel_cache.telemetry.events names them)

    monkeypatch.setattr(counters, "_listeners", ())
    monkeypatch.setattr(counters, "_recorders", ())
    monkeypatch.setattr(counters, "Event", None)  # an event object would be built only for a listener
    events.emit(events.HIT, "disk", 1.0)
    start = time.perf_counter()
    for _ in range(100_000):
        events.emit(events.MISS)
    assert time.perf_counter() - start < 0.5  # a call and a check: well under a microsecond each


def test_the_core_does_not_import_jax_for_events():
    loaded = run_python("import sys, kernel_cache.telemetry.events, kernel_cache.telemetry.stats; "
                        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'lowering')))")
    assert loaded.stdout.strip().splitlines()[-1] == "[]"


# jax.monitoring ------------------------------------------------------------------------------------------
def test_jax_monitoring_signatures_take_keyword_metadata():
    """The forwarder passes level=...: every supported JAX takes **kwargs in record_event and
    record_event_duration_secs and hands them to listeners."""
    import inspect

    from jax import monitoring

    for fn in (monitoring.record_event, monitoring.record_event_duration_secs):
        assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(fn).parameters.values()), fn


def test_jax_listeners_see_the_store_as_they_see_jaxs_cache(tmp_path):
    import jax.monitoring

    import lowering.monitoring as lm

    seen: list[tuple] = []

    def on_event(event, **kw):
        if event.startswith("/kernel_cache/"):
            seen.append((event, kw))

    def on_duration(event, duration, **kw):
        if event.startswith("/kernel_cache/"):
            seen.append((event, round(duration, 6), kw))

    jax.monitoring.register_event_listener(on_event)
    jax.monitoring.register_event_duration_secs_listener(on_duration)
    try:
        assert lm.RECORDER in events.recorders()  # installed by importing lowering
        store = Store(Config(dir=tmp_path / "c"))
        store.get_or_create(KEY, build(0.5))
        store.get_or_create(KEY, build(0.5))
        store.stats.count(events.ERROR)
        store.stats.count(events.REJECTED, "remote")
        store.close()
    finally:
        jax.monitoring.unregister_event_listener(on_event)
        jax.monitoring.unregister_event_duration_listener(on_duration)
    assert seen == [("/kernel_cache/misses", {}),
                    ("/kernel_cache/compiles", {}), ("/kernel_cache/compile_time_sec", 0.5, {}),
                    ("/kernel_cache/hits", {"level": "memory"}),
                    ("/kernel_cache/compile_time_saved_sec", 0.5, {"level": "memory"}),
                    ("/kernel_cache/errors", {}), ("/kernel_cache/rejected", {"level": "remote"})]


LOWERING_CHILD = textwrap.dedent("""
    import json, sys
    from collections import Counter
    import jax, jax.monitoring, jax.numpy as jnp
    from kernel_cache import default_store
    from kernel_cache.telemetry import events
    import lowering
    from lowering import examples as ep

    seen = Counter()
    def record(event, **kw):
        seen[event + "".join(f"|{k}={v}" for k, v in sorted(kw.items()))] += 1
    def boom(event, *args, **kw):
        raise RuntimeError("a broken JAX listener")
    def core_boom(event):
        raise RuntimeError("a broken kernel_cache listener")
    jax.monitoring.register_event_listener(record)
    jax.monitoring.register_event_listener(boom)  # after `record`: JAX's loop stops at it
    events.add_listener(core_boom)
    vec = jax.ShapeDtypeStruct((4096,), jnp.float32)
    for _ in range(2):  # cold: a miss and a compile; then served from memory
        fn = lambda x, y: ep.add_program(x, y, block=1024, compute_capability=90)
        jax.jit(fn).trace(vec, vec).lower(lowering_platforms=("cuda",))
    print(json.dumps({"seen": seen, "stats": default_store().stats.session()}))
""")


def test_a_broken_listener_never_fails_a_lowering_and_jax_counts_match_stats(tmp_path):
    proc = run_python(LOWERING_CHILD, env={"KERNEL_CACHE_DIR": str(tmp_path / "c"), "JAX_PLATFORMS": "cpu"})
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    seen, stats = report["seen"], report["stats"]
    served = sum(stats["hits"].values()) + sum(stats["record_hits"].values())
    assert stats["misses"] >= 1 and stats["compiles"] >= 1 and served >= 1, stats
    assert seen.get("/kernel_cache/misses", 0) == stats["misses"]
    assert seen.get("/kernel_cache/compiles", 0) == stats["compiles"]
    for level, n in stats["hits"].items():
        assert seen.get(f"/kernel_cache/hits|level={level}", 0) == n, (level, seen)
    for level, n in stats["record_hits"].items():
        assert seen.get(f"/kernel_cache/record_hits|level={level}", 0) == n, (level, seen)
    # each failure said once, as a warning: the broken JAX listener surfaces as jax.monitoring's recorder's
    assert "(core_boom) raised RuntimeError: a broken kernel_cache listener" in proc.stderr, proc.stderr
    assert "(record_event) raised RuntimeError: a broken JAX listener" in proc.stderr, proc.stderr
