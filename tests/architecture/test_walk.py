"""A warm call's walk: CONTRIBUTING's "A warm call, file by file" names, in order, the files
one warm call passes through from the lowering rule to its payload, and this test follows the same
call (tests/support/walk_child.py) and compares.

A *stop* is a file that, on the walk, calls on into another of our files; a *tool* is one that only
answers (the entry codec, Triton's and jaxlib's accessors, the LRU) and returns. Every stop is
entered once: a reader follows the call down and never comes back to a file left behind. Tools may
be asked more than once; the walk's table lists them too, so a new file on the way is seen.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
from conftest import ROOT, json_child

CHILD = ROOT / "tests" / "support" / "walk_child.py"


def _from_the_rule(entries: list[list[str | None]]) -> list[list[str | None]]:
    """The walk starts where JAX calls our rule (before it, JAX may call our DCE rule: its business)."""
    start = next(i for i, (path, _, _) in enumerate(entries) if path == "lowering/frontend/rule.py")
    return entries[start:]


@pytest.fixture(scope="module")
def walks(tmp_path_factory) -> dict[str, list[list[str | None]]]:
    work = tmp_path_factory.mktemp("walk")
    env = {"KERNEL_CACHE_TARGET_ARCH": "sm_90", "JAX_PLATFORMS": "cpu", "KERNEL_CACHE_COMPILE_WORKERS": "1"}
    cold = json_child(CHILD, work / "cold.json", "cold", KERNEL_CACHE_DIR=str(work / "cold"), **env)["entries"]
    json_child(CHILD, work / "fill.json", "fill", KERNEL_CACHE_DIR=str(work / "warm"), **env)
    warm = json_child(CHILD, work / "walk.json", "walk", KERNEL_CACHE_DIR=str(work / "warm"), **env)["entries"]
    return {"warm": _from_the_rule(warm), "cold": _from_the_rule(cold)}


@pytest.fixture
def walk(walks) -> list[list[str | None]]:
    return walks["warm"]


def documented_cold_walk() -> list[str]:
    """The files of CONTRIBUTING's cold call, in the order the paragraph names them."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    paragraph = text.split("A **cold call**", 1)[1].split("A first call in a process", 1)[0]
    return re.findall(r"`((?:lowering|compiler|kernel_cache)/[\w/]+\.py)`", paragraph)


def documented_walk() -> tuple[list[str], set[str]]:
    """(stops in order, tools) from CONTRIBUTING's table: `| n | file | ... |` rows, tools marked "tool"."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    section = text.split("## A warm call, file by file", 1)[1].split("\n## ", 1)[0]
    stops, tools = [], set()
    for _, path, role in re.findall(r"^\| *(\d+|-) *\| *`([^`]+)` *\| *(stop|tool) *\|", section, re.M):
        (stops.append(path) if role == "stop" else tools.add(path))
    return stops, tools


def test_every_stop_on_a_warm_calls_walk_is_entered_once(walk):
    callers = {caller for _, _, caller in walk if caller}
    entered = Counter(path for path, _, _ in walk)
    stops = [path for path in dict.fromkeys(path for path, _, _ in walk) if path in callers]
    assert {path: entered[path] for path in stops if entered[path] > 1} == {}, walk
    assert len(stops) >= 5  # the walk really was followed: rule, records, signature, its form, emitter


def test_contributing_walks_the_same_call_in_the_same_order(walk):
    callers = {caller for _, _, caller in walk if caller}
    order = list(dict.fromkeys(path for path, _, _ in walk))
    stops = [path for path in order if path in callers]
    tools = {path for path in order if path not in callers}
    documented_stops, documented_tools = documented_walk()
    assert stops == documented_stops
    assert tools == documented_tools


def test_contributing_walks_the_cold_call_in_the_same_order(walks):
    """Each file the paragraph names is entered after the one before it (a subsequence of the walk)."""
    entered = [path for path, _, _ in walks["cold"]]
    position = 0
    for path in documented_cold_walk():
        assert path in entered[position:], f"{path} is not entered after {entered[position - 1]} (entry {position})"
        position = entered.index(path, position) + 1


def switches(walk: list[list[str | None]]) -> int:
    """Switches from file to file: each entry is a call into another file and, later, its return."""
    return 2 * len(walk)


def test_a_warm_call_stays_within_fifteen_files_and_forty_switches(walk):
    """The record comes from the program's warm set, named by the call's signature, unplanned."""
    files = {path for path, _, _ in walk}
    assert len(files) <= 15, sorted(files)
    assert switches(walk) <= 40, walk


def test_a_cold_call_stays_within_450_switches(walks):
    """The cold call also notes itself in the same-call memo, asks the program's warm set for its
    signature, and derives its compile inputs (`compiler/inputs.py`) once for its key and its
    kernel's content key alike."""
    cold = walks["cold"]
    assert switches(cold) <= 450, Counter((path, caller) for path, _, caller in cold).most_common(10)
