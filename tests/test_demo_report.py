"""The demo says what happened: per program and phase, where its kernels came from (compiled, read
from a level, or served whole by a lowered-call record), and what went wrong with a cache level, the
phases' own warnings included."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import ROOT, child_env

from scripts import demo

NONE = {"memory": 0, "disk": 0, "job": 0, "shared": 0, "remote": 0}


def row(compiles=0, hits=None, records=None, **more) -> dict:
    return {"compiles": compiles, "hits": {**NONE, **(hits or {})}, "record_hits": {**NONE, **(records or {})}, **more}


@pytest.mark.parametrize(("served", "said"), [
    (row(compiles=6), "compiled 6"),
    (row(records={"disk": 1}), "disk record"),
    (row(records={"remote": 2}), "remote 2 records"),
    (row(compiles=1, hits={"memory": 2, "shared": 1}), "compiled 1, memory 2, shared 1"),
    (row(compiles=1, rejected=1, errors=2), "compiled 1, rejected 1, errors 2"),
    (row(), "no lookup"),
])
def test_each_way_a_kernel_is_served_is_named(served, said):
    assert demo.served_by(served) == said


def test_the_total_adds_up_every_way():
    rows = [row(compiles=1), row(records={"disk": 1}), row(hits={"memory": 1}, records={"disk": 1}, errors=1)]
    assert demo.served_by(demo.total(rows)) == "compiled 1, memory 1, disk 2 records, errors 1"


def levels(unusable=None, mode="read-write", remote=None) -> dict:
    used = [{"name": "memory", "location": "this process", "mode": "read-write"},
            {"name": "disk", "location": "/c", "mode": "read-write"}]
    if remote is not None:
        used.append({"name": "remote", "location": "redis://h:1", "mode": mode})
    return {"used": used, "unusable": unusable or {}, "remote": remote}


def test_levels_that_served_as_configured_say_nothing():
    assert demo.level_notes("cold", levels()) == []
    assert demo.level_notes("warm", levels(remote={"hits": 3, "misses": 0, "errors": 0})) == []


def test_an_unusable_a_skipped_or_a_failing_remote_is_said():
    (unsigned,) = demo.level_notes("cold", levels(unusable={"remote": "needs a signing key"}))
    assert unsigned == "cold phase: remote not used: needs a signing key"
    skipped, failing = demo.level_notes("cold", levels(mode="skipped (server failing)",
                                                       remote={"hits": 0, "misses": 26, "errors": 3, "timeouts": 1}))
    assert skipped == "cold phase: remote redis://h:1 ended skipped (server failing)"
    assert failing.startswith("cold phase: remote 3 errors, 1 timeouts (hits 0, misses 26)")


@pytest.mark.slow
@pytest.mark.parametrize(("settings", "stderr", "note"), [
    ({}, r"\[cold phase\] .*needs a signing key", "cold phase: remote not used: "),
    ({"KERNEL_CACHE_REMOTE_UNSIGNED": "1"}, r"\[cold phase\] .*Connection refused", "cold phase: remote "),
], ids=["unsigned", "unreachable"])
def test_a_remote_problem_is_shown_not_swallowed(tmp_path, settings, stderr, note):
    """End to end (about 5 s): an unsigned remote, and one nobody listens at: the phase's warning is
    passed on, marked with its phase, and the summary says the remote did not serve."""
    env = child_env(KERNEL_CACHE_REMOTE="redis://127.0.0.1:1", **settings)
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "demo.py"), "--dir", str(tmp_path / "demo")],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(stderr, proc.stderr), proc.stderr
    notes = proc.stdout[proc.stdout.index("cache levels that did not serve as configured:"):]
    assert f"\n  {note}" in notes, proc.stdout
    # cold: compiled (the rule may also read from memory a config a compile worker built first); warm: the record
    assert re.search(r"^matmul\[autotuned x6\] .* compiled 6\b.* disk record$", proc.stdout, re.M), proc.stdout


@pytest.mark.parametrize("keep", [False, True], ids=["emptied", "kept"])
def test_the_demo_says_at_its_start_whether_it_emptied_its_cache(tmp_path, monkeypatch, capsys, keep):
    """Its first line of its own says what it did to its cache (emptied, or kept with --keep), as it did."""
    cache = tmp_path / "demo"
    demo.prepare_demo_dir(cache)
    (cache / "left-by-an-earlier-run").write_text("an entry\n")

    def no_phase(name, env):
        raise demo.DemoPhaseError("the phases are not run here")

    monkeypatch.setattr(demo, "run_phase", no_phase)
    monkeypatch.setattr(sys, "argv", ["demo.py", "--dir", str(cache), *(["--keep"] if keep else [])])
    with pytest.raises(SystemExit):
        demo.main()
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"kernel-cache demo: 9 JAX programs / 14 Triton kernels, cache dir {cache} ("), first
    assert (cache / "left-by-an-earlier-run").exists() == keep
    if keep:
        assert "--keep: not emptied" in first, first
    else:
        assert "emptied at each start" in first and "--keep keeps it" in first, first
